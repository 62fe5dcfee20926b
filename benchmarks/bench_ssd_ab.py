"""The numba scan kernels of this tree against those of another git revision, interleaved in one process, at the
training step's shape (b=8, l=512, h=8, p=64, g=1, n=64, float32, chunk 64).

    python benchmarks/bench_ssd_ab.py --old-rev 7d9c51f            # before the four-row passes
    python benchmarks/bench_ssd_ab.py --old-rev 7d9c51f --quick    # a smoke run
    python benchmarks/bench_ssd_ab.py --old-rev c49dc08 --step     # whole training steps with either scan

The other revision's `tinygrad_ssm/scan/numba_cpu.py` is read with `git show` into a temporary directory and
imported beside this tree's. Each repeat runs old then new (new then old on odd repeats) on the same arrays:
forward, then backward of dy. Reported per thread count (1, then numba's default): the median seconds of each,
and the median over repeats of new / old, in process CPU time (what the kernels cost; less disturbed by other
jobs on a shared machine) and in wall time. With --step [bench|default] it times whole training steps instead (bench_step_ab.py's
shapes), the model's scan switched between the two revisions' kernels in one process every --steps + 1 steps
(the first step after a switch untimed), the order alternating by round: what the kernels change in a step,
with the process, its heap and the rest of the code the same on both sides. Writes JSON to --json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tinygrad_ssm  # noqa: F401, I001  (first: OpenBLAS's threads sleep after a matmul, see tinygrad_ssm/fast/blas_threads.py)
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import numba                                                                        # noqa: E402
from tinygrad_ssm.scan import numba_cpu as new                                   # noqa: E402

TRAINING = dict(b=8, l=512, h=8, p=64, g=1, n=64)


def load_revision(rev: str, folder: Path):
    """The module numba_cpu.py as it is at git revision `rev`, imported from `folder` as numba_cpu_<rev>."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:tinygrad_ssm/scan/numba_cpu.py"],
                            check=True, capture_output=True, text=True).stdout
    name = f"numba_cpu_{rev.replace('/', '_').replace('-', '_')}"
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module                                          # numba's cache finds the module by name
    spec.loader.exec_module(module)
    return module


