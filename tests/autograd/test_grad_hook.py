"""Tensor hooks, as torch's: register_post_accumulate_grad_hook, called once per backward when a leaf's gradient is
final; register_hook, called with a tensor's (leaf or not) gradient, whose return value replaces it."""
import numpy as np
import pytest

from tinygrad_ssm import Tensor


def test_hook_sees_the_final_gradient_once():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)  # used three times, first in the forward
    b = Tensor(np.array([3.0, 4.0]), requires_grad=True)  # used once, last in the forward
    unused = Tensor(np.array([5.0]), requires_grad=True)
    seen = []
    for name, t in (("a", a), ("b", b), ("unused", unused)):
        t.register_post_accumulate_grad_hook(lambda leaf, name=name: seen.append((name, leaf.grad.data.copy())))
    loss = ((a * a).sum() + (a.tanh() * b).sum()) * 2.0
    loss.backward()
    assert sorted(n for n, _ in seen) == ["a", "b"]  # once each; never for a leaf that got no gradient
    seen = dict(seen)
    np.testing.assert_array_equal(seen["a"], a.grad.data)  # all three uses of a already summed in
    np.testing.assert_allclose(a.grad.data, 2 * (2 * a.data + (1 - np.tanh(a.data) ** 2) * b.data))
    np.testing.assert_array_equal(seen["b"], b.grad.data)


def test_hook_accumulating_backward_and_remove():
    a = Tensor(np.array([1.0]), requires_grad=True)
    grads = []
    handle = a.register_post_accumulate_grad_hook(lambda leaf: grads.append(float(leaf.grad.data[0])))
    (a * 3.0).sum().backward()
    (a * 3.0).sum().backward()  # .grad accumulates across backwards: the hook sees the running sum
    assert grads == [3.0, 6.0]
    handle.remove()
    (a * 3.0).sum().backward()
    assert grads == [3.0, 6.0]


