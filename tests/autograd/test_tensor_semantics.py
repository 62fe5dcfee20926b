"""The Tensor's PyTorch semantics, one test per rule: what is recorded, who gets .grad (its accumulation:
test_grad_accumulation.py), the freed graph, detach, no_grad / enable_grad, dtype promotion, fan-out, deep
graphs (the version counter: test_version_counter.py)."""
from __future__ import annotations

import sys
import threading
import warnings
import weakref

import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import Tensor, enable_grad, is_grad_enabled, no_grad
from tinygrad_ssm.autograd import functional as F

from tests.support.op_specs import SPECS
from tests.support.tensors import leaf


# --- the basics of a Tensor -----------------------------------------------------------------------------

def test_tensor_wraps_a_numpy_array():
    array = np.arange(6.0).reshape(2, 3)
    t = Tensor(array)
    assert t.data is array  # an ndarray keeps its memory, like torch.from_numpy
    assert t.shape == (2, 3) and t.ndim == 2 and t.dtype == np.float64
    assert t.numpy() is array


def test_default_dtypes_float32_and_int64():
    assert Tensor([1.0, 2.0]).dtype == np.float32
    assert Tensor(1.5).dtype == np.float32
    assert Tensor([1, 2]).dtype == np.int64
    assert Tensor(np.zeros(2)).dtype == np.float64  # an array keeps its dtype: float64 on request
    assert tg.zeros(2, 3).dtype == np.float32 and tg.ones(2, dtype=np.float64).dtype == np.float64


def test_numpy_of_a_tensor_that_requires_grad_raises():
    with pytest.raises(RuntimeError, match="detach"):
        leaf([1.0]).numpy()


def test_requires_grad_on_an_integer_tensor_raises_type_error():
    with pytest.raises(TypeError, match="int64"):
        Tensor(np.array([1, 2]), requires_grad=True)
    with pytest.raises(TypeError, match="floating point"):
        Tensor(np.array([1, 2])).requires_grad_()


def test_requires_grad_flag_and_is_leaf():
    t = Tensor(np.ones(2))
    assert not t.requires_grad and t.is_leaf
    assert t.requires_grad_() is t and t.requires_grad and t.is_leaf
    y = t * 2
    assert y.requires_grad and not y.is_leaf
    with pytest.raises(RuntimeError, match="leaf"):
        y.requires_grad_(False)


# --- what is recorded -----------------------------------------------------------------------------------

def test_op_is_recorded_only_when_an_input_requires_grad():
    a, b = Tensor(np.ones(3)), Tensor(np.full(3, 2.0))
    c = a * b
    assert not c.requires_grad and c.grad_fn is None and c.is_leaf
    b.requires_grad_()
    d = a * b
    assert d.requires_grad and d.grad_fn is not None and not d.is_leaf
    assert d.grad_fn.inputs[0] is a and d.grad_fn.inputs[1] is b


def test_only_leaves_get_grad():
    x = leaf([1.0, 2.0, 3.0])
    y = x * 3.0                # non-leaf
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.data, 18.0 * x.data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert y.grad is None


def test_grad_is_a_tensor_without_history():
    x = leaf([1.0, 2.0])
    (x * x).sum().backward()
    assert isinstance(x.grad, Tensor) and not x.grad.requires_grad and x.grad.grad_fn is None
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape


def test_reading_grad_of_a_non_leaf_warns():
    y = leaf([1.0]) * 2
    with pytest.warns(UserWarning, match="not a leaf"):
        y.grad


def test_retain_grad_keeps_a_non_leaf_gradient():
    x = leaf([1.0, -2.0])
    y = x * 3.0
    assert y.retain_grad() is y and y.retains_grad
    (y * y).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning once retain_grad was called
        np.testing.assert_allclose(y.grad.data, 2 * y.data)
    np.testing.assert_allclose(x.grad.data, 18.0 * x.data)


def test_retain_grad_is_a_no_op_on_a_leaf_and_an_error_without_requires_grad():
    x = leaf([1.0])
    x.retain_grad()
    assert not x.retains_grad
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        Tensor(np.ones(1)).retain_grad()


# --- backward -------------------------------------------------------------------------------------------

class _Doubled(tg.Function):
    """y = 2 a; its backward's gradient is a new array (kept in `made` by weak reference), or `returned` as it is."""
    returned = None
    made: list = []

    def forward(self, a):
        return a * 2

    def backward(self, grad):
        if _Doubled.returned is not None:
            return _Doubled.returned
        out = grad * 2
        _Doubled.made.append(weakref.ref(out))
        return out


