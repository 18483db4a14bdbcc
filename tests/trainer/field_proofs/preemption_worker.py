"""One process (CPU) for the enable_jit_checkpoint proof: ``preemption_worker.py OUT``.

Trains the checkpoint workload with save_strategy='no' and enable_jit_checkpoint=True, and sends itself SIGUSR1
after step 2. With the field the run saves OUT/checkpoint-2 and exits 75; ignored, nothing catches the signal.
"""

import os
import signal
import sys

from tests.trainer.checkpoint_workload import make_trainer
from trainkit import TrainerCallback


class SignalAfterStep2(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGUSR1)


trainer = make_trainer(sys.argv[1], max_steps=6, save_strategy="no", eval_strategy="no", enable_jit_checkpoint=True)
trainer.add_callback(SignalAfterStep2())
trainer.train()
