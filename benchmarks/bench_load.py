"""Loading a checkpoint: peak memory and time of `Mamba2LMHeadModel.from_pretrained`, against the way it loaded
before (build the model with random weights, then read each stored tensor into a new array and copy it in).

    python benchmarks/bench_load.py            # the 130M shape: d_model 768, 24 layers, d_state 128, vocab 50,280
    python benchmarks/bench_load.py --quick    # a small shape, a smoke run

Random weights are written with save_pretrained into a temporary folder (float32), and once more stored as
bfloat16 (as the published checkpoints often are). Each (checkpoint, way of loading) is measured in a fresh
process: the peak resident memory the load adds (VmHWM, after a reset), NumPy's peak as tracemalloc sees it
(NumPy reports its allocations to it), the memory the loaded model holds afterwards, and the median time of three
loads (the file in the page cache). The references, measured in the same run: the model's own weight bytes
(float32) for memory, and reading the weight file's bytes into one array (np.fromfile) for time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import _common as common  # noqa: I001  (no NumPy: threads_from_argv must come first)
THREADS = common.threads_from_argv()

import numpy as np  # noqa: E402

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel  # noqa: E402
from tinygrad_ssm.io.safetensors import SafetensorsFile  # noqa: E402

SHAPE_130M = {"d_model": 768, "n_layer": 24, "d_state": 128, "vocab_size": 50280, "headdim": 64, "ngroups": 1,
              "expand": 2, "pad_vocab_size_multiple": 16}
QUICK_SHAPE = {"d_model": 128, "n_layer": 4, "d_state": 32, "vocab_size": 4096, "headdim": 32, "ngroups": 1,
               "expand": 2}
WAYS = {"from_pretrained": "from_pretrained (in place)", "copy": "build, then read + copy (the old way)"}
MB = 1e6


def read_as_before(path: Path, info) -> np.ndarray:
    """SafetensorsFile.read as it was before read_into: the tensor's bytes, then a converted copy of them."""
    with open(path, "rb") as f:
        header_length = int.from_bytes(f.read(8), "little")
        f.seek(8 + header_length + info.begin)
        raw = f.read(info.end - info.begin)
    array = np.frombuffer(raw, dtype="<u2" if info.dtype == "BF16" else f"<f{int(info.dtype[1:]) // 8}")
    if info.dtype == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.reshape(info.shape).astype(np.float32, copy=True)


def load_by_copy(directory: Path):
    """The old from_pretrained, written with public APIs: a randomly initialised model, then every stored tensor
    read into a new array (as the old `SafetensorsFile.read` did) and copied into its parameter (`set_one`)."""
    with open(directory / "config.json") as f:
        raw = json.load(f)
    config = Mamba2Config(**{k: raw[k] for k in ("d_model", "n_layer", "vocab_size", "pad_vocab_size_multiple",
                                                 "tie_embeddings")},
                          **{k: raw["ssm_cfg"][k] for k in ("d_state", "headdim", "ngroups", "expand")})
    model = Mamba2LMHeadModel(config, dtype="float32")
    stored = SafetensorsFile(directory / "model.safetensors")
    for name in model.varmap.names():
        model.varmap.set_one(name, read_as_before(directory / "model.safetensors", stored.info(name)))
    return model


def load(way: str, directory: Path):
    return Mamba2LMHeadModel.from_pretrained(directory) if way == "from_pretrained" else load_by_copy(directory)


def measure(way: str, directory: Path) -> dict:
    """In a fresh process: the peak memory one load adds (RSS and tracemalloc), what the model holds, the time."""
    import gc
    held = []
    peak_rss = common.peak_added_bytes(lambda: held.append(load(way, directory)))
    model = held.pop()
    weight_bytes = sum(t.data.nbytes for t in model.varmap.all_vars())
    del model
    gc.collect()
    tracemalloc.start()
    model = load(way, directory)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del model
    gc.collect()
    seconds, reads = [], []
    for _ in range(5):  # a load, then the file read alone, in turn: the two see the same page cache and neighbours
        start = time.perf_counter()
        model = load(way, directory)
        seconds.append(time.perf_counter() - start)
        del model
        gc.collect()
        start = time.perf_counter()
        np.fromfile(directory / "model.safetensors", dtype=np.uint8)
        reads.append(time.perf_counter() - start)
    return {"peak_added_bytes": peak_rss, "traced_peak_bytes": traced_peak, "weight_bytes": weight_bytes,
            "load_s": float(np.median(seconds)), "read_s": float(np.median(reads)),
            "load_over_read": float(np.median(np.array(seconds) / np.array(reads)))}


def write_bfloat16_copy(source: Path, target: Path):
    """The float32 checkpoint with every tensor stored as bfloat16 (the top 16 bits, rounded to nearest even)."""
    target.mkdir()
    (target / "config.json").write_bytes((source / "config.json").read_bytes())
    stored = SafetensorsFile(source / "model.safetensors")
    header, offset = {}, 0
    for name, info in stored.tensors.items():
        size = int(np.prod(info.shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(info.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    with open(target / "model.safetensors", "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name in stored.tensors:
            bits = stored.read(name, np.float32).view(np.uint32).astype(np.uint64)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            f.write(rounded.astype("<u2").tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--quick", action="store_true", help="a small shape (a smoke run)")
    parser.add_argument("--threads", type=common.positive_int, default=None,
                        help="threads of every pool (read before NumPy)")
    parser.add_argument("--json", default=None, help=common.json_help("bench_load"))
    parser.add_argument("--measure", nargs=2, metavar=("WAY", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]))))
        return
    shape = QUICK_SHAPE if args.quick else SHAPE_130M
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        f32, bf16 = Path(tmp) / "float32", Path(tmp) / "bfloat16"
        Mamba2LMHeadModel(Mamba2Config(**shape), dtype="float32").save_pretrained(f32)
        write_bfloat16_copy(f32, bf16)
        for stored, directory in (("F32", f32), ("BF16", bf16)):
            for way, label in WAYS.items():
                argv = [sys.executable, __file__, "--measure", way, str(directory)]
                if THREADS is not None:
                    argv += ["--threads", str(THREADS)]
                done = subprocess.run(argv, check=False, capture_output=True, text=True, env=os.environ.copy())
                if done.returncode != 0:
                    raise SystemExit(f"measuring {way} on {stored} failed:\n{done.stderr[-2000:]}")
                r = json.loads(done.stdout.strip().splitlines()[-1])
                raw[f"{stored}/{way}"] = r
                w = r["weight_bytes"]
                rows.append([stored, label, round(w / MB, 1), round((r["peak_added_bytes"] or 0) / MB, 1),
                             round((r["peak_added_bytes"] or 0) / w, 2), round(r["traced_peak_bytes"] / MB, 1),
                             round(r["traced_peak_bytes"] / w, 2), round(r["load_s"], 3),
                             round(r["load_over_read"], 1)])
    columns = ["stored", "load", "weights MB", "peak RSS added MB", "/ weights", "tracemalloc peak MB",
               "/ weights", "load s", "/ read file s"]
    notes = [f"shape {shape}; float32 model; peak RSS: VmHWM added by the first load in a fresh process",
             "load s: median of 5 loads, the file in the page cache; / read file s: the median of each round's load "
             "over np.fromfile of model.safetensors timed just after it (the same process, the same page cache)"]
    common.write_result(common.result_path(args.json, "bench_load", args.quick), "load", "Loading a checkpoint: from_pretrained vs. build-then-copy",
                        columns, rows, notes, shape=shape, raw=raw, threads=THREADS)


if __name__ == "__main__":
    main()
