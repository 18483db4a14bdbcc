"""The random numbers a prepared loader's pass draws outside the model, and replaying them on resume.

A pass of torch's DataLoader draws its iterator's base seed (its workers' seed) from the loader's ``generator``,
else from torch's global generator; a ``RandomSampler`` without a generator then draws its own seed from the global
generator; and a collate function may draw while a batch is read (MLM masking). A prepared loader reads one batch
ahead of the one it hands out (to know which is the last), as Accelerate's does. Prepared loaders make exactly
these draws in this order, so the model's random stream (dropout) is the one Accelerate and transformers give on
the same seed.

For an exact resume, a checkpoint taken inside a pass stores, per process: the states of the generators the pass's
starting draws came from, taken before them, and the global states (python, numpy, torch) before the batch read
ahead was collated. The resumed pass takes its starting draws from copies of the first (the restored global state
is not touched) and collates its first batch under the second, then puts the restored states back: from there on
every draw is the uninterrupted run's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from trainkit.utils.random import rng_state_from_text, rng_state_to_text


def _global_states(everything: bool = True) -> tuple[Any, Any, torch.Tensor]:
    """torch's global state, with python's and numpy's too when ``everything`` (they cost tens of microseconds)."""
    if not everything:
        return None, None, torch.get_rng_state()
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_global_states(states: tuple[Any, Any, torch.Tensor]) -> None:
    if states[0] is not None:
        random.setstate(states[0])
        np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _states_to_json(states: tuple[Any, Any, torch.Tensor]) -> dict[str, Any]:
    text: dict[str, Any] = {"torch": rng_state_to_text(states[2])}
    if states[0] is not None:
        version, internal, gauss = states[0]
        kind, keys, position, has_gauss, cached = states[1]
        text.update(python=[version, list(internal), gauss],
                    numpy=[kind, keys.tolist(), int(position), int(has_gauss), float(cached)])
    return text


def _states_from_json(state: dict[str, Any]) -> tuple[Any, Any, torch.Tensor]:
    if "python" not in state:
        return None, None, rng_state_from_text(state["torch"])
    version, internal, gauss = state["python"]
    kind, keys, position, has_gauss, cached = state["numpy"]
    return ((version, tuple(internal), gauss), (kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached),
            rng_state_from_text(state["torch"]))


def _generator_from(state: torch.Tensor | None) -> torch.Generator:
    generator = torch.Generator()
    if state is not None:
        generator.set_state(state)
    return generator


