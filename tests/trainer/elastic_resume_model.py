"""The checkpoint workload's regressor without dropout: its result does not depend on which rank's random
stream drew a mask, so a run resumed on another world size can be compared with the uninterrupted one."""

from torch import nn

from tests.trainer.checkpoint_workload import FEATURES


class PlainRegressor(nn.Module):
    """Two linear layers with a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        prediction = self.layers(x).squeeze(-1)
        output = {"logits": prediction}
        if labels is not None:
            output["loss"] = ((prediction - labels) ** 2).mean()
        return output
