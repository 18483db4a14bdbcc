"""TrainingArguments: transformers 5 names and defaults, validation with did-you-mean, fsdp parsing, argparse."""

import json

import pytest

from trainkit import TrainingArguments
from trainkit.config.errors import ConfigError


def test_defaults_follow_transformers_5():
    args = TrainingArguments()
    assert args.output_dir == "trainer_output"
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.num_train_epochs) == (5e-5, 0.0, 1.0, 3.0)
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size) == (8, 8)
    assert (args.eval_strategy, args.save_strategy, args.logging_strategy) == ("no", "steps", "steps")
    assert (args.logging_steps, args.save_steps, args.seed, args.optim) == (500, 500, 42, "adamw_torch_fused")
    assert args.report_to == [] and args.fsdp == [] and args.fsdp_options is None
    assert args.mixed_precision == "no"


@pytest.mark.parametrize("kwargs, expected", [
    (dict(eval_strategy="epochs"), "Did you mean 'epoch'"),
    (dict(save_strategy="bst"), "Did you mean 'best'"),
    (dict(lr_scheduler_type="cosin"), "Did you mean 'cosine'"),
    (dict(optim="adamw_torch_fusd"), "Did you mean .adamw_torch_fused."),
    (dict(report_to="tensorbord"), "Did you mean 'tensorboard'"),
    (dict(fsdp="ful_shard"), "Did you mean 'full_shard'"),
    (dict(learning_rat=1e-3), "Did you mean 'learning_rate'"),
    (dict(evaluation_strategy="epoch"), "eval_strategy"),
    (dict(fsdp="full_shard", fsdp_config={"sharding_stratgy": "FULL_SHARD"}), "Did you mean 'fsdp_sharding_strategy'"),
])
def test_bad_arguments_are_named_with_a_suggestion(kwargs, expected):
    with pytest.raises((ConfigError, TypeError), match=expected):
        TrainingArguments(**kwargs)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(load_best_model_at_end=True, eval_strategy="epoch"), "match"),
    (dict(load_best_model_at_end=True), "needs both evaluations and checkpoints"),
    (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=30, save_steps=50), "multiple"),
    (dict(fp16=True, bf16=True), "contradict"),
    (dict(save_strategy="best"), "needs evaluations"),
    (dict(per_device_train_batch_size=0), ">= 1"),
    (dict(logging_steps=2.5), "whole number"),
    (dict(dataloader_prefetch_factor=2), "dataloader_num_workers"),
    (dict(fsdp="full_shard shard_grad_op"), "name one"),
])
def test_contradictory_settings_are_rejected(kwargs, expected):
    with pytest.raises(ConfigError, match=expected):
        TrainingArguments(**kwargs)


def test_best_model_defaults_and_ratios():
    args = TrainingArguments(eval_strategy="steps", eval_steps=10, save_steps=20, load_best_model_at_end=True, warmup_steps=0.1)
    assert args.metric_for_best_model == "loss" and args.greater_is_better is False
    assert args.warmup_steps_for(95) == 10
    args = TrainingArguments(eval_strategy="epoch", save_strategy="best", metric_for_best_model="accuracy")
    assert args.greater_is_better is True


@pytest.mark.parametrize("value, words", [
    (True, ["full_shard"]), ("full_shard auto_wrap offload", ["full_shard", "auto_wrap", "offload"]),
    (["shard_grad_op", "offload"], ["shard_grad_op", "offload"]), ("offload", ["full_shard", "offload"]),
    (False, []), ("", []), (None, []),
])
def test_fsdp_string_list_and_bool(value, words):
    args = TrainingArguments(fsdp=value)
    assert args.fsdp == words
    assert (args.fsdp_options is None) == (not words)


def test_fsdp_words_and_config_file_combine(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_transformer_layer_cls_to_wrap": "BertLayer", "backward_prefetch": "BACKWARD_POST"}))
    options = TrainingArguments(fsdp="shard_grad_op auto_wrap offload", fsdp_config=str(path)).fsdp_options
    assert options.sharding_strategy == "SHARD_GRAD_OP" and options.offload_params
    assert options.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
    assert options.transformer_layer_cls_to_wrap == ["BertLayer"] and options.backward_prefetch == "BACKWARD_POST"


def test_fsdp_config_from_yaml_and_whole_launch_config(tmp_path):
    plain = tmp_path / "fsdp.yaml"
    plain.write_text("transformer_layer_cls_to_wrap: [BertLayer]\nstate_dict_type: SHARDED_STATE_DICT\n")
    assert TrainingArguments(fsdp=True, fsdp_config=str(plain)).fsdp_options.state_dict_type == "SHARDED_STATE_DICT"
    launch = tmp_path / "default_config.yaml"
    launch.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 2\n"
        "fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n  fsdp_offload_params: true\n"
    )
    options = TrainingArguments(fsdp=True, fsdp_config=str(launch)).fsdp_options
    assert options.sharding_strategy == "HYBRID_SHARD" and options.offload_params
    bad = tmp_path / "bad.yaml"
    bad.write_text("fsdp_ofload_params: true\n")
    with pytest.raises(ConfigError, match="fsdp_offload_params"):
        TrainingArguments(fsdp=True, fsdp_config=str(bad))


def test_hf_argument_parser_parses_every_field():
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses([
        "--output_dir", "out", "--fsdp", "full_shard offload", "--learning_rate", "1e-4", "--bf16",
        "--report_to", "tensorboard", "--label_names", "labels", "--eval_strategy", "steps", "--eval_steps", "10",
        "--lr_scheduler_kwargs", '{"num_cycles": 2}', "--gradient_checkpointing",
    ])
    assert args.fsdp == ["full_shard", "offload"] and args.fsdp_options.offload_params
    assert (args.learning_rate, args.mixed_precision, args.report_to) == (1e-4, "bf16", ["tensorboard"])
    assert args.label_names == ["labels"] and args.eval_steps == 10 and args.gradient_checkpointing is True
    assert args.lr_scheduler_kwargs == {"num_cycles": 2}
    (bare,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(["--fsdp"])
    assert bare.fsdp == ["full_shard"]
    assert json.loads(args.to_json_string())["learning_rate"] == 1e-4
