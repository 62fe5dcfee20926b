"""Every Mamba2Config setting a real checkpoint may change, computed as transformers' Mamba2ForCausalLM computes
it: a small random model of each variant is built by transformers itself, written by its own save_pretrained (its
config.json keys, its weight names), loaded here by from_pretrained, and held to its float64 logits, to the logits
of prefill + one-token steps, and to its gradients, on the fused and the engine-op path. The same weights under a
mamba_ssm config.json (the ssm_cfg names that mean the same settings) give the same logits.

transformers' CPU path casts its norms and scan to float32 inside a float64 model; float64_throughout
(benchmarks/parity_transformers.py) keeps those casts float64, so the bound is rounding (1e-10), not float32's."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional reference (pip install -e '.[bench]')")
transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from parity_transformers import float64_throughout  # noqa: E402

import tinygrad_ssm as tg  # noqa: E402
from tinygrad_ssm.models import Mamba2LMHeadModel  # noqa: E402
from tinygrad_ssm.models.mamba2.pretrained import _stored_name  # noqa: E402

BOUND = 1e-10
BASE = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, state_size=16, head_dim=16, num_heads=4, n_groups=2,
            expand=2, conv_kernel=4, chunk_size=8, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            residual_in_fp32=False)  # their residual stream float32 otherwise, in a float64 model
# each variant changes several settings from BASE; together they change every one that reaches the logits
VARIANTS = {
    "one-group-biases-eps": dict(n_groups=1, use_bias=True, layer_norm_epsilon=1e-2),
    "four-groups-no-conv-bias-dt-limit": dict(n_groups=4, use_conv_bias=False, time_step_limit=(0.05, 0.3)),
    "tied-kernel-2-headdim-8": dict(tie_word_embeddings=True, conv_kernel=2, head_dim=8, num_heads=8),
    "expand-1-state-64-kernel-6": dict(expand=1, num_heads=2, state_size=64, conv_kernel=6, chunk_size=5),
}
IDS = np.random.default_rng(0).integers(0, 61, (2, 19))                 # l = 19: several chunks, a partial last one


def their_model(variant: str, folder: Path):
    """transformers' model of the variant, every parameter moved off its init (D = 1, zero biases, unit norm
    weights hide bugs; dt_bias spans both ends of a dt_limit clamp), saved into `folder` by transformers."""
    torch.manual_seed(sorted(VARIANTS).index(variant))
    theirs = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**(BASE | VARIANTS[variant]))).double().eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name.endswith("dt_bias"):
                p.copy_(torch.empty_like(p).uniform_(-4.0, 2.0))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.3, 4.0)))
            elif "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
            elif p.ndim == 1:                                           # D and the biases
                p.copy_(0.3 * torch.randn_like(p))
    theirs.save_pretrained(folder)
    return theirs


def their_logits(theirs, ids):
    with float64_throughout():                                          # their lm_head on their float64 hidden state
        return theirs.lm_head(theirs.backbone(torch.from_numpy(ids)).last_hidden_state)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    theirs = their_model(request.param, folder)
    with torch.no_grad():
        logits = their_logits(theirs, IDS).numpy()
    return folder, theirs, logits


@pytest.mark.parametrize("fused", [True, False])
def test_logits_and_prefill_then_steps_are_transformers(pair, fused):
    folder, _, logits = pair
    ours = Mamba2LMHeadModel.from_pretrained(folder, dtype="float64", fused=fused)
    with tg.no_grad():
        assert np.abs(ours(IDS).data - logits).max() < BOUND
        cache = ours.allocate_cache(2)
        pieces = [ours(IDS[:, :7], cache).data]                         # prefill, then one token at a time
    pieces += [ours.step(IDS[:, t], cache).data[:, None] for t in range(7, IDS.shape[1])]
    assert np.abs(np.concatenate(pieces, axis=1) - logits).max() < BOUND


@pytest.mark.parametrize("fused", [True, False])
def test_gradients_are_transformers(pair, fused):
    folder, theirs, _ = pair
    ours = Mamba2LMHeadModel.from_pretrained(folder, dtype="float64", fused=fused)
    targets = np.roll(IDS, -1, axis=1)
    ours.loss(IDS, targets).backward()
    theirs.zero_grad()
    logits = their_logits(theirs, IDS)
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      torch.from_numpy(targets).reshape(-1)).backward()
    their_grads = {name: p.grad.numpy() for name, p in theirs.named_parameters()}
    if ours.config.tie_embeddings:                                      # one tensor: its gradient counts both uses
        their_grads.pop("lm_head.weight", None)
    names = [name for name, _ in ours.varmap.named_vars()]
    assert sorted(_stored_name(n, "transformers") for n in names) == sorted(their_grads)
    for name, t in ours.varmap.named_vars():
        theirs_g = their_grads[_stored_name(name, "transformers")]
        assert np.linalg.norm(t.grad.data - theirs_g) <= BOUND * np.linalg.norm(theirs_g), name


def test_the_same_weights_under_a_mamba_ssm_config_give_the_same_logits(pair, tmp_path):
    """mamba_ssm's names for the same settings (ssm_cfg.ngroups, bias, conv_bias, dt_limit, d_conv, ...), its
    embedding name, and a vocabulary padded by pad_vocab_size_multiple to the rows transformers stores."""
    folder, theirs, logits = pair
    c = theirs.config
    ssm_cfg = {"layer": "Mamba2", "d_state": c.state_size, "d_conv": c.conv_kernel, "expand": c.expand,
               "headdim": c.head_dim, "ngroups": c.n_groups, "chunk_size": c.chunk_size, "bias": c.use_bias,
               "conv_bias": c.use_conv_bias, "dt_limit": list(c.time_step_limit)}
    config = {"d_model": c.hidden_size, "n_layer": c.num_hidden_layers, "vocab_size": c.vocab_size - 3,
              "pad_vocab_size_multiple": c.vocab_size, "tie_embeddings": c.tie_word_embeddings, "ssm_cfg": ssm_cfg}
    if c.layer_norm_epsilon != 1e-5:
        config["norm_epsilon"] = c.layer_norm_epsilon                   # this package's key; mamba_ssm fixes 1e-5
    (tmp_path / "config.json").write_text(json.dumps(config))
    from safetensors.numpy import load_file, save_file
    weights = load_file(str(folder / "model.safetensors"))
    weights["backbone.embedding.weight"] = weights.pop("backbone.embeddings.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    ours = Mamba2LMHeadModel.from_pretrained(tmp_path, dtype="float64")
    assert ours.config.padded_vocab_size == c.vocab_size
    with tg.no_grad():
        assert np.abs(ours(IDS).data - logits).max() < BOUND
