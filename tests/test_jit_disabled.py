"""NUMBA_DISABLE_JIT=1 (what a reader sets to step through a kernel in a debugger) runs the package, slowly: every
numba intrinsic (fast/claims.py's atomics, fast/fast_exp.py's bit casts, fast/vector_width.py's hint) has a
pure-Python twin (issue 24, class 9). Training and generation give what the compiled kernels give.

Tolerance: in float64 the compiled kernels differ from their Python run only by fastmath's reassociation and
fused multiply-adds, a few ulp per operation; over a 2-step tiny run the losses agree to about 1e-13 relative,
so 1e-9 leaves five orders of margin and still catches any real difference (a wrong kernel moves the loss in
the second or third digit). Greedy generation from the same weights picks the same bytes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "2",
        "--seq-len", "32", "--eval-batches", "1", "--eval-every", "1", "--sample-bytes", "8", "--no-progress",
        "--dtype", "float64", "--steps", "2"]


def _run(args, jit: bool, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONIOENCODING": "utf-8", "NUMBA_NUM_THREADS": "2"}
    env.pop("NUMBA_DISABLE_JIT", None)
    if not jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    return subprocess.run([sys.executable, "-m", "tinygrad_ssm", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [r[k] for r in records for k in ("train_loss", "val_loss", "val_bpb") if k in r]


@pytest.mark.parametrize("backend", ["numba_chunked"])
def test_training_and_generation_run_with_the_jit_disabled(corpus, tmp_path, backend):
    runs = {}
    for jit in (True, False):
        out = tmp_path / ("jit" if jit else "nojit")
        proc = _run(["train", "--data", corpus, "--out", out, "--backend", backend, *TINY], jit)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[jit] = out
    with_jit, without = _losses(runs[True]), _losses(runs[False])
    assert len(with_jit) == len(without) >= 4
    for a, b in zip(with_jit, without):
        assert abs(a - b) <= 1e-9 * abs(a), (with_jit, without)

    for weights in (None, "int8", "bfloat16"):                         # quantized: the intrinsics' NumPy twins
        texts, quantized = {}, [] if weights is None else ["--weights", weights]
        for jit in (True, False):
            proc = _run(["generate", "--checkpoint", runs[True], "--prompt", "line 1", "--max-new-tokens", "24",
                         "--temperature", "0", "--backend", backend, *quantized], jit)
            assert proc.returncode == 0, proc.stderr[-3000:]
            texts[jit] = proc.stdout
        assert texts[True].startswith("line 1") and len(texts[True]) > len("line 1")
        assert texts[False] == texts[True], weights
