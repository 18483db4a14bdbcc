"""The checkpoint workload's regressor without dropout: its result does not depend on which rank's random
stream drew a mask, so a run resumed on another world size can be compared with the uninterrupted one."""

from tests.trainer.checkpoint_workload import DropoutRegressor


class PlainRegressor(DropoutRegressor):
    """Two linear layers with a ReLU (the workload's regressor, its dropout layer left out)."""

    def __init__(self) -> None:
        super().__init__(dropout=None)
