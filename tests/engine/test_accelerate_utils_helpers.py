"""``trainkit.utils``' small helpers with Accelerate's names: environment, versions, sizes, names (CPU only)."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from trainkit import utils


def test_truth_values_and_environment_reads(monkeypatch):
    assert utils.str_to_bool("YES") == 1 and utils.str_to_bool("off", to_bool=True) is False
    with pytest.raises(ValueError, match="maybe"):
        utils.str_to_bool("maybe")
    monkeypatch.setenv("TK_FLAG", "true")
    monkeypatch.setenv("TK_N", "3")
    assert utils.parse_flag_from_env("TK_FLAG") is True and utils.parse_flag_from_env("TK_UNSET") is False
    assert utils.parse_choice_from_env("TK_UNSET") == "no" and utils.parse_choice_from_env("TK_N") == "3"
    assert utils.get_int_from_env(["TK_UNSET", "TK_N"], 7) == 3 and utils.get_int_from_env(["TK_UNSET"], 7) == 7


def test_patch_and_clear_environment_restore_everything(monkeypatch):
    monkeypatch.setenv("TK_KEEP", "old")
    with utils.patch_environment(tk_keep="new", tk_added=1):
        assert os.environ["TK_KEEP"] == "new" and os.environ["TK_ADDED"] == "1"
    assert os.environ["TK_KEEP"] == "old" and "TK_ADDED" not in os.environ
    with utils.clear_environment():
        assert "TK_KEEP" not in os.environ
        os.environ["TK_INSIDE"] = "x"
    assert os.environ["TK_KEEP"] == "old" and "TK_INSIDE" not in os.environ


def test_purge_accelerate_environment_undoes_what_the_function_set(monkeypatch):
    monkeypatch.setenv("ACCELERATE_KEEP", "1")

    @utils.purge_accelerate_environment
    def sets_variables():
        os.environ["ACCELERATE_NEW"] = "1"
        os.environ["ACCELERATE_KEEP"] = "2"

    sets_variables()
    assert "ACCELERATE_NEW" not in os.environ and os.environ["ACCELERATE_KEEP"] == "1"


def test_env_file_lines_skip_unsafe_pairs(caplog):
    lines = utils.convert_dict_to_env_variables({"GOOD": "1", "BAD": "a;b", "EMPTY": ""})
    assert lines == ["GOOD=1\n"] and "BAD" in caplog.text


def test_versions_sizes_names_and_dicts():
    assert utils.compare_versions("torch", ">=", "2.0") and not utils.compare_versions("torch", "<", "1.0")
    with pytest.raises(ValueError, match="'>='"):
        utils.compare_versions("torch", "~=", "2.0")
    assert utils.convert_bytes(512) == "512 bytes" and utils.convert_bytes(3 * 1024**2) == "3.0 MB"
    assert utils.get_pretty_name(torch.nn.Linear) == "Linear" and utils.get_pretty_name(torch.nn.Linear(1, 1)) == "Linear"
    assert utils.merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}, "d": 3}) == {"a": {"c": 2, "b": 1}, "d": 3}
    model = torch.nn.Sequential(torch.nn.Linear(1, 1))
    assert utils.recursive_getattr(model, "0.weight") is model[0].weight
    assert utils.are_libraries_initialized("torch", "not_a_library_xyz") == ["torch"]
    assert utils.get_current_device_type()[0] in ("cpu", "cuda")
    assert utils.is_peft_model(model) is False


def test_is_port_in_use_sees_a_listening_socket():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert utils.is_port_in_use(server.getsockname()[1]) is True


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x):
        self.seen_by = self.name
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_compile_regions_returns_a_twin_whose_blocks_are_compiled_as_accelerates():
    from types import MethodType

    from torch._dynamo.eval_frame import OptimizedModule

    model = _Stack()
    model.name = "original"
    model.forward = MethodType(lambda self, x: type(self).forward(self, x), model)  # a forward bound to the instance
    twin = utils.compile_regions(model, backend="eager")
    twin.name = "twin"
    assert twin is not model and type(twin) is _Stack
    assert all(isinstance(block, OptimizedModule) for block in twin.blocks) and isinstance(twin.head, OptimizedModule)
    assert not any(isinstance(block, OptimizedModule) for block in model.modules())  # the original stays as it was
    assert twin.__dict__["forward"].__self__ is twin
    x = torch.randn(4, 2)
    assert torch.equal(twin(x), model(x)) and twin.seen_by == "twin" and model.seen_by == "original"
    assert twin.blocks[0]._orig_mod.weight is model.blocks[0].weight  # one set of parameters
    assert utils.extract_model_from_parallel(twin, keep_torch_compile=False) is model
    assert utils.extract_model_from_parallel(twin) is twin  # keep_torch_compile=True, the default
    whole = torch.nn.Linear(2, 2)
    assert isinstance(utils.compile_regions(whole, backend="eager"), OptimizedModule)  # no repeated blocks: whole


def test_compile_regions_deepspeed_compiles_in_place():
    model = _Stack()
    assert utils.compile_regions_deepspeed(model, backend="eager") is None
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    assert model.head._compiled_call_impl is not None


@pytest.mark.parametrize("name, hint", [("write_basic_config", "trainkit config --default"),
                                        ("merge_fsdp_weights", "trainkit merge-weights")])
def test_command_line_features_point_to_the_command(name, hint):
    with pytest.raises(NotImplementedError, match=hint):
        getattr(utils, name)()


def test_hardware_predicates_answer_false_for_hardware_trainkit_does_not_drive():
    for name in ("is_hpu_available", "is_habana_gaudi1", "is_transformer_engine_mxfp8_available", "is_xccl_available",
                 "is_pippy_available", "is_bitsandbytes_multi_backend_available", "is_mlu_available", "is_fp8_available"):
        assert getattr(utils, name)() is False, name
    assert utils.is_hpu_available(init_hccl=True) is False
    if not utils.is_package_available("torch_npu"):
        assert utils.is_npu_available(check_device=True) is False
    if not utils.is_package_available("torch_xla"):
        assert utils.is_torch_xla_available(check_is_tpu=True) is False
    if not utils.is_package_available("bitsandbytes"):
        assert utils.is_bnb_available(min_version="0.39.0") is False and utils.is_4bit_bnb_available() is False
    assert utils.is_weights_only_available() is True
