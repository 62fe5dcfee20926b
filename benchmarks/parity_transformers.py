"""Training parity with transformers' Mamba2ForCausalLM: same config, same initial weights (copied through a
safetensors file), same batches, AdamW with the same settings, both sides in float64.

    python benchmarks/parity_transformers.py [--steps 100] [--json PATH]

What is compared (the bounds tests/test_parity_transformers.py asserts):
- the initial logits (max |difference|, bound 1e-5);
- every parameter's gradient of the first loss (|g_ours - g_theirs| / |g_theirs|, bound 1e-5);
- the loss curves over the steps (max relative difference, bound 1e-4);
- greedy generation of 64 tokens (identical).
and the same figures in float32, for the record (no bound).

Agreement is bounded near 1e-6, not 1e-15, by transformers itself: in its PyTorch path (the one that runs on a
CPU) the RMS norms, the gated norm and the whole SSD scan compute in float32 even in a float64 model, and A is
cast to float32. The worst gradient is D's (3.9e-6): D's gradient sums dy * x over every position and channel,
terms of both signs that cancel, so float32 rounding shows most there; our own model in float32 against float64
puts D's gradient off by 7.9e-6 the same way (measured on this config), above every other parameter. It also casts
the logits to float32, so its lm_head is applied here to its float64 last hidden
state. residual_in_fp32=False keeps its residual stream in float64.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_json, write_result  # noqa: E402  (and the repository on the path)

import tinygrad_ssm as tg  # noqa: E402
from tinygrad_ssm.models import Mamba2Config, Mamba2LMHeadModel  # noqa: E402
from tinygrad_ssm.optim import AdamW  # noqa: E402
from tinygrad_ssm.registry import VarMap  # noqa: E402

# A small model that still has every feature: 2 layers, 2 groups of 2 heads, chunks shorter than the sequence.
CONFIG = dict(d_model=32, n_layer=2, vocab_size=256, d_state=16, headdim=16, ngroups=2, chunk_size=16,
              pad_vocab_size_multiple=8, tie_embeddings=True)
BATCH, SEQLEN = 2, 40
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
BOUNDS = dict(initial_logits=1e-5, gradients=1e-5, losses=1e-4)


def _hf_name(ours: str) -> str:
    """Our (mamba_ssm) parameter name -> transformers' name: only the embedding differs (embeddings, with an s)."""
    return ours.replace("backbone.embedding.", "backbone.embeddings.")


def build_pair(dtype: str = "float64", seed: int = 0, config: dict | None = None):
    """(ours, theirs): the same weights on both sides, copied through one safetensors file."""
    import torch
    from safetensors.numpy import save_file
    from safetensors.torch import load_file
    from transformers import Mamba2Config as HFConfig, Mamba2ForCausalLM

    c = Mamba2Config(**(config or CONFIG))
    ours = Mamba2LMHeadModel(c, VarMap(seed=seed), dtype=dtype)
    hf_config = HFConfig(hidden_size=c.d_model, num_hidden_layers=c.n_layer, vocab_size=c.padded_vocab_size,
                         state_size=c.d_state, head_dim=c.headdim, num_heads=c.nheads, n_groups=c.ngroups,
                         expand=c.expand, conv_kernel=c.d_conv, chunk_size=c.chunk_size, use_bias=c.bias,
                         use_conv_bias=c.conv_bias, layer_norm_epsilon=c.rms_norm_eps,
                         time_step_limit=tuple(c.dt_limit), tie_word_embeddings=c.tie_embeddings,
                         residual_in_fp32=False, rescale_prenorm_residual=False)
    torch.manual_seed(seed)
    theirs = Mamba2ForCausalLM(hf_config).to(getattr(torch, dtype))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        save_file({_hf_name(n): np.ascontiguousarray(t.data) for n, t in ours.varmap.named_vars()}, path)
        state = load_file(path)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if c.tie_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise RuntimeError(f"weights do not map one to one: missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        theirs.tie_weights()
    return ours, theirs


def _text() -> np.ndarray:
    """Bytes of this package's own sources: text with structure, so the loss falls as it trains."""
    package = Path(tg.__file__).parent
    return np.frombuffer(b"".join(p.read_bytes() for p in sorted(package.glob("*.py"))), dtype=np.uint8)


def batches(steps: int, seed: int = 1):
    """The same (input ids, targets) for both sides, step after step: random windows of the text."""
    text, rng = _text().astype(np.int64), np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(text) - SEQLEN - 1, BATCH)
        window = np.stack([text[s:s + SEQLEN + 1] for s in starts])   # (BATCH, SEQLEN + 1)
        yield window[:, :-1], window[:, 1:]


def their_logits(theirs, ids):
    """Their lm_head on their last hidden state, in the model's own dtype (their forward casts to float32)."""
    import torch
    hidden = theirs.backbone(torch.from_numpy(ids)).last_hidden_state
    return theirs.lm_head(hidden)


