"""Sampling the next token inside numba: temperature, top-k and top-p over the first `vocab` logits of each row,
one uniform number per row. The twin of models/mamba2/sampling.py's `sample_next` (NumPy, the spec), step by
step in its order: the sums run one token after the other as np.cumsum's do, so no fastmath here (reassociated
sums would give other bits). The exp is libm's, NumPy's may differ from it in the last bit; the ids differ only
if a uniform number lands within that rounding of a boundary (tests/fast/test_sampling_kernels.py).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

_SAMPLE_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(**_SAMPLE_JIT)
def sample_row(row, vocab, temperature, top_k, top_p, u, w):
    """The id drawn from row[:vocab] (logits of any float dtype) with the uniform number u in [0, 1); -1 when the
    row holds NaN or +inf or no finite value. top_k 0 and top_p 1.0 mean no filter; w (vocab,) float64 scratch."""
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
    for v in range(vocab):
        w[v] = np.float64(row[v]) / temperature                          # (vocab,) scaled logits
    if 0 < top_k < vocab:
        kth = np.partition(w, vocab - top_k)[vocab - top_k]             # the k-th largest
        for v in range(vocab):
            if not w[v] >= kth:
                w[v] = -math.inf
    top = -math.inf
    for v in range(vocab):
        top = max(top, w[v])
    for v in range(vocab):
        w[v] = math.exp(w[v] - top)                                      # unnormalised probabilities
    if top_p < 1.0:
        order = np.argsort(-w, kind="mergesort")                       # most likely first, ties by index
        total = 0.0
        for v in range(vocab):
            total += w[order[v]]
        ahead = 0.0                                                     # the weight of the tokens before
        for v in range(vocab):
            weight = w[order[v]]
            if not ahead < top_p * total:
                w[order[v]] = 0.0
            ahead += weight
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
def sample_rows(logits, vocab, temperature, top_k, top_p, uniforms, ids):
    """ids (b,) = each row's sample_row with uniforms (b,); returns -1, or the first row that cannot be sampled
    (ids then partly written)."""
    w = np.empty(vocab, np.float64)
    for bi in range(logits.shape[0]):
        v = sample_row(logits[bi], vocab, temperature, top_k, top_p, uniforms[bi], w)
        if v < 0:
            return bi
        ids[bi] = v
    return -1
