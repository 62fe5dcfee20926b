"""Fused ops, continued (tests/fast/test_fused.py has the threads, the split, the conv and dt): the gated RMS norm,
the residual add + RMS norm, float32, and the model's switch between the fused and the engine paths."""
import math

import numpy as np
import pytest
from tests.support.gradcheck import gradcheck
from tests.support.row_blocks import BLOCKS, block_bytes
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.fast import fused
from tests.support.fused_checks import (LAYOUTS, TOL, assert_same, fused_values_and_grads, layout,
                                        values_and_grads)


# --- gated rms norm -------------------------------------------------------------------------------------------

@given(lead=st.lists(st.integers(1, 3), max_size=2), groups=st.integers(1, 3), group=st.integers(1, 5),
       gated=st.booleans(), blocks=BLOCKS, how=LAYOUTS, seed=st.integers(0, 2**16))
def test_gated_rms_norm_equals_reference(lead, groups, group, gated, blocks, how, seed):
    r = np.random.default_rng(seed)
    d = groups * group
    y, w = r.standard_normal((*lead, d)), r.standard_normal(d)
    z = r.standard_normal((*lead, d)) * 2 if gated else None
    if len(lead) == 2 and z is not None:
        z = layout(z, how)
    with block_bytes(blocks):
        assert_same(lambda yy, ww, zz=None: fused.gated_rms_norm(yy, zz, ww, group, 1e-5),
                    lambda yy, ww, zz=None: fused.reference_gated_rms_norm(yy, zz, ww, group, 1e-5), [y, w, z])


def test_gated_rms_norm_gradcheck():
    r = np.random.default_rng(3)
    assert gradcheck(lambda y, z, w: fused.gated_rms_norm(y, z, w, 3, 1e-5), r.standard_normal((2, 3, 6)),
                     r.standard_normal((2, 3, 6)), r.standard_normal(6))
    assert gradcheck(lambda y, w: fused.gated_rms_norm(y, None, w, 4, 1e-5), r.standard_normal((5, 4)),
                     r.standard_normal(4))


def test_gated_rms_norm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="gated_rms_norm: .*group_size 4"):
        fused.gated_rms_norm(tg.Tensor(np.zeros((2, 6))), None, tg.Tensor(np.ones(6)), 4)


# --- residual add + rms norm -----------------------------------------------------------------------------------

def both_outputs(add_norm):
    """x, m, w -> 0.7 total + out: one tensor through which gradients reach both outputs of an add + norm."""
    def fn(x, m, w):
        total, out = add_norm(x, m, w)
        return total * 0.7 + out
    return fn


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), d=st.integers(1, 9), return_total=st.booleans(),
       blocks=BLOCKS, how=LAYOUTS, seed=st.integers(0, 2**16))
def test_add_rms_norm_equals_reference(lead, d, return_total, blocks, how, seed):
    r = np.random.default_rng(seed)
    x, m, w = r.standard_normal((*lead, d)), r.standard_normal((*lead, d)) * 3, r.standard_normal(d)
    if len(lead) == 2:
        m = layout(m, how)
    with block_bytes(blocks):
        if return_total:
            assert_same(both_outputs(lambda xx, mm, ww: fused.add_rms_norm(xx, mm, ww, 1e-5)),
                        both_outputs(lambda xx, mm, ww: fused.reference_add_rms_norm(xx, mm, ww, 1e-5)), [x, m, w])
        else:
            assert_same(lambda xx, mm, ww: fused.add_rms_norm(xx, mm, ww, 1e-5, return_total=False),
                        lambda xx, mm, ww: fused.reference_add_rms_norm(xx, mm, ww, 1e-5, False), [x, m, w])


def test_add_rms_norm_gradcheck():
    r = np.random.default_rng(4)
    args = r.standard_normal((2, 3, 5)), r.standard_normal((2, 3, 5)), r.standard_normal(5)
    assert gradcheck(both_outputs(lambda x, m, w: fused.add_rms_norm(x, m, w, 1e-5)), *args)
    assert gradcheck(lambda x, m, w: fused.add_rms_norm(x, m, w, 1e-5, return_total=False), *args)


