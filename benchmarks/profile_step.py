"""Where one training step's time goes, by share: the scan, the BLAS matmuls, the fused numba ops (each, forward
and backward), the other engine ops, the optimizer, and what is left (the graph walk and Python between ops);
and for each, the cores it kept busy (the process's CPU time over its wall time: 2 on 2 cores is all of them).

    python benchmarks/profile_step.py                          # b=8 l=512 chunk 64, fused, the auto scan backend
    python benchmarks/profile_step.py --reference --chunk-size 256 --backend reference

Every op's forward (Function.apply) and backward is timed; ops run while the scan runs count as the scan
(for a kernel backend that is its one SSD op). Shares are of the mean step over --repeats after --warmup untimed steps;
on a loaded machine the absolute times drift, the shares much less.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import resource
import sys
import time

import _common  # noqa: F401, I001  (first: puts this clone on sys.path before the installed package)
import tinygrad_ssm  # noqa: F401
import numpy as np

import _common as common

import tinygrad_ssm.scan as K
from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
from tinygrad_ssm.optim import AdamW
from tinygrad_ssm.autograd.function import Function

SHAPES = {"small": dict(d_model=256, n_layer=4, vocab_size=256, d_state=64, headdim=64, expand=2),
          "130m": common.SHAPE_130M}
FUSED_OPS = ("Conv1dSilu", "GatedRMSNorm", "SplitLast", "DtSoftplus", "AddRMSNorm")


def cpu_seconds() -> float:
    """CPU time of the whole process (every thread) so far: over a stretch of wall time, the cores it used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def instrument(times: dict, counts: collections.Counter, in_scan: list, cpu: dict):
    """Wrap Function.apply and every backward so that each adds its seconds to times[(where, phase, op)] and the
    process's CPU seconds meanwhile to cpu[(where, phase, op)]."""
    plain_apply = Function.apply.__func__

    def apply(cls, *args, **kwargs):
        t0, c0 = time.perf_counter(), cpu_seconds()
        out = plain_apply(cls, *args, **kwargs)
        where = "scan" if in_scan[0] else "model"
        times[(where, "forward", cls.__name__)] += time.perf_counter() - t0
        cpu[(where, "forward", cls.__name__)] += cpu_seconds() - c0
        counts[where] += 1
        for o in out if isinstance(out, tuple) else (out,):
            if o._ctx is not None:
                o._ctx._profile_where = where
        return out
    Function.apply = classmethod(apply)

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    def timed_backward(plain):
        def backward(self, *grads):
            t0, c0 = time.perf_counter(), cpu_seconds()
            result = plain(self, *grads)
            where = getattr(self, "_profile_where", "model")
            times[(where, "backward", type(self).__name__)] += time.perf_counter() - t0
            cpu[(where, "backward", type(self).__name__)] += cpu_seconds() - c0
            return result
        return backward
    for cls in list(subclasses(Function)):
        if "backward" in cls.__dict__:
            cls.backward = timed_backward(cls.backward)

    for name, record in list(K.BACKENDS.items()):  # mark the scan, whichever backend runs it
        def wrap(fn):
            def marked(*args, **kwargs):
                in_scan[0] = True
                try:
                    return fn(*args, **kwargs)
                finally:
                    in_scan[0] = False
            return marked
        if record.ops is not None:
            K.BACKENDS[name] = dataclasses.replace(record, ops=wrap(record.ops))
        else:
            K.BACKENDS[name] = dataclasses.replace(record, forward=wrap(record.forward),
                                                   backward=wrap(record.backward))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=common.positive_int, default=8)
    p.add_argument("--seqlen", type=common.positive_int, default=512)
    p.add_argument("--chunk-size", type=common.positive_int, default=64)
    p.add_argument("--backend", default="auto")
    p.add_argument("--reference", action="store_true", help="profile the engine-op path (fused=False)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="small",
                   help="the model: small (d_model 256, 4 layers, bytes) or 130m (Mamba-2 130M's shape, vocab 50,277)")
    p.add_argument("--repeats", type=common.positive_int, default=3)
    p.add_argument("--warmup", type=common.nonnegative_int, default=2,
                   help="untimed steps first: the second step still paid a one-time ~0.1 s (in the first gated norm's "
                        "backward), which one warm-up step spread over the timed ones")
    args = p.parse_args(argv)
    times, counts, in_scan, cpu = collections.defaultdict(float), collections.Counter(), [False], collections.defaultdict(float)
    instrument(times, counts, in_scan, cpu)
    config = Mamba2Config(**SHAPES[args.shape], chunk_size=args.chunk_size)
    model = Mamba2LMHeadModel(config, VarMap(seed=0), backend=args.backend, fused=not args.reference)
    opt = AdamW(model.varmap.all_vars(), lr=1e-3)
    data = np.random.default_rng(0).integers(0, config.vocab_size, (args.batch, args.seqlen + 1))
    phases, phases_cpu = collections.defaultdict(float), collections.defaultdict(float)

    def step():
        t0, c0 = time.perf_counter(), cpu_seconds()
        opt.zero_grad()
        loss = model.loss(data[:, :-1], data[:, 1:])
        t1 = time.perf_counter()
        loss.backward()
        t2, c2 = time.perf_counter(), cpu_seconds()
        opt.step()
        t3, c3 = time.perf_counter(), cpu_seconds()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["optimizer"] += t3 - t2
        phases_cpu["model"] += c2 - c0
        phases_cpu["optimizer"] += c3 - c2
    for _ in range(args.warmup):
        step()
    times.clear(), counts.clear(), phases.clear(), cpu.clear(), phases_cpu.clear()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(args.repeats):
        step()
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    n = args.repeats
    faults, system_s = (usage1.ru_minflt - usage0.ru_minflt) / n, (usage1.ru_stime - usage0.ru_stime) / n
    step_s = sum(phases.values()) / n
    shares, detail = collections.defaultdict(float), collections.defaultdict(float)
    shares_cpu, detail_cpu = collections.defaultdict(float), collections.defaultdict(float)
    for key, seconds in times.items():
        where, phase, op = key
        seconds, cpu_s = seconds / n, cpu[key] / n
        if where == "scan" or op == "SSD":  # a kernel backend is the one SSD op
            share, part = "scan", f"scan {phase}"
        elif op == "Matmul":
            share, part = "BLAS matmuls (projections, head)", None
        else:
            share, part = "fused numba ops" if op in FUSED_OPS else "other engine ops", f"{op} {phase}"
        shares[share] += seconds
        shares_cpu[share] += cpu_s
        if part:
            detail[part] += seconds
            detail_cpu[part] += cpu_s
    shares["optimizer (AdamW)"], shares_cpu["optimizer (AdamW)"] = phases["optimizer"] / n, phases_cpu["optimizer"] / n
    walk = "graph walk, Python between ops"
    shares_cpu[walk] = (phases_cpu["model"] + phases_cpu["optimizer"]) / n - sum(shares_cpu.values())
    shares[walk] = step_s - sum(shares.values())
    step_cpu = sum(shares_cpu.values())
    print(f"training step b={args.batch} l={args.seqlen} chunk={args.chunk_size} backend={args.backend} "
          f"{'reference' if args.reference else 'fused'}: {step_s:.3f} s (forward {phases['forward'] / n:.3f}, "
          f"backward {phases['backward'] / n:.3f}, optimizer {phases['optimizer'] / n:.3f}); ops per step: "
          f"{counts['model'] // n} model, {counts['scan'] // n} scan; per step {faults:,.0f} page faults, "
          f"{system_s:.3f} s system time (tinygrad_ssm/fast/heap_reuse.py); {step_cpu:.3f} s of CPU time, "
          f"{step_cpu / step_s:.2f} cores on average")
    print(f"  {'':40s} {'wall':>9s} {'share':>7s} {'cores':>6s}  (cores = the process's CPU time / wall time)")
    for name, seconds in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {name:40s} {seconds:7.3f} s {100 * seconds / step_s:5.1f} % {shares_cpu[name] / seconds:6.2f}")
    print("  of which:")
    for name, seconds in sorted(detail.items(), key=lambda kv: -kv[1])[:10]:
        print(f"    {name:38s} {seconds:7.3f} s {100 * seconds / step_s:5.1f} % {detail_cpu[name] / seconds:6.2f}")
    return {"step_s": step_s, "step_cpu_s": step_cpu, "shares": dict(shares), "shares_cpu": dict(shares_cpu),
            "detail": dict(detail), "detail_cpu": dict(detail_cpu), "page_faults": faults, "system_s": system_s}


if __name__ == "__main__":
    sys.exit(main() and 0)
