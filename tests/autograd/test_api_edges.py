"""The autograd API at edges an audit against torch found: requires_grad assigned as an attribute, a custom
Function's gradients returned as a list or too few, its non-float outputs, deepcopy and pickle of tensors with
hooks or a graph, a backward seed holding None or text, and a stale .grad of another shape."""
import copy
import pickle
import warnings

import numpy as np
import pytest

from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd.function import Function


def test_assigning_requires_grad_is_checked_as_requires_grad_():
    """y.requires_grad = False on an op's output cut x's gradient through it silently ([1, 1] for [7, 7]); an int
    tensor took it and got an int64 .grad; "yes" was kept (torch refuses all three)."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf tensors"):
        y.requires_grad = False
    (y * 3 + x).sum().backward()
    assert x.grad.data.tolist() == [7.0, 7.0]
    with pytest.raises(TypeError, match="only floating point tensors can require gradients"):
        Tensor(np.array([1, 2, 3])).requires_grad = True
    with pytest.raises(TypeError, match="requires_grad must be True or False, got 'yes'"):
        Tensor(np.array([1.0])).requires_grad = "yes"
    leaf = Tensor(np.array([1.0]))
    leaf.requires_grad = True
    assert leaf.requires_grad and leaf.is_leaf


class _Mul(Function):
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * b


def test_a_custom_functions_gradients_must_be_one_per_input():
    """Returned as a list, both gradients were summed into the first input (b got none); returned one short, the
    second input silently got none. torch: 'returned an incorrect number of gradients'."""
    class AsList(_Mul):
        def backward(self, g):
            a, b = self.saved
            return [g * b, g * a]

    class OneShort(_Mul):
        def backward(self, g):
            return (g * self.saved[1],)

    for op in (AsList, OneShort):
        a, b = (Tensor(np.array(v), requires_grad=True) for v in ([1.0, 2.0], [3.0, 4.0]))
        with pytest.raises(RuntimeError, match=rf"{op.__name__}.backward returned 1 gradient\(s\) for 2 input\(s\), "
                                               rf"none for input\(s\) \[1\], which need one"):
            op.apply(a, b).sum().backward()
    a, b = Tensor(np.array([1.0, 2.0]), requires_grad=True), Tensor(np.array([3.0, 4.0]))   # b needs none: fine
    OneShort.apply(a, b).sum().backward()
    assert a.grad.data.tolist() == [3.0, 4.0]


def test_a_custom_functions_bool_output_is_not_differentiable():
    """A mask output of a Function on inputs that require grad failed: Tensor(mask, requires_grad=True)."""
    class Positive(Function):
        def forward(self, a):
            return a > 0

        def backward(self, g):
            return None

    mask = Positive.apply(Tensor(np.array([1.0, -1.0]), requires_grad=True))
    assert mask.data.tolist() == [True, False] and not mask.requires_grad and mask.is_leaf


def test_deepcopy_takes_leaves_without_their_hooks_and_pickle_drops_graph_and_hooks():
    """deepcopy of an op's output gave a copy whose backward reached nothing; a leaf's copy kept its hooks, which
    the original's handle could not remove; pickle of an output or of a tensor with a hook failed on a weakref."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match="deepcopy: only leaf tensors"):
        copy.deepcopy(x * x)
    handle = x.register_hook(lambda g: g * 2)
    (x * 1).sum().backward()
    twin = copy.deepcopy(x)
    handle.remove()
    (twin * 1).sum().backward()
    assert twin.grad.data.tolist() == [3.0, 3.0]        # the copied .grad [2, 2] plus [1, 1], doubled by no hook
    x.register_post_accumulate_grad_hook(lambda t: None)
    with pytest.warns(UserWarning, match="hooks registered on this tensor are not pickled"):
        back = pickle.loads(pickle.dumps(x))
    assert back.requires_grad and back.is_leaf and back.data.tolist() == [1.0, 2.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pickle.loads(pickle.dumps(x * 2))
    assert out.is_leaf and out.requires_grad and out.data.tolist() == [2.0, 4.0]
    (out * 1).sum().backward()
    assert out.grad.data.tolist() == [1.0, 1.0]


def test_a_backward_seed_of_none_or_text_is_refused_and_a_stale_grad_of_another_shape_too():
    """backward([None, 1.]) seeded NaN and backward('3') 3.0; after x.data grew, the old (1,) .grad was broadcast
    into the new gradient ([4, 4, 4]; torch: a shape error)."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(TypeError, match=r"backward: gradient must be .* got a list that NumPy turns into dtype object"):
        (x * 2).backward([None, 1.0])
    with pytest.raises(TypeError, match=r"backward: gradient must be .* got str '3'"):
        (x * 2).sum().backward("3")
    with pytest.raises(TypeError, match=r"Tensor: data must be .* dtype object"):
        Tensor([None, 1.0], dtype="float32")
    (x * 2).backward([1.0, 0.5])                                          # a list of numbers is a seed
    assert x.grad.data.tolist() == [2.0, 1.0]
    y = Tensor(np.array([1.0]), requires_grad=True)
    (y * 2).sum().backward()
    y.data = np.array([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match=r"\.grad has shape \(1,\) and its new gradient \(3,\).*set \.grad = None"):
        (y * 2).sum().backward()
    y.grad = None
    (y * 2).sum().backward()
    assert y.grad.data.tolist() == [2.0, 2.0, 2.0]


def test_a_custom_functions_forward_knows_which_inputs_get_a_gradient():
    """needs_input_grad was empty inside forward (set after it): torch's forward reads it to skip saving."""
    seen = []

    class Probe(_Mul):
        def forward(self, a, b):
            seen.append(self.needs_input_grad)
            return super().forward(a, b)

        def backward(self, g):
            a, b = self.saved
            return g * b, None

    a, b = Tensor(np.array([1.0]), requires_grad=True), Tensor(np.array([2.0]))
    Probe.apply(a, b).sum().backward()
    from tinygrad_ssm import no_grad
    with no_grad():
        Probe.apply(a, b)
    assert seen == [(True, False), (False, False)] and a.grad.data.tolist() == [2.0]


def test_pickle_drops_grad_and_assigned_grads_must_be_arrays():
    """pickle kept .grad (torch drops it); `.grad = [1., 2.]` or `= 3.0` was wrapped silently (torch: TypeError);
    a NumPy array stays accepted, the engine's storage."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * 3).sum().backward()
    back = pickle.loads(pickle.dumps(x))
    assert back.grad is None and back.requires_grad and x.grad.data.tolist() == [3.0, 3.0]
    for wrong in ([1.0, 2.0], 3.0, (1.0, 2.0)):
        with pytest.raises(TypeError, match=f"grad: assigned grad must be a Tensor.*got {type(wrong).__name__}"):
            x.grad = wrong
    assert x.grad.data.tolist() == [3.0, 3.0]          # unchanged by the refused assignments
    x.grad = np.array([5.0, 6.0])
    assert isinstance(x.grad, Tensor) and x.grad.data.tolist() == [5.0, 6.0] and not x.grad.requires_grad


def test_abs_and_unary_plus_as_torch():
    """abs(t) and +t had no dunders (TypeError); torch: abs is the op, +t is t itself, a bool tensor refused."""
    x = Tensor(np.array([-1.5, 2.0]), requires_grad=True)
    y = abs(x)
    y.sum().backward()
    assert y.data.tolist() == [1.5, 2.0] and x.grad.data.tolist() == [-1.0, 1.0]
    assert +x is x and abs(Tensor(np.array([-3, 4]))).data.tolist() == [3, 4]
    with pytest.raises(TypeError, match=r"\+t: unary \+ is not defined for a bool tensor"):
        +Tensor(np.array([True]))
