"""How training batches are cut along the sequence for sequence/context parallelism, and which models and batches
are refused (CPU, one process: no process group is needed to cut a batch; the processes' test runs the rest)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForMaskedLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel import attention, ring, ulysses
from trainkit.engine.parallel.sequence import SequenceSplit


def _split(layout, **inputs) -> dict:
    return SequenceSplit(None, layout).split(inputs)


def _llama(heads: int = 4, kv_heads: int = 2, **extra) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=32, hidden_size=8 * heads, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, **extra)
    return LlamaForCausalLM(config)


def test_ulysses_ranks_hold_contiguous_chunks_and_ring_ranks_torchs_head_tail_chunks() -> None:
    """Ulysses: rank r holds the r-th quarter. Ring (torch's layout for causal load balance): with 2 ranks and 8
    positions in 4 chunks of 2, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2, so both do the same work."""
    device = torch.device("cpu")
    assert [ulysses.ContiguousLayout(r, 4).positions(8, device).tolist() for r in range(4)] == [
        [0, 1], [2, 3], [4, 5], [6, 7]]
    assert [ring.HeadTailLayout(r, 2).positions(8, device).tolist() for r in range(2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    work = [int((ring.HeadTailLayout(r, 4).positions(64, device) + 1).sum()) for r in range(4)]
    assert len(set(work)) == 1  # keys attended under a causal mask, per rank


@pytest.mark.parametrize("layout", [ulysses.ContiguousLayout, ring.HeadTailLayout])
def test_labels_are_shifted_before_the_split_and_positions_are_global(layout) -> None:
    """Every rank's targets are the next tokens of its own positions, including the one whose next token lives on
    another rank; only the sequence's last position has none. Its position ids are the global ones."""
    ids = torch.arange(100, 116).view(1, 16)
    parts = [_split(layout(rank, 2), input_ids=ids, labels=ids) for rank in range(2)]
    held = torch.cat([layout(rank, 2).positions(16, ids.device) for rank in range(2)])
    order = held.argsort()
    shifted = torch.cat([part["shift_labels"] for part in parts], dim=1)[:, order]
    assert shifted.tolist() == [list(range(101, 116)) + [-100]]
    assert torch.cat([part["position_ids"] for part in parts], dim=1)[:, order].tolist() == [list(range(16))]
    for rank, part in enumerate(parts):
        assert part["input_ids"].tolist() == [[100 + p for p in layout(rank, 2).positions(16, ids.device).tolist()]]
        assert part["labels"] is part["shift_labels"]  # the logits' shape; the loss reads shift_labels
        assert int(part["num_items_in_batch"]) == 15  # the whole sequence's targets, on every rank


def test_sequences_are_padded_at_their_end_without_targets() -> None:
    """258 tokens over a 2-rank ring (chunks of 4): padded to 260 with token 0, position 0 and label -100."""
    ids = torch.arange(1, 259).view(1, 258)
    parts = [_split(ring.HeadTailLayout(rank, 2), input_ids=ids, labels=ids) for rank in range(2)]
    assert [part["input_ids"].shape[1] for part in parts] == [130, 130]
    tail = parts[0]  # rank 0 holds the last chunk: positions 195..259
    assert tail["input_ids"][0, -2:].tolist() == [0, 0] and tail["shift_labels"][0, -3:].tolist() == [-100] * 3
    assert tail["position_ids"][0, -3:].tolist() == [257, 0, 0]
    assert sum(int(part["shift_labels"].ne(-100).sum()) for part in parts) == 257


def test_a_given_item_count_is_kept_and_the_callers_batch_is_not_changed() -> None:
    ids = torch.arange(8).view(1, 8)
    inputs = {"input_ids": ids, "labels": ids.clone(), "num_items_in_batch": torch.tensor(100)}
    split = SequenceSplit(None, ulysses.ContiguousLayout(1, 2)).split(inputs)
    assert int(split["num_items_in_batch"]) == 100
    assert inputs["input_ids"].shape == (1, 8) and "shift_labels" not in inputs


def test_end_of_row_padding_without_labels_is_dropped() -> None:
    ids = torch.arange(8).view(1, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    labels = ids.masked_fill(mask == 0, -100)
    split = _split(ulysses.ContiguousLayout(0, 2), input_ids=ids, attention_mask=mask, labels=labels)
    assert "attention_mask" not in split and int(split["num_items_in_batch"]) == 4


@pytest.mark.parametrize(("inputs", "match"), [
    (dict(attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])), "left or inner padding"),
    (dict(attention_mask=torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]]), labels=torch.arange(8).view(1, 8)),
     "labels on padded positions"),
    (dict(position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])), "packed sequences"),
    (dict(attention_mask=torch.ones(1, 1, 8, 8)), "custom attention_mask"),
])
def test_batches_that_need_more_than_causal_attention_are_refused(inputs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _split(ulysses.ContiguousLayout(0, 2), input_ids=torch.arange(8).view(1, 8), **inputs)


def test_a_fixed_sequence_length_is_checked() -> None:
    split = SequenceSplit(None, ulysses.ContiguousLayout(0, 2), fixed_length=16)
    with pytest.raises(ConfigError, match="length 8, but sp_seq_length=16"):
        split.split({"input_ids": torch.arange(8).view(1, 8)})
    with pytest.raises(ConfigError, match="splits input_ids"):
        split.split({"pixel_values": torch.ones(1, 3, 4, 4)})


def test_models_that_cannot_have_their_sequence_split_are_refused_by_name() -> None:
    attention.check_model(_llama(), "sp")
    with pytest.raises(ConfigError, match="not a transformers model"):
        attention.check_model(nn.Linear(2, 2), "sp")
    bert = BertForMaskedLM(BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=16))
    with pytest.raises(ConfigError, match="causal language models.*BertForMaskedLM"):
        attention.check_model(bert, "cp")
    mistral = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=2, sliding_window=4))
    with pytest.raises(ConfigError, match="sliding_attention"):
        attention.check_model(mistral, "sp")


