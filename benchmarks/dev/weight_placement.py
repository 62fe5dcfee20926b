"""Where the weights lie in memory, and how fast decoding streams them: the model's large weights (2 MiB or more)
switched between placements in one process, the sides taking turns round after round (A, B, then B, A), greedy
decoding at batch 1 from a 16-token prompt. A round's step is generate(33 new) less generate(1 new) over 32:
the decoding steps alone.

    python benchmarks/dev/weight_placement.py                 # Mamba-2 130M's shape, 12 rounds
    python benchmarks/dev/weight_placement.py --quick         # a smoke run: a small model, 2 rounds

Placements, each a fresh copy of every large weight (so no side keeps the pages it was first given):
- plain: np.empty, where the allocator puts it (what VarMap gives a variable outside a reserved block). NumPy
  asks the kernel for huge pages over a large allocation, which covers only the whole 2 MiB pages inside it;
- aligned: each weight in a buffer of its own starting on a 2 MiB boundary, rounded up to whole 2 MiB pages,
  so all of it can be in huge pages (up to 2 MiB more memory per weight);
- packed: in_proj's matrices in one 2 MiB-aligned block, out_proj's in another, the rest aligned (a fused
  model's own placement since VarMap.reserve_block, for in_proj and out_proj).
Prints each round, then per placement the median over rounds of its step / plain's step (and their range).
docs/mamba2.md has what it measured. Writes JSON to --json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the private helpers
import _common as common  # noqa: E402  (first: the thread settings come before NumPy)
THREADS = common.threads_from_argv(default=2)

import numpy as np  # noqa: E402

from tinygrad_ssm.registry import HUGE_PAGE, huge_page_buffer as aligned_buffer  # noqa: E402  (what reserve_block uses)


def plain(arrays):
    return [np.array(a, copy=True) for a in arrays]


def aligned(arrays):
    out = []
    for a in arrays:
        b = aligned_buffer(a.nbytes).view(a.dtype).reshape(a.shape)
        b[...] = a
        out.append(b)
    return out


def packed(arrays, names):
    """in_proj's weights in one aligned block, out_proj's in another, the others aligned one by one."""
    out = dict(zip(names, aligned(arrays)))
    for kind in ("in_proj", "out_proj"):
        group = [(n, a) for n, a in zip(names, arrays) if f".{kind}." in n]
        if not group:
            continue
        block = aligned_buffer(sum(a.nbytes for _, a in group)).view(group[0][1].dtype)
        pos = 0
        for n, a in group:
            view = block[pos:pos + a.size].reshape(a.shape)
            view[...] = a
            out[n], pos = view, pos + a.size
    return [out[n] for n in names]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=common.positive_int, default=12)
    p.add_argument("--quick", action="store_true", help="a small model, 2 rounds")
    p.add_argument("--threads", type=common.positive_int, default=2, help="threads for numba and BLAS [2]")
    p.add_argument("--json", default=None, help=common.json_help("weight_placement"))
    args = p.parse_args(argv)
    config = common.QUICK_CONFIG if args.quick else common.SHAPE_130M
    rounds = 2 if args.quick else args.rounds
    model = common.ours(config, 64 if args.quick else 256)
    large = [(n, t) for n, t in model.varmap.named_vars() if t.data.nbytes >= (HUGE_PAGE if not args.quick else 0)]
    names, tensors = [n for n, _ in large], [t for _, t in large]
    originals = [t.data for t in tensors]
    sides = {"plain": plain(originals), "aligned": aligned(originals), "packed": packed(originals, names)}
    prompt = np.random.default_rng(1).integers(0, config["vocab_size"], (1, 16))
    new = 5 if args.quick else 33

    def step(arrays) -> float:
        for t, a in zip(tensors, arrays):
            t.data = a                                                  # the decoder takes the new arrays
        one = min(common.timed(lambda: model.generate(prompt, 1, temperature=0)) for _ in range(2))
        many = min(common.timed(lambda: model.generate(prompt, new, temperature=0)) for _ in range(2))
        return (many - one) / (new - 1)

    for arrays in sides.values():
        step(arrays)                                                    # warm-up: compiles, touches every page
    seconds = {name: [] for name in sides}
    order = list(sides)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            seconds[name].append(step(sides[name]))
        print(f"round {r + 1}: " + ", ".join(f"{n} {seconds[n][-1] * 1e3:.2f} ms" for n in order), flush=True)
    result = {"benchmark": "weight_placement", "config": config, "rounds": rounds, "threads": THREADS,
              "large_weights": len(tensors), "large_bytes": int(sum(a.nbytes for a in originals)),
              "step_s": seconds, "of_plain": {}}
    for name in order[1:]:
        ratios = [s / b for s, b in zip(seconds[name], seconds["plain"])]
        result["of_plain"][name] = {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios),
                                    "faster_rounds": int(sum(x < 1 for x in ratios))}
        print(f"{name} / plain: median {np.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}, "
              f"{sum(x < 1 for x in ratios)} of {rounds} faster)")
    common.dump_json(result, args.json or common.default_json("weight_placement" + ("_quick" if args.quick else "")))
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
