"""NumPy's protocols on a Tensor against the same work on its ndarray: np.asarray(t), np.exp(t) (an engine
op through __array_ufunc__), the mask ids[ids == 0], np.sum(t), iterating the rows of a matrix.

    python benchmarks/dev/numpy_protocols.py              # 200,000 elements
    python benchmarks/dev/numpy_protocols.py --size 1000000 --json

Before Tensor had __array__ and __array_ufunc__, np.asarray(t) and np.exp(t) built an object array of 0-d
tensors, one per element (1.2 s and 3.4 s for 200,000 elements, measured on 2 busy cores); now each is one
array operation. Times are the best of --repeats runs (time.perf_counter).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the private helpers
from _common import positive_int

from tinygrad_ssm import Tensor


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=positive_int, default=200_000)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.size)                      # (size,) float64
    ids = rng.integers(0, 4, args.size)                     # (size,) int64
    rows = x.reshape(-1, 100) if args.size % 100 == 0 else x[None, :]
    t, t_ids, t_rows = Tensor(x), Tensor(ids), Tensor(rows)
    cases = {  # name: (on the Tensor, the same on the ndarray)
        "np.asarray(t)": (lambda: np.asarray(t), lambda: np.asarray(x)),
        "np.exp(t)": (lambda: np.exp(t), lambda: np.exp(x)),
        "ids[ids == 0]": (lambda: t_ids[t_ids == 0], lambda: ids[ids == 0]),
        "np.sum(t)": (lambda: np.sum(t), lambda: np.sum(x)),
        "list(t) (rows)": (lambda: list(t_rows), lambda: list(rows)),
    }
    result = {"size": args.size, "repeats": args.repeats, "cases": {}}
    for name, (on_tensor, on_array) in cases.items():
        tensor_s, array_s = best(on_tensor, args.repeats), best(on_array, args.repeats)
        result["cases"][name] = {"tensor_s": tensor_s, "ndarray_s": array_s,
                                 "ratio": tensor_s / array_s if array_s else None}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.size:,} float64 elements, best of {args.repeats}")
        print(f"  {'':18} {'Tensor':>12} {'ndarray':>12} {'ratio':>8}")
        for name, c in result["cases"].items():
            print(f"  {name:18} {c['tensor_s'] * 1e6:10.1f}us {c['ndarray_s'] * 1e6:10.1f}us {c['ratio']:8.1f}")
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
