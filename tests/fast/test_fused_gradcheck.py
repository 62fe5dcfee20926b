"""Every fused op (fast/fused.py) against central finite differences in float64 on hypothesis-drawn shapes, every
input included (a conv's history, a norm's gate, both outputs of add_rms_norm), each call checked to run the
fused op and not its twin. test_fused.py and test_fused_norms.py hold the ops equal to their twins; before this
file split_last had no gradient check and the others one fixed shape each, the conv's history none."""
import numpy as np
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tinygrad_ssm.fast import fused
from tests.support.gradcheck import gradcheck
from tests.support.kernel_calls import counting_fused_ops

SEEDS = st.integers(0, 2**16)


def checked(fn, *arrays):
    with counting_fused_ops() as ran:
        assert gradcheck(fn, *arrays)
    assert ran, "the fused op fell back to its twin"


@given(lead=st.lists(st.integers(1, 3), max_size=2), sizes=st.lists(st.integers(0, 3), min_size=1, max_size=4),
       seed=SEEDS)
def test_split_last(lead, sizes, seed):
    x = np.random.default_rng(seed).standard_normal((*lead, sum(sizes)))
    # each piece weighted differently, so that a gradient routed to the wrong piece shows
    checked(lambda t: tg.cat([p.reshape(-1) * (i + 1.0) for i, p in enumerate(fused.split_last(t, sizes))]), x)


@given(b=st.integers(1, 2), l=st.integers(1, 5), c=st.integers(1, 3), k=st.integers(1, 4), bias=st.booleans(),
       history=st.booleans(), seed=SEEDS)
def test_conv1d_silu(b, l, c, k, bias, history, seed):
    r = np.random.default_rng(seed)
    arrays = [r.standard_normal((b, l, c)), r.standard_normal((c, 1, k))]
    arrays += [r.standard_normal(c)] if bias else []
    if history:
        arrays += [r.standard_normal((b, k - 1, c))]
        fn = (lambda x, w, bb, h: fused.conv1d_silu(x, w, bb, h)) if bias else \
            (lambda x, w, h: fused.conv1d_silu(x, w, None, h))
    else:
        fn = fused.conv1d_silu
    checked(fn, *arrays)


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), h=st.integers(1, 4),
       limit=st.sampled_from([(0.0, np.inf), (0.2, 1.5)]), seed=SEEDS)
def test_dt_softplus(lead, h, limit, seed):
    r = np.random.default_rng(seed)
    bias = r.uniform(-1, 1, h)
    v = r.uniform(-9, 19, (*lead, h))                   # dt + bias up to softplus' threshold (20), not across it
    soft = np.logaddexp(0, v)
    # away from the clip's kinks, where a central difference straddles the corner
    v = np.where((np.abs(soft - limit[0]) < 1e-3) | (np.abs(soft - limit[1]) < 1e-3), v + 0.01, v)
    checked(lambda d, bb: fused.dt_softplus(d, bb, *limit), v - bias, bias)


@given(rows=st.integers(1, 4), groups=st.integers(1, 3), group_size=st.integers(1, 4), gate=st.booleans(),
       seed=SEEDS)
def test_gated_rms_norm(rows, groups, group_size, gate, seed):
    r = np.random.default_rng(seed)
    d = groups * group_size
    y, z, w = r.standard_normal((rows, d)), r.standard_normal((rows, d)) * 2, r.standard_normal(d)
    if gate:
        checked(lambda a, zz, ww: fused.gated_rms_norm(a, zz, ww, group_size), y, z, w)
    else:
        checked(lambda a, ww: fused.gated_rms_norm(a, None, ww, group_size), y, w)


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), d=st.integers(1, 5), seed=SEEDS)
def test_add_rms_norm_both_outputs(lead, d, seed):
    r = np.random.default_rng(seed)
    x, m, w = r.standard_normal((*lead, d)), r.standard_normal((*lead, d)), r.standard_normal(d)

    def both(a, b_, ww):
        total, out = fused.add_rms_norm(a, b_, ww)
        return tg.cat([total.reshape(-1) * 0.5, out.reshape(-1)])
    checked(both, x, m, w)
