"""``trainkit.tracking``: Accelerate's tracker contract and registry (CPU, one process, local files only)."""

from __future__ import annotations

import pytest

import trainkit.tracking
from trainkit import Accelerator
from trainkit.engine.tracking import registry as engine_tracking
from trainkit.engine.process.state import ProcessState
from trainkit.tracking import (
    GeneralTracker,
    filter_trackers,
    get_available_trackers,
    on_main_process,
    register_tracker_class,
)


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    # Registering is process-wide: each test registers into copies, so no tracker leaks into later tests.
    monkeypatch.setattr(engine_tracking, "OPTIONAL_TRACKERS", dict(engine_tracking.OPTIONAL_TRACKERS))
    monkeypatch.setattr(trainkit.tracking, "LOGGER_TYPE_TO_CLASS", dict(trainkit.tracking.LOGGER_TYPE_TO_CLASS))
    ProcessState.reset()
    yield
    ProcessState.reset()


class ListTracker(GeneralTracker):
    name = "list_tracker"
    requires_logging_directory = False
    started: list = []

    def __init__(self, run_name, **kwargs):
        super().__init__()
        self.run_name, self.kwargs, self.logged = run_name, kwargs, []
        ListTracker.started.append(self)

    @property
    def tracker(self):
        return self.logged

    @on_main_process
    def log(self, values, step=None, **kwargs):
        self.logged.append((dict(values), step))


def test_general_tracker_checks_the_subclass_contract():
    class Incomplete(GeneralTracker):
        name = "incomplete"

        def __init__(self):
            super().__init__()

    with pytest.raises(NotImplementedError, match="requires_logging_directory, tracker"):
        Incomplete()
    with pytest.raises(NotImplementedError, match="GeneralTracker must define name"):
        GeneralTracker()
    GeneralTracker(_blank=True)  # Accelerate's unchecked base: the same class, no error


def test_a_registered_tracker_class_is_started_by_name(tmp_path):
    register_tracker_class(ListTracker)
    assert trainkit.tracking.LOGGER_TYPE_TO_CLASS["list_tracker"] is ListTracker and "list_tracker" in get_available_trackers()
    accelerator = Accelerator(cpu=True, log_with="list_tracker", project_dir=tmp_path)
    accelerator.init_trackers("run-1", init_kwargs={"list_tracker": {"colour": "blue"}})
    tracker = ListTracker.started[-1]
    assert tracker.run_name == "run-1" and tracker.kwargs == {"colour": "blue"}
    accelerator.log({"loss": 1.5}, step=3)
    assert tracker.logged == [({"loss": 1.5}, 3)]
    with pytest.raises(ValueError, match="GeneralTracker subclass"):
        register_tracker_class(object)


def test_filter_trackers_expands_all_and_drops_repeats():
    assert "list_tracker" not in get_available_trackers()  # the registration above did not leak
    pytest.importorskip("tensorboard", reason="filter_trackers(['tensorboard']) needs the optional tensorboard package")
    assert filter_trackers(["tensorboard", "tensorboard"], logging_dir="logs") == ["tensorboard"]
    assert set(filter_trackers("all", logging_dir="logs")) == set(get_available_trackers())
    with pytest.raises(ValueError, match="logging_dir"):
        filter_trackers("tensorboard")
    with pytest.raises(ValueError, match="not_a_tracker"):
        filter_trackers("not_a_tracker")


def test_trackers_trainkit_does_not_build_in_say_so():
    from trainkit.tracking import AimTracker

    with pytest.raises(NotImplementedError, match="GeneralTracker"):
        AimTracker("run")