def test_add_rms_norm_rejects_bad_shapes():
    with pytest.raises(ValueError, match="add_rms_norm: .*m \\(2, 5\\)"):
        fused.add_rms_norm(tg.Tensor(np.zeros((2, 6))), tg.Tensor(np.zeros((2, 5))), tg.Tensor(np.ones(6)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_model_fused_residual_stream_is_the_blocks_one_by_one(dtype):
    """The fused model's forward (each residual add done with the next norm: AddRMSNorm) gives the same bits,
    logits and every parameter's gradient, as its blocks called one by one (x + mixer(norm(x)), then norm_f)."""
    config = tg.Mamba2Config(d_model=16, n_layer=3, vocab_size=40, d_state=4, headdim=4, chunk_size=4)
    model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=9), dtype=dtype)
    ids = np.random.default_rng(9).integers(0, 40, (2, 11))

    def one_by_one(ids):
        x = model.embedding(ids)
        for layer in model.layers:
            x = layer(x)
        return model._head(x)
    results = []
    for forward in (model, one_by_one):
        for t in model.varmap.all_vars():
            t.grad = None
        logits = forward(ids)
        F.cross_entropy(logits[:, :-1], ids[:, 1:]).backward()
        results.append((logits.data, {name: t.grad.data.copy() for name, t in model.varmap.named_vars()}))
    (fused_logits, fused_grads), (plain_logits, plain_grads) = results
    np.testing.assert_array_equal(fused_logits, plain_logits)
    for name in plain_grads:
        np.testing.assert_array_equal(fused_grads[name], plain_grads[name], err_msg=name)


# --- dtypes ---------------------------------------------------------------------------------------------------

def test_float32_in_float32_out_and_gradients():
    """No accidental float64 in a float32 model: outputs and gradients keep float32."""
    r = np.random.default_rng(4)
    f32 = lambda shape: tg.Tensor(r.standard_normal(shape).astype(np.float32), requires_grad=True)  # noqa: E731
    x, w, bias, z, nw, dt, dtb = f32((2, 5, 3)), f32((3, 1, 4)), f32(3), f32((2, 5, 3)), f32(3), f32((2, 5, 2)), f32(2)
    outs = [fused.conv1d_silu(x, w, bias), fused.gated_rms_norm(x, z, nw, 3), fused.dt_softplus(dt, dtb, 0.0, 3.0),
            *fused.split_last(x, [1, 2])]
    assert all(o.dtype == np.float32 for o in outs)
    sum(F.sum(o) for o in outs).backward()
    assert all(t.grad.dtype == np.float32 for t in (x, w, bias, z, nw, dt, dtb))


def test_float32_split_into_the_fused_ops_matches_float64():
    """The float32 mixer chain (split pieces read in place, gradients written into the split's array) keeps
    float32 and agrees with the same chain in float64 to float32 precision."""
    r = np.random.default_rng(6)
    arrays = [r.standard_normal((2, 6, 13)), r.standard_normal((2, 6, 4)), r.standard_normal((6, 1, 4)),
              r.standard_normal(6), r.standard_normal(4)]
    results = []
    for dtype in (np.float32, np.float64):
        p, y, cw, cb, nw = (tg.Tensor(a.astype(dtype), requires_grad=True) for a in arrays)
        z, xBC, dt = fused.split_last(p, [4, 6, 3])
        loss = (F.sum(fused.gated_rms_norm(y, z, nw, 2) * 1.5) + F.sum(fused.conv1d_silu(xBC, cw, cb) ** 2)
                + F.sum(dt * 3.0))
        loss.backward()
        results.append([p.grad.data, y.grad.data, cw.grad.data, cb.grad.data, nw.grad.data])
    for g32, g64 in zip(*results):
        assert g32.dtype == np.float32
        np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-4)


def _f32_gap(fast, exact, scale):
    """max |fast - exact| in float32 ulps of scale (the largest magnitude in play)."""
    return float(np.max(np.abs(fast.astype(np.float64) - exact))) / (np.finfo(np.float32).eps * scale)


def test_float32_sigmoid_is_within_two_float32_ulp_and_float64_keeps_its_own():
    from tests.support.numba_functions import elementwise
    from tinygrad_ssm.fast.fast_exp import exp as exp64, sigmoid

    sigmoid_all = elementwise(sigmoid)
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.uniform(-88, 88, 20000), rng.normal(0, 3, 20000), [0.0, -0.0, 1e-30]]).astype(np.float32)
    x64 = x.astype(np.float64)
    assert sigmoid_all(x).dtype == np.float32
    np.testing.assert_allclose(sigmoid_all(x), 1 / (1 + np.exp(-x64)), rtol=2 * np.finfo(np.float32).eps, atol=1e-37)
    ends = sigmoid_all(np.array([np.nan, np.inf, -np.inf, 100.0, -100.0], np.float32))
    assert math.isnan(ends[0]) and (ends[1:] == [1.0, 0.0, 1.0, 0.0]).all()
    np.testing.assert_array_equal(sigmoid_all(x64), 1 / (1 + np.vectorize(exp64)(-x64)))   # not exp32's values


