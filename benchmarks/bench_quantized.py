"""Decoding from 8-bit and bfloat16 weights (models/mamba2/quantize.py, fast/quantized_kernels.py) against float32
at the shape of the pretrained Mamba-2 130M (bench_pretrained_shape.py's SHAPE: d_model 768, 24 layers, d_state
128, vocabulary 50,288 rows, tied), random weights, 2 threads (--threads N).

    python benchmarks/bench_quantized.py                    # generation b=1 and b=8, eval on random ids
    python benchmarks/bench_quantized.py --quick --json     # a tiny config: a smoke run

Rows per format: the time of generate(prompt of --prompt-tokens, 1) (the chunked scan through dequantized blocks
of rows, the LM head on the last position); greedy generation tokens/s (a 16-token prompt then --new-tokens, prefill included; medians of
interleaved repeats: the formats run in turn inside each repeat), bytes of weights a decoding step reads (every
weight once: the float parameters left plus the quantized arrays and scales), the bandwidth limit (batch x read
bandwidth / those bytes; read bandwidth as bench_pretrained_shape.read_bandwidth measures it), resident weight
MB, and `evaluate`'s perplexity on --eval-tokens random ids. The issue's goals are reported, never asserted.
"""
from __future__ import annotations

import argparse
import sys
import time

import _common as common

THREADS = common.threads_from_argv(default=2)

import numpy as np
from bench_pretrained_shape import QUICK_SHAPE, SHAPE, _sum, read_bandwidth

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
from tinygrad_ssm.models.mamba2.evaluation import evaluate
from tinygrad_ssm.models.mamba2.quantize import resident_weight_bytes

FORMATS = ("float32", "bfloat16", "int8")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=common.positive_int, nargs="+", default=[1, 8])
    p.add_argument("--new-tokens", type=common.positive_int, default=64)
    p.add_argument("--repeats", type=common.positive_int, default=3)
    p.add_argument("--block", type=common.positive_int, default=32, help="int8 scale block")
    p.add_argument("--eval-tokens", type=common.positive_int, default=2048)
    p.add_argument("--prompt-tokens", type=common.positive_int, default=512, help="the prompt row: generate(prompt, 1)")
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-")
    args = p.parse_args(argv)
    shape = QUICK_SHAPE if args.quick else SHAPE
    if args.quick:
        args.new_tokens, args.repeats, args.eval_tokens, args.prompt_tokens = 8, 2, 256, 64
    config = Mamba2Config(**shape, tie_embeddings=True, chunk_size=256)
    models = {}
    for fmt in FORMATS:                                                 # the same random weights (seed 0)
        model = Mamba2LMHeadModel(config, VarMap(seed=0))
        models[fmt] = model if fmt == "float32" else model.quantize(fmt, block=args.block if fmt == "int8" else None)
    gib = 0.0625 if args.quick else 1.0
    bandwidth = read_bandwidth(gib)["gb_s"] * 1e9
    result = {"benchmark": "bench_quantized", "shape": shape, "block": args.block, "threads": THREADS,
              "read_bandwidth_gb_s": round(bandwidth / 1e9, 1), "rows": {}}
    # the limits use the bandwidth read beside the runs, in every round (before and after them, the faster read):
    # one read at the start once left float32 b=1 at 83.3 tokens/s against a "limit" of 71.8
    probe = np.ones(int(gib * 2**30) // 4, np.float32)

    def probe_bytes_per_s() -> float:
        return probe.nbytes / min(common.timed(lambda: _sum(probe)) for _ in range(3))
    for batch in args.batches:
        prompt = np.random.default_rng(batch).integers(0, shape["vocab_size"], (batch, 16))
        sides = {fmt: (lambda m=m, prompt=prompt: m.generate(prompt, args.new_tokens, temperature=0))
                 for fmt, m in models.items()}
        for run in sides.values():
            run()                                                       # warm-up (compiles)
        times, rounds = {fmt: [] for fmt in sides}, []
        for _ in range(args.repeats):
            before = probe_bytes_per_s()
            for fmt, run in sides.items():
                times[fmt].append(common.timed(run))
            rounds.append(max(before, probe_bytes_per_s()))
        beside = float(np.median(rounds))                               # bytes/s, read beside this batch's runs
        for fmt in FORMATS:
            step_bytes = resident_weight_bytes(models[fmt])
            result["rows"][f"{fmt} b={batch}"] = {
                "tokens_per_s": round(batch * args.new_tokens / float(np.median(times[fmt])), 1),
                "weight_bytes_per_step": step_bytes, "resident_mb": round(step_bytes / 1e6, 1),
                "read_gb_s_beside": round(beside / 1e9, 1),
                "bandwidth_limit_tokens_per_s": round(batch * beside / step_bytes, 1)}
        base = result["rows"][f"float32 b={batch}"]["tokens_per_s"]
        for fmt in FORMATS:
            row = result["rows"][f"{fmt} b={batch}"]
            row["x_float32"] = round(row["tokens_per_s"] / base, 2)
    prompt = np.random.default_rng(512).integers(0, shape["vocab_size"], (1, args.prompt_tokens))
    sides = {fmt: (lambda m=m: m.generate(prompt, 1, temperature=0)) for fmt, m in models.items()}
    for run in sides.values():
        run()
    times = {fmt: [] for fmt in sides}
    for _ in range(args.repeats):
        for fmt, run in sides.items():
            times[fmt].append(common.timed(run))
    for fmt in FORMATS:                                                 # the prompt through the chunked scan
        seconds = float(np.median(times[fmt]))
        result["rows"][f"{fmt} prompt {args.prompt_tokens}"] = {
            "seconds": round(seconds, 3), "tokens_per_s": round(args.prompt_tokens / seconds, 1),
            "x_float32": round(float(np.median(times["float32"])) / seconds, 2)}
    ids = np.random.default_rng(7).integers(0, shape["vocab_size"], args.eval_tokens)
    result["perplexity_random_ids"], result["eval_tokens_per_s"] = {}, {}
    for fmt, m in models.items():                                       # eval: the forward in windows of 512
        evaluate(m, ids[:64], window=64)                                # warm-up (compiles the forward)
        start = time.perf_counter()
        result["perplexity_random_ids"][fmt] = round(evaluate(m, ids, window=512).perplexity, 3)
        result["eval_tokens_per_s"][fmt] = round(len(ids) / (time.perf_counter() - start), 1)
    print(f"read bandwidth at the start {bandwidth / 1e9:.1f} GB/s (the limits: read beside each batch's runs); "
          f"{THREADS} threads; block {args.block}")
    print(f"{'':18s} {'tokens/s':>9s} {'x f32':>6s} {'MB/step':>8s} {'limit tok/s':>11s}")
    for name, r in result["rows"].items():
        if "resident_mb" in r:
            print(f"{name:18s} {r['tokens_per_s']:9.1f} {r['x_float32']:6.2f} {r['resident_mb']:8.1f} "
                  f"{r['bandwidth_limit_tokens_per_s']:11.1f}")
        else:
            print(f"{name:18s} {r['tokens_per_s']:9.1f} {r['x_float32']:6.2f} {'':8s} {'':11s}  ({r['seconds']} s)")
    print("perplexity (random weights, random ids):", result["perplexity_random_ids"])
    print("eval tokens/s (one run each):", result["eval_tokens_per_s"])
    if args.json:
        common.dump_json(result, args.json)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
