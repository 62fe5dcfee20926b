"""Scaling with sequence length, beside transformers' Mamba2 on the same weights:
- a training step (forward + backward + AdamW update, batch 1) at l = 256 .. 8,192: time and peak memory, and
  the fitted exponent of time in l (1 is linear, the goal);
- generation: peak memory against the number of generated tokens (flat is the goal: the state is O(1)).

    python benchmarks/bench_scaling.py [--quick] [--json PATH]

Each (side, size) runs in its own fresh process, so the peak memory of one does not hide the next. Peak memory is
_common.peak_added_bytes, as bench_train_step.py and bench_generate.py measure it: the resident memory one call
adds over what the process holds before it (VmHWM reset), with freed heap handed back first and every block over
1 MiB mapped on its own (_common.fixed_mmap_threshold), so a call's arrays fault in fresh pages and count. (The
process's lifetime peak, ru_maxrss, measured this before: a warm-up's freed heap pages stayed resident and took the
next call's arrays, so a generation of 2,048 tokens read as 0.0 MiB on both sides.) Model: the default run's
(vocab 256, d_model 256, 4 layers, d_state 64, headdim 64, chunk 64), float32.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import _common  # noqa: F401, I001  (first: puts this clone on sys.path before the installed package)
THREADS = _common.threads_from_argv(default=2)  # every library's pool, before NumPy loads its BLAS
from _common import (fitted_exponent, fixed_mmap_threshold, json_help, peak_added_bytes, result_path, timeit,
                     write_result)

MODEL = dict(d_model=256, n_layer=4, vocab_size=256, d_state=64, headdim=64, ngroups=1, chunk_size=64,
             tie_embeddings=True)
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
GENERATED = (128, 512, 2048)
PROMPT = 16


def _pair(side: str):
    """Our model, or transformers' with our weights (benchmarks/parity_transformers.build_pair)."""
    from parity_transformers import build_pair
    if side == "ours":
        from tinygrad_ssm.models import Mamba2Config, Mamba2LMHeadModel
        from tinygrad_ssm.registry import VarMap
        return Mamba2LMHeadModel(Mamba2Config(**MODEL), VarMap(seed=0), dtype="float32")
    return build_pair("float32", seed=0, config=MODEL)[1]


def warm_up(model, side: str):
    """A tiny forward + backward and a 2-token generation first, so that loading (or compiling) numba's kernels
    and torch's first-call set-up are not counted as the memory of the work measured after."""
    import numpy as np
    ids = np.zeros((1, 8), np.int64)
    if side == "ours":
        model.loss(ids, np.ones_like(ids)).backward()
        model.generate(ids, 2, temperature=0)
        for _, p in model.varmap.named_vars():
            p.grad = None
    else:
        import torch
        from parity_transformers import their_loss
        their_loss(model, ids, ids).backward()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            model.generate(torch.from_numpy(ids), max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)


def child_step(side: str, seqlen: int, repeat: int) -> dict:
    import numpy as np
    rng = np.random.default_rng(0)
    window = rng.integers(0, 256, (1, seqlen + 1))
    ids, targets = window[:, :-1], window[:, 1:]
    model = _pair(side)
    if side == "ours":
        from tinygrad_ssm.optim import AdamW
        opt = AdamW(model.varmap, lr=1e-3)

        def step():
            opt.zero_grad()
            model.loss(ids, targets).backward()
            opt.step()
    else:
        import torch
        from parity_transformers import their_loss
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            their_loss(model, ids, targets).backward()
            opt.step()
    warm_up(model, side)
    times = timeit(step, repeat=repeat, warmup=1)                       # glibc's defaults while timed (see below)
    fixed_mmap_threshold()                                              # then the memory of one more step
    return {"peak_bytes": _peak(step), **times}


def child_generate(side: str, new_tokens: int) -> dict:
    import numpy as np
    prompt = np.random.default_rng(0).integers(0, 256, (1, PROMPT))
    model = _pair(side)
    if side == "ours":
        run = lambda: model.generate(prompt, new_tokens, temperature=0)  # noqa: E731
    else:
        import torch
        def run():
            with torch.no_grad():
                model.generate(torch.from_numpy(prompt), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=0)
    fixed_mmap_threshold()                                              # nothing timed in this process
    warm_up(model, side)
    return {"peak_bytes": _peak(run)}


def _peak(fn) -> int:
    peak = peak_added_bytes(fn)
    if peak is None:
        raise SystemExit("bench_scaling measures peak memory through Linux's /proc/self/status (VmHWM) and "
                         "/proc/self/clear_refs, which this system does not allow")
    return peak


