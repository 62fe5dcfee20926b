"""A small Mamba-2 LM (2 layers, d_model 16, vocab 50, chunk 8) and ids to feed it: the model the tests of the
model (tests/models/test_mamba2.py) and of loading checkpoints (test_pretrained.py, test_config_files.py) build."""
import numpy as np

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap


def small_config(**kw):
    """The small config, any field replaced by a keyword."""
    base = dict(d_model=16, n_layer=2, vocab_size=50, d_state=4, headdim=8, ngroups=1, chunk_size=8,
                pad_vocab_size_multiple=8)
    return Mamba2Config(**{**base, **kw})


def small_model(seed=0, dtype="float64", **kw):
    """A small model with fresh parameters from VarMap(seed); keywords go to small_config."""
    return Mamba2LMHeadModel(small_config(**kw), VarMap(seed=seed), dtype=dtype)


IDS = np.random.default_rng(0).integers(0, 50, (2, 13))     # (b, l) token ids below the vocab_size 50
