"""Worker: trackers on every rank (2 gloo processes on CPU). Writes report_rank{r}.json into argv[1]."""

import json
import sys
from pathlib import Path

from trainkit import Accelerator
from trainkit.tracking import GeneralTracker

OUT = Path(sys.argv[1])


class EveryRank(GeneralTracker):
    """A script's tracker that asks to run on every process (``main_process_only = False``)."""

    name = "every_rank"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    @property
    def tracker(self):
        return self

    def start(self) -> None:
        self.started = True


accelerator = Accelerator(cpu=True, log_with=["jsonl", "tensorboard", EveryRank()], project_dir=str(OUT))
accelerator.init_trackers("ranks")
wrapper = accelerator.get_tracker("tensorboard")
accelerator.log({"loss": 1.0 + accelerator.process_index}, step=1)
report = {"names": [t.name for t in accelerator.trackers], "wrapper": type(wrapper).__name__,
          "writer_here": hasattr(wrapper, "writer"), "custom_started": accelerator.get_tracker("every_rank").started}
accelerator.end_training()
(OUT / f"report_rank{accelerator.process_index}.json").write_text(json.dumps(report))