class PassDraws:
    """One prepared loader's draws outside the model: recorded while a pass runs, replayed by a resumed pass.

    ``reads_in_workers``: batches are collated in worker processes, so reading one draws nothing here.
    ``all_generators``: note python's and numpy's states before each read too, not only torch's (the Trainer's and
    stateful loaders; the two cost tens of microseconds a batch, so other loaders replay torch draws only).
    ``draw_order``: for a sampler that draws its order from the global generator when its pass starts, what makes
    that draw from a given generator (the global one, or a resumed pass's copy of it): a generator-less
    ``RandomSampler`` on one process (:func:`reseeding`), or any sampler with a ``draw_pass_order(generator)``
    method (transformers' length-grouped order). None: the sampler draws nothing from the global generator.
    Shared by a loader and the views ``skip_first_batches`` makes of it.
    """

    def __init__(self, reads_in_workers: bool, draw_order: Callable[[torch.Generator], None] | None = None,
                 all_generators: bool = False) -> None:
        self.reads_in_workers = reads_in_workers
        self.all_generators = all_generators
        self.draw_order = draw_order
        self._start: dict[str, torch.Tensor] | None = None
        self._read_ahead: tuple[Any, Any, torch.Tensor] | None = None
        self._replay: dict[str, Any] | None = None
        self._replay_source: dict[str, Any] | None = None  # the loaded JSON, until the next pass takes it
        self._replay_read: tuple[Any, Any, torch.Tensor] | None = None
        self._pending_order: tuple[torch.Generator, Callable[[], None] | None] | None = None
        """The pass's order draw, made when the sampler starts (:meth:`sampler_starts`): its source, then what aligns
        the shuffling generator once it has drawn."""

    # -- a pass ---------------------------------------------------------------------------------------
    def open(self, loader: Any, new_iterator: Callable[[], Iterator[Any]], epoch: int, skip: int,
             begin_sampler_pass: Callable[[], None] | None = None) -> Iterator[Any]:
        """The pass's DataLoader iterator with its starting draws made: afresh, or replayed when the pass at ``epoch``
        starting ``skip`` samples in continues the one a loaded checkpoint was taken in.

        ``begin_sampler_pass`` aligns a shuffling generator (see :mod:`.generator_sync`): before the base seed is
        drawn, as Accelerate does, except for a sampler that draws its order, whose pass starts once it has.
        """
        replay, self._replay, self._replay_source = self._replay, None, None
        if replay is not None and (replay["epoch"], replay["samples_seen"]) != (epoch, skip):
            replay = None  # the run started this epoch over (or elsewhere): draw afresh, as a new pass does
        self._read_ahead = None
        draw_order = self.draw_order
        if begin_sampler_pass is not None and draw_order is None:
            begin_sampler_pass()
        if replay is None:
            draws_base = not (loader.num_workers > 0 and loader.persistent_workers and loader._iterator is not None)
            self._start = None
            if draws_base or draw_order is not None:
                self._start = {"global": torch.get_rng_state()}
                if loader.generator is not None:
                    self._start["loader"] = loader.generator.get_state()
            if draw_order is not None:
                self._pending_order = (torch.default_generator, begin_sampler_pass)
            return new_iterator()
        return self._replayed_iterator(loader, new_iterator, replay, begin_sampler_pass)

    def sampler_starts(self) -> None:
        """The pass's sampler starts iterating: make its order draw now, as a sampler drawing for itself would (after
        the iterator's base seed; with worker processes, inside the iterator's construction, whose prefetching
        starts the sampler). Nothing when no draw is pending (a sampler iterated outside a pass)."""
        pending, self._pending_order = self._pending_order, None
        if pending is None or self.draw_order is None:
            return
        source, begin_sampler_pass = pending
        self.draw_order(source)
        if begin_sampler_pass is not None:
            begin_sampler_pass()

    def _replayed_iterator(self, loader: Any, new_iterator: Callable[[], Iterator[Any]], replay: dict[str, Any],
                           begin_sampler_pass: Callable[[], None] | None) -> Iterator[Any]:
        """The starting draws from copies of the stored generator states; the live global state is left alone."""
        start = self._start = replay["start"]
        self._replay_read = replay["read_ahead"]
        stand_in = _generator_from(start.get("global") if start else None)  # draws what the global one drew
        if self.draw_order is not None:
            self._pending_order = (stand_in, begin_sampler_pass)
        own = loader.generator
        if own is not None and start and "loader" in start:
            own.set_state(start["loader"])  # the loader's own generator continues as it did
        else:
            loader.generator = stand_in if own is None else _generator_from(None)
        try:
            return new_iterator()
        finally:
            loader.generator = own

    def read(self, next_batch: Callable[[], Any]) -> Any:
        """Read the next batch, noting the global states it was collated from (or, for a resumed pass's first batch,
        collating it from the stored ones and putting the current ones back)."""
        if self._replay_read is not None:
            stored, self._replay_read = self._replay_read, None
            current = _global_states(stored[0] is not None)
            _set_global_states(stored)
            try:
                return next_batch()
            finally:
                self._read_ahead = stored
                _set_global_states(current)
        if not self.reads_in_workers:
            self._read_ahead = _global_states(self.all_generators)
        return next_batch()

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self, epoch: int, samples_seen: int) -> dict[str, Any]:
        """This process's draws of the running pass, at the position ``(epoch, samples_seen)`` (JSON); a loaded
        state not replayed yet is kept as it was."""
        if self._replay_source is not None:
            return self._replay_source
        return {"epoch": epoch, "samples_seen": samples_seen,
                "start": None if self._start is None else {k: rng_state_to_text(v) for k, v in self._start.items()},
                "read_ahead": None if self._read_ahead is None else _states_to_json(self._read_ahead)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Replay ``state`` (from :meth:`state_dict`) in the next pass, if it starts where that one stood."""
        self._replay_source = state or None
        if not state:
            self._replay = None
            return
        start = state.get("start")
        read_ahead = state.get("read_ahead")
        self._replay = {"epoch": int(state["epoch"]), "samples_seen": int(state["samples_seen"]),
                        "start": None if start is None else {k: rng_state_from_text(v) for k, v in start.items()},
                        "read_ahead": None if read_ahead is None else _states_from_json(read_ahead)}


def reseeding(generator: torch.Generator) -> Callable[[torch.Generator], None]:
    """The draw a ``RandomSampler`` without a generator makes at each pass, for the one it was given instead: a seed
    from ``source`` (torch's global generator in a fresh pass)."""
    return _Reseeding(generator)


class _Reseeding:
    """:func:`reseeding`'s draw (a class, so a prepared loader holding it pickles)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, source: torch.Generator) -> None:
        self.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_(generator=source).item()))
