"""A training step of this tree against the same step of another git revision, each side in a process of its
own, the two sides taking turns (old, new, old, new, ...), so that a machine whose speed drifts through the day
(this one: 10% between hours) slows both alike.

    python benchmarks/bench_step_ab.py --old-rev 931a76e                     # the benchmark's shape
    python benchmarks/bench_step_ab.py --old-rev 931a76e --shape default     # the default run's shape
    python benchmarks/bench_step_ab.py --old-rev HEAD~1 --quick              # a smoke run

The other revision's tree comes from `git archive` into a temporary folder; its numba kernels compile there on
its first round (inside the warm-up steps). A process builds the model (fused, the numba scan, AdamW), runs
--warmup steps untimed, then --steps timed ones, and prints their seconds. The table gives per side the median
over rounds of each round's median step, the fastest step, and new / old of those medians. Writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import RESULTS, ROOT, write_result

SHAPES = {  # name: (n_layer, batch, seq_len, lr)
    "bench": (4, 8, 512, 1e-3),      # bench_train_step.py's model and batch
    "default": (3, 32, 128, 4e-3),   # the default training run's (tinygrad_ssm/train/config.py)
}

STEP = """
import tinygrad_ssm  # first: tinygrad_ssm/fast/blas_threads.py
import json, sys, time
import numpy as np
from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
from tinygrad_ssm.optim import AdamW
n_layer, batch, seq_len, lr, warmup, steps = json.loads(sys.argv[1])
config = Mamba2Config(d_model=256, n_layer=n_layer, vocab_size=256, d_state=64, headdim=64, expand=2, chunk_size=64)
model = Mamba2LMHeadModel(config, VarMap(seed=0))
opt = AdamW(model.varmap.all_vars(), lr=lr)
data = np.random.default_rng(0).integers(0, 256, (batch, seq_len + 1))
times = []
for i in range(warmup + steps):
    start = time.perf_counter()
    opt.zero_grad()
    loss = model.loss(data[:, :-1], data[:, 1:])
    loss.backward()
    opt.step()
    del loss
    times.append(time.perf_counter() - start)
print(json.dumps({"file": tinygrad_ssm.__file__, "times": times[warmup:]}))
"""


def run_side(tree: Path, spec: list) -> list:
    """The timed steps of one process whose tinygrad_ssm is the one in `tree`."""
    out = subprocess.run([sys.executable, "-c", STEP, json.dumps(spec)], cwd=tree, check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["file"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the process for {tree} imported tinygrad_ssm from {result['file']}")
    return result["times"]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-rev", required=True, help="git revision to compare this tree against")
    p.add_argument("--shape", choices=sorted(SHAPES), default="bench")
    p.add_argument("--rounds", type=int, default=3, help="processes per side, taking turns")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 layer, batch 2 x 64, 1 round of 2 steps")
    p.add_argument("--json", default=str(RESULTS / "bench_step_ab.json"))
    args = p.parse_args(argv)
    n_layer, batch, seq_len, lr = (1, 2, 64, 1e-3) if args.quick else SHAPES[args.shape]
    rounds, warmup, steps = (1, 1, 2) if args.quick else (args.rounds, args.warmup, args.steps)
    spec = [n_layer, batch, seq_len, lr, warmup, steps]
    medians, fastest = {"old": [], "new": []}, {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as folder:
        old_tree = Path(folder) / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old_rev], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
        for r in range(rounds):
            for side, tree in (("old", old_tree), ("new", ROOT)):
                times = run_side(tree, spec)
                medians[side].append(statistics.median(times))
                fastest[side].append(min(times))
                print(f"round {r + 1}/{rounds} {side}: median {medians[side][-1]:.3f} s, fastest {min(times):.3f} s",
                      flush=True)
    rows = []
    for side in ("old", "new"):
        rows.append([f"{args.old_rev} (old)" if side == "old" else "this tree (new)",
                     round(statistics.median(medians[side]), 4), round(min(fastest[side]), 4)])
    ratios = [n / o for n, o in zip(medians["new"], medians["old"])]
    rows.append(["new / old", round(statistics.median(ratios), 3), f"rounds: {min(ratios):.3f}-{max(ratios):.3f}"])
    title = (f"A training step, this tree against {args.old_rev}: {n_layer} layers, batch {batch} x {seq_len}, "
             f"{rounds} rounds of {steps} steps after {warmup}")
    notes = [f"shape: {'quick' if args.quick else args.shape}; a process per side and round, the sides taking "
             "turns; per round the median step of each side"]
    return write_result(args.json, "bench_step_ab", title, ["side", "median s (of round medians)", "fastest s"],
                        rows, notes, medians=medians, ratios=ratios)


if __name__ == "__main__":
    sys.exit(main() and 0)
