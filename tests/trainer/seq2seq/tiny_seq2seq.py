"""A tiny translation task for the Seq2Seq tests: a word-level tokenizer built here, T5 and BART built from small
configs (no downloads), and a dataset whose targets are the source words sorted, of varying lengths.

Imported by the in-process tests and by the multi-process worker, so both build exactly the same things.
"""

from __future__ import annotations

import random

import numpy as np

WORDS = [f"w{i}" for i in range(20)]


def tokenizer(kind: str):
    """A fast word-level tokenizer with the special tokens ``kind`` ("t5" or "bart") uses, ids in that model's order."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"] if kind == "t5" else ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {token: index for index, token in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = "$A </s>" if kind == "t5" else "<s> $A </s>"
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(token, vocab[token]) for token in ("<s>", "</s>") if token in vocab])
    extra = {"bos_token": "<s>"} if kind == "bart" else {}
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", **extra)


def model(kind: str, tok, seed: int = 0):
    """A randomly initialised (seeded) one-layer T5 or BART, dropout off so runs are deterministic."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    if kind == "t5":
        config = T5Config(vocab_size=len(tok), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
                          num_heads=2, dropout_rate=0.0, initializer_factor=4.0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          decoder_start_token_id=tok.pad_token_id)
        return T5ForConditionalGeneration(config)
    config = BartConfig(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, init_std=0.3, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        decoder_start_token_id=tok.eos_token_id, forced_eos_token_id=tok.eos_token_id)
    return BartForConditionalGeneration(config)


def dataset(tok, size: int, seed: int):
    """``size`` samples: 2 to 6 random words, target the same words sorted (a datasets.Dataset of token ids)."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        source = tok(" ".join(words))
        rows.append({"input_ids": source["input_ids"], "attention_mask": source["attention_mask"],
                     "labels": tok(" ".join(sorted(words)))["input_ids"]})
    return Dataset.from_list(rows)


def compute_metrics_for(tok):
    """Exact-match rate, token accuracy and mean generated length over decoded predictions."""

    def compute_metrics(prediction) -> dict[str, float]:
        predictions, labels = prediction.predictions, prediction.label_ids
        predictions = np.where(predictions != -100, predictions, tok.pad_token_id)
        labels = np.where(labels != -100, labels, tok.pad_token_id)
        decoded = tok.batch_decode(predictions, skip_special_tokens=True)
        references = tok.batch_decode(labels, skip_special_tokens=True)
        exact = [p.split() == r.split() for p, r in zip(decoded, references)]
        hits = sum(sum(a == b for a, b in zip(p.split(), r.split())) for p, r in zip(decoded, references))
        total = sum(len(r.split()) for r in references)
        lengths = [int(np.count_nonzero(row != tok.pad_token_id)) for row in predictions]
        return {"exact_match": float(np.mean(exact)), "token_accuracy": hits / total, "gen_len": float(np.mean(lengths))}

    return compute_metrics


def run(lib, kind: str, output_dir: str, train: bool = True) -> dict:
    """Evaluate and predict with generation, then (``train``) train 16 steps and evaluate again; ``lib`` is
    transformers or trainkit.

    The evaluation generates with the arguments' beam search (2 beams, max length 9); the prediction overrides them
    by keywords (greedy, max_new_tokens 4) and its predictions and label ids are returned as lists."""
    from transformers import DataCollatorForSeq2Seq

    tok = tokenizer(kind)
    net = model(kind, tok)
    args = lib.Seq2SeqTrainingArguments(
        output_dir, per_device_train_batch_size=4, per_device_eval_batch_size=2, max_steps=16, learning_rate=3e-2,
        lr_scheduler_type="constant", seed=0, report_to="none", use_cpu=True, save_strategy="no",
        disable_tqdm=True, logging_steps=1, predict_with_generate=True, generation_max_length=9,
        generation_num_beams=2)
    trainer = lib.Seq2SeqTrainer(model=net, args=args, train_dataset=dataset(tok, 32, seed=1),
                                 eval_dataset=dataset(tok, 12, seed=2), processing_class=tok,
                                 data_collator=DataCollatorForSeq2Seq(tok, model=net),
                                 compute_metrics=compute_metrics_for(tok))
    results = {"eval": _numbers(trainer.evaluate())}
    predicted = trainer.predict(dataset(tok, 12, seed=3), num_beams=1, max_new_tokens=4)
    results.update(test=_numbers(predicted.metrics), predictions=predicted.predictions.tolist(),
                   label_ids=predicted.label_ids.tolist())
    if train:
        trainer.train()
        results["losses"] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        results["trained_eval"] = _numbers(trainer.evaluate())
    return results


def _numbers(metrics: dict) -> dict:
    """The metrics without timings (and without transformers' model preparation time)."""
    return {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second", "model_preparation_time"))}
