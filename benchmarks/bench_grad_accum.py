"""What --grad-accum costs and saves: one training step (train/step.py's train_step, as `train` runs it: micro-batches,
their backwards, clipping, AdamW) of the same batch as 1, 2, 4 ... micro-batches, at Mamba-2 130M's shape (random
weights, float32, the fine-tuning step of bench_pretrained_shape.py at twice its batch).

    python benchmarks/bench_grad_accum.py                  # batch 8 x 512 as 1, 2, 4 and 8 micro-batches
    python benchmarks/bench_grad_accum.py --quick          # a small model, for a smoke run

Per row: the median step time (the rows take turns within each repeat, so a load from other processes hits all of
them alike) and its ratio to one micro-batch; the peak memory a step adds (each row in a fresh process, so none
inherits another's heap) and its ratio. The weights, their gradients and AdamW's moments are held before the step
and not counted: what the micro-batches divide is the activations (and the logits, 50,288 wide here).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from types import SimpleNamespace

import _common as common  # noqa: I001  (no NumPy: threads_from_argv must come first)
THREADS = common.threads_from_argv(default=2)

import numpy as np  # noqa: E402

from tinygrad_ssm import optim  # noqa: E402
from tinygrad_ssm.distributed import SINGLE  # noqa: E402
from tinygrad_ssm.train.step import train_step  # noqa: E402

NAME = "bench_grad_accum"
SHAPE = common.SHAPE_130M
QUICK_SHAPE = dict(common.QUICK_CONFIG, pad_vocab_size_multiple=16)


class FixedBatch:
    """The sampler's part in a step: the same (inputs, targets) every time."""

    def __init__(self, ids: np.ndarray):
        self.batch = ids[:, :-1], ids[:, 1:]                            # (b, l) each

    def next_batch(self):
        return self.batch

    def state_dict(self) -> dict:                                       # train_step puts back an unfinished step's
        return {}                                                       # draw: here there is nothing to put back

    def load_state_dict(self, state: dict) -> None:
        pass


def step_of(model, ids: np.ndarray, pieces: int):
    """One call = one optimizer step of the real train_step, through the parts of a run it reads."""
    run = SimpleNamespace(
        cfg=SimpleNamespace(grad_accum=pieces, grad_clip=1.0), model=model, world=SINGLE, reducer=None,
        optimizers={"adamw": optim.AdamW(model.varmap.all_vars(), lr=1e-5)}, schedule=lambda step: 1e-5,
        sampler=FixedBatch(ids), clip=optim.clip_grad_norm_, corpus=SimpleNamespace(train_tokens_per_byte=1.0),
        step=0, tokens=0, train_s=0.0, rate=None, last_ckpt=None, loss_val=None, in_update=False, log=None,
        hold_signals=contextlib.nullcontext)
    return lambda: train_step(run)


def notes(shape: dict, times: dict) -> list:
    return [f"the model: {shape}, random weights, AdamW",
            "peak added: the resident memory one step adds to the weights, gradients and AdamW moments already "
            "held, each row in a fresh process",
            "each row's timed steps in seconds, in the order run (one warm-up step each before): "
            + "; ".join(f"{name}: {', '.join(f'{t:.2f}' for t in ts)}" for name, ts in times.items())]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=common.positive_int, default=8, help="sequences per step [%(default)s]")
    p.add_argument("--seq-len", type=common.positive_int, default=512, help="tokens per sequence [%(default)s]")
    p.add_argument("--pieces", type=common.positive_int, nargs="+", default=[1, 2, 4, 8],
                   help="the --grad-accum values to compare, each dividing --batch [%(default)s]")
    p.add_argument("--chunk-size", type=common.positive_int, default=128, help="the scan's chunk [%(default)s]")
    p.add_argument("--repeats", type=common.positive_int, default=3, help="timed steps per row [%(default)s]")
    p.add_argument("--quick", action="store_true", help="a small model and batch: a smoke run")
    p.add_argument("--json", default=None, help=common.json_help(NAME))
    p.add_argument("--threads", type=common.positive_int, default=2, help="threads (set before NumPy loads) [%(default)s]")
    p.add_argument(common.MEMORY_FLAG, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.seq_len, args.pieces, args.chunk_size, args.repeats = 4, 64, [1, 2, 4], 32, 1
    bad = [n for n in args.pieces if args.batch % n]
    if bad:
        p.error(f"--pieces {bad} must divide --batch {args.batch}")
    shape = QUICK_SHAPE if args.quick else SHAPE
    model = common.ours(shape, args.chunk_size)
    ids = np.random.default_rng(0).integers(0, shape["vocab_size"], (args.batch, args.seq_len + 1))
    names = {f"{n} micro-batch{'es' * (n > 1)} of {args.batch // n}": n for n in args.pieces}
    if common.memory_mode() is not None:                                # a subprocess: one side's peak, alone
        common.fixed_mmap_threshold()                                   # freed memory may not hide a step's peak
        name = common.memory_mode()
        common.report_memory({name: step_of(model, ids, names[name])}, name)
        return 0
    sides = {name: step_of(model, ids, n) for name, n in names.items()}   # each with its own AdamW moments
    names = list(names)

    for run in sides.values():                                          # warm-up: compilation, the heap pool
        run()
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    del sides, model, run                                              # the subprocesses need the memory
    common.release_freed_memory()
    same_run = ["--batch", str(args.batch), "--seq-len", str(args.seq_len), "--pieces", *map(str, args.pieces),
                "--chunk-size", str(args.chunk_size), "--threads", str(THREADS)] + ["--quick"] * args.quick
    peaks = common.peak_memory_by_side(__file__, same_run, names)

    first = names[0]
    base_s, base_peak = common.stats(times[first])["median_s"], peaks[first]
    rows = []
    for name in names:
        median = common.stats(times[name])["median_s"]
        peak = peaks[name]
        rows.append([name, median, round(median / base_s, 3), None if peak is None else round(peak / 2 ** 20),
                     None if peak is None or not base_peak else round(peak / base_peak, 3)])
    columns = ["step of the batch as", "median s", "x one batch's time", "peak added MiB", "x one batch's memory"]
    print(f"a training step at batch {args.batch} x {args.seq_len}, d_model {shape['d_model']}, {shape['n_layer']} "
          f"layers, vocab {shape['vocab_size']:,}, float32, chunk {args.chunk_size}, {THREADS} threads; median of "
          f"{args.repeats}")
    # a --quick run writes bench_grad_accum_quick.json (a bare --json wrote the record's file, even for --quick)
    common.write_result(common.result_path(args.json, NAME, args.quick), NAME,
                        f"--grad-accum: a step at batch {args.batch} x {args.seq_len} in micro-batches",
                        columns, rows, notes=notes(shape, times), threads=THREADS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
