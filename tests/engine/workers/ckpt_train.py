"""Checkpoint worker: train a small dropout MLP with shuffling, accumulation, a scheduler (and fp16), saving
and/or resuming with ``save_state`` / ``load_state``; record the final weights and the global sample order.

Run as one process or under torchrun. Rank 0 writes ``OUT/NAME.safetensors`` (final full weights) and
``OUT/NAME.json`` (per optimizer step: the global sample indices consumed, in stream order).
``--kill-rank R --kill-at-save K``: rank R SIGKILLs itself in the middle of writing its K-th checkpoint.
``--async-save``: saves are asynchronous. ``--fault RANK:STEP:POINT``: during the background write of the save
after optimizer step STEP, rank RANK meets POINT: ``files`` (SIGKILL after writing its first tensor file),
``hash`` (SIGKILL while checksumming), ``rename`` (SIGKILL with the manifest written, before the rename),
``loop`` (its writer is held and the training loop SIGKILLs the process at its next backward), ``gather``
(SIGKILL while the writers gather a FULL_STATE_DICT checkpoint's shards onto rank 0), ``sigterm``
(SIGTERM to itself while writing: a preemption), ``disk-full`` (the write fails with ENOSPC).
``--check-preemption``: call ``accelerator.check_preemption()`` after every optimizer step.
``--project`` may be an object-store URL (``s3://bucket/run``); ``--per-rank-project``: each rank keeps its checkpoints
in its own folder ``PROJECT/rank{r}`` (each node's own disk).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainkit import Accelerator
from trainkit.utils import set_seed
from trainkit.utils.dataclasses import DataLoaderConfiguration, ProjectConfiguration

NUM_SAMPLES, FEATURES = 88, 8  # 11 global batches of 8: the last accumulation window of an epoch is short


class IndexedData(Dataset):
    """Fixed random regression data that also returns each sample's index (to record the order)."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(NUM_SAMPLES, FEATURES, generator=generator)
        self.y = torch.randn(NUM_SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[index], self.y[index], index


class Progress:
    """Optimizer steps taken; registered for checkpointing like a user's own counter."""

    def __init__(self) -> None:
        self.optimizer_steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"optimizer_steps": self.optimizer_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.optimizer_steps = int(state["optimizer_steps"])


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 1))


def make_accelerator(args: argparse.Namespace) -> Accelerator:
    project_dir = f"{args.project}/rank{os.environ.get('RANK', '0')}" if args.per_rank_project else args.project
    project = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=args.total_limit,
                                   async_save=args.async_save)
    kwargs = {}
    if args.fsdp:
        from trainkit import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(state_dict_type=args.fsdp)
    # The loop below resumes mid-epoch without skip_first_batches: the loader's position is restored.
    return Accelerator(cpu=True, gradient_accumulation_steps=2, mixed_precision="fp16" if args.fp16 else "no",
                       project_config=project, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
                       **kwargs)


def install_kill(rank: int, at_save: int) -> None:
    """SIGKILL this process while its ``at_save``-th checkpoint is half written (after the model/optimizer files)."""
    from trainkit.engine.checkpoint import accelerator_state

    original, calls = accelerator_state.capture_rng_state, [0]

    def capture_or_die():
        calls[0] += 1
        if calls[0] == at_save:
            logging.getLogger("ckpt_train").warning("rank %d: SIGKILL during checkpoint %d", rank, at_save)
            os.kill(os.getpid(), signal.SIGKILL)
        return original()

    accelerator_state.capture_rng_state = capture_or_die


