"""Sentiment classification on IMDB with BERT and trainkit's Trainer.

Fine-tunes ``bert-base-uncased`` on the Hub's ``imdb`` reviews, or, with ``--synthetic`` (no network
needed), trains a tiny BERT from scratch on generated reviews with a tokenizer trained on the spot.
The script is the same on one CPU, one GPU, N GPUs (DDP or FSDP) and several machines:

    python recipes/imdb/trainer_imdb_finetune.py --synthetic
    trainkit launch --config_file recipes/configs/fsdp.yaml recipes/imdb/trainer_imdb_finetune.py
    trainkit launch --num_processes 8 recipes/imdb/trainer_imdb_finetune.py --bf16

``output_dir`` receives a ``checkpoint-N/`` per epoch, the final model with its tokenizer (loadable
with ``from_pretrained``), ``eval_results.json``, the metrics log and ``training_curves.png``.
"""

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
)

from trainkit import PartialState, Trainer, TrainingArguments
from trainkit.utils import set_seed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/, for `common`
from common.metrics import load_metric  # evaluate's accuracy, with an offline copy
from common.plotting import plot_history

# Defaults that differ between fine-tuning a pretrained BERT and training a tiny one from scratch:
# a pretrained model needs a small learning rate to keep what it knows, a fresh one a much larger
# one (above ~1e-3 this tiny post-LayerNorm BERT stalls or diverges, though).
DEFAULTS = {
    "real": {"num_train": None, "num_test": None, "epochs": 2, "batch_size": 16, "lr": 2e-5},
    "synthetic": {"num_train": 8000, "num_test": 1000, "epochs": 3, "batch_size": 16, "lr": 5e-4},
}


def build_parser():
    """The recipe's flags; recipes built on this one (e.g. the LoRA variant) add their own."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", action="store_true", help="generated reviews and a tiny BERT (offline)")
    parser.add_argument("--model_name", default="bert-base-uncased", help="pretrained model (real data only)")
    parser.add_argument("--num_train", type=int, help="training reviews (default: all 25000; 8000 synthetic)")
    parser.add_argument("--num_test", type=int, help="test reviews (default: all 25000; 1000 synthetic)")
    parser.add_argument("--epochs", type=float, help="default: 2 (3 synthetic)")
    parser.add_argument("--batch_size", type=int, help="per process (default: 16)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: 2e-5; 5e-4 synthetic)")
    parser.add_argument("--max_length", type=int, default=256, help="tokens per review, longer ones are truncated")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision (also set by the launch config)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--report_to", default=None, help="trackers (default: jsonl, and tensorboard when installed)")
    parser.add_argument("--output_dir", default="outputs/imdb")
    return parser


def fill_defaults(args, defaults=DEFAULTS):
    """Give every flag left unset the default of the chosen path (real or synthetic)."""
    for name, value in defaults["synthetic" if args.synthetic else "real"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def load_reviews(args):
    """The train and test splits (``text``, ``label``), cut to ``--num_train`` / ``--num_test``."""
    if args.synthetic:
        from synthetic_reviews import synthetic_imdb  # next to this script

        splits = synthetic_imdb(args.num_train, args.num_test, seed=args.seed)
    else:
        from datasets import load_dataset

        splits = load_dataset("imdb")
    train, test = splits["train"], splits["test"]
    # The Hub's splits are sorted by label: shuffle before cutting so both classes stay in.
    if args.num_train is not None and args.num_train < len(train):
        train = train.shuffle(seed=args.seed).select(range(args.num_train))
    if args.num_test is not None and args.num_test < len(test):
        test = test.shuffle(seed=args.seed).select(range(args.num_test))
    return train, test


def load_tokenizer(args, train_texts, is_main_process):
    """The pretrained tokenizer, or (``--synthetic``) a WordPiece tokenizer trained on the training texts."""
    if not args.synthetic:
        return AutoTokenizer.from_pretrained(args.model_name)
    from synthetic_reviews import train_wordpiece_tokenizer

    # Training a WordPiece vocabulary is not deterministic (token ids differ between runs), so the
    # main process trains and saves it, and the others (which wait for it) load that copy.
    tokenizer_dir = os.path.join(args.output_dir, "tokenizer")
    if is_main_process:
        train_wordpiece_tokenizer(train_texts, model_max_length=args.max_length).save_pretrained(tokenizer_dir)
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def build_model(args, tokenizer):
    """The pretrained BERT with a new 2-class head, or (``--synthetic``) a tiny BERT with random weights."""
    if not args.synthetic:
        return AutoModelForSequenceClassification.from_pretrained(args.model_name, num_labels=2)
    from synthetic_reviews import tiny_bert_config
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(tiny_bert_config(len(tokenizer), max_position_embeddings=args.max_length))


def prepare_data_and_model(args):
    """Tokenized train/test splits, the tokenizer and the model, prepared once per machine's cache."""
    set_seed(args.seed)  # reproducible data order, dropout and (synthetic) initial weights
    # The main process downloads (or generates) and tokenizes first, filling the caches; the
    # others wait, then read them.
    state = PartialState()
    with state.main_process_first():
        train_set, test_set = load_reviews(args)
        tokenizer = load_tokenizer(args, train_set["text"], state.is_main_process)

        def tokenize(batch):
            return tokenizer(batch["text"], truncation=True, max_length=args.max_length)

        train_set = train_set.map(tokenize, batched=True, remove_columns=["text"])
        test_set = test_set.map(tokenize, batched=True, remove_columns=["text"])
        model = build_model(args, tokenizer)
    return train_set, test_set, tokenizer, model


def train_and_evaluate(args, model, tokenizer, train_set, test_set, title="IMDB sentiment"):
    """Train with per-epoch evaluation and checkpoints, then save the model, metrics and curves."""
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=2 * args.batch_size,
        learning_rate=args.lr,
        warmup_steps=0.1,  # a ratio: ramp the learning rate up over the first 10% of the steps
        weight_decay=0.01,
        bf16=args.bf16,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_steps=args.logging_steps,
        report_to=args.report_to or ("jsonl,tensorboard" if importlib.util.find_spec("tensorboard") else "jsonl"),
        run_name="logs",  # metrics.jsonl (and TensorBoard files) go to output_dir/logs/
        seed=args.seed,
    )
    accuracy = load_metric("accuracy", keep_in_memory=True)

    def compute_metrics(eval_prediction):
        logits, labels = eval_prediction
        return accuracy.compute(predictions=np.argmax(logits, axis=-1), references=labels)

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_set, eval_dataset=test_set,
        processing_class=tokenizer,  # saved with every checkpoint, so each one loads with from_pretrained
        data_collator=DataCollatorWithPadding(tokenizer),  # pads each batch to its longest review only
        compute_metrics=compute_metrics,
    )
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()
    trainer.save_metrics("eval", metrics)
    if trainer.is_world_process_zero():
        curves = plot_history(trainer.state.log_history, os.path.join(args.output_dir, "training_curves.png"), title=title)
        print(f"\ntest accuracy {metrics['eval_accuracy']:.4f}")
        print(f"results in {args.output_dir}/: checkpoint-*/ (one per epoch), the final model and tokenizer, "
              f"eval_results.json, logs/metrics.jsonl, {os.path.basename(curves)}")
    return trainer, metrics


def main():
    args = fill_defaults(build_parser().parse_args())
    train_set, test_set, tokenizer, model = prepare_data_and_model(args)
    train_and_evaluate(args, model, tokenizer, train_set, test_set)


if __name__ == "__main__":
    main()
