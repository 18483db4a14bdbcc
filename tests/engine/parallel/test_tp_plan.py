"""The tensor-parallel plan trainkit applies (CPU, one process, no mesh): the model's own plan, completed with
its input embedding where the plan leaves it out (transformers 5.17 names ``embed_tokens`` only for tied
embeddings, 5.2x always), so a layout splits the same weights whatever the transformers release."""

from __future__ import annotations

from torch import nn

from trainkit.engine.parallel.tensor_parallel import expand_plan, model_tp_plan

PLAN_517_UNTIED = {"lm_head": "colwise_gather_output", "model.layers.*.mlp.up_proj": "colwise"}


class Tiny(nn.Module):
    """An LM shape: ``model.embed_tokens``, ``model.layers.N.mlp.up_proj``, ``lm_head``, and a plan attribute."""

    def __init__(self, plan: dict[str, str]) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(8, 4)
        self.model.layers = nn.ModuleList([nn.Module()])
        self.model.layers[0].mlp = nn.Module()
        self.model.layers[0].mlp.up_proj = nn.Linear(4, 4)
        self.lm_head = nn.Linear(4, 8)
        self.tp_plan = plan

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens


def test_the_models_plan_gains_its_input_embedding_split_on_the_vocabulary() -> None:
    model = Tiny(dict(PLAN_517_UNTIED))
    assert expand_plan(model, model_tp_plan(model)) == {
        "model.embed_tokens": "embedding_rowwise", "lm_head": "colwise_gather_output",
        "model.layers.0.mlp.up_proj": "colwise"}


def test_a_plan_that_names_the_embedding_and_a_users_plan_are_applied_as_given() -> None:
    named = {"model.*": "replicate", **PLAN_517_UNTIED}  # a pattern naming the embedding counts
    assert model_tp_plan(Tiny(named)) == named
    assert model_tp_plan(Tiny({}), user_plan=PLAN_517_UNTIED) == PLAN_517_UNTIED
