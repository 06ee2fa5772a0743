"""Deterministic, resumable, host-sharded batch iteration over an in-memory example list.

Epoch e visits the examples in the order ``permutation(seed, e)`` (numpy's PCG64 seeded with
``[seed, e]``; identity when ``shuffle=False``). The epoch's order is cut into *global*
batches of ``batch_size × process_count`` examples (a trailing partial global batch is
dropped, so every host runs the same number of steps); host ``process_index`` takes the
contiguous slice ``[process_index × batch_size, (process_index + 1) × batch_size)`` of each
global batch. Together the hosts partition every global batch, and a single host
(``process_count=1``) sees the plain shuffled stream.

The iterator's whole state is a small JSON-serialisable dict
``{"seed", "epoch", "position", "num_examples"}`` (``position`` = batches already yielded in
``epoch``); ``make_iterator(..., state=it.state())`` yields exactly the batches the first
iterator would have yielded next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.errors import ConfigError


def epoch_order(num_examples: int, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The example order of one epoch: a permutation of ``range(num_examples)``.

    Deterministic in (seed, epoch); a different epoch gives a different order.
    """
    if not shuffle:
        return np.arange(num_examples)
    rng = np.random.Generator(np.random.PCG64([int(seed), int(epoch)]))
    return rng.permutation(num_examples)


class BatchIterator(Iterator[Any]):
    """Iterator over collated batches; see the module doc and :func:`make_iterator`."""

    def __init__(
        self,
        examples: Sequence[Any],
        *,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any] | None,
        seed: int,
        shuffle: bool,
        num_epochs: int | None,
        process_index: int,
        process_count: int,
        state: Mapping[str, Any] | None,
    ):
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        if process_count <= 0 or not 0 <= process_index < process_count:
            raise ConfigError(
                f"need 0 <= process_index < process_count, got process_index="
                f"{process_index}, process_count={process_count}"
            )
        if num_epochs is not None and num_epochs <= 0:
            raise ConfigError(f"num_epochs must be positive or None, got {num_epochs}")
        self._examples = examples
        self._n = len(examples)
        self._global = batch_size * process_count
        if self._n < self._global:
            raise ConfigError(
                f"{self._n} examples cannot fill one global batch of "
                f"{batch_size} x {process_count} hosts = {self._global}; lower "
                f"batch_size"
            )
        self._batch_size = batch_size
        self._collate = collate_fn
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        self._pi, self._pc = process_index, process_count
        self._seed, self._epoch, self._position = int(seed), 0, 0
        if state is not None:
            self._restore(state)
        self._order = np.empty((0,), np.int64)  # the order of epoch self._order_epoch
        self._order_epoch = -1

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch (the same on every host)."""
        return self._n // self._global

    def _restore(self, state: Mapping[str, Any]):
        missing = {"seed", "epoch", "position", "num_examples"} - set(state)
        if missing:
            raise ConfigError(f"iterator state is missing keys {sorted(missing)}")
        if int(state["num_examples"]) != self._n:
            raise ConfigError(
                f"iterator state was saved for {state['num_examples']} examples, "
                f"but the data set has {self._n}; resume with the same data"
            )
        if int(state["seed"]) != self._seed:
            raise ConfigError(
                f"iterator state has seed {state['seed']}, the iterator was "
                f"built with seed {self._seed}; they must match"
            )
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        if not 0 <= self._position <= self.steps_per_epoch:
            raise ConfigError(
                f"iterator state position {self._position} is outside 0..{self.steps_per_epoch}"
            )

    def state(self) -> dict[str, int]:
        """JSON-serialisable position after the last yielded batch."""
        return {
            "seed": self._seed,
            "epoch": self._epoch,
            "position": self._position,
            "num_examples": self._n,
        }

    def __iter__(self):
        return self

    def next_indices(self) -> np.ndarray:
        """Advance and return this host's example indices for the next batch."""
        if self._position >= self.steps_per_epoch:
            self._epoch += 1
            self._position = 0
        if self._num_epochs is not None and self._epoch >= self._num_epochs:
            raise StopIteration
        if self._order_epoch != self._epoch:
            self._order = epoch_order(
                self._n, seed=self._seed, epoch=self._epoch, shuffle=self._shuffle
            )
            self._order_epoch = self._epoch
        start = self._position * self._global + self._pi * self._batch_size
        idx = self._order[start : start + self._batch_size]
        self._position += 1
        return idx

    def __next__(self):
        idx = self.next_indices()
        batch = [self._examples[int(i)] for i in idx]
        return batch if self._collate is None else self._collate(batch)


def make_iterator(
    examples: Sequence[Any],
    *,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    state: Mapping[str, Any] | None = None,
) -> BatchIterator:
    """A resumable iterator of per-host batches.

    Args:
      examples: the whole (tokenised) data set, identical on every host.
      batch_size: examples per batch on this host.
      collate_fn: list of examples → batch (e.g. ``functools.partial(collate_sequences,
        padding=...)``); None yields the lists themselves.
      seed: shuffling seed. shuffle: False keeps the file order every epoch.
      num_epochs: stop after this many epochs (None: forever).
      process_index, process_count: this host and the number of hosts
        (``jax.process_index()``, ``jax.process_count()``).
      state: a dict from :meth:`BatchIterator.state` to resume from.

    Returns:
      a :class:`BatchIterator`.
    """
    return BatchIterator(
        examples,
        batch_size=batch_size,
        collate_fn=collate_fn,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        process_index=process_index,
        process_count=process_count,
        state=state,
    )
