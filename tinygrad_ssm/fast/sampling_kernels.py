"""Sampling the next token inside numba: a repetition penalty, temperature, top-k, top-p and min-p over the first
`vocab` logits of each row, one uniform number per row. The twin of models/mamba2/sampling.py's `sample_next`
(NumPy, the spec), step by step in its order: the sums run one token after the other as np.cumsum's do, so no
fastmath here (reassociated sums would give other bits). The exp is libm's, NumPy's may differ from it in the
last bit; the ids differ only if a uniform number lands within that rounding of a boundary
(tests/fast/test_sampling_kernels.py).
"""
from __future__ import annotations

import math

import numpy as np

from .jit import njit

_SAMPLE_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(**_SAMPLE_JIT)
def sample_row(row, vocab, temperature, top_k, top_p, min_p, penalty, seen, u, w):
    """The id drawn from row[:vocab] (logits of any float dtype) with the uniform number u in [0, 1); -1 when the
    row holds NaN or +inf or no finite value. top_k 0, top_p 1.0, min_p 0.0 and penalty 1.0 mean no filter;
    seen (vocab,) bool: the ids the penalty applies to (read only when penalty != 1); w (vocab,) float64 scratch."""
    if penalty == 1.0:
        return _sample_scores(row, vocab, temperature, top_k, top_p, min_p, u, w)
    for v in range(vocab):                                              # sample_next's np.where(seen, ...)
        x = np.float64(row[v])
        w[v] = (x * penalty if x < 0 else x / penalty) if seen[v] else x
    return _sample_scores(w, vocab, temperature, top_k, top_p, min_p, u, w)   # in place: each w[v] read first


@njit(**_SAMPLE_JIT)
def _sample_scores(row, vocab, temperature, top_k, top_p, min_p, u, w):
    """sample_row after the penalty (row may be w itself). The penalty is a pass of its own: tested inside the
    loops below, it made a row of 50k float32 logits take 2.5x as long at temperature 1 and up to 14x greedy
    (~1 ms against ~55 us), with no penalty at all."""
    best, arg, finite = -math.inf, 0, False
    for v in range(vocab):
        x = row[v]
        if math.isnan(x) or x == math.inf:
            return -1
        if x > best:
            best, arg, finite = x, v, True
    if not finite:
        return -1
    if temperature == 0:
        return arg                                                      # np.argmax's: the first largest
    top = -math.inf                                                     # the largest (a top-k filter keeps it)
    for v in range(vocab):                                              # (vocab,) scaled, the largest first
        w[v] = (np.float64(row[v]) - np.float64(best)) / temperature     # subtracted (sample_next says why)
        top = max(top, w[v])
    if 0 < top_k < vocab:
        kth = _kth_largest(w, top_k)
        for v in range(vocab):
            if not w[v] >= kth:
                w[v] = -math.inf
    total = 0.0                                                         # np.cumsum(weights)[-1]
    for v in range(vocab):
        w[v] = 0.0 if w[v] == -math.inf else math.exp(w[v] - top)       # unnormalised probabilities
        total += w[v]
    if top_p < 1.0:
        _nucleus(w, top_p * total)
    if min_p > 0.0:                                                     # the largest weight is exp(0) = 1
        for v in range(vocab):
            if not w[v] >= min_p:
                w[v] = 0.0
    last = 0                                                            # the last token that can be drawn
    cdf = 0.0
    for v in range(vocab):
        if w[v] > 0:
            last = v
        cdf += w[v]
    target = u * cdf
    cdf = 0.0
    for v in range(vocab):                                              # the first token whose cdf passes target
        cdf += w[v]
        if cdf > target:
            return v
    return last                                                         # u rounded to the very top


@njit(**_SAMPLE_JIT)
def _kth_largest(w, k):
    """np.partition(w, len(w) - k)[len(w) - k]: the k largest values (repeats counted) kept in a sorted buffer,
    for a small k; one scan of w instead of a partition of a copy (0.4 ms for 50k logits). A large k partitions."""
    if k > 64:
        return np.partition(w, w.shape[0] - k)[w.shape[0] - k]
    buf = np.full(k, -math.inf)                                         # (k,) ascending; buf[0] the k-th largest
    for v in range(w.shape[0]):
        x = w[v]
        if x > buf[0]:
            j = 0
            while j + 1 < k and buf[j + 1] < x:
                buf[j] = buf[j + 1]
                j += 1
            buf[j] = x
    return buf[0]


@njit(**_SAMPLE_JIT)
def _nucleus(w, limit):
    """Zero every weight outside the nucleus: walking the tokens most likely first (ties by the higher index
    first: the reverse of a stable ascending sort, sample_next's order), a token stays while
    the weight before it is below limit (top_p times the total). Only the tokens of weight >= t are sorted (a
    prefix of that order), t lowered until the walk ends inside them: a full sort of 50k weights took 5 ms a row."""
    t = 0.25                                                            # of the largest weight, which is 1
    while True:
        n, enough = 0, 0.0
        for v in range(w.shape[0]):
            if w[v] >= t:
                n += 1
                enough += w[v]
        if enough >= limit or t == 0.0:                                 # (a guess: the walk decides)
            candidates = np.empty(n, np.int64)
            n = 0
            for v in range(w.shape[0]):
                if w[v] >= t:
                    candidates[n] = v
                    n += 1
            order = candidates[np.argsort(w[candidates], kind="mergesort")[::-1]]
            ahead, kept = 0.0, 0
            while kept < n and ahead < limit:
                ahead += w[order[kept]]
                kept += 1
            if kept < n or t == 0.0:                                    # the walk stopped inside: done
                keep = np.zeros(w.shape[0], np.bool_)
                for j in range(kept):
                    keep[order[j]] = True
                for v in range(w.shape[0]):
                    if not keep[v]:
                        w[v] = 0.0
                return
        t = t / 16.0 if t > 1e-30 else 0.0


@njit(**_SAMPLE_JIT)
def sample_rows(logits, vocab, temperature, top_k, top_p, min_p, penalty, seen, uniforms, ids):
    """ids (b,) = each row's sample_row with uniforms (b,) and seen (b, vocab) (or (b, 0) when penalty is 1);
    returns -1, or the first row that cannot be sampled (ids then partly written)."""
    w = np.empty(vocab, np.float64)
    for bi in range(logits.shape[0]):
        v = sample_row(logits[bi], vocab, temperature, top_k, top_p, min_p, penalty, seen[bi], uniforms[bi], w)
        if v < 0:
            return bi
        ids[bi] = v
    return -1
