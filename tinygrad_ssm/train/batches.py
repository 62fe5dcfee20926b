"""The batches drawn from a corpus's streams (train/data.py): random training windows, whose sampler is resumable,
and the fixed validation windows every evaluation scores.

- The train sampler draws `batch_size` windows at uniform random offsets from one np.random.Generator;
  its whole state (bit generator state + batches drawn) is JSON, so a resumed run draws exactly the
  batches the uninterrupted run would have drawn.
- The validation windows are evenly spaced over the split and do not overlap while it is long enough: the same
  windows at every evaluation, so the figures of a run compare from step to step.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .data import check_length


def _windows(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]  # (b, l + 1)
    chunk = data[idx].astype(np.int64)  # (b, l + 1)
    return chunk[:, :-1], chunk[:, 1:]  # inputs (b, l), targets (b, l): the next byte of each input


class BatchSampler:
    """Random training windows; deterministic given the seed, and resumable from `state_dict()`."""

    def __init__(self, data: np.ndarray, batch_size: int, seq_len: int, seed: int = 0):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"BatchSampler: batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
        check_length(data, seq_len, "training", "the corpus")
        self.data, self.batch_size, self.seq_len = data, batch_size, seq_len
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.batches_drawn = 0

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs (b, l), targets (b, l)) as int64 byte ids."""
        high = len(self.data) - self.seq_len  # exclusive: the last start whose window + target fits
        starts = self.rng.integers(0, high, size=self.batch_size)  # (b,)
        self.batches_drawn += 1
        return _windows(self.data, starts, self.seq_len)

    def state_dict(self) -> dict:
        """JSON-serialisable: the generator's exact state and how many batches were drawn."""
        return {"batches_drawn": self.batches_drawn, "bit_generator": self.rng.bit_generator.state,
                "batch_size": self.batch_size, "seq_len": self.seq_len, "data_len": int(len(self.data))}

    def load_state_dict(self, state: dict) -> None:
        mine = (self.batch_size, self.seq_len, int(len(self.data)))
        theirs = (state.get("batch_size"), state.get("seq_len"), state.get("data_len"))
        if mine != theirs:
            raise ValueError(f"BatchSampler.load_state_dict: saved for (batch_size, seq_len, data bytes) = "
                             f"{theirs}, but this sampler has {mine}; resume with the same data and sizes")
        self.rng.bit_generator.state = state["bit_generator"]
        self.batches_drawn = int(state["batches_drawn"])


def eval_window_starts(data_len: int, batch_size: int, seq_len: int, max_batches: int) -> np.ndarray:
    """Start offsets of the fixed validation windows: evenly spaced over the stream, non-overlapping while
    the stream is long enough (a short stream gives fewer windows)."""
    n_fit = (data_len - 1) // seq_len  # non-overlapping windows (+ 1 target byte) that fit
    n_windows = max(1, min(max_batches * batch_size, n_fit))
    return np.linspace(0, data_len - seq_len - 1, n_windows).astype(np.int64)  # (n,)


def eval_batches(data: np.ndarray, batch_size: int, seq_len: int,
                 max_batches: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation batches (the same windows at every evaluation): (inputs (b, l), targets (b, l))."""
    check_length(data, seq_len, "validation", "the corpus")
    starts = eval_window_starts(len(data), batch_size, seq_len, max_batches)
    for i in range(0, len(starts), batch_size):
        yield _windows(data, starts[i:i + batch_size], seq_len)
