"""A kernel backend in plain NumPy, for testing the kernel interface (`Backend.forward/backward` wrapped by
the `SSD` op): the recurrence one step at a time, vectorised over batch and heads, with its backward written
by hand. It keeps every state (l * h * p * n floats), which a real kernel must not: small shapes only.

Per batch and head (group gi of head i), with a_t = exp(dt_t A):
    S_t = a_t S_{t-1} + dt_t x_t B_t^T          y_t = S_t C_t + D x_t
Backward, G_t = dL/dS_t, from G_l = d final_state, for t = l .. 1:
    G_t += dy_t C_t^T;  dC_t = S_t^T dy_t;  dx_t = dt_t G_t B_t + D dy_t;  dB_t = dt_t G_t^T x_t;
    ddt_t = x_t . (G_t B_t) + A a_t <G_t, S_{t-1}>;  dA += dt_t a_t <G_t, S_{t-1}>;  G_{t-1} = a_t G_t
and d initial_state = G_0, dD = sum_t <dy_t, x_t>. B and C gradients are summed over the heads of a group.
"""
import numpy as np


def forward(x, dt, A, B, C, D, initial_state, chunk_size):
    b, l, h, p = x.shape
    g, n = B.shape[2:]
    group = np.arange(h) // (h // g)
    S = np.zeros((b, h, p, n), x.dtype) if initial_state is None else initial_state.copy()
    states = np.empty((l + 1, b, h, p, n), x.dtype)                     # (l + 1, b, h, p, n) S_0 .. S_l
    states[0] = S
    y = np.empty_like(x)
    for t in range(l):
        decay = np.exp(dt[:, t] * A)[..., None, None]                   # (b, h, 1, 1)
        S = decay * S + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t][:, group][:, :, None, :]
        states[t + 1] = S
        y[:, t] = np.einsum("bhpn,bhn->bhp", S, C[:, t][:, group])
    if D is not None:
        y = y + x * D[:, None]
    return y, S.copy(), (x, dt, A, B, C, D if D is not None else np.zeros(0), states,
                         np.array(initial_state is not None))


def backward(saved, dy, d_final):
    x, dt, A, B, C, D, states, had_initial = saved
    b, l, h, p = x.shape
    g, n = B.shape[2:]
    group = np.arange(h) // (h // g)
    dx, ddt, dA = np.zeros_like(x), np.zeros_like(dt), np.zeros_like(A)
    dB, dC = np.zeros_like(B), np.zeros_like(C)
    G = d_final.copy()                                                  # (b, h, p, n)
    for t in reversed(range(l)):
        Bt, Ct = B[:, t][:, group], C[:, t][:, group]                   # (b, h, n)
        G += dy[:, t][..., None] * Ct[:, :, None, :]
        np.add.at(dC[:, t], (slice(None), group), np.einsum("bhpn,bhp->bhn", states[t + 1], dy[:, t]))
        GB = np.einsum("bhpn,bhn->bhp", G, Bt)                           # (b, h, p)
        dx[:, t] = dt[:, t, :, None] * GB
        np.add.at(dB[:, t], (slice(None), group), dt[:, t, :, None] * np.einsum("bhpn,bhp->bhn", G, x[:, t]))
        decay = np.exp(dt[:, t] * A)                                     # (b, h)
        G_dot_S = np.einsum("bhpn,bhpn->bh", G, states[t])               # (b, h)
        ddt[:, t] = np.einsum("bhp,bhp->bh", x[:, t], GB) + A * decay * G_dot_S
        dA += (dt[:, t] * decay * G_dot_S).sum(axis=0)
        G = decay[..., None, None] * G
    dD = None
    if D.size:
        dx += dy * D[:, None]
        dD = np.einsum("blhp,blhp->h", dy, x)
    return dx, ddt, dA, dB, dC, dD, (G if had_initial else None)
