"""Accelerate's shared-state classes, ``PartialState`` and ``AcceleratorState``, as views of the process state.

Accelerate's states are "Borg" objects: every instance of a class shares one attribute dictionary
(``_shared_state``), ``Class._reset_state()`` empties it, and reading a state attribute of an emptied state
raises an ``AttributeError`` saying that the state was reset. Test harnesses and notebooks rely on this, and
scripts print and pass these objects around. trainkit keeps one :class:`ProcessState` per process (rank, device,
process group, the newest Accelerator); the views here give it Accelerate's class names and semantics:

- ``PartialState()`` and ``AcceleratorState()`` return a new instance each call whose ``__dict__`` is the class's
  shared dictionary, holding the process state under ``_process``; anything not set on the view itself is read
  from the process state (``num_processes``, ``device``, ``wait_for_everyone``...). A property of the process state
  that can be set (``distributed_type``, ``debug``) is set there; any other attribute set on a view is shared by
  every instance of its class, as in Accelerate.
- ``PartialState._reset_state()`` tears down the process group trainkit created and forgets the process state;
  ``AcceleratorState._reset_state()`` forgets the Accelerator-level state (``reset_partial_state=True``: both).
  A new ``PartialState()``/``AcceleratorState()``/``Accelerator()`` shows the current process state again.
  Until a new ``Accelerator()`` (or state) is made, reading a state attribute raises Accelerate's message.
- ``accelerator.state`` is an ``AcceleratorState``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, ClassVar

from trainkit.engine.process.state import ProcessState
from trainkit.engine.process.state_api import AccelerateStateAPI

_RESET_HINT = ("This happens if `{cls}._reset_state()` was called and an `Accelerator` or `PartialState` was not "
               "reinitialized.")


class _SharedStateView:
    """The Borg mechanics both views share (Accelerate's ``SharedDict`` pattern)."""

    _shared_state: ClassVar[dict[str, Any]]
    _known_attrs: ClassVar[tuple[str, ...]]
    """State attributes whose absence after a reset gets the explanatory message (Accelerate's list)."""

    def _share(self, cls: type[_SharedStateView], cpu: bool, process_kwargs: dict[str, Any]) -> None:
        object.__setattr__(self, "__dict__", cls._shared_state)
        # Always the current one: after PartialState._reset_state() a new process state replaces the old.
        cls._shared_state["_process"] = _process_state(cpu, process_kwargs)

    @property
    def initialized(self) -> bool:
        """True while the state is set up (False after ``_reset_state()`` until it is made again)."""
        return "_process" in self.__dict__

    def _answering(self, name: str) -> Any:
        """The process state that answers for ``name``, or the ``AttributeError`` saying why there is none."""
        process = self.__dict__.get("_process")
        if process is None and name not in self._known_attrs:
            # Accelerate's methods and derived properties (is_main_process, wait_for_everyone...) live on the class
            # and keep working after AcceleratorState._reset_state(); only the stored attributes are gone.
            process = ProcessState._instance
        if process is not None:
            return process
        label = type(self).__name__
        if name in self._known_attrs:
            raise AttributeError(f"`{label}` object has no attribute `{name}`. " + _RESET_HINT.format(cls=label))
        raise AttributeError(f"'{label}' object has no attribute '{name}'")

    def __getattr__(self, name: str) -> Any:
        # Only called when the view has no such attribute (the process state's instance attributes: device...).
        try:
            return getattr(self._answering(name), name)
        except AttributeError as error:
            if str(error).startswith("`"):
                raise
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __reduce__(self) -> tuple[type, tuple[()]]:
        # The state of the process that loads a pickled object holding one (one state per process).
        return (type(self), ())

    def __repr__(self) -> str:
        backend = self.__dict__["_process"].backend if self.initialized else None
        return (f"Distributed environment: {self.distributed_type}{f'  Backend: {backend}' if backend else ''}\n"
                f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
                f"Local process index: {self.local_process_index}\nDevice: {self.device}\n")


def _process_state(cpu: bool, kwargs: dict[str, Any]) -> ProcessState:
    """The process state, created on first use; Accelerate's ``cpu=False`` default is "not asked" (the
    launcher's ``--cpu`` still applies), and ``backend``/``timeout`` go to the process group."""
    return ProcessState.get(cpu=cpu or None, backend=kwargs.get("backend"), timeout=kwargs.get("timeout"))


class PartialState(_SharedStateView):
    """Accelerate's ``PartialState``: who this process is (rank, device, process group) and the helpers that run
    code on some processes; every instance shares one state. ``cpu=True`` forces the CPU on first creation."""

    _shared_state: ClassVar[dict[str, Any]] = {}
    _known_attrs = ("_cpu", "_mixed_precision", "_shared_state", "backend", "debug", "device", "distributed_type",
                    "fork_launched", "local_process_index", "num_processes", "process_index")

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self._share(PartialState, cpu, kwargs)

    @staticmethod
    def _reset_state() -> None:
        """Tear down the process group trainkit created and forget the process state (test harnesses). As in
        Accelerate, an ``AcceleratorState`` made before keeps what it holds until it is reset or made again."""
        PartialState._shared_state.clear()
        ProcessState.reset()


class AcceleratorState(_SharedStateView):
    """Accelerate's ``AcceleratorState``: the process state plus what the Accelerator decided (distributed type,
    mixed precision, plugins), read from the newest Accelerator of the process; every instance shares one state.

    The plugins belong to the Accelerator that uses them (``Accelerator(fsdp_plugin=...)``): given here they are
    accepted and the state keeps reporting the Accelerator's. A ``mixed_precision`` that differs from the one in
    use is refused, as in Accelerate.
    """

    _shared_state: ClassVar[dict[str, Any]] = {}
    _known_attrs = (*PartialState._known_attrs, "deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin",
                    "dynamo_plugin", "mixed_precision", "parallelism_config")

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, dynamo_plugin: Any = None,
                 deepspeed_plugin: Any = None, fsdp_plugin: Any = None, torch_tp_plugin: Any = None,
                 megatron_lm_plugin: Any = None, parallelism_config: Any = None, _from_accelerator: bool = False,
                 **kwargs: Any) -> None:
        PartialState(cpu, **kwargs)
        self._share(AcceleratorState, cpu, kwargs)
        process = self.__dict__["_process"]
        if mixed_precision is None or _from_accelerator or process.accelerator is None:
            return
        in_use = process.mixed_precision
        if str(mixed_precision) != in_use:
            raise ValueError(f"AcceleratorState(mixed_precision={mixed_precision!r}): the Accelerator already uses "
                             f"{in_use!r}; set it with Accelerator(mixed_precision=...).")

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the Accelerator-level state (``reset_partial_state``: the process state too). Until a new
        ``Accelerator()`` is made, an existing Accelerator's attributes raise an ``AttributeError`` saying so."""
        AcceleratorState._shared_state.clear()
        if ProcessState._instance is not None:
            ProcessState._instance.clear_accelerator_state()
        if reset_partial_state:
            PartialState._reset_state()

    def __repr__(self) -> str:
        return super().__repr__() + f"\nMixed precision type: {self.mixed_precision}\n"


