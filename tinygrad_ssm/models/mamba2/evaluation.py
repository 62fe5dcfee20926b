"""Scoring a long text: the cross entropy of every next token, in windows, with the state carried between them.

A transformer scores a text longer than its context with overlapping windows (each token re-reads the last
context_length - stride tokens). A state space model needs none of that: its whole past lives in the cache (a
conv state and an SSM state per layer, O(1) in the text's length), so a window started from the previous
window's final state computes exactly what one forward over the whole text would. `evaluate` therefore reads
every token once, and its result does not depend on `window` up to float rounding (tests/models/test_evaluation.py
holds it to one plain forward).

    result = evaluate(model, ids, window=512)          # ids (n,) ints: n - 1 predictions
    result.perplexity, result.bits_per_token, result.bits_per_byte(n_bytes)
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...autograd import functional as F
from ...autograd.tensor import no_grad
from ...fast import row_ops


@dataclass(frozen=True)
class EvalResult:
    tokens: int      # predictions scored (the text's ids less the first, which has no context)
    nats: float      # the sum of their cross entropies
    windows: int

    @property
    def mean_nats(self) -> float:
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nats)

    @property
    def bits_per_token(self) -> float:
        return self.mean_nats / math.log(2)

    def bits_per_byte(self, n_bytes: int) -> float:
        """The total bits over the bytes of text the scored tokens stand for (tokenizers compare on it)."""
        return self.nats / math.log(2) / n_bytes


def evaluate(model, ids, window: int = 512, *, carry_state: bool = True,
             progress: Callable[[int], None] | None = None) -> EvalResult:
    """Cross entropy of ids[1:] given what precedes each, in windows of `window` predictions. carry_state=False
    starts every window from a zero state (what training's validation does with its fixed windows), to compare
    with it. `progress(n)` is called with the number of predictions each window scored."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"evaluate: ids must be a 1-D array of token ids, got dtype {ids.dtype} shape {ids.shape}")
    if len(ids) < 2:
        raise ValueError(f"evaluate: ids must hold at least 2 tokens (one to predict from, one to predict), got "
                         f"{len(ids)}")
    if not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 1:
        raise ValueError(f"evaluate: window must be an int >= 1, got {window!r}")
    inputs, targets = ids[:-1].astype(np.int64), ids[1:].astype(np.int64)  # (n - 1,) each
    cross_entropy = row_ops.cross_entropy if model.fused else F.cross_entropy
    nats, windows = 0.0, 0
    cache = model.allocate_cache(1) if carry_state else None
    with no_grad():
        for start in range(0, len(inputs), window):
            x = inputs[start:start + window][None]                       # (1, w)
            y = targets[start:start + window][None]                      # (1, w)
            logits = model(x, cache)                                     # (1, w, V); the cache moves to the end
            mean = cross_entropy(logits, y).data                         # mean over the window's w predictions
            nats += float(mean) * y.size
            windows += 1
            if progress is not None:
                progress(y.size)
    return EvalResult(tokens=len(targets), nats=nats, windows=windows)

