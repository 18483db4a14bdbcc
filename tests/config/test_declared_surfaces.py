"""Every declared engine setting reaches the engine from ``Accelerator(...)`` and from ``TrainingArguments``, and every
checkpointing setting from ``ProjectConfiguration`` and ``TrainingArguments``, by its declaration alone (CPU only,
no processes: the surfaces build settings and configurations, never a model).

A new ``Option`` of ``EngineConfig`` (``config/engine_options.py``) or of the checkpointing section
(``config/checkpointing.py``) without its keyword, or without a row below, fails here naming it.
"""

from __future__ import annotations

import cProfile
import dataclasses
import inspect
import pstats
from datetime import timedelta

import pytest

from trainkit import Accelerator, InitProcessGroupKwargs, TrainingArguments
from trainkit.config.checkpointing import (
    CHECKPOINTING,
    parse_async_save,
    parse_async_save_when_busy,
    training_arguments_fields,
)
from trainkit.config.engine import EngineConfig, Setting
from trainkit.config.options import declared_options
from trainkit.engine.accelerator_parts.configuration import ACCELERATOR_KEYWORDS, accelerator_settings
from trainkit.trainer.training_arguments.engine_settings import accelerator_arguments, training_arguments_settings
from trainkit.utils import ProjectConfiguration

ENGINE_OPTIONS = declared_options(EngineConfig)

# keyword -> (a value that sets it, the setting it gives, its provenance): the strings users and tests read.
ACCELERATOR_CASES = {
    "mixed_precision": ("bf16", "bf16", "Accelerator(mixed_precision=)"),
    "gradient_accumulation_steps": (3, 3, "Accelerator(gradient_accumulation_steps=)"),
    "cpu": (True, True, "Accelerator(cpu=)"),
    "timeout": (timedelta(seconds=90), 90.0, "InitProcessGroupKwargs(timeout=)"),
}
ACCELERATOR_NOT_SET = {"gradient_accumulation_steps": 1}  # Accelerate's default, passed through by scripts
TRAINING_ARGUMENTS_CASES = {
    "bf16": (True, "bf16", "TrainingArguments(bf16=True)"),
    "fp16": (True, "fp16", "TrainingArguments(fp16=True)"),
    "gradient_accumulation_steps": (2, 2, "TrainingArguments(gradient_accumulation_steps=)"),
    "use_cpu": (True, True, "TrainingArguments(use_cpu=True)"),
    "ddp_timeout": (120, 120.0, "TrainingArguments(ddp_timeout=)"),
}
# TrainingArguments field -> a value other than its default, and the ProjectConfiguration field it arrives as.
CHECKPOINTING_CASES = {"save_on_each_node": True, "async_save": True, "async_save_when_busy": "skip"}


def test_every_declared_engine_setting_names_its_keyword_and_fields():
    for name, option in ENGINE_OPTIONS.items():
        assert option.accelerator is not None, f"{name}: declare the Accelerator(...) keyword that sets it"
        assert option.training_arguments, f"{name}: declare the TrainingArguments field(s) that set it"
        keyword = option.accelerator
        if keyword.owner:  # a field of a kwargs handler the Accelerator takes (InitProcessGroupKwargs.timeout)
            owner = {"InitProcessGroupKwargs": InitProcessGroupKwargs}[keyword.owner]
            assert keyword.name in {f.name for f in dataclasses.fields(owner)}, name
        else:
            assert keyword.name in inspect.signature(Accelerator.__init__).parameters, name
        for field in option.training_arguments:
            assert field.name in {f.name for f in dataclasses.fields(TrainingArguments)}, f"{name}: {field.name}"
        assert keyword.name in ACCELERATOR_CASES, f"{name}: add a row for Accelerator({keyword.name}=) above"
        for field in option.training_arguments:
            assert field.name in TRAINING_ARGUMENTS_CASES, f"{name}: add a row for TrainingArguments({field.name}=)"
    assert set(ACCELERATOR_KEYWORDS) == set(ACCELERATOR_CASES)


@pytest.mark.parametrize("keyword", sorted(ACCELERATOR_CASES))
def test_an_accelerator_keyword_is_explicit_only_when_given(keyword):
    given, value, source = ACCELERATOR_CASES[keyword]
    name = ACCELERATOR_KEYWORDS[keyword]
    assert accelerator_settings(**{keyword: given})[name] == Setting(value, source)
    assert name not in accelerator_settings(**{keyword: None})
    if keyword in ACCELERATOR_NOT_SET:
        assert name not in accelerator_settings(**{keyword: ACCELERATOR_NOT_SET[keyword]})


def test_an_unknown_accelerator_keyword_is_refused():
    with pytest.raises(TypeError, match="unknown keywords \\['mixed_precison'\\]"):
        accelerator_settings(mixed_precison="bf16")


@pytest.mark.parametrize("field", sorted(TRAINING_ARGUMENTS_CASES))
def test_a_training_arguments_field_is_explicit_only_away_from_its_default(tmp_path, field):
    given, value, source = TRAINING_ARGUMENTS_CASES[field]
    name = next(name for name, option in ENGINE_OPTIONS.items()
                if field in [keyword.name for keyword in option.training_arguments])
    settings = training_arguments_settings(TrainingArguments(output_dir=str(tmp_path), report_to="none",
                                                             **{field: given}))
    assert settings[name] == Setting(value, source)


def test_fields_at_their_defaults_set_nothing(tmp_path):
    fields = {keyword.name: TrainingArguments.__dataclass_fields__[keyword.name].default
              for option in ENGINE_OPTIONS.values() for keyword in option.training_arguments}
    settings = training_arguments_settings(TrainingArguments(output_dir=str(tmp_path), report_to="none", **fields))
    assert not set(settings) & set(ENGINE_OPTIONS)


def test_the_checkpointing_section_is_project_configurations_fields():
    assert declared_options(ProjectConfiguration) == CHECKPOINTING
    assert set(training_arguments_fields()) == set(CHECKPOINTING_CASES), "add a row to CHECKPOINTING_CASES"
    for field, (project_field, option) in training_arguments_fields().items():
        assert TrainingArguments.__dataclass_fields__[field].default == option.default, field
        assert CHECKPOINTING_CASES[field] != option.default, field


def test_training_arguments_hand_the_checkpointing_section_over_parsed_once(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **CHECKPOINTING_CASES)
    profile = cProfile.Profile()
    config = profile.runcall(lambda: accelerator_arguments(args)["project_config"])
    for field, (project_field, _) in training_arguments_fields().items():
        assert getattr(config, project_field) == CHECKPOINTING_CASES[field], field
    parsers = [ProjectConfiguration.__post_init__, parse_async_save, parse_async_save_when_busy]
    keys = {(f.__code__.co_filename, f.__code__.co_firstlineno, f.__code__.co_name) for f in parsers}
    parses = [key for key in pstats.Stats(profile).stats if key in keys]
    assert parses == []  # parsed by TrainingArguments' checks (below), not again for the Trainer's project_config


@pytest.mark.parametrize(("field", "bad", "message"), [
    ("async_save_when_busy", "later", r"async_save_when_busy='later' in {} is not valid; use 'wait'.*'skip'"),
    ("async_save", "yes", r"async_save='yes'"),
])
def test_a_bad_checkpointing_value_is_refused_where_it_enters(tmp_path, field, bad, message):
    with pytest.raises(ValueError, match=message.format("ProjectConfiguration")):
        ProjectConfiguration(**{field: bad})
    with pytest.raises(ValueError, match=message.format("TrainingArguments")):
        TrainingArguments(output_dir=str(tmp_path), report_to="none", **{field: bad})