def test_float32_kernels_are_within_a_few_ulp_of_float64():
    """The float32 kernels (exp32's sigmoid and silu, float32 sums) against the same ops in float64 on the same
    (float32) numbers: outputs within 4 float32 ulps of the largest output, gradients within 16 ulps of the
    largest gradient (the weight gradients sum ~50 rows; measured: 1 and 4). The float64 ops agree with their
    twins to 1e-12, so they do not take the float32 exp."""
    r = np.random.default_rng(13)
    x, cw, cb = r.standard_normal((2, 23, 6)) * 2, r.standard_normal((6, 1, 4)), r.standard_normal(6)
    y, z, nw = r.standard_normal((2, 23, 8)), r.standard_normal((2, 23, 8)) * 3, r.standard_normal(8)
    cases = [(fused.conv1d_silu, fused.reference_conv1d_silu, [x, cw, cb]),
             (lambda a, b_, w: fused.gated_rms_norm(a, b_, w, 4),
              lambda a, b_, w: fused.reference_gated_rms_norm(a, b_, w, 4), [y, z, nw]),
             (lambda a, w: fused.gated_rms_norm(a, None, w, 8),
              lambda a, w: fused.reference_gated_rms_norm(a, None, w, 8), [y, nw])]
    for fast, slow, arrays in cases:
        arrays = [a.astype(np.float32).astype(np.float64) for a in arrays]       # numbers float32 can hold
        with block_bytes(40):
            out32, grads32 = fused_values_and_grads(fast, [a.astype(np.float32) for a in arrays])
            out64, grads64 = fused_values_and_grads(fast, arrays)
        out_ref, grads_ref = values_and_grads(slow, arrays)
        np.testing.assert_allclose(out64, out_ref, rtol=1e-12, atol=1e-12)
        assert out32.dtype == np.float32 and _f32_gap(out32, out64, np.abs(out64).max()) <= 4
        for g32, g64, g_ref in zip(grads32, grads64, grads_ref):
            np.testing.assert_allclose(g64, g_ref, rtol=1e-12, atol=1e-12)
            assert g32.dtype == np.float32 and _f32_gap(g32, g64, np.abs(g64).max()) <= 16


# --- the model's switch ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("ngroups,dt_limit,with_cache", [(1, (0.0, math.inf), False), (2, (0.02, 0.4), True)])
def test_model_fused_and_reference_paths_agree(ngroups, dt_limit, with_cache):
    """fused=True and fused=False on one VarMap: the same logits, loss and gradient of every parameter."""
    config = tg.Mamba2Config(d_model=16, n_layer=2, vocab_size=40, d_state=4, headdim=4, chunk_size=4,
                             ngroups=ngroups, dt_limit=dt_limit, bias=with_cache, conv_bias=True)
    varmap = tg.VarMap(seed=7)
    models = [tg.Mamba2LMHeadModel(config, varmap, dtype="float64", fused=f) for f in (True, False)]
    assert [m.fused for m in models] == [True, False]
    ids = np.random.default_rng(7).integers(0, 40, (2, 9))
    results = []
    for model in models:
        for t in varmap.all_vars():
            t.grad = None
        cache = model.allocate_cache(2) if with_cache else None
        logits = model(ids, cache)
        F.cross_entropy(logits[:, :-1], ids[:, 1:]).backward()
        results.append((logits.data, {name: t.grad.data.copy() for name, t in varmap._vars.items()},
                        None if cache is None else [s.ssm.data for s in cache.layers]))
    (lf, gf, sf), (ls, gs, ss) = results
    np.testing.assert_allclose(lf, ls, **TOL)
    assert gf.keys() == gs.keys()
    for name in gf:
        np.testing.assert_allclose(gf[name], gs[name], **TOL, err_msg=name)
    if with_cache:
        for a, b in zip(sf, ss):
            np.testing.assert_allclose(a, b, **TOL)


def test_model_rejects_a_non_bool_fused():
    with pytest.raises(TypeError, match="fused must be True or False"):
        tg.Mamba2LMHeadModel(tg.Mamba2Config(d_model=8, n_layer=1, vocab_size=10, d_state=4, headdim=4), fused="yes")


def test_an_input_changed_in_place_before_backward_is_caught():
    """The fused ops save their inputs as given (views included), so the version counter still guards them."""
    r = np.random.default_rng(5)
    for make in (lambda t: fused.conv1d_silu(t[:, :, :3], tg.Tensor(r.standard_normal((3, 1, 2)))),
                 lambda t: fused.gated_rms_norm(t[:, :, :3], t[:, :, 1:], tg.Tensor(np.ones(3)), 3)):
        base = tg.Tensor(r.standard_normal((2, 4, 4)), requires_grad=True)
        view = base * 1.0
        out = make(view)
        with tg.no_grad():
            view.mul_(0.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            F.sum(out).backward()