def _in_child(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--threads", str(THREADS), "--child", *map(str, args)],
                         capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    if out.returncode:
        raise RuntimeError(f"bench_scaling child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--quick", action="store_true", help="two lengths, one repeat: a smoke run")
    parser.add_argument("--json", default=None, help=json_help("bench_scaling"))
    parser.add_argument("--threads", type=_common.positive_int, default=2,
                        help="threads for numba, BLAS and torch on both sides [%(default)s]")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _common.apply_to_torch(THREADS)
    if args.child:
        kind, side, size, *rest = args.child
        result = child_step(side, int(size), int(rest[0])) if kind == "step" else child_generate(side, int(size))
        print(json.dumps(result))
        return
    import importlib.util
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        sides = ("ours", "transformers")
    else:
        sides = ("ours",)
        print("transformers is not installed (pip install -e '.[bench]'): our side only")
    lengths = LENGTHS[:2] if args.quick else LENGTHS
    generated = GENERATED[:2] if args.quick else GENERATED
    repeat = 1 if args.quick else 3
    step = {side: {} for side in sides}
    for seqlen in lengths:
        for side in sides:
            print(f"  step {side} l={seqlen} ...", flush=True)
            step[side][seqlen] = _in_child("step", side, seqlen, repeat)
    gen = {side: {} for side in sides}
    for n in generated:
        for side in sides:
            print(f"  generate {side} {n} tokens ...", flush=True)
            gen[side][n] = _in_child("generate", side, n)

    exponents = {side: fitted_exponent(lengths, [step[side][l]["median"] for l in lengths]) for side in sides}
    rows = []
    for seqlen in lengths:
        row = [seqlen]
        for side in sides:
            row += [step[side][seqlen]["median"], step[side][seqlen]["peak_bytes"] / 2**20]
        if len(sides) == 2:
            row.append(step["ours"][seqlen]["median"] / step["transformers"][seqlen]["median"])
        rows.append(row)
    columns = ["l"] + [f"{s} {what}" for s in sides for what in ("s/step", "peak MiB")]
    columns += ["time ratio"] if len(sides) == 2 else []
    gen_rows = [[n] + [gen[side][n]["peak_bytes"] / 2**20 for side in sides] for n in generated]
    plots = [
        {"file": "bench_scaling_step_time.png", "title": "Training step time vs sequence length (batch 1)",
         "xlabel": "sequence length", "ylabel": "seconds per step", "logx": True, "logy": True,
         "series": {s: [[l, step[s][l]["median"]] for l in lengths] for s in sides}},
        {"file": "bench_scaling_step_memory.png", "title": "Training step peak memory vs sequence length",
         "xlabel": "sequence length", "ylabel": "peak MiB above the model", "logx": True, "logy": True,
         "series": {s: [[l, step[s][l]["peak_bytes"] / 2**20] for l in lengths] for s in sides}},
        {"file": "bench_scaling_generation_memory.png", "title": "Generation peak memory vs generated tokens",
         "xlabel": "generated tokens", "ylabel": "peak MiB above the model", "logx": True, "logy": False,
         "series": {s: [[n, gen[s][n]["peak_bytes"] / 2**20] for n in generated] for s in sides}},
    ]
    notes = ["fitted exponent of step time in l: " + ", ".join(f"{s} {e:.2f}" for s, e in exponents.items())
             + " (1 = linear)",
             "peak MiB: the resident memory one step adds above the process's size before it (after a warm-up "
             "step, so the optimizer's moments are held already; VmHWM reset, freed heap trimmed, blocks over 1 MiB "
             "mapped on their own), each (side, l) in a fresh process",
             "generation peak MiB by generated tokens: " + "; ".join(
                 f"{s} " + ", ".join(f"{n}: {gen[s][n]['peak_bytes'] / 2**20:.1f}" for n in generated) for s in sides)]
    write_result(result_path(args.json, "bench_scaling", args.quick), "bench_scaling", f"Scaling with sequence length, float32, model {MODEL}", columns, rows,
                 notes=notes, plots=plots, step=step, generation=gen, exponents=exponents,
                 extra_tables=[{"title": "Generation (batch 1, greedy): peak memory against generated tokens",
                                "columns": ["generated tokens"] + [f"{s} peak MiB" for s in sides],
                                "rows": gen_rows}])


if __name__ == "__main__":
    main()
