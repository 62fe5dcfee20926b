"""Two backends of the scan in this tree (by default the numba kernels against the engine-op reference),
interleaved in one process, forward then backward, at the training step's shape (b=8, l=512, h=8, p=64, g=1,
n=64, chunk 64) and at bench_ssd.py's (b=2, l=4096, chunk 256), float32.

    python benchmarks/dev/bench_ssd_backends.py                          # numba_chunked vs reference
    python benchmarks/dev/bench_ssd_backends.py --quick                  # a smoke run: a small shape, 2 repeats
    python benchmarks/dev/bench_ssd_backends.py --a numba_chunked --b cuda   # on a machine with a GPU
    python benchmarks/dev/bench_ssd_backends.py --step                   # also whole training steps

A kernel backend (forward and backward on arrays) runs on plain arrays, no engine; an engine-op backend runs
its ops on Tensors and autograd's backward of sum(y * dy) + sum(final_state * d_final). Each repeat runs A then
B (B then A on odd repeats) on the same arrays: forward, then backward of (dy, d final state). Reported per
shape: the median seconds of each part of each backend, and the median over repeats of B / A, in wall time and
in process CPU time (all threads); the backends' outputs and gradients are compared once (max relative
difference). With --step, also the training step of profile_step.py's model (d_model 256, 4 layers, b=8 x 512,
chunk 64, fused ops, AdamW), one model per backend from the same weights, steps alternating A, B (B, A on odd
repeats): the median step of each and the median of B / A. Writes JSON to --json.
To time this tree's scan against another git revision's, use ab.py --what ssd.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))                                                      # run from a clone too
sys.path.insert(0, str(ROOT / "benchmarks"))                                      # the private helpers
from _common import positive_int
import tinygrad_ssm as tg  # noqa: E402
import numpy as np                                                                 # noqa: E402

from tinygrad_ssm.scan import BACKENDS, available_backends                         # noqa: E402

SHAPES = {"training step": (dict(b=8, l=512, h=8, p=64, g=1, n=64), 64),
          "bench_ssd": (dict(b=2, l=4096, h=8, p=64, g=1, n=64), 256)}
QUICK = {"quick": (dict(b=2, l=128, h=4, p=16, g=1, n=16), 32)}


def make_inputs(b, l, h, p, g, n, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(x=rng.standard_normal((b, l, h, p)).astype(f), dt=rng.uniform(0.001, 0.1, (b, l, h)).astype(f),
                A=-rng.uniform(0.5, 2.0, h).astype(f), B=rng.standard_normal((b, l, g, n)).astype(f),
                C=rng.standard_normal((b, l, g, n)).astype(f), D=rng.standard_normal(h).astype(f),
                dy=rng.standard_normal((b, l, h, p)).astype(f), d_final=rng.standard_normal((b, h, p, n)).astype(f))


class EngineOps:
    """An engine-op backend behind the kernel interface: forward (arrays) -> (y, final_state, saved), backward
    (saved, dy, d_final) -> the input gradients, through autograd."""

    def __init__(self, record):
        self.record = record

    def forward(self, x, dt, A, B, C, D, initial_state, chunk):
        tensors = [tg.Tensor(v, requires_grad=True) for v in (x, dt, A, B, C, D)]
        y, state = self.record.ops(*tensors, None, chunk)
        return y.data, state.data, (tensors, y, state)

    def backward(self, saved, dy, d_final):
        tensors, y, state = saved
        ((y * dy).sum() + (state * d_final).sum()).backward()
        return [t.grad.data for t in tensors]


def side(name: str):
    record = BACKENDS[name]
    if not record.available():
        raise SystemExit(f"backend {name!r} is not available here; available: {available_backends()}")
    return EngineOps(record) if record.ops is not None else record


def run(backend, v, chunk):
    y, state, saved = backend.forward(v["x"], v["dt"], v["A"], v["B"], v["C"], v["D"], None, chunk)
    return [y, state, *backend.backward(saved, v["dy"], v["d_final"])[:6]]


def compare(pair, v, chunk, repeats):
    """times[repeat, which of pair, (forward, backward), (cpu, wall)] in seconds, the two interleaved."""
    times = np.zeros((repeats, 2, 2, 2))
    for r in range(repeats):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            backend = pair[which]
            c0, w0 = time.process_time(), time.perf_counter()
            y, state, saved = backend.forward(v["x"], v["dt"], v["A"], v["B"], v["C"], v["D"], None, chunk)
            c1, w1 = time.process_time(), time.perf_counter()
            backend.backward(saved, v["dy"], v["d_final"])
            c2, w2 = time.process_time(), time.perf_counter()
            times[r, which] = [[c1 - c0, w1 - w0], [c2 - c1, w2 - w1]]
    return times


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
    parser.add_argument("--a", default="numba_chunked", help="backend A [%(default)s]")
    parser.add_argument("--b", default="reference", help="backend B [%(default)s]")
    parser.add_argument("--repeats", type=positive_int, default=9)
    parser.add_argument("--quick", action="store_true", help="smoke run: a small shape, 2 repeats")
    parser.add_argument("--step", action="store_true", help="also time whole training steps with each backend")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "bench_ssd_backends.json"),
                        help="where to write [%(default)s]")
    args = parser.parse_args(argv)
    backends = [side(args.a), side(args.b)]
    shapes, repeats = (QUICK, 2) if args.quick else (SHAPES, args.repeats)
    results = dict(a=args.a, b=args.b, dtype="float32", repeats=repeats, runs=[])
    print(f"{args.a} (A) against {args.b} (B), float32, forward then backward, median of {repeats}")
    print("| shape (b, l, h, p, g, n) | chunk | part | A wall ms | B wall ms | B/A wall | A cpu ms | B cpu ms "
          "| B/A cpu |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, (shape, chunk) in shapes.items():
        v = make_inputs(**shape)
        outs = [run(backend, v, chunk) for backend in backends]         # compiles numba, and checks agreement
        agree = max(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)) for a, b in zip(*outs))
        t = compare(backends, v, chunk, repeats)
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
