"""transformers' Trainer API, compared member by member with the installed transformers (CPU only, one process).

The members come from the installed transformers at test time, never from a list typed here, so each release
is compared with what it has (transformers 5.1's ``_rotate_checkpoints``, 5.24's ``_finalize_training``...):

- ``Trainer`` and ``Seq2SeqTrainer``: every public member and every underscore member (the hooks published
  subclasses override are underscore methods: ``_save``, ``_prepare_inputs``, ``_inner_training_loop``...);
- ``TrainingArguments``, ``Seq2SeqTrainingArguments`` and the callback classes (``TrainerCallback``,
  ``CallbackHandler``, ``TrainerState``, ``TrainerControl``, ``ExportableState``, ``EarlyStoppingCallback``,
  ``ProgressCallback``, ``PrinterCallback``, ``DefaultFlowCallback``): every public member, and ``__init__``
  (for the dataclasses, their fields as constructor parameters).

Each member has a counterpart in trainkit: a method with the same parameters (names, kinds, order, defaults;
trainkit may add keyword-only parameters with defaults, which no call written for transformers reaches), a
static or class method of the same kind, a property or attribute of the same name, a constant of the same value.
:data:`ALLOWED` holds the deliberate differences, by member and parameter, each with its reason (and, for a
difference only some releases have, the releases); a stale entry fails :func:`test_every_allowance_is_needed`.
A Trainer subclass that overrides one of transformers' hooks trainkit does not call gets a notice saying why
(:data:`trainkit.trainer.hooks.NOT_CALLED`), checked here against the allow-list.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import types
from typing import Any, NamedTuple

import pytest
import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers import trainer_callback

from trainkit.trainer.hooks import NOT_CALLED

INSTALLED = Version(transformers.__version__)


class Allowed(NamedTuple):
    """A deliberate difference: why, and the transformers releases that have it (None: every release)."""

    reason: str
    releases: str | None = None

    def applies(self) -> bool:
        return self.releases is None or INSTALLED in SpecifierSet(self.releases)


def _absent(reason: str, releases: str | None = None) -> Allowed:
    return Allowed(f"not in trainkit: {reason}", releases)


# Deliberate differences: "Class.member" (the member is absent, or differs as a whole) or
# "Class.member(parameter)" (that parameter differs). docs/migrating-from-transformers.md lists them too.
# The Trainer hooks trainkit does not have are trainkit.trainer.hooks.NOT_CALLED (with their reasons, which a
# subclass overriding one is told); those only transformers 5.1 has are marked so below.
NEWER_ONLY = {"_defer_fsdp_gradient_reduction", "_sync_replicated_trainable_parameters"}  # after 5.17
AFTER_5_1 = {"_has_mixed_mesh_grads", "_mixed_mesh_grad_norm"}
OLDER_ONLY = {"_activate_neftune", "_deactivate_neftune", "_add_sm_patterns_to_gitignore", "_align_special_tokens",
              "_deepspeed_sp_compute_loss", "_fsdp_qlora_plugin_updates", "_is_attention_mask_causal", "_nested_gather",
              "_rotate_checkpoints", "_sorted_checkpoints", "_save_tpu", "num_tokens", "propagate_args_to_deepspeed"}
ALLOWED: dict[str, Allowed] = {
    **{f"Trainer.{name}": _absent(reason, "<=5.1" if name in OLDER_ONLY else ">5.17" if name in NEWER_ONLY else
                                  ">5.1" if name in AFTER_5_1 else None)
       for name, reason in NOT_CALLED.items()},
    "Trainer.create_optimizer(model)": Allowed("create_optimizer(model=None) came after transformers 5.1; trainkit "
                                               "has the later signature", "<=5.1"),
    "Trainer.set_initial_training_values(total_train_batch_size)": Allowed(
        "transformers 5.1 passed the global batch in; later releases compute it (get_total_train_batch_size), "
        "as trainkit does", "<=5.1"),
    "Trainer.init_hf_repo(private)": Allowed("private= came after transformers 5.17; trainkit has the later "
                                             "signature", "<=5.17"),
    "Trainer.push_to_hub(private)": Allowed("as init_hf_repo(private)", "<=5.17"),
    # -- TrainingArguments ------------------------------------------------------------------------------
    "TrainingArguments.__init__(positions)": Allowed(
        "transformers itself reorders the fields between releases (5.1 and 5.24 differ after output_dir): only "
        "output_dir's position is a contract; every field is compared by name, kind and default"),
    "TrainingArguments.__init__(enable_jit_checkpoint)": Allowed("None: save on preemption whenever checkpoints "
                                                                 "are written (issue 13); False turns it off"),
    "TrainingArguments.__init__(trackio_space_id)": Allowed("transformers 5.1 defaults it to 'trackio' (its "
                                                            "Trackio callback's Space); trainkit drives no "
                                                            "Trackio tracker", "<=5.1"),
    "TrainingArguments.__init__(warmup_ratio)": Allowed("transformers 5.1's field, mapped onto warmup_steps with "
                                                        "a notice (trainer/training_arguments/older_fields.py)", ">5.1"),
    "TrainingArguments.__init__(group_by_length)": Allowed("transformers 5.1's field, mapped onto "
                                                           "train_sampling_strategy (older_fields.py)", ">5.1"),
    "TrainingArguments.__init__(logging_dir)": Allowed("transformers 5.1's field, the TensorBoard folder "
                                                       "(older_fields.py)", ">5.1"),
    **{f"TrainingArguments.__init__({name})": Allowed("a later transformers' field (trainkit has the newest "
                                                      "release's fields)", "<=5.1")
       for name in ("dataloader_in_order", "dataloader_multiprocessing_context", "ddp_static_graph",
                    "trackio_bucket_id", "trackio_static_space_id", "train_sampling_strategy")},
    "TrainingArguments.__init__(activation_checkpointing)": Allowed("transformers 5.24's name of "
                                                                    "gradient_checkpointing", "<=5.17"),
    "TrainingArguments.__init__(activation_checkpointing_kwargs)": Allowed("as activation_checkpointing", "<=5.17"),
    "TrainingArguments.__init__(gradient_checkpointing)": Allowed("None: not set (transformers 5.24's default, "
                                                                  "the older name of activation_checkpointing)",
                                                                  "<=5.17"),
    "TrainingArguments.__init__(async_save)": Allowed("trainkit's field: checkpoints written in the background "
                                                      "(docs/checkpoints.md)"),
    "TrainingArguments.__init__(async_save_when_busy)": Allowed("trainkit's field, with async_save"),
    "TrainingArguments.__init__(checkpoint_dir)": Allowed("trainkit's field: where checkpoint-N folders go (a folder "
                                                          "or an object-store URL; docs/checkpoints.md)"),
    "TrainingArguments.is_torch_greater_or_equal_than_2_8": _absent("a torch version flag of transformers' "
                                                                     "own code, not an argument"),
    "TrainingArguments.set_training(activation_checkpointing)": Allowed(
        "before transformers 5.24 set_training had only gradient_checkpointing (renamed activation_checkpointing); "
        "trainkit has the later signature, which takes both names", "<=5.17"),
    "TrainingArguments.set_training(gradient_checkpointing)": Allowed("as activation_checkpointing", "<=5.17"),
    "TrainingArguments.set_lr_scheduler(warmup_ratio)": Allowed("transformers 5.1's; later releases take "
                                                                "warmup_steps (a ratio when below 1)", "<=5.1"),
    "TrainingArguments.set_dataloader(multiprocessing_context)": Allowed("added after transformers 5.1", "<=5.1"),
    "TrainingArguments.set_dataloader(in_order)": Allowed("added after transformers 5.1", "<=5.1"),
    "TrainingArguments.set_dataloader(auto_find_batch_size)": Allowed("a later position than 5.1's (two "
                                                                      "parameters were added before it)", "<=5.1"),
    "TrainingArguments.set_dataloader(ignore_data_skip)": Allowed("as auto_find_batch_size", "<=5.1"),
    "TrainingArguments.set_dataloader(sampler_seed)": Allowed("as auto_find_batch_size", "<=5.1"),
    # -- callbacks ---------------------------------------------------------------------------------------
    **{f"CallbackHandler.{event}(kwargs)": Allowed("the events take **kwargs from transformers 5.2 on; trainkit "
                                                   "has the later signature", "<=5.1")
       for event in ("on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
                     "on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end", "on_step_end",
                     "on_evaluate", "on_predict", "on_save", "on_log", "on_prediction_step")},
    "TrainerState.__init__(epoch)": Allowed("transformers 5.1's default was None, later releases' 0 (trainkit's)",
                                            "<=5.1"),
}

# Members another engineer of this round is adding (issue 33): compared as soon as trainkit has them.
ELSEWHERE = {
    "_get_train_sampler": "tf-numbers (issue 33 item 6: transformers' samplers)",
    "_get_eval_sampler": "tf-numbers (issue 33 item 6: transformers' samplers)",
}

CALLBACK_CLASSES = ["TrainerCallback", "CallbackHandler", "TrainerState", "TrainerControl", "ExportableState",
                    "EarlyStoppingCallback", "ProgressCallback", "PrinterCallback", "DefaultFlowCallback"]


class Compared(NamedTuple):
    """One class of transformers and trainkit's counterpart (None: trainkit lacks it, which fails)."""

    name: str
    theirs: type
    ours: type | None
    trainer: bool  # a Trainer: underscore members are compared too (subclasses override them)


