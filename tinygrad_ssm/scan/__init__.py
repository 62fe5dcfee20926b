"""`ssd(...)`: the Mamba-2 scan as one differentiable call, with interchangeable backends.

Every implementation of the scan is one `Backend` record in `BACKENDS`, of one of two kinds:
- engine-op backends (`ops`): the scan composed of engine ops on Tensors, so autograd records it and the
  backward comes for free. "reference" (reference.py, the chunked algorithm a reader studies and the spec
  every kernel is tested against) and "scan" (sequential.py, the sequential recurrence, slow, for checking).
- kernel backends (`forward` and `backward` on plain arrays): the one differentiable op `SSD` below wraps
  them, so a new backend is two functions and a record: "numba_chunked" (numba_chunked.py, the CPU kernels:
  numba_cpu.py's chunked forward and a chunked backward, their small products BLAS calls made inside the
  kernels, via SciPy; and a forward that keeps nothing, for when no gradient is wanted) and "cuda" (cuda.py,
  numba-cuda kernels on an NVIDIA GPU; the gradient of the log decay in cuda_decay.py).
`ssd(..., backend="auto")` takes the available backend of highest priority that takes the call's sizes
(Backend.refuses); the model, the CLI and the tests all read this registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..autograd.function import Function, gradient_slot
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.dtypes import _check_numeric
from ..autograd.tensor import Tensor
from . import numba_chunked
from .reference import ssd_chunked
from .sequential import ssd_scan


@dataclass(frozen=True)
class Backend:
    """One implementation of the scan.

    name: what `ssd(backend=...)`, the model and the CLI call it.
    priority: "auto" takes the available backend with the highest priority.
    available: () -> bool, whether it can run here (e.g. numba importable, a GPU present); cheap.
    ops: for an engine-op backend, (x, dt, A, B, C, D, initial_state, chunk_size) Tensors -> (y, final_state).
    forward: for a kernel backend, the same arguments as arrays -> (y, final_state, saved), where `saved` is a
        tuple of arrays that backward needs (inputs saved as themselves, so in-place changes are caught).
    backward: (saved, dy, d_final_state) -> the gradients of (x, dt, A, B, C, D, initial_state), arrays,
        None for D / initial_state when the call had none.
    why_unavailable: optionally () -> None where it can run, else why not and the fix (for the error that names it).
    backward_into: whether backward also takes `into=(x's, B's, C's)`: arrays (views allowed) or None, to write
        dx, dB, dC into and return instead of new arrays (see `SSD.backward`).
    inference: optionally, for a kernel backend, forward's arguments -> (y, final_state) without keeping
        anything for a backward; `ssd` calls it when no input needs a gradient (no_grad, eval, prefill).
    refuses: optionally (b, h, p, n, dtype) -> why it cannot take these sizes, None where it can; "auto" then takes
        the next backend (cuda's blocks hold a row of the state in shared memory: float64 at n = 192 does not fit).
    """
    name: str
    priority: int
    available: Callable[[], bool]
    ops: Callable | None = None
    forward: Callable | None = None
    backward: Callable | None = None
    description: str = ""
    backward_into: bool = False
    why_unavailable: Callable[[], str | None] | None = None
    inference: Callable | None = None
    refuses: Callable[..., str | None] | None = None

    def __post_init__(self):
        if (self.ops is None) == (self.forward is None or self.backward is None):
            raise ValueError(f"Backend {self.name!r}: give either ops, or forward and backward")


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    if backend.name in BACKENDS or backend.name == "auto":
        raise ValueError(f"register_backend: a backend named {backend.name!r} exists already")
    BACKENDS[backend.name] = backend
    return backend


def _always() -> bool:
    return True


register_backend(Backend("reference", priority=0, available=_always, ops=ssd_chunked,
                         description="chunked SSD of engine ops (ssd_minimal's algorithm): the spec"))
register_backend(Backend("numba_chunked", priority=12, available=_always,
                         forward=numba_chunked.forward, backward=numba_chunked.backward, backward_into=True,
                         inference=numba_chunked.inference,
                         description="numba CPU kernels of the chunked form, their products BLAS calls (needs SciPy)"))
register_backend(Backend("scan", priority=-1, available=_always, ops=ssd_scan,
                         description="the sequential recurrence of engine ops, one step at a time: for checking"))
from . import cuda as _numba_cuda  # noqa: E402  (imports numba.cuda only when used)
register_backend(Backend("cuda", priority=20, available=_numba_cuda.available, forward=_numba_cuda.forward,
                         backward=_numba_cuda.backward, description="numba-cuda kernels on an NVIDIA GPU",
                         why_unavailable=_numba_cuda.why_unavailable, refuses=_numba_cuda.refuses))


def available_backends() -> list[str]:
    """Names of the backends that can run here, fastest (highest priority) first."""
    ready = [b for b in BACKENDS.values() if b.available()]
    return [b.name for b in sorted(ready, key=lambda b: -b.priority)]


def resolve_backend(backend: str) -> Backend:
    """"auto" -> the available backend of highest priority; a name -> its record (an error if unknown or
    unavailable here)."""
    if not isinstance(backend, str):
        raise TypeError(f"ssd: backend must be a str ('auto' or one of {sorted(BACKENDS)}), got {backend!r}")
    if backend == "auto":
        return BACKENDS[available_backends()[0]]
    if backend not in BACKENDS:
        raise ValueError(f"ssd: unknown backend {backend!r}; choose 'auto' or one of {sorted(BACKENDS)}")
    record = BACKENDS[backend]
    if not record.available():
        why = record.why_unavailable() if record.why_unavailable else None
        raise RuntimeError(f"ssd: backend {backend!r} is not available here ({record.description}"
                           f"{': ' + why if why else ''}); available: {available_backends()}")
    return record


class SSD(Function):
    """The scan as one op over a kernel backend's array functions: forward gives (y, final_state), and
    backward receives both outputs' gradients (zeros for an unused one) and returns one gradient per input
    x, dt, A, B, C, D, initial_state (None for an input that is None)."""

    def forward(self, x, dt, A, B, C, D, initial_state, kernel: Backend = None, chunk_size: int = 256):
        self.kernel = kernel
        y, final_state, saved = kernel.forward(x, dt, A, B, C, D, initial_state, chunk_size)
        self.save_for_backward(*saved)
        return y, final_state                                           # (b, l, h, p), (b, h, p, n)

    def backward(self, grad_y, grad_final_state):
        if not self.kernel.backward_into:
            return tuple(self.kernel.backward(self.saved, grad_y, grad_final_state))
        # in the model x, B and C are reshaped pieces of one split_last: their gradients go straight into the
        # split's gradient array (the engine's gradient_slot hook), which then copies nothing for them
        into = tuple(gradient_slot(self.inputs[i], self.saved[i].dtype) if self.needs_input_grad[i] else None
                     for i in (0, 3, 4))
        return tuple(self.kernel.backward(self.saved, grad_y, grad_final_state, into=into))


def _tensor(name: str, value) -> Tensor:
    if not isinstance(value, Tensor):
        array = np.asarray(value)
        _check_numeric("ssd", name, value, array)                       # a complex or str input named as itself
        value = Tensor(array)
    t = value
    if t.dtype.kind != "f":
        raise TypeError(f"ssd: {name} must be a floating point tensor, got dtype {t.dtype}")
    if t.dtype.itemsize > 8:  # NumPy's longdouble: no numba type, and the kernels compute in float32 or float64
        raise TypeError(f"ssd: {name} has dtype {t.dtype}; the scan takes float16, float32 or float64: cast it "
                        f"(e.g. {name}.astype('float64'))")
    return t


def _check_shape(name: str, t: Tensor, expected: tuple, meaning: str):
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"ssd: {name} must have shape {meaning} = {tuple(expected)}, got {tuple(t.shape)}")


def ssd(x, dt, A, B, C, D=None, initial_state=None, chunk_size: int = 256, backend: str = "auto"):
    """The selective state space scan of Mamba-2, for every batch b and head i (group g(i) = i // (h / g)):

        S_t = exp(dt_t A_i) S_{t-1} + dt_t x_t B_t^T,    S_0 = initial_state (zeros if None)
        y_t = S_t C_t + D_i x_t

    x (b, l, h, p); dt (b, l, h), already softplus'd; A (h,); B, C (b, l, g, n), h divisible by g;
    D (h,) or None; initial_state (b, h, p, n) or None. Returns (y (b, l, h, p), final_state (b, h, p, n)).
    chunk_size bounds the chunks of the chunked backends: "reference" and "cuda" cut l into c = ceil(l / chunk_size)
    chunks of ceil(l / c) steps (the last shorter, or zero-padded in "reference"); "numba_chunked" into chunks of
    min(chunk_size, 32, l) steps, the last shorter; "scan" ignores it. The results do not depend on it (up to rounding).
    The argument order is not mamba_ssm's mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, ...):
    pass chunk_size by name.
    Gradients reach every tensor input. Everything is computed in the widest input dtype, float32 at least
    (dt, A and their cumulative sums must not be lower)."""
    run = resolve_backend(backend)
    if not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"ssd: chunk_size must be a positive int, got {chunk_size!r}")
    if isinstance(D, (int, np.integer)) and not isinstance(D, bool):
        raise TypeError(f"ssd: D = {int(D)} is an int, not a tensor of shape (h,): ssd's argument order differs from "
                        f"mamba_ssm's mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, ...); it is "
                        f"ssd(x, dt, A, B, C, D=None, initial_state=None, chunk_size=256, backend='auto'): pass "
                        f"chunk_size={int(D)} by name")
    x, dt, A, B, C = (_tensor(name, v) for name, v in zip("x dt A B C".split(), (x, dt, A, B, C)))
    D = None if D is None else _tensor("D", D)
    initial_state = None if initial_state is None else _tensor("initial_state", initial_state)

    if x.ndim != 4:
        raise ValueError(f"ssd: x must have shape (b, l, h, p), got {tuple(x.shape)}")
    b, l, h, p = x.shape
    if l < 1:
        raise ValueError(f"ssd: x has sequence length 0 (shape {tuple(x.shape)}); need at least one step")
    _check_shape("dt", dt, (b, l, h), "(b, l, h) from x")
    if A.shape == (b, l, h):  # ssd_minimal_discrete's A, the per-step log decay: here dt and A come apart
        raise ValueError(f"ssd: A must have shape (h,) = {(h,)}, one per head, got {tuple(A.shape)}, the shape of "
                         f"ssd_minimal_discrete's A (the per-step log decay dt * A): pass dt (b, l, h) and A (h,) "
                         f"apart; ssd multiplies them")
    _check_shape("A", A, (h,), "(h,) from x")
    if B.ndim != 4 or B.shape[:2] != (b, l):
        raise ValueError(f"ssd: B must have shape (b, l, g, n) with (b, l) = {(b, l)} from x, got {tuple(B.shape)}")
    g, n = B.shape[2], B.shape[3]
    if g < 1:
        raise ValueError(f"ssd: the number of groups g (B's axis 2, B {tuple(B.shape)}) must be at least 1, got 0")
    if h % g:
        raise ValueError(f"ssd: the number of heads h = {h} (x {tuple(x.shape)}) must be divisible by the number "
                         f"of groups g = {g} (B {tuple(B.shape)})")
    _check_shape("C", C, (b, l, g, n), "(b, l, g, n) like B")
    if D is not None:
        _check_shape("D", D, (h,), "(h,) from x")
    if initial_state is not None:
        _check_shape("initial_state", initial_state, (b, h, p, n), "(b, h, p, n) from x and B")

    inputs = [t for t in (x, dt, A, B, C, D, initial_state) if t is not None]
    dtype = np.result_type(np.float32, *[t.dtype for t in inputs])
    if backend == "auto":  # the fastest that takes these sizes (on a GPU, float64 at d_state 192 was refused by cuda)
        run = next(BACKENDS[name] for name in available_backends()
                   if BACKENDS[name].refuses is None or BACKENDS[name].refuses(b, h, p, n, dtype) is None)
    x, dt, A, B, C = (t.astype(dtype) for t in (x, dt, A, B, C))
    D = None if D is None else D.astype(dtype)
    initial_state = None if initial_state is None else initial_state.astype(dtype)
    if run.ops is not None:
        return run.ops(x, dt, A, B, C, D, initial_state, int(chunk_size))
    if run.inference is not None and not (is_grad_enabled() and any(t.requires_grad for t in inputs)):
        y, final_state = run.inference(*(None if t is None else t.data for t in (x, dt, A, B, C, D, initial_state)),
                                       int(chunk_size))
        return Tensor(y), Tensor(final_state)                          # (b, l, h, p), (b, h, p, n)
    return SSD.apply(x, dt, A, B, C, D, initial_state, kernel=run, chunk_size=int(chunk_size))


__all__ = ["ssd", "ssd_chunked", "ssd_scan", "Backend", "BACKENDS", "SSD", "available_backends", "register_backend",
           "resolve_backend"]
