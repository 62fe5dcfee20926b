"""tinygrad_ssm against llama.cpp at the shape of Mamba-2 130M (issue 23): the same random weights on both
sides, 2 threads each, float32 and 8-bit weights (ours int8, a float32 scale per 32 weights; llama.cpp's Q8_0,
a float16 scale per 32). llama.cpp is the fastest CPU engine for Mamba-2; it is not a dependency of the package
or of this script: bring your own build of it (its llama-bench tool) and convert the weights with its own script.

    python benchmarks/bench_llama_cpp.py --export DIR      # writes DIR: the weights in mamba_ssm's layout
    # in your llama.cpp checkout, with its gguf-py importable:
    python convert_hf_to_gguf.py DIR --outtype f32  --outfile DIR/f32.gguf
    python convert_hf_to_gguf.py DIR --outtype q8_0 --outfile DIR/q8_0.gguf
    python benchmarks/bench_llama_cpp.py --model DIR --llama-bench PATH_TO/llama-bench

Rows, as llama-bench names its tests (median, min and max of --repeats rounds; in each round llama-bench runs
once per weight format, `-r 1`, after its own warm-up run, and our side runs beside it):
- tg32: 32 tokens decoded one at a time after a one-token context. Ours: model.generate(one token, 32,
  temperature=0): the whole call, prefill and greedy sampling included;
- pp512: a 512-token prompt to the last position's logits. Ours: model.generate(prompt, 1, temperature=0).
The GGUF files hold the weights of DIR: both sides compute from the same numbers (convert_hf_to_gguf copies the
float32 weights, and quantizes them for Q8_0 as we do for int8, per block of 32).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import _common as common

THREADS = common.threads_from_argv(default=2)

import numpy as np

from tinygrad_ssm import Mamba2LMHeadModel

NAME = "bench_llama_cpp"
TESTS = {"tg32": "decode 32 tokens, b=1", "pp512": "prompt 512 tokens, b=1"}
FORMATS = {"f32": ("float32", "f32.gguf"), "int8": ("int8 / Q8_0", "q8_0.gguf")}


def export(directory: str) -> None:
    """The benchmark's weights (bench_pretrained_shape's model: 130M shape, seed 0) in mamba_ssm's layout."""
    from bench_pretrained_shape import SHAPE
    model = common.ours(SHAPE, chunk_size=256)
    model.save_pretrained(directory)
    print(f"wrote {directory} ({model}); now convert it with llama.cpp's script, in its checkout, once per format:")
    for _, (_, gguf) in FORMATS.items():
        outtype = gguf.split(".")[0]
        print(f"  python convert_hf_to_gguf.py {directory} --outtype {outtype} --outfile {Path(directory) / gguf}")


