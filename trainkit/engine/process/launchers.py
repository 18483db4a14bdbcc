"""Starting a function on several local processes from Python (``notebook_launcher``, ``debug_launcher``).

Built on torch's ``torch.distributed.launcher.api.elastic_launch`` (the engine behind torchrun), with a
c10d rendezvous on a free loopback port; the function runs in each worker with RANK/WORLD_SIZE set, so
an ``Accelerator()`` built inside it joins the group.
"""

from __future__ import annotations

import functools
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
                      node_rank: int = 0, num_nodes: int = 1, rdzv_backend: str = "static", rdzv_endpoint: str = "",
                      rdzv_conf: dict[str, Any] | None = None, rdzv_id: str = "none", max_restarts: int = 0,
                      monitor_interval: float = 0.1, log_line_prefix_template: str | None = None, *,
                      start_method: str = "fork") -> dict[int, Any]:
    """Run ``function(*args)`` on ``num_processes`` local processes; return each rank's return value.

    One machine only (``num_nodes`` > 1 is refused: use ``trainkit launch`` on each machine). With
    ``num_processes`` None or 1 the function runs here, in this process. ``use_port`` None picks a free port;
    ``rdzv_endpoint`` (host:port) replaces ``master_addr``/``use_port``; ``rdzv_conf``, ``rdzv_id``,
    ``monitor_interval`` and ``log_line_prefix_template`` go to torch's elastic launcher. ``start_method``
    (trainkit's, keyword only): "fork" (default, as notebooks need) or "spawn".
    """
    if num_nodes != 1 or node_rank != 0:
        raise NotImplementedError("notebook_launcher starts processes on this machine only; for several machines "
                                  "run `trainkit launch --num_machines N --machine_rank R ...` on each.")
    if mixed_precision not in ("no", None):
        raise ValueError("notebook_launcher(mixed_precision=...): pass it to Accelerator(mixed_precision=...) "
                         "inside the function instead.")
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"notebook_launcher(rdzv_backend={rdzv_backend!r}): one machine needs 'static' or 'c10d'.")
    if start_method not in ("fork", "spawn"):
        raise ValueError(f"notebook_launcher(start_method={start_method!r}): use 'fork' or 'spawn'.")
    if not num_processes or num_processes == 1:
        return {0: function(*args)}
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    endpoint = rdzv_endpoint or f"{master_addr}:{int(use_port) if use_port else _free_port()}"
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=num_processes,
                          run_id=uuid.uuid4().hex if rdzv_id == "none" else rdzv_id, rdzv_endpoint=endpoint,
                          rdzv_backend="c10d", rdzv_configs=dict(rdzv_conf or {}), max_restarts=max_restarts,
                          monitor_interval=monitor_interval, log_line_prefix_template=log_line_prefix_template,
                          start_method=start_method)
    entrypoint = functools.update_wrapper(functools.partial(_run_in_fresh_state, function), function)
    # torch's launcher names the run after the function; a functools.partial has no name of its own.
    inner = getattr(function, "func", function)
    for attribute in ("__name__", "__qualname__"):
        setattr(entrypoint, attribute, getattr(function, attribute, None) or getattr(inner, attribute,
                                                                                      type(function).__name__))
    return elastic_launch(config, entrypoint)(*args)


def _run_in_fresh_state(function: Callable, *args: Any) -> Any:
    """In a worker: forget a process state forked from the launching process (it describes one process, not
    this worker's place in the group), so the function's Accelerator reads the launcher's RANK/WORLD_SIZE."""
    from trainkit.engine.process.state import ProcessState

    ProcessState._instance = None
    return function(*args)


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
