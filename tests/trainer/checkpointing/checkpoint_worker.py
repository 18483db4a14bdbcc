"""Multi-process checks of the Trainer's checkpoints: ``checkpoint_worker.py OUT SCENARIO...``.

Scenarios (rank 0 writes ``OUT/{name}.safetensors`` with final full weights, and JSON facts):

- ``ddp``: uninterrupted run, then runs stopped after steps 2 and 5 and resumed with
  ``train(resume_from_checkpoint=True)``; all must end with the same weights.
- ``fsdp``: the same under FSDP2 with SHARDED_STATE_DICT (checkpoints hold DCP shards, no model.safetensors).
- ``fsdp-async``: ``fsdp`` with ``async_save=True`` (the shards staged as DTensors, written by the background writer).
- ``fsdp-full-async``: FSDP2 with FULL_STATE_DICT and ``async_save=True`` (each rank's shards staged, gathered onto
  rank 0 by the background writers, which write full ``model.safetensors`` and ``optimizer.safetensors``).
- ``restart`` (under ``trainkit launch --max_restarts 1``): on the first attempt rank 1 SIGKILLs itself in
  the middle of writing checkpoint-KILL_STEP; the restarted attempt runs the unchanged script, which must
  resume by itself from the previous complete checkpoint. It records what it found on disk, then also
  trains an uninterrupted reference.
"""

import json
import os
import signal
import sys

from safetensors.torch import save_file

from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit.trainer.checkpointing import files as checkpoints

OUT = sys.argv[1]
RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
STOPS = (2, 5)  # per rank 11 batches of 2, windows of 3: 4 steps per epoch, the 4th a short window
KILL_STEP = 6
FSDP = dict(fsdp="full_shard", fsdp_config={"state_dict_type": "SHARDED_STATE_DICT", "reshard_after_forward": True})
FSDP_FULL = dict(fsdp="full_shard", fsdp_config={"state_dict_type": "FULL_STATE_DICT", "reshard_after_forward": True})


def save_weights(name: str, trainer) -> None:
    weights = final_weights(trainer)  # collective under FSDP
    if RANK == 0:
        save_file(weights, os.path.join(OUT, f"{name}.safetensors"))


def write_json(name: str, value) -> None:
    if RANK == 0:
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as handle:
            json.dump(value, handle)


def stop_and_resume(kind: str, **extra) -> None:
    full = make_trainer(os.path.join(OUT, f"{kind}-full"), **extra)
    full.train()
    save_weights(f"{kind}-full", full)
    layout = sorted(os.listdir(checkpoints.checkpoint_folder(full.args.output_dir, 3)))
    for stop in STOPS:
        output_dir = os.path.join(OUT, f"{kind}-stopped-{stop}")
        make_trainer(output_dir, stop_after=stop, **extra).train()
        resumed = make_trainer(output_dir, **extra)
        output = resumed.train(resume_from_checkpoint=True)
        save_weights(f"{kind}-resumed-{stop}", resumed)
        write_json(f"{kind}-resumed-{stop}.json", {"global_step": output.global_step, "epoch": resumed.state.epoch,
                                                   "resumed_from": resumed.checkpoint_manager.resumed_from})
    write_json(f"{kind}-layout.json", {"checkpoint-3": layout, "world_size": full.accelerator.num_processes,
                                       "distributed_type": str(full.accelerator.distributed_type)})


def kill_rank1_while_writing(step: int) -> None:
    """Make rank 1 die after writing its share of checkpoint-``step`` but before the checkpoint is committed."""
    from trainkit.engine.checkpoint import StagedCheckpoint

    original = StagedCheckpoint.write_engine_state

    def write_then_die(staged, *args, **kwargs):
        original(staged, *args, **kwargs)
        if RANK == 1 and os.path.basename(staged.path) == f".checkpoint-{step}.staging":
            os.kill(os.getpid(), signal.SIGKILL)

    StagedCheckpoint.write_engine_state = write_then_die


def restart() -> None:
    output_dir = os.path.join(OUT, "restart")
    if ATTEMPT == 0:
        kill_rank1_while_writing(KILL_STEP)
    else:
        found = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
        write_json("restart-found.json", {"attempt": ATTEMPT, "entries": found,
                                          "complete": [os.path.basename(p) for p in checkpoints.sorted_checkpoints(output_dir)]})
    trainer = make_trainer(output_dir)
    trainer.train()  # the script does not ask for a resume: the restart does
    save_weights("restart-resumed", trainer)
    write_json("restart.json", {"attempt": ATTEMPT, "resumed_from": trainer.checkpoint_manager.resumed_from,
                                "global_step": trainer.state.global_step})
    reference = make_trainer(os.path.join(OUT, "restart-reference"))
    reference.train()
    save_weights("restart-reference", reference)


SCENARIOS = {"ddp": lambda: stop_and_resume("ddp"), "fsdp": lambda: stop_and_resume("fsdp", **FSDP), "restart": restart,
             "fsdp-async": lambda: stop_and_resume("fsdp-async", async_save=True, **FSDP),
             "fsdp-full-async": lambda: stop_and_resume("fsdp-full-async", async_save=True, **FSDP_FULL)}

if __name__ == "__main__":
    for scenario in sys.argv[2:]:
        SCENARIOS[scenario]()
