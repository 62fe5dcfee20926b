"""The training step's plain NumPy parts that have numba kernels, timed inside real training steps: AdamW's update
(fast/adam_kernel.py), the embedding's backward and cross entropy forward and backward (fast/row_ops.py), each
against its reference, chosen explicitly per step: `AdamW(..., fused=False)` against `fused=True`, the engine's
`tinygrad_ssm.autograd.functional.cross_entropy` against `tinygrad_ssm.fast.row_ops.cross_entropy`, and the
embedding layer's engine op against its numba twin (its `fused` flag); the residual adds, which have no kernel
(memory-bound: a + b over both threads measured no faster), as a check on noise. Steps alternate between the two
in one process (each first in turn), so a shared machine's drifting load falls on both alike; each part's figure
is the median over the quiet rounds of its milliseconds per step.

    python benchmarks/bench_step_parts.py [--rounds 15] [--batch 8] [--seqlen 512] [--json PATH]

The model is profile_step.py's (d_model 256, 4 layers, d_state 64, headdim 64, vocab 256, float32, fused ops).
The two optimizers update the same parameters, each with its own moments (what is timed is the update's work).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

from _common import threads_from_argv

threads_from_argv()

import numpy as np  # noqa: E402

from _common import default_json, positive_int, write_result  # noqa: E402

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap  # noqa: E402
from tinygrad_ssm.autograd import functional as F  # noqa: E402
from tinygrad_ssm.autograd.ops import elementwise, nn, reduce  # noqa: E402
from tinygrad_ssm.fast import row_ops  # noqa: E402
from tinygrad_ssm.optim import Adam, AdamW  # noqa: E402

QUIET = 1.3                                                              # see the end of main
# part -> the methods timed for it: the engine op's and its numba twin's (a twin that falls back to the engine
# op's code calls it from inside: only the outer call counts)
TIMED = {"AdamW update (all parameters)": [(Adam, "_update")],
         "Embedding backward": [(nn.Embedding, "backward"), (row_ops.FusedEmbedding, "backward")],
         "CrossEntropy forward": [(reduce.CrossEntropy, "forward")],
         "CrossEntropy backward": [(reduce.CrossEntropy, "backward"), (row_ops.FusedCrossEntropy, "backward")],
         "Add forward (residual, no kernel)": [(elementwise.Add, "forward")]}
CROSS_ENTROPY = {"reference": F.cross_entropy, "kernels": row_ops.cross_entropy}


def timed(seconds: dict, depth: dict, part: str, method):
    def run(*args, **kwargs):
        depth[part] += 1
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            depth[part] -= 1
            if not depth[part]:
                seconds[part] += time.perf_counter() - start
    return run


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=positive_int, default=15)
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--seqlen", type=positive_int, default=512)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="threads for every pool (read before NumPy loads)")
    p.add_argument("--json", default=default_json("bench_step_parts"))
    args = p.parse_args(argv)
    seconds, depth = collections.defaultdict(float), collections.defaultdict(int)
    for part, methods in TIMED.items():
        for cls, name in methods:
            if name in cls.__dict__:                                     # its own method, not an inherited one
                setattr(cls, name, timed(seconds, depth, part, cls.__dict__[name]))
    config = Mamba2Config(d_model=256, n_layer=4, vocab_size=256, d_state=64, headdim=64, expand=2, chunk_size=64)
    model = Mamba2LMHeadModel(config, VarMap(seed=0))
    opts = {"reference": AdamW(model.varmap.all_vars(), lr=1e-3, fused=False),
            "kernels": AdamW(model.varmap.all_vars(), lr=1e-3, fused=True)}
    data = np.random.default_rng(0).integers(0, 256, (args.batch, args.seqlen + 1))
    variants = ("reference", "kernels")
    per_step = {k: collections.defaultdict(list) for k in variants}

    def step(variant: str):
        opt = opts[variant]
        model.embedding.fused = variant == "kernels"                    # the layer's engine op or its numba twin
        seconds.clear()
        start = time.perf_counter()
        opt.zero_grad()
        CROSS_ENTROPY[variant](model(data[:, :-1]), data[:, 1:]).backward()
        opt.step()
        return time.perf_counter() - start

    for variant in variants:                                             # warm-up: compilation, first touches
        step(variant)
    for r in range(args.rounds):
        for variant in variants[r % 2:] + variants[:r % 2]:               # each variant first in turn
            total = step(variant)
            for part in TIMED:
                per_step[variant][part].append(seconds[part])
            per_step[variant]["training step"].append(total)
    # A shared machine's load comes in phases (steps 2-3x slower for a while): the figures are medians over the
    # quiet rounds, those whose slowest step is within QUIET of the fastest step seen.
    fastest = min(min(per_step[k]["training step"]) for k in variants)
    quiet = [r for r in range(args.rounds) if max(per_step[k]["training step"][r] for k in variants) <= QUIET * fastest]
    rounds = quiet or list(range(args.rounds))
    rows = []
    for part in (*TIMED, "training step"):
        ref, new = (1e3 * statistics.median(per_step[k][part][r] for r in rounds) for k in variants)
        rows.append([part, round(ref, 3), round(new, 3), round(ref / new, 2) if new else float("nan")])
    return write_result(args.json, "bench_step_parts",
                        f"Step parts, reference NumPy vs numba kernels, in training steps (b={args.batch} "
                        f"l={args.seqlen}), ms per step, median of {len(rounds)} quiet rounds of {args.rounds}",
                        ["part", "reference ms", "kernels ms", "speed-up"], rows,
                        notes=[f"quiet rounds: every step within {QUIET}x the fastest step"
                               + ("" if quiet else " (none was: all rounds)")],
                        quiet_rounds=quiet, raw={k: dict(v) for k, v in per_step.items()})


if __name__ == "__main__":
    main()
