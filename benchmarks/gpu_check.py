"""The "cuda" backend on a real GPU: correctness against the CPU backend, then speed beside PyTorch.

    python benchmarks/gpu_check.py                       # on a machine with an NVIDIA GPU
    python benchmarks/gpu_check.py --json gpu_check.json # also write the results as JSON
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu_check.py --tiny   # correctness only, on numba-cuda's simulator

1. Correctness, float32 and float64: forward (y, final state) and every gradient of backend "cuda" against the
   best other backend available here (numba on the CPU when installed, else the engine-op reference), on a
   shape with several chunks and a short last one, g = 2, initial_state and D, under mild and under strong decay
   (DECAYS). float64 must agree to 1e-10, float32 to 1e-4 (both relative to the largest value).
2. Speed (not with --tiny): forward, and forward + backward, at b=8, l=8192, h=24, p=64, n=128 (g=1, chunk 256),
   float32 and float64 under mild decay and float32 under strong decay (every chunk of kernel 7 the exact way: what
   that costs), with the arrays already on the GPU (copies are not timed: the backend's NumPy interface
   copies every call, `forward_device` / `backward_device` do not), beside a PyTorch CUDA chunked SSD written
   here (ssd_minimal's algorithm; autograd for its backward). Best of --repeats, time.perf_counter around a
   cuda.synchronize(), after a warm-up call (which compiles). Bandwidth: the bytes the op must move at least
   (inputs read, outputs written once) over the time; FLOP/s: the kernels' own operation count (forward 8, backward
   18 per (b, l, h, p, n) element: see docs/kernels.md) over the time.
Without a GPU (and without --tiny under the simulator) it stops with an error that says so.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import _common  # noqa: I001  (first: puts this clone on sys.path before the installed package)
import numpy as np

import tinygrad_ssm as tg
from _common import machine, save_json
from tinygrad_ssm.scan import BACKENDS, SSD, available_backends, cuda as numba_cuda, ssd

TIMED_SHAPE = dict(b=8, l=8192, h=24, p=64, g=1, n=128)
CHECK_SHAPE = dict(b=2, l=600, h=4, p=32, g=2, n=64)
TINY_SHAPE = dict(b=1, l=11, h=4, p=3, g=2, n=5)


# dt and -A drawn from: "mild" decay (the fast sum of kernel 7 keeps every chunk), "strong" (dt A down to -80, as a
# real checkpoint's A_log up to log 16 allows: kernel 7 redoes every chunk the exact way, scan/cuda_decay.py)
DECAYS = {"mild": ((0.01, 0.3), (0.5, 2.0)), "strong": ((1.0, 5.0), (8.0, 16.0))}


def make_inputs(rng, b, l, h, p, g, n, dtype, decay="mild"):
    (dt_low, dt_high), (a_low, a_high) = DECAYS[decay]
    inputs = dict(x=rng.standard_normal((b, l, h, p)), dt=rng.uniform(dt_low, dt_high, (b, l, h)),
                  A=-rng.uniform(a_low, a_high, h), B=rng.standard_normal((b, l, g, n)) / np.sqrt(n),
                  C=rng.standard_normal((b, l, g, n)) / np.sqrt(n), D=rng.standard_normal(h),
                  initial_state=rng.standard_normal((b, h, p, n)))
    return {k: v.astype(dtype) for k, v in inputs.items()}


def run_backend(backend: str, inputs: dict, chunk_size: int):
    """y, final state and every input's gradient for a fixed random weighting of both outputs."""
    tensors = {k: tg.Tensor(v, requires_grad=True) for k, v in inputs.items()}
    if backend == "cuda":   # through the SSD op with the record: under the simulator ssd() refuses "cuda"
        y, state = SSD.apply(*tensors.values(), kernel=BACKENDS["cuda"], chunk_size=chunk_size)
    else:
        y, state = ssd(**tensors, chunk_size=chunk_size, backend=backend)
    rng = np.random.default_rng(1)
    dtype = inputs["x"].dtype
    loss = (y * rng.standard_normal(y.shape).astype(dtype)).sum() + \
        (state * rng.standard_normal(state.shape).astype(dtype)).sum()
    loss.backward()
    return {"y": y.data, "final_state": state.data, **{"d" + k: t.grad.data for k, t in tensors.items()}}


