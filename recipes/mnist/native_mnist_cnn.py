"""MNIST with a small CNN on trainkit's Accelerator: pytorch_mnist_cnn.py's loop, converted.

Compare the two files (``diff recipes/mnist/pytorch_mnist_cnn.py recipes/mnist/native_mnist_cnn.py``)
to see everything the conversion changes. The same file runs on one CPU, one GPU, N GPUs or machines:

    python recipes/mnist/native_mnist_cnn.py --synthetic                        # one process
    trainkit launch --num_processes 2 recipes/mnist/native_mnist_cnn.py --synthetic
    trainkit launch --config_file recipes/configs/ddp.yaml recipes/mnist/native_mnist_cnn.py
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from trainkit import Accelerator, DataLoaderConfiguration

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/, for `common`
from common.metrics import load_metric  # evaluate's accuracy, with an offline copy

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # the usual normalisation constants of the real dataset


class Net(nn.Module):
    """The classic MNIST CNN: two 5x5 convolutions with max-pooling, then two fully connected layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5)  # 28x28 -> 24x24, pooled to 12x12
        self.conv2 = nn.Conv2d(32, 64, 5)  # 12x12 -> 8x8, pooled to 4x4
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, images):
        x = F.max_pool2d(F.relu(self.conv1(images)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", action="store_true", help="train on generated digits (offline)")
    parser.add_argument("--num_train", type=int, default=None, help="training images (default: 60000 real, 20000 synthetic)")
    parser.add_argument("--num_test", type=int, default=None, help="test images (default: 10000 real, 4000 synthetic)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log_interval", type=int, default=50, help="print the loss every this many steps")
    parser.add_argument("--output_dir", default="outputs/mnist_native")
    return parser.parse_args()


def load_mnist(args):
    """Train and test splits as TensorDatasets of normalised (1, 28, 28) images and labels."""
    if args.synthetic:
        from synthetic_digits import synthetic_mnist  # next to this script

        splits = synthetic_mnist(args.num_train or 20_000, args.num_test or 4_000, seed=args.seed)
    else:
        from datasets import load_dataset

        splits = load_dataset("ylecun/mnist")

    def to_tensors(split, limit):
        if limit is not None:
            split = split.select(range(min(limit, len(split))))
        images = torch.from_numpy(np.stack([np.asarray(image) for image in split["image"]]))
        images = (images.float() / 255 - MNIST_MEAN) / MNIST_STD
        return TensorDataset(images.unsqueeze(1), torch.tensor(split["label"]))

    return to_tensors(splits["train"], args.num_train), to_tensors(splits["test"], args.num_test)


def train_one_epoch(model, loader, optimizer, accelerator, epoch, args):
    model.train()
    for step, (images, labels) in enumerate(loader):
        optimizer.zero_grad()  # the prepared loader already put the batch on accelerator.device
        loss = F.cross_entropy(model(images), labels)
        accelerator.backward(loss)
        optimizer.step()
        if step % args.log_interval == 0:
            accelerator.print(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f}")


@torch.no_grad()
def evaluate(model, loader, metric, accelerator):
    model.eval()
    for images, labels in loader:
        predictions = model(images).argmax(dim=-1)
        # Every process scored its share of the test set: collect all of it (without the padding).
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        metric.add_batch(predictions=predictions.cpu(), references=labels.cpu())
    return metric.compute()["accuracy"]


def main():
    args = parse_args()
    # One shuffling seed for every process (each then reads its own share of every global batch).
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(data_seed=args.seed, use_seedable_sampler=True))

    with accelerator.main_process_first():  # process 0 downloads, the others then read its cache
        train_set, test_set = load_mnist(args)
    # Explicit generators make runs reproducible: the sampler's fixes the shuffling order, and the
    # loaders' keep DataLoader from drawing its base seed from the global RNG (which dropout uses).
    train_sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(args.seed))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler,
                              generator=torch.Generator().manual_seed(args.seed))
    test_loader = DataLoader(test_set, batch_size=256, generator=torch.Generator().manual_seed(args.seed))

    torch.manual_seed(args.seed)  # same initial weights and dropout masks on every run
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, optimizer, train_loader, test_loader = accelerator.prepare(model, optimizer, train_loader, test_loader)
    metric = load_metric("accuracy", keep_in_memory=True)

    history = []
    for epoch in range(args.epochs):
        # The prepared loader reshuffles each epoch by itself, from (data_seed, epoch).
        train_one_epoch(model, train_loader, optimizer, accelerator, epoch, args)
        accuracy = evaluate(model, test_loader, metric, accelerator)
        history.append({"epoch": epoch + 1, "eval_accuracy": accuracy})
        accelerator.print(f"epoch {epoch}: test accuracy {accuracy:.4f}")

    accelerator.save_model(model, args.output_dir)  # model.safetensors, full weights, from process 0
    if accelerator.is_main_process:
        with open(os.path.join(args.output_dir, "results.json"), "w") as f:
            json.dump(history, f, indent=2)
    accelerator.print(f"model and results in {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
