"""Shared by bench_train_step.py, bench_generate.py and parity_transformers.py: the benchmark's Mamba-2 on both sides with the same
weights (ours saved to safetensors, read back into transformers' Mamba2ForCausalLM under its layout names),
wall-clock statistics, and the peak memory one call adds.

Needs the `bench` extra (torch==2.13.0, transformers==5.24.0); each script says so and stops without them.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
from tinygrad_ssm.models.mamba2.pretrained import _stored_name

CONFIG = dict(vocab_size=256, d_model=256, n_layer=4, d_state=64, headdim=64, ngroups=1, expand=2, d_conv=4)
QUICK_CONFIG = dict(vocab_size=256, d_model=64, n_layer=2, d_state=16, headdim=16, ngroups=1, expand=2, d_conv=4)


def require_transformers():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise SystemExit(f"this benchmark needs the bench extra (pip install -e '.[bench]'): {e}") from None
    return torch, transformers


def ours(config_kw: dict, chunk_size: int, fused: bool = True, backend: str = "auto", seed: int = 0):
    config = Mamba2Config(**config_kw, chunk_size=chunk_size, tie_embeddings=True)
    return Mamba2LMHeadModel(config, VarMap(seed=seed), dtype="float32", backend=backend, fused=fused)


def theirs(model: Mamba2LMHeadModel, chunk_size: int):
    """transformers' Mamba2ForCausalLM with `model`'s weights, copied through a safetensors file, in the model's
    dtype (float32 or float64; residual_in_fp32=False, so a float64 model keeps its residual stream float64)."""
    torch, transformers = require_transformers()
    from safetensors.torch import load_file
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


def max_logit_difference(model, hf, ids: np.ndarray) -> float:
    """Both sides' logits on the same ids (float32): how far apart the two implementations are."""
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


def peak_added_bytes(fn):
    """Peak resident memory added by fn() over what the process holds before it (Linux: VmHWM reset through
    /proc/self/clear_refs, after handing freed heap back with malloc_trim). The same measure for both sides:
    arrays, tensors and allocator slack alike. None where /proc does not allow it."""
    try:
        gc.collect()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                                # reset the peak to the current RSS
        fn()
        return _status("VmHWM") - before
    except OSError:
        return None
