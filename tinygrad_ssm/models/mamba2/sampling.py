"""Choosing the next token from logits: a repetition penalty, then greedy, or temperature, top-k, top-p (nucleus)
and min-p sampling, in NumPy: transformers' logits processors in their order."""
from __future__ import annotations

import math
import numbers

import numpy as np


class NonFiniteLogits(FloatingPointError):
    """The model produced NaN or +inf logits (or a row with no finite logit): there is nothing to sample from."""


class PenaltyOverflow(ValueError):
    """A repetition_penalty so near 0 that a seen token's logit divided by it passes float64's range: the
    setting's fault, not the model's."""


def check_sampling_args(temperature, top_k, top_p, min_p=None, repetition_penalty=None):
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) or not temperature >= 0:
        raise ValueError(f"generate: temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or top_k < 1):
        hint = " (None is no limit: mamba_ssm's and transformers' top_k=0)" if top_k == 0 else ""
        raise ValueError(f"generate: top_k must be None or an int >= 1, got {top_k!r}{hint}")
    if top_p is not None and (not isinstance(top_p, numbers.Real) or isinstance(top_p, bool) or not 0 < top_p <= 1):
        # mamba_ssm's top_p=0.0 (its default) is no filter, transformers' keeps the most likely token alone
        hint = (" (None is no filter, mamba_ssm's top_p=0.0; temperature=0 takes the most likely token, "
                "transformers' top_p=0)" if top_p == 0 else "")
        raise ValueError(f"generate: top_p must be None or in (0, 1], got {top_p!r}{hint}")
    if min_p is not None and (not isinstance(min_p, numbers.Real) or isinstance(min_p, bool) or not 0 <= min_p <= 1):
        raise ValueError(f"generate: min_p must be None or in [0, 1] (0 = no filter), got {min_p!r}")
    if repetition_penalty is not None and (not isinstance(repetition_penalty, numbers.Real)
                                           or isinstance(repetition_penalty, bool)
                                           or not 0 < repetition_penalty < math.inf):
        raise ValueError(f"generate: repetition_penalty must be None or a finite number > 0 (1 = none, > 1 makes "
                         f"repeats less likely), got {repetition_penalty!r}")


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                repetition_penalty: float | None = None, seen: np.ndarray | None = None) -> np.ndarray:
    """logits (b, V) -> token ids (b,) int64. repetition_penalty (None or 1: none) first, on the ids seen
    (b, V) bool marks (each row's prompt and generated ids): a positive logit divided by it, a negative one
    multiplied (transformers' RepetitionPenaltyLogitsProcessor, mamba_ssm's too), for greedy decoding as well.
    temperature 0 is greedy (argmax). top_k keeps the k most likely tokens; top_p keeps the smallest set of most
    likely tokens whose probability reaches top_p (the most likely token always stays; among tokens of equal
    probability the higher id is kept first: a stable ascending sort's order reversed. transformers' TopPLogitsWarper
    sorts with torch.sort, not stable: which of equally likely tokens at the nucleus' edge it keeps is unspecified,
    the probability kept the same);
    then min_p keeps the tokens at least min_p times as likely as the most likely one (transformers'
    MinPLogitsWarper; mamba_ssm's compares with the first token's logit instead). Sampling draws one uniform
    number per row from `rng` (rng.random((b, 1))); fast/sampling_kernels.py is the numba twin, given those
    numbers."""
    if repetition_penalty is not None and repetition_penalty != 1:      # float64, as the twin computes it
        logits = np.asarray(logits, dtype=np.float64)                   # (b, V)
        if seen is None or np.shape(seen) != logits.shape:             # np.where(None, ...) penalises nothing
            raise ValueError(f"sample_next: a repetition_penalty needs seen, a bool array of the logits' shape "
                             f"{logits.shape} marking the ids each row has seen; got "
                             f"{None if seen is None else np.shape(seen)}")
        with np.errstate(over="ignore"):
            penalised = np.where(logits < 0, logits * repetition_penalty, logits / repetition_penalty)
        overflowed = seen & np.isposinf(penalised) & np.isfinite(logits)  # a tiny penalty: x / 1e-310
        if overflowed.any():  # the model is fine: the penalty made the +inf (the numba twin stops there too)
            row, token = map(int, np.argwhere(overflowed)[0])
            raise PenaltyOverflow(f"generate: repetition_penalty {repetition_penalty!r} divides the logit "
                                  f"{float(logits[row, token])!r} of token {token} (batch row {row}) past float64's range; "
                                  f"give a penalty nearer 1 (1 = none, < 1 makes repeats more likely)")
        emptied = ~np.isfinite(np.where(seen, penalised, logits)).any(axis=-1) & np.isfinite(logits).any(axis=-1)
        if emptied.any():  # a huge penalty times every finite logit (all seen, all < 0): -inf, not the model's fault
            row = int(np.argmax(emptied))
            raise PenaltyOverflow(f"generate: repetition_penalty {repetition_penalty!r} multiplies every finite "
                                  f"logit of batch row {row} (each of a token seen, each < 0) past float64's range, "
                                  f"so no token is left to sample; give a penalty nearer 1 (1 = none)")
        logits = np.where(seen, penalised, logits)                      # NaN and +inf stay what they were
    if temperature == 0:
        ids = np.argmax(logits, axis=-1)                                # (b,) a NaN counts as the largest
        if np.isfinite(np.max(logits, axis=-1)).all():               # max is NaN with a NaN, +inf with a +inf
            return ids.astype(np.int64)                                 # and -inf with no finite value
    logits = np.asarray(logits, dtype=np.float64)                       # (b, V)
    # NaN compares false everywhere: argmax and the cdf below would quietly return token 0 forever
    bad_rows = np.isnan(logits).any(axis=-1) | np.isposinf(logits).any(axis=-1) | ~np.isfinite(logits).any(axis=-1)
    if bad_rows.any():
        row = int(np.argmax(bad_rows))
        what = ("NaN" if np.isnan(logits[row]).any() else "+inf" if np.isposinf(logits[row]).any()
                else "no finite value")
        raise NonFiniteLogits(f"the logits of batch row {row} hold {what}; the model's weights or input are "
                              f"not finite, so there is nothing to sample from")
    if temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    # the largest logit subtracted before the division: logits / 1e-310 overflowed to inf, inf - inf made every
    # weight NaN, and the draw returned token 0; this way a tiny temperature tends to the argmax, as it should
    with np.errstate(over="ignore"):                                    # to -inf: weight 0, as meant
        logits = (logits - logits.max(axis=-1, keepdims=True)) / temperature  # (b, V) <= 0, the largest 0
    if top_k is not None and top_k < logits.shape[-1]:
        kth = np.partition(logits, -top_k, axis=-1)[:, -top_k][:, None]  # (b, 1) the k-th largest
        logits = np.where(logits >= kth, logits, -np.inf)
    # unnormalised probabilities, summed one token after the other (np.cumsum) and never divided: the numba
    # twin (fast/sampling_kernels.py) repeats these steps in this order and gets the same bits
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))      # (b, V)
    if top_p is not None and top_p < 1:
        # most likely first, ties by the higher id: the reverse of a stable ascending sort
        order = np.argsort(weights, axis=-1, kind="stable")[:, ::-1]     # (b, V)
        sorted_weights = np.take_along_axis(weights, order, axis=-1)
        running = np.cumsum(sorted_weights, axis=-1)                     # (b, V)
        ahead = np.concatenate([np.zeros_like(running[:, :1]), running[:, :-1]], axis=-1)  # the tokens before
        total = np.cumsum(weights, axis=-1)[:, -1:]                      # (b, 1) summed in the tokens' order
        keep_sorted = ahead < top_p * total                             # the first token always: ahead = 0
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        weights = np.where(keep, weights, 0.0)
    if min_p:                                                           # the largest weight is exp(0) = 1
        weights = np.where(weights >= min_p, weights, 0.0)
    cdf = np.cumsum(weights, axis=-1)                                   # (b, V)
    u = rng.random((weights.shape[0], 1)) * cdf[:, -1:]                 # (b, 1)
    ids = (cdf <= u).sum(axis=-1)                                       # the first index whose cdf passes u
    # that token has probability > 0; only if rounding put u at the very top is it past the end: then
    # take the last token with probability > 0 (never a filtered one)
    last_possible = weights.shape[-1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=-1)
    return np.where(ids < weights.shape[-1], ids, last_possible).astype(np.int64)