def _delegating(name: str, member: Any) -> Any:
    """A class-level member of the views for ``ProcessState``'s ``name``: a property or method that asks the
    process state answering at call time (so help(), IDEs and signature checks see Accelerate's members)."""
    if not inspect.isfunction(member):  # a property, or a plain value the process state holds (fork_launched)
        def get(view: _SharedStateView) -> Any:
            return getattr(view._answering(name), name)

        def put(view: _SharedStateView, value: Any) -> None:
            setattr(view._answering(name), name, value)  # distributed_type, debug: the one value every reader sees

        settable = not isinstance(member, property) or member.fset is not None
        return property(get, put if settable else None, doc=getattr(member, "__doc__", None) if isinstance(
            member, property) else f"The process state's ``{name}``.")

    @functools.wraps(member)
    def method(view: _SharedStateView, *args: Any, **kwargs: Any) -> Any:
        return getattr(view._answering(name), name)(*args, **kwargs)

    return method


for _name, _member in {**vars(AccelerateStateAPI), **vars(ProcessState)}.items():
    if not _name.startswith("_") and not isinstance(_member, (staticmethod, classmethod)):
        for _view in (PartialState, AcceleratorState):
            if _name not in vars(_view) and _name not in vars(_SharedStateView):
                setattr(_view, _name, _delegating(_name, _member))
