"""Accelerate's other commands in trainkit: tpu-config, to-fsdp2, estimate-memory, env's report, the config-file
dataclasses. In-process units on CPU (no device, no processes, no network): each pins what a user of the command
relies on. The launches of `trainkit test` are in test_cli_launch.py."""

from __future__ import annotations

import argparse

import pytest
import torch
import yaml

from trainkit.cli import env_command, estimate_command, to_fsdp2_command, tpu_command
from trainkit.cli.main import main
from trainkit.config import ConfigError, LaunchConfig
from trainkit.config.accelerate_files import ClusterConfig, SageMakerConfig, load_config_from_file
from trainkit.config.fsdp2_file import convert_config_to_fsdp2

FSDP1_FILE = {
    "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 2,
    "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_backward_prefetch": "BACKWARD_PRE",
                    "fsdp_use_orig_params": True, "fsdp_sync_module_states": True, "fsdp_forward_prefetch": False,
                    "fsdp_offload_params": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "Block"},
}


def _write(path, mapping):
    path.write_text(yaml.safe_dump(mapping))
    return str(path)


@pytest.fixture(autouse=True)
def _no_default_config(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINKIT_CONFIG_FILE", str(tmp_path / "absent.yaml"))


# --- tpu-config ------------------------------------------------------------------------------------------------
def test_tpu_config_prints_the_gcloud_command_from_flags(capsys):
    assert main(["tpu-config", "--tpu_name", "pod", "--tpu_zone", "europe-west4-a", "--command", "ls /tmp",
                 "echo hi", "--command", "pwd", "--use_alpha", "--debug"]) == 0
    assert capsys.readouterr().out.strip() == ("Running gcloud alpha compute tpus tpu-vm ssh pod --zone europe-west4-a "
                                               "--command cd /usr/share; ls /tmp; echo hi; pwd --worker all")


def test_tpu_config_reads_the_pod_and_commands_from_the_config_file(tmp_path, capsys):
    commands = tmp_path / "setup.sh"
    commands.write_text("pip install -e .\necho ready\n")
    config = _write(tmp_path / "c.yaml", {"distributed_type": "NO", "tpu_name": "p1", "tpu_zone": "z1",
                                          "command_file": str(commands)})
    args = tpu_command.tpu_command_parser().parse_args(["--config-file", config, "--install_accelerate",
                                                        "--accelerate_version", "1.15.0", "--debug"])
    tpu_command.tpu_command_launcher(args)
    assert capsys.readouterr().out.strip() == ("Running gcloud compute tpus tpu-vm ssh p1 --zone z1 --command "
                                               "cd /usr/share; pip install accelerate==1.15.0; pip install -e .; "
                                               "echo ready --worker all")


def test_tpu_config_without_a_pod_or_commands_says_what_is_missing():
    parser = tpu_command.tpu_command_parser()
    with pytest.raises(ConfigError, match="--command"):
        tpu_command.gcloud_command(parser.parse_args(["--tpu_name", "p", "--tpu_zone", "z"]))
    with pytest.raises(ConfigError, match="--tpu_name and --tpu_zone"):
        tpu_command.gcloud_command(parser.parse_args(["--command", "ls"]))


# --- to-fsdp2 --------------------------------------------------------------------------------------------------
def test_to_fsdp2_rewrites_fsdp1_keys_and_trainkit_reads_the_same_sharding(tmp_path):
    source = _write(tmp_path / "fsdp1.yaml", FSDP1_FILE)
    output = tmp_path / "fsdp2.yaml"
    assert main(["to-fsdp2", "--config_file", source, "--output_file", str(output)]) == 0
    converted = yaml.safe_load(output.read_text())["fsdp_config"]
    assert converted == {"fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": False,
                         "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                         "fsdp_transformer_layer_cls_to_wrap": "Block"}
    before, after = LaunchConfig.from_file(source).fsdp_config, LaunchConfig.from_file(str(output)).fsdp_config
    assert (after.sharding_strategy, after.transformer_layer_cls_to_wrap, after.state_dict_type) == \
        (before.sharding_strategy, before.transformer_layer_cls_to_wrap, before.state_dict_type) == \
        ("SHARD_GRAD_OP", ["Block"], "SHARDED_STATE_DICT")
    assert yaml.safe_load(open(source))["fsdp_config"] == FSDP1_FILE["fsdp_config"]  # the input is untouched


def test_to_fsdp2_leaves_an_fsdp2_config_alone_and_keeps_unknown_keys(caplog):
    already = {"fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True}}
    assert convert_config_to_fsdp2({**already}) == already
    assert "already specifies FSDP2" in caplog.text
    assert convert_config_to_fsdp2({"fsdp_config": {"fsdp_reshard_after_forward": "FULL_SHARD", "other": 1}}) == \
        {"fsdp_config": {"fsdp_reshard_after_forward": True, "other": 1, "fsdp_version": 2}}


def test_to_fsdp2_refuses_before_writing_anything(tmp_path):
    parser = to_fsdp2_command.to_fsdp2_command_parser()
    source = _write(tmp_path / "in.yaml", FSDP1_FILE)
    existing = tmp_path / "out.yaml"
    existing.write_text("kept: true\n")
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        to_fsdp2_command.to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "missing.yaml")]))
    with pytest.raises(ConfigError, match="--output_file"):
        to_fsdp2_command.to_fsdp2_command(parser.parse_args(["--config_file", source]))
    with pytest.raises(FileExistsError, match="--overwrite"):
        to_fsdp2_command.to_fsdp2_command(parser.parse_args(["--config_file", source, "--output_file", str(existing)]))
    assert existing.read_text() == "kept: true\n"
    to_fsdp2_command.to_fsdp2_command(parser.parse_args(["--config_file", source, "--overwrite"]))
    assert load_config_from_file(source).fsdp_config["fsdp_version"] == 2


