"""Seq2SeqTrainer and Seq2SeqTrainingArguments against transformers' own (CPU; the 2-process test on gloo).

The oracle is transformers' Seq2SeqTrainer run in this process on the same tiny T5 and BART, tokenizer, data and
seed (tiny_seq2seq.py): evaluation with generation, prediction with keyword overrides and training give equal
metrics, equal generated ids and equal padded labels.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import typing

import pytest
import torch
import transformers
from transformers import DataCollatorForSeq2Seq, DataCollatorWithPadding, GenerationConfig, HfArgumentParser

import trainkit
from tests.distributed import run_torchrun
from tests.trainer.seq2seq import tiny_seq2seq
from trainkit import Seq2SeqTrainer, Seq2SeqTrainingArguments
from trainkit.config.errors import ConfigError

KINDS = ("t5", "bart")
needs_oracle = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                  reason="transformers' Seq2SeqTrainer (the oracle) needs accelerate, absent here")


@pytest.fixture(scope="module")
def transformers_runs(tmp_path_factory) -> dict[str, dict]:
    """transformers' Seq2SeqTrainer on one process: the reference for both trainkit tests below."""
    folder = tmp_path_factory.mktemp("transformers")
    return {kind: tiny_seq2seq.run(transformers, kind, str(folder / kind)) for kind in KINDS}


def _assert_same_results(ours: dict, theirs: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        if isinstance(theirs[key], dict):
            assert set(ours[key]) == set(theirs[key]), key
            for name, value in theirs[key].items():
                assert ours[key][name] == pytest.approx(value, rel=1e-6, abs=1e-9), f"{key}/{name}"
        elif key == "losses":
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key
        else:
            assert ours[key] == theirs[key], key


@needs_oracle
@pytest.mark.parametrize("kind", KINDS)
def test_one_process_metrics_and_generations_equal_transformers(kind, transformers_runs, tmp_path):
    ours = tiny_seq2seq.run(trainkit, kind, str(tmp_path))
    theirs = transformers_runs[kind]
    # Generation lengths vary across samples and batches, so the padding is exercised, not just the decoding.
    assert len({sum(t not in (0, 1, 2) for t in row) for row in theirs["predictions"]}) > 1 or kind == "bart"
    assert len(theirs["predictions"][0]) == 20  # padded to the model's generation config max_length (20)
    _assert_same_results(ours, theirs, ("eval", "test", "predictions", "label_ids", "losses", "trained_eval"))


@needs_oracle
@pytest.mark.multiprocess
def test_two_processes_gather_the_generations_transformers_gets_on_one(transformers_runs, tmp_path):
    """2 gloo processes, 12 samples in batches of 2 per process: the generated ids (padded per batch, then across
    processes and batches) come back in dataset order, equal to the one-process reference. (Generation does not
    depend on the world size; transformers' own 2-process run gives the same here, the sizes being divisible.)"""
    out = tmp_path / "results.json"
    run_torchrun("tests/trainer/seq2seq/seq2seq_worker.py", "trainkit", str(out), *KINDS, timeout=400)
    results = json.loads(out.read_text())
    for kind in KINDS:
        assert results[kind]["world_size"] == 2
        _assert_same_results(results[kind], transformers_runs[kind], ("eval", "test", "predictions", "label_ids"))


def _recording_trainer(lib, tmp_path, **overrides):
    tok = tiny_seq2seq.tokenizer("t5")
    net = tiny_seq2seq.model("t5", tok)
    calls: list[dict] = []
    generate = net.generate

    def recording_generate(*args, **kwargs):
        calls.append({k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask", "labels",
                                                                    "decoder_input_ids")})
        return generate(*args, **kwargs)

    net.generate = recording_generate
    settings = dict(per_device_eval_batch_size=4, report_to="none", use_cpu=True, predict_with_generate=True)
    settings.update(overrides)
    args = lib.Seq2SeqTrainingArguments(str(tmp_path / lib.__name__), **settings)
    trainer = lib.Seq2SeqTrainer(model=net, args=args, processing_class=tok,
                                 data_collator=DataCollatorForSeq2Seq(tok, model=net))
    return trainer, calls, tiny_seq2seq.dataset(tok, 4, seed=5)


@needs_oracle
@pytest.mark.parametrize("overrides", [dict(), dict(generation_max_length=7, generation_num_beams=3)])
def test_generate_receives_what_transformers_passes(overrides, tmp_path):
    """Keywords of evaluate/predict > generation_max_length/num_beams > the model's generation_config."""
    seen = {}
    for lib in (transformers, trainkit):
        trainer, calls, data = _recording_trainer(lib, tmp_path, **overrides)
        trainer.evaluate(data)
        trainer.evaluate(data, max_new_tokens=3)
        trainer.evaluate(data, max_length=5, num_beams=1, no_repeat_ngram_size=2)
        output = trainer.predict(data, num_beams=None)
        trainer.prediction_step(trainer.model, next(iter(trainer.get_test_dataloader(data))), False, max_length=4)
        seen[lib.__name__] = (calls, output.predictions.shape)
    assert seen["trainkit"] == seen["transformers"]
    if overrides:
        assert seen["trainkit"][0][0] == {"max_length": 7, "num_beams": 3, "synced_gpus": False}


