"""What the Trainer reads, in which order: transformers' samplers (``train_sampling_strategy``, length grouping drawn
as transformers draws it) and the hooks a subclass overrides to change them (:class:`SamplingHooks`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from . import loss_items

if TYPE_CHECKING:
    from trainkit.trainer.training_arguments.arguments import TrainingArguments


class LengthGroupedPassSampler(torch.utils.data.Sampler):
    """transformers' length-grouped order (megabatches sorted by length, the longest batch first), drawn at each pass's
    start from torch's global generator as transformers' ``LengthGroupedSampler`` draws it, so the order and the random
    stream are transformers'. A prepared loader calls :meth:`draw_pass_order` when the pass starts (and replays it on
    resume: trainkit/engine/data/pass_draws.py); every process takes the main process's order. With ``seed`` (an
    evaluation order) every pass draws from a generator seeded with it instead: the same order each time."""

    def __init__(self, batch_size: int, dataset: Any, lengths: list[int] | None, model_input_name: str | None,
                 seed: int | None = None) -> None:
        from transformers.trainer_pt_utils import LengthGroupedSampler

        grouped = LengthGroupedSampler(batch_size, dataset=dataset, lengths=lengths, model_input_name=model_input_name)
        self.lengths, self.batch_size, self.seed = grouped.lengths, grouped.batch_size, seed
        self._order: list[int] | None = None

    def draw_pass_order(self, generator: torch.Generator) -> None:
        """Draw the next pass's order from ``generator`` (every process draws; the main process's order is kept)."""
        from transformers.trainer_pt_utils import get_length_grouped_indices

        from trainkit.engine import broadcast_object_list

        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed)
        order = get_length_grouped_indices(self.lengths, self.batch_size, generator=generator)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            order = broadcast_object_list([order])[0]
        self._order = order

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        if self._order is None:  # iterated outside a prepared loader: draw now, as transformers' sampler does
            self.draw_pass_order(torch.default_generator)
        order, self._order = self._order, None
        return iter(order)


def _lengths_and_input_name(trainer: Any, dataset: Any) -> tuple[Any, str | None]:
    """The dataset's length column (``length_column_name``) and the processing class's first input name, as
    transformers reads them for length grouping."""
    args = trainer.args
    columns = getattr(dataset, "column_names", None) or []
    lengths = dataset[args.length_column_name] if args.length_column_name in columns else None
    input_names = getattr(trainer.processing_class, "model_input_names", None)
    return lengths, input_names[0] if input_names else None


def train_sampler(trainer: Any, dataset: Any) -> torch.utils.data.Sampler | None:
    """The sampler ``train_sampling_strategy`` names (None for a dataset without a length: its own order)."""
    args = trainer.args
    if not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        if args.train_sampling_strategy != "random":
            raise ValueError(f"train_sampling_strategy={args.train_sampling_strategy!r} needs a dataset with len(); "
                             "an iterable dataset is read in its own order.")
        return None
    if args.train_sampling_strategy == "sequential":
        return torch.utils.data.SequentialSampler(dataset)
    if args.train_sampling_strategy != "group_by_length":
        return torch.utils.data.RandomSampler(dataset)
    lengths, model_input_name = _lengths_and_input_name(trainer, dataset)
    # Megabatches of a whole optimizer step's batches, as transformers groups them.
    megabatch = args.per_device_train_batch_size * trainer.accelerator.gradient_accumulation_steps
    return LengthGroupedPassSampler(megabatch, dataset, lengths, model_input_name)


EVAL_ORDER_SEEDED_SINCE = (5, 16)
"""From this transformers release a length-grouped evaluation order comes from ``data_seed`` (before: the global RNG)."""


def eval_sampler(trainer: Any, dataset: Any) -> torch.utils.data.Sampler | None:
    """The evaluation order: transformers' length-grouped one under ``group_by_length`` (from a generator seeded
    with ``data_seed``, else ``seed``; before transformers 5.16 drawn from the global RNG at each evaluation), else
    sequential; None for a dataset without a length."""
    from .training_arguments.fields import installed_transformers_release

    args = trainer.args
    if dataset is None or not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    if args.train_sampling_strategy == "group_by_length":
        lengths, model_input_name = _lengths_and_input_name(trainer, dataset)
        seed = args.data_seed if args.data_seed is not None else args.seed
        if installed_transformers_release() < EVAL_ORDER_SEEDED_SINCE:
            seed = None
        return LengthGroupedPassSampler(args.per_device_eval_batch_size, dataset, lengths, model_input_name, seed)
    return torch.utils.data.SequentialSampler(dataset)


class SamplingHooks:
    """transformers' Trainer hooks that decide what the training loop reads, for a subclass to override: the
    training and evaluation orders, and each optimizer step's window of batches with its loss-item count."""

    args: TrainingArguments
    train_dataset: Any

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        """The order ``train_sampling_strategy`` names (None: a dataset without a length, read in its own order)."""
        return train_sampler(self, self.train_dataset if train_dataset is None else train_dataset)

    def _get_eval_sampler(self, eval_dataset: Any) -> torch.utils.data.Sampler | None:
        """An evaluation set's order: sequential, length-grouped under ``group_by_length`` (None: no length)."""
        return eval_sampler(self, eval_dataset)

    def get_batch_samples(self, epoch_iterator: Iterator[Any], num_batches: int,
                          device: torch.device | None) -> tuple[list[Any], torch.Tensor | None]:
        """The next ``num_batches`` batches (fewer at the epoch's end) and their loss items on all processes, counted
        as transformers counts them (``num_items_in_batch``; None when transformers would not count them)."""
        batch_samples = list(itertools.islice(epoch_iterator, num_batches))
        return batch_samples, self._get_num_items_in_batch(batch_samples, device)

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device | None) -> torch.Tensor | None:
        """The labels that are not -100 in ``batch_samples`` on all processes, where transformers counts them."""
        return loss_items.num_items_in_batch(self, batch_samples, device)


def seed_run(args: TrainingArguments) -> None:
    """set_seed, or with full_determinism transformers' enable_full_determinism (deterministic kernels too)."""
    if args.full_determinism:
        from transformers.trainer_utils import enable_full_determinism

        enable_full_determinism(args.seed)
    else:
        from trainkit.engine import set_seed

        set_seed(args.seed)
