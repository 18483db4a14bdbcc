"""`trainkit config` numbers FSDP sharding strategies 1-5 in FSDP's order; names still work (no device needed)."""

from __future__ import annotations

import io

import pytest

from trainkit.cli.config_questions import Asker, ask_fsdp_options

FSDP_ORDER = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]


def _answer_strategy(answer: str) -> tuple[str, str]:
    """Answer the sharding question with ``answer``, every later FSDP question with its default."""
    output = io.StringIO()
    options = ask_fsdp_options(Asker(source=io.StringIO(answer + "\n"), output=output))
    return options["fsdp_sharding_strategy"], output.getvalue()


@pytest.mark.parametrize("number, strategy", [(str(i), name) for i, name in enumerate(FSDP_ORDER, start=1)])
def test_numbers_follow_fsdp_order(number, strategy):
    chosen, prompt = _answer_strategy(number)
    assert chosen == strategy
    assert "[1] FULL_SHARD, [2] SHARD_GRAD_OP, [3] NO_SHARD, [4] HYBRID_SHARD, [5] HYBRID_SHARD_ZERO2" in prompt


@pytest.mark.parametrize("name", FSDP_ORDER + ["shard_grad_op"])
def test_names_still_work(name):
    assert _answer_strategy(name)[0] == name.upper()


@pytest.mark.parametrize("out_of_range", ["0", "6"])
def test_numbers_outside_one_to_five_are_asked_again(out_of_range):
    # The refused answer is followed by end of input, so the default (FULL_SHARD) is taken.
    chosen, prompt = _answer_strategy(out_of_range)
    assert f"{out_of_range!r} is not one of FULL_SHARD" in prompt
    assert chosen == "FULL_SHARD"


def test_other_menus_keep_numbering_from_zero():
    asker = Asker(source=io.StringIO("1\n"), output=io.StringIO())
    assert asker.choice("Mixed precision?", ["no", "fp16", "bf16"], "no") == "fp16"