def check(shape: dict, chunk_size: int) -> dict:
    """Each decay and dtype: every output's largest difference from the CPU backend's, relative to its largest value
    (dA under strong decay is ~1e-4: relative to max(1, that), as before, would pass any error of dA there)."""
    cpu = [name for name in available_backends() if name != "cuda"][0]
    result = {"cpu_backend": cpu, "shape": shape, "chunk_size": chunk_size, "dtypes": {}}
    for decay in DECAYS:
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
            inputs = make_inputs(np.random.default_rng(0), **shape, dtype=dtype, decay=decay)
            expected, got = run_backend(cpu, inputs, chunk_size), run_backend("cuda", inputs, chunk_size)
            errors = {k: float(np.abs(got[k] - expected[k]).max() / max(1e-30, np.abs(expected[k]).max()))
                      for k in expected}
            worst = max(errors, key=errors.get)
            result["dtypes"][f"{np.dtype(dtype).name} {decay}"] = {"max_relative_error": errors, "tolerance": tol,
                                                                   "ok": errors[worst] <= tol}
            print(f"check {np.dtype(dtype).name}, {decay} decay: cuda vs {cpu}, worst {worst} {errors[worst]:.2e} "
                  f"(tolerance {tol:.0e}) {'ok' if errors[worst] <= tol else 'FAILED'}")
    return result


# --- PyTorch: a chunked SSD (ssd_minimal's algorithm) on the GPU, the speed to compare with -----------------

def torch_segsum(x):
    """x (..., T) -> (..., T, T): x[j+1] + ... + x[i] below the diagonal, -inf above (masked, then summed)."""
    import torch
    T = x.size(-1)
    x = x[..., None].expand(*x.shape, T)                                  # (..., T, T): [i, j] = x[i]
    x = x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), -1), 0)
    x = torch.cumsum(x, dim=-2)
    return x.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), 0), -torch.inf)


