"""Data-parallel throughput on one machine: 1 process x 2 threads (and x 1 thread) against 2 MPI ranks x 1
thread each, with and without overlapping the gradient allreduce with the backward, and the allreduce time.

    python benchmarks/bench_distributed.py                       # d_model 256, 4 layers, the CLI's batch, 8 steps
    python benchmarks/bench_distributed.py --steps 12 --json out.json

Each configuration is a real `python -m tinygrad_ssm train` run (under `mpiexec -n 2` for the MPI ones) with
the same global batch; tokens/s is the median over the steps after the first `--skip` (compilation, warm
caches), read from the run's log.jsonl. `finish_s` is the median time of the allreduce step's finish() per
training step: the communication the backward did not hide, plus waiting for the slower rank. `allreduce_s`
is a separate measurement: the bare bucketed allreduce of the model's gradients (no compute), 2 ranks.
Threads: OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS set per run. Needs the `distributed` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import nonnegative_int, positive_int, save_json

ROOT = Path(__file__).resolve().parent.parent


def _env(threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def run_training(ranks: int, threads: int, overlap: bool, args, work: Path) -> dict:
    out = work / f"r{ranks}t{threads}{'' if overlap else '-no-overlap'}"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tinygrad_ssm", "train", "--steps", str(args.steps), "--out", str(out),
           "--eval-every", str(args.steps), "--eval-batches", "1", "--checkpoint-every", str(args.steps),
           "--sample-bytes", "0", "--no-progress", "--batch-size", str(args.batch_size), "--seq-len",
           str(args.seq_len), "--d-model", str(args.d_model), "--n-layer", str(args.n_layer)]
    if ranks > 1:
        cmd = [_mpiexec(), "-n", str(ranks), *cmd] + ([] if overlap else ["--no-overlap"])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(threads))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "train_loss" in r][args.skip:]
    return {"ranks": ranks, "threads_per_rank": threads, "overlap": overlap if ranks > 1 else None,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps),
            "step_s": statistics.median(args.batch_size * args.seq_len / r["tokens_per_s"] for r in steps),
            "finish_s": statistics.median(r["allreduce_s"] for r in steps) if ranks > 1 else None,
            "buckets_sent_in_backward": steps[-1].get("buckets_sent_in_backward"),
            "steps_timed": len(steps), "wall_s": time.perf_counter() - t0}


def bare_allreduce(args) -> None:
    """Under mpiexec: time GradientAllreducer.finish() of the model's gradients, no compute between."""
    import numpy as np

    from tinygrad_ssm import distributed as dist
    from tinygrad_ssm.tokenizer import ByteTokenizer
    from tinygrad_ssm.train.loop import TrainConfig
    from tinygrad_ssm.train.starting_point import build_model

    world = dist.init()
    model = build_model(TrainConfig(d_model=args.d_model, n_layer=args.n_layer), ByteTokenizer())
    reducer = dist.GradientAllreducer(model.varmap, world, overlap=False)
    times = []
    for _ in range(args.repeats + 2):
        for p in model.varmap.all_vars():
            p.grad = np.ones(p.shape, dtype=p.dtype)
        world.comm.Barrier()
        t0 = time.perf_counter()
        reducer.finish()
        times.append(time.perf_counter() - t0)
    if world.is_root:
        n = model.varmap.num_parameters()
        print(json.dumps({"allreduce_s": statistics.median(times[2:]), "parameters": n,
                          "megabytes": n * 4 / 1e6, "buckets": len(reducer.buckets)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=8)
    p.add_argument("--skip", type=nonnegative_int, default=2, help="first steps left out of the medians")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--d-model", type=positive_int, default=256)
    p.add_argument("--n-layer", type=positive_int, default=4)
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="runs of every configuration, round-robin; the median one is shown (the lower for even)")
    p.add_argument("--repeats", type=positive_int, default=20, help="bare allreduce repetitions")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results here")
    p.add_argument("--bare-allreduce", action="store_true", help=argparse.SUPPRESS)  # the mpiexec child
    args = p.parse_args()
    if args.skip >= args.steps:                                         # (the medians would be of no steps)
        p.error(f"--skip {args.skip} leaves none of --steps {args.steps}: give --skip below --steps")
    if args.bare_allreduce:
        return bare_allreduce(args)
    results = {"config": {k: getattr(args, k) for k in ("steps", "skip", "batch_size", "seq_len", "d_model",
                                                         "n_layer", "rounds")}, "cpus": os.cpu_count(), "runs": []}
    configurations = ((1, 2, True), (1, 1, True), (2, 1, True), (2, 1, False))
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):  # round-robin: a machine whose load drifts affects every configuration
            rounds.append([run_training(*c, args, Path(tmp) / f"round{i}") for c in configurations])
    for runs in zip(*rounds):  # per configuration: the round with the median tokens/s
        results["runs"].append(sorted(runs, key=lambda r: r["tokens_per_s"])[(len(runs) - 1) // 2])
    results["rounds"] = rounds
    bare = subprocess.run([_mpiexec(), "-n", "2", sys.executable, __file__, "--bare-allreduce", "--d-model",
                           str(args.d_model), "--n-layer", str(args.n_layer), "--repeats", str(args.repeats)],
                          capture_output=True, text=True, env=_env(1))
    if bare.returncode != 0:
        raise RuntimeError(bare.stderr[-3000:])
    results["bare_allreduce"] = json.loads(bare.stdout.strip().splitlines()[-1])
    base = results["runs"][0]["tokens_per_s"]
    print(f"{'configuration':<34}{'tokens/s':>10}{'vs 1x2':>8}{'step s':>9}{'finish() s':>12}"
          f"{'sent in backward':>18}")
    for r in results["runs"]:
        name = (f"1 process x {r['threads_per_rank']} thread(s)" if r["ranks"] == 1 else
                f"{r['ranks']} ranks x {r['threads_per_rank']} thread, {'overlap' if r['overlap'] else 'no overlap'}")
        finish = f"{r['finish_s']:.4f}" if r["finish_s"] is not None else "-"
        print(f"{name:<34}{r['tokens_per_s']:>10,.0f}{r['tokens_per_s'] / base:>8.2f}{r['step_s']:>9.3f}{finish:>12}"
              f"{r['buckets_sent_in_backward'] or '-':>18}")
    b = results["bare_allreduce"]
    print(f"bare allreduce of {b['parameters']:,} float32 gradients ({b['megabytes']:.1f} MB, {b['buckets']} "
          f"buckets), 2 ranks: {b['allreduce_s'] * 1e3:.2f} ms")
    if args.json:
        save_json(args.json, results)


if __name__ == "__main__":
    main()
