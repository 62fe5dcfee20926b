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


def numpy_scan_gradients(x, dt, A, B, C, D=None, initial_state=None, dy=None, d_final_state=None):
    """The gradients of the recurrence (`numpy_scan`) by hand, backwards one step at a time, independent of the
    engine: a dict like the inputs (None where an input is None). It multiplies only what the recurrence itself
    multiplies, so a non-finite value reaches exactly the gradients that depend on it (as torch's autograd of
    the recurrence): what every backend's gradients are held to when an input is not finite."""
    b, l, h, p = x.shape
    g, n = B.shape[2:]
    group = np.arange(h) // (h // g)
    S = [np.zeros((b, h, p, n)) if initial_state is None else initial_state.copy()]     # S_0 .. S_l
    for t in range(l):
        S.append(np.exp(dt[:, t] * A)[..., None, None] * S[-1]
                 + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t][:, group][:, :, None, :])
    dy = np.ones_like(x) if dy is None else dy
    dS = np.zeros((b, h, p, n)) if d_final_state is None else d_final_state.copy()      # dL/dS_t, t from l down
    dx, ddt, dA = np.zeros_like(x), np.zeros_like(dt), np.zeros_like(A)
    dB_heads, dC_heads = np.zeros((b, l, h, n)), np.zeros((b, l, h, n))
    for t in range(l - 1, -1, -1):
        Bt, Ct = B[:, t][:, group], C[:, t][:, group]                                    # (b, h, n)
        dS = dS + dy[:, t, :, :, None] * Ct[:, :, None, :]                              # y_t = S_t C_t
        dC_heads[:, t] = np.einsum("bhpn,bhp->bhn", S[t + 1], dy[:, t])
        decay = np.exp(dt[:, t] * A)                                                    # (b, h)
        dX = np.einsum("bhpn,bhn->bhp", dS, Bt)                                         # d(dt_t x_t)
        dB_heads[:, t] = np.einsum("bhpn,bhp->bhn", dS, dt[:, t, :, None] * x[:, t])
        da = np.einsum("bhpn,bhpn->bh", dS, S[t]) * decay                               # d(dt_t A)
        dx[:, t] = dX * dt[:, t, :, None]
        ddt[:, t] = np.einsum("bhp,bhp->bh", dX, x[:, t]) + da * A
        dA += np.einsum("bh,bh->h", da, dt[:, t])
        dS = dS * decay[..., None, None]
    sum_group = lambda v: v.reshape(b, l, g, h // g, n).sum(3)                         # noqa: E731
    return dict(x=dx if D is None else dx + dy * D[:, None], dt=ddt, A=dA, B=sum_group(dB_heads),
                C=sum_group(dC_heads), D=None if D is None else np.einsum("blhp,blhp->h", x, dy),
                initial_state=None if initial_state is None else dS)