def _trainkit_class(name: str) -> type | None:
    import trainkit
    import trainkit.trainer

    return getattr(trainkit, name, None) or getattr(trainkit.trainer, name, None)


def _classes() -> list[Compared]:
    compared = [Compared("Trainer", transformers.Trainer, _trainkit_class("Trainer"), True),
                Compared("TrainingArguments", transformers.TrainingArguments, _trainkit_class("TrainingArguments"), False),
                Compared("Seq2SeqTrainer", transformers.Seq2SeqTrainer, _trainkit_class("Seq2SeqTrainer"), True),
                Compared("Seq2SeqTrainingArguments", transformers.Seq2SeqTrainingArguments,
                         _trainkit_class("Seq2SeqTrainingArguments"), False)]
    compared += [Compared(name, getattr(trainer_callback, name), _trainkit_class(name), False) for name in CALLBACK_CLASSES]
    return compared


CLASSES = _classes()


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def members(compared: Compared) -> dict[str, Any]:
    """transformers' members of one class, by name (``inspect.getattr_static`` objects), fields left out."""
    cls = compared.theirs
    names = [name for name in dir(cls) if not (name.startswith("__") and name != "__init__")]
    if not compared.trainer:
        names = [name for name in names if not name.startswith("_") or name == "__init__"]
    fields = _field_names(cls)
    return {name: inspect.getattr_static(cls, name) for name in names
            if name not in fields and (name == "__init__" or name not in dir(object))}


