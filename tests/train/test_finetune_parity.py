"""Fine-tuning with `train --init-from` against the plain PyTorch loop a transformers user writes, from the same
transformers folder (config.json + model.safetensors + tokenizer.json): Mamba2ForCausalLM.from_pretrained, the
batches the package drew (recorded from its sampler), torch.optim.AdamW with two parameter groups (weight decay on
the ndim >= 2 tensors only, betas (0.9, 0.95), eps 1e-8), torch.nn.utils.clip_grad_norm_, and the package's
schedule written out here from its definition (linear warmup lr * (k + 1) / W, then cosine to --min-lr). Both in
float64. tests/models/test_parity_transformers.py compares the model and AdamW alone; this compares what the
training loop adds: the loading, the decay groups, the clipping, the schedule, the saved run folder.

transformers' CPU path casts its norms, its scan and its residual stream to float32 even in a float64 model, so
its side runs under float64_throughout (benchmarks/parity_transformers.py), which keeps them float64: then the
two sides differ by rounding alone: losses and gradient norms agree to ~5e-16 relative, weights after 5 steps to
~5e-15, so 1e-10 has room; decay on the vectors too, another clip, another warmup each fail it (tried)."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.checkpoints import write_checkpoint
from tests.support.training import quiet
from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import load_file
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.pretrained import _stored_name
from tinygrad_ssm.train import loop
from tinygrad_ssm.train.loop import TrainConfig, train

torch = pytest.importorskip("torch", reason="torch is an optional reference (pip install -e '.[bench]')")
transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import parity_transformers as parity  # noqa: E402

BOUND = 1e-10  # rounding alone (see the docstring)
# a clip low enough that every step is clipped, a schedule with both phases in 5 steps
SETTINGS = dict(dtype="float64", steps=5, warmup_steps=2, lr=3e-3, min_lr=5e-4, weight_decay=0.1, grad_clip=0.5,
                batch_size=2, seq_len=24, chunk_size=16, eval_every=5, eval_batches=1, checkpoint_every=5,
                sample_bytes=2)


def package_schedule(k: int, cfg: TrainConfig) -> float:
    """The lr of step k (from 0), as --help and optim/schedule.py define it."""
    w, t = cfg.warmup_steps, cfg.steps
    if k < w:
        return cfg.lr * (k + 1) / w
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * (k - w) / (t - w)))


def fine_tune_both(folder: Path, corpus: Path, out: Path, monkeypatch):
    """The package's run from `folder` and the PyTorch loop on the batches it drew: (run folder, its log's step
    records, the torch model after the loop, its losses, its gradient norms, its learning rates)."""
    batches = []

    class Recording(loop.BatchSampler):
        def next_batch(self):
            batches.append(super().next_batch())
            return batches[-1]

    monkeypatch.setattr(loop, "BatchSampler", Recording)
    cfg = TrainConfig(**SETTINGS, data=str(corpus), out=str(out), init_from=str(folder))
    assert train(cfg, progress=False, say=quiet).status == "done"
    records = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "train_loss" in r]
    assert len(batches) == len(records) == cfg.steps

    hf = transformers.Mamba2ForCausalLM.from_pretrained(folder, dtype=torch.float64)
    named = list(hf.named_parameters())                                  # (a tied lm_head is listed once)
    opt = torch.optim.AdamW([{"params": [p for _, p in named if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                             {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    losses, norms, lrs = [], [], []
    for k, (x, y) in enumerate(batches):                                 # x, y: (b, l) int64
        lrs.append(package_schedule(k, cfg))
        for group in opt.param_groups:
            group["lr"] = lrs[-1]
        opt.zero_grad()
        logits = parity.their_logits(hf, x, exact=True)                 # (b, l, padded vocab)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
        with parity.float64_throughout():
            loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(hf.parameters(), cfg.grad_clip)))
        opt.step()
        losses.append(float(loss.detach()))
    return out, records, hf, losses, norms, lrs


@pytest.mark.parametrize("tied, vocab_size", [(True, 320), (False, 336)])
def test_fine_tuning_equals_the_pytorch_loop_on_the_same_batches(tied, vocab_size, bpe_tokenizer, corpus, tmp_path,
                                                                 monkeypatch):
    """Tied and untied embeddings (tie_word_embeddings false); the untied one padded to 336 rows for the
    tokenizer's 320, as a transformers config states its vocabulary."""
    config = Mamba2Config(d_model=32, n_layer=2, vocab_size=vocab_size, d_state=16, headdim=16, ngroups=2,
                          chunk_size=16, tie_embeddings=tied)
    folder = write_checkpoint("transformers", tmp_path / "hf", Mamba2LMHeadModel(config, VarMap(seed=5)),
                              tokenizer_json=bpe_tokenizer)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    out, records, hf, losses, norms, lrs = fine_tune_both(folder, corpus, tmp_path / "run", monkeypatch)

    assert [r["lr"] for r in records] == lrs                             # the schedule, exactly
    assert min(norms) > SETTINGS["grad_clip"]                            # every step clipped: the clip compared
    np.testing.assert_allclose([r["grad_norm"] for r in records], norms, rtol=BOUND)
    np.testing.assert_allclose([r["train_loss"] for r in records], losses, rtol=BOUND)
    assert losses[-1] < losses[0]

    checkpoint = out / "checkpoints" / f"step-{SETTINGS['steps']:06d}"
    saved = json.loads((checkpoint / "config.json").read_text())
    assert saved["tie_embeddings"] is tied and saved["vocab_size"] == vocab_size
    ours = load_file(checkpoint / "model.safetensors")                  # float64, as trained
    theirs = {n: p.detach().numpy() for n, p in hf.named_parameters()}
    assert ("lm_head.weight" in ours) is (not tied)                      # a tied head is the embedding, not saved
    assert len(ours) == len(theirs)
    worst = max(float(np.abs(a - theirs[_stored_name(n, "transformers")]).max()) for n, a in ours.items())
    assert worst < BOUND, worst
    moved = float(np.abs(ours["backbone.embedding.weight"] - load_file(folder / "model.safetensors")[
        "backbone.embeddings.weight"]).max())
    assert moved > 1e-4                                                  # the weights compared have moved
    if not tied:                                                         # and the head apart from the embedding
        assert not np.allclose(ours["lm_head.weight"], ours["backbone.embedding.weight"])
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the folder fine-tuned from: untouched
