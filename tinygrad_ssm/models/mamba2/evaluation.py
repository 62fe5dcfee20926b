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
from collections.abc import Callable, Iterable
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
        # 0 gave a bare ZeroDivisionError, -5 a negative figure
        if not isinstance(n_bytes, (int, np.integer)) or isinstance(n_bytes, bool) or n_bytes < 1:
            raise ValueError(f"bits_per_byte: n_bytes must be an int >= 1, the bytes of text the scored tokens "
                             f"stand for, got {n_bytes!r}")
        return self.nats / math.log(2) / int(n_bytes)


def evaluate(model, ids, window: int = 512, *, carry_state: bool = True,
             progress: Callable[[int], None] | None = None) -> EvalResult:
    """Cross entropy of ids[1:] given what precedes each, in windows of `window` predictions. carry_state=False
    starts every window from a zero state (what training's validation does with its fixed windows), to compare
    with it. `progress(n)` is called with the number of predictions each window scored."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"evaluate: ids must be a 1-D array of token ids, got dtype {ids.dtype} shape {ids.shape}")
    return evaluate_pieces(model, [ids], window, carry_state=carry_state, progress=progress)


def _check_ids(piece: np.ndarray, vocab: int, read: int) -> None:
    """Every id of `piece` (the text's ids from position `read` on) is a row of the model's vocabulary. The model
    checks its inputs, but the text's last id is only a target, which cross entropy would skip when it is -100
    (its ignore_index) while the result still counted it: a silently wrong perplexity."""
    bad = np.flatnonzero((piece < 0) | (piece >= vocab))
    if bad.size:
        raise ValueError(f"evaluate: ids must be token ids in [0, {vocab}), got {int(piece[bad[0]])} at position "
                         f"{read + int(bad[0])}")


def evaluate_pieces(model, pieces: Iterable, window: int = 512, *, carry_state: bool = True,
                    progress: Callable[[int], None] | None = None,
                    token_nats: Callable[[np.ndarray], None] | None = None) -> EvalResult:
    """evaluate of the ids the 1-D arrays of `pieces` join into, read as they come (a text tokenized piece by
    piece: memory flat in its length): the same windows, so the same result, as evaluate of the whole.
    `token_nats(nats)` is called with each window's (w,) float64 cross entropies, one per prediction in the text's
    order (eval's per-file figures): the result's `nats` is their sum, so parts of them add up to it."""
    if not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 1:
        raise ValueError(f"evaluate: window must be an int >= 1, got {window!r}")
    cross_entropy = row_ops.cross_entropy if model.fused else F.cross_entropy
    nats, windows, tokens = 0.0, 0, 0
    cache = model.allocate_cache(1) if carry_state else None
    pending = np.zeros(0, np.int64)      # (k,) ids not yet scored as inputs: the last one is the next window's first

    def score(chunk: np.ndarray) -> None:                                # (w + 1,): w predictions
        nonlocal nats, windows, tokens
        x, y = chunk[None, :-1], chunk[None, 1:]                         # (1, w) each
        logits = model(x, cache)                                         # (1, w, V); the cache moves to the end
        # each prediction's loss (the kernel computes them for the mean anyway), added up in float64
        losses = np.asarray(cross_entropy(logits, y, reduction="none").data, np.float64).reshape(-1)   # (w,)
        nats += float(losses.sum())
        windows, tokens = windows + 1, tokens + y.size
        if token_nats is not None:
            token_nats(losses)
        if progress is not None:
            progress(y.size)

    with no_grad():
        for piece in pieces:
            piece = np.asarray(piece)
            if piece.ndim != 1 or not np.issubdtype(piece.dtype, np.integer):
                raise ValueError(f"evaluate: ids must be a 1-D array of token ids, got dtype {piece.dtype} shape "
                                 f"{piece.shape}")
            _check_ids(piece, model.config.padded_vocab_size, read=tokens + len(pending))
            pending = np.concatenate([pending, piece.astype(np.int64)])
            full = (len(pending) - 1) // window                          # whole windows with their targets
            for k in range(full):
                score(pending[k * window:(k + 1) * window + 1])
            pending = pending[full * window:]
        if tokens + len(pending) < 2:
            raise ValueError(f"evaluate: ids must hold at least 2 tokens (one to predict from, one to predict), "
                             f"got {tokens + len(pending)}")
        if len(pending) > 1:                                             # the last, shorter window
            score(pending)
    return EvalResult(tokens=tokens, nats=nats, windows=windows)