def test_a_leaf_keeps_a_gradient_only_the_walk_holds_and_copies_any_other():
    """As torch's AccumulateGrad: the first gradient of a leaf is the op's own array when nothing else holds it
    (no copy of a large gradient), a copy otherwise, so changing .grad never changes what anyone else holds."""
    _Doubled.made.clear()
    x = leaf([1.0, 2.0])
    _Doubled.apply(x).sum().backward()
    assert x.grad.data is _Doubled.made[-1]()
    kept = np.array([5.0, 6.0])                                        # an array the op's owner still holds
    _Doubled.returned = kept
    try:
        y = leaf([1.0, 2.0])
        _Doubled.apply(y).sum().backward()
    finally:
        _Doubled.returned = None
    assert y.grad.data is not kept
    y.grad.data += 1
    np.testing.assert_array_equal(kept, [5.0, 6.0])


def test_one_gradient_array_for_two_leaves_is_never_shared_between_their_grads():
    a, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    ((a + b) * 2.0).sum().backward()                                   # Add hands both Mul's new array
    assert not np.shares_memory(a.grad.data, b.grad.data)
    a.grad.data += 1
    np.testing.assert_array_equal(b.grad.data, [2.0, 2.0])


def test_a_gradient_the_caller_passed_is_copied_into_grad():
    x = leaf([1.0, 2.0])
    seed = np.array([0.5, 0.25])
    x.backward(gradient=seed)                                          # a leaf's gradient is the seed
    assert not np.shares_memory(x.grad.data, seed)
    y = x * 1.0
    y.backward(gradient=seed)
    x.grad.data[:] = 0
    np.testing.assert_array_equal(seed, [0.5, 0.25])


def test_sums_of_several_uses_are_the_same_in_place_as_fresh():
    """A leaf used three times: its gradients are summed in place into an array only the walk holds, or into a
    fresh one when the first is shared (x + x hands one array twice); the sums equal NumPy's."""
    _Doubled.made.clear()
    x = leaf([1.0, 2.0])
    (_Doubled.apply(x) + _Doubled.apply(x) + x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [7.0, 7.0])
    assert any(x.grad.data is r() for r in _Doubled.made)             # summed in place into the first
    z = leaf([1.0, 2.0])
    (z + z + z).sum().backward()
    np.testing.assert_array_equal(z.grad.data, [3.0, 3.0])


class _Keeper:
    """An allocator as fast/heap_reuse.py's pool: it keeps blocks and hands out views of them."""

    def __init__(self):
        self.blocks, self.other_views = [], []
        self.another_view = False                                      # keep a second view of each new block

    def view(self, values):
        block = np.array(values, dtype=np.float64)
        self.blocks.append(block)
        if self.another_view:
            self.other_views.append(block[:1])
        return block[:]                                                # a view: base is the kept block

    def references_held(self, block):
        return 1 if any(b is block for b in self.blocks) else 0


@pytest.fixture
def keeper(monkeypatch):
    from tinygrad_ssm.autograd import backward
    k = _Keeper()
    monkeypatch.setattr(backward, "_block_keepers", [k.references_held])
    return k


class _Tripled(tg.Function):
    """y = 3 a; its backward's gradient is a view of a block of `keeper` (set by the test)."""
    keeper = None

    def forward(self, a):
        return a * 3

    def backward(self, grad):
        return _Tripled.keeper.view(grad * 3)


def test_the_only_view_of_a_registered_keeper_s_block_counts_as_the_walk_s_own(keeper):
    """A gradient that is a view of a pool's block (registered with register_block_keeper) is kept as .grad and
    summed into in place when it is the block's only view and nothing else holds it."""
    _Tripled.keeper = keeper
    x = leaf([1.0, 2.0])
    _Tripled.apply(x).sum().backward()
    assert x.grad.data.base is keeper.blocks[-1]                       # kept as it is: no copy
    y = leaf([1.0, 2.0])
    (_Tripled.apply(y) + _Doubled.apply(y)).sum().backward()           # the pooled gradient arrives first
    np.testing.assert_array_equal(y.grad.data, [5.0, 5.0])
    assert y.grad.data.base is keeper.blocks[-1]                       # summed into it: no new array


