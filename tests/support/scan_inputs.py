"""Inputs of the scan drawn at random, and the scan's recurrence in plain NumPy (independent of the engine): what
every test of the scan's backends compares against."""
import numpy as np


def numpy_scan(x, dt, A, B, C, D=None, initial_state=None):
    """The recurrence of docs/mamba2.md (section 1), one step at a time, independent of the engine."""
    b, l, h, p = x.shape
    g, n = B.shape[2:]
    group = np.arange(h) // (h // g)                                 # head i reads group i // (h / g)
    S = np.zeros((b, h, p, n)) if initial_state is None else initial_state.copy()
    y = np.zeros_like(x)
    for t in range(l):
        Bt, Ct = B[:, t][:, group], C[:, t][:, group]                # (b, h, n)
        S = np.exp(dt[:, t] * A)[..., None, None] * S + (dt[:, t, :, None] * x[:, t])[..., None] * Bt[:, :, None, :]
        y[:, t] = np.einsum("bhpn,bhn->bhp", S, Ct)
    if D is not None:
        y = y + x * D[:, None]
    return y, S


def make_inputs(rng, b=2, l=11, h=4, p=3, g=2, n=5, initial_state=True, dtype=np.float64):
    inputs = dict(
        x=rng.standard_normal((b, l, h, p)),
        dt=rng.uniform(0.05, 1.0, (b, l, h)),                        # already softplus'd: positive
        A=-rng.uniform(0.5, 2.0, h),
        B=rng.standard_normal((b, l, g, n)),
        C=rng.standard_normal((b, l, g, n)),
        D=rng.standard_normal(h),
        initial_state=rng.standard_normal((b, h, p, n)) if initial_state else None,
    )
    return {k: (v.astype(dtype) if v is not None else None) for k, v in inputs.items()}