def _entries() -> list[tuple[str, str]]:
    return [(compared.name, name) for compared in CLASSES for name in members(compared)]


ENTRIES = _entries()


def _allowance(class_name: str, member: str, parameter: str | None = None) -> Allowed | None:
    """The allowance for ``Class.member`` (or its parameter); a Seq2Seq class inherits its base class's."""
    suffix = f"{member}({parameter})" if parameter is not None else member
    for owner in (class_name, class_name.removeprefix("Seq2Seq")):
        allowed = ALLOWED.get(f"{owner}.{suffix}")
        if allowed is not None and allowed.applies():
            return allowed
    return None


_FACTORY = getattr(dataclasses, "_HAS_DEFAULT_FACTORY_CLASS", None)


def _default(cls: type, parameter: inspect.Parameter) -> Any:
    """A parameter's default, a dataclass field's factory called (its signature shows only ``<factory>``)."""
    if _FACTORY is not None and isinstance(parameter.default, _FACTORY):
        field = {f.name: f for f in dataclasses.fields(cls)}[parameter.name]
        return field.default_factory()  # type: ignore[misc]
    return parameter.default


def _same_default(theirs: Any, ours: Any) -> bool:
    if theirs is inspect.Parameter.empty or ours is inspect.Parameter.empty:
        return theirs is ours
    if isinstance(theirs, enum.Enum) or isinstance(ours, enum.Enum):
        return getattr(theirs, "value", theirs) == getattr(ours, "value", ours)
    if callable(theirs):
        return callable(ours) and getattr(theirs, "__name__", None) == getattr(ours, "__name__", None)
    try:
        return bool(theirs == ours) and (type(theirs) is type(ours) or isinstance(theirs, (int, float)) and
                                         isinstance(ours, (int, float)) and not isinstance(ours, bool))
    except Exception:  # noqa: BLE001 - objects without a usable ==
        return type(theirs) is type(ours)


