"""transformers' Trainer hooks that trainkit's Trainer does not have, each with the reason, and the notice a
subclass gets when it overrides one (its override would otherwise never run, silently).

Every other member of transformers' Trainer exists in trainkit with its signature and is called where
transformers calls it (tests/trainer/test_transformers_signatures.py and test_hook_call_order.py check both).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_ENGINE = "trainkit's engine does this work itself (Accelerator.prepare, the strategy's clip_grad_norm_ and no_sync)"
_ONE_CHECKPOINT = ("the optimizer, schedule, loss scaler, random states and data position are saved and restored "
                   "together as one atomic, verified engine checkpoint, never piecewise (save_only_model=True gives "
                   "weights-only checkpoints)")
_OLDER = "a transformers 5.1 internal; "

NOT_CALLED: dict[str, str] = {
    "_defer_fsdp_gradient_reduction": _ENGINE + "; models sharded at load time are prepared by the engine",
    "_sync_replicated_trainable_parameters": _ENGINE,
    "_has_mixed_mesh_grads": _ENGINE + "; clip_grad_norm_ spans every device mesh",
    "_mixed_mesh_grad_norm": _ENGINE + "; clip_grad_norm_ spans every device mesh",
    "_move_model_to_device": "the engine places the model (Accelerator.prepare)",
    "_prepare_context_parallel_inputs": "context parallelism is refused by trainkit's ParallelismConfig (cp_size > 1)",
    "_save_optimizer_and_scheduler": _ONE_CHECKPOINT,
    "_save_scaler": _ONE_CHECKPOINT,
    "_save_rng_state": _ONE_CHECKPOINT,
    "_load_optimizer_and_scheduler": _ONE_CHECKPOINT,
    "_load_scaler": _ONE_CHECKPOINT,
    "_load_rng_state": _ONE_CHECKPOINT,
    "_issue_warnings_after_load": ("weight loads are strict: missing, unexpected or mis-shaped keys fail the load "
                                   "naming them before anything is copied, so there is nothing to warn about"),
    "_activate_neftune": _OLDER + "NEFTune is activated through the installed transformers' own hook",
    "_deactivate_neftune": _OLDER + "NEFTune is activated through the installed transformers' own hook",
    "_add_sm_patterns_to_gitignore": _OLDER + "SageMaker is not driven by trainkit",
    "_align_special_tokens": _OLDER + "aligning the model's and the tokenizer's special tokens is the script's",
    "_deepspeed_sp_compute_loss": _OLDER + "DeepSpeed's sequence parallelism is not driven by trainkit",
    "_fsdp_qlora_plugin_updates": _OLDER + "QLoRA under FSDP is prepared by the engine",
    "_is_attention_mask_causal": _OLDER + "context parallelism is refused (cp_size > 1)",
    "_nested_gather": _OLDER + "Accelerator.gather does it",
    "_rotate_checkpoints": _OLDER + "rotation is the CheckpointManager's (never the best, newest or resumed-from)",
    "_sorted_checkpoints": _OLDER + "rotation is the CheckpointManager's",
    "_save_tpu": _OLDER + "TPUs are not driven by trainkit",
    "num_tokens": _OLDER + "tokens are counted while training (state.num_input_tokens_seen)",
    "propagate_args_to_deepspeed": _OLDER + "TrainingArguments(deepspeed=...) is translated when the Trainer is built",
}
"""transformers hook -> why trainkit's Trainer has (and calls) no such method."""


def announce_overridden_hooks(trainer_cls: type) -> None:
    """Warn, once per hook, when a Trainer subclass defines one of :data:`NOT_CALLED` (it would never run)."""
    for name in sorted(NOT_CALLED):
        owner = next((cls for cls in trainer_cls.__mro__ if name in vars(cls)), None)
        if owner is not None and not owner.__module__.startswith("transformers"):
            logger.warning("%s.%s overrides a transformers Trainer hook that trainkit's Trainer does not call: %s.",
                           owner.__name__, name, NOT_CALLED[name])