def llama_bench(binary: str, ggufs: list, threads: int) -> tuple:
    """One llama-bench run per GGUF (`-r 1`, after its warm-up): ({(gguf, "tg32" | "pp512"): seconds}, the
    build it reports)."""
    done = subprocess.run([binary, *[a for g in ggufs for a in ("-m", str(g))], "-t", str(threads), "-p", "512",
                           "-n", "32", "-r", "1", "-o", "json"], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{NAME}: {binary} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    seconds, build = {}, None
    for test in json.loads(done.stdout):
        name = "pp512" if test["n_prompt"] else "tg32"
        seconds[(Path(test["model_filename"]).name, name)] = test["avg_ns"] / 1e9
        build = f"commit {test['build_commit']} (build {test['build_number']}), backend {test['backends']}"
    return seconds, build


def our_runs(model) -> dict:
    vocab = model.config.vocab_size
    one = np.random.default_rng(1).integers(0, vocab, (1, 1))                       # (1, 1)
    prompt = np.random.default_rng(512).integers(0, vocab, (1, 512))               # (1, 512)
    return {"tg32": lambda: model.generate(one, 32, temperature=0),
            "pp512": lambda: model.generate(prompt, 1, temperature=0)}


def main(argv=None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export", metavar="DIR", help="write the benchmark's weights into DIR and stop")
    p.add_argument("--model", metavar="DIR", help="the folder --export wrote, with f32.gguf and q8_0.gguf in it")
    p.add_argument("--llama-bench", metavar="PATH", help="llama.cpp's llama-bench binary")
    p.add_argument("--repeats", type=common.positive_int, default=5, help="rounds [%(default)s]")
    p.add_argument("--threads", type=common.positive_int, default=2, help="threads on both sides [2]")
    p.add_argument("--json", default=common.default_json(NAME), help="where the JSON goes [%(default)s]")
    args = p.parse_args(argv)
    if args.export:
        return export(args.export)
    if not (args.model and args.llama_bench):
        p.error("give --export DIR, or --model DIR and --llama-bench PATH (see the usage above)")
    folder = Path(args.model)
    ggufs = {fmt: folder / gguf for fmt, (_, gguf) in FORMATS.items()}
    missing = [str(g) for g in ggufs.values() if not g.is_file()]
    if missing:
        raise SystemExit(f"{NAME}: missing {', '.join(missing)}: convert {folder} with llama.cpp's "
                         "convert_hf_to_gguf.py first (see the usage: python benchmarks/bench_llama_cpp.py -h)")
    if not (folder / "config.json").is_file():                          # (our side loads the same weights)
        raise SystemExit(f"{NAME}: --model {str(folder)!r} holds no config.json: give the folder --export wrote, "
                         f"into which the GGUF files were converted")
    binary = shutil.which(args.llama_bench)                             # checked before minutes of our side's work
    if binary is None or not os.access(binary, os.X_OK):
        raise SystemExit(f"{NAME}: --llama-bench {args.llama_bench!r} is not an executable file: build llama.cpp "
                         f"(its llama-bench; how: docs/benchmarks.md) and give the binary's path")
    ours = {"f32": Mamba2LMHeadModel.from_pretrained(folder),
            "int8": Mamba2LMHeadModel.from_pretrained(folder).quantize("int8")}
    runs = {fmt: our_runs(model) for fmt, model in ours.items()}
    for fmt in runs:                                                   # compiles, warms the caches
        for run in runs[fmt].values():
            run()
    times = {(side, fmt, test): [] for side in ("ours", "llama.cpp") for fmt in FORMATS for test in TESTS}
    build = None
    for round_ in range(args.repeats):
        theirs, build = llama_bench(binary, list(ggufs.values()), args.threads or 2)
        for fmt, gguf in ggufs.items():
            for test in TESTS:
                times[("llama.cpp", fmt, test)].append(theirs[(gguf.name, test)])
                times[("ours", fmt, test)].append(common.timed(runs[fmt][test]))
        print(f"round {round_ + 1}/{args.repeats} done", flush=True)

    tokens = {"tg32": 32, "pp512": 512}
    rows, results = [], []
    for fmt, (label, _) in FORMATS.items():
        for test, what in TESTS.items():
            ours_s, theirs_s = (np.median(times[(side, fmt, test)]) for side in ("ours", "llama.cpp"))
            ratio = float(np.median([t / o for o, t in zip(times[("ours", fmt, test)], times[("llama.cpp", fmt, test)])]))
            row = {"test": test, "what": what, "weights": label,
                   "ours_tokens_per_s": round(tokens[test] / ours_s, 1),
                   "llama_cpp_tokens_per_s": round(tokens[test] / theirs_s, 1), "x_llama_cpp": round(ratio, 2),
                   "ours": common.stats(times[("ours", fmt, test)]),
                   "llama_cpp": common.stats(times[("llama.cpp", fmt, test)])}
            results.append(row)
            rows.append([test, what, label, row["ours_tokens_per_s"], row["llama_cpp_tokens_per_s"], row["x_llama_cpp"]])
    notes = [f"x llama.cpp: the median over rounds of llama.cpp's time over ours in the same round (> 1: ours is "
             f"faster); {args.repeats} rounds, {args.threads} threads on each side",
             "ours: tg32 is model.generate(1 token, 32, temperature=0), the whole call; pp512 is "
             "model.generate(512-token prompt, 1, temperature=0), the whole call",
             f"llama.cpp: llama-bench -t {args.threads} -p 512 -n 32 -r 1, once per round (after its warm-up run), "
             f"its avg_ns; llama.cpp {build}"]
    title = (f"Mamba-2 130M's shape ({ours['f32'].varmap.num_parameters():,} parameters, the same random weights), "
             f"tinygrad_ssm against llama.cpp's llama-bench, median of {args.repeats} rounds")
    return common.write_result(args.json, NAME, title,
                               ["test", "what", "weights", "ours tokens/s", "llama.cpp tokens/s", "x llama.cpp"],
                               rows, notes=notes, results=results, threads=args.threads)


if __name__ == "__main__":
    sys.exit(main() and 0)
