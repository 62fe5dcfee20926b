"""What a PyTorch program ported line by line meets: `p.data = p.data - lr * p.grad` (a Tensor stored inside
.data crashed AdamW and save much later), float64 data from torch or NumPy scalars kept float64 (it was rounded
to float32), argmax for the indices torch.max(dim) returns, f"{loss:.4f}", and errors that say what to write
instead (an ndarray updated in place with a tensor, torch's (N, C, L) cross-entropy layout)."""
import numpy as np
import pytest

import tinygrad_ssm as tg
from tinygrad_ssm import Tensor
from tinygrad_ssm.autograd import functional as F


def test_assigning_data_takes_a_tensors_array_and_keeps_a_grad_tensor_float():
    p = Tensor(np.ones(3), requires_grad=True)
    p.grad = Tensor(np.full(3, 2.0))
    version = p._version[0]
    p.data = p.data - 0.1 * p.grad                      # ndarray - Tensor is a Tensor: its array is stored
    assert type(p.data) is np.ndarray and p.data.tolist() == [0.8] * 3 and p._version[0] == version
    p.data = [1.0, 2.0]                                  # converted as Tensor(...) converts (a new shape is allowed)
    assert p.shape == (2,) and p.dtype == np.float32
    with pytest.raises(TypeError, match=r"requires grad, so its data must be floating point, got dtype int64"):
        p.data = np.ones(2, np.int64)
    q = Tensor(np.ones(2))
    q.data = np.arange(2)                                # a tensor that requires no grad may hold ints
    assert q.dtype == np.int64


def test_data_that_states_its_dtype_keeps_it():
    assert tg.tensor(np.float64(0.1)).dtype == tg.Tensor(np.float64(0.1)).dtype == np.float64
    assert tg.tensor(memoryview(np.array([0.1]))).dtype == np.float64
    assert tg.tensor([0.1]).dtype == tg.tensor(0.1).dtype == np.float32   # Python floats: float32, as torch
    torch = pytest.importorskip("torch")
    weights = torch.tensor([0.1, 0.2], dtype=torch.float64)
    for made in (tg.tensor(weights), tg.Tensor(weights)):
        assert made.dtype == np.float64 and made.data.tolist() == [0.1, 0.2]


def test_argmax_gives_the_indices_max_does_not():
    scores = Tensor(np.array([[1.0, 3.0, 3.0], [5.0, 2.0, 0.0]]), requires_grad=True)
    assert scores.argmax(1).tolist() == [1, 0] and scores.argmax(1).dtype == np.int64    # the first of a tie
    assert scores.argmax().item() == 3 and scores.argmax(0, keepdims=True).shape == (1, 3)
    assert scores.max(1).tolist() == [3.0, 5.0]


def test_a_one_element_tensor_formats_as_its_number():
    loss = Tensor(np.array(1.23456), requires_grad=True) * 2
    assert f"{loss:.3f}" == "2.469" and f"{Tensor([7]):d}" == "7"
    assert f"{loss}" == repr(loss)


def test_errors_say_what_to_write_instead():
    p = Tensor(np.ones(3), requires_grad=True)
    p.grad = Tensor(np.ones(3))
    with pytest.raises(TypeError, match=r"with no_grad\(\): p -= lr \* p.grad.*p.data -= lr \* p.grad.data"):
        p.data += -0.1 * p.grad
    with pytest.raises(ValueError, match=r"the class axis is the last: torch's \(N, C, L\) logits are \(N, L, C\)"):
        F.cross_entropy(Tensor(np.zeros((4, 27, 8))), np.zeros((4, 8), np.int64))


def test_torchs_cast_methods_give_torchs_dtypes():
    """`(x > 0).long()` (a torch target) raised AttributeError: only float() and double() existed."""
    torch = pytest.importorskip("torch")
    data = np.array([-1.5, 0.0, 2.7])
    for name in ("long", "int", "bool", "float", "double"):
        ours, theirs = getattr(Tensor(data), name)(), getattr(torch.tensor(data), name)()
        assert str(ours.dtype) == str(theirs.dtype).removeprefix("torch."), name
        assert ours.tolist() == theirs.tolist(), name


def test_an_integer_cast_of_a_tensor_that_requires_grad_ends_the_graph_as_torchs():
    """`idx = (w * n).long()` on a parameter (a torch idiom: bucket indices) raised "detach() it first"; torch gives
    an integer tensor that does not require grad, and the gradient of what else used w is unchanged."""
    torch = pytest.importorskip("torch")
    data = np.array([1.5, -2.7, 0.2])
    w, w_t = Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    for name in ("long", "int", "bool"):
        ours, theirs = getattr(w * 3, name)(), getattr(w_t * 3, name)()
        assert ours.tolist() == theirs.tolist() and not ours.requires_grad and not theirs.requires_grad, name
        assert ours.grad_fn is None, name
    idx = (w * 2).long()                               # (3,) int64: [3, -5, 0]
    (w * w).sum().backward()
    assert idx.tolist() == [3, -5, 0] and np.array_equal(w.grad.data, 2 * data)
