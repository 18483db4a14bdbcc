"""MLflow (needs ``mlflow``; imported when the tracker starts)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from trainkit.engine.tracking.base import GeneralTracker, jsonable, logger, warn_skipped



class MLflowTracker(GeneralTracker):
    """Logs to MLflow: the run's name is the experiment; the tracking URI is ``MLFLOW_TRACKING_URI``
    (MLflow's default otherwise); ``init_kwargs['mlflow']`` may give ``run_name``, ``run_id``, ``tags``,
    ``nested_run``, ``description``. Numbers become metrics; other values are skipped with a warning.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name: str | None = None, logging_dir: str | None = None, run_id: str | None = None,
                 tags: Any = None, nested_run: bool = False, run_name: str | None = None,
                 description: str | None = None) -> None:
        import mlflow

        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            tags = json.loads(tags)
        experiment_id = None  # no name: MLflow's active (or default) experiment
        if experiment_name is not None:
            experiment = mlflow.get_experiment_by_name(experiment_name)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else mlflow.create_experiment(experiment_name, tags=tags))
        self.run = mlflow.start_run(run_id=os.environ.get("MLFLOW_RUN_ID", run_id), experiment_id=experiment_id,
                                    run_name=run_name, tags=tags,
                                    nested=bool(os.environ.get("MLFLOW_NESTED_RUN", nested_run)),
                                    description=description)
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        """The active MLflow run."""
        return self.run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        params = {str(k): v for k, v in jsonable(dict(values)).items()}
        limit = self._mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        too_long = [k for k, v in params.items() if len(str(v)) > limit]
        if too_long:
            logger.warning("MLflow keeps parameters up to %d characters; not stored: %s", limit, too_long)
        self._mlflow.log_params({k: v for k, v in params.items() if k not in too_long})

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {}
        for key, value in values.items():
            value = jsonable(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[key] = value
            else:
                warn_skipped(self.name, key, value)
        self._mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()
