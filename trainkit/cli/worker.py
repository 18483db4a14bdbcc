"""Worker bootstrap run by torchrun for each rank: die with the launcher, record the exception, run the script.

``python -m trainkit.cli.worker [-m] script_or_module [args...]``.

torchrun starts every worker in its own session, so a SIGKILLed launcher leaves them running (training on,
writing checkpoints). The worker's parent is the process running torchrun's elastic agent, i.e. the
`trainkit launch` process itself (it calls ``torch.distributed.run`` in-process); its pid arrives in
``TRAINKIT_LAUNCHER_PID``. On Linux the kernel delivers SIGKILL when that parent dies
(``PR_SET_PDEATHSIG``); elsewhere a thread polls the parent pid.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from types import TracebackType

from trainkit.config.files import write_text_atomic
from trainkit.config.handoff import LAUNCH_CONFIG_ENV

LAUNCHER_PID_ENV = "TRAINKIT_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 1.0


def _parent_gone(launcher_pid: int) -> bool:
    # Re-parented to init / a subreaper means the launcher died (possibly before we armed the signal).
    return os.getppid() != launcher_pid


def die_with_launcher() -> None:
    """Arrange for this process to be killed when the launcher (its parent) dies."""
    launcher_pid = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    if not launcher_pid:
        return  # not started by `trainkit launch` (e.g. plain torchrun): nothing to watch
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if _parent_gone(launcher_pid):
        os.kill(os.getpid(), signal.SIGKILL)
    if not armed:
        threading.Thread(target=_watch_parent, args=(launcher_pid,), name="trainkit-parent-watch", daemon=True).start()


def _watch_parent(launcher_pid: int) -> None:
    while not _parent_gone(launcher_pid):
        time.sleep(_POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


def _record_for_launcher(error: BaseException) -> None:
    """Write torchrun's per-worker error file so the launcher can name this rank's exception.

    Same JSON as torch's ``ErrorHandler.record_exception``, but written atomically: the agent SIGTERMs the
    other ranks as soon as one fails, and a half-written file makes the agent itself crash on parsing it
    (seen on restart tests: the job ended although restarts were left).
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": f"{type(error).__name__}: {error}", "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
        "timestamp": str(int(time.time())),
    }}}
    try:
        write_text_atomic(path, json.dumps(data))
    except OSError:  # best effort: the traceback still reaches stderr
        pass


def _without_bootstrap_frames(frames: TracebackType | None) -> TracebackType | None:
    """Drop this module's and runpy's frames so tracebacks start in the user's script."""
    own_files = {__file__, runpy.__file__}
    while frames is not None and (frames.tb_frame.f_code.co_filename in own_files
                                  or frames.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        frames = frames.tb_next
    return frames


def run_target(argv: list[str]) -> None:
    """Run ``argv`` (``[-m] target args...``) as ``__main__``, as `python` itself would."""
    if not argv:
        raise SystemExit("usage: python -m trainkit.cli.worker [-m] script.py|module [args...]")
    as_module = argv[0] == "-m"
    if as_module:
        argv = argv[1:]
    target, script_args = argv[0], argv[1:]
    if as_module:
        sys.argv = [target, *script_args]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *script_args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


def _prepare_model_loading() -> None:
    """Settings the script's model loading must see before it runs: ``cpu_ram_efficient_loading``, from
    the launcher's FSDP config or a DeepSpeed config's ``zero3_init_flag``."""
    if not os.environ.get(LAUNCH_CONFIG_ENV):
        return
    from trainkit.config.engine import resolve_engine_config

    fsdp = resolve_engine_config().fsdp
    if fsdp is not None and fsdp.cpu_ram_efficient_loading:
        from trainkit.engine import load_on_rank0_only

        load_on_rank0_only()


def main() -> None:
    """Entry point of ``python -m trainkit.cli.worker``."""
    die_with_launcher()
    # Drop this bootstrap's own folder from the path, as if the script had been started directly.
    if sys.path and sys.path[0] in ("", os.getcwd()) and not os.environ.get("PYTHONSAFEPATH"):
        sys.path.pop(0)
    try:
        _prepare_model_loading()
        run_target(sys.argv[1:])
    except Exception as error:
        error = error.with_traceback(_without_bootstrap_frames(error.__traceback__))
        _record_for_launcher(error)
        raise error


if __name__ == "__main__":
    main()
