"""Two kernel backends of the scan (by default numba against blas), interleaved in one process, forward then
backward on plain arrays, at the training step's shape (b=8, l=512, h=8, p=64, g=1, n=64, chunk 64) and at
bench_ssd.py's (b=2, l=4096, chunk 256), float32.

    python benchmarks/bench_ssd_backends.py                    # numba vs blas at both shapes
    python benchmarks/bench_ssd_backends.py --quick            # a smoke run: small shapes, 2 repeats
    python benchmarks/bench_ssd_backends.py --blas-threads 1   # the blas backend on one Python thread
    python benchmarks/bench_ssd_backends.py --step             # also whole training steps, one model per backend

Each repeat runs A then B (B then A on odd repeats) on the same arrays: forward, then backward of (dy, d final
state). Reported per shape: the median seconds of each part of each backend, and the median over repeats of
B / A, in wall time and in process CPU time (all threads); the backends' outputs and gradients are compared
once (max relative difference). With --step, also the training step of profile_step.py's model (d_model 256,
4 layers, b=8 x 512, chunk 64, fused ops, AdamW), one model per backend from the same weights, steps alternating
A, B (B, A on odd repeats): the median step of each and the median of B / A. Writes JSON to --json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import tinygrad_ssm  # noqa: F401, I001  (first: OpenBLAS's threads sleep after a matmul, see tinygrad_ssm/fast/blas_threads.py)
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tinygrad_ssm.scan import BACKENDS, blas_chunked                             # noqa: E402
from bench_ssd_ab import compare, make_inputs                                      # noqa: E402

SHAPES = {"training step": (dict(b=8, l=512, h=8, p=64, g=1, n=64), 64),
          "bench_ssd": (dict(b=2, l=4096, h=8, p=64, g=1, n=64), 256)}
QUICK = {"quick": (dict(b=2, l=128, h=4, p=16, g=1, n=16), 32)}


def run(record, v, chunk):
    y, state, saved = record.forward(v["x"], v["dt"], v["A"], v["B"], v["C"], v["D"], None, chunk)
    return [y, state, *record.backward(saved, v["dy"], v["d_final"])[:6]]


def compare_steps(a: str, b: str, repeats: int, quick: bool) -> dict:
    """Median seconds of a training step with backend a and with b, steps interleaved, and the median ratio b / a."""
    from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
    from tinygrad_ssm.optim import AdamW
    batch, seqlen = (2, 64) if quick else (8, 512)
    config = Mamba2Config(d_model=256, n_layer=4, vocab_size=256, d_state=64, headdim=64, expand=2, chunk_size=64)
    data = np.random.default_rng(0).integers(0, 256, (batch, seqlen + 1))
    steps = []
    for backend in (a, b):
        model = Mamba2LMHeadModel(config, VarMap(seed=0), backend=backend)
        opt = AdamW(model.varmap.all_vars(), lr=1e-3)

        def step(model=model, opt=opt):
            opt.zero_grad()
            model.loss(data[:, :-1], data[:, 1:]).backward()
            opt.step()
        step()                                                          # warm-up
        steps.append(step)
    times = np.zeros((repeats, 2))
    for r in range(repeats):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            steps[which]()
            times[r, which] = time.perf_counter() - t0
    return dict(batch=batch, seqlen=seqlen, a_median_s=float(np.median(times[:, 0])),
                b_median_s=float(np.median(times[:, 1])), ratio=float(np.median(times[:, 1] / times[:, 0])),
                a_s=times[:, 0].tolist(), b_s=times[:, 1].tolist())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", default="numba", help="backend A [%(default)s]")
    parser.add_argument("--b", default="blas", help="backend B [%(default)s]")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--blas-threads", type=int, default=None, help="blas_chunked.THREADS [its default]")
    parser.add_argument("--quick", action="store_true", help="smoke run: a small shape, 2 repeats")
    parser.add_argument("--step", action="store_true", help="also time whole training steps with each backend")
    parser.add_argument("--json", default="benchmarks/results/bench_ssd_backends.json",
                        help="where to write [%(default)s]")
    args = parser.parse_args(argv)
    if args.blas_threads is not None:
        blas_chunked.THREADS = args.blas_threads
    records = [BACKENDS[args.a], BACKENDS[args.b]]
    shapes, repeats = (QUICK, 2) if args.quick else (SHAPES, args.repeats)
    results = dict(a=args.a, b=args.b, blas_threads=blas_chunked.THREADS, dtype="float32", repeats=repeats, runs=[])
    print(f"{args.a} (A) against {args.b} (B), float32, forward then backward on arrays, median of {repeats}, "
          f"blas on {blas_chunked.THREADS} Python thread(s)")
    print("| shape (b, l, h, p, g, n) | chunk | part | A wall ms | B wall ms | B/A wall | A cpu ms | B cpu ms "
          "| B/A cpu |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, (shape, chunk) in shapes.items():
        v = make_inputs(**shape)
        outs = [run(record, v, chunk) for record in records]              # compiles numba, and checks agreement
        agree = max(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)) for a, b in zip(*outs))
        t = compare(records, v, chunk, repeats)
        parts = {"forward": t[:, :, 0], "backward": t[:, :, 1], "forward+backward": t.sum(2)}
        for part, pt in parts.items():                                  # pt[repeat, backend, (cpu, wall)]
            row = dict(label=label, shape=shape, chunk=chunk, part=part, max_relative_difference=agree)
            for k, clock in enumerate(("cpu", "wall")):
                row[f"a_{clock}_s"] = float(np.median(pt[:, 0, k]))
                row[f"b_{clock}_s"] = float(np.median(pt[:, 1, k]))
                row[f"ratio_{clock}"] = float(np.median(pt[:, 1, k] / pt[:, 0, k]))
            results["runs"].append(row)
            print(f"| {tuple(shape.values())} | {chunk} | {part} | {row['a_wall_s']*1e3:.1f} | "
                  f"{row['b_wall_s']*1e3:.1f} "
                  f"| {row['ratio_wall']:.3f} | {row['a_cpu_s']*1e3:.1f} | {row['b_cpu_s']*1e3:.1f} | "
                  f"{row['ratio_cpu']:.3f} |")
        print(f"  ({label}: outputs and gradients agree to {agree:.1e}, relative)")
    if args.step:
        step = compare_steps(args.a, args.b, repeats, args.quick)
        results["training_step"] = step
        print(f"training step (b={step['batch']} x {step['seqlen']}, d_model 256, 4 layers, chunk 64), median of "
              f"{repeats} interleaved: {args.a} {step['a_median_s']:.3f} s, {args.b} {step['b_median_s']:.3f} s, "
              f"{args.b} / {args.a} = {step['ratio']:.3f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
