"""Greedy generation (prefill a prompt, then one token at a time) of tinygrad_ssm against transformers'
Mamba2ForCausalLM on the CPU: the same config and weights, float32, batch 1 and 8.

    python benchmarks/bench_generate.py                    # 16-token prompt, 256 new tokens, batch 1 and 8
    python benchmarks/bench_generate.py --quick --json     # a smoke run of a tiny config

Tokens/s counts the new tokens of every sequence over the whole call (prefill included). The sides run in turn
inside each repeat; median, min and max of --repeats after a warm-up call; the peak memory one call adds;
and how many of the greedy tokens both sides agree on (float32 rounding may flip a near-tie late on).
Our rows: the fused model (numba decoding, the default) and, with --with-reference, the engine-op step; with
--sampling, the fused model sampling (top_k=1, and temperature 0.8 with top_p 0.9; seed 0) against its greedy
row (x greedy: tokens/s over greedy's, measured in the same repeats).

    python benchmarks/bench_generate.py --batches 1 8 --sampling
"""
from __future__ import annotations

import argparse
import sys

import _common as common  # no NumPy yet: threads_from_argv must come first

THREADS = common.threads_from_argv(default=2)

import numpy as np

SAMPLING_ROWS = {"tinygrad_ssm top_k=1": {"temperature": 1.0, "top_k": 1},
                 "tinygrad_ssm t=0.8 top_p=0.9": {"temperature": 0.8, "top_p": 0.9}}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=common.positive_int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=common.positive_int, default=16)
    p.add_argument("--new-tokens", type=common.positive_int, default=256)
    p.add_argument("--chunk-size", type=common.positive_int, default=64)
    p.add_argument("--repeats", type=common.positive_int, default=5)
    p.add_argument("--with-reference", action="store_true", help="also time our engine-op step (fused=False)")
    p.add_argument("--sampling", action="store_true", help="also time top_k=1 and temperature=0.8/top_p=0.9")
    p.add_argument("--threads", type=common.positive_int, default=2,
                   help="threads for every library on both sides [%(default)s]")
    p.add_argument("--quick", action="store_true", help="tiny config, 32 new tokens, 2 repeats: a smoke run")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-", help="write the results as JSON (- = stdout)")
    p.add_argument(common.MEMORY_FLAG, dest="memory_of", help=argparse.SUPPRESS)  # "SIDE@BATCH"
    args = p.parse_args(argv)
    if args.memory_of:
        common.fixed_mmap_threshold()
        args.batches = [int(args.memory_of.rsplit("@", 1)[1])]
    torch, _ = common.require_transformers()
    common.apply_to_torch(THREADS)
    config_kw = common.QUICK_CONFIG if args.quick else common.CONFIG
    if args.quick:
        args.new_tokens, args.repeats = 32, 2

    model = common.ours(config_kw, args.chunk_size, fused=True)
    reference = common.ours(config_kw, args.chunk_size, fused=False) if args.with_reference else None
    hf = common.theirs(model, args.chunk_size)
    n = args.new_tokens
    result = {"benchmark": "generate", "prompt_len": args.prompt_len, "new_tokens": n, "config": config_kw,
              "parameters": model.varmap.num_parameters(), "threads": torch.get_num_threads(), "rows": {}}
    outputs = {}
    for batch in args.batches:
        prompt = np.random.default_rng(batch).integers(0, config_kw["vocab_size"], (batch, args.prompt_len))
        prompt_t = torch.from_numpy(prompt)

        def theirs_run(prompt_t=prompt_t):
            with torch.no_grad():
                out = hf.generate(prompt_t, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True)
            outputs["transformers"] = out.numpy()

        def ours_run(m, key, prompt=prompt, **sampling):
            def call():
                outputs[key] = m.generate(prompt, n, **(sampling or {"temperature": 0}))
            return call

        sides = {"tinygrad_ssm": ours_run(model, "tinygrad_ssm")}
        if args.sampling:
            for name, kw in SAMPLING_ROWS.items():
                sides[name] = ours_run(model, name, seed=0, **kw)
        if reference is not None:
            sides["tinygrad_ssm reference"] = ours_run(reference, "tinygrad_ssm reference")
        sides["transformers"] = theirs_run
        if args.memory_of:
            return common.report_memory(sides, args.memory_of.rsplit("@", 1)[0])
        for run in sides.values():
            run()                                                       # warm-up
        agree = int((outputs["tinygrad_ssm"][:, args.prompt_len:] == outputs["transformers"][:, args.prompt_len:])
                    .all(axis=0).cumprod().sum())                       # leading new tokens equal in every row
        times = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, run in sides.items():
                times[name].append(common.timed(run))
        memory = common.peak_memory_by_side(__file__, sys.argv[1:] if argv is None else argv,
                                             [f"{name}@{batch}" for name in sides])
        for name, run in sides.items():
            added = memory[f"{name}@{batch}"]
            row = {**common.stats(times[name]), "tokens_per_s": round(batch * n / np.median(times[name]), 1),
                   "peak_added_mib": None if added is None else round(added / 2**20, 1)}
            result["rows"][f"{name} batch {batch}"] = row
        theirs_tps = result["rows"][f"transformers batch {batch}"]["tokens_per_s"]
        for name in sides:
            row = result["rows"][f"{name} batch {batch}"]
            row["x_transformers"] = round(row["tokens_per_s"] / theirs_tps, 2)
        result["rows"][f"tinygrad_ssm batch {batch}"]["greedy_tokens_agreeing"] = agree
        greedy_tps = result["rows"][f"tinygrad_ssm batch {batch}"]["tokens_per_s"]
        for name in SAMPLING_ROWS if args.sampling else ():
            row = result["rows"][f"{name} batch {batch}"]
            row["x_greedy"] = round(row["tokens_per_s"] / greedy_tps, 2)

    print(f"greedy generation, prompt {args.prompt_len}, {n} new tokens, {result['parameters']:,} parameters, "
          f"float32; median of {args.repeats} after a warm-up")
    print(f"{'':32s} {'median s':>9s} {'min':>7s} {'max':>7s} {'tokens/s':>9s} {'peak +MiB':>9s} {'x tf':>6s}")
    for name, r in result["rows"].items():
        extra = f"  (first {r['greedy_tokens_agreeing']} tokens equal to transformers')" \
            if "greedy_tokens_agreeing" in r else f"  ({r['x_greedy']:.2f} x greedy)" if "x_greedy" in r else ""
        print(f"{name:32s} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} {r['tokens_per_s']:9.0f} "
              f"{r['peak_added_mib'] if r['peak_added_mib'] is not None else '-':>9} {r['x_transformers']:6.2f}{extra}")
    if args.json:
        common.dump_json(result, args.json)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