def test_hook_only_on_leaves():
    a = Tensor(np.array([1.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        (a * 2.0).register_post_accumulate_grad_hook(lambda t: None)


def test_post_accumulate_hook_needs_a_tensor_that_requires_grad():
    """Its .grad never changes, so the hook would never run (it was taken without a word); torch refuses it."""
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        Tensor(np.array([1.0])).register_post_accumulate_grad_hook(lambda t: None)


# --- register_hook (torch's tensor hook): leaves and non-leaves, replacement, removal ----------------------------

def _hooked_graph(lib, x_data, w_data, hooks):
    """loss = sum(tanh(y) * y) + sum(y * w), y = x * w + x (a non-leaf used three times); `hooks`: y's, in order.
    The same program for the engine (lib=None) and torch."""
    if lib is None:
        x, w = Tensor(x_data.copy(), requires_grad=True), Tensor(w_data.copy(), requires_grad=True)
    else:
        x, w = (lib.tensor(a.copy(), requires_grad=True) for a in (x_data, w_data))
    y = x * w + x
    y.retain_grad()
    handles = [y.register_hook(h) for h in hooks]
    loss = (y.tanh() * y).sum() + (y * w).sum()
    return x, w, y, loss, handles


def test_register_hook_on_a_non_leaf_sees_the_summed_gradient_and_its_replacement_flows_on_as_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x_data, w_data, scale = rng.standard_normal((2, 3)), rng.standard_normal(3), rng.standard_normal((2, 3))
    results = {}
    for name, lib in (("ours", None), ("torch", torch)):
        seen = []
        scale_t = Tensor(scale) if lib is None else torch.tensor(scale)
        hooks = [lambda g: seen.append(np.array(g.tolist())),     # observes, returns None: nothing changes
                 lambda g: g * scale_t,                             # replaces the gradient
                 lambda g: seen.append(np.array(g.tolist()))]      # sees the replacement
        x, w, y, loss, _ = _hooked_graph(lib, x_data, w_data, hooks)
        loss.backward()
        results[name] = seen, np.array(x.grad.tolist()), np.array(w.grad.tolist()), np.array(y.grad.tolist())
    (seen, *grads), (seen_t, *grads_t) = results["ours"], results["torch"]
    assert len(seen) == len(seen_t) == 2                            # once per backward, every use summed first
    for a, b in zip([*seen, *grads], [*seen_t, *grads_t]):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=1e-10)
    np.testing.assert_allclose(seen[1], seen[0] * scale, atol=1e-14)  # y.grad (retained) is after the hooks


def test_register_hook_on_a_leaf_replaces_what_reaches_grad_before_the_post_accumulate_hook():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    order = []
    a.register_hook(lambda g: order.append(("hook", g.tolist())) or Tensor(np.array([7.0, 7.0])))
    a.register_post_accumulate_grad_hook(lambda t: order.append(("post", t.grad.tolist())))
    (a * a).sum().backward()
    assert order == [("hook", [2.0, 4.0]), ("post", [7.0, 7.0])] and a.grad.tolist() == [7.0, 7.0]
    b = Tensor(np.array(3.0), requires_grad=True)                   # backward() on the leaf itself: the seed
    b.register_hook(lambda g: g * 5)
    b.backward()
    assert b.grad.item() == 5.0


def test_a_hook_on_the_root_sees_the_seed():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    loss = (x * 2).sum()
    loss.register_hook(lambda g: g * 3)
    loss.backward()
    assert x.grad.tolist() == [6.0, 6.0]


def test_a_hook_registered_twice_runs_twice_and_each_handle_removes_its_own():
    x = Tensor(np.array([1.0]), requires_grad=True)
    calls = []
    hook = lambda g: calls.append("hook")  # noqa: E731
    post = lambda t: calls.append("post")  # noqa: E731
    y = x * 2
    first, _ = y.register_hook(hook), y.register_hook(hook)
    first_post, _ = x.register_post_accumulate_grad_hook(post), x.register_post_accumulate_grad_hook(post)
    first.remove()
    first_post.remove()
    first.remove()                                                  # a second remove does nothing
    y.sum().backward()
    assert calls == ["hook", "post"]                                # torch: one of each left (it removed both)


def test_the_hook_path_keeps_gradients_exact():
    """A hook that returns a new tensor equal to its gradient, on every non-leaf of a small graph: the
    gradients still match central differences (float64)."""
    from tests.support.gradcheck import gradcheck

    def fn(x, w):
        y = x * w
        z = y.tanh() + y * y
        if z.requires_grad:                                          # (finite differences run without a graph)
            y.register_hook(lambda g: g * 1.0)
            z.register_hook(lambda g: g + 0.0)
        return z.sum(axis=1)
    rng = np.random.default_rng(1)
    assert gradcheck(fn, rng.standard_normal((2, 3)), rng.standard_normal(3))


def test_register_hook_errors_are_torchs():
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        Tensor(np.ones(2)).register_hook(lambda g: g)
    with pytest.raises(TypeError, match="register_hook: hook must be callable, got int"):
        Tensor(np.ones(2), requires_grad=True).register_hook(3)
    cases = [(lambda g: Tensor(np.ones(3)), RuntimeError, r"changed the size of value: it returned shape \(3,\)"),
             (lambda g: g.astype(np.float32), RuntimeError, "changed the type of value \\(was float64 got float32\\)"),
             (lambda g: 5, TypeError, "returned int; return a Tensor")]
    for hook, error, message in cases:
        x = Tensor(np.ones(2), requires_grad=True)
        y = x * 2
        y.register_hook(hook)
        with pytest.raises(error, match=message):
            y.sum().backward()


def test_a_hook_cannot_change_its_gradient_in_place():
    """z + z2 hands one array to both inputs' gradients: a hook on z that multiplied it in place changed y's
    gradient too (torch leaves the rule to the user; here the hook's argument is read-only)."""
    x = Tensor(np.ones(3), requires_grad=True)
    y = Tensor(np.ones(3), requires_grad=True)
    z, z2 = x * 1.0, y * 1.0
    z.register_hook(lambda g: g.mul_(10))
    with pytest.raises(RuntimeError, match="mul_: this tensor is read-only .* the gradient a hook was given"):
        (z + z2).backward(np.ones(3))
    x.grad, y.grad = None, None
    z, z2 = x * 1.0, y * 1.0
    z.register_hook(lambda g: g * 10)                                   # the way: a new Tensor
    (z + z2).backward(np.ones(3))
    np.testing.assert_array_equal(x.grad.data, np.full(3, 10.0))
    np.testing.assert_array_equal(y.grad.data, np.ones(3))
