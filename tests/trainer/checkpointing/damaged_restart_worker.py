"""Worker for test_damaged_checkpoints_processes.py, run by ``trainkit launch --num_processes 2 --max_restarts 2``.

Attempt 0 saves checkpoint-6, truncates its weights (a disk that lost the end of a file) and dies; attempt 1
resumes by itself, saves checkpoint-6 anew, then flips a byte of checkpoint-7 (same size, wrong checksum)
and dies; attempt 2 must resume from the new checkpoint-6, replay step 7 and finish. Each attempt records
what it resumed from; the last also trains an uninterrupted reference. ``damaged_restart_worker.py OUT``.
"""

import json
import os
import signal
import sys

from safetensors.torch import save_file

from tests.trainer.checkpoint_workload import final_weights, make_trainer
from trainkit import TrainerCallback

OUT = sys.argv[1]
RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
DAMAGE_AT = {0: 6, 1: 7}  # attempt -> the step whose checkpoint it damages before dying


def damage(folder: str, how: str) -> None:
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as handle:
        if how == "truncate":
            handle.truncate(64)
        else:
            handle.seek(-3, os.SEEK_END)
            byte = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([byte[0] ^ 0xFF]))


class DamageAndDie(TrainerCallback):
    """After the save of step DAMAGE_AT[ATTEMPT]: rank 0 damages that checkpoint, then kills itself."""

    def on_save(self, args, state, control, **kwargs):
        step = DAMAGE_AT.get(ATTEMPT)
        if step == state.global_step and RANK == 0:
            damage(os.path.join(args.output_dir, f"checkpoint-{step}"), "truncate" if ATTEMPT == 0 else "flip")
            os.kill(os.getpid(), signal.SIGKILL)
        return control


def main() -> None:
    output_dir = os.path.join(OUT, "run")
    trainer = make_trainer(output_dir)
    trainer.add_callback(DamageAndDie())
    trainer.train()  # unchanged script: the restart makes it resume
    record = {"attempt": ATTEMPT, "resumed_from": trainer.checkpoint_manager.resumed_from,
              "global_step": trainer.state.global_step, "entries": sorted(os.listdir(output_dir))}
    weights = final_weights(trainer)
    reference = make_trainer(os.path.join(OUT, "reference"))
    reference.train()
    reference_weights = final_weights(reference)
    if RANK == 0:
        save_file(weights, os.path.join(OUT, "resumed.safetensors"))
        save_file(reference_weights, os.path.join(OUT, "reference.safetensors"))
        with open(os.path.join(OUT, "outcome.json"), "w", encoding="utf-8") as handle:
            json.dump(record, handle)


if __name__ == "__main__":
    main()
