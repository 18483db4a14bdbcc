"""Accelerate's smaller ``Accelerator`` attributes and decorators, kept out of the facade (a mixin).

Properties that read the Accelerator's configuration under Accelerate's names (``non_blocking``,
``use_seedable_sampler``, ``save_iteration``...), the ``on_*_process`` decorators, the checkpoint pre-hooks
registry, and the parallelism attributes (the ParallelismConfig, its device mesh and this process's ranks in
it; pipeline parallelism is refused).
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from torch import nn
from torch.utils.hooks import RemovableHandle

from trainkit.engine.process.control import only_when
from trainkit.utils.enums import DistributedType

_NO_PARALLELISM = ("trainkit does not drive pipeline parallelism; tensor, data, sharded, context and sequence "
                   "parallelism are set with ParallelismConfig (docs/parallelism.md)")


def _notice_once(message: str) -> None:
    if message not in _NOTICES:
        _NOTICES.add(message)
        logging.getLogger("trainkit").info(message)


_NOTICES: set[str] = set()


def refuse_parallelism(*, deepspeed_plugins: Any) -> None:
    """Accelerator arguments for parallelism trainkit does not drive: an error naming the argument."""
    if deepspeed_plugins is not None:
        raise NotImplementedError("Accelerator(deepspeed_plugins=...): trainkit runs one DeepSpeed config; pass it "
                                  "as deepspeed_plugin=DeepSpeedPlugin(...).")


def _refuse(what: str) -> NoReturn:
    raise NotImplementedError(f"{what}: {_NO_PARALLELISM}.")


class AccelerateAttributes:
    """Mixin over :class:`trainkit.engine.accelerator.Accelerator` (which provides the state and configuration)."""

    state: Any
    dataloader_config: Any
    project_configuration: Any
    deepspeed_plugin: Any = None
    """The DeepSpeed config given to the Accelerator, or None."""
    parallel_dims: Any = None
    """The run's :class:`~trainkit.engine.parallel.ParallelDims` when a ParallelismConfig was given, else None."""
    fp8_backend = None
    """None: trainkit has no fp8 training."""

    # -- configuration under Accelerate's names -----------------------------------------------------
    @property
    def dispatch_batches(self) -> bool | None:
        """``DataLoaderConfiguration.dispatch_batches``: iterable datasets are read on the main process and each batch
        sliced across processes; map-style datasets are split by indices anyway (a notice says so)."""
        return self.dataloader_config.dispatch_batches

    @property
    def non_blocking(self) -> bool:
        """``DataLoaderConfiguration.non_blocking``: batches move to the device asynchronously."""
        return self.dataloader_config.non_blocking

    @property
    def use_seedable_sampler(self) -> bool:
        """``DataLoaderConfiguration.use_seedable_sampler``."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def use_stateful_dataloader(self) -> bool:
        """``DataLoaderConfiguration.use_stateful_dataloader``: loaders resume mid-epoch from a checkpoint."""
        return bool(getattr(self.dataloader_config, "use_stateful_dataloader", False))

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets (``ProjectConfiguration.iteration``)."""
        return self.project_configuration.iteration

    @property
    def should_save_model(self) -> bool:
        """True where this process writes model files: each machine's first process."""
        return self.state.is_local_main_process

    @property
    def is_fsdp2(self) -> bool:
        """True when the model is sharded (trainkit's FSDP is always FSDP2)."""
        return getattr(self, "distributed_type") == DistributedType.FSDP

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Accelerate's name for "FSDP2 is on"."""
        return self.is_fsdp2

    @property
    def multi_device(self) -> bool:
        """True for several processes on accelerator devices (DDP on GPUs), as opposed to CPU processes."""
        return self.state.use_distributed and getattr(self, "distributed_type") == DistributedType.MULTI_GPU

    # -- parallelism (Accelerate's answers: a ParallelismConfig is needed for the ranks) --------------
    @property
    def parallelism_config(self) -> Any:
        """The run's ParallelismConfig with its degrees resolved against the world size, or None."""
        return self.parallel_dims.config if self.parallel_dims is not None else None

    @property
    def torch_device_mesh(self) -> Any:
        """The device mesh ``dp_replicate x dp_shard x tp`` (plus the flattened ``dp``), or None without a
        ParallelismConfig (the FSDP strategy then builds its mesh internally)."""
        dims = self.parallel_dims
        return dims.mesh if dims is not None and dims.world_size > 1 else None

    def _mesh_rank(self, dimension: str, what: str) -> int:
        dims = self.parallel_dims
        if dims is None:
            raise RuntimeError(f"Accelerator.{what} needs a ParallelismConfig (Accelerator(parallelism_config=...)); "
                               "without one, the data-parallel rank is accelerator.process_index.")
        return dims.mesh.get_local_rank(dimension) if getattr(dims, dimension) > 1 else 0  # size 1: no mesh needed

    @property
    def data_parallel_rank(self) -> int:
        """This process's index along ``dp_replicate`` (0 when it has size 1); needs a ParallelismConfig."""
        return self._mesh_rank("dp_replicate", "data_parallel_rank")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index along ``dp_shard`` (0 when it has size 1); needs a ParallelismConfig."""
        return self._mesh_rank("dp_shard", "data_parallel_shard_rank")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index inside its tensor-parallel group (0 when ``tp_size`` is 1)."""
        if self.parallel_dims is None:
            raise RuntimeError("Accelerator.tensor_parallel_rank needs a ParallelismConfig with tp_size "
                               "(Accelerator(parallelism_config=ParallelismConfig(tp_size=...))).")
        return self._mesh_rank("tp", "tensor_parallel_rank")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index inside its context-parallel group (0 when ``cp_size`` is 1); needs a
        ParallelismConfig (Accelerate raises NotImplementedError here)."""
        return self._mesh_rank("cp", "context_parallel_rank")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Pipeline parallelism is not driven (by Accelerate either)."""
        _refuse("Accelerator.pipeline_parallel_rank")

    def maybe_context_parallel(self, buffers: list[Any] | None = None, buffer_seq_dims: list[int] | None = None,
                               no_restore_buffers: set[Any] | None = None) -> contextlib.AbstractContextManager:
        """A no-op: with ``cp_size > 1`` trainkit splits each training batch at the prepared model's forward
        (``buffers`` must not be cut a second time), so scripts written for Accelerate's context manager keep
        working; without context parallelism it does nothing in Accelerate either."""
        if buffers and self.parallel_dims is not None and self.parallel_dims.cp > 1:
            _notice_once("maybe_context_parallel: trainkit splits the batch along the sequence inside the prepared "
                         "model's forward; the buffers are left whole here.")
        return contextlib.nullcontext()

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any) -> Any:
        """Returns ``dl`` as it is: trainkit's sequence parallelism splits each training batch inside the prepared
        model's forward, so the dataloader keeps yielding whole sequences (every rank of an sp group the same)."""
        return dl

    def lomo_backward(self, loss: Any, learning_rate: float) -> NoReturn:
        """LOMO fuses backward and optimizer step; trainkit does not drive LOMO optimizers."""
        raise NotImplementedError("Accelerator.lomo_backward: trainkit does not drive LOMO optimizers (the lomo-optim "
                                  "package); use a torch optimizer with accelerator.backward and optimizer.step.")

    def verify_device_map(self, model: nn.Module) -> bool:
        """True when a submodule carries a multi-entry ``hf_device_map`` (big-model inference), which
        training cannot shard or replicate."""
        return any(len(getattr(module, "hf_device_map", None) or {}) > 1 for module in model.modules())

    # -- running on some processes ------------------------------------------------------------------
    def on_main_process(self, function: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the main process only."""
        return self._on(lambda: self.state.is_main_process, function)

    def on_local_main_process(self, function: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on each machine's first process only."""
        return self._on(lambda: self.state.is_local_main_process, function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` on the last process only."""
        return self._on(lambda: self.state.is_last_process, function)

    def on_process(self, function: Callable[..., Any] | None = None,
                   process_index: int | None = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on the process with global rank ``process_index`` only."""
        return self._on(lambda: self.state.rank == process_index, function, "process_index", process_index)

    def on_local_process(self, function: Callable[..., Any] | None = None,
                         local_process_index: int | None = None) -> Callable[..., Any]:
        """Decorator: run ``function`` on local rank ``local_process_index`` of each machine only."""
        return self._on(lambda: self.state.local_rank == local_process_index, function, "local_process_index",
                        local_process_index)

    @staticmethod
    def _on(condition: Callable[[], bool], function: Callable[..., Any] | None, index_name: str = "",
            index: int | None = 0) -> Callable[..., Any]:
        if index_name and index is None:
            raise ValueError(f"on_{index_name.replace('_index', '')}(...) needs {index_name}=<rank>.")
        decorator = only_when(condition)
        return decorator(function) if function is not None else decorator

    @staticmethod
    def trigger_sync_in_backward(model: nn.Module) -> contextlib.AbstractContextManager:
        """Make the next backward all-reduce ``model``'s gradients, even inside ``no_sync``/``accumulate``."""
        from trainkit.engine.strategies.ddp_sync import sync_in_backward

        return sync_in_backward(model)

    # -- checkpoint hooks ---------------------------------------------------------------------------
    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in ``save_state`` before the files are written:
        ``weights`` are the models' full state dicts, ``output_dir`` the checkpoint folder being written
        (extra files written there become part of the checkpoint). Returns a handle whose ``remove()``
        unregisters it."""
        return _register(self.__dict__.setdefault("_save_state_pre_hooks", OrderedDict()), hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in ``load_state`` before the models are loaded. Returns a
        handle whose ``remove()`` unregisters it."""
        return _register(self.__dict__.setdefault("_load_state_pre_hooks", OrderedDict()), hook)


def _register(hooks: OrderedDict, hook: Callable[..., None]) -> RemovableHandle:
    if not callable(hook):
        raise TypeError(f"a state hook must be callable, got {hook!r}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def run_save_state_pre_hooks(accelerator: Any, models: Sequence[nn.Module], output_dir: str) -> None:
    """Called by ``save_state``: each registered hook sees the models, their state dicts and the folder.

    A hook may write files of its own there and, as Accelerate's hooks do when they save a model in their own
    format (diffusers, PEFT), take models and weights out of the lists. trainkit still writes every prepared
    model (so the checkpoint stays complete and is verified as a whole); the hook's files are an extra copy."""
    hooks = accelerator.__dict__.get("_save_state_pre_hooks")
    if not hooks:
        return
    listed = _as_hooks_see_them(accelerator, models)
    weights = [accelerator.get_state_dict(model) for model in listed]
    for hook in list(hooks.values()):
        hook(listed, weights, output_dir)


def run_load_state_pre_hooks(accelerator: Any, models: Sequence[nn.Module], input_dir: str) -> None:
    """Called by ``load_state`` before anything is loaded. A hook may load models itself and take them out of
    the list, as in Accelerate; trainkit then restores every prepared model from its own files, which hold the
    same weights the hook read (both were written by the same ``save_state``)."""
    hooks = accelerator.__dict__.get("_load_state_pre_hooks")
    if not hooks:
        return
    listed = _as_hooks_see_them(accelerator, models)
    for hook in list(hooks.values()):
        hook(listed, input_dir)


def _as_hooks_see_them(accelerator: Any, models: Sequence[nn.Module]) -> list[nn.Module]:
    """The script's own modules, outside DDP: hooks call their methods (``save_pretrained``, ``load_adapter``).
    Accelerate passes the DDP wrapper on several GPUs but, having no DDP on CPU processes, the module itself there;
    trainkit trains CPU processes with DDP too, so it always passes the module (``unwrap_model`` of it is itself)."""
    return [accelerator.unwrap_model(model, keep_fp32_wrapper=True, keep_torch_compile=True) for model in models]
