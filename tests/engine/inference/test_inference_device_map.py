"""Planning device maps (trainkit.utils.modeling's infer_auto_device_map, get_balanced_memory, get_max_memory,
check_device_map, clean_device_map: Accelerate's API).

Planning reads sizes only, so maps for accelerators (integer keys) are planned here on the CPU; nothing runs on
them. Sizes below are float32 bytes: Linear(i, o) holds (i * o + o) * 4. Where Accelerate is installed, its planner
is the oracle for the same models and budgets. CPU only, in-process."""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict

import pytest
import torch
from torch import nn

from trainkit.utils.modeling import (check_device_map, clean_device_map, get_balanced_memory, get_max_memory,
                                     infer_auto_device_map)


def chain(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(OrderedDict((f"l{i}", layer) for i, layer in enumerate(layers)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)    # 160 bytes
        self.down = nn.Linear(8, 4)  # 144 bytes


class TiedLM(nn.Module):
    """An embedding tied to the output head, with two layers between them."""

    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)             # 160 bytes
        self.body1 = nn.Linear(4, 4)                 # 80 bytes
        self.body2 = nn.Linear(4, 4)                 # 80 bytes
        self.head = nn.Linear(4, 10, bias=False)     # shares embed's 160 bytes
        if tied:
            self.head.weight = self.embed.weight


def test_greedy_fill_keeps_room_for_the_largest_layer_on_the_first_accelerator():
    model = chain(nn.Linear(4, 4), nn.Linear(8, 4), nn.Linear(4, 2))  # 80, 144, 40 bytes
    # 224 bytes hold l0 and l1 together, but while l1 and l2 may be offloaded, device 0 keeps room for the largest
    # remaining layer (l1: 144, then l2: 40), so l1 moves on
    assert infer_auto_device_map(model, max_memory={0: 224, "cpu": 1000}) == {"l0": 0, "l1": "cpu", "l2": "cpu"}
    # a second accelerator keeps no such room
    assert infer_auto_device_map(model, max_memory={0: 80 + 144, 1: 184}) == {"l0": 0, "l1": 1, "l2": 1}
    # all of it fits: one entry for the whole model
    assert infer_auto_device_map(model, max_memory={0: 1000, "cpu": 1000}) == {"": 0}
    # the CPU keeps that room too (a layer offloaded to disk runs from it): with 100 bytes, neither takes l0
    assert infer_auto_device_map(model, max_memory={0: 100, "cpu": 100}) == {"": "disk"}


def test_modules_split_into_children_unless_their_class_is_kept_whole():
    model = chain(Block(), Block(), Block())  # 304 bytes each
    # l1 does not fit next to l0 and the reserve (the largest layer: an "up", 160), so it is split: its "up" fits
    split = infer_auto_device_map(model, max_memory={0: 700, 1: 1000})
    assert split == {"l0": 0, "l1.up": 0, "l1.down": 1, "l2": 1}
    for no_split in (["Block"], {"Block"}, "Block"):  # a list, a set or one name; the reserve is now a Block
        assert infer_auto_device_map(model, max_memory={0: 700, 1: 1000}, no_split_module_classes=no_split) == {
            "l0": 0, "l1": 1, "l2": 1}
    assert infer_auto_device_map(model, max_memory={0: 10**4}, clean_result=False) == {"l0": 0, "l1": 0, "l2": 0}


def test_tied_parameters_go_to_one_device():
    # the head comes last, but shares the embedding's weight, so it goes with the embedding (which needs no more
    # room for it); untied, the head is a 160-byte layer device 0 keeps room for, and the embedding moves on too
    assert infer_auto_device_map(TiedLM(), max_memory={0: 300, 1: 1000}) == {
        "embed": 0, "head": 0, "body1": 1, "body2": 1}
    assert infer_auto_device_map(TiedLM(tied=False), max_memory={0: 300, 1: 1000}) == {"": 1}
    assert infer_auto_device_map(TiedLM(), max_memory={0: 1000}) == {"": 0}


def test_buffers_of_offloaded_layers_warn_when_no_accelerator_can_hold_them():
    # each norm: 128 bytes of weights and 136 of buffers (running mean and variance, the batch count)
    model = chain(nn.Linear(8, 8), nn.BatchNorm1d(16), nn.BatchNorm1d(16), nn.BatchNorm1d(16))
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        device_map = infer_auto_device_map(model, max_memory={0: 600, "cpu": 10**6})
    # 3 x 136 bytes of buffers would join the 288 + 264 bytes device 0 holds and keeps: more than its 600
    assert device_map == {"l0": 0, "l1": "cpu", "l2": "cpu", "l3": "cpu"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert infer_auto_device_map(model, max_memory={0: 600, "cpu": 10**6}, offload_buffers=True) == device_map
        # a CPU-only plan has no accelerator to bring buffers to: no warning
        infer_auto_device_map(model, max_memory={"cpu": 700})


def test_fallback_allocation_places_a_smaller_later_part_on_an_empty_device(caplog):
    model = chain(nn.Sequential(nn.Linear(16, 8), nn.Linear(2, 2), nn.Linear(4, 4)))  # 544, 24, 80 bytes
    with caplog.at_level(logging.INFO):
        plain = infer_auto_device_map(model, max_memory={0: 600})
    assert 0 not in plain.values() and any("insufficient memory" in r.getMessage() for r in caplog.records)
    assert infer_auto_device_map(model, max_memory={0: 600}, fallback_allocation=True) == {
        "l0.0": "disk", "l0.1": 0, "l0.2": "disk"}


def test_budgets_in_strings_and_their_device_order():
    assert list(get_max_memory({"cpu": "1KB", "disk": 5, 1: "2KiB", 0: 7})) == [0, 1, "cpu", "disk"]
    assert get_max_memory({"cpu": "1KB", 0: "2KiB"}) == {0: 2048, "cpu": 1000}
    with pytest.raises(ValueError, match="'gpu'"):
        get_max_memory({"gpu": 10})
    available = get_max_memory()  # what is free now: accelerators by index, then the host's RAM
    assert available and all(isinstance(key, int) or key in ("cpu", "mps") for key in available)
    assert all(isinstance(size, int) and size > 0 for size in available.values())


def test_balanced_memory_spreads_the_model_with_a_margin():
    model = chain(nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 2))  # 440 + 440 + 88 = 968 bytes
    # each but the last: 968 // 2 + 1.25 * the mean last-level module (322) = 484 + 402
    assert get_balanced_memory(model, max_memory={0: 1000, 1: 1000}) == {0: 886, 1: 1000}
    # a block kept whole sets the margin when larger: 484 + 1.25 * 440 > 1000, so the budget stays
    assert get_balanced_memory(model, max_memory={0: 1000, 1: 1000}, no_split_module_classes={"Linear"}) == {
        0: 1000, 1: 1000}
    # low_zero: device 0 only takes what the others cannot
    assert get_balanced_memory(model, max_memory={0: 1000, 1: 1000, 2: 1000}, low_zero=True) == {
        0: 0, 1: 886, 2: 1000}
    assert get_balanced_memory(model, max_memory={"cpu": 100}) == {"cpu": 100}  # no accelerator: as given


def test_check_device_map_names_what_is_missing_and_what_is_unknown():
    model = TiedLM()
    check_device_map(model, {"": "cpu"})
    check_device_map(model, {"embed": 0, "body1": "cpu", "body2.weight": 0, "body2.bias": 0, "head": 0})
    with pytest.raises(ValueError, match="body1.weight, body1.bias"):
        check_device_map(model, {"embed": 0, "body2": 0, "head": 0})
    with pytest.warns(UserWarning, match="'tail'"):
        check_device_map(model, {"": 0, "tail": 1})


def test_clean_device_map_merges_entries_that_share_a_device():
    assert clean_device_map({"a.x": 0, "a.y": 0, "b": 0}) == {"": 0}
    assert clean_device_map({"a.x.0": 1, "a.x.1": 1, "a.y": "cpu", "b": "cpu"}) == {
        "a.x": 1, "a.y": "cpu", "b": "cpu"}
    assert clean_device_map({"h.1": 0, "h.10": 1}) == {"h.1": 0, "h.10": 1}  # "h.1" is no prefix of "h.10"


def test_a_meta_model_is_planned_in_a_given_dtype():
    from trainkit import init_empty_weights

    with init_empty_weights():
        model = chain(nn.Linear(4, 4), nn.Linear(8, 4), nn.Linear(4, 2))
    # in float32 (80, 144, 40 bytes) l0 does not fit next to the reserve for l1; in float16 all of it fits
    assert infer_auto_device_map(model, max_memory={0: 132, "cpu": 1000}) == {"": "cpu"}
    assert infer_auto_device_map(model, max_memory={0: 132, "cpu": 1000}, dtype=torch.float16) == {"": 0}
    assert infer_auto_device_map(model, max_memory={0: 132, "cpu": 1000}, dtype="float16") == {"": 0}


ORACLE_CASES = [
    (lambda: chain(nn.Linear(4, 4), nn.Linear(8, 4), nn.Linear(4, 2)), {0: 224, "cpu": 1000}, {}),
    (lambda: chain(Block(), Block(), Block()), {0: 500, 1: 400, "cpu": 300}, {}),
    (lambda: chain(Block(), Block(), Block()), {0: 500, 1: 400, "cpu": 300}, {"no_split_module_classes": ["Block"]}),
    (TiedLM, {0: 300, 1: 1000}, {"clean_result": False}),
    (TiedLM, {0: 200, "cpu": 200}, {}),
    (lambda: TiedLM(tied=False), {0: 300, 1: 1000}, {}),
    (lambda: chain(Block(), Block(), Block()), {0: 700, 1: 1000}, {"clean_result": False}),
    (lambda: chain(nn.Sequential(nn.Linear(16, 8), nn.Linear(2, 2), nn.Linear(4, 4))), {0: 600},
     {"fallback_allocation": True}),
    (lambda: chain(nn.Linear(8, 8), *(nn.BatchNorm1d(16) for _ in range(3))), {0: 600, 1: 300, "cpu": 10**6},
     {"offload_buffers": True}),
]


@pytest.mark.parametrize("build, budget, options", ORACLE_CASES)
def test_plans_equal_accelerates(build, budget, options):
    accelerate_modeling = pytest.importorskip("accelerate.utils.modeling", reason="Accelerate is the oracle")
    model = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # as dicts: the order of a cleaned map's entries is not part of it (Accelerate's varies between runs)
        assert dict(infer_auto_device_map(model, max_memory=dict(budget), **options)) == \
            dict(accelerate_modeling.infer_auto_device_map(model, max_memory=dict(budget), **options))
    balanced = {key: size for key, size in budget.items() if isinstance(key, int)}
    assert get_balanced_memory(model, max_memory=dict(balanced)) == \
        accelerate_modeling.get_balanced_memory(model, max_memory=dict(balanced))


def tiny_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    from trainkit import init_empty_weights

    with init_empty_weights():  # planning needs no memory
        model = T5ForConditionalGeneration(T5Config(num_layers=3, d_model=32, d_ff=64, num_heads=2, d_kv=16,
                                                    vocab_size=100))
    model.tie_weights()
    return model


def tiny_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainkit import init_empty_weights

    with init_empty_weights():
        model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                           bos_token_id=0, eos_token_id=0))
    model.tie_weights()
    return model