def make_inputs(b, l, h, p, g, n, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(x=rng.standard_normal((b, l, h, p)).astype(f), dt=rng.uniform(0.001, 0.1, (b, l, h)).astype(f),
                A=-rng.uniform(0.5, 2.0, h).astype(f), B=rng.standard_normal((b, l, g, n)).astype(f),
                C=rng.standard_normal((b, l, g, n)).astype(f), D=rng.standard_normal(h).astype(f),
                dy=rng.standard_normal((b, l, h, p)).astype(f), d_final=rng.standard_normal((b, h, p, n)).astype(f))


def run(module, v, chunk):
    y, state, saved = module.forward(v["x"], v["dt"], v["A"], v["B"], v["C"], v["D"], None, chunk)
    return (y, state), module.backward(saved, v["dy"], v["d_final"])


def compare(pair, v, chunk, repeats):
    """times[repeat, which of pair, (forward, backward), (cpu, wall)] in seconds: anything with the kernel
    interface's forward and backward (a module, a Backend record), the two interleaved (bench_ssd_backends.py
    uses it too)."""
    times = np.zeros((repeats, 2, 2, 2))
    for r in range(repeats):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            module = pair[which]
            c0, w0 = time.process_time(), time.perf_counter()
            y, state, saved = module.forward(v["x"], v["dt"], v["A"], v["B"], v["C"], v["D"], None, chunk)
            c1, w1 = time.process_time(), time.perf_counter()
            module.backward(saved, v["dy"], v["d_final"])
            c2, w2 = time.process_time(), time.perf_counter()
            times[r, which] = [[c1 - c0, w1 - w0], [c2 - c1, w2 - w1]]
    return times


def compare_steps(old, shape_name: str, rounds: int, steps: int) -> dict:
    """Training-step seconds (wall, process CPU) with the scan backend's kernels taken from `old` or from this
    tree, switched in one process; see the module's docstring."""
    import dataclasses

    import tinygrad_ssm.scan as K
    from bench_step_ab import SHAPES
    from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
    from tinygrad_ssm.optim import AdamW
    n_layer, batch, seq_len, lr = SHAPES[shape_name]
    plain = K.BACKENDS["numba"]
    sides = {"old": dataclasses.replace(plain, forward=old.forward, backward=old.backward), "new": plain}
    model = Mamba2LMHeadModel(Mamba2Config(d_model=256, n_layer=n_layer, vocab_size=256, d_state=64, headdim=64,
                                           chunk_size=64), VarMap(seed=0))
    opt = AdamW(model.varmap.all_vars(), lr=lr)
    data = np.random.default_rng(0).integers(0, 256, (batch, seq_len + 1))

    def step():
        opt.zero_grad()
        model.loss(data[:, :-1], data[:, 1:]).backward()
        opt.step()
    times = {name: [] for name in sides}
    try:
        for name in sides:                                              # compile, warm up
            K.BACKENDS["numba"] = sides[name]
            for _ in range(3):
                step()
        for r in range(rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                K.BACKENDS["numba"] = sides[name]
                step()
                for _ in range(steps):
                    c0, w0 = time.process_time(), time.perf_counter()
                    step()
                    times[name].append((time.perf_counter() - w0, time.process_time() - c0))
    finally:
        K.BACKENDS["numba"] = plain
    result = {name: {"median_s": float(np.median([t[0] for t in v])), "cpu_s": float(np.median([t[1] for t in v]))}
              for name, v in times.items()}
    result.update(shape=shape_name, rounds=rounds, steps_per_round=steps,
                  new_over_old=result["new"]["median_s"] / result["old"]["median_s"])
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-rev", default="7d9c51f", help="git revision of the kernels to compare [%(default)s]")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--chunk", type=int, default=64, help="chunk_size (checkpoint interval) [%(default)s]")
    parser.add_argument("--quick", action="store_true", help="smoke run: b=1, l=128, 2 repeats")
    parser.add_argument("--json", default="benchmarks/results/bench_ssd_ab.json", help="where to write [%(default)s]")
    parser.add_argument("--step", nargs="?", const="bench", choices=["bench", "default"],
                        help="time whole training steps at bench_step_ab.py's shape instead of the kernels")
    parser.add_argument("--rounds", type=int, default=8, help="with --step: rounds of old and new [%(default)s]")
    parser.add_argument("--steps", type=int, default=4, help="with --step: timed steps per side and round [%(default)s]")
    args = parser.parse_args(argv)
    if args.step:
        with tempfile.TemporaryDirectory() as folder:
            old = load_revision(args.old_rev, Path(folder))
            r = compare_steps(old, args.step, 2 if args.quick else args.rounds, 1 if args.quick else args.steps)
        print(f"training steps ({args.step} shape) with the scan kernels of {args.old_rev} (old) and of this tree "
              f"(new), switched in one process: {r['rounds']} rounds of {r['steps_per_round']} steps a side")
        print("| side | median step s | median CPU s |\n|---|---|---|")
        for name in ("old", "new"):
            print(f"| {name} | {r[name]['median_s']:.3f} | {r[name]['cpu_s']:.3f} |")
        print(f"new / old: {r['new_over_old']:.3f}")
        path = Path(args.json.replace(".json", f"_step_{args.step}.json"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(r, old_rev=args.old_rev), indent=1))
        print(f"wrote {path}")
        return
    shape = dict(TRAINING, b=1, l=128) if args.quick else TRAINING
    repeats = 2 if args.quick else args.repeats
    v = make_inputs(**shape)
    with tempfile.TemporaryDirectory() as folder:
        old = load_revision(args.old_rev, Path(folder))
        (y_old, s_old), g_old = run(old, v, args.chunk)                 # compiles (or loads) both, and checks
        (y_new, s_new), g_new = run(new, v, args.chunk)                 # that they agree
        agree = max(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
                    for a, b in zip([y_old, s_old, *g_old[:5]], [y_new, s_new, *g_new[:5]]))
        default_threads = numba.get_num_threads()
        results = dict(shape=shape, dtype="float32", chunk=args.chunk, old_rev=args.old_rev, repeats=repeats,
                       max_relative_difference=agree, runs=[])
        print(f"numba kernels, this tree against {args.old_rev}: b,l,h,p,g,n = {tuple(shape.values())}, float32, "
              f"chunk {args.chunk}, median of {repeats}; outputs and gradients agree to {agree:.1e} (relative)")
        print("| threads | part | old cpu ms | new cpu ms | new/old (cpu) | old wall ms | new wall ms | new/old (wall) |")
        print("|---|---|---|---|---|---|---|---|")
        for threads in sorted({1, default_threads}):
            numba.set_num_threads(threads)
            t = compare((old, new), v, args.chunk, repeats)
            numba.set_num_threads(default_threads)
            parts = {"forward": t[:, :, 0], "backward": t[:, :, 1], "forward+backward": t.sum(2)}
            for part, pt in parts.items():                              # pt[repeat, (old, new), (cpu, wall)]
                row = dict(threads=threads, part=part)
                for k, clock in enumerate(("cpu", "wall")):
                    row[f"old_{clock}_s"] = float(np.median(pt[:, 0, k]))
                    row[f"new_{clock}_s"] = float(np.median(pt[:, 1, k]))
                    row[f"ratio_{clock}"] = float(np.median(pt[:, 1, k] / pt[:, 0, k]))
                results["runs"].append(row)
                print(f"| {threads} | {part} | {row['old_cpu_s']*1e3:.1f} | {row['new_cpu_s']*1e3:.1f} | "
                      f"{row['ratio_cpu']:.3f} | {row['old_wall_s']*1e3:.1f} | {row['new_wall_s']*1e3:.1f} | "
                      f"{row['ratio_wall']:.3f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
