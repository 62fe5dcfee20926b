"""A training step and greedy generation, each in a fresh process, for each import order a user's script may
have: tinygrad_ssm first, NumPy first, torch first (when installed). The package's speed must not depend on it.

    python benchmarks/bench_import_order.py                 # batch 8 x 512, d_model 256, 4 layers; 7 rounds
    python benchmarks/bench_import_order.py --quick         # a smoke run of a tiny config

Each round starts one process per order, in turn (so load from other processes hits every order alike); a
process imports its module first, then builds the fused model, times --steps AdamW steps after two warm-up
steps (the median) and five greedy generations after a warm-up one (the median). The table gives each order's median over the
rounds and its ratio to tinygrad_ssm-first's, with the range of the per-round ratios.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import _common as common  # noqa: I001  (no NumPy: threads_from_argv must come first)
THREADS = common.threads_from_argv()

import numpy as np  # noqa: E402

WORKER = textwrap.dedent("""
    import json, sys, time
    first, config, batch, seqlen, steps, new_tokens = json.loads(sys.argv[1])
    if first == "numpy":
        import numpy
    elif first == "torch":
        import torch
    import tinygrad_ssm as tg
    import numpy as np
    model = tg.Mamba2LMHeadModel(tg.Mamba2Config(**config, chunk_size=64, tie_embeddings=True), tg.VarMap(seed=0),
                                 dtype="float32", fused=True)
    opt = tg.optim.AdamW(model.varmap, lr=1e-3)
    data = np.random.default_rng(0).integers(0, config["vocab_size"], (batch, seqlen + 1))
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        opt.zero_grad()
        model.loss(data[:, :-1], data[:, 1:]).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - start)
    prompt = data[:1, :16]
    model.generate(prompt, max_new_tokens=new_tokens, temperature=0)    # warm-up: compiles the decoder
    generation = []
    for _ in range(5):
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens=new_tokens, temperature=0)
        generation.append(time.perf_counter() - start)
    print(json.dumps({"step_s": float(np.median(times)), "tokens_per_s": new_tokens / float(np.median(generation))}))
""")


def orders() -> list[str]:
    return ["tinygrad_ssm", "numpy"] + (["torch"] if importlib.util.find_spec("torch") is not None else [])


def run_one(first: str, config: dict, batch: int, seqlen: int, steps: int, new_tokens: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env["PYTHONPATH"] = os.pathsep.join([str(common.ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", WORKER, json.dumps([first, config, batch, seqlen, steps, new_tokens])],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench_import_order: the {first}-first process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=common.positive_int, default=7)
    p.add_argument("--steps", type=common.positive_int, default=5, help="timed steps per process (their median)")
    p.add_argument("--batch", type=common.positive_int, default=8)
    p.add_argument("--seqlen", type=common.positive_int, default=512)
    p.add_argument("--new-tokens", type=common.positive_int, default=256)
    p.add_argument("--threads", type=common.positive_int, default=None,
                   help="threads for every library (default: their own)")
    p.add_argument("--quick", action="store_true", help="tiny config, batch 2 x 64, 2 rounds: a smoke run")
    p.add_argument("--json", default=None, help=common.json_help("bench_import_order"))
    args = p.parse_args(argv)
    config = common.QUICK_CONFIG if args.quick else common.CONFIG
    if args.quick:
        args.rounds, args.steps, args.batch, args.seqlen, args.new_tokens = 2, 2, 2, 64, 32
    names = orders()
    runs = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            runs[name].append(run_one(name, config, args.batch, args.seqlen, args.steps, args.new_tokens))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{name} first {runs[name][-1]['step_s']:.3f} s" for name in names), flush=True)

    base = runs[names[0]]
    rows = []
    for name in names:
        step = [run["step_s"] for run in runs[name]]
        tokens = [run["tokens_per_s"] for run in runs[name]]
        step_ratios = [s / b["step_s"] for s, b in zip(step, base)]
        token_ratios = [t / b["tokens_per_s"] for t, b in zip(tokens, base)]
        rows.append([f"{name} first", round(float(np.median(step)), 4), round(float(np.median(step_ratios)), 3),
                     f"{min(step_ratios):.3f}-{max(step_ratios):.3f}", round(float(np.median(tokens)), 1),
                     round(float(np.median(token_ratios)), 3), f"{min(token_ratios):.3f}-{max(token_ratios):.3f}"])
    columns = ["first import", "step s", "/ tinygrad_ssm first", "rounds", "generation tokens/s",
               "/ tinygrad_ssm first", "rounds"]
    title = (f"fresh process per order, d_model {config['d_model']}, {config['n_layer']} layers, step batch "
             f"{args.batch} x {args.seqlen} (median of {args.steps} after 2), greedy generation of "
             f"{args.new_tokens} tokens at batch 1 (median of 5); medians of {args.rounds} rounds")
    return common.write_result(common.result_path(args.json, "bench_import_order", args.quick), "bench_import_order", title, columns, rows,
                               notes=["each round's ratio is to the tinygrad_ssm-first process of the same round; the "
                                      "table gives their median and, under 'rounds', their range"],
                               runs=runs, threads=THREADS)


if __name__ == "__main__":
    sys.exit(main() and 0)
