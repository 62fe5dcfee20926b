"""One training step (forward, cross entropy, backward, AdamW update) of tinygrad_ssm against transformers'
Mamba2ForCausalLM on the CPU: the same config and weights, float32, each side at chunk 32, 64 and 256 (on the
2-core machine transformers' best was chunk 32 or 64, within 3% of each other, ours 64; chunk 16 and 128 were
slower for both sides, 256 is the model's default).

    python benchmarks/bench_train_step.py                  # batch 8 x 512, d_model 256, 4 layers (1.79M params)
    python benchmarks/bench_train_step.py --quick --json   # a smoke run of a tiny config

The sides run in turn inside each repeat (so load from other processes hits all of them alike); the table
gives the median, min and max of --repeats timed steps after --warmup steps, the peak memory one step adds
(resident set, measured on one extra step), and each row's time over transformers' best. Our rows: the fused
model (the default) and, with --with-reference, the engine-op reference path. --backend picks our scan.
"""
from __future__ import annotations

import argparse
import sys

import _common as common  # noqa: I001  (no NumPy: threads_from_argv must come first)
THREADS = common.threads_from_argv(default=2)

import numpy as np  # noqa: E402

from tinygrad_ssm.optim import AdamW  # noqa: E402


def our_step(model, opt, ids, targets):
    def run():
        opt.zero_grad()
        loss = model.loss(ids, targets)
        loss.backward()
        opt.step()
        return loss.item()
    return run


def their_step(hf, opt, ids, targets):
    import torch
    ids_t, targets_t = torch.from_numpy(ids), torch.from_numpy(targets)

    def run():
        opt.zero_grad(set_to_none=True)
        logits = hf(ids_t, use_cache=False).logits                 # (its config's use_cache would keep states)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets_t.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()
    return run


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=common.positive_int, default=8)
    p.add_argument("--seqlen", type=common.positive_int, default=512)
    p.add_argument("--chunks", type=common.positive_int, nargs="+", default=[32, 64, 256])
    p.add_argument("--repeats", type=common.positive_int, default=5)
    p.add_argument("--warmup", type=common.nonnegative_int, default=1)
    p.add_argument("--backend", default="auto", help="our scan backend")
    p.add_argument("--with-reference", action="store_true", help="also time our reference path (fused=False)")
    p.add_argument("--threads", type=common.positive_int, default=2,
                   help="threads for every library on both sides [%(default)s]")
    p.add_argument("--quick", action="store_true", help="tiny config, batch 2 x 64, 2 repeats: a smoke run")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-", help="write the results as JSON (- = stdout)")
    p.add_argument(common.MEMORY_FLAG, dest="memory_of", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_of:
        common.fixed_mmap_threshold()
    torch, _ = common.require_transformers()
    common.apply_to_torch(THREADS)
    config_kw = common.QUICK_CONFIG if args.quick else common.CONFIG
    if args.quick:
        args.batch, args.seqlen, args.repeats = 2, 64, 2

    rng = np.random.default_rng(0)
    data = rng.integers(0, config_kw["vocab_size"], (args.batch, args.seqlen + 1))
    ids, targets = data[:, :-1].copy(), data[:, 1:].copy()
    sides = {}
    for chunk in args.chunks:
        model = common.ours(config_kw, chunk, fused=True, backend=args.backend)
        hf = common.theirs(model, chunk)
        if chunk == args.chunks[0]:
            difference = common.max_logit_difference(model, hf, ids[:1, :64])
        sides[f"tinygrad_ssm chunk {chunk}"] = our_step(model, AdamW(model.varmap.all_vars(), lr=1e-3), ids, targets)
        if args.with_reference:
            ref = common.ours(config_kw, chunk, fused=False, backend=args.backend)
            sides[f"tinygrad_ssm reference chunk {chunk}"] = our_step(ref, AdamW(ref.varmap.all_vars(), lr=1e-3),
                                                                       ids, targets)
        sides[f"transformers chunk {chunk}"] = their_step(hf, torch.optim.AdamW(hf.parameters(), lr=1e-3), ids,
                                                          targets)
    if args.memory_of:
        return common.report_memory(sides, args.memory_of)
    for run in sides.values():
        for _ in range(args.warmup):
            run()
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            times[name].append(common.timed(run))
    memory = common.peak_memory_by_side(__file__, sys.argv[1:] if argv is None else argv, sides)

    rows = {name: {**common.stats(t), "tokens_per_s": round(args.batch * args.seqlen / np.median(t), 1),
                   "peak_added_mib": None if memory[name] is None else round(memory[name] / 2**20, 1)}
            for name, t in times.items()}
    best_theirs = min(r["median_s"] for n, r in rows.items() if n.startswith("transformers"))
    for r in rows.values():
        r["vs_transformers_best"] = round(r["median_s"] / best_theirs, 3)
    result = {"benchmark": "train_step", "batch": args.batch, "seqlen": args.seqlen, "config": config_kw,
              "parameters": model.varmap.num_parameters(), "threads": torch.get_num_threads(),
              "our_backend": args.backend, "max_logit_difference": difference, "rows": rows}
    print(f"training step, b={args.batch} l={args.seqlen}, {result['parameters']:,} parameters, float32, "
          f"AdamW; logits differ by {difference:.2e}; median of {args.repeats} after {args.warmup} warm-up")
    print(f"{'':34s} {'median s':>9s} {'min':>7s} {'max':>7s} {'tokens/s':>9s} {'peak +MiB':>9s} {'/ tf best':>9s}")
    for name, r in rows.items():
        print(f"{name:34s} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} {r['tokens_per_s']:9.0f} "
              f"{r['peak_added_mib'] if r['peak_added_mib'] is not None else '-':>9} {r['vs_transformers_best']:9.3f}")
    if args.json:
        common.dump_json(result, args.json)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
