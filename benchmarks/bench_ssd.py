"""Forward+backward of the SSD scan: the reference backend, the numba kernels ("numba_chunked") and (when torch is
installed) a PyTorch chunked SSD (ssd_minimal's algorithm with autograd, the faster of chunk 64 and 256), float32.

    python benchmarks/bench_ssd.py            # b=2 l=4096 h=8 p=64 g=1 n=64, then l = 1024 .. 32768
    python benchmarks/bench_ssd.py --quick    # a smoke run: small shapes, 2 repeats

One run measures everything, so the ratios compare like with like on a loaded machine. Times are the median of
--repeats runs of forward then backward of sum(y * w) + sum(final_state * w'), each through its own autograd
(the engine's Tensors, or torch's). Peak memory is measured in a fresh subprocess per backend: the peak resident
set (VmHWM, reset through /proc/self/clear_refs) above the resident set once the inputs exist. GFLOP/s counts
the recurrence's nominal work, 16 b l h p n flops for forward+backward (forward: the state update and y_t = S_t
C_t, 2 p n each per head and step; backward three times that), beside the machine's float32 matmul (NumPy) rate
measured in the same run. Writes JSON to --json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import _common  # noqa: I001  (first: puts this clone on sys.path before the installed package)
THREADS = _common.threads_from_argv(default=2)  # every library's pool, before NumPy loads its BLAS
import numpy as np  # noqa: E402

import tinygrad_ssm as tg                                                           # noqa: E402
from tinygrad_ssm.scan import available_backends, ssd                           # noqa: E402
from _common import json_help, result_path, save_json                                                     # noqa: E402

try:
    import torch
except ImportError:
    torch = None

MAIN = dict(b=2, l=4096, h=8, p=64, g=1, n=64)


def make_inputs(b, l, h, p, g, n, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    return dict(x=rng.standard_normal((b, l, h, p)).astype(f), dt=rng.uniform(0.01, 0.2, (b, l, h)).astype(f),
                A=-rng.uniform(0.5, 4.0, h).astype(f), B=rng.standard_normal((b, l, g, n)).astype(f),
                C=rng.standard_normal((b, l, g, n)).astype(f), D=rng.standard_normal(h).astype(f))


def engine_step(backend, chunk):
    def step(inputs, w_y, w_state):
        tensors = {k: tg.Tensor(v, requires_grad=True) for k, v in inputs.items()}
        y, state = ssd(**tensors, chunk_size=chunk, backend=backend)
        ((y * w_y).sum() + (state * w_state).sum()).backward()
        return [t.grad.data for t in tensors.values()]
    return step


# --- PyTorch: ssd_minimal (github.com/state-spaces/mamba, ssd_minimal.py) with groups, under autograd ---------

def torch_segsum(a):
    T = a.size(-1)
    a = a[..., None].expand(*a.shape, T)                                 # (..., T, T): [i, j] = a[i]
    a = a.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), -1), 0)
    a_segsum = torch.cumsum(a, dim=-2)
    return a_segsum.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool), 0), -torch.inf)


def torch_ssd(x, dt, A, B, C, D, q):
    b, l, h, p = x.shape
    g, n = B.shape[2:]
    r, c = h // g, l // q
    X = (x * dt[..., None]).reshape(b, c, q, g, r, p)                   # (b, c, q, g, r, p)
    a = (dt * A).reshape(b, c, q, g, r).permute(0, 3, 4, 1, 2)          # (b, g, r, c, q)
    B, C = B.reshape(b, c, q, g, n), C.reshape(b, c, q, g, n)           # (b, c, q, g, n)
    a_cumsum = torch.cumsum(a, dim=-1)
    L = torch.exp(torch_segsum(a))                                       # (b, g, r, c, q, q)
    Y_diag = torch.einsum("bclgn,bcsgn,bgrcls,bcsgrp->bclgrp", C, B, L, X)
    decay_states = torch.exp(a_cumsum[..., -1:] - a_cumsum)
    states = torch.einsum("bclgn,bgrcl,bclgrp->bcgrpn", B, decay_states, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(torch_segsum(torch.nn.functional.pad(a_cumsum[..., -1], (1, 0))))
    new_states = torch.einsum("bgrzc,bcgrpn->bzgrpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    Y_off = torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", C, states, torch.exp(a_cumsum))
    y = (Y_diag + Y_off).reshape(b, l, h, p) + x * D[:, None]
    return y, final_state.reshape(b, h, p, n)


def torch_step(chunk):
    def step(inputs, w_y, w_state):
        tensors = {k: torch.from_numpy(v).requires_grad_() for k, v in inputs.items()}
        y, state = torch_ssd(**tensors, q=chunk)
        ((y * torch.from_numpy(w_y)).sum() + (state * torch.from_numpy(w_state)).sum()).backward()
        return [t.grad.numpy() for t in tensors.values()]
    return step


# the engine-op reference materialises a (q, q, p) product per chunk and head (its causal masking for NaNs,
# scan/reference.py): 5.7 GB above the inputs at the main shape, twice that at l = 8192; past it, not timed
REFERENCE_MAX_L = 8192


def steps(chunk_numba):
    out = {"reference": engine_step("reference", 64)}
    if "numba_chunked" in available_backends():                         # the chunked forward and backward
        out["numba_chunked"] = engine_step("numba_chunked", chunk_numba)
    if torch is not None:
        out["torch_chunk64"], out["torch_chunk256"] = torch_step(64), torch_step(256)
    return out


def median_time(step, inputs, weights, repeats):
    step(inputs, *weights)                                               # warm-up (numba: load or compile)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(inputs, *weights)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), times


def matmul_gflops(size=2048, repeats=5):
    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(repeats))
    return 2 * size ** 3 / best / 1e9


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _status_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def kernel_step(chunk):
    """The numba kernels alone on arrays, no engine: forward, then backward of given dy, d_final."""
    from tinygrad_ssm.scan import BACKENDS
    kernels = BACKENDS["numba_chunked"]

    def step(inputs, w_y, w_state):
        y, state, saved = kernels.forward(*[inputs[k] for k in ("x", "dt", "A", "B", "C", "D")], None, chunk)
        return [g for g in kernels.backward(saved, w_y, w_state) if g is not None]
    return step


def measure_memory_child(name, chunk_numba):
    """In a fresh process: peak resident set above the resident set with the inputs (and the output gradients
    w_y, w_state) in place, in bytes."""
    step = kernel_step(chunk_numba) if name == "numba_kernel" else steps(chunk_numba)[name]
    small = make_inputs(**{**MAIN, "l": 256})
    step(small, np.ones_like(small["x"]), np.ones((2, 8, 64, 64), np.float32))   # compile / load outside
    inputs = make_inputs(**MAIN)
    w_y, w_state = np.ones_like(inputs["x"]), np.ones((MAIN["b"], MAIN["h"], MAIN["p"], MAIN["n"]), np.float32)
    Path("/proc/self/clear_refs").write_text("5")                       # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    grads = step(inputs, w_y, w_state)
    peak = _status_kib("VmHWM")
    print(json.dumps(dict(extra_peak_bytes=(peak - before) * 1024, grads_bytes=sum(g.nbytes for g in grads))))


def measure_memory(name, chunk_numba):
    result = subprocess.run([sys.executable, __file__, "--memory-child", name, "--chunk", str(chunk_numba),
                             "--threads", str(THREADS)],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def profile_numba(shape, repeats, chunk):
    """The numba kernels ("numba_chunked") alone (no engine), one thread: the median seconds of the forward and
    of the backward."""
    import numba
    from tinygrad_ssm.scan import BACKENDS
    kernels = BACKENDS["numba_chunked"]
    inputs = make_inputs(**shape)
    args = [inputs[k] for k in ("x", "dt", "A", "B", "C", "D")]
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        y, state, saved = kernels.forward(*args, None, chunk)
        kernels.backward(saved, y, state)
        fwd, bwd = [], []
        for _ in range(repeats):
            fwd.append(_timed(lambda: kernels.forward(*args, None, chunk)))
            bwd.append(_timed(lambda: kernels.backward(saved, y, state)))
    finally:
        numba.set_num_threads(threads)
    return {"chunk": chunk, "forward_s": float(np.median(fwd)), "backward_s": float(np.median(bwd))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, help=json_help("bench_ssd"))
    parser.add_argument("--quick", action="store_true", help="smoke run: small shapes, 2 repeats, no memory")
    parser.add_argument("--repeats", type=_common.positive_int, default=5)
    parser.add_argument("--chunk", type=_common.positive_int, default=64,
                        help="numba's chunk (checkpoint interval) [%(default)s]")
    parser.add_argument("--threads", type=_common.positive_int, default=2,
                        help="threads for numba, BLAS and torch on every side [%(default)s]")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _common.apply_to_torch(THREADS)
    if args.memory_child:
        return measure_memory_child(args.memory_child, args.chunk)

    repeats = 2 if args.quick else args.repeats
    main_shape = dict(MAIN, l=512, h=2) if args.quick else MAIN
    lengths = [256, 512] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
    import numba
    report = dict(machine=dict(platform=platform.platform(), cpus=os.cpu_count(), numba_threads=numba.get_num_threads(),
                               torch_threads=torch.get_num_threads() if torch else None,
                               float32_matmul_gflops=matmul_gflops(1024 if args.quick else 2048)),
                  main_shape=main_shape, repeats=repeats, numba_chunk=args.chunk, flops_per_step="16 b l h p n")
    print(f"float32 matmul (NumPy, 2048^2): {report['machine']['float32_matmul_gflops']:.1f} GFLOP/s; "
          f"numba threads {report['machine']['numba_threads']}, torch threads {report['machine']['torch_threads']}")

    def run_shape(shape):
        inputs = make_inputs(**shape)
        rng = np.random.default_rng(1)
        weights = (rng.standard_normal(inputs["x"].shape).astype(np.float32),
                   rng.standard_normal((shape["b"], shape["h"], shape["p"], shape["n"])).astype(np.float32))
        flops = 16 * shape["b"] * shape["l"] * shape["h"] * shape["p"] * shape["n"]
        rows = {}
        for name, step in steps(args.chunk).items():
            if name == "reference" and shape["l"] > REFERENCE_MAX_L:
                continue
            median, times = median_time(step, inputs, weights, repeats)
            rows[name] = dict(median_s=median, times_s=times, gflops=flops / median / 1e9)
        if torch is not None:
            best = min(("torch_chunk64", "torch_chunk256"), key=lambda k: rows[k]["median_s"])
            rows["torch"] = dict(rows[best], chunk=int(best.rsplit("k", 1)[1]))
            for row in rows.values():
                row["ratio_to_torch"] = row["median_s"] / rows["torch"]["median_s"]
        return rows

    print(f"\nmain shape {main_shape}, float32, forward+backward, median of {repeats}")
    report["main"] = run_shape(main_shape)
    print(f"{'backend':>16} {'median s':>9} {'/ torch':>8} {'GFLOP/s':>8}")
    for name, row in report["main"].items():
        print(f"{name:>16} {row['median_s']:9.4f} {row.get('ratio_to_torch', float('nan')):8.2f} {row['gflops']:8.2f}")

    report["numba_profile_one_thread"] = prof = profile_numba(main_shape, repeats, args.chunk)
    print(f"numba kernels alone, one thread, median s: forward {prof['forward_s']:.4f}, "
          f"backward {prof['backward_s']:.4f} (chunk {prof['chunk']})")

    if not args.quick:
        inputs_bytes = sum(v.nbytes for v in make_inputs(**MAIN).values())
        outputs_bytes = 4 * MAIN["b"] * MAIN["h"] * (MAIN["l"] * MAIN["p"] + MAIN["p"] * MAIN["n"])
        io_bytes = 2 * inputs_bytes + 2 * outputs_bytes      # inputs, outputs, their gradients (dy, d_final, dx, ...)
        report["memory"] = dict(inputs_bytes=inputs_bytes, outputs_bytes=outputs_bytes, io_bytes=io_bytes)
        print(f"\npeak memory, main shape: inputs {inputs_bytes / 2**20:.1f} MiB, outputs {outputs_bytes / 2**20:.1f} "
              f"MiB; io = inputs + outputs + the gradients of both = {io_bytes / 2**20:.1f} MiB")
        print(f"{'':>16} {'peak above inputs':>18} {'peak / io':>10}")
        kernel = ["numba_kernel"] if "numba_chunked" in report["main"] else []
        for name in [n for n in report["main"] if n != "torch"] + kernel:
            mem = measure_memory(name, args.chunk)
            mem["peak_over_io"] = (inputs_bytes + outputs_bytes + mem["extra_peak_bytes"]) / io_bytes
            report["memory"][name] = mem
            print(f"{name:>16} {mem['extra_peak_bytes'] / 2**20:14.1f} MiB {mem['peak_over_io']:10.2f}")
        print("(the engine rows include the loss sum(y * w) + sum(state * w'): its product and dy, "
              f"{2 * outputs_bytes / 2**20:.0f} MiB; numba_kernel is the kernels alone with dy given)")

    print(f"\nscaling in l (b, h, p, g, n of the main shape), median seconds; the reference up to l = "
          f"{REFERENCE_MAX_L} (its memory, linear in l: ~5.7 GB at 4,096)")
    report["scaling"] = {}
    for l in lengths:
        report["scaling"][l] = run_shape(dict(main_shape, l=l))
        print(f"l={l:>6} " + "  ".join(f"{k} {v['median_s']:.4f}" for k, v in report["scaling"][l].items()
                                       if not k.startswith("torch_")))
    report["fitted_exponent"] = {}
    for name in report["scaling"][lengths[0]]:
        ran = [l for l in lengths if name in report["scaling"][l]]        # the reference stops at REFERENCE_MAX_L
        report["fitted_exponent"][name] = float(np.polyfit(np.log(ran), np.log(
            [report["scaling"][l][name]["median_s"] for l in ran]), 1)[0])
    print("fitted exponent of time ~ l^k: " + ", ".join(f"{k} {v:.2f}" for k, v in report["fitted_exponent"].items()))

    path = result_path(args.json, "bench_ssd", args.quick)
    save_json(path, report)
    if path != "-":
        print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
