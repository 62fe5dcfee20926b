"""Fused ops for the Mamba-2 mixer's hot chains: one engine op (and one pass over memory) where the plain
composition takes several. Internal: the model and the layers call them when built with fused=True; every
one has a slow twin made of engine ops (the `reference_*` function beside it), which tests/fast/test_fused.py
holds equal in float64 to 1e-10, and gradchecks.

    split_last(x, sizes)               = F.split(x, sizes, axis=-1), one op whose backward writes one array
    conv1d_silu(x, weight, bias, h)    = silu(causal_conv1d(cat(h, x), weight, bias))[:, k - 1:]  (h: history)
    dt_softplus(dt, bias, low, high)   = clip(softplus(dt + bias), low, high)
    gated_rms_norm(y, z, weight, G, e) = rms_norm per group of G channels of (y * silu(z)), times weight

How they run (each choice measured, benchmarks/bench_fused.py): the rows are cut into blocks of ~128 KiB
that stay in L2, handed to whichever thread asks first (numba.get_num_threads() of them, the caller's among
them; the caller never waits for a helper that has not started). Per block, a numba kernel (fast/conv_kernels.py,
fast/norm_kernels.py) does all the arithmetic, exp included: fast/fast_exp's exp32 for float32 data (within 2
float32 ulp), its float64 exp for float64 (within 2 ulp), both vectorised by LLVM inside the kernels' loops,
where numba's math.exp is a scalar libm call (no SVML in the llvmlite wheels) and NumPy's exp a pass of its own
over a scratch block. sigmoid(v) = 1 / (1 + exp(-v)), silu(v) = v / (1 + exp(-v)). A strided input (the
in_proj split's views) is read in place as rows of its base array from a column on, never copied; a conv or
gated-norm input that is a SplitLast output gets its gradient written straight into the split's one gradient
array (`SplitLast.gradient_slot`, the engine's gradient_slot hook), so the split's backward copies nothing for
it. Weight gradients are summed per block in a fixed order: the same bits whichever thread ran which block
(resume is bit-identical). The kernels keep the input dtype (a float32 model stays float32) and recompute cheap
intermediates in backward instead of saving them, so a fused op holds less memory than its composition.

Arguments and dtypes: each op checks every argument's shape before a kernel runs (the kernels index unchecked),
as its twin does. The kernels take float32 and float64 operands, in the dtype the twin gives; any other dtype
(integers, bools, float16) runs the twin itself, so an op's output dtype is always its twin's
(tests/fast/test_fused_dtypes.py holds the two over a grid of dtypes).
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd import args as A
from ..autograd import functional as F
from ..autograd.function import Function, gradient_slot
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.tensor import Tensor
from . import heap_reuse
from .conv_kernels import conv_dx_dw, conv_silu_forward, conv_silu_grad
from .norm_kernels import add_rms_backward, add_rms_forward, gated_rms_backward, gated_rms_forward
from .row_blocks import as_rows, on_threads, rows_per_block


def _gradient_destination(op: Function, i: int, dtype) -> tuple:
    """Where op's backward writes the gradient of its input i: (rows, col, gradient) with gradient (x's shape)
    == rows[:, col:col + c] reshaped: the slot the op that made that input lends (the engine's gradient_slot
    hook: a SplitLast's piece of its one gradient array), else a new array."""
    x = op.inputs[i]
    slot = gradient_slot(x, dtype)
    if slot is not None:
        rows, col = as_rows(slot, dtype)
        if np.may_share_memory(rows, slot):                              # rows of the slot's own memory
            return rows, col, slot
    grad = heap_reuse.empty(x.shape, dtype)
    return _matrix(grad), 0, grad


KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _kernels_take(*tensors) -> bool:
    """Whether an op's operands (None: an argument not given) are all float32 or float64, which the kernels
    compute in. Any other dtype (integers, bools, float16, which numba has no arithmetic for) runs the op's twin:
    its dtype rules (integers become float32, as F.silu) and its results, as the fused matmul, cross entropy and
    embedding fall back to their engine ops."""
    return all(t is None or t.dtype in KERNEL_DTYPES for t in tensors)


def _matrix(a: np.ndarray) -> np.ndarray:
    """(..., c) -> (N, c), also when c = 0."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


# --- split along the last axis ------------------------------------------------------------------------------

class SplitLast(Function):
    """x (..., sum(sizes)) -> views x[..., s_i:s_i + n_i]. Backward: the pieces' gradients side by side in one
    array (an unused piece's are zeros), instead of one full-size zeros array per piece.
    A fused op whose input is piece i may ask for `gradient_slot` in its backward and write its gradient there,
    in that one array, so this backward copies nothing for that piece."""

    is_view = True

    def forward(self, x, sizes=()):
        self.bounds = tuple(zip(np.cumsum((0,) + sizes[:-1]).tolist(), np.cumsum(sizes).tolist()))
        self.grad_shape, self.grad = x.shape, None
        self.lent: dict = {}                                             # piece -> its slot of self.grad
        return tuple(x[..., a:b] for a, b in self.bounds)

    def gradient_slot(self, piece: Tensor, dtype) -> np.ndarray | None:
        """The engine's hook (Function.gradient_slot): this op's gradient array[..., a:b], where the gradient of
        output `piece` goes; backward then copies nothing for that piece if it gets that slot itself back as
        its gradient. None if
        `piece` is not (or no longer) an output, the dtype is not the input's, or the slot was lent already
        (a second user of the piece keeps its own array; the engine then sums the two and backward copies)."""
        index = next((j for j, ref in enumerate(self.outputs) if ref() is piece), None)
        if index is None or index in self.lent or self._freed or dtype != self.output_specs[index][1]:
            return None
        if self.grad is None:
            self.grad = heap_reuse.empty(self.grad_shape, dtype)
        a, b = self.bounds[index]
        self.lent[index] = self.grad[..., a:b]
        return self.lent[index]

    def backward(self, *grads):
        if self.grad is None:
            return np.concatenate(grads, axis=-1)
        out, lent = self.grad, self.lent
        self.grad, self.lent = None, {}                                  # lent once: nothing writes it later
        for j, ((a, b), g) in enumerate(zip(self.bounds, grads)):
            if not _same_view(g, lent.get(j)):                           # not written in place (or a sum of two)
                out[..., a:b] = g
        return out


def _same_view(g: np.ndarray, slot) -> bool:
    """Whether g is the lent slot itself or the same memory seen the same way (a reshape of the slot that came
    back through a Reshape's backward, as the scan's dx, dB, dC do)."""
    return slot is not None and (g is slot or (
        g.shape == slot.shape and g.strides == slot.strides and g.dtype == slot.dtype
        and g.__array_interface__["data"][0] == slot.__array_interface__["data"][0]))


def split_last(x: Tensor, sizes) -> tuple:
    sizes = tuple(int(s) for s in sizes)
    if sum(sizes) != x.shape[-1] or min(sizes, default=0) < 0:
        raise ValueError(f"split_last: sizes {sizes} don't add up to the last axis of {x.shape}")
    return SplitLast.apply(x, sizes=sizes)


def _destination(op: Function, i: int, shape: tuple, dtype) -> tuple:
    """(rows, col, gradient) for input i (see _gradient_destination); scratch when it needs no gradient."""
    if op.needs_input_grad[i]:
        return _gradient_destination(op, i, dtype)
    return _matrix(heap_reuse.empty(shape, dtype)), 0, None


# --- causal depthwise conv1d + SiLU -------------------------------------------------------------------------

class Conv1dSilu(Function):
    """y = silu(pre), pre[b, t, c] = bias[c] + sum_j weight[c, j] x[b, t + j - (k - 1), c].
    x (b, l, c) (a strided view is read in place), weight (c, k), bias (c,) or None. Saves x only: pre is
    recomputed in backward (k multiply-adds per entry). With d = grad * s (1 + pre (1 - s)), s = sigmoid(pre):
    dx[t] = sum_j weight[:, j] d[t + k - 1 - j], dweight[:, j] = sum_t d[t] x[t + j - (k - 1)], dbias = sum d.
    A block is up to `steps` steps of one sequence; backward recomputes pre for k - 1 steps past its end."""

    def forward(self, x, weight, bias=None):
        dtype = np.result_type(x, weight) if bias is None else np.result_type(x, weight, bias)  # F.causal_conv1d's
        c, k = weight.shape
        w = np.zeros((-(-k // 4) * 4, c), dtype)                         # (kp, c): weight.T after kp - k zero rows
        w[w.shape[0] - k:] = weight.T
        b_ = np.zeros(c, dtype) if bias is None else bias.astype(dtype, copy=False)
        self.save_for_backward(x, w, b_)                                 # x as given: a view stays a view
        self.k = k
        nb, l, _ = x.shape
        out = heap_reuse.empty(x.shape, dtype)                           # (b, l, c)
        if x.size == 0:
            return out
        rows, col = as_rows(x, dtype)                                    # (b l, D), x at column col
        steps = rows_per_block(c, out.itemsize)
        per_seq = -(-l // steps)
        out_rows, zero = out.reshape(nb * l, c), np.zeros(c, dtype)

        def work(blocks, share):
            for blk in blocks:
                seq, t0 = blk // per_seq, blk % per_seq * steps
                conv_silu_forward(rows, col, l, w, k, b_, zero, seq, t0, min(t0 + steps, l), out_rows)
        on_threads(work, nb * per_seq)
        return out

    def backward(self, grad):                                          # grad (b, l, c)
        x, w, b_ = self.saved
        dtype, (nb, l, c), (kp, k) = w.dtype, x.shape, (w.shape[0], self.k)
        rows, col = as_rows(x, dtype)
        g_rows, gcol = as_rows(grad, dtype)
        dx, dxcol, grad_x = _destination(self, 0, x.shape, dtype)
        steps = rows_per_block(c, w.itemsize)
        per_seq = -(-l // steps) if l else 0
        # per block, summed below in a fixed order: the same bits whichever thread ran which block; zeroed by the
        # thread that runs the block (a 3.4 MiB memset a step on the caller's thread otherwise)
        dw = np.empty((nb * per_seq, kp, c), dtype)
        db = np.empty((nb * per_seq, c), dtype)
        zero, one = np.zeros(c, dtype), dtype.type(1)

        def work(blocks, share):
            d = np.empty((steps + kp - 1, c), dtype)
            for blk in blocks:
                dw[blk], db[blk] = 0, 0
                seq, t0 = blk // per_seq, blk % per_seq * steps
                t1 = min(t0 + steps, l)
                conv_silu_grad(rows, col, l, w, k, b_, zero, one, g_rows, gcol, seq, t0, t1, d)
                conv_dx_dw(rows, col, l, w, k, zero, seq, t0, t1, d, dx, dxcol, dw[blk], db[blk])
        on_threads(work, nb * per_seq)
        grad_bias = db.sum(axis=0) if len(self.needs_input_grad) > 2 and self.needs_input_grad[2] else None
        return grad_x, dw.sum(axis=0)[kp - k:].T, grad_bias


def conv1d_silu(x: Tensor, weight: Tensor, bias: Tensor | None = None, history: Tensor | None = None) -> Tensor:
    """silu(causal_conv1d(x, weight, bias)): x (b, l, c), weight (c, 1, k) or (c, k), bias (c,) or None.
    history (b, k - 1, c) or None: the inputs before x (a sequence continued from a cache), which the conv reads
    where it would read zeros. When a graph is recorded that is the conv of cat(history, x) from its step k - 1
    on (reference_conv1d_silu); otherwise (eval, prefill) the conv of x alone, its first k - 1 steps done again
    from a small window with the history in place: no (b, k - 1 + l, c) copy of x (at the 130M shape the cat was
    1.2% of eval). Every argument is checked here, before a kernel runs: the kernels index them unchecked."""
    x, weight = A.as_tensor("conv1d_silu", "x", x), A.as_tensor("conv1d_silu", "weight", weight)
    bias = None if bias is None else A.as_tensor("conv1d_silu", "bias", bias)
    history = None if history is None else A.as_tensor("conv1d_silu", "history", history)
    given = weight.shape                                   # for the messages, before the (c, 1, k) -> (c, k) reshape
    if weight.ndim == 3 and weight.shape[1] == 1:
        weight = F.reshape(weight, (weight.shape[0], weight.shape[2]))
    if x.ndim != 3 or weight.ndim != 2 or weight.shape[0] != x.shape[2] or weight.shape[1] == 0:
        raise ValueError(f"conv1d_silu: need x (b, l, c) and weight (c, 1, k) or (c, k) with the same c and k >= 1, "
                         f"got x {x.shape} and weight {given}")
    c, k = x.shape[2], weight.shape[1]
    if bias is not None and bias.shape != (c,):
        raise ValueError(f"conv1d_silu: bias must have shape ({c},), one per channel of x {x.shape} and weight "
                         f"{given}, got {bias.shape}; pass a bias of shape ({c},) or None")
    if history is not None and history.shape != (x.shape[0], k - 1, c):
        raise ValueError(f"conv1d_silu: history must be (b, k - 1, c) = {(x.shape[0], k - 1, c)} for x "
                         f"{x.shape} and weight {given}, got {history.shape}")
    if not _kernels_take(x, weight, bias, history):
        return reference_conv1d_silu(x, weight, bias, history)

    def conv(inputs):
        return Conv1dSilu.apply(inputs, weight, bias) if bias is not None else Conv1dSilu.apply(inputs, weight)
    if history is None:
        return conv(x)
    if is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, history)):
        return conv(F.cat([history, x], axis=1))[:, k - 1:]          # (b, l, c)
    dtype = np.result_type(history.dtype, x.dtype, weight.dtype)        # cat(history, x)'s conv: the twin's dtype
    if dtype != np.result_type(x.dtype, weight.dtype):                    # (a bias's dtype counts in Conv1dSilu)
        weight = Tensor(weight.data.astype(dtype))                   # no graph: a float64 history widens x's conv too
    out = conv(x)                                                     # (b, l, c) as if zeros came before x
    m = min(x.shape[1], k - 1)
    if m:
        window = np.concatenate([history.data, x.data[:, :m]], axis=1)   # (b, k - 1 + m, c)
        out.data[:, :m] = conv(Tensor(window)).data[:, k - 1:]       # the first m steps, with the history
    return out


def reference_conv1d_silu(x, weight, bias=None, history=None):
    if history is None:
        return F.silu(F.causal_conv1d(x, weight, bias))
    return F.silu(F.causal_conv1d(F.cat([history, x], axis=1), weight, bias))[:, history.shape[1]:]


# --- dt: softplus(dt + bias), clamped -------------------------------------------------------------------------

class DtSoftplus(Function):
    """out = clip(softplus(dt + bias), low, high); softplus(v) = v where v > 20 (torch's threshold).
    d/d dt = sigmoid(v) (1 where v > 20), times 0 where the clip is active; d bias = the same, summed."""

    def forward(self, dt, bias, low=0.0, high=math.inf):
        v = dt + bias                                                    # (..., h)
        linear = v > 20.0
        soft = np.where(linear, v, np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v))))
        out = np.clip(soft, low, high) if (low, high) != (0.0, math.inf) else soft
        inside = (soft >= low) & (soft <= high)                          # where the clip passes the gradient
        self.save_for_backward(v, linear, inside)
        return out.astype(np.result_type(dt, bias), copy=False)

    def backward(self, grad):
        v, linear, inside = self.saved
        e = np.exp(-np.abs(v))                                           # sigmoid(v), overflow-free
        slope = np.where(linear, 1.0, np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))).astype(v.dtype)
        d = grad * slope * inside
        return d, d


def dt_softplus(dt: Tensor, bias: Tensor, low: float = 0.0, high: float = math.inf) -> Tensor:
    """clip(softplus(dt + bias), low, high): dt (..., h), bias (h,) (one per head; not broadcast further)."""
    dt, bias = A.as_tensor("dt_softplus", "dt", dt), A.as_tensor("dt_softplus", "bias", bias)
    low, high = A.number("dt_softplus", "low", low), A.number("dt_softplus", "high", high)
    if dt.ndim == 0 or bias.shape != dt.shape[-1:]:
        raise ValueError(f"dt_softplus: need dt (..., h) and bias (h,), one per head, got dt {dt.shape} and bias "
                         f"{bias.shape}; pass a bias of shape {dt.shape[-1:] or '(h,)'}")
    if not _kernels_take(dt, bias):
        return reference_dt_softplus(dt, bias, low, high)
    return DtSoftplus.apply(dt, bias, low=float(low), high=float(high))


def reference_dt_softplus(dt, bias, low=0.0, high=math.inf):
    out = F.softplus(dt + bias)
    return F.clip(out, low, high) if (low, high) != (0.0, math.inf) else out


# --- gated (grouped) RMS norm ---------------------------------------------------------------------------------

class GatedRMSNorm(Function):
    """out = u r weight, u = y * silu(z) (u = y without z), r = 1 / sqrt(mean over each group of u^2 + eps).
    y, z (..., d), weight (d,). Saves y, z (as given: a view stays a view, read in place) and r (one number
    per row and group); u and sigmoid(z) are recomputed.
    With xhat = u r:  du = r (g w - xhat mean(g w xhat)),  dy = du silu(z),  dz = du y silu'(z),
    dweight = sum over rows of g xhat."""

    def forward(self, y, z, weight, group=1, eps=1e-5):
        d = y.shape[-1]
        dtype = np.result_type(y, weight) if z is None else np.result_type(y, z, weight)
        y_rows, ycol = as_rows(y, dtype)                                 # (N, D), y at column ycol
        z_rows, zcol = (y_rows, ycol) if z is None else as_rows(z, dtype)
        w = weight.astype(dtype, copy=False)
        n = y_rows.shape[0]
        out = heap_reuse.empty(y.shape, dtype)
        rstd = np.empty((n, d // group), dtype)                          # (N, G)
        consts = np.array([0.0, 1.0 / group, 1.0, eps], dtype)          # see fast/norm_kernels.py
        self.save_for_backward(y, z, weight, rstd)
        self.consts, self.dtype = consts, dtype
        rows_per = rows_per_block(d, out.itemsize)
        out_rows = out.reshape(n, d)

        def work(blocks, share):
            for blk in blocks:
                r0, r1 = blk * rows_per, min(blk * rows_per + rows_per, n)
                gated_rms_forward(y_rows, ycol, z_rows, zcol, w, consts, z is not None, r0, r1, out_rows, rstd)
        on_threads(work, -(-n // rows_per))
        return out

    def backward(self, grad):
        y, z, weight, rstd = self.saved
        dtype, d = self.dtype, y.shape[-1]
        y_rows, ycol = as_rows(y, dtype)
        z_rows, zcol = (y_rows, ycol) if z is None else as_rows(z, dtype)
        g_rows, gcol = as_rows(grad, dtype)
        w = weight.astype(dtype, copy=False)
        n = y_rows.shape[0]
        dy, dycol, grad_y = _destination(self, 0, y.shape, dtype)
        dz, dzcol, grad_z = (dy, dycol, None) if z is None else _destination(self, 1, z.shape, dtype)
        rows_per = rows_per_block(d, dy.itemsize)
        blocks = -(-n // rows_per)
        dw = np.zeros((blocks, d), dtype)          # per block, summed in a fixed order: the same bits every run

        def work(blocks, share):
            u, s = np.empty(d, dtype), np.empty(d, dtype)                # scratch rows
            for blk in blocks:
                r0, r1 = blk * rows_per, min(blk * rows_per + rows_per, n)
                gated_rms_backward(y_rows, ycol, z_rows, zcol, w, rstd, g_rows, gcol, self.consts, z is not None,
                                   r0, r1, dy, dycol, dz, dzcol, dw[blk], u, s)
        on_threads(work, blocks)
        return grad_y, grad_z, dw.sum(axis=0)


def gated_rms_norm(y: Tensor, z: Tensor | None, weight: Tensor, group_size: int, eps: float = 1e-5) -> Tensor:
    """rms_norm over each group of group_size channels of y * silu(z) (of y when z is None), times weight.
    With group_size = d and z None it is the plain RMSNorm."""
    y, weight = A.as_tensor("gated_rms_norm", "y", y), A.as_tensor("gated_rms_norm", "weight", weight)
    z = None if z is None else A.as_tensor("gated_rms_norm", "z", z)
    group_size, eps = A.integer("gated_rms_norm", "group_size", group_size), A.number("gated_rms_norm", "eps", eps)
    d = y.shape[-1] if y.ndim else None
    if (d is None or weight.shape != (d,) or group_size <= 0 or d % group_size
            or (z is not None and z.shape != y.shape)):
        raise ValueError(f"gated_rms_norm: need y (..., d), z None or y's shape, weight (d,), d divisible by "
                         f"group_size; got y {y.shape}, z {None if z is None else z.shape}, weight {weight.shape}, "
                         f"group_size {group_size}")
    # operands of different dtypes run the twin: it computes silu(z) and a float32 y's norm in float32 and widens
    # after, the kernels all in the widest dtype (a float32 y with a float64 weight differed by 8e-8; an audit)
    if not _kernels_take(y, z, weight) or len({t.dtype for t in (y, z, weight) if t is not None}) > 1:
        return reference_gated_rms_norm(y, z, weight, group_size, eps)
    return GatedRMSNorm.apply(y, z, weight, group=int(group_size), eps=float(eps))


class AddRMSNorm(Function):
    """The residual add and the next norm in one pass (mamba_ssm's fused_add_norm): total = x + m and
    out = total r weight, r = 1 / sqrt(mean(total^2, last axis) + eps); x, m (..., d), weight (d,).
    Outputs (total, out), or out alone with return_total=False (the last norm: nothing reads the sum).
    Saves total and r. With xhat = total r and g_total, g the outputs' gradients:
    dx = dm = g_total + r (g w - xhat mean(g w xhat)),  dweight = sum over rows of g xhat.
    The same bits as the add followed by the RMSNorm op (`gated_rms_norm` without a gate) and the engine summing
    the residual stream's two gradients; one pass fewer each way."""

    def forward(self, x, m, weight, eps=1e-5, return_total=True):
        d = x.shape[-1]
        dtype = np.result_type(x, m, weight)
        x_rows, xcol = as_rows(x, dtype)
        m_rows, mcol = as_rows(m, dtype)
        n = x_rows.shape[0]
        total, out = heap_reuse.empty(x.shape, dtype), heap_reuse.empty(x.shape, dtype)
        rstd = np.empty(n, dtype)                                        # (N,)
        consts = np.array([0.0, 1.0 / d, 1.0, eps], dtype)              # see fast/norm_kernels.py
        w = weight.astype(dtype, copy=False)
        self.save_for_backward(total, weight, rstd)
        self.consts, self.dtype, self.return_total = consts, dtype, return_total
        rows_per = rows_per_block(d, out.itemsize)
        total_rows, out_rows = total.reshape(n, d), out.reshape(n, d)

        def work(blocks, share):
            for blk in blocks:
                r0, r1 = blk * rows_per, min(blk * rows_per + rows_per, n)
                add_rms_forward(x_rows, xcol, m_rows, mcol, w, consts, r0, r1, total_rows, out_rows, rstd)
        on_threads(work, -(-n // rows_per))
        return (total, out) if return_total else out

    def backward(self, *grads):
        total, weight, rstd = self.saved
        grad_total, grad = grads if self.return_total else (None, grads[0])
        dtype, d = self.dtype, total.shape[-1]
        n = rstd.shape[0]
        total_rows = total.reshape(n, d)
        g_rows, gcol = as_rows(grad, dtype)
        t_rows, tcol = (g_rows, gcol) if grad_total is None else as_rows(grad_total, dtype)
        w = weight.astype(dtype, copy=False)
        dx = heap_reuse.empty(total.shape, dtype)
        rows_per = rows_per_block(d, dx.itemsize)
        blocks = -(-n // rows_per)
        dw = np.zeros((blocks, d), dtype)          # per block, summed in a fixed order: the same bits every run
        dx_rows = dx.reshape(n, d)

        def work(blocks, share):
            for blk in blocks:
                r0, r1 = blk * rows_per, min(blk * rows_per + rows_per, n)
                add_rms_backward(total_rows, w, rstd, g_rows, gcol, t_rows, tcol, grad_total is not None,
                                 self.consts, r0, r1, dx_rows, dw[blk])
        on_threads(work, blocks)
        return dx, dx, dw.sum(axis=0)


def add_rms_norm(x: Tensor, m: Tensor, weight: Tensor, eps: float = 1e-5, return_total: bool = True):
    """(x + m, rms_norm(x + m) * weight) in one op, or the norm alone with return_total=False."""
    x, m = A.as_tensor("add_rms_norm", "x", x), A.as_tensor("add_rms_norm", "m", m)
    weight, eps = A.as_tensor("add_rms_norm", "weight", weight), A.number("add_rms_norm", "eps", eps)
    if x.ndim == 0 or m.shape != x.shape or weight.shape != x.shape[-1:]:
        raise ValueError(f"add_rms_norm: need x (..., d), m x's shape, weight (d,); got x {x.shape}, m {m.shape}, "
                         f"weight {weight.shape}")
    # the twin's sum x + m keeps their dtype where a wider weight widens only the norm: the kernels write both in one
    total = np.result_type(x.dtype, m.dtype)
    if not _kernels_take(x, m, weight) or np.result_type(total, weight.dtype) != total:
        return reference_add_rms_norm(x, m, weight, eps, return_total)
    return AddRMSNorm.apply(x, m, weight, eps=float(eps), return_total=bool(return_total))


def reference_add_rms_norm(x, m, weight, eps=1e-5, return_total=True):
    total = x + m
    out = F.rms_norm(total, weight, eps)
    return (total, out) if return_total else out


def reference_gated_rms_norm(y, z, weight, group_size, eps=1e-5):
    if z is not None:
        y = y * F.silu(z)
    d = y.shape[-1]
    grouped = F.reshape(y, (*y.shape[:-1], d // group_size, group_size))
    return F.reshape(F.rms_norm(grouped, None, eps), y.shape) * weight


__all__ = ["split_last", "conv1d_silu", "dt_softplus", "gated_rms_norm", "add_rms_norm", "reference_conv1d_silu",
           "reference_dt_softplus", "reference_gated_rms_norm", "reference_add_rms_norm"]
