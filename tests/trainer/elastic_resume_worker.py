"""Two processes (torchrun): the checkpoint workload without dropout, run whole and stopped after step 2 (a
checkpoint every step). ``elastic_resume_worker.py OUT``; rank 0 writes ``OUT/full.safetensors``.
``tests/trainer/test_elastic_resume.py`` resumes the stopped run on one process."""

import os
import sys

from safetensors.torch import save_file

from tests.trainer.checkpoint_workload import final_weights, make_trainer
from tests.trainer.elastic_resume_model import PlainRegressor

OUT = sys.argv[1]
full = make_trainer(os.path.join(OUT, "full"), model_init=PlainRegressor)
full.train()
weights = final_weights(full)
make_trainer(os.path.join(OUT, "stopped"), stop_after=2, model_init=PlainRegressor).train()
if int(os.environ.get("RANK", "0")) == 0:
    save_file(weights, os.path.join(OUT, "full.safetensors"))
