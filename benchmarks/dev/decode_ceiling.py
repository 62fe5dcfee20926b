"""How close batch-1 decoding can come to the bandwidth limit on this machine with the numba decoder's own kernels:
the decoder's weight arrays streamed by its product kernel (decode_kernels.weight_rows) and its cache's SSM
states updated by its state kernel (_update_heads2), each thread taking the same half of every projection, of
the heads and of the LM head with no phases at all (it never waits for the other thread, so nothing of the
step's order is kept: the outputs are not a model's, only the memory traffic and the arithmetic are a step's).
Beside it, in the same rounds: the decoder's real step (from a one-token prompt, generate(N new) less
generate(1 new), over the N - 1 steps left) and a read of a 1 GiB array (the probe of bench_pretrained_shape.py,
whose limit this is: the bytes of weights a step reads / the probe's bandwidth). The phase-free passes are timed
as the decoder's steps run, N - 1 of them in a row over the same arrays.

    python benchmarks/dev/decode_ceiling.py                 # Mamba-2 130M's shape, 2 threads, 15 rounds
    python benchmarks/dev/decode_ceiling.py --quick         # the small model, 2 rounds: a smoke run

Rows: a plain read of the same weights (each thread sums its half of every matrix, in the step's order, and does
nothing else: no decoder can read them faster), the phase-free weights alone, the phase-free weights and states,
the decoder's step; each as ms a step and as a share of the limit (the median over rounds of each round's ratio to that round's probe). The
phase-free step with states is what a decoder built of these kernels can reach here: the phases, the norms,
the conv and the claims of the real step are the difference. docs/mamba2.md has what it measured.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the private helpers
import _common as common  # noqa: E402  (first: the thread settings come before NumPy)
THREADS = common.threads_from_argv(default=2)

import numpy as np  # noqa: E402
from bench_pretrained_shape import _sum, weight_bytes_per_step  # noqa: E402
from numba import njit, prange  # noqa: E402

from tinygrad_ssm.fast.decode_kernels import _JIT, _update_heads2, weight_rows  # noqa: E402
from tinygrad_ssm.fast.typed_lists import array_list  # noqa: E402
from tinygrad_ssm.models.mamba2 import decode  # noqa: E402


@njit(parallel=True, **_JIT)
def phase_free_step(in_w, out_w, head, in_b, out_b, head_b, ssms, with_states, u, y, proj, delta, logits, coef):
    """Thread t of 2 streams rows [t n / 2, (t + 1) n / 2) of every projection and (with_states) updates heads
    [t h / 2, (t + 1) h / 2) of every layer's state (1, h, p, n), two at a time, with made-up inputs (decay
    coef[0] < 1: the states stay bounded)."""
    zero = u.dtype.type(0)
    for t in prange(2):
        for layer in range(len(in_w)):
            w = in_w[layer]                                             # (d_in_proj, d_model)
            weight_rows(w, t * w.shape[0] // 2, (t + 1) * w.shape[0] // 2, u, in_b[layer], zero, proj)
            if with_states:
                s = ssms[layer][0]                                      # (h, p, n)
                p, n = s.shape[1], s.shape[2]
                for hi in range(t * s.shape[0] // 2, (t + 1) * s.shape[0] // 2, 2):
                    x = proj[0, hi * p:(hi + 2) * p]                    # (2 p,) made up: in_proj's first rows
                    B, C = u[0, :n], u[0, n:2 * n]                      # (n,) made up: the normed input
                    _update_heads2(s[hi], s[hi + 1], x, B, C, B, C, coef, coef[1], coef[3], y[0, hi * p:(hi + 2) * p])
            w = out_w[layer]                                            # (d_model, d_inner)
            weight_rows(w, t * w.shape[0] // 2, (t + 1) * w.shape[0] // 2, y, out_b[layer], zero, delta)
        weight_rows(head, t * head.shape[0] // 2, (t + 1) * head.shape[0] // 2, u, head_b, zero, logits)


@njit(parallel=True, **_JIT)
def plain_read(in_w, out_w, head):
    """Thread t of 2 sums rows [t n / 2, (t + 1) n / 2) of every projection and of the LM head, in the decoder's
    order, with nothing else to do: the fastest these weights can be read here, whatever a kernel does with them."""
    total = np.zeros(2, head.dtype)
    for t in prange(2):
        acc = head.dtype.type(0)
        for layer in range(len(in_w)):
            for w in (in_w[layer], out_w[layer]):
                flat = w[t * w.shape[0] // 2:(t + 1) * w.shape[0] // 2].ravel()
                for i in range(flat.size):
                    acc += flat[i]
        flat = head[t * head.shape[0] // 2:(t + 1) * head.shape[0] // 2].ravel()
        for i in range(flat.size):
            acc += flat[i]
        total[t] = acc
    return total


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=common.positive_int, default=15)
    p.add_argument("--new-tokens", type=common.positive_int, default=33, help="tokens a timed generate makes [33]")
    p.add_argument("--threads", type=common.positive_int, default=2,
                   help="2: the phase-free step is written for two threads")
    p.add_argument("--quick", action="store_true", help="the small model, 2 rounds: a smoke run")
    p.add_argument("--json", default=None, help=common.json_help("decode_ceiling"))
    args = p.parse_args(argv)
    if THREADS != 2:
        p.error(f"--threads must be 2 (the phase-free step splits the work in two halves), got {THREADS}")
    model = common.ours(common.CONFIG, 64, fused=True) if args.quick else common.ours(common.SHAPE_130M, 256)
    rounds = 2 if args.quick else args.rounds
    c, dtype = model.config, model.dtype
    if c.nheads % 4:
        p.error(f"the model's nheads ({c.nheads}) must be a multiple of 4: two threads take heads two at a time")
    ids = np.random.default_rng(1).integers(0, c.vocab_size, (1, 1))   # (1, 1) a one-token prompt
    model.generate(ids, 2, temperature=0)                               # compiles; builds the decoder's weights
    w = decode._weights(model)
    in_w, out_w, _ = w.mats
    _, in_b, _, _, _, _, _, out_b, head_b = w.vecs
    cache = model.allocate_cache(1)
    ssms = array_list([state.ssm.data for state in cache.layers])      # (1, h, p, n) each
    rng = np.random.default_rng(0)
    u = (rng.standard_normal((1, c.d_model)) * 0.1).astype(dtype)      # (1, d_model)
    y = np.zeros((1, c.d_inner), dtype)
    proj, delta = np.zeros((1, c.d_in_proj), dtype), np.zeros((1, c.d_model), dtype)
    logits = np.zeros((1, w.head.shape[0]), dtype)
    coef = np.array([0.9, 0.01, 0.9, 0.01], dtype)                      # decay, dt of two heads

    def phase_free(with_states):
        """Seconds a pass, over as many passes in a row as the decoder's timed steps (its steps, too, follow
        one another over the same arrays: what the last one left in L3 is there for the next)."""
        passes = args.new_tokens - 1
        return lambda: common.timed(lambda: [phase_free_step(in_w, out_w, w.head, in_b, out_b, head_b, ssms,
                                                             with_states, u, y, proj, delta, logits, coef)
                                             for _ in range(passes)]) / passes

    def plain():
        """Seconds a plain read of the weights, over as many reads in a row as the decoder's timed steps."""
        passes = args.new_tokens - 1
        return common.timed(lambda: [plain_read(in_w, out_w, w.head) for _ in range(passes)]) / passes

    def decoder_step():
        """Seconds a step: generate(N new tokens) runs N steps (the prompt's, which gives the first token, and
        N - 1 more); less generate(1 new token), the prompt's step alone, that leaves the N - 1."""
        n = args.new_tokens
        return (common.timed(lambda: model.generate(ids, n, temperature=0)) -
                common.timed(lambda: model.generate(ids, 1, temperature=0))) / (n - 1)

    weights = weight_bytes_per_step(model)
    probe = np.ones((2**28 if not args.quick else 2**22), np.float32)  # 1 GiB (16 MiB for --quick), resident
    _sum(probe)
    sides = {"plain read: weights": plain,
             "phase-free: weights": phase_free(False),
             "phase-free: weights + states": phase_free(True),
             "the decoder's step": decoder_step}
    for side in sides.values():                                         # warm-ups (phase_free_step compiles)
        side()
    times, read = {name: np.zeros(rounds) for name in sides}, np.zeros(rounds)
    for r in range(rounds):
        read[r] = probe.nbytes / min(common.timed(lambda: _sum(probe)) for _ in range(2))
        for name in (list(sides) if r % 2 == 0 else reversed(list(sides))):
            times[name][r] = sides[name]()
        print(f"round {r + 1:3d}: probe {read[r] / 1e9:5.1f} GB/s | " +
              " ".join(f"{times[name][r] * 1e3:7.2f}" for name in sides) + " ms", flush=True)
    limit_s = weights / read                                            # (rounds,) the limit's step
    result = {"benchmark": "decode_ceiling", "config": common.SHAPE_130M if not args.quick else common.CONFIG,
              "threads": THREADS, "rounds": rounds, "weight_bytes": weights,
              "probe_gb_s": (read / 1e9).round(1).tolist(),
              "limit_step_ms": round(float(np.median(limit_s)) * 1e3, 2), "rows": []}
    print(f"{weights / 1e6:.0f} MB of weights a step; the limit's step {result['limit_step_ms']:.2f} ms at the "
          f"probe's median {np.median(read) / 1e9:.1f} GB/s ({rounds} rounds)")
    print(f"  {'':32s} {'ms a step':>10s} {'of limit':>9s} {'range':>13s}")
    for name, t in times.items():
        share = limit_s / t
        row = {"what": name, "median_step_ms": round(float(np.median(t)) * 1e3, 2),
               "of_limit": round(float(np.median(share)), 3),
               "of_limit_min": round(float(share.min()), 3), "of_limit_max": round(float(share.max()), 3)}
        result["rows"].append(row)
        print(f"  {name:32s} {row['median_step_ms']:10.2f} {row['of_limit']:9.3f} "
              f"{row['of_limit_min']:6.3f}-{row['of_limit_max']:.3f}")
    common.dump_json(result, args.json or common.default_json("decode_ceiling" + "_quick" * args.quick))
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
