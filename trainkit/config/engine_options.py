"""The engine's own settings that the launcher also takes, declared once for both.

``LaunchConfig`` (the launcher's YAML keys and flags) and ``EngineConfig`` (what the engine runs with) declare
these fields with the same :class:`~trainkit.config.options.Option`, so their default, help and parser cannot
drift apart; the resolver hands a launcher value to the engine exactly for the fields that share one
(``trainkit.config.engine``). Mixed precision, the fourth such setting, is declared with its section
(``trainkit.config.precision.MIXED_PRECISION``). No torch here.
"""

from __future__ import annotations

from .options import Option, boolean, integer, seconds

GRADIENT_ACCUMULATION_STEPS = Option(
    help="Micro-batches per optimizer step (the default of the script's Accelerator).", default=1,
    parse=integer(1), flag_type=int)
USE_CPU = Option(help="Run on CPU even where GPUs exist.", default=False, parse=boolean, flag=False)
COLLECTIVE_TIMEOUT = Option(
    help="Seconds before a collective that never completes fails the job (default 600; gloo's and NCCL's own "
         "are 30 minutes, so a rank that skipped a collective is reported in minutes).",
    default=600.0, parse=seconds, flag_type=float)
