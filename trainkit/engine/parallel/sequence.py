"""Splitting each training sequence across the ranks of a ``cp`` or ``sp`` group, around a model's forward.

Every rank of a sequence group reads the same batch (the data is sharded by the data-parallel rank only). In
training mode, a forward pre-hook on the prepared model cuts the batch along its sequence dimension before the
model sees it, and a forward hook turns the rank's loss into the loss of the whole sequence; in evaluation mode
(``model.eval()``) both step aside and every rank runs the whole sequence, as one process would. The cut:

* labels are shifted **before** splitting (``shift_labels``: ``labels[:, 1:]`` then ``-100``), so each rank
  holds the targets of its own positions, the last one included; transformers' causal-LM loss reads them;
* each rank's ``position_ids`` are its global positions (RoPE and learned positions see the true offsets);
* a 2-D ``attention_mask`` is dropped after checking that it only pads at the end of rows whose padded
  positions carry no label (then causal attention without it gives every counted token the same output);
* the sequence is padded at its end to a multiple of what the layout needs (``-100`` labels: no loss changes);
* which positions a rank holds is the layout's: contiguous chunks for Ulysses (:mod:`.ulysses`), torch's
  head-tail load balancing for ring attention (:mod:`.ring`).

The loss: the model is given ``num_items_in_batch`` = the labelled tokens of the whole batch (every rank can count
them, it holds the whole batch), so each rank's loss is its share of the sequence's mean; the forward hook adds
the shares across the group, so every rank returns the one-process loss. Its gradient is scaled by the group
size because FSDP, whose mesh includes the group, averages the group's gradients where the sequence needs
their sum. The Trainer's and Accelerate-style loops therefore need no change.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from trainkit.config.errors import ConfigError

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
SEQUENCE_INPUTS = ("input_ids", "inputs_embeds", "position_ids", "token_type_ids", "shift_labels", "labels")
"""Keyword inputs cut along their second dimension (``labels`` becomes this rank's shifted labels)."""
_in_flight = 0
"""Sharded training forwards under way (the mask functions registered for our attention step aside for them)."""
_attention_calls = 0
"""Calls of the split attention functions so far (a split forward that makes none split a model it cannot)."""


class SequenceLayout(Protocol):
    """Which global positions of a sequence one rank of the group holds."""

    size: int
    """Ranks in the group."""
    multiple: int
    """Sequence lengths are padded to a multiple of this."""

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        """The global positions (ascending in the rank's own order) this rank holds of a ``length`` sequence."""
        ...


def in_flight() -> bool:
    """True while a sharded training forward runs (its mask is built from local shards and must not be)."""
    return _in_flight > 0


def count_attention_call() -> None:
    """Called by the split attention functions for every split call (see :meth:`SequenceSplit._after_forward`)."""
    global _attention_calls
    _attention_calls += 1


class SequenceSplit:
    """The hooks that cut a model's training batches along the sequence and add its loss across the group."""

    def __init__(self, group: dist.ProcessGroup | None, layout: SequenceLayout, *,
                 fixed_length: int | None = None) -> None:
        self.group = group
        self.layout = layout
        self.fixed_length = fixed_length
        """When set (``sp_seq_length_is_variable=False``), every batch must have this length."""
        self._calls_before: int | None = None  # attention calls when the first split forward started

    def attach(self, model: nn.Module) -> None:
        """Register the hooks on the prepared model's root module."""
        self._signature = inspect.signature(model.forward)
        model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        model.register_forward_hook(self._after_forward, with_kwargs=True, always_call=True)

    # -- the hooks --------------------------------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
        global _in_flight
        if not module.training:
            return None
        if args:  # inputs given by position: name them, to find the sequence tensors
            kwargs = dict(self._signature.bind_partial(*args, **kwargs).arguments)
            extra = _var_keyword(self._signature)
            if extra is not None:
                kwargs.update(kwargs.pop(extra, None) or {})
        split = self.split(kwargs)
        if self._calls_before is None:
            self._calls_before = _attention_calls
        if "use_cache" in self._signature.parameters:
            # A key/value cache of one rank's positions means nothing, and activation checkpointing's recompute
            # would append to it a second time (the recomputed attention would see twice the keys).
            split["use_cache"] = False
        _in_flight += 1
        return (), split

    def _after_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        global _in_flight
        if not module.training or _in_flight == 0:
            return None
        _in_flight -= 1
        if self._calls_before is not None and output is not None:
            self._check_attention_ran(module)
        loss = _loss_of(output)
        if loss is None:
            return None
        return _with_loss(output, self.combine(loss))

    def _check_attention_ran(self, module: nn.Module) -> None:
        """After the first split forward: its attention went through the split functions, else each rank would
        have attended to its own part of the sequence only (attention computed outside transformers'
        AttentionInterface, or recurrent layers), a silent error."""
        if _attention_calls == self._calls_before:
            raise ConfigError(f"{type(module).__name__} computed a training forward without calling attention "
                              "through transformers' AttentionInterface, so its split sequence was never "
                              "gathered; sequence and context parallelism need models whose attention goes "
                              "through it (config._attn_implementation).")
        self._calls_before = None  # checked once

    # -- what they do -----------------------------------------------------------------------------
    def split(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """This rank's part of a batch given as keywords (a new dict; the caller's tensors are not changed)."""
        main = inputs.get("input_ids")
        if main is None:
            main = inputs.get("inputs_embeds")
        if not isinstance(main, torch.Tensor) or main.ndim < 2:
            raise ConfigError("Sequence/context parallelism splits input_ids (or inputs_embeds) of shape (batch, "
                              f"sequence); the model was called with {sorted(inputs)}.")
        batch, length = main.shape[:2]
        if self.fixed_length is not None and length != self.fixed_length:
            raise ConfigError(f"A batch of sequence length {length}, but sp_seq_length={self.fixed_length} with "
                              "sp_seq_length_is_variable=False: pad batches to that length, or leave the length "
                              "variable (sp_seq_length_is_variable=True).")
        split = dict(inputs)
        labels = split.get("labels")
        if split.get("shift_labels") is None and isinstance(labels, torch.Tensor):
            split["shift_labels"] = nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
        shift_labels = split.get("shift_labels")
        if split.get("position_ids") is None:
            split["position_ids"] = torch.arange(length, device=main.device)
        split["position_ids"] = split["position_ids"].expand(batch, length)  # (length,) or (1, length) too
        _check_causal(split.pop("attention_mask", None), split["position_ids"], shift_labels)
        padding = -length % self.layout.multiple
        positions = self.layout.positions(length + padding, main.device)
        for name in SEQUENCE_INPUTS:
            value = split.get(name)
            if isinstance(value, torch.Tensor) and name != "labels":
                split[name] = _pad(value, padding, name).index_select(1, positions)
        if shift_labels is not None:
            if labels is not None:
                split["labels"] = split["shift_labels"]  # same shape as the logits; the loss reads shift_labels
            if split.get("num_items_in_batch") is None:
                split["num_items_in_batch"] = shift_labels.ne(IGNORE_INDEX).sum()
        return split

    def combine(self, local_loss: torch.Tensor) -> torch.Tensor:
        """The sum of the group's losses; its gradient reaches this rank's term scaled by the group size."""
        total = local_loss.detach().clone()
        dist.all_reduce(total, group=self.group)
        scaled = local_loss * self.layout.size
        return scaled - scaled.detach() + total


def _check_causal(attention_mask: Any, position_ids: torch.Tensor, shift_labels: torch.Tensor | None) -> None:
    """Only causal attention over whole sequences can be split: refuse left padding, masks on labelled positions,
    4-D masks and packed sequences (positions restarting), each by name. One host sync."""
    problems = []
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2:
            raise ConfigError("Sequence/context parallelism supports causal attention with an optional 2-D padding "
                              "mask; this batch has a custom attention_mask "
                              f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}.")
        mask = attention_mask.bool()
        problems.append(("left or inner padding", (mask[:, 1:] & ~mask[:, :-1]).any()))
        if shift_labels is not None:
            problems.append(("labels on padded positions", (~mask & shift_labels.ne(IGNORE_INDEX)).any()))
    problems.append(("packed sequences (position_ids not counting up by one)",
                     (position_ids[..., 1:] - position_ids[..., :-1]).ne(1).any()))
    found = torch.stack([flag for _, flag in problems]).tolist()
    bad = [name for (name, _), flag in zip(problems, found) if flag]
    if bad:
        raise ConfigError(f"Sequence/context parallelism runs causal attention over whole sequences; this batch has "
                          f"{' and '.join(bad)}. Pad at the end of each row with labels -100 "
                          "(DataCollatorForLanguageModeling does), one sequence per row.")


def _pad(value: torch.Tensor, padding: int, name: str) -> torch.Tensor:
    """``value`` padded at the end of its sequence dimension: labels with -100, positions and tokens with 0
    (never attended to by a real token under causal attention, and within any position table)."""
    if not padding:
        return value
    fill = IGNORE_INDEX if name in ("labels", "shift_labels") else 0
    pad = [0, 0] * (value.ndim - 2) + [0, padding]
    return nn.functional.pad(value, pad, value=fill)


def _var_keyword(signature: inspect.Signature) -> str | None:
    return next((p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)


def _loss_of(output: Any) -> torch.Tensor | None:
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        return output.get("loss")
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) and output[0].ndim == 0:
        return output[0]
    return None


def _with_loss(output: Any, loss: torch.Tensor) -> Any:
    if isinstance(output, (tuple, list)):
        return type(output)((loss, *output[1:]))
    output["loss"] = loss
    return output
