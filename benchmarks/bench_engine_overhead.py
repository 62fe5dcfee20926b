"""Engine overhead: the time of one op on small tensors, where the arithmetic is nothing and the Python around
it is everything, beside PyTorch eager on the CPU (report only: no target).

    python benchmarks/bench_engine_overhead.py [--quick] [--json PATH]

For each op: forward alone (no graph recorded) and forward + backward of its sum (graph built and walked),
in microseconds per call, float32, inputs of shape (16, 16).
"""
from __future__ import annotations

import argparse
import time

import _common  # noqa: F401, I001  (first: puts this clone on sys.path before the installed package)
import tinygrad_ssm  # noqa: F401
import numpy as np

from _common import json_help, result_path, write_result

import tinygrad_ssm as tg  # noqa: E402  (_common puts the repository on the path)
from tinygrad_ssm.autograd import functional as F  # noqa: E402

SHAPE = (16, 16)
OPS = {  # name -> (ours, torch's), each taking (a, b)
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "exp": (lambda a, b: a.exp(), lambda a, b: a.exp()),
    "tanh": (lambda a, b: a.tanh(), lambda a, b: a.tanh()),
    "sigmoid": (lambda a, b: a.sigmoid(), lambda a, b: a.sigmoid()),
    "sum(axis=-1)": (lambda a, b: a.sum(axis=-1), lambda a, b: a.sum(dim=-1)),
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b),
    "reshape": (lambda a, b: a.reshape(256), lambda a, b: a.reshape(256)),
    "getitem a[2:10]": (lambda a, b: a[2:10], lambda a, b: a[2:10]),
    "softmax": (lambda a, b: F.softmax(a, -1), lambda a, b: a.softmax(-1)),
}


def per_call(fn, calls: int) -> float:
    """Microseconds per call, the best of 3 runs of `calls` calls (the least disturbed by the machine)."""
    best = float("inf")
    fn()
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    parser.add_argument("--json", default=None, help=json_help("bench_engine_overhead"))
    args = parser.parse_args(argv)
    calls = 200 if args.quick else 2000
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    a_np, b_np = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
    rows, per_op = [], {}
    for name, (ours, theirs) in OPS.items():
        a, b = tg.Tensor(a_np), tg.Tensor(b_np)
        ga, gb = tg.Tensor(a_np, requires_grad=True), tg.Tensor(b_np, requires_grad=True)
        fwd = per_call(lambda: ours(a, b), calls)
        bwd = per_call(lambda: ours(ga, gb).sum().backward(), calls // 4)
        row = {"op": name, "ours_forward_us": fwd, "ours_fwd_bwd_us": bwd}
        if torch is not None:
            ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
            tga, tgb = ta.clone().requires_grad_(), tb.clone().requires_grad_()
            row["torch_forward_us"] = per_call(lambda: theirs(ta, tb), calls)
            row["torch_fwd_bwd_us"] = per_call(lambda: theirs(tga, tgb).sum().backward(), calls // 4)
        per_op[name] = row
        rows.append([name, fwd, row.get("torch_forward_us", "-"),
                     fwd / row["torch_forward_us"] if torch is not None else "-",
                     bwd, row.get("torch_fwd_bwd_us", "-"),
                     bwd / row["torch_fwd_bwd_us"] if torch is not None else "-"])
    write_result(result_path(args.json, "bench_engine_overhead", args.quick), "bench_engine_overhead",
                 f"Engine overhead per op, float32 {SHAPE}, microseconds per call (best of 3 x {calls})",
                 ["op", "ours fwd", "torch fwd", "ratio", "ours fwd+bwd", "torch fwd+bwd", "ratio"], rows,
                 notes=["ratio = ours / torch: above 1 we are slower. On tensors this small both sides measure "
                        "their Python and dispatch overhead, not arithmetic.",
                        "torch runs with 1 thread (set_num_threads(1)); NumPy's small ops are single-threaded."
                        if torch is not None else "torch is not installed (pip install -e '.[bench]'): ours only"],
                 per_op=per_op)


if __name__ == "__main__":
    main()
