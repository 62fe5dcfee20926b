"""What the benchmark scripts share (private: not a benchmark itself):

1. --threads N: the same thread count for every library on both sides (OpenBLAS under NumPy, numba's pool,
   torch's intra-op pool), read from sys.argv before NumPy loads, since OpenBLAS fixes its pool when it starts.
   On a machine shared with other work, --threads 1 keeps spinning thread pools (torch's OpenMP pool above all)
   from measuring the load instead of the code. So this module imports no NumPy at its top: a script calls
   `threads_from_argv()` first, then imports NumPy. Every count flag's argparse type is positive_int (or
   nonnegative_int), so a 0 or a negative count stops at parsing.
2. Timing (median of n after warm-up, with min and max), peak memory of a piece of work, the machine's facts,
   and one JSON layout that run_all.py turns into docs/benchmarks.md.
3. The transformers twin (bench_train_step.py, bench_generate.py, parity_transformers.py, profile_decode.py):
   the benchmark's Mamba-2 on both sides with the same weights (ours saved to safetensors, read back into
   transformers' Mamba2ForCausalLM under its layout names), and the peak memory one call adds, each side
   measured in a fresh process. Needs the `bench` extra (torch==2.13.0, transformers==5.24.0); each script
   says so and stops without them.

A result file holds {"name", "title", "columns", "rows", "notes", "machine", "plots", ...}: `rows` are the
printed table's rows (plain numbers and strings), `plots` a list of {"file", "title", "xlabel", "ylabel",
"logx", "logy", "series": {label: [[x, y], ...]}} drawn by run_all.py. Scripts may add any other key.

The scripts in benchmarks/ import it as `_common` (their folder is on sys.path when run); those in
benchmarks/dev/ put benchmarks/ on sys.path first.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a clone without installing


# --- 1. threads ---------------------------------------------------------------------------------------------

def threads_from_argv(default: int | None = None) -> int | None:
    """--threads N (or --threads=N) of sys.argv, set as every pool's size in the environment (before the script
    imports NumPy, which reads them when it loads its BLAS); then imports tinygrad_ssm. Returns N or None."""
    n = default
    for i, arg in enumerate(sys.argv):
        value = sys.argv[i + 1] if arg == "--threads" and i + 1 < len(sys.argv) else \
            arg.split("=", 1)[1] if arg.startswith("--threads=") else None
        if value is not None:
            try:
                n = int(value)
            except ValueError:   # (argparse has not run yet: this is the flag's first reader)
                raise SystemExit(f"--threads must be a whole number of threads, got {value!r}") from None
    if n is not None:
        if n < 1:
            raise SystemExit(f"--threads must be >= 1, got {n}")
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            os.environ[var] = str(n)
    import tinygrad_ssm  # noqa: F401  (after the counts, before the script's NumPy)
    return n


def positive_int(text: str) -> int:
    """argparse type of a count flag (--repeats, --batches, --new-tokens, --steps, ...): a whole number >= 1, so
    that 0 or a negative number stops at parsing, naming the flag, instead of in a traceback from inside the run
    (--batches 0 failed in generate, --repeats 0 in the median of no times)."""
    return _whole_number(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse type of a count that may be 0 (--warmup, --skip)."""
    return _whole_number(text, 0)


def _whole_number(text: str, least: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {least}, got {text!r}") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {n}")
    return n


def apply_to_torch(n: int | None):
    if n is not None:
        import torch
        torch.set_num_threads(n)


# --- 2. timing, memory, the machine, the result files -------------------------------------------------------

def timeit(fn, repeat: int = 5, warmup: int = 1) -> dict:
    """Run fn warmup times untimed, then `repeat` times: {"median", "min", "max", "times"} in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "times": times}


def machine() -> dict:
    """CPU model, cores, BLAS, library versions and the date: what a reader needs to compare figures."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy as np
    blas = "unknown"
    try:
        config = np.show_config(mode="dicts")
        info = config.get("Build Dependencies", {}).get("blas", {})
        blas = f"{info.get('name', '?')} {info.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - only a label
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for name in ("numba", "numba_cuda", "torch", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - optional
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "blas": blas, "versions": versions,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform()}


def fitted_exponent(xs, ys) -> float:
    """The k of y ~ x^k, least squares in log-log: 1 is linear."""
    import numpy as np
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


