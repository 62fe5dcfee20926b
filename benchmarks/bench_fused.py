"""The fused mixer ops (tinygrad_ssm/fast/fused.py), forward and backward, at the training step's shape, against
their engine-op twins (the `reference_*` compositions) and, with --baseline REV, against the fused ops of
another git revision, interleaved in one process (a shared machine's load drifts; the ratios much less).

    python benchmarks/bench_fused.py [--json PATH] [--repeats 7] [--threads 2] [--baseline HEAD~3]

Shape: profile_step.py's (b=8, l=512, d_model 256: d_inner 512, conv_dim 640, 8 heads, in_proj width 1160),
float32. Each op reads what the mixer hands it: the conv the xBC piece and the gated norm the z piece of a
split of the in_proj output (split_last for the fused path, F.split for the twin), so backward times include
the split's backward; "mixer chain" is all of them on one split (conv, gated norm, dt softplus), and "rms
norm" the block norm (no gate, d_model wide). Gradients come from fixed arrays (one `Seeds` op, no loss
arithmetic) and the inputs' own gradients stop at a `Source` op, so no leaf copy is timed. Times are medians,
wall clock ("ms") and this process's CPU time over all threads ("cpu ms").
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import threads_from_argv

THREADS = threads_from_argv()

import numpy as np  # noqa: E402  (after threads_from_argv: the pools' sizes are fixed when they load)

from _common import ROOT, default_json, positive_int, write_result  # noqa: E402

import tinygrad_ssm.fast.fused as fused  # noqa: E402
from tinygrad_ssm.autograd import functional as F  # noqa: E402
from tinygrad_ssm.autograd.function import Function  # noqa: E402
from tinygrad_ssm.autograd.tensor import Tensor  # noqa: E402

B, L, D_MODEL, D_INNER, CONV_DIM, HEADS, K = 8, 512, 256, 512, 640, 8, 4
SIZES = [D_INNER, CONV_DIM, HEADS]                                      # in_proj's output: z | xBC | dt


class Source(Function):
    """A leaf's stand-in whose gradient stops here (no leaf .grad copy in the timings); the ops before it in a
    model (in_proj's matmul, the scan) take its gradient instead."""

    def forward(self, x):
        return x

    def backward(self, grad):
        return None


class Seeds(Function):
    """The end of the graph: backward hands each input a fixed gradient array, the loss's part done."""

    def forward(self, *xs, seeds=()):
        self.seeds = seeds
        return np.zeros((), xs[0].dtype)

    def backward(self, grad):
        return self.seeds


def load_fused(rev: str, where: Path):
    """fast/fused.py as of git revision `rev`, loaded as a module of the package (its relative imports work)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:tinygrad_ssm/fast/fused.py"],
                            capture_output=True, text=True, check=True).stdout
    path = where / "fused_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("tinygrad_ssm.fast.fused_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def paths(baseline):
    """path name -> (split, conv1d_silu, gated_rms_norm(y, z, w, group), dt_softplus)."""
    out = {"fused": (lambda p: fused.split_last(p, SIZES), fused.conv1d_silu, fused.gated_rms_norm,
                     fused.dt_softplus)}
    if baseline is not None:
        out["baseline"] = (lambda p: baseline.split_last(p, SIZES), baseline.conv1d_silu, baseline.gated_rms_norm,
                           baseline.dt_softplus)
    out["twin"] = (lambda p: F.split(p, SIZES, axis=-1), fused.reference_conv1d_silu,
                   fused.reference_gated_rms_norm, fused.reference_dt_softplus)
    return out


def cases(data):
    """case name -> build(split, conv, norm, softplus) -> (outputs, their gradient seeds)."""
    def conv(split, conv1d_silu, norm, softplus):
        _, xBC, _ = split(Source.apply(data["proj"]))
        return [conv1d_silu(xBC, data["conv_w"], data["conv_b"])], [data["g_conv"]]

    def gated(split, conv1d_silu, norm, softplus):
        z, _, _ = split(Source.apply(data["proj"]))
        return [norm(Source.apply(data["y"]), z, data["norm_w"], D_INNER)], [data["g_norm"]]

    def rms(split, conv1d_silu, norm, softplus):
        return [norm(Source.apply(data["resid"]), None, data["rms_w"], D_MODEL)], [data["g_rms"]]

    def chain(split, conv1d_silu, norm, softplus):
        z, xBC, dt = split(Source.apply(data["proj"]))
        outs = [conv1d_silu(xBC, data["conv_w"], data["conv_b"]), norm(Source.apply(data["y"]), z, data["norm_w"],
                                                                        D_INNER), softplus(dt, data["dt_b"])]
        return outs, [data["g_conv"], data["g_norm"], data["g_dt"]]
    return {"conv1d + silu": conv, "gated rms norm": gated, "rms norm (block)": rms, "mixer chain": chain}


def make_data(dtype):
    rng = np.random.default_rng(0)

    def arr(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)
    leaf = lambda a: Tensor(a, requires_grad=True)  # noqa: E731
    return {"proj": leaf(arr(B, L, sum(SIZES))), "y": leaf(arr(B, L, D_INNER)), "resid": leaf(arr(B, L, D_MODEL)),
            "conv_w": leaf(arr(CONV_DIM, 1, K, scale=0.5)), "conv_b": leaf(arr(CONV_DIM)),
            "norm_w": leaf(arr(D_INNER)), "rms_w": leaf(arr(D_MODEL)), "dt_b": leaf(arr(HEADS)),
            "g_conv": arr(B, L, CONV_DIM), "g_norm": arr(B, L, D_INNER), "g_rms": arr(B, L, D_MODEL),
            "g_dt": arr(B, L, HEADS)}


def run_once(build, ops) -> tuple:
    """(forward wall, backward wall, forward cpu, backward cpu) seconds of one forward and one backward."""
    w0, c0 = time.perf_counter(), time.process_time()
    outs, seeds = build(*ops)
    w1, c1 = time.perf_counter(), time.process_time()
    Seeds.apply(*outs, seeds=tuple(seeds)).backward()
    return w1 - w0, time.perf_counter() - w1, c1 - c0, time.process_time() - c1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=None, help="threads for numba and BLAS (read at start)")
    parser.add_argument("--baseline", default=None, help="also time the fused ops of this git revision")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", default=default_json("bench_fused"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_fused(args.baseline, Path(tmp)) if args.baseline else None
        all_paths = paths(baseline)
        data = make_data(np.dtype(args.dtype))
        times = {}                                                       # (case, path) -> list of 4-tuples
        for case, build in cases(data).items():
            for ops in all_paths.values():                               # warm-up: numba's compile, caches
                run_once(build, ops)
            for rep in range(args.repeats):
                order = list(all_paths.items())
                for name, ops in order if rep % 2 == 0 else order[::-1]:
                    times.setdefault((case, name), []).append(run_once(build, ops))
    med = {key: [statistics.median(column) * 1e3 for column in zip(*runs)] for key, runs in times.items()}
    rows, results = [], {}
    for (case, name), (fwd, bwd, fwd_cpu, bwd_cpu) in med.items():
        twin, base = med[(case, "twin")], med.get((case, "baseline"))
        row = [case, name, fwd, bwd, fwd_cpu, bwd_cpu, (fwd + bwd) / (twin[0] + twin[1])]
        if base is not None:
            row.append((fwd + bwd) / (base[0] + base[1]))
        rows.append(row)
        results.setdefault(case, {})[name] = {"forward_ms": fwd, "backward_ms": bwd, "forward_cpu_ms": fwd_cpu,
                                              "backward_cpu_ms": bwd_cpu}
    columns = ["op", "path", "fwd ms", "bwd ms", "fwd cpu ms", "bwd cpu ms", "fwd+bwd / twin"]
    if baseline is not None:
        columns.append(f"fwd+bwd / {args.baseline}")
    import numba
    write_result(args.json, "bench_fused",
                 f"Fused mixer ops at b={B} l={L} d_model={D_MODEL} ({args.dtype}, {numba.get_num_threads()} "
                 f"threads), median of {args.repeats}, interleaved",
                 columns, rows,
                 notes=["twin = the engine-op composition (reference_*); ratios below 1: faster than it.",
                        "backward includes the split's backward (gradients of the split pieces into one array).",
                        "cpu ms: CPU time of all this process's threads; on a loaded machine wall times drift."],
                 per_case=results, baseline=args.baseline)


if __name__ == "__main__":
    main()
