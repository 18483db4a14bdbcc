"""Starting a function on several local processes from Python (``notebook_launcher``, ``debug_launcher``).

Built on torch's ``torch.distributed.launcher.api.elastic_launch`` (the engine behind torchrun), with a
c10d rendezvous on a free loopback port; the function runs in each worker with RANK/WORLD_SIZE set, so
an ``Accelerator()`` built inside it joins the group.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def notebook_launcher(function: Callable, args: tuple = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str | None = None, master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, max_restarts: int = 0, **kwargs: Any) -> dict[int, Any]:
    """Run ``function(*args)`` on ``num_processes`` local processes; return each rank's return value.

    One machine only (``num_nodes`` > 1 is refused: use ``trainkit launch`` on each machine). With
    ``num_processes`` None or 1 the function runs here, in this process.
    """
    if num_nodes != 1 or node_rank != 0:
        raise NotImplementedError("notebook_launcher starts processes on this machine only; for several machines "
                                  "run `trainkit launch --num_machines N --machine_rank R ...` on each.")
    if mixed_precision not in ("no", None):
        raise ValueError("notebook_launcher(mixed_precision=...): pass it to Accelerator(mixed_precision=...) "
                         "inside the function instead.")
    if not num_processes or num_processes == 1:
        return {0: function(*args)}
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    port = int(use_port) if use_port else _free_port()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=num_processes, run_id=uuid.uuid4().hex,
                          rdzv_endpoint=f"{master_addr}:{port}", rdzv_backend="c10d", max_restarts=max_restarts,
                          start_method="fork" if kwargs.get("start_method") != "spawn" else "spawn")
    return elastic_launch(config, function)(*args)


def debug_launcher(function: Callable, args: tuple = (), num_processes: int = 2) -> dict[int, Any]:
    """Run ``function(*args)`` on ``num_processes`` CPU processes (for tests of distributed code)."""
    import os

    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # workers inherit it: CPU and gloo only
    try:
        return notebook_launcher(function, args, num_processes=num_processes)
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous
