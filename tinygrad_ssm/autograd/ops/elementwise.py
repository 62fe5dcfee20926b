"""Elementwise ops: each forward beside its backward.

Backward receives `grad`, the gradient of the loss with respect to this op's output (same shape as the
output), and returns one gradient per input in the *output's* shape: the engine sums broadcast axes away
(`backward.unbroadcast`), so no op has to.
"""
import numpy as np

from ..function import Function


# --- binary arithmetic ---------------------------------------------------------------------------------------

class Add(Function):
    def forward(self, a, b):
        return a + b

    def backward(self, grad):
        return grad, grad


class Sub(Function):
    def forward(self, a, b):
        return a - b

    def backward(self, grad):
        return grad, -grad


class Mul(Function):
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * b

    def saved_needed(self):
        return self.needs_input_grad[1], self.needs_input_grad[0]       # d/da reads b, d/db reads a

    def backward(self, grad):
        a, b = self.saved
        return (grad * b if self.needs_input_grad[0] else None,
                grad * a if self.needs_input_grad[1] else None)


class Div(Function):
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a / b

    def saved_needed(self):
        return self.needs_input_grad[1], True                           # d/da = 1 / b, d/db = -a / b^2

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad / b
        return grad_a, (-grad_a * a / b if self.needs_input_grad[1] else None)


class Pow(Function):
    """a ** b. d/da = b * a^(b-1), taken as 0 where b == 0 (a^0 is 1 for every a, even a = 0 where the
    formula reads 0 * 0^-1); d/db = a^b * log(a), taken as 0 where a == 0 and b >= 0 (a^b is then constant
    in b) and NaN for a < 0, where log(a) is not real: torch's rules. d/db's 0 multiplies the incoming gradient, so
    an infinite one (log(x ** y) at x = 0) gives NaN there, as torch's; d/da's 0 replaces it (a^0 is constant)."""

    def forward(self, a, b):
        both_bool = a.dtype == np.bool_ and b.dtype == np.bool_
        out = a | ~b if both_bool else a ** b    # bool ** bool is bool, as torch's (NumPy's is int8): 0^0 = 1, 0^1 = 0
        self.save_for_backward(a, b, out)
        return out

    def saved_needed(self):
        return True, True, self.needs_input_grad[1]                     # the output only for d/db (x ** 2.0: none)

    def backward(self, grad):
        a, b, out = self.saved
        grad_a = grad_b = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.needs_input_grad[0]:
                grad_a = np.where(b == 0, 0.0, grad * b * a ** (b - 1))
            if self.needs_input_grad[1]:
                grad_b = grad * np.where((a == 0) & (b >= 0), 0.0, out * np.log(a))   # NaN, inf grads pass
        return grad_a, grad_b


def _share(grad, lost, tie):
    """An input's share of max's or min's gradient: 0 where it lost, half on a tie, all of it otherwise.
    Picked, not multiplied by a 0/1 mask: an infinite gradient (sqrt(maximum(x, 0)) at x <= 0) is 0 where the
    input lost, where inf * 0 would be NaN (torch picks too)."""
    return np.where(lost, 0, np.where(tie, grad * 0.5, grad))


class Maximum(Function):
    """The larger input gets the gradient; a tie splits it in half; where either is NaN (so is the result)
    both get all of it (torch's formula: each input's share is 1, 0 where it is the smaller, 1/2 on a tie)."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return np.maximum(a, b)

    def backward(self, grad):
        a, b = self.saved
        return _share(grad, a < b, a == b), _share(grad, b < a, a == b)


class Minimum(Function):
    """As Maximum, with the smaller input getting the gradient."""

    def forward(self, a, b):
        self.save_for_backward(a, b)
        return np.minimum(a, b)

    def backward(self, grad):
        a, b = self.saved
        return _share(grad, a > b, a == b), _share(grad, b > a, a == b)


class Where(Function):
    """where(condition, a, b): the gradient goes to whichever input was picked; condition gets none."""

    def forward(self, condition, a, b):
        # a copy: the caller's mask (a bool tensor or array) may be changed in place before backward
        self.save_for_backward(np.array(condition, dtype=bool))
        return np.where(condition, a, b)

    def backward(self, grad):
        (condition,) = self.saved
        zero = np.zeros((), grad.dtype)
        return None, np.where(condition, grad, zero), np.where(condition, zero, grad)


# --- unary math ------------------------------------------------------------------------------------------

class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, grad):
        return -grad


class Exp(Function):
    def forward(self, a):
        out = np.exp(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad * out


class Log(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return np.log(a)

    def backward(self, grad):
        (a,) = self.saved
        return grad / a


class Sqrt(Function):
    def forward(self, a):
        out = np.sqrt(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad / (2 * out)


class Rsqrt(Function):
    """1 / sqrt(a); d/da = -0.5 * a^(-3/2) = -0.5 * out^3."""

    def forward(self, a):
        out = 1 / np.sqrt(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad * -0.5 * out ** 3


class Abs(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return np.abs(a)

    def backward(self, grad):
        (a,) = self.saved
        return grad * np.where(np.isnan(a), 0, np.sign(a))  # 0 at 0 and at NaN, as torch's sgn


class Tanh(Function):
    def forward(self, a):
        out = np.tanh(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad * (1 - out * out)


def _stable_sigmoid(a):
    """1 / (1 + exp(-a)) without overflow: exp of a non-positive number only."""
    e = np.exp(-np.abs(a))                      # in (0, 1]
    return np.where(a >= 0, 1, e) / (1 + e)     # 1/(1+e^-a) for a >= 0, e^a/(1+e^a) below


class Sigmoid(Function):
    def forward(self, a):
        out = _stable_sigmoid(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad * out * (1 - out)


class Silu(Function):
    """a * sigmoid(a); d/da = s * (1 + a * (1 - s))."""

    def forward(self, a):
        s = _stable_sigmoid(a)
        self.save_for_backward(a, s)
        return a * s

    def backward(self, grad):
        a, s = self.saved
        return grad * s * (1 + a * (1 - s))


class Softplus(Function):
    """log(1 + exp(beta * a)) / beta, and the identity where beta * a > threshold (as torch).
    The stable form max(x, 0) + log1p(exp(-|x|)) never overflows."""

    def forward(self, a, beta=1.0, threshold=20.0):
        x = beta * a
        linear = x > threshold
        self.save_for_backward(x, linear)
        soft = (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))) / beta
        return np.where(linear, a, soft).astype(a.dtype, copy=False)

    def backward(self, grad):
        x, linear = self.saved
        return grad * np.where(linear, 1, _stable_sigmoid(x))


class Relu(Function):
    """The output is saved, not the input (as torch): out <= 0 exactly where a <= 0, and the input may then be
    changed in place."""

    def forward(self, a):
        out = np.maximum(a, 0)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return np.where(out <= 0, 0, grad)  # passes at NaN, as torch's threshold_backward (0 only where a <= 0)


class Clip(Function):
    """Clamp to [low, high]; the gradient passes where low <= a <= high (inclusive, as torch.clamp)."""

    def forward(self, a, low=None, high=None):
        self.save_for_backward(a)
        self.low, self.high = low, high
        return np.clip(a, low, high)

    def backward(self, grad):
        (a,) = self.saved
        keep = np.ones(a.shape, bool)
        if self.low is not None:
            keep &= a >= self.low
        if self.high is not None:
            keep &= a <= self.high
        return np.where(keep, grad, 0)


class Cast(Function):
    """Change dtype; the gradient is cast back to the input's dtype by the engine."""

    def forward(self, a, dtype=None):
        return a.astype(dtype)

    def backward(self, grad):
        return grad
