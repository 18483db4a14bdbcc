"""Accelerate's process-level names (trainkit.state, trainkit.utils operations, Accelerator contexts) in real
processes. Run as ``python surface_checks.py OUT`` or under torchrun with 2 gloo ranks (CPU); each rank
writes ``report_rank<i>.json`` for the test to assert on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from trainkit import Accelerator
from trainkit.state import AcceleratorState, GradientState, PartialState
from trainkit.utils import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedOperationException,
    ProfileKwargs,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    save,
    wait_for_everyone,
)

OUT = Path(sys.argv[1])
report: dict = {}


class Numbers(IterableDataset):
    """A stream of six scalars (an iterable dataset for join_uneven_inputs)."""

    def __iter__(self):
        return iter(torch.arange(6.0))

def state_checks() -> None:
    state = PartialState(cpu=True)
    rank, world = state.process_index, state.num_processes
    report.update(distributed_type=state.distributed_type.value, num_processes=world, is_last=state.is_last_process,
                  same_object=PartialState().__dict__ is state.__dict__ and AcceleratorState().device == state.device)
    ran = []
    state.on_main_process(lambda: ran.append("main"))()
    state.on_last_process(lambda: ran.append("last"))()
    state.on_process(lambda: ran.append("p1"), process_index=1)()
    report["ran"] = ran
    with state.split_between_processes(list(range(5)), apply_padding=True) as share:
        report["share"] = share
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        state.print("hello")
    report["printed"] = printed.getvalue()
    state.wait_for_everyone()


def operation_checks() -> None:
    rank = PartialState().process_index
    world = PartialState().num_processes
    report["gather"] = gather(torch.tensor([rank, 10 + rank])).tolist()
    report["gather_object"] = gather_object([f"r{rank}"])
    report["broadcast"] = broadcast(torch.tensor([rank * 1.0]), from_process=world - 1).tolist()
    report["broadcast_object_list"] = broadcast_object_list([f"from{rank}"], from_process=world - 1)
    report["pad"] = pad_across_processes(torch.ones(rank + 2), pad_index=-1).tolist()
    report["reduce_default"] = reduce(torch.tensor([float(rank)])).tolist()
    report["reduce_sum"] = reduce(torch.tensor([float(rank)]), reduction="sum").tolist()
    report["copied"] = copy_tensor_to_devices(torch.arange(3.0) if rank == world - 1 else None).tolist()
    os.environ["ACCELERATE_DEBUG_MODE"] = "1"
    try:
        gather(torch.zeros(rank + 1))
        report["debug_mismatch"] = "no error"
    except DistributedOperationException as error:
        report["debug_mismatch"] = str(error)
    finally:
        del os.environ["ACCELERATE_DEBUG_MODE"]
    # Accelerate's test_ops switches the checks with the state's attribute instead of the environment.
    state = PartialState()
    state.debug = True
    try:
        reduce(torch.zeros(rank + 1))
        report["debug_attribute_mismatch"] = "no error"
    except DistributedOperationException as error:
        report["debug_attribute_mismatch"] = str(error)
    try:  # padding evens out sizes, not numbers of dimensions: [1, 5] against [1, 1, 6] cannot be padded
        pad_across_processes({"t": torch.zeros([1, 5] if rank == 0 else [1, 1, 6])})
        report["debug_pad_mismatch"] = "no error"
    except DistributedOperationException as error:
        report["debug_pad_mismatch"] = str(error)
    report["debug_pad_sizes"] = pad_across_processes(torch.zeros(rank + 1, 2)).shape[0]  # sizes may differ
    state.debug = False
    report["debug_attribute_off"] = [state.debug, reduce(torch.zeros(1)).tolist()]
    save({"w": torch.ones(1)}, OUT / "saved.pt")
    wait_for_everyone()


def accelerator_checks() -> None:
    hook = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[hook, ProfileKwargs(output_trace_dir=str(OUT / "traces"))])
    report["gradient_state_shared"] = GradientState() is accelerator.gradient_state
    torch.manual_seed(0)
    model = accelerator.prepare(nn.Linear(3, 1))
    rank = accelerator.process_index
    if accelerator.num_processes > 1:
        report["comm_hook"] = model._get_ddp_logging_data().get("comm_hook", "")
    x = torch.full((2, 3), float(rank + 1))
    with accelerator.no_sync(model):
        model(x).sum().backward()
    report["grad_no_sync"] = model.module.weight.grad.tolist() if hasattr(model, "module") else model.weight.grad.tolist()
    model.zero_grad()
    with accelerator.no_sync(model):
        with accelerator.trigger_sync_in_backward(model):
            model(x).sum().backward()
    inner = accelerator.unwrap_model(model)
    report["grad_triggered"] = inner.weight.grad.tolist()

    # Uneven inputs: 5 samples, batch 1, no padding -> rank 0 gets 3 batches, rank 1 gets 2; Join keeps DDP alive.
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.randn(5, 3)), batch_size=1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = 0
    with accelerator.join_uneven_inputs([model], even_batches=False):
        for (batch,) in loader:
            optimizer.zero_grad()
            accelerator.backward(model(batch).sum())
            optimizer.step()
            batches += 1
    report["uneven_batches"] = batches
    # An iterable loader cannot take the override: as Accelerate's, a UserWarning says so and the loader keeps it.
    streamed = accelerator.prepare(DataLoader(Numbers(), batch_size=1))
    switches = lambda: {k: v for k, v in vars(streamed.dataset).items() if isinstance(v, bool)}  # noqa: E731
    report["iterable_switches_before"] = switches()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            report["iterable_switches_inside"] = switches()
            report["map_even_batches_inside"] = loader.batch_sampler.even_batches
    report["join_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    report["even_batches_restored"] = getattr(loader.batch_sampler, "even_batches", None)
    report["weights_after_join"] = inner.weight.detach().flatten().tolist()
    # LocalSGD: replicas drift inside the block (no gradient all-reduce) and are averaged every 2 steps and at exit.
    from trainkit.local_sgd import LocalSGD

    torch.manual_seed(0)
    local_model = accelerator.prepare(nn.Linear(3, 1))
    local_optimizer = accelerator.prepare(torch.optim.SGD(local_model.parameters(), lr=0.1))
    local_inner = accelerator.unwrap_model(local_model)
    with LocalSGD(accelerator, local_model, local_sgd_steps=2) as local_sgd:
        for step in range(3):
            local_optimizer.zero_grad()
            accelerator.backward(local_model(torch.full((1, 3), float(rank + 1))).sum())
            local_optimizer.step()
            local_sgd.step()
            report[f"local_sgd_step{step}"] = local_inner.weight.detach().flatten().tolist()
    report["local_sgd_exit"] = local_inner.weight.detach().flatten().tolist()
    powersgd = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD,
                                             comm_wrapper=DDPCommunicationHookType.FP16,
                                             comm_state_option={"matrix_approximation_rank": 1})
    second = Accelerator(cpu=True, kwargs_handlers=[powersgd])
    compressed = second.prepare(nn.Linear(3, 1))
    second.backward(compressed(torch.ones(2, 3)).sum())
    if second.num_processes > 1:
        report["wrapped_comm_hook"] = compressed._get_ddp_logging_data().get("comm_hook", "")
    with accelerator.profile() as profiler:
        model(torch.ones(1, 3)).sum().backward()
    report["profiled_events"] = len(profiler.key_averages()) > 0


state_checks()
operation_checks()
accelerator_checks()
(OUT / f"report_rank{PartialState().process_index}.json").write_text(json.dumps(report))
