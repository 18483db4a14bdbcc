"""Tiny transformers models trained by trainkit's Trainer and by transformers' own on the same seed (shared by
tests/trainer/test_same_numbers.py and its two-process worker).

Tasks: a BERT classifier with dropout 0.1 (``bert``), BERT masked-LM with transformers' masking collator (``mlm``),
and two causal LMs with dropout (``gpt2``, whose ``loss_type`` transformers does not recognise, and ``llama``).
The tokenizer has a fixed word-level vocabulary: a trained one orders tied tokens differently from one process to
the next, which would change the data between the two runs.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import torch

TASKS = ("bert", "mlm", "gpt2", "llama")
WORDS = [f"w{i}" for i in range(59)]


def tokenizer():
    """A fast tokenizer over [PAD] [UNK] [CLS] [SEP] [MASK] and 59 words, adding [CLS] ... [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocabulary)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def examples(count: int, seed: int, with_labels: bool) -> list[dict[str, Any]]:
    """Texts of 4 to 14 words, tokenized; the class label leans on which half of the vocabulary the words come from."""
    generator, encode = random.Random(seed), tokenizer()
    rows = []
    for _ in range(count):
        label = generator.randint(0, 1)
        words = [f"w{generator.randint(0, 28) + 30 * label}" if generator.random() < 0.3 else f"w{generator.randint(0, 58)}"
                 for _ in range(generator.randint(4, 14))]
        row = dict(encode(" ".join(words)))
        row.pop("token_type_ids", None)
        if with_labels:
            row["labels"] = label
        rows.append(row)
    return rows


def model(task: str):
    """The task's model, initialised from torch's global generator (seed it first)."""
    from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel,
                              LlamaConfig, LlamaForCausalLM)

    size = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                max_position_embeddings=64)
    if task == "bert":
        return BertForSequenceClassification(BertConfig(**size, num_labels=2, hidden_dropout_prob=0.1,
                                                        attention_probs_dropout_prob=0.1))
    if task == "mlm":
        return BertForMaskedLM(BertConfig(**size, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    if task == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                          bos_token_id=2, eos_token_id=3))
    return LlamaForCausalLM(LlamaConfig(**size, num_key_value_heads=2, attention_dropout=0.1))


def collator(task: str):
    """Padding for the classifier; transformers' language-modeling collator (masking 30 %, or causal) otherwise."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if task == "bert":
        return DataCollatorWithPadding(tokenizer())
    return DataCollatorForLanguageModeling(tokenizer(), mlm=task == "mlm", mlm_probability=0.3)


def train(library: Any, task: str, output_dir: str, resume: str | None = None, stop_after: int | None = None,
          **arguments: Any) -> dict[str, Any]:
    """Train ``task`` with ``library``'s Trainer (``trainkit`` or ``transformers``, the module): 32 training examples
    in batches of 8 (4 optimizer steps per epoch), 6 steps, an evaluation every 3. Returns per-step losses and
    gradient norms, the evaluation losses, the train loss, the final weights and ``state.log_history``."""
    from transformers import set_seed

    losses: list[float] = []
    norms: list[float] = []
    evaluations: list[float] = []

    class Record(library.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                losses.append(logs["loss"])
                norms.append(logs["grad_norm"])
            if "eval_loss" in logs:
                evaluations.append(logs["eval_loss"])

        def on_step_end(self, args, state, control, **kwargs):
            if stop_after is not None and state.global_step >= stop_after:
                control.should_training_stop = True

    settings: dict[str, Any] = dict(
        output_dir=output_dir, per_device_train_batch_size=8, per_device_eval_batch_size=8, max_steps=6,
        learning_rate=5e-3, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="no", seed=42,
        report_to="none", disable_tqdm=True, use_cpu=True)
    settings.update(arguments)
    args = library.TrainingArguments(**settings)
    set_seed(42)
    trainer = library.Trainer(model=model(task), args=args, train_dataset=examples(32, 1, task == "bert"),
                              eval_dataset=examples(16, 2, task == "bert"), data_collator=collator(task),
                              callbacks=[Record()])
    output = trainer.train(resume_from_checkpoint=resume)
    weights = {name: tensor.detach().cpu().clone() for name, tensor in trainer.model.state_dict().items()}
    return {"losses": losses, "grad_norms": norms, "eval_losses": evaluations, "train_loss": output.training_loss,
            "weights": weights, "log_history": trainer.state.log_history}


def timeless(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``log_history`` with its clock readings (runtimes and rates) as None: every key kept, every other value."""
    return [{key: None if key.endswith(("_runtime", "_per_second")) else value for key, value in entry.items()}
            for entry in log_history]


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """A digest of every tensor's bytes (for comparing final weights across processes)."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].contiguous().numpy().tobytes())
    return digest.hexdigest()
