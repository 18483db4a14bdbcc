"""2 machines of 1 process each, on loopback (two torchrun agents, gloo on CPU), for the field proofs of
test_field_effects.py: ``fields_nodes_worker.py OUT``.

Rank 1 is the first (and only) process of the second machine: a machine's main process, not the job's. Each
rank writes ``OUT/rank<N>.json``: how many of trainkit's debug lines each run let through on it (an evaluation
logs one).
"""

import json
import logging
import os
import sys

import torch.distributed as dist

from tests.trainer.checkpoint_workload import make_trainer

OUT = sys.argv[1]


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.debug = 0

    def emit(self, record):
        if record.levelno == logging.DEBUG and record.name.startswith("trainkit"):
            self.debug += 1


def debug_lines(name: str, **fields) -> int:
    """Evaluate once with ``fields``; the number of trainkit debug lines this process let through."""
    lines = Lines()
    logging.getLogger().addHandler(lines)
    try:
        make_trainer(os.path.join(OUT, name), save_strategy="no", eval_strategy="no", **fields).evaluate()
    finally:
        logging.getLogger().removeHandler(lines)
        logging.getLogger("trainkit").setLevel(logging.NOTSET)
    return lines.debug


facts = {
    # log_level applies where logs are written: with log_on_each_node=False, only on the job's main process.
    "log_on_each_node": debug_lines("on_each_node", log_on_each_node=False, log_level="debug"),
    # With log_on_each_node=False the second machine's process is a replica: log_level_replica applies.
    "log_level_replica": debug_lines("replica", log_on_each_node=False, log_level_replica="debug"),
}
dist.barrier()
with open(os.path.join(OUT, f"rank{dist.get_rank()}.json"), "w") as handle:
    json.dump(facts, handle)
