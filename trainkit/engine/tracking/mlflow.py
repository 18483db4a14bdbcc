"""MLflow (needs ``mlflow``; imported when the tracker starts)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from trainkit.engine.tracking.base import LibraryTracker, on_main_process, jsonable, logger, warn_skipped
from trainkit.utils.environment import str_to_bool



class MLflowTracker(LibraryTracker):
    """Logs to MLflow: the run's name is the experiment; the tracking URI is ``MLFLOW_TRACKING_URI``
    (MLflow's default otherwise); ``init_kwargs['mlflow']`` may give ``run_name``, ``run_id``, ``tags``,
    ``nested_run``, ``description``. Numbers become metrics; other values are skipped with a warning.
    """

    name = "mlflow"
    library_attribute = "active_run"
    requires_logging_directory = False

    def __init__(self, experiment_name: str | None = None, logging_dir: str | None = None, run_id: str | None = None,
                 tags: Any = None, nested_run: bool = False, run_name: str | None = None,
                 description: str | None = None) -> None:
        """The ``MLFLOW_EXPERIMENT_NAME``/``MLFLOW_RUN_ID``/``MLFLOW_TAGS`` (JSON)/``MLFLOW_NESTED_RUN`` (yes/no)
        variables override the arguments. Nothing is created before :meth:`start` (``init_trackers`` calls it)."""
        super().__init__()
        tags = os.environ.get("MLFLOW_TAGS", tags)
        nested = os.environ.get("MLFLOW_NESTED_RUN")
        # Accelerate's attribute names, for scripts that read them off the tracker.
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        """The artifact location of an experiment this tracker creates (None: MLflow's default)."""
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = bool(str_to_bool(nested)) if nested is not None else bool(nested_run)
        self.run_name, self.description = run_name, description

    @on_main_process
    def start(self) -> None:
        """Find or create the experiment and start (or resume) the run."""
        import mlflow

        experiment_id = None  # no name: MLflow's active (or default) experiment
        if self.experiment_name is not None:
            experiment = mlflow.get_experiment_by_name(self.experiment_name)
            experiment_id = (experiment.experiment_id if experiment is not None else mlflow.create_experiment(
                self.experiment_name, artifact_location=self.logging_dir, tags=self.tags))
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           tags=self.tags, nested=self.nested_run, description=self.description)
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        """The active MLflow run (``mlflow.ActiveRun``)."""
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        params = {str(k): v for k, v in jsonable(dict(values)).items()}
        limit = self._mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        too_long = [k for k, v in params.items() if len(str(v)) > limit]
        if too_long:
            logger.warning("MLflow keeps parameters up to %d characters; not stored: %s", limit, too_long)
        self._mlflow.log_params({k: v for k, v in params.items() if k not in too_long})

    @on_main_process
    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {}
        for key, value in values.items():
            value = jsonable(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[key] = value
            else:
                warn_skipped(self.name, key, value)
        self._mlflow.log_metrics(metrics, step=step)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Store a matplotlib or plotly figure as the run's artifact ``artifact_file``."""
        self._mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Store every file of ``local_dir`` among the run's artifacts (under ``artifact_path``)."""
        self._mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Store the file ``local_path`` among the run's artifacts (under ``artifact_path``)."""
        self._mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        self._mlflow.end_run()