# --- Accelerate's config-file dataclasses ----------------------------------------------------------------------
def test_config_files_load_as_accelerates_dataclasses_and_round_trip(tmp_path):
    path = _write(tmp_path / "c.yaml", {**FSDP1_FILE, "fp16": True, "dynamo_backend": "INDUCTOR"})
    config = load_config_from_file(path)
    assert isinstance(config, ClusterConfig) and config.num_processes == 2 and config.debug is False
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR"} and config.deepspeed_config == {}
    config.to_yaml_file(tmp_path / "again.yaml")
    assert load_config_from_file(tmp_path / "again.yaml") == config
    sagemaker = load_config_from_file(_write(tmp_path / "s.yaml", {
        "compute_environment": "AMAZON_SAGEMAKER", "distributed_type": False, "ec2_instance_type": "ml.p3.2xlarge",
        "iam_role_name": "role", "mixed_precision": "fp16"}))  # YAML reads an unquoted NO as False
    assert isinstance(sagemaker, SageMakerConfig) and sagemaker.distributed_type == "NO"


def test_config_file_keys_are_checked():
    with pytest.raises(ConfigError, match="'tpu_nmae'.*Did you mean 'tpu_name'"):
        ClusterConfig.from_mapping({"distributed_type": "NO", "tpu_nmae": "x"})
    with pytest.raises(ConfigError, match="distributed_type"):
        ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_TPU", mixed_precision="no",
                      use_cpu=False, debug=False)


# --- env -------------------------------------------------------------------------------------------------------
def test_env_returns_its_report_and_names_both_commands(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(env_command, "which", lambda name: "/opt/bin/trainkit" if name == "trainkit" else None)
    config = _write(tmp_path / "c.yaml", {"distributed_type": "MULTI_CPU", "num_processes": 2})
    info = env_command.env_command(env_command.env_command_parser().parse_args(["--config_file", config]))
    assert info["`trainkit` bash location"] == "/opt/bin/trainkit"
    assert info["`accelerate` bash location"] == "Not found"
    assert info["torch version"] == torch.__version__.split("+")[0] or info["torch version"] == torch.__version__
    assert info["trainkit config"] == {"distributed_type": "MULTI_CPU", "num_processes": 2}
    printed = capsys.readouterr().out
    assert "- `accelerate` bash location: Not found" in printed and "    num_processes: 2" in printed


# --- estimate-memory -------------------------------------------------------------------------------------------
def _tiny_bert(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    config.save_pretrained(tmp_path)
    return transformers.BertModel(config)  # the real model, on CPU: the oracle for sizes


def test_estimate_memory_of_a_local_model_matches_the_built_model(tmp_path):
    model = _tiny_bert(tmp_path)
    total = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    embeddings = sum(t.numel() * t.element_size() for t in [*model.embeddings.parameters(), *model.embeddings.buffers()])
    args = estimate_command.estimate_command_parser().parse_args([str(tmp_path), "--dtypes", "float32", "bfloat16",
                                                                  "int4"])
    rows = estimate_command.gather_data(args)
    assert [row[0] for row in rows] == ["float32", "bfloat16", "int4"]
    assert rows[0][2] == total and rows[1][2] == total / 2 and rows[2][2] == total / 8
    assert rows[0][1] == embeddings  # the word embeddings dominate this tiny model; a BertLayer is smaller
    assert rows[0][3]["total"] == rows[1][3]["total"] == 4 * total and rows[2][3] == {}


def test_estimate_memory_refuses_a_gated_repo_and_prefixes_timm_hub_ids(monkeypatch):
    monkeypatch.setattr(estimate_command, "verify_on_hub", lambda repo, token=None: "gated")
    with pytest.raises(OSError, match="gated"):
        estimate_command.estimate_command(argparse.Namespace(model_name="org/private", library_name=None,
                                                             dtypes=["float32"], trust_remote_code=False))
    assert estimate_command.add_timm_hub_prefix("timm/resnet50.a1_in1k") == "hf-hub:timm/resnet50.a1_in1k"
    assert estimate_command.add_timm_hub_prefix("resnet50") == "resnet50"
    assert estimate_command.add_timm_hub_prefix("local-dir:/m") == "local-dir:/m"