def their_loss(theirs, ids, targets):
    import torch
    logits = their_logits(theirs, ids)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets).reshape(-1))


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def compare(dtype: str = "float64", steps: int = 100, new_tokens: int = 64, seed: int = 0) -> dict:
    """Every figure of the module docstring, for one dtype."""
    import torch
    ours, theirs = build_pair(dtype, seed)
    ids0, targets0 = next(batches(1))

    # initial logits
    with tg.no_grad():
        logits_ours = ours(ids0).data
    with torch.no_grad():
        logits_theirs = their_logits(theirs, ids0).numpy()
    initial_logits = float(np.abs(logits_ours - logits_theirs).max())

    # gradients of the first loss, and the loss curves under AdamW
    their_params = dict(theirs.named_parameters())
    opt_ours = AdamW(ours.varmap, **ADAMW)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), **ADAMW)
    gradients, losses_ours, losses_theirs = {}, [], []
    for step, (ids, targets) in enumerate(batches(steps)):
        opt_ours.zero_grad()
        loss = ours.loss(ids, targets)
        loss.backward()
        opt_theirs.zero_grad()
        loss_theirs = their_loss(theirs, ids, targets)
        loss_theirs.backward()
        if step == 0:
            for name, t in ours.varmap.named_vars():
                gradients[name] = _relative(t.grad.data, their_params[_hf_name(name)].grad.numpy())
        losses_ours.append(float(loss.item()))
        losses_theirs.append(float(loss_theirs.item()))
        opt_ours.step()
        opt_theirs.step()
    losses = max(abs(a - b) / abs(b) for a, b in zip(losses_ours, losses_theirs))

    # greedy generation from the trained weights
    prompt = ids0[:1, :16]
    generated_ours = ours.generate(prompt, new_tokens, temperature=0)[0, prompt.shape[1]:]
    with torch.no_grad():
        generated_theirs = theirs.generate(torch.from_numpy(prompt), max_new_tokens=new_tokens, do_sample=False,
                                           min_new_tokens=new_tokens, pad_token_id=0)[0, prompt.shape[1]:].numpy()
    return dict(dtype=dtype, steps=steps, initial_logits_max_abs=initial_logits,
                worst_gradient=max(gradients, key=gradients.get), worst_gradient_relative=max(gradients.values()),
                gradients_relative=gradients, losses_max_relative=losses, loss_first=losses_ours[0],
                loss_last=losses_ours[-1], losses_ours=losses_ours, losses_theirs=losses_theirs,
                generated_identical=bool(np.array_equal(generated_ours, generated_theirs)),
                generated_first_difference=int(np.argmax(generated_ours != generated_theirs))
                if not np.array_equal(generated_ours, generated_theirs) else None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", default=default_json("parity_transformers"))
    args = parser.parse_args(argv)
    import torch
    import transformers
    print(f"parity with transformers {transformers.__version__}: {CONFIG}, batch {BATCH} x {SEQLEN}, "
          f"AdamW {ADAMW}, {args.steps} steps", flush=True)
    runs, rows = {}, []
    for dtype in ("float64", "float32"):
        r = runs[dtype] = compare(dtype, args.steps)
        rows.append([dtype, r["initial_logits_max_abs"], r["worst_gradient_relative"], r["worst_gradient"],
                     r["losses_max_relative"], f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}",
                     "identical" if r["generated_identical"] else f"differ at {r['generated_first_difference']}"])
    f64 = runs["float64"]
    ok = (f64["initial_logits_max_abs"] < BOUNDS["initial_logits"] and f64["worst_gradient_relative"] <
          BOUNDS["gradients"] and f64["losses_max_relative"] < BOUNDS["losses"] and f64["generated_identical"])
    notes = [f"float64 bounds (asserted by tests/test_parity_transformers.py): {BOUNDS}; within them and greedy "
             f"identical: {'yes' if ok else 'NO'}",
             "transformers' CPU path computes its norms and SSD scan in float32 even in a float64 model, which puts "
             "the floor of agreement near 1e-6; float32 is reported for the record, with no bound",
             f"model {CONFIG}, batch {BATCH} x {SEQLEN} bytes of text, AdamW {ADAMW}, {args.steps} steps, "
             f"torch {torch.__version__}, transformers {transformers.__version__}"]
    write_result(args.json, "parity_transformers", f"Training parity with transformers, {args.steps} AdamW steps",
                 ["dtype", "initial logits max |d|", "worst gradient rel", "worst parameter", "loss curve max rel",
                  "loss first -> last", f"greedy {64} tokens"], rows, notes=notes,
                 plots=[{"file": "parity_transformers_loss.png", "title": "Loss curves, float64, same batches",
                         "xlabel": "step", "ylabel": "loss", "logx": False, "logy": False,
                         "series": {"tinygrad_ssm": list(enumerate(f64["losses_ours"])),
                                    "transformers": list(enumerate(f64["losses_theirs"]))}}],
                 runs=runs, bounds_float64=BOUNDS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
