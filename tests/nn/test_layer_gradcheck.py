"""Every layer of tinygrad_ssm/nn against central finite differences in float64, on hypothesis-drawn shapes, with
fused=False (engine ops) and fused=True (the fast twins), every parameter and input included: Linear, Embedding and
its tied head (`attend`), RMSNorm, GatedRMSNorm with and without a gate, CausalDepthwiseConv1d's forward, `silu_of`
(with a history) and `step`. test_nn.py holds one fixed shape of each, engine ops only."""
import numpy as np
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tinygrad_ssm import VarBuilder, VarMap, nn
from tests.support.gradcheck import gradcheck

SEEDS = st.integers(0, 2**16)
LEAD = st.lists(st.integers(1, 3), min_size=1, max_size=2)


def builder():
    return VarBuilder.from_varmap(VarMap(seed=0), "float64")


def with_parameters(layer, names, fn):
    """fn(layer, inputs...) as a function of (inputs..., parameters...): gradcheck perturbs the parameters too."""
    def call(*tensors):
        inputs, params = tensors[:len(tensors) - len(names)], tensors[len(tensors) - len(names):]
        for name, t in zip(names, params):
            setattr(layer, name, t)
        return fn(layer, *inputs)
    return call


@given(lead=LEAD, n_in=st.integers(1, 4), n_out=st.integers(1, 3), bias=st.booleans(), fused=st.booleans(),
       seed=SEEDS)
def test_linear(lead, n_in, n_out, bias, fused, seed):
    r = np.random.default_rng(seed)
    lin = nn.Linear(builder().pp("lin"), n_in, n_out, bias=bias, fused=fused)
    names = ["weight", "bias"] if bias else ["weight"]
    gradcheck(with_parameters(lin, names, lambda m, x: m(x)), r.standard_normal((*lead, n_in)),
              *(r.standard_normal(getattr(lin, n).shape) for n in names))


@given(lead=LEAD, vocab=st.integers(1, 5), dim=st.integers(1, 3), fused=st.booleans(), seed=SEEDS)
def test_embedding_lookup_and_tied_head(lead, vocab, dim, fused, seed):
    r = np.random.default_rng(seed)
    emb = nn.Embedding(builder().pp("emb"), vocab, dim, fused=fused)
    ids = r.integers(0, vocab, lead)                                   # repeated ids: their gradients add up

    def both(m, x):
        return tg.cat([m(ids).reshape(-1), m.attend(x).reshape(-1)])
    gradcheck(with_parameters(emb, ["weight"], both), r.standard_normal((*lead, dim)),
              r.standard_normal((vocab, dim)))


@given(lead=LEAD, dim=st.integers(1, 5), fused=st.booleans(), seed=SEEDS)
def test_rmsnorm(lead, dim, fused, seed):
    r = np.random.default_rng(seed)
    norm = nn.RMSNorm(builder().pp("norm"), dim, fused=fused)
    gradcheck(with_parameters(norm, ["weight"], lambda m, x: m(x)), r.standard_normal((*lead, dim)),
              r.standard_normal(dim))


@given(lead=LEAD, groups=st.integers(1, 3), group_size=st.integers(1, 3), gate=st.booleans(), fused=st.booleans(),
       seed=SEEDS)
def test_gated_rmsnorm(lead, groups, group_size, gate, fused, seed):
    r = np.random.default_rng(seed)
    dim = groups * group_size
    norm = nn.GatedRMSNorm(builder().pp("norm"), dim, group_size, fused=fused)
    arrays = [r.standard_normal((*lead, dim))] + ([r.standard_normal((*lead, dim)) * 2] if gate else [])
    gradcheck(with_parameters(norm, ["weight"], lambda m, *yz: m(*yz)), *arrays, r.standard_normal(dim))


@given(b=st.integers(1, 2), l=st.integers(1, 5), c=st.integers(1, 3), k=st.integers(1, 4), bias=st.booleans(),
       history=st.booleans(), fused=st.booleans(), seed=SEEDS)
def test_conv_forward_and_silu_of(b, l, c, k, bias, history, fused, seed):
    r = np.random.default_rng(seed)
    conv = nn.CausalDepthwiseConv1d(builder().pp("conv"), c, k, bias=bias, fused=fused)
    names = ["weight", "bias"] if bias else ["weight"]
    params = [r.standard_normal(getattr(conv, n).shape) for n in names]
    x = r.standard_normal((b, l, c))
    gradcheck(with_parameters(conv, names, lambda m, xx: m(xx)), x, *params)
    if history:
        gradcheck(with_parameters(conv, names, lambda m, xx, h: m.silu_of(xx, h)), x,
                  r.standard_normal((b, k - 1, c)), *params)
    else:
        gradcheck(with_parameters(conv, names, lambda m, xx: m.silu_of(xx)), x, *params)


@given(b=st.integers(1, 2), c=st.integers(1, 3), k=st.integers(1, 4), bias=st.booleans(), seed=SEEDS)
def test_conv_step(b, c, k, bias, seed):
    r = np.random.default_rng(seed)
    conv = nn.CausalDepthwiseConv1d(builder().pp("conv"), c, k, bias=bias)
    names = ["weight", "bias"] if bias else ["weight"]

    def step(m, state, x_t):
        y, new_state = m.step(state, x_t)
        return tg.cat([y.reshape(-1), new_state.reshape(-1) * 0.5])
    gradcheck(with_parameters(conv, names, step), r.standard_normal((b, c, k)), r.standard_normal((b, c)),
              *(r.standard_normal(getattr(conv, n).shape) for n in names))
