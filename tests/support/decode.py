"""Twin models, one decoding with numba (fused) and one with engine ops, and the check that their steps agree:
what tests/models/test_decode.py and tests/fast/test_decode_kernels.py share."""
import numpy as np

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap


def twin_models(dtype="float64", seed=0, **overrides):
    """The fused model and the reference model on one VarMap (the same tensors)."""
    kw = dict(d_model=16, n_layer=2, vocab_size=40, d_state=4, headdim=4, expand=2, chunk_size=4, ngroups=2)
    kw.update(overrides)
    config = Mamba2Config(**kw)
    varmap = VarMap(seed=seed)
    fast = Mamba2LMHeadModel(config, varmap, dtype=dtype, fused=True)
    slow = Mamba2LMHeadModel(config, varmap, dtype=dtype, fused=False)
    rng = np.random.default_rng(seed)
    for t in varmap.all_vars():  # off the init's constants (D = 1, norms = 1, zero biases) so every term counts
        t.data[...] += rng.uniform(-0.3, 0.3, t.shape).astype(t.dtype)
    return fast, slow


def assert_steps_agree(fast, slow, batch, prompt_len, steps, seed, tol):
    rng = np.random.default_rng(seed)
    V = fast.config.vocab_size
    cache_f, cache_s = fast.allocate_cache(batch), slow.allocate_cache(batch)
    if prompt_len:
        ids = rng.integers(0, V, (batch, prompt_len))
        fast(ids, cache_f)
        slow(ids, cache_s)
    for _ in range(steps):
        token = rng.integers(0, V, batch)
        logits_f, logits_s = fast.step(token, cache_f).data, slow.step(token, cache_s).data
        assert logits_f.dtype == logits_s.dtype == fast.dtype
        assert logits_f.shape == (batch, fast.config.padded_vocab_size)
        np.testing.assert_allclose(logits_f, logits_s, rtol=tol, atol=tol)
        for lf, ls in zip(cache_f.layers, cache_s.layers):
            np.testing.assert_allclose(lf.conv.data, ls.conv.data, rtol=tol, atol=tol)
            np.testing.assert_allclose(lf.ssm.data, ls.ssm.data, rtol=tol, atol=tol)
    assert cache_f.seqlen_offset == cache_s.seqlen_offset == prompt_len + steps
