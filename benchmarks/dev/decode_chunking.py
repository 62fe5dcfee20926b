"""How the numba decoder cuts its projections into claimed chunks, and how fast it decodes with each cutting:
decode.CHUNK_BYTES (the small chunks' weights) and decode.BIG_SHARE (the two big chunks' share of the rows)
switched between calls in one process, the settings taking turns round after round (in order, then reversed),
each round beside a read of a 1 GiB array (the machine's read bandwidth at that moment). Greedy decoding from a
one-token prompt: a round's step is generate(N new) less generate(1 new) (the prompt's step, which gives the
first token), over the N - 1 steps left (N = 33, or --new-tokens: more for a small model, whose 33 tokens take
~7 ms).

    python benchmarks/dev/decode_chunking.py                            # 130M's shape, batch 1, 16 and 128 KB
    python benchmarks/dev/decode_chunking.py --batch 8 --chunk-kb 16 64 128 --shares 0.48 0.44
    python benchmarks/dev/decode_chunking.py --shape small --new-tokens 257   # bench_generate's 1.8M model
    python benchmarks/dev/decode_chunking.py --quick                    # a smoke run: small model, 2 rounds

Prints each round (the probe's GB/s, then every setting's ms a step), then per setting the median over rounds of
its step / the first setting's step, split into the rounds whose probe read over FAST_GB_S and the rest (the
shared machine flips between ~35 and ~60 GB/s; a decoder's share of the probe differs between the two), and
the share of the limit (batch x probe bandwidth / the bytes of weights a step reads). docs/mamba2.md has what it
measured. Writes JSON to --json.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the private helpers
import _common as common  # noqa: E402  (first: the thread settings come before NumPy)
THREADS = common.threads_from_argv(default=2)

import numpy as np  # noqa: E402
from bench_pretrained_shape import _sum, weight_bytes_per_step  # noqa: E402

from tinygrad_ssm.models.mamba2 import decode  # noqa: E402

FAST_GB_S = 50.0


def settings_of(chunk_kb: list, shares: list) -> list:
    return [{"CHUNK_BYTES": kb << 10, "BIG_SHARE": share} for share, kb in itertools.product(shares, chunk_kb)]


def step_seconds(model, ids, setting: dict, new_tokens: int) -> float:
    """Seconds a decoding step with this chunking (the decoder's weights rebuilt: the chunk rows are theirs)."""
    for name, value in setting.items():
        setattr(decode, name, value)
    model.__dict__.pop("_decode_weights", None)
    return (common.timed(lambda: model.generate(ids, new_tokens, temperature=0)) -
            common.timed(lambda: model.generate(ids, 1, temperature=0))) / (new_tokens - 1)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("130m", "small"), default="130m")
    p.add_argument("--batch", type=common.positive_int, default=1)
    p.add_argument("--chunk-kb", type=common.positive_int, nargs="+", default=[16, 128],
                   help="CHUNK_BYTES in KB [16 128]")
    p.add_argument("--shares", type=float, nargs="+", default=[decode.BIG_SHARE], help="BIG_SHARE values")
    p.add_argument("--rounds", type=common.positive_int, default=40)
    p.add_argument("--new-tokens", type=common.positive_int, default=33, help="tokens a timed generate makes [33]")
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--quick", action="store_true", help="the small model, 2 rounds: a smoke run")
    p.add_argument("--json", default=None, help=common.json_help("decode_chunking"))
    args = p.parse_args(argv)
    shape, rounds = ("small", 2) if args.quick else (args.shape, args.rounds)
    model = common.ours(common.SHAPE_130M, 256) if shape == "130m" else common.ours(common.CONFIG, 64, fused=True)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, (args.batch, 1))   # (b, 1)
    weights = weight_bytes_per_step(model)
    probe = np.ones((2**28 if not args.quick else 2**22), np.float32)  # 1 GiB (16 MiB for --quick), resident
    _sum(probe)
    settings = settings_of(args.chunk_kb, args.shares)
    kept = {name: getattr(decode, name) for name in settings[0]}
    try:
        for setting in settings:                                        # warm-ups (the first compiles)
            step_seconds(model, ids, setting, args.new_tokens)
        steps, read = np.zeros((rounds, len(settings))), np.zeros(rounds)
        for r in range(rounds):
            read[r] = probe.nbytes / min(common.timed(lambda: _sum(probe)) for _ in range(2))
            for i in (range(len(settings)) if r % 2 == 0 else reversed(range(len(settings)))):
                steps[r, i] = step_seconds(model, ids, settings[i], args.new_tokens)
            print(f"round {r + 1:3d}: probe {read[r] / 1e9:5.1f} GB/s | " +
                  " ".join(f"{s * 1e3:7.3f}" for s in steps[r]) + " ms", flush=True)
    finally:
        for name, value in kept.items():
            setattr(decode, name, value)
        model.__dict__.pop("_decode_weights", None)
    result = {"benchmark": "decode_chunking", "shape": shape, "batch": args.batch, "threads": THREADS,
              "rounds": rounds, "weight_bytes": weights, "probe_gb_s": (read / 1e9).round(1).tolist(), "settings": []}
    groups = {"all": np.ones(rounds, bool), "fast": read > FAST_GB_S * 1e9, "slow": read <= FAST_GB_S * 1e9}
    print(f"{shape}, batch {args.batch}, {rounds} rounds; step / the first setting's step (median over rounds), "
          f"of the limit; fast rounds: probe over {FAST_GB_S:g} GB/s")
    for i, setting in enumerate(settings):
        row = {**setting}
        for group, chosen in groups.items():
            if chosen.any():
                row[group] = {"rounds": int(chosen.sum()),
                              "median_step_ms": round(float(np.median(steps[chosen, i])) * 1e3, 3),
                              "step_ratio": round(float(np.median(steps[chosen, i] / steps[chosen, 0])), 3),
                              "of_limit": round(float(np.median(args.batch * weights / steps[chosen, i] / read[chosen])), 3)}
        result["settings"].append(row)
        print(f"  CHUNK_BYTES {setting['CHUNK_BYTES'] >> 10:5d} KB, BIG_SHARE {setting['BIG_SHARE']:.2f}: " +
              "; ".join(f"{g} ({v['rounds']}) {v['step_ratio']:.3f}x, {v['of_limit']:.3f} of the limit"
                        for g, v in row.items() if isinstance(v, dict)))
    common.dump_json(result, args.json or common.default_json("decode_chunking" + "_quick" * args.quick))
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