def torch_ssd(x, dt, A, B, C, D, initial_state, chunk_size):
    """x (b, l, h, p), dt (b, l, h), A, D (h,), B, C (b, l, g, n), initial_state (b, h, p, n); l a multiple of
    chunk_size. -> y (b, l, h, p), final state (b, h, p, n)."""
    import torch
    b, l, h, p = x.shape
    g, n, q = B.shape[2], B.shape[3], chunk_size
    c = l // q
    B = B.repeat_interleave(h // g, dim=2).reshape(b, c, q, h, n)        # (b, c, q, h, n)
    C = C.repeat_interleave(h // g, dim=2).reshape(b, c, q, h, n)
    X = (x * dt[..., None]).reshape(b, c, q, h, p)                       # (b, c, q, h, p)
    a = (dt * A).reshape(b, c, q, h).permute(0, 3, 1, 2)                 # (b, h, c, q)
    a_cumsum = torch.cumsum(a, dim=-1)
    L = torch.exp(torch_segsum(a))                                       # (b, h, c, q, q)
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
    decay_states = torch.exp(a_cumsum[..., -1:] - a_cumsum)              # (b, h, c, q)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)  # (b, c, h, p, n)
    states = torch.cat([initial_state[:, None], states], dim=1)         # (b, c + 1, h, p, n)
    decay_chunk = torch.exp(torch_segsum(torch.nn.functional.pad(a_cumsum[..., -1], (1, 0))))  # (b, h, c+1, c+1)
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states[:, :-1], torch.exp(a_cumsum))
    y = (Y_diag + Y_off).reshape(b, l, h, p) + x * D[:, None]
    return y, states[:, -1]


def check_torch_ssd(shape: dict, chunk_size: int, device: str) -> float:
    """The PyTorch SSD of this script against the engine-op reference (float64), so its timing is of the op."""
    import torch
    inputs = make_inputs(np.random.default_rng(2), **shape, dtype=np.float64)
    y_ref, state_ref = ssd(**inputs, chunk_size=chunk_size, backend="reference")
    y, state = torch_ssd(*(torch.tensor(v, device=device) for v in inputs.values()), chunk_size)
    error = max(np.abs(y.cpu().numpy() - y_ref.data).max(), np.abs(state.cpu().numpy() - state_ref.data).max())
    print(f"check torch chunked SSD ({device}) vs reference, float64: max error {error:.1e}")
    if error > 1e-10:
        raise SystemExit(f"gpu_check: the PyTorch SSD of this script disagrees with the reference ({error:.1e})")
    return float(error)


# --- timing -------------------------------------------------------------------------------------------------

def best_time(fn, synchronize, repeats: int) -> float:
    fn()                                                                  # warm-up: compiles the kernels
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def min_bytes(b, l, h, p, g, n, itemsize) -> tuple[int, int]:
    """The bytes the forward and the backward must at least move (each input read, each output written once)."""
    forward = (2 * b * l * h * p + b * l * h + 2 * b * l * g * n + 2 * b * h * p * n) * itemsize
    backward = (3 * b * l * h * p + 2 * b * l * h + 4 * b * l * g * n + 2 * b * h * p * n) * itemsize
    return forward, forward + backward


def time_shape(shape: dict, chunk_size: int, dtype, repeats: int, torch_device: str = "cuda",
               decay: str = "mild") -> dict:
    """Times of the cuda kernels and of the PyTorch SSD on torch_device ("cpu" only to try the script out)."""
    from numba import cuda
    b, l, h, p, g, n = (shape[k] for k in "b l h p g n".split())
    inputs = make_inputs(np.random.default_rng(3), **shape, dtype=dtype, decay=decay)
    on_gpu = {k: cuda.to_device(v) for k, v in inputs.items()}
    dy = cuda.to_device(np.random.default_rng(4).standard_normal((b, l, h, p)).astype(dtype))
    d_final = cuda.to_device(np.random.default_rng(5).standard_normal((b, h, p, n)).astype(dtype))
    args = list(on_gpu.values())

    def forward():
        return numba_cuda.forward_device(*args, chunk_size)

    def forward_backward():
        y, boundary, log_decay = numba_cuda.forward_device(*args, chunk_size)
        return numba_cuda.backward_device(*args[:6], boundary, log_decay, dy, d_final, chunk_size)

    elements = b * l * h * p * n
    bytes_forward, bytes_both = min_bytes(b, l, h, p, g, n, np.dtype(dtype).itemsize)
    t_forward = best_time(forward, cuda.synchronize, repeats)
    t_both = best_time(forward_backward, cuda.synchronize, repeats)
    row = {"dtype": np.dtype(dtype).name, "decay": decay, "cuda_forward_s": t_forward, "cuda_forward_backward_s": t_both,
           "cuda_forward_GBps": bytes_forward / t_forward / 1e9,
           "cuda_forward_backward_GBps": bytes_both / t_both / 1e9,
           "cuda_forward_TFLOPs": 8 * elements / t_forward / 1e12,
           "cuda_forward_backward_TFLOPs": 26 * elements / t_both / 1e12}
    try:
        import torch
        has_torch_device = torch_device == "cpu" or torch.cuda.is_available()
    except ImportError:
        has_torch_device = False
    if not has_torch_device:
        row["torch"] = f"skipped: torch with {torch_device} is not installed"
        return row
    tensors = {k: torch.tensor(v, device=torch_device, requires_grad=True) for k, v in inputs.items()}
    dy_t = torch.tensor(dy.copy_to_host(), device=torch_device)
    d_final_t = torch.tensor(d_final.copy_to_host(), device=torch_device)
    torch_synchronize = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)

    def torch_forward():
        with torch.no_grad():
            return torch_ssd(*tensors.values(), chunk_size)

    def torch_forward_backward():
        y, state = torch_ssd(*tensors.values(), chunk_size)
        torch.autograd.backward([y, state], [dy_t, d_final_t])

    t_forward = best_time(torch_forward, torch_synchronize, repeats)
    t_both = best_time(torch_forward_backward, torch_synchronize, repeats)
    y_torch, _ = torch_forward()
    y_cuda = forward()[0].copy_to_host()
    row.update({"torch_forward_s": t_forward, "torch_forward_backward_s": t_both,
                "torch_forward_GBps": bytes_forward / t_forward / 1e9,
                "torch_forward_backward_GBps": bytes_both / t_both / 1e9,
                "y_cuda_vs_torch_max_relative": float(np.abs(y_cuda - y_torch.cpu().numpy()).max()
                                                      / np.abs(y_cuda).max())})
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny shape, correctness only (runs on the simulator)")
    parser.add_argument("--repeats", type=_common.positive_int, default=3)
    parser.add_argument("--chunk-size", type=_common.positive_int, default=256)
    parser.add_argument("--json", metavar="FILE", help="write the results to FILE as JSON")
    args = parser.parse_args(argv)

    if numba_cuda.simulated():
        if not args.tiny:
            raise SystemExit("gpu_check: under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) only the correctness part "
                             "runs, on a tiny shape: add --tiny")
    elif not numba_cuda.available():
        raise SystemExit(f"gpu_check: backend 'cuda' cannot run here: {numba_cuda.why_unavailable()}. Run it on a "
                         "machine with an NVIDIA GPU, or the correctness part on the simulator: "
                         "NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu_check.py --tiny")

    result = {"simulator": numba_cuda.simulated(), "machine": machine()}
    if not numba_cuda.simulated():
        from numba import cuda
        name = cuda.get_current_device().name
        result["device"] = name.decode() if isinstance(name, bytes) else str(name)
    shape, chunk_size = (TINY_SHAPE, 4) if args.tiny else (CHECK_SHAPE, args.chunk_size)
    result["check"] = check(shape, chunk_size)
    try:
        import torch
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        result["torch_ssd_check_error"] = check_torch_ssd(dict(TINY_SHAPE, l=12), 4, torch_device)
    except ImportError:
        print("torch is not installed: no PyTorch comparison")
    ok = all(d["ok"] for d in result["check"]["dtypes"].values())

    if not args.tiny and ok:
        result["timed_shape"], result["timed_chunk_size"] = TIMED_SHAPE, args.chunk_size
        result["timings"] = [time_shape(TIMED_SHAPE, args.chunk_size, dtype, args.repeats, decay=decay)
                             for dtype, decay in ((np.float32, "mild"), (np.float64, "mild"), (np.float32, "strong"))]
        print(f"\n{'':15} {'forward ms':>11} {'GB/s':>7} {'TFLOP/s':>8} {'fwd+bwd ms':>11} {'GB/s':>7} {'TFLOP/s':>8} "
              f"{'torch fwd ms':>13} {'torch fwd+bwd ms':>17}")
        for row in result["timings"]:
            print(f"{row['dtype'] + ' ' + row['decay']:15} {1e3 * row['cuda_forward_s']:11.2f} {row['cuda_forward_GBps']:7.1f} "
                  f"{row['cuda_forward_TFLOPs']:8.2f} {1e3 * row['cuda_forward_backward_s']:11.2f} "
                  f"{row['cuda_forward_backward_GBps']:7.1f} {row['cuda_forward_backward_TFLOPs']:8.2f} "
                  f"{1e3 * row.get('torch_forward_s', float('nan')):13.2f} "
                  f"{1e3 * row.get('torch_forward_backward_s', float('nan')):17.2f}")
    if args.json:
        save_json(args.json, result)
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
