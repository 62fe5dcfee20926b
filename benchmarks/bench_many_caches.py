"""Decoding many conversations in turn, as a server does: one fused model, N caches (batch 1 each), one
`model.step` on each cache in turn, against the same caches stepped on one thread (no helper thread) and against
one cache alone, in the same run.

    python benchmarks/bench_many_caches.py                  # the default model (d_model 256, 4 layers), N 1 4 64
    python benchmarks/bench_many_caches.py --quick --json   # a smoke run

The numba decoder gives each cache's session a helper thread (models/mamba2/decode.py) that spins ~10 ms after
the session's last step; another session's step sends it home, or takes it over if it has none. Rows: ms a step
(median of --rounds, each round --steps steps, the settings in turn inside each round), the ratio to one cache
on the same threads, and the cores the process kept busy in the 100 ms after stepping each cache once (CPU time
over wall time while the caller sleeps: helpers still spinning show here).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import _common as common

THREADS = common.threads_from_argv(default=2)

import numba
import numpy as np

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
from tinygrad_ssm.models.mamba2.decode import helper_threads


def ms_a_step(model, caches, steps: int) -> float:
    ids = np.array([1])
    rounds = max(1, steps // len(caches))
    start = time.perf_counter()
    for _ in range(rounds):
        for cache in caches:
            model.step(ids, cache)
    return (time.perf_counter() - start) / (rounds * len(caches)) * 1e3


def cores_busy_after(model, caches, seconds: float = 0.1) -> float:
    time.sleep(0.05)                                                    # the helpers of what ran before: gone
    for cache in caches:
        model.step(np.array([1]), cache)
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--caches", type=common.positive_int, nargs="+", default=[1, 4, 64])
    p.add_argument("--steps", type=common.positive_int, default=2048, help="steps a setting takes in each round")
    p.add_argument("--rounds", type=common.positive_int, default=5)
    p.add_argument("--threads", type=common.positive_int, default=None)
    p.add_argument("--quick", action="store_true", help="the quick config, 256 steps, 2 rounds: a smoke run")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-", help=common.json_help("bench_many_caches"))
    args = p.parse_args(argv)
    shape = common.QUICK_CONFIG if args.quick else common.CONFIG
    if args.quick:
        args.steps, args.rounds = 256, 2
    model = Mamba2LMHeadModel(Mamba2Config(**shape, chunk_size=64), VarMap(seed=0), fused=True)
    caches = {n: [model.allocate_cache(1) for _ in range(n)] for n in args.caches}
    threads = numba.get_num_threads()
    settings = [(n, t) for n in args.caches for t in sorted({threads, 1}, reverse=True)]
    times = {s: [] for s in settings}
    busy = {s: [] for s in settings}
    for round_ in range(args.rounds + 1):                              # round 0 warms up (compiles, first pages)
        for n, t in settings:
            numba.set_num_threads(t)                                    # 1: no helper thread (decode.helper_threads)
            took = ms_a_step(model, caches[n], args.steps)
            if round_:
                times[n, t].append(took)
                busy[n, t].append(cores_busy_after(model, caches[n]))
    numba.set_num_threads(threads)
    rows = []
    for n, t in settings:
        alone = statistics.median(times[min(args.caches), t])
        median = statistics.median(times[n, t])
        rows.append([n, t, round(median, 4), round(median / alone, 2), round(statistics.median(busy[n, t]), 2)])
    notes = [f"{model.varmap.num_parameters():,} parameters, float32, batch 1 a cache; {helper_threads()} helper "
             f"thread(s) at {threads} threads; median of {args.rounds} rounds of {args.steps} steps"]
    return common.write_result(common.result_path(args.json, "bench_many_caches", args.quick), "bench_many_caches",
                               "Decoding N caches in turn (a server's conversations)",
                               ["caches in turn", "threads", "ms a step", "x one cache", "cores busy after"], rows,
                               notes, config=shape)


if __name__ == "__main__":
    sys.exit(main() and 0)
