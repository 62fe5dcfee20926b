"""What every benchmark script shares: timing (median of n after warm-up, with min and max), peak memory of a
piece of work, the machine's facts, and one JSON layout that run_all.py turns into docs/benchmarks.md.

A result file holds {"name", "title", "columns", "rows", "notes", "machine", "plots", ...}: `rows` are the
printed table's rows (plain numbers and strings), `plots` a list of {"file", "title", "xlabel", "ylabel",
"logx", "logy", "series": {label: [[x, y], ...]}} drawn by run_all.py. Scripts may add any other key.
"""
from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # run from a clone without installing


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


def current_rss() -> int:
    """Resident memory of this process now, in bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def peak_rss() -> int:
    """The most resident memory this process has held so far, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_increment(fn) -> int:
    """Bytes of resident memory fn needs above what the process holds before it: the process's peak after fn
    minus its size before. Meaningful for the first big piece of work in a fresh process (the peak never
    goes down), so the scripts measure each side in its own subprocess. Counts NumPy and PyTorch alike."""
    gc.collect()
    before = current_rss()
    fn()
    return max(0, peak_rss() - before)


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
    blas = "unknown"
    try:
        config = np.show_config(mode="dicts")
        info = config.get("Build Dependencies", {}).get("blas", {})
        blas = f"{info.get('name', '?')} {info.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - only a label
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for name in ("numba", "torch", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - optional
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "blas": blas, "versions": versions,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform()}


def fitted_exponent(xs, ys) -> float:
    """The k of y ~ x^k, least squares in log-log: 1 is linear."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


def format_table(columns, rows) -> str:
    cells = [[str(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def write_result(path, name: str, title: str, columns, rows, notes=(), plots=(), **extra) -> dict:
    """Print the table and write the result JSON (see the module docstring)."""
    result = {"name": name, "title": title, "columns": list(columns), "rows": [list(r) for r in rows],
              "notes": list(notes), "plots": list(plots), "machine": machine(), **extra}
    print(f"\n{title}\n{format_table(columns, rows)}")
    for note in notes:
        print(f"  {note}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {path}")
    return result


def default_json(name: str) -> str:
    return str(RESULTS / f"{name}.json")


def dump_json(result: dict, where: str) -> None:
    """`--json FILE` (or `-` for stdout) of the scripts that print their own table."""
    text = json.dumps(result, indent=2)
    if where == "-":
        print(text)
        return
    Path(where).parent.mkdir(parents=True, exist_ok=True)
    Path(where).write_text(text + "\n")
