"""Where a generated token's time goes in the numba decoder (tinygrad_ssm/models/mamba2/decode.py): the caller's
thread's cycles in each phase of a step (a phase ends when all its chunks are done, by either thread), and the
rest of the wall time per step (Python: sampling, checks, the call itself). bench_generate.py's model and run.

    python benchmarks/profile_decode.py                     # batch 1 and 8, 16-token prompt, 256 new tokens
    python benchmarks/profile_decode.py --threads 1         # the caller's thread alone (no helper)
    python benchmarks/profile_decode.py --shape 130m --batches 1   # Mamba-2 130M's shape (bench_pretrained_shape's)

Cycles are converted with the cycle counter's rate measured against perf_counter over the run.
"""
from __future__ import annotations

import argparse
import sys
import time

import _common as common  # noqa: I001  (no NumPy: threads_from_argv must come first)
THREADS = common.threads_from_argv()

import numpy as np  # noqa: E402

from tinygrad_ssm.models.mamba2 import decode, generation  # noqa: E402
from numba import njit  # noqa: E402
from tinygrad_ssm.fast.claims import cycles as _cycles  # noqa: E402

cycles = njit(lambda: _cycles())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("small", "130m"), default="small",
                   help="bench_generate's model, or bench_pretrained_shape's (Mamba-2 130M's shape) [small]")
    p.add_argument("--batches", type=common.positive_int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=common.positive_int, default=16)
    p.add_argument("--new-tokens", type=common.positive_int, default=256)
    p.add_argument("--repeats", type=common.positive_int, default=5)
    p.add_argument("--threads", type=common.positive_int, default=None,
                   help="NUMBA_NUM_THREADS (2: the caller and one helper)")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-", help="write the results as JSON (- = stdout)")
    args = p.parse_args(argv)
    if args.shape == "130m":
        config = common.SHAPE_130M
        model = common.ours(config, 256)
    else:
        config = common.CONFIG
        model = common.ours(config, 64, fused=True)
    result = {"benchmark": "profile_decode", "config": config, "rows": {}}
    for batch in args.batches:
        prompt = np.random.default_rng(batch).integers(0, config["vocab_size"], (batch, args.prompt_len))
        model.generate(prompt, args.new_tokens, temperature=0)              # warm-up (compiles)
        prof = decode.PROFILE = np.zeros(len(decode.PROFILE_PHASES), np.int64)
        # decoder steps: new_tokens - 1, and the prompt's when it is one step of all its tokens (a longer prompt
        # goes through the chunked scan, outside the decoder)
        steps = args.repeats * (args.new_tokens - 1 + generation.prompt_in_one_step(model, prompt))
        c0, t0, cpu0 = cycles(), time.perf_counter(), time.process_time()
        for _ in range(args.repeats):
            model.generate(prompt, args.new_tokens, temperature=0)
        c1, t1, cpu1 = cycles(), time.perf_counter(), time.process_time()
        decode.PROFILE = None
        rate = (c1 - c0) / (t1 - t0)                                    # cycles per second
        per_step = {name: prof[i] / rate / steps * 1e6 for i, name in enumerate(decode.PROFILE_PHASES)}
        wall = (t1 - t0) / steps * 1e6
        per_step["the rest (Python, sampling, calls)"] = wall - sum(per_step.values())
        result["rows"][f"batch {batch}"] = {"us_per_step": {k: round(v, 1) for k, v in per_step.items()},
                                            "wall_us_per_step": round(wall, 1),
                                            "cores_busy": round((cpu1 - cpu0) / (t1 - t0), 2)}
        print(f"batch {batch}: {wall:.0f} us per step ({steps} steps, {args.repeats} generations), "
              f"{(cpu1 - cpu0) / (t1 - t0):.2f} cores busy")
        for name, us in per_step.items():
            print(f"  {name:36s} {us:7.1f} us  {us / wall:6.1%}")
    if args.json:
        common.dump_json(result, args.json)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
