"""Time and peak memory of one forward+backward (loss.backward()) of the small default Mamba-2 LM.

    python benchmarks/dev/model_step.py                         # b=1, l=1024, reference backend, float32
    python benchmarks/dev/model_step.py --batch 8 --seqlen 512  # one training step of the CLI's default run

Times are the best of --repeats runs (wall clock, time.perf_counter). Peak memory is measured in a separate
run under tracemalloc (NumPy reports its array allocations to it), so tracing does not slow the timed runs;
ru_maxrss (the process's peak resident set, including Python and the libraries) is printed too.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the private helpers
from _common import positive_int  # noqa: I001  (and the clone on the path)
import tinygrad_ssm  # noqa: F401
import numpy as np

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap


def build(args) -> Mamba2LMHeadModel:
    config = Mamba2Config(d_model=args.d_model, n_layer=args.n_layer, vocab_size=256, d_state=args.d_state,
                          headdim=args.headdim, expand=2, chunk_size=args.chunk_size)
    return Mamba2LMHeadModel(config, VarMap(seed=0), dtype=args.dtype, backend=args.backend)


def step(model, ids, targets):
    for t in model.varmap.all_vars():
        t.grad = None
    t0 = time.perf_counter()
    loss = model.loss(ids, targets)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    if not np.isfinite(loss.item()):
        raise RuntimeError(f"loss is {loss.item()}")
    return t1 - t0, t2 - t1


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--seqlen", type=positive_int, default=1024)
    p.add_argument("--chunk-size", type=positive_int, default=64)
    p.add_argument("--d-model", type=positive_int, default=256)
    p.add_argument("--n-layer", type=positive_int, default=4)
    p.add_argument("--d-state", type=positive_int, default=64)
    p.add_argument("--headdim", type=positive_int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backend", default="reference")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = p.parse_args(argv)

    model = build(args)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (args.batch, args.seqlen))
    targets = rng.integers(0, 256, (args.batch, args.seqlen))
    step(model, ids, targets)                                           # warm up (allocator, BLAS threads)
    times = [step(model, ids, targets) for _ in range(args.repeats)]
    forward, backward = min(t[0] for t in times), min(t[1] for t in times)
    total = min(f + b for f, b in times)

    tracemalloc.start()
    step(model, ids, targets)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB on Linux

    result = {"batch": args.batch, "seqlen": args.seqlen, "chunk_size": args.chunk_size, "dtype": args.dtype,
              "backend": args.backend, "parameters": model.varmap.num_parameters(),
              "forward_s": round(forward, 4), "backward_s": round(backward, 4), "step_s": round(total, 4),
              "tokens_per_s": round(args.batch * args.seqlen / total, 1),
              "peak_traced_mib": round(peak / 2**20, 1), "max_rss_mib": round(maxrss_kb / 1024, 1)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"Mamba-2 LM ({result['parameters']:,} parameters), b={args.batch} l={args.seqlen} "
              f"chunk={args.chunk_size} {args.dtype} backend={args.backend}")
        print(f"  forward {forward:.3f} s + backward {backward:.3f} s = {total:.3f} s per step "
              f"({result['tokens_per_s']:.0f} tokens/s; best of {args.repeats})")
        print(f"  peak memory: {result['peak_traced_mib']} MiB traced (tracemalloc), "
              f"{result['max_rss_mib']} MiB max RSS")
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