def _parameters(function: Any) -> list[inspect.Parameter]:
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    return parameters


def signature_differences(compared: Compared, member: str) -> list[tuple[str | None, str]]:
    """(parameter or None, what differs) between transformers' ``member`` and trainkit's."""
    theirs_cls, ours_cls = compared.theirs, compared.ours
    theirs, ours = getattr(theirs_cls, member), getattr(ours_cls, member)
    try:
        params_theirs = _parameters(theirs)
    except (TypeError, ValueError):
        return []  # a builtin without a signature on transformers' side: nothing to compare
    try:
        params_ours = {p.name: p for p in _parameters(ours)}
    except (TypeError, ValueError):
        return [(None, "trainkit's has no inspectable signature")]
    problems: list[tuple[str | None, str]] = []
    positions = {name: index for index, name in enumerate(params_ours)}
    for index, param in enumerate(params_theirs):
        mine = params_ours.get(param.name)
        if mine is None:
            problems.append((param.name, f"missing parameter {param.name!r}"))
            continue
        if mine.kind != param.kind:
            problems.append((param.name, f"{param.name!r} is {mine.kind.name}, transformers' is {param.kind.name}"))
        theirs_default, ours_default = _default(theirs_cls, param), _default(ours_cls, mine)
        if not _same_default(theirs_default, ours_default):
            problems.append((param.name, f"{param.name!r} defaults to {ours_default!r}, transformers' to "
                                         f"{theirs_default!r}"))
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) and positions[param.name] != index:
            problems.append(("positions" if member == "__init__" and index > 0 else param.name,
                             f"{param.name!r} is positional parameter {positions[param.name]}, transformers' is {index}"))
    names_theirs = {p.name for p in params_theirs}
    for name, mine in params_ours.items():
        if name in names_theirs:
            continue
        if mine.kind is mine.KEYWORD_ONLY and mine.default is not mine.empty:
            continue  # a trainkit extension no call written for transformers can reach
        if mine.kind is mine.VAR_KEYWORD and any(p.kind is p.VAR_KEYWORD for p in params_theirs):
            continue
        problems.append((name, f"extra parameter {name!r} ({mine.kind.name})"))
    return problems


def member_differences(compared: Compared, member: str) -> list[tuple[str | None, str]]:
    """Everything that differs for one member: absent, of another kind, another signature or value."""
    theirs_static = inspect.getattr_static(compared.theirs, member)
    if not hasattr(compared.ours, member):
        return [(None, f"{compared.name}.{member} is missing")]
    ours_static = inspect.getattr_static(compared.ours, member)
    if isinstance(theirs_static, (property, types.GetSetDescriptorType, types.MemberDescriptorType)) or \
            type(theirs_static).__name__ == "cached_property":
        return []  # an attribute: its presence is the contract
    if not callable(getattr(compared.theirs, member)) and not isinstance(theirs_static, (staticmethod, classmethod)):
        value = getattr(compared.theirs, member)
        if isinstance(value, (str, int, float, bool, type(None), tuple, list, dict)):
            ours_value = getattr(compared.ours, member)
            return [] if _same_default(value, ours_value) else [(None, f"value {ours_value!r}, transformers' {value!r}")]
        return []
    problems = []
    for kind in (staticmethod, classmethod):
        if isinstance(theirs_static, kind) != isinstance(ours_static, kind):
            problems.append((None, f"a {kind.__name__} on one side only"))
    return problems + signature_differences(compared, member)