def test_heads_must_split_over_sp_ranks() -> None:
    ulysses.check_heads(_llama(4, 2), sp=4, tp=1)  # key/value heads repeated: 2 divides 4
    ulysses.check_heads(_llama(4, 2), sp=2, tp=2)  # one key/value head per TP rank, repeated for 2 sp ranks
    with pytest.raises(ConfigError, match="6 attention heads and 6 key/value heads"):
        ulysses.check_heads(_llama(6, 6), sp=4, tp=1)
    with pytest.raises(ConfigError, match="4 attention heads and 4 key/value heads \\(2 and 2 per tensor-parallel"):
        ulysses.check_heads(_llama(4, 4), sp=4, tp=2)


def test_the_inner_attention_is_the_models_own_or_sdpa() -> None:
    assert attention.inner_implementation(_llama(attn_implementation="eager"), None) == "sdpa"
    assert attention.inner_implementation(_llama(attn_implementation="sdpa"), None) == "sdpa"
    with pytest.raises(ConfigError, match="cannot run a split sequence"):
        attention.inner_implementation(_llama(), "flex_attention")
    with pytest.raises(ConfigError, match="'kernels-community/flash-attn2' is not registered"):
        attention.inner_implementation(_llama(), "kernels-community/flash-attn2")


def test_context_parallelism_on_cpu_is_refused_with_torchs_reason() -> None:
    with pytest.raises(ConfigError, match="cp_size > 1 on cpu.*_scaled_dot_product_flash_attention_for_cpu.*sp_size"):
        ring.check_device("cpu")


def test_the_trainer_refuses_label_smoothing_over_split_sequences(tmp_path) -> None:
    """The smoothed loss is computed outside the model, on whole-sequence labels: refused when arguments are built."""
    from trainkit import ParallelismConfig, TrainingArguments

    with pytest.raises(ConfigError, match="label_smoothing_factor=0.1.*cp_size/sp_size"):
        TrainingArguments(output_dir=str(tmp_path), use_cpu=True, label_smoothing_factor=0.1,
                          parallelism_config=ParallelismConfig(sp_size=2))
    TrainingArguments(output_dir=str(tmp_path), use_cpu=True, label_smoothing_factor=0.1,
                      parallelism_config=ParallelismConfig(tp_size=2))


class _Echo(nn.Module):
    """Keeps what its forward received; calls the split attention hook only when told to."""

    def __init__(self, attends: bool) -> None:
        super().__init__()
        self.attends = attends

    def forward(self, input_ids=None, labels=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        from trainkit.engine.parallel import sequence

        self.seen = {"input_ids": input_ids, **kwargs}
        if self.attends:
            sequence.count_attention_call()
        return {"logits": input_ids.float()}


def test_the_hooks_split_positional_inputs_in_training_mode_only() -> None:
    model = _Echo(attends=True)
    SequenceSplit(None, ulysses.ContiguousLayout(1, 2)).attach(model)
    ids = torch.arange(8).view(1, 8)
    model(ids)  # positional, as scripts may call it
    assert model.seen["input_ids"].tolist() == [[4, 5, 6, 7]] and model.seen["position_ids"].tolist() == [[4, 5, 6, 7]]
    model.eval()
    model(ids)
    assert model.seen["input_ids"].tolist() == [list(range(8))] and "position_ids" not in model.seen


def test_a_model_whose_attention_bypasses_the_interface_is_refused_after_its_first_split_forward() -> None:
    """Each rank would attend to its own part only (recurrent layers, attention outside transformers' interface):
    a silent error, caught on the first training forward."""
    model = _Echo(attends=False)
    SequenceSplit(None, ulysses.ContiguousLayout(0, 2)).attach(model)
    with pytest.raises(ConfigError, match="without calling attention through transformers' AttentionInterface"):
        model(input_ids=torch.arange(8).view(1, 8))
