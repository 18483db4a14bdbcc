"""The engine's own settings that the launcher also takes, declared once for both.

``LaunchConfig`` (the launcher's YAML keys and flags) and ``EngineConfig`` (what the engine runs with) declare
these fields with the same :class:`~trainkit.config.options.Option`, so their default, help and parser cannot
drift apart; the resolver hands a launcher value to the engine exactly for the fields that share one
(``trainkit.config.engine``). Each also names the ``Accelerator(...)`` keyword and the ``TrainingArguments``
fields that set it (:class:`~trainkit.config.options.Keyword`), so both mappings loop over these declarations.
Mixed precision, the fourth such setting, is declared with its section
(``trainkit.config.precision.MIXED_PRECISION``). No torch here.
"""

from __future__ import annotations

from datetime import timedelta

from .options import Keyword, Option, boolean, integer, seconds

GRADIENT_ACCUMULATION_STEPS = Option(
    help="Micro-batches per optimizer step (the default of the script's Accelerator).", default=1,
    parse=integer(1), flag_type=int,
    # 1 is Accelerate's default, which scripts pass through from their own argparse defaults
    # (`Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)`): it asks for nothing, so
    # `trainkit launch --gradient_accumulation_steps 4` or a DeepSpeed config still decides.
    accelerator=Keyword("gradient_accumulation_steps", unset=(1,)),
    training_arguments=(Keyword("gradient_accumulation_steps"),))
USE_CPU = Option(help="Run on CPU even where GPUs exist.", default=False, parse=boolean, flag=False,
                 accelerator=Keyword("cpu"), training_arguments=(Keyword("use_cpu", shown="use_cpu=True"),))
COLLECTIVE_TIMEOUT = Option(
    help="Seconds before a collective that never completes fails the job (default 600; gloo's and NCCL's own "
         "are 30 minutes, so a rank that skipped a collective is reported in minutes).",
    default=600.0, parse=seconds, flag_type=float,
    accelerator=Keyword("timeout", owner="InitProcessGroupKwargs", convert=timedelta.total_seconds),
    # ddp_timeout at transformers' default (1800) counts as not set, as every field at its default does.
    training_arguments=(Keyword("ddp_timeout", convert=float),))
