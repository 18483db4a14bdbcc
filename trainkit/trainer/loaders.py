"""The Trainer's DataLoaders and the batches it feeds the model: transformers' data hooks.

``get_train_dataloader``, ``get_eval_dataloader`` and ``get_test_dataloader`` build plain torch DataLoaders
through ``_get_dataloader``, which drops what the model's forward does not take (``_remove_unused_columns`` for a
``datasets.Dataset``, ``_get_collator_with_removed_columns`` for other datasets) and hands the loader to the
engine, which shards it across processes. ``get_batch_samples`` takes one optimizer step's micro-batches and
opens the engine's accumulation window for them; ``_prepare_inputs`` puts a batch on the device.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from .data import LABEL_COLUMN_ALIASES, UnusedColumnsDropper

if TYPE_CHECKING:
    from torch import nn

    from trainkit.engine import Accelerator

    from .training_arguments.arguments import TrainingArguments
    from .callbacks import CallbackHandler
    from .data import ItemCounter

# a Trainer mixin's messages are the Trainer's: one logger for them all, as transformers' come from transformers.trainer
logger = logging.getLogger("trainkit.trainer.trainer")


def seed_worker(worker_id: int, num_workers: int, rank: int) -> None:
    """Seed a training loader's worker as transformers' ``trainer_utils.seed_worker`` does: python, numpy and torch
    from the worker's torch seed plus ``num_workers * rank`` (the same for every worker of a process, as there)."""
    from trainkit.engine import set_seed

    set_seed(num_workers * rank + torch.initial_seed() % 2**32)


def is_columnar(dataset: Any) -> bool:
    """A ``datasets.Dataset``-like table whose columns are known: unused ones are removed from the table itself."""
    return hasattr(dataset, "remove_columns") and getattr(dataset, "column_names", None) is not None


