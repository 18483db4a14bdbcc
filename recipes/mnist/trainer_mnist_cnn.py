"""MNIST with a small CNN and trainkit's Trainer: progress bar, per-epoch accuracy, checkpoints, plots.

The same script runs on one process or many; only the launch command changes:

    python recipes/mnist/trainer_mnist_cnn.py --synthetic                      # one process, offline
    trainkit launch --num_processes 2 recipes/mnist/trainer_mnist_cnn.py --synthetic
    trainkit launch --config_file recipes/configs/ddp.yaml recipes/mnist/trainer_mnist_cnn.py

Without ``--synthetic`` it trains on MNIST from the Hugging Face Hub. ``output_dir`` receives one
``checkpoint-N/`` per epoch, the final model, ``eval_results.json``, the metrics log (JSONL, plus
TensorBoard event files when tensorboard is installed) and ``training_curves.png``.
"""

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainkit import Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/, for `common`
from common.metrics import load_metric  # evaluate's accuracy, with an offline copy
from common.plotting import plot_history

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # the usual normalisation constants of the real dataset


class MnistCNN(nn.Module):
    """The classic MNIST CNN (two 5x5 convolutions, two linear layers), in the Trainer's calling convention:
    keyword inputs named like the batch's columns, and a dict with the loss when labels are given."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5)  # 28x28 -> 24x24, pooled to 12x12
        self.conv2 = nn.Conv2d(32, 64, 5)  # 12x12 -> 8x8, pooled to 4x4
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, pixel_values, labels=None):
        x = F.max_pool2d(F.relu(self.conv1(pixel_values)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        logits = self.fc2(x)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", action="store_true", help="train on generated digits (offline)")
    parser.add_argument("--num_train", type=int, default=None, help="training images (default: 60000 real, 12000 synthetic)")
    parser.add_argument("--num_test", type=int, default=None, help="test images (default: 10000 real, 2000 synthetic)")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch_size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--report_to", default=None, help="trackers (default: jsonl, and tensorboard when installed)")
    parser.add_argument("--output_dir", default="outputs/mnist")
    return parser.parse_args()


def to_model_inputs(batch):
    """Decode a batch of PIL images into the model's normalised (N, 1, 28, 28) float ``pixel_values``."""
    images = torch.from_numpy(np.stack([np.asarray(image) for image in batch["image"]]))
    pixel_values = (images.float() / 255 - MNIST_MEAN) / MNIST_STD
    return {"pixel_values": pixel_values.unsqueeze(1), "labels": torch.tensor(batch["label"])}


def load_mnist(args):
    """Train and test splits that yield ``pixel_values`` and ``labels``, decoded on the fly."""
    if args.synthetic:
        from synthetic_digits import synthetic_mnist  # next to this script

        splits = synthetic_mnist(args.num_train or 12_000, args.num_test or 2_000, seed=args.seed)
    else:
        from datasets import load_dataset

        splits = load_dataset("ylecun/mnist")
    train, test = splits["train"], splits["test"]
    if args.num_train is not None:
        train = train.select(range(min(args.num_train, len(train))))
    if args.num_test is not None:
        test = test.select(range(min(args.num_test, len(test))))
    # Decoding per batch keeps memory flat and starts training at once; the stored images stay PIL.
    return train.with_transform(to_model_inputs), test.with_transform(to_model_inputs)


def main():
    args = parse_args()
    # The JSONL log (logs/metrics.jsonl), plus TensorBoard when installed.
    report_to = args.report_to or ("jsonl,tensorboard" if importlib.util.find_spec("tensorboard") else "jsonl")
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=256,
        learning_rate=args.lr,
        eval_strategy="epoch",  # accuracy on the test split after every epoch
        save_strategy="epoch",  # and a checkpoint-N/ folder, which train(resume_from_checkpoint=True) resumes
        logging_steps=args.logging_steps,
        report_to=report_to,
        run_name="logs",  # metrics.jsonl (and TensorBoard files) go to output_dir/logs/
        seed=args.seed,
        # The batches are built by to_model_inputs from the "image" column, which the model's
        # forward does not name: keep it instead of pruning it as an unused column.
        remove_unused_columns=False,
    )
    # The main process downloads (or generates) the splits first; the others then read its cache.
    with training_args.main_process_first(desc="loading MNIST"):
        train_set, test_set = load_mnist(args)

    accuracy = load_metric("accuracy", keep_in_memory=True)

    def compute_metrics(eval_prediction):
        logits, labels = eval_prediction
        return accuracy.compute(predictions=np.argmax(logits, axis=-1), references=labels)

    trainer = Trainer(model=MnistCNN(), args=training_args, train_dataset=train_set, eval_dataset=test_set,
                      compute_metrics=compute_metrics)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()  # the final weights, next to the per-epoch checkpoints
    trainer.save_metrics("eval", metrics)

    if trainer.is_world_process_zero():
        curves = plot_history(trainer.state.log_history, os.path.join(args.output_dir, "training_curves.png"), title="MNIST CNN")
        print(f"\ntest accuracy {metrics['eval_accuracy']:.4f} (epochs: {training_args.num_train_epochs:g})")
        print(f"results in {args.output_dir}/:")
        print(f"  checkpoints        {args.output_dir}/checkpoint-*/ (one per epoch)")
        print(f"  final model        {args.output_dir}/model.safetensors")
        print(f"  test metrics       {args.output_dir}/eval_results.json")
        print(f"  metrics log        {args.output_dir}/logs/metrics.jsonl"
              + (f" (TensorBoard: tensorboard --logdir {args.output_dir}/logs)" if "tensorboard" in report_to else ""))
        print(f"  loss and accuracy  {curves}")


if __name__ == "__main__":
    main()
