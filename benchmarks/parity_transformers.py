"""Training parity with transformers' Mamba2ForCausalLM: same config, same initial weights (copied through a
safetensors file), same batches, AdamW with the same settings, both sides in float64.

    python benchmarks/parity_transformers.py [--steps 100] [--json PATH]

What is compared (tests/models/test_parity_transformers.py asserts the bounds):
- the initial logits (max |difference|, bound 1e-5);
- every parameter's gradient of the first loss (|g_ours - g_theirs| / |g_theirs|, bound 1e-5);
- the loss curves over the steps (max relative difference, bound 1e-4);
- greedy generation of 64 tokens (identical).

Plain float64 transformers is not float64 throughout: in its PyTorch path (the one that runs on a CPU) the RMS
norms, the gated norm and the whole SSD scan cast to float32, and so does A. That puts the floor of agreement
near 1e-6 per step, and 100 AdamW steps amplify it (Adam divides by the gradient's size, so a rounding-level
change in a small gradient moves that weight a full step): the loss curves drift to ~5e-4 by step 100. So the
comparison also runs with those casts kept float64 (`float64_throughout`, "their casts off"): then the two
sides agree to rounding, initial logits ~4e-16, gradients ~1e-15, loss curves ~1e-13 over 100 steps, greedy
generation identical, which shows that the casts, and nothing else, separate them. The tests assert the
issue's bounds on the plain run where they hold (logits, gradients, generation) and 1e-10 on everything in
the run with the casts off, the loss curves included. float32 is reported for the record, with no bound.
Their forward also casts the logits to float32, so their lm_head is applied here to their float64 last hidden
state; residual_in_fp32=False keeps their residual stream in float64.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_json, positive_int, require_transformers, write_result  # noqa: E402  (and the clone)

import tinygrad_ssm as tg  # noqa: E402
from tinygrad_ssm.models import Mamba2Config, Mamba2LMHeadModel  # noqa: E402
from tinygrad_ssm.optim import AdamW  # noqa: E402
from tinygrad_ssm.models.mamba2.pretrained import _stored_name  # noqa: E402
from tinygrad_ssm.registry import VarMap  # noqa: E402

# A small model that still has every feature: 2 layers, 2 groups of 2 heads, chunks shorter than the sequence.
CONFIG = dict(d_model=32, n_layer=2, vocab_size=256, d_state=16, headdim=16, ngroups=2, chunk_size=16,
              pad_vocab_size_multiple=8, tie_embeddings=True)
BATCH, SEQLEN = 2, 40
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
BOUNDS = dict(initial_logits=1e-5, gradients=1e-5, losses=1e-4)
EXACT_BOUND = 1e-10  # with transformers' internal float32 casts kept float64: rounding alone


def build_pair(dtype: str = "float64", seed: int = 0, config: dict | None = None):
    """(ours, theirs): the same weights on both sides, copied through one safetensors file (_common.theirs)."""
    from _common import theirs
    c = Mamba2Config(**(config or CONFIG))
    ours = Mamba2LMHeadModel(c, VarMap(seed=seed), dtype=dtype)
    return ours, theirs(ours, c.chunk_size)


WORDS = ("the state space model reads each byte once and keeps a small state that it updates with a decay "
         "learnt from the input so the scan costs linear time in the length of the sequence while attention "
         "costs quadratic time").split()


def _text(n_words: int = 20_000, seed: int = 0) -> np.ndarray:
    """Sentences of a small vocabulary drawn by a seeded generator: text with structure (the loss falls as it
    trains) that is the same in every checkout, whatever else the repository holds."""
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, n_words)
    ends = rng.random(n_words) < 0.1
    text = " ".join(w + (".\n" if end else "") for w, end in zip(words, ends))
    return np.frombuffer(text.encode(), dtype=np.uint8)


def batches(steps: int, seed: int = 1):
    """The same (input ids, targets) for both sides, step after step: random windows of the text."""
    text, rng = _text().astype(np.int64), np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(text) - SEQLEN - 1, BATCH)
        window = np.stack([text[s:s + SEQLEN + 1] for s in starts])   # (BATCH, SEQLEN + 1)
        yield window[:, :-1], window[:, 1:]


@contextlib.contextmanager
def float64_throughout():
    """While active, a float64 tensor's casts to float32 (`.float()`, `.to(torch.float32)`, as transformers'
    CPU path does in its norms and its scan) keep float64. Used to show that those casts, and nothing else,
    are what separates the two sides: with them gone, the sides agree to rounding (1e-13 over 100 steps)."""
    import torch
    to_float, to = torch.Tensor.float, torch.Tensor.to

    def keep_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)

    def keep_to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return to(self, *args, **kwargs)

    torch.Tensor.float, torch.Tensor.to = keep_float, keep_to
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to = to_float, to


def their_logits(theirs, ids, exact: bool = False):
    """Their lm_head on their last hidden state, in the model's own dtype (their forward casts to float32).
    exact: without their internal float32 casts (float64_throughout)."""
    import torch
    with float64_throughout() if exact else contextlib.nullcontext():
        hidden = theirs.backbone(torch.from_numpy(ids)).last_hidden_state
        return theirs.lm_head(hidden)


def their_loss(theirs, ids, targets, exact: bool = False):
    import torch
    logits = their_logits(theirs, ids, exact)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets).reshape(-1))


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def compare(dtype: str = "float64", steps: int = 100, new_tokens: int = 64, seed: int = 0, exact: bool = False) -> dict:
    """Every figure of the module docstring, for one dtype; `exact`: their side without its float32 casts."""
    import torch
    ours, theirs = build_pair(dtype, seed)
    ids0, targets0 = next(batches(1))

    # initial logits
    with tg.no_grad():
        logits_ours = ours(ids0).data
    with torch.no_grad():
        logits_theirs = their_logits(theirs, ids0, exact).numpy()
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
        loss_theirs = their_loss(theirs, ids, targets, exact)
        loss_theirs.backward()
        if step == 0:
            for name, t in ours.varmap.named_vars():
                gradients[name] = _relative(t.grad.data, their_params[_stored_name(name, "transformers")].grad.numpy())
        losses_ours.append(float(loss.item()))
        losses_theirs.append(float(loss_theirs.item()))
        opt_ours.step()
        opt_theirs.step()
    losses = max(abs(a - b) / abs(b) for a, b in zip(losses_ours, losses_theirs))

    # greedy generation from the trained weights
    prompt = ids0[:1, :16]
    generated_ours = ours.generate(prompt, new_tokens, temperature=0)[0, prompt.shape[1]:]
    with torch.no_grad(), float64_throughout() if exact else contextlib.nullcontext():
        generated_theirs = theirs.generate(torch.from_numpy(prompt), max_new_tokens=new_tokens, do_sample=False,
                                           min_new_tokens=new_tokens, pad_token_id=0)[0, prompt.shape[1]:].numpy()
    return dict(dtype=dtype, exact=exact, steps=steps, initial_logits_max_abs=initial_logits,
                worst_gradient=max(gradients, key=gradients.get), worst_gradient_relative=max(gradients.values()),
                gradients_relative=gradients, losses_max_relative=losses, loss_first=losses_ours[0],
                loss_last=losses_ours[-1], losses_ours=losses_ours, losses_theirs=losses_theirs,
                generated_identical=bool(np.array_equal(generated_ours, generated_theirs)),
                generated_first_difference=int(np.argmax(generated_ours != generated_theirs))
                if not np.array_equal(generated_ours, generated_theirs) else None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--steps", type=positive_int, default=100)
    parser.add_argument("--json", default=default_json("parity_transformers"))
    args = parser.parse_args(argv)
    torch, transformers = require_transformers()    # (a clear stop without the bench extra)
    print(f"parity with transformers {transformers.__version__}: {CONFIG}, batch {BATCH} x {SEQLEN}, "
          f"AdamW {ADAMW}, {args.steps} steps", flush=True)
    runs, rows = {}, []
    for label, dtype, exact in (("float64", "float64", False), ("float64, their casts off", "float64", True),
                                ("float32", "float32", False)):
        r = runs[label] = compare(dtype, args.steps, exact=exact)
        rows.append([label, r["initial_logits_max_abs"], r["worst_gradient_relative"], r["worst_gradient"],
                     r["losses_max_relative"], f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}",
                     "identical" if r["generated_identical"] else f"differ at {r['generated_first_difference']}"])
    f64, exact = runs["float64"], runs["float64, their casts off"]
    ok = (f64["initial_logits_max_abs"] < BOUNDS["initial_logits"] and f64["worst_gradient_relative"] <
          BOUNDS["gradients"] and f64["generated_identical"] and exact["initial_logits_max_abs"] < EXACT_BOUND
          and exact["worst_gradient_relative"] < EXACT_BOUND and exact["losses_max_relative"] < EXACT_BOUND
          and exact["generated_identical"])
    notes = [f"bounds (asserted by tests/models/test_parity_transformers.py): {BOUNDS} for plain float64 (the loss curve "
             f"bound on the run with their casts off), {EXACT_BOUND:g} for everything with their casts off; all "
             f"met: {'yes' if ok else 'NO'}",
             "transformers' CPU path computes its norms and SSD scan in float32 even in a float64 model: the floor "
             "of plain float64 agreement is ~1e-6 per step, and 100 AdamW steps amplify it (Adam divides by the "
             "gradient's size, so a rounding-level change in a small gradient moves its weight a full step). "
             "With those casts kept float64 (\"their casts off\", float64_throughout) the two sides agree to "
             "rounding: nothing else differs. float32 is reported for the record, with no bound",
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