def test_generation_config_argument_replaces_the_models(tmp_path):
    GenerationConfig(max_length=6, num_beams=2, decoder_start_token_id=0).save_pretrained(tmp_path / "gen")
    for value in (tmp_path / "gen", str(tmp_path / "gen" / "generation_config.json"),
                  GenerationConfig(max_length=6, num_beams=2, decoder_start_token_id=0)):
        trainer, calls, data = _recording_trainer(trainkit, tmp_path, generation_config=value)
        assert trainer.model.generation_config.max_length == 6
        output = trainer.predict(data)
        assert trainer.model.generation_config.num_beams == 2
        assert output.predictions.shape[0] == 4 and output.predictions.shape[1] >= 6  # padded to at least max_length
        assert calls[0] == {"synced_gpus": False}  # the settings come from the model's (replaced) config
    assert trainer.args.to_dict()["generation_config"]["max_length"] == 6  # a GenerationConfig is saved as its dict
    bad = GenerationConfig(num_beams=1, length_penalty=2.0)  # strict validation: a beam setting without beams
    with pytest.raises(ValueError, match="Fix these issues"):
        _recording_trainer(trainkit, tmp_path, generation_config=bad)


def test_generated_ids_padded_with_the_pad_token_or_its_fallbacks(tmp_path):
    trainer, _, _ = _recording_trainer(trainkit, tmp_path)
    ids = torch.tensor([[5, 6, 1]])
    assert trainer._pad_tensors_to_max_len(ids, 5).tolist() == [[5, 6, 1, 0, 0]]  # the tokenizer's pad (0)
    trainer.processing_class.pad_token = None
    assert trainer._pad_tensors_to_max_len(ids, 5).tolist() == [[5, 6, 1, 1, 1]]  # no pad token: its EOS (1)
    trainer.processing_class = None
    trainer.model.config.pad_token_id = 3
    assert trainer._pad_tensors_to_max_len(ids, 4).tolist() == [[5, 6, 1, 3]]  # no tokenizer: the model config's
    trainer.model.config.pad_token_id = None
    with pytest.raises(ValueError, match="pad token"):
        trainer._pad_tensors_to_max_len(ids, 4)


def test_predict_without_labels_and_without_generation(tmp_path):
    trainer, calls, data = _recording_trainer(trainkit, tmp_path)
    collator = trainer.data_collator  # DataCollatorForSeq2Seq gives labels=None without labels, which the step
    trainer.data_collator = DataCollatorWithPadding(trainer.processing_class)  # (as transformers') passes on
    output = trainer.predict(data.remove_columns("labels"))
    trainer.data_collator = collator
    assert output.label_ids is None and output.predictions.shape[0] == 4 and "test_loss" not in output.metrics
    trainer.args.predict_with_generate = False  # the Trainer's own step: the model's logits, no generate()
    calls.clear()
    output = trainer.predict(data)
    assert calls == [] and output.predictions[0].ndim == 3


def test_arguments_have_exactly_transformers_seq2seq_fields():
    def own_fields(cls, base):
        inherited = {f.name for f in dataclasses.fields(base)}
        return {f.name: f for f in dataclasses.fields(cls) if f.name not in inherited}

    ours = own_fields(Seq2SeqTrainingArguments, trainkit.TrainingArguments)
    theirs = own_fields(transformers.Seq2SeqTrainingArguments, transformers.TrainingArguments)
    assert list(ours) == list(theirs)
    hints_ours = typing.get_type_hints(Seq2SeqTrainingArguments)
    hints_theirs = typing.get_type_hints(transformers.Seq2SeqTrainingArguments)
    for name, field in theirs.items():
        assert ours[name].default == field.default, name
        assert hints_ours[name] == hints_theirs[name], name


def test_hf_argument_parser_reads_the_arguments(tmp_path):
    command = ["--output_dir", str(tmp_path), "--predict_with_generate", "--generation_max_length", "12",
               "--generation_num_beams", "3", "--generation_config", str(tmp_path / "gen"), "--report_to", "none"]
    (ours,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(command)
    assert (ours.predict_with_generate, ours.generation_max_length, ours.generation_num_beams) == (True, 12, 3)
    assert str(ours.generation_config) == str(tmp_path / "gen") and ours.sortish_sampler is False  # str or Path
    if importlib.util.find_spec("accelerate") is not None:  # transformers' arguments need it to be built
        (theirs,) = HfArgumentParser(transformers.Seq2SeqTrainingArguments).parse_args_into_dataclasses(command)
        for name in ("predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config",
                     "sortish_sampler"):
            assert getattr(ours, name) == getattr(theirs, name), name


def test_bad_arguments_fail_at_construction(tmp_path, caplog):
    with pytest.raises(ConfigError, match="generation_num_beams=0"):
        Seq2SeqTrainingArguments(str(tmp_path), generation_num_beams=0)
    with pytest.raises(ConfigError, match="generation_config=3"):
        Seq2SeqTrainingArguments(str(tmp_path), generation_config=3)
    with pytest.raises(TypeError, match="Did you mean 'predict_with_generate'"):
        Seq2SeqTrainingArguments(str(tmp_path), predict_with_generat=True)
    with caplog.at_level(logging.WARNING):
        Seq2SeqTrainingArguments(str(tmp_path), sortish_sampler=True, predict_with_generate=True)
    assert "sortish_sampler=True has no effect" in caplog.text
    with pytest.raises(TypeError, match="needs Seq2SeqTrainingArguments"):
        Seq2SeqTrainer(model=torch.nn.Linear(2, 2), args=trainkit.TrainingArguments(str(tmp_path), use_cpu=True))