def unallowed(compared: Compared, member: str) -> list[str]:
    problems = member_differences(compared, member)
    if _allowance(compared.name, member) is not None:
        return []
    return [text for parameter, text in problems
            if parameter is None or _allowance(compared.name, member, parameter) is None]


def _compared(class_name: str) -> Compared:
    return next(compared for compared in CLASSES if compared.name == class_name)


def test_the_comparison_covers_transformers(record_property):
    """Guards the enumeration: the counts compared, per class (reported in the test's properties and log)."""
    counts = {compared.name: len(members(compared)) for compared in CLASSES}
    for name, count in counts.items():
        record_property(name, count)
    logging.getLogger(__name__).info("transformers %s: members compared %s", transformers.__version__, counts)
    assert counts["Trainer"] > 80 and counts["TrainingArguments"] > 20 and counts["CallbackHandler"] > 15


@pytest.mark.parametrize("class_name, member", ENTRIES, ids=[f"{c}.{m}" for c, m in ENTRIES])
def test_member_matches_transformers(class_name, member):
    compared = _compared(class_name)
    assert compared.ours is not None, f"trainkit has no {class_name}"
    if member in ELSEWHERE and not hasattr(compared.ours, member):
        pytest.skip(f"{member}: added by {ELSEWHERE[member]}; compared once trainkit has it")
    problems = unallowed(compared, member)
    assert not problems, f"trainkit's {class_name}.{member}: " + "; ".join(problems)


def test_every_allowance_is_needed():
    """An allowance for the installed release names a difference that exists (no stale entries)."""
    stale = []
    for key, allowed in ALLOWED.items():
        if not allowed.applies():
            continue
        class_name, _, rest = key.partition(".")
        member, _, parameter = rest.partition("(")
        parameter = parameter.rstrip(")") or None
        compared = _compared(class_name)
        if member not in members(compared):
            stale.append(f"{key} (transformers {INSTALLED} has no {class_name}.{member})")
            continue
        found = member_differences(compared, member)
        if parameter is None and not found:
            stale.append(f"{key} (no difference)")
        elif parameter is not None and parameter not in [p for p, _ in found]:
            stale.append(f"{key} (no difference for {parameter!r})")
    assert not stale, "allowances that no longer apply: " + "; ".join(stale)


def test_hooks_trainkit_does_not_call_are_announced_when_overridden(caplog):
    """A subclass overriding a transformers hook trainkit never calls hears so when it is built."""
    from trainkit.trainer.hooks import NOT_CALLED

    absent = {key.split(".", 1)[1] for key, allowed in ALLOWED.items()
              if key.startswith("Trainer.") and "(" not in key and allowed.reason.startswith("not in trainkit")}
    assert absent == set(NOT_CALLED), "the notices and the allow-list name the same hooks"
    present = sorted(name for name in NOT_CALLED if hasattr(transformers.Trainer, name))
    assert present, "the installed transformers has some of them"

    from tests.trainer.helpers import EchoModel, IndexDataset
    from trainkit import Trainer, TrainingArguments

    class Custom(Trainer):
        pass

    setattr(Custom, present[0], lambda self, *args, **kwargs: None)
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        Custom(model=EchoModel(), args=TrainingArguments("unused", report_to="none", use_cpu=True),
               train_dataset=IndexDataset(4))
    assert present[0] in caplog.text and "does not call" in caplog.text


def test_callback_classes_import_where_transformers_exports_them():
    """``trainer.remove_callback(PrinterCallback)`` needs the class under the name scripts import."""
    import trainkit
    import trainkit.trainer

    for name in CALLBACK_CLASSES:
        assert hasattr(trainkit.trainer, name), f"trainkit.trainer.{name}"
        if hasattr(transformers, name):
            assert getattr(trainkit, name) is getattr(trainkit.trainer, name), f"trainkit.{name}"
