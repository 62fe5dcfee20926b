"""fast/products.py's RowSplitMatmul against its engine twin, Matmul: forward and both gradients equal to 1e-10
in float64 on hypothesis-drawn shapes, cut into blocks down to one row per block, with operands in both layouts
(Linear's W.T is a transposed view); the gradients keep the operands' layouts; gradchecks; float32 stays
float32; Linear and the tied head with fused=True equal to fused=False."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tests.support.gradcheck import gradcheck
from tinygrad_ssm.autograd import functional as F
from tinygrad_ssm.fast import products
from tests.support.kernel_calls import counting

TOL = dict(rtol=1e-10, atol=1e-10)


def values_and_grads(matmul, a, b, weight):
    ta, tb = tg.Tensor(a, requires_grad=True), tg.Tensor(b, requires_grad=True)
    out = matmul(ta, tb)
    (out * tg.Tensor(weight)).sum().backward()
    return out.data, ta.grad.data, tb.grad.data


SIDES = st.sampled_from([1, 5, 31, 63, 64, 65, 100, 131])   # below, at and past one and two blocks of 32


@given(m=SIDES, k=st.integers(1, 9), n=SIDES, a_transposed=st.booleans(), b_transposed=st.booleans(),
       min_work=st.sampled_from([0, 1 << 18]), seed=st.integers(0, 2 ** 16))
def test_row_split_products_equal_the_engines_in_float64(m, k, n, a_transposed, b_transposed, min_work, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m)).T if a_transposed else rng.standard_normal((m, k))
    b = rng.standard_normal((n, k)).T if b_transposed else rng.standard_normal((k, n))
    weight = rng.standard_normal((m, n))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(products, "MIN_WORK", min_work)                    # 0: split whenever there are 2 x 32
        with counting((products, "rows_product")) as fast_calls:
            got = values_and_grads(products.matmul, a, b, weight)
    with counting((products, "rows_product")) as engine_calls:
        want = values_and_grads(F.matmul, a, b, weight)
    assert fast_calls["rows_product"] == 3 and not engine_calls        # the product and both gradients
    for name, g, w in zip(("out", "grad a", "grad b"), got, want):
        np.testing.assert_allclose(g, w, **TOL, err_msg=name)
        assert (g.flags.c_contiguous, g.flags.f_contiguous) == (w.flags.c_contiguous, w.flags.f_contiguous), name


def test_an_operand_no_gradient_reads_may_change_before_backward(monkeypatch):
    """The engine's rule (tests/autograd/test_torch_differential.py) holds for the twin: it keeps only the operand a
    wanted gradient reads, and notes the layouts and its own choice of code in forward."""
    from tests.autograd import test_torch_differential as engine_rules
    monkeypatch.setattr(products, "MIN_WORK", 0)
    with counting((products, "rows_product")) as calls:
        engine_rules.test_changing_a_product_operand_no_gradient_reads_is_no_error(matmul=products.matmul)
    assert calls["rows_product"] >= 4


def test_blocks_are_taken_by_every_thread(monkeypatch):
    """With a block of 32 rows per thread and more threads than that, every block is still one product."""
    monkeypatch.setattr(products, "MIN_WORK", 0)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((257, 40)), rng.standard_normal((40, 33))
    calls = []
    original = np.matmul

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return original(*args, **kwargs)
    monkeypatch.setattr(products.np, "matmul", counting)
    np.testing.assert_allclose(products.rows_product(a, b), a @ b, **TOL)
    assert sum(calls) == 257 and len(calls) == products.shares(257 // 32)


def test_few_rows_are_split_by_columns(monkeypatch):
    """A short prompt's rows against a large head: the blocks are columns, each one product."""
    monkeypatch.setattr(products, "MIN_WORK", 0)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((5, 40)), rng.standard_normal((40, 257))
    calls = []
    original = products.np.matmul

    def counting(left, right, *args, **kwargs):
        calls.append(right.shape[1])
        return original(left, right, *args, **kwargs)
    monkeypatch.setattr(products.np, "matmul", counting)
    np.testing.assert_allclose(products.rows_product(a, b), a @ b, **TOL)
    assert sum(calls) == 257 and len(calls) == products.shares(257 // 32)


def test_gradcheck():
    rng = np.random.default_rng(2)
    gradcheck(lambda x, w: products.matmul(x, w.T), rng.standard_normal((70, 5)), rng.standard_normal((3, 5)))


def test_float32_stays_float32_and_other_shapes_take_the_engines_code():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((300, 64)).astype(np.float32), rng.standard_normal((64, 70)).astype(np.float32)
    out = products.matmul(tg.Tensor(a), tg.Tensor(b))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.data, a @ b, rtol=1e-5, atol=1e-5)
    batched = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))                  # 3-d: Matmul's own
    np.testing.assert_allclose(products.matmul(*map(tg.Tensor, batched)).data, batched[0] @ batched[1], **TOL)
    vector = products.matmul(tg.Tensor(rng.standard_normal(4)), tg.Tensor(rng.standard_normal((4, 2))))
    assert vector.shape == (2,)


@pytest.mark.parametrize("tied", [False, True])
def test_a_fused_model_equals_the_engine_op_one(tied):
    """The model's products (in_proj, out_proj, the head) through RowSplitMatmul: the loss and every gradient
    of a float64 model equal to the engine-op model's (fused=False)."""
    config = tg.Mamba2Config(d_model=32, n_layer=2, vocab_size=40, d_state=8, headdim=8, chunk_size=8,
                             tie_embeddings=tied)
    ids = np.random.default_rng(4).integers(0, 40, (2, 48))
    grads = []
    for fused in (True, False):
        model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=0), dtype="float64", fused=fused)
        model.loss(ids[:, :-1], ids[:, 1:]).backward()
        grads.append({name: t.grad.data for name, t in model.varmap.named_vars()})
    for name in grads[1]:
        np.testing.assert_allclose(grads[0][name], grads[1][name], **TOL, err_msg=name)