class DataLoaderMethods:
    """transformers' DataLoader and batch hooks (mixed into :class:`~trainkit.Trainer`)."""

    if TYPE_CHECKING:
        args: TrainingArguments
        accelerator: Accelerator
        model: nn.Module
        data_collator: Callable[[list[Any]], Any]
        train_dataset: Any
        eval_dataset: Any
        label_names: list[str]
        _signature_columns: list[str] | None
        _train_batch_size: int
        _eval_dataloaders: dict[Any, DataLoader]
        _count_items: ItemCounter
        callback_handler: CallbackHandler

        def _get_train_sampler(self, train_dataset: Any = None) -> Any: ...

        def _get_eval_sampler(self, eval_dataset: Any) -> Any: ...

    def get_train_dataloader(self) -> DataLoader:
        """The training DataLoader, shuffled with ``data_seed`` and sharded across processes by the engine."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset.")
        return self._get_dataloader(self.train_dataset, "Training", self._train_batch_size,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        """The evaluation DataLoader of ``eval_dataset`` (a dataset, or the name of one of ``self.eval_dataset``'s),
        in order, nothing dropped; built afresh on each call (as transformers: changed arguments apply), except
        with ``dataloader_persistent_workers``, where the loader of a dataset is kept so its workers live on."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Evaluation needs an eval_dataset (in the Trainer or as an argument).")
        key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        persistent = self.args.dataloader_persistent_workers
        if persistent and id(eval_dataset) in self._eval_dataloaders:
            return self._eval_dataloaders[id(eval_dataset)]
        loader = self._get_dataloader(eval_dataset, "Evaluation", self.args.per_device_eval_batch_size,
                                      sampler_fn=self._get_eval_sampler, dataloader_key=key)
        if persistent:
            self._eval_dataloaders[id(eval_dataset)] = loader
        return loader

    def get_test_dataloader(self, test_dataset: Any) -> DataLoader:
        """The prediction DataLoader for ``test_dataset`` (in order, nothing dropped)."""
        return self._get_dataloader(test_dataset, "test", self.args.per_device_eval_batch_size,
                                    sampler_fn=self._get_eval_sampler)

    def _get_dataloader(self, dataset: Any, description: str, batch_size: int,
                        sampler_fn: Callable[[Any], Any] | None = None, is_training: bool = False,
                        dataloader_key: Any = None) -> DataLoader:
        """A DataLoader over ``dataset`` without the columns the model does not take, prepared by the engine.

        ``sampler_fn(dataset)`` gives the sampler (None: shuffled when training, in order otherwise); an
        iterable dataset is read in its own order."""
        args = self.args
        collator = self.data_collator
        if is_columnar(dataset):
            dataset = self._remove_unused_columns(dataset, description=description)
        else:
            collator = self._get_collator_with_removed_columns(self.data_collator, description=description)
        sampler = None
        if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__getitem__"):
            sampler = sampler_fn(dataset) if sampler_fn is not None else None
            if sampler is None:
                sampler = RandomSampler(dataset) if is_training else SequentialSampler(dataset)
        workers = args.dataloader_num_workers
        worker_init_fn = None
        if is_training and sampler is not None:  # transformers seeds a map-style training loader's workers
            worker_init_fn = functools.partial(seed_worker, num_workers=workers, rank=args.process_index)
        loader = DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, collate_fn=collator,
            drop_last=args.dataloader_drop_last if is_training else False, num_workers=workers,
            pin_memory=args.dataloader_pin_memory and torch.cuda.is_available(),
            persistent_workers=args.dataloader_persistent_workers if workers else False,
            prefetch_factor=args.dataloader_prefetch_factor if workers else None,
            multiprocessing_context=args.dataloader_multiprocessing_context, in_order=args.dataloader_in_order,
            worker_init_fn=worker_init_fn,
        )
        return self.accelerator.prepare(loader)

    def _set_signature_columns_if_needed(self) -> None:
        """``self._signature_columns``: the names ``model.forward`` takes, and the label columns."""
        if self._signature_columns is None:
            model = self.model
            get_base_model = getattr(model, "get_base_model", None)  # a PEFT model: its base model's forward
            if callable(get_base_model):
                model = get_base_model()
            columns = list(inspect.signature(model.forward).parameters)
            self._signature_columns = columns + sorted(set(LABEL_COLUMN_ALIASES) | set(self.label_names))

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        """``dataset`` (a ``datasets.Dataset``) without the columns ``model.forward`` does not take, when
        ``remove_unused_columns``; none left is an error naming the dropped columns."""
        if not self.args.remove_unused_columns:
            return dataset
        self._set_signature_columns_if_needed()
        accepted = self._signature_columns or []
        unused = [column for column in dataset.column_names if column not in accepted]
        where = f" ({description})" if description else ""
        if unused:
            logger.info("Dropping columns%s that %s.forward does not take: %s", where, type(self.model).__name__, unused)
        if len(unused) == len(dataset.column_names):
            raise ValueError(f"No column{where} is left after dropping those {type(self.model).__name__}.forward does "
                             f"not take (dropped {unused}). Rename your columns to the forward's argument names or "
                             "pass remove_unused_columns=False.")
        return dataset.remove_columns(unused) if unused else dataset

    def _get_collator_with_removed_columns(self, data_collator: Callable[[list[Any]], Any],
                                           description: str | None = None) -> Callable[[list[Any]], Any]:
        """``data_collator`` behind a filter that drops the keys of dict samples ``model.forward`` does not take
        (for datasets whose columns are not known up front), when ``remove_unused_columns``."""
        if not self.args.remove_unused_columns:
            return data_collator
        self._set_signature_columns_if_needed()
        return UnusedColumnsDropper(data_collator, set(self._signature_columns or []), description or "data")

    def num_examples(self, dataloader: DataLoader) -> int:
        """Samples in ``dataloader``'s dataset (or, without one, batches x ``per_device_train_batch_size``)."""
        try:
            return len(dataloader.dataset)  # type: ignore[arg-type]  # torch types Dataset without __len__; caught below
        except (AttributeError, TypeError):
            return len(dataloader) * self.args.per_device_train_batch_size

    def _prepare_input(self, data: Any) -> Any:
        """``data`` on the device, nested dicts, lists and tuples included."""
        if isinstance(data, Mapping):
            return type(data)({key: self._prepare_input(value) for key, value in data.items()})  # type: ignore[call-arg]  # a Mapping subclass built from a dict
        if isinstance(data, (tuple, list)):
            return type(data)(self._prepare_input(value) for value in data)
        if isinstance(data, torch.Tensor):
            return data.to(self.accelerator.device)
        return data

    def _prepare_inputs(self, inputs: Any) -> Any:
        """One batch ready for the model: on the device; an empty batch is an error."""
        inputs = self._prepare_input(inputs)
        if len(inputs) == 0:
            raise ValueError("The batch is empty: check that the dataset has the columns the model takes "
                             f"({', '.join(self._signature_columns or [])}).")
        return inputs
