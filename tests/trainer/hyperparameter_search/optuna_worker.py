"""Worker (torchrun, gloo on CPU): an Optuna search on every rank; rank 0 runs the study and sends each trial's
parameters to the others. Each rank writes what it ended with to ``argv[1]/rank{N}.json``."""

import json
import os
import sys

import optuna
import torch.distributed as dist

import trainkit
from tests.trainer.hyperparameter_search import search_task


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trainer = search_task.trainer(trainkit, os.path.join(sys.argv[1], "out"), num_train_epochs=1)
    # A model_init that draws from the trial cannot run on the other ranks: they receive only the parameters
    # hp_space drew (as in transformers), so this one draws nothing.
    trainer.model_init = lambda: search_task.Regressor()
    best = trainer.hyperparameter_search(hp_space=search_task.optuna_space, n_trials=2, backend="optuna",
                                         sampler=optuna.samplers.TPESampler(seed=0))
    result = {"best": None if best is None else [best.run_id, best.objective, best.hyperparameters],
              "learning_rate": trainer.args.learning_rate,
              "batch_size": trainer.args.per_device_train_batch_size,
              "world_size": dist.get_world_size()}
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