def test_a_keeper_s_block_with_another_view_alive_is_never_changed(keeper):
    """A view of a kept block is copied (and never summed into) while any other view of the block lives."""
    _Tripled.keeper, keeper.another_view = keeper, True
    y = leaf([1.0, 2.0])
    _Tripled.apply(y).sum().backward()
    z = leaf([1.0, 2.0])
    (_Tripled.apply(z) + z * 2.0).sum().backward()
    assert not any(np.shares_memory(g, b) for g in (y.grad.data, z.grad.data) for b in keeper.blocks)
    np.testing.assert_array_equal(z.grad.data, [5.0, 5.0])
    assert [v[0] for v in keeper.other_views] == [3.0, 3.0]            # what the other views see is unchanged


def test_a_view_of_a_block_no_keeper_claims_is_copied(keeper):
    """A view of memory someone else keeps (as numba's arrays are) is never the walk's, registered keepers or not."""
    kept = []

    class _Unregistered(tg.Function):
        def forward(self, a):
            return a * 2

        def backward(self, grad):
            kept.append(grad * 2)                                      # the block, held by someone unknown
            return kept[-1][:]

    y = leaf([1.0, 2.0])
    (_Unregistered.apply(y) + y * 1.0).sum().backward()
    assert not np.shares_memory(y.grad.data, kept[0])
    np.testing.assert_array_equal(kept[0], [2.0, 2.0])
    z = leaf([1.0, 2.0])
    _Unregistered.apply(z).sum().backward()
    assert not np.shares_memory(z.grad.data, kept[1])


def test_backward_of_a_non_scalar_needs_a_gradient():
    x = leaf([1.0, 2.0, 3.0])
    y = x * x
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"):
        y.backward()
    y.backward(gradient=np.array([1.0, 0.5, -1.0]))
    np.testing.assert_allclose(x.grad.data, 2 * x.data * [1.0, 0.5, -1.0])
    with pytest.raises(RuntimeError, match=r"shape \(2,\)"):
        (x * x).backward(gradient=np.ones(2))


def test_backward_on_a_tensor_that_does_not_require_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(1)).sum().backward()


def test_second_backward_raises_unless_retain_graph():
    x = leaf([1.0, 2.0])
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*retain_graph=True"):
        loss.backward()

    x.grad = None
    loss = (x * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()  # the graph was kept for this one
    np.testing.assert_allclose(x.grad.data, 4 * x.data)


def test_fan_out_sums_the_gradients_of_every_use():
    x = leaf([0.5, -1.0, 2.0])
    y = x * x + x                    # x used three times
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, 2 * x.data + 1)

    a = leaf([1.5])                  # a diamond: a -> b, c -> d
    b, c = a * 2.0, a.exp()
    (b * c).sum().backward()
    np.testing.assert_allclose(a.grad.data, 2 * np.exp(1.5) + 2 * 1.5 * np.exp(1.5))


def test_same_tensor_as_both_operands():
    x = leaf([3.0])
    (x * x).backward()
    np.testing.assert_allclose(x.grad.data, [6.0])


def test_a_graph_deeper_than_the_recursion_limit():
    depth = 5000
    assert depth > sys.getrecursionlimit()
    x = leaf([1.0])
    y = x
    for _ in range(depth):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, [1.0001 ** depth])
    del y  # freeing a 5000-deep chain must not overflow the stack either


# --- detach ---------------------------------------------------------------------------------------------

def test_detach_shares_storage_and_never_requires_grad():
    x = leaf([1.0, 2.0])
    d = x.detach()
    assert not d.requires_grad and d.is_leaf and d.grad_fn is None
    assert np.shares_memory(d.data, x.data)
    d.mul_(10.0)  # d does not require grad: allowed, and x sees it
    np.testing.assert_allclose(x.data, [10.0, 20.0])


def test_detach_cuts_the_graph():
    x = leaf([1.0, 2.0, 3.0])
    y = x * x
    (y.detach() * x).sum().backward()  # only the direct use of x is differentiated
    np.testing.assert_allclose(x.grad.data, x.data ** 2)


# --- no_grad / enable_grad ------------------------------------------------------------------------------

def test_no_grad_context_records_nothing():
    x = leaf([1.0])
    with no_grad():
        assert not is_grad_enabled()
        y = x * 2
        with enable_grad():
            z = x * 3
    assert is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None


def test_no_grad_and_enable_grad_as_decorators():
    x = leaf([1.0])

    @no_grad()
    def frozen(t):
        return t * 2

    @enable_grad()
    def recorded(t):
        return t * 2

    @no_grad  # without parentheses too, as torch allows
    def frozen_bare(t):
        return t * 2

    @enable_grad
    def recorded_bare(t):
        return t * 2

    assert not frozen(x).requires_grad and not frozen_bare(x).requires_grad
    with no_grad():
        assert recorded(x).requires_grad and recorded_bare(x).requires_grad
    assert is_grad_enabled()
    assert frozen_bare.__name__ == "frozen_bare"


