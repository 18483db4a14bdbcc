"""Tensor-parallel plans: transformers' style names turned into torch's ``ParallelStyle`` objects and applied
with ``parallelize_module`` on the TP sub-mesh.

A plan maps module names (``*`` matches one name segment, e.g. ``model.layers.*.mlp.up_proj``) to a style.
The plan comes from the user (``ParallelismConfig(tp_handler=...)`` with a ``tp_plan``, or the model's
``tp_plan`` attribute set by hand) or from the model: transformers models carry one (``model.tp_plan``,
built from ``config.base_model_tp_plan``). Style names are transformers' (``colwise``, ``rowwise``...);
:data:`STYLES` lists the ones trainkit applies; any other is refused by name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from trainkit.config.errors import ConfigError
from trainkit.engine.parallel.ties import parameter_ties, restore_parameter_ties

logger = logging.getLogger(__name__)

_KEEP = "replicate"
STYLES: dict[str, Callable[[], ParallelStyle] | None] = {
    # Output dimension split; each rank returns its slice of the features (the next rowwise layer consumes it).
    "colwise": ColwiseParallel,
    # Input dimension split; the partial outputs are summed across the TP group (one all-reduce).
    "rowwise": RowwiseParallel,
    # Output dimension split, then gathered: every rank returns the full output (an LM head's logits).
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_rep": RowwiseParallel,
    # An embedding split along the vocabulary: each rank looks up its rows, the results are summed.
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    # Left whole on every TP rank (its gradients are the same on each, as for any parameter outside the plan).
    _KEEP: None,
}
"""transformers' style name -> a factory of torch's style (None: the module stays replicated)."""


def model_tp_plan(model: nn.Module, user_plan: Mapping[str, str] | None = None) -> dict[str, str]:
    """The plan to apply: the user's as given, else the model's own (transformers' ``tp_plan``) with its input
    embedding split on the vocabulary where the plan leaves it out; an error if neither plan exists."""
    if user_plan:
        return dict(user_plan)
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None)
    if not plan:
        raise ConfigError(
            f"tp_size > 1 but {type(model).__name__} has no tensor-parallel plan: pass one as "
            "ParallelismConfig(tp_handler=...) with a tp_plan attribute, e.g. {'layers.*.mlp.up_proj': 'colwise', "
            f"'layers.*.mlp.down_proj': 'rowwise'}} (styles: {sorted(STYLES)}), or use a transformers model whose "
            "config has a base_model_tp_plan.")
    return _with_input_embedding(model, dict(plan))


def _with_input_embedding(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """``plan`` plus ``embedding_rowwise`` for the model's input embedding when no entry names it.

    Which transformers release built the plan decides whether it names the embedding: 5.2x adds
    ``embed_tokens: embedding_rowwise`` to every plan, 5.17 only when the embeddings are tied. Completing the
    plan the same way here makes one layout hold the same bytes and compute the same sums on either release."""
    get_input_embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get_input_embeddings() if callable(get_input_embeddings) else None
    except NotImplementedError:  # transformers' default for models without one
        embedding = None
    if not isinstance(embedding, nn.Embedding):
        return plan
    name = next((name for name, module in model.named_modules() if module is embedding and name), None)
    if name is None or any(_pattern(entry).fullmatch(name) for entry in plan):
        return plan
    return {name: "embedding_rowwise", **plan}


def _pattern(entry: str) -> re.Pattern[str]:
    """A plan entry as a regular expression over module names (``*`` = one name segment)."""
    return re.compile(re.escape(entry).replace(r"\*", r"[^.]+"))


def expand_plan(model: nn.Module, plan: Mapping[str, str]) -> dict[str, str]:
    """``{module name: style}`` for every module a plan pattern names (``*`` = one name segment).

    An unknown style is an error naming it and the valid ones; a pattern that names no module is skipped with
    a debug line (transformers' plans cover every variant of a model family)."""
    unknown = sorted({style for style in plan.values() if style not in STYLES})
    if unknown:
        raise ConfigError(f"Tensor-parallel plan: unknown or unsupported styles {unknown}; trainkit applies "
                          f"{sorted(STYLES)}.")
    names = [name for name, _ in model.named_modules() if name]
    chosen: dict[str, str] = {}
    for pattern, style in plan.items():
        regex = _pattern(pattern)
        matched = [name for name in names if regex.fullmatch(name)]
        if not matched:
            logger.debug("TP plan entry %r names no module of %s", pattern, type(model).__name__)
        for name in matched:
            chosen[name] = style
    return chosen


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, str]) -> dict[str, str]:
    """Split ``model``'s planned modules across ``tp_mesh`` in place; return the applied ``{module: style}``.

    Tied parameters (an LM head sharing the input embedding's weight) are tied again afterwards; both must
    then be split the same way, else the error names the pair."""
    modules = expand_plan(model, plan)
    for name, style in modules.items():
        module = model.get_submodule(name)
        if not isinstance(module, (nn.Linear, nn.Embedding)) and STYLES[style] is not None:
            raise ConfigError(f"Tensor-parallel plan: {name!r} is a {type(module).__name__}; the style {style!r} "
                              "applies to nn.Linear and nn.Embedding modules only.")
    ties = parameter_ties(model)
    torch_plan: dict[str, Any] = {name: factory() for name, style in modules.items()
                                  if (factory := STYLES[style]) is not None}
    if torch_plan:
        parallelize_module(model, tp_mesh, torch_plan)
    _check_ties(model, ties)
    restore_parameter_ties(model, ties)
    return modules


def _check_ties(model: nn.Module, ties: dict[str, str]) -> None:
    for name, source in ties.items():
        tied, first = model.get_parameter(name), model.get_parameter(source)
        layout = [getattr(p, "placements", None) if isinstance(p, DTensor) else None for p in (tied, first)]
        if layout[0] != layout[1]:
            raise ConfigError(f"Tensor-parallel plan: {name!r} is tied to {source!r} but the plan splits them "
                              f"differently ({layout[0]} vs {layout[1]}); give both modules matching styles "
                              "(e.g. 'embedding_rowwise' for the embedding and 'colwise_gather_output' for the head).")