def install_fault(accelerator: Accelerator, spec: str, progress: Progress) -> None:
    """The ``--fault`` of this rank: patch the background writer's path at the named point (writer thread only)."""
    import errno
    import threading
    import time

    from trainkit.engine.checkpoint import async_writer, sinks
    from trainkit.engine.checkpoint.storage.manifest import MANIFEST_NAME

    rank, step, point = spec.split(":")
    if int(rank) != accelerator.process_index:
        return
    log = logging.getLogger("ckpt_train")
    storage_class = type(accelerator.checkpointer.storage_for(accelerator.project_configuration.project_dir))

    # The writer runs while the loop goes on: the checkpoint is recognised by its name in the paths written.
    armed_folder: list[str] = []
    real_save_state = accelerator.save_state

    def save_state(*a, **kw):
        if progress.optimizer_steps == int(step) and not armed_folder:
            armed_folder.append(f"checkpoint_{accelerator.project_configuration.iteration}")
            saved = real_save_state(*a, **kw)
            if point == "loop":
                loop_may_die.set()  # the writer is held (below): this save is in flight at the next backward
            return saved
        return real_save_state(*a, **kw)

    accelerator.save_state = save_state

    def armed(path: str) -> bool:
        name = armed_folder[0] if armed_folder else None
        return (threading.current_thread().name == async_writer.WRITER_THREAD_NAME and name is not None
                and (f"/{name}/" in path or f"/.{name}.staging/" in path))

    def die(where: str) -> None:
        log.warning("rank %s: SIGKILL %s, in the background write of the step-%s checkpoint", rank, where, step)
        os.kill(os.getpid(), signal.SIGKILL)

    real_write, real_checksum = sinks.write_tensors_now, storage_class.checksum
    real_bytes, real_publish = storage_class.write_bytes, storage_class._publish

    def write_tensors(storage, tensors, path):
        if armed(path) and point == "disk-full":
            raise OSError(errno.ENOSPC, "No space left on device", path)
        if armed(path) and point == "sigterm" and not signalled:
            signalled.append(path)  # once: a second SIGTERM means "stop now, without saving"
            log.warning("rank %s: SIGTERM while writing the step-%s checkpoint", rank, step)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the loop goes on meanwhile and sees the signal at its next check
        real_write(storage, tensors, path)
        if armed(path) and point == "files":
            die(f"after writing {os.path.basename(path)}")

    def checksum(self, path):
        if armed(path) and point == "hash":
            die(f"while checksumming {os.path.basename(path)}")
        return real_checksum(self, path)

    def write_bytes(self, path, data, **kwargs):
        if armed(path) and point == "loop":
            time.sleep(60)  # the writer is held at its first file: the training loop kills the process meanwhile
        real_bytes(self, path, data, **kwargs)

    def publish(self, staging, final_dir, manifest):
        if armed(staging + "/") and point == "rename":
            # On a disk: with the manifest written, before the rename; in an object store: before the manifest.
            if hasattr(self, "local_path") and self.local_path(staging) is not None:
                real_bytes(self, os.path.join(staging, MANIFEST_NAME), self.manifest_bytes(manifest))
                die("with the manifest written, before the rename")
            die("with every file uploaded and checked, before the manifest")
        return real_publish(self, staging, final_dir, manifest)

    # The gather has no path: the writer's staging location of the moment tells which checkpoint it gathers.
    writing: list[str] = [""]
    real_background_write, real_gather = async_writer.BackgroundCheckpointWriter._write, async_writer.gather_full

    def background_write(self, storage, recorder, *rest):
        writing[0] = recorder.root + "/"
        return real_background_write(self, storage, recorder, *rest)

    def gather_full(tensors, mesh, keep):
        if armed(writing[0]) and point == "gather":
            die("while the writers gather the shards onto rank 0")
        return real_gather(tensors, mesh, keep)

    async_writer.BackgroundCheckpointWriter._write = background_write
    async_writer.gather_full = gather_full
    loop_may_die = threading.Event()
    signalled: list[str] = []
    sinks.write_tensors_now = write_tensors
    storage_class.checksum, storage_class.write_bytes, storage_class._publish = checksum, write_bytes, publish
    if point == "loop":
        real_backward = accelerator.backward

        def backward(loss, **kwargs):
            if loop_may_die.is_set():
                log.warning("rank %s: SIGKILL in the training loop while the writer is busy", rank)
                os.kill(os.getpid(), signal.SIGKILL)
            return real_backward(loss, **kwargs)

        accelerator.backward = backward


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--save-at", type=int, nargs="*", default=[])
    parser.add_argument("--resume", default=None, help="'latest' (automatic naming) or a folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-rank-batch", type=int, default=4)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--fsdp", default=None, help="SHARDED_STATE_DICT or FULL_STATE_DICT")
    parser.add_argument("--total-limit", type=int, default=None)
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--kill-at-save", type=int, default=None)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--fault", default=None, help="RANK:STEP:POINT (see the module doc)")
    parser.add_argument("--check-preemption", action="store_true")
    parser.add_argument("--per-rank-project", action="store_true",
                        help="each rank's checkpoints in PROJECT/rank{r} (each node's own disk)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', 0)}] %(name)s %(levelname)s: %(message)s")

    set_seed(args.seed)
    accelerator = make_accelerator(args)
    if args.kill_rank is not None and accelerator.process_index == args.kill_rank:
        install_kill(args.kill_rank, args.kill_at_save)
    model = accelerator.prepare(build_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.1 * step))
    loader = DataLoader(IndexedData(), batch_size=args.per_rank_batch, shuffle=True)
    optimizer, scheduler, loader = accelerator.prepare(optimizer, scheduler, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if args.fault:
        install_fault(accelerator, args.fault, progress)
    if args.check_preemption:
        from trainkit.engine.process.preemption import PreemptionWatch

        # Agree at every step (the default spaces the checks 0.5 s apart: longer than this whole run).
        accelerator._preemption_watch = PreemptionWatch(check_interval=0).start()
    if args.resume:
        accelerator.load_state(None if args.resume == "latest" else args.resume)
        loaded = {k: v.detach().cpu().contiguous() for k, v in accelerator.get_state_dict(model).items()}
        if accelerator.is_main_process:
            save_file(loaded, str(Path(args.out) / f"{args.name}.loaded.safetensors"))

    order: dict[int, list[int]] = {}
    first_step = progress.optimizer_steps
    while progress.optimizer_steps < args.steps:
        for x, y, index in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            order.setdefault(progress.optimizer_steps + 1, []).extend(accelerator.gather(index).tolist())
            if accelerator.sync_gradients:
                progress.optimizer_steps += 1
                if progress.optimizer_steps in args.save_at:
                    accelerator.save_state()
                if args.check_preemption:
                    accelerator.check_preemption()
                if progress.optimizer_steps == args.steps:
                    break

    weights = {k: v.detach().cpu().contiguous() for k, v in accelerator.get_state_dict(model).items()}
    if accelerator.is_main_process:
        out = Path(args.out)
        save_file(weights, str(out / f"{args.name}.safetensors"))
        result = {"first_step": first_step, "order": order, "world_size": accelerator.num_processes,
                  "lr": scheduler.get_last_lr(), "scale": accelerator.precision.state_dict().get("scale")}
        (out / f"{args.name}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