def test_a_transformers_model_keeps_its_tied_embeddings_and_blocks_together():
    from trainkit.utils.modeling import compute_module_sizes

    model = tiny_t5()
    total = compute_module_sizes(model)[""]
    device_map = infer_auto_device_map(model, max_memory={0: total // 3, 1: total // 3, "cpu": total // 4},
                                       no_split_module_classes=model._no_split_modules)
    # the shared embedding, both stacks' embed_tokens and the head are one tensor: one device, the first
    assert [device_map[name] for name in ("shared", "encoder.embed_tokens", "decoder.embed_tokens", "lm_head")] == [
        0, 0, 0, 0]
    # blocks are never split ("encoder.block.0" at most), and the rest spills to device 1 and on to disk (the CPU's
    # quarter is less than the room it keeps for a block)
    assert all(key.count(".") <= 2 for key in device_map) and set(device_map.values()) == {0, 1, "disk"}
    check_device_map(model, device_map)


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_t5])
def test_plans_of_transformers_models_equal_accelerates(build):
    accelerate_modeling = pytest.importorskip("accelerate.utils.modeling", reason="Accelerate is the oracle")
    model = build()
    total = accelerate_modeling.compute_module_sizes(model)[""]
    no_split = list(model._no_split_modules)
    for budget in ({0: total // 3, 1: total // 3, "cpu": total // 4}, {0: total // 2, "cpu": total}):
        for options in ({}, {"no_split_module_classes": no_split, "dtype": torch.float16}):
            assert dict(infer_auto_device_map(model, max_memory=dict(budget), **options)) == \
                dict(accelerate_modeling.infer_auto_device_map(model, max_memory=dict(budget), **options))
    spread = {0: total // 2, 1: total // 2, 2: total}
    for low_zero in (False, True):
        assert get_balanced_memory(model, dict(spread), no_split_module_classes=no_split, low_zero=low_zero) == \
            accelerate_modeling.get_balanced_memory(model, dict(spread), no_split_module_classes=no_split,
                                                    low_zero=low_zero)
