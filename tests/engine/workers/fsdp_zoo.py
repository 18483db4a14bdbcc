"""Tiny real transformers architectures for the FSDP model matrix (built from configs, nothing downloaded).

Each builder returns the same weights on every rank for the same seed. The set covers what fine-tuning
users bring: an encoder with a tied MLM head (BERT), tied input/output embeddings (GPT-2, Llama with
``tie_word_embeddings=True``), untied Llama, an encoder-decoder sharing one embedding (T5), and a PEFT
LoRA wrapper (frozen base, trainable adapters) when ``peft`` is installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn

VOCAB, SEQ, BATCH = 128, 8, 2
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
# A size at which SIZE_BASED_WRAP picks MLPs and then the whole backbone (which holds the tied embedding).
MIN_NUM_PARAMS = 4_500


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(**TINY, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0))


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=16,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _llama(tied: bool) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**TINY, num_key_value_heads=2, max_position_embeddings=16,
                                        tie_word_embeddings=tied))


def llama_tied() -> nn.Module:
    return _llama(True)


def llama_untied() -> nn.Module:
    return _llama(False)


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                               num_heads=2, dropout_rate=0.0, decoder_start_token_id=0))


def lora() -> nn.Module:
    """LoRA adapters on the tied Llama's attention projections; everything else frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(llama_tied(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                   target_modules=["q_proj", "v_proj"]))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "bert": bert, "gpt2": gpt2, "llama_tied": llama_tied, "llama_untied": llama_untied, "t5": t5,
}
if importlib.util.find_spec("peft") is not None:
    MODELS["lora"] = lora


def build(name: str, seed: int = 0) -> nn.Module:
    """Model ``name`` with weights that depend only on ``seed``."""
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(name: str, step: int, rank: int) -> dict[str, torch.Tensor]:
    """This rank's batch for ``step``: token ids and labels for the model's own loss."""
    generator = torch.Generator().manual_seed(10_000 * rank + step)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    if name == "t5":
        data["labels"] = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    return data


def tied_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """(name, other name) for each parameter reachable under two names: the ties a reload must keep."""
    first: dict[int, str] = {}
    pairs = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            pairs.append((first[id(param)], name))
        else:
            first[id(param)] = name
    return pairs