def test_leaving_a_nested_mode_restores_the_outer_one_not_the_default():
    """Each exit puts back the mode it found (torch's): leaving an inner no_grad, an inner enable_grad or a
    @no_grad function called under no_grad must leave the outer no_grad in force, not turn recording on."""
    x = leaf([1.0])

    @no_grad
    def frozen(t):
        return t * 2

    with no_grad():
        with no_grad():
            pass
        assert not is_grad_enabled() and not (x * 2).requires_grad
        with enable_grad():
            assert (x * 2).requires_grad
        assert not is_grad_enabled() and not (x * 2).requires_grad
        frozen(x)
        assert not is_grad_enabled() and not (x * 2).requires_grad
    assert is_grad_enabled()


def test_grad_mode_is_restored_after_an_exception():
    with pytest.raises(ValueError):
        with no_grad():
            raise ValueError("boom")
    assert is_grad_enabled()


def test_grad_mode_is_per_thread():
    seen = []
    with no_grad():
        thread = threading.Thread(target=lambda: seen.append(is_grad_enabled()))
        thread.start()
        thread.join()
    assert seen == [True]


# --- dtypes ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scalar", [2.5, 3, np.float64(2.5), np.int64(3)])
def test_a_scalar_never_upcasts_float32(scalar):
    x = Tensor(np.ones(3, np.float32))
    for result in (x + scalar, scalar + x, x - scalar, scalar - x, x * scalar, x / scalar, scalar / x, x ** scalar,
                   F.maximum(x, scalar), F.where(np.array([True, False, True]), x, scalar)):
        assert result.dtype == np.float32


def test_float32_and_float64_promote_to_float64_and_gradients_keep_their_dtype():
    a = leaf([1.0, 2.0], np.float32)
    b = leaf([3.0, 4.0], np.float64)
    for result in (a + b, b + a, a * b, F.matmul(a, b), F.cat([a, b]), F.where(np.array([True, False]), a, b)):
        assert result.dtype == np.float64
    (a * b).sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64
    np.testing.assert_allclose(a.grad.data, [3.0, 4.0])


def test_integer_tensors():
    i = Tensor(np.array([1, 2, 3]))
    assert (i + 1).dtype == np.int64 and (i * i).dtype == np.int64
    assert (i + 0.5).dtype == np.float32            # int meets a float scalar: the default float, as torch
    assert (i + Tensor(np.ones(3))).dtype == np.float64  # int meets a float64 tensor: float64
    assert F.sum(i).dtype == np.int64
    np.testing.assert_array_equal(F.getitem(Tensor(np.arange(5.0)), i).data, [1.0, 2.0, 3.0])


def test_changing_an_index_mask_or_ids_tensor_after_the_op_keeps_the_gradient_right():
    # Integer and bool operands are not differentiated, but backward needs them: changing them in place
    # between forward and backward must not reroute the gradient.
    x = leaf([0.0, 1.0, 2.0])
    condition = Tensor(np.array([True, False, True]))
    y = F.where(condition, x, 0.0)
    condition[0] = False
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, [1.0, 0.0, 1.0])

    x = leaf([0.0, 1.0, 2.0])
    index = Tensor(np.array([0, 0]))
    y = x[index]
    index[0] = 2
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, [2.0, 0.0, 0.0])

    weight = leaf(np.eye(3))
    ids = Tensor(np.array([0, 1]))
    y = F.embedding(ids, weight)
    ids[0] = 2
    y.sum().backward()
    np.testing.assert_array_equal(weight.grad.data.sum(axis=1), [3.0, 3.0, 0.0])


@pytest.mark.parametrize("name", list(SPECS))
def test_every_op_keeps_float32_as_float32(name):
    """Each op's `float32` call in tests/support/op_specs.py: float32 tensors (Python or NumPy scalars mixed in where
    they fit) give float32, and so do the gradients."""
    out = SPECS[name].float32()
    assert out.dtype == np.float32, f"{name} gave {out.dtype}"
    out.backward(np.ones(out.shape, np.float32))
    leaves, stack = [], [out]
    while stack:  # the float32 leaves behind `out`
        node = stack.pop()
        if node.is_leaf:
            leaves.append(node)
        else:
            stack.extend(t for t in node.grad_fn.inputs if isinstance(t, Tensor) and t.requires_grad)
    assert leaves and all(leaf.grad.dtype == np.float32 for leaf in leaves), name
