"""Whether arrays are fit to be saved as weights or optimizer state: what a checkpoint (train/checkpoint.py) and
`save_pretrained` check before they write, so that nothing saved is called good with a NaN in it."""
from __future__ import annotations

import numpy as np


def non_finite_problems(tensors) -> list[str]:
    """One sentence per (name, array) of weights or optimizer state that is not fit to save or resume from:
    a NaN or inf anywhere, or a negative value in a second moment (exp_avg_sq, a mean of squares)."""
    bad = []
    for name, a in tensors:
        a = np.asarray(a if isinstance(a, (np.ndarray, np.generic, int, float)) else a.data)  # a Tensor: its array
        if a.dtype.kind in "fc":
            n = count_non_finite(a)
            if n:
                bad.append(f"tensor {name!r} holds {n} non-finite value(s) (NaN or inf) of {a.size}")
                continue
        if name.endswith("exp_avg_sq") and a.dtype.kind in "fi":
            n = int(np.count_nonzero(a < 0))
            if n:
                bad.append(f"tensor {name!r} holds {n} negative value(s) of {a.size} (a second moment is a mean "
                           f"of squares, never negative)")
    return bad


BLOCK = 1 << 20  # elements checked at a time: a mask of the whole array would add a quarter of a float32 one


def count_non_finite(a: np.ndarray) -> int:
    """How many of a float array's values are NaN or inf, counted a block at a time (loading checks every weight
    with it, in its one-copy memory budget)."""
    flat = a.reshape(-1) if a.flags.c_contiguous else a.ravel(order="K")
    return sum(int(block.size - np.count_nonzero(np.isfinite(block)))
               for block in (flat[i:i + BLOCK] for i in range(0, flat.size, BLOCK)))