def format_table(columns, rows) -> str:
    cells = [[str(c) for c in columns]] + [[format_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_cell(value) -> str:
    """A table cell as both the printed tables and docs/benchmarks.md (run_all.py) show it: a float to 3
    significant digits below 1,000, else whole with thousands separators; anything else as str() has it."""
    if isinstance(value, float):  # (.3g wrote 7,760 as 7.76e+03)
        return f"{value:.3g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return str(value)


WRITTEN_BY = "tinygrad_ssm benchmarks"  # the mark that lets a later run replace a --json file of its own


def save_json(path, result: dict, indent: int = 1) -> None:
    """Write a result JSON where `--json` points: a new file, a file of benchmarks/results (the project's own), or
    one these scripts wrote (it carries WRITTEN_BY); never through a symbolic link. Anything else of the user's at
    that path is refused (SystemExit naming it), and left as it is."""
    from tinygrad_ssm.io.atomic_write import write_atomic
    text = json.dumps({**result, "written_by": WRITTEN_BY}, indent=indent, default=float) + "\n"
    if str(path) == "-":                                                # as dump_json: stdout, not a file named -
        sys.stdout.write(text)
        return
    path = Path(path)
    existing = path.exists() or path.is_symlink()
    if existing and not (not path.is_symlink() and path.is_file() and
                         (path.resolve().parent == RESULTS.resolve() or _written_by_us(path))):
        raise SystemExit(f"--json {str(path)!r} exists and is not a result these scripts wrote (or is a link); "
                         f"give a new file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, text, replace=existing)
    except FileExistsError:
        raise SystemExit(f"--json {str(path)!r}: a file appeared there while the benchmark ran; it was left as it "
                         f"is and the result not written") from None


def _written_by_us(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("written_by") == WRITTEN_BY
    except (OSError, ValueError, AttributeError):
        return False


def write_result(path, name: str, title: str, columns, rows, notes=(), plots=(), **extra) -> dict:
    """Print the table and write the result JSON (see the module docstring)."""
    result = {"name": name, "title": title, "columns": list(columns), "rows": [list(r) for r in rows],
              "notes": list(notes), "plots": list(plots), "machine": machine(), **extra}
    print(f"\n{title}\n{format_table(columns, rows)}")
    for note in notes:
        print(f"  {note}")
    save_json(path, result)
    if str(path) != "-":
        print(f"wrote {path}")
    return result


def default_json(name: str) -> str:
    return str(RESULTS / f"{name}.json")


def result_path(json_arg: str | None, name: str, quick: bool = False) -> str:
    """Where a script's --json goes: the flag's path, else benchmarks/results/NAME.json, or NAME_quick.json for a
    --quick run (a smoke run's figures never replace the record run_all.py renders into docs/benchmarks.md)."""
    return json_arg if json_arg is not None else default_json(name + ("_quick" if quick else ""))


def json_help(name: str) -> str:
    """--json's help for a script with --quick (result_path's rule)."""
    return (f"where the JSON goes, - for stdout [{default_json(name)}; with --quick "
            f"{default_json(name + '_quick')}]")


def dump_json(result: dict, where: str) -> None:
    """`--json FILE` (or `-` for stdout) of the scripts that print their own table."""
    if where == "-":
        print(json.dumps(result, indent=2))
        return
    save_json(where, result, indent=2)


# --- 3. the transformers twin -------------------------------------------------------------------------------

CONFIG = dict(vocab_size=256, d_model=256, n_layer=4, d_state=64, headdim=64, ngroups=1, expand=2, d_conv=4)
QUICK_CONFIG = dict(vocab_size=256, d_model=64, n_layer=2, d_state=16, headdim=16, ngroups=1, expand=2, d_conv=4)
# Mamba-2 130M's shape (state-spaces/mamba2-130m: vocabulary 50,277 padded to 50,288), random weights
SHAPE_130M = dict(vocab_size=50277, pad_vocab_size_multiple=16, d_model=768, n_layer=24, d_state=128, headdim=64,
                  ngroups=1, expand=2, d_conv=4)


def require_transformers():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise SystemExit(f"this benchmark needs the bench extra (pip install -e '.[bench]'): {e}") from None
    return torch, transformers


def ours(config_kw: dict, chunk_size: int, fused: bool = True, backend: str = "auto", seed: int = 0):
    from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
    config = Mamba2Config(**config_kw, chunk_size=chunk_size, tie_embeddings=True)
    return Mamba2LMHeadModel(config, VarMap(seed=seed), dtype="float32", backend=backend, fused=fused)


def theirs(model, chunk_size: int):
    """transformers' Mamba2ForCausalLM with `model`'s weights, copied through a safetensors file, in the model's
    dtype (float32 or float64; residual_in_fp32=False, so a float64 model keeps its residual stream float64)."""
    torch, transformers = require_transformers()
    from safetensors.torch import load_file

    from tinygrad_ssm.models.mamba2.pretrained import _stored_name
    c = model.config
    hf_config = transformers.Mamba2Config(
        vocab_size=c.padded_vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layer, state_size=c.d_state,
        head_dim=c.headdim, num_heads=c.nheads, n_groups=c.ngroups, expand=c.expand, conv_kernel=c.d_conv,
        chunk_size=chunk_size, use_bias=c.bias, use_conv_bias=c.conv_bias, layer_norm_epsilon=c.rms_norm_eps,
        time_step_limit=tuple(c.dt_limit), tie_word_embeddings=c.tie_embeddings, residual_in_fp32=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.Mamba2ForCausalLM(hf_config).to(getattr(torch, model.dtype.name))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        model.varmap.save(path, metadata={"format": "pt"})
        stored = load_file(path)
    state = {_stored_name(name, "transformers"): t for name, t in stored.items()}
    if c.tie_embeddings:
        state["lm_head.weight"] = state["backbone.embeddings.weight"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto transformers: missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        hf.tie_weights()
    hf.eval()
    return hf


def max_logit_difference(model, hf, ids) -> float:
    """Both sides' logits on the same ids (float32): how far apart the two implementations are."""
    import numpy as np
    import torch

    from tinygrad_ssm import no_grad
    with no_grad():
        a = model(ids).data
    with torch.no_grad():
        b = hf(torch.from_numpy(ids)).logits.numpy()
    return float(np.abs(a - b[..., :a.shape[-1]]).max())


def stats(seconds: list) -> dict:
    return {"median_s": round(statistics.median(seconds), 4), "min_s": round(min(seconds), 4),
            "max_s": round(max(seconds), 4), "runs": len(seconds)}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes, libc.malloc_trim.argtypes = [ctypes.c_int, ctypes.c_int], [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()
MEMORY_FLAG = "--memory-of"


def fixed_mmap_threshold():
    """Every block over 1 MiB mapped on its own and returned on free (glibc's sliding threshold would keep a
    step's freed memory resident, so the next step's peak would look like nothing). Only in the memory
    subprocesses: it also makes every large allocation fault its pages in, which would slow the timed runs."""
    if _LIBC is not None:
        _LIBC.mallopt(-3, 1 << 20)                                      # M_MMAP_THRESHOLD


def memory_mode() -> str | None:
    """The side whose memory this process measures (a subprocess started by `peak_memory_by_side`), or None."""
    return sys.argv[sys.argv.index(MEMORY_FLAG) + 1] if MEMORY_FLAG in sys.argv else None


def report_memory(sides: dict, name: str):
    """In a memory subprocess: warm `name` up once, then print the peak its next call adds, as JSON."""
    run = sides[name]
    run()
    print(json.dumps({"peak_added_bytes": peak_added_bytes(run)}))


def peak_memory_by_side(script: str, argv: list, names) -> dict:
    """Each side's peak added memory, measured in a fresh process of `script` per side (same arguments plus
    --memory-of NAME), so no side inherits another's heap and the timed process keeps glibc's defaults."""
    result = {}
    for name in names:
        done = subprocess.run([sys.executable, script, *argv, MEMORY_FLAG, name], capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result[name] = json.loads(lines[-1])["peak_added_bytes"] if done.returncode == 0 and lines else None
        if result[name] is None:
            print(f"memory of {name!r} not measured: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return result


def release_freed_memory() -> None:
    """Hand what the process has freed back to the system: glibc's free heap (malloc_trim) and the package's unused
    pooled arrays (heap_reuse.release_unused), after a garbage collection."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    if "tinygrad_ssm.fast.heap_reuse" in sys.modules:
        sys.modules["tinygrad_ssm.fast.heap_reuse"].release_unused()


def peak_added_bytes(fn):
    """Peak resident memory added by fn() over what the process holds before it (Linux: VmHWM reset through
    /proc/self/clear_refs, after handing freed heap back with malloc_trim and the package's unused pooled arrays
    with heap_reuse.release_unused, so a step's own arrays count in its peak). The same measure for both sides:
    arrays, tensors and allocator slack alike. None where /proc does not allow it."""
    try:
        release_freed_memory()
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                                # reset the peak to the current RSS
        fn()
        return _status("VmHWM") - before
    except OSError:
        return None
