"""Bugs in the scan's backends (tinygrad_ssm/scan/) and the training step's fast paths (tinygrad_ssm/fast/): each
should fail a test of tests/scan/ or tests/fast/. The numba kernels' bugs pay the compilation of what their tests
use (the harness deletes the package's numba caches around each), so their tests are narrowed to the backend's
or the kernel's own tests. The CUDA bugs run tests/scan/test_ssd_cuda.py, which reruns itself on numba-cuda's
simulator in a subprocess: about two minutes where one plain test fails, but eight where the bug fails the
hypothesis tests too (their shrinking runs on the simulator), so only the Python-side check is here. Last full run: 49 of 49
caught, about 17 minutes on the shared 2-core machine; 50-56 (fast paths falling back to their twins unseen,
the fused ops' gradient checks) 7 of 7 on 2026-12-07."""
# ruff: noqa: E501 (each bug quotes lines of code whole, so that it names one place)
from inject_bugs import Bug

SSD = ("tests/scan/test_ssd.py",)
NUMBA_SCAN = ("tests/scan/test_ssd_kernels.py", "-k", "numba")
NUMBA_CAUSAL = ("tests/scan/test_causality.py", "-k", "numba")
CUDA = ("tests/scan/test_ssd_cuda.py",)
FUSED = ("tests/fast/test_fused.py",)
NORMS = ("tests/fast/test_fused_norms.py",)

REF = "tinygrad_ssm/scan/reference.py"
SEQ = "tinygrad_ssm/scan/sequential.py"
API = "tinygrad_ssm/scan/__init__.py"
FWD = "tinygrad_ssm/scan/numba_cpu.py"
BWD = "tinygrad_ssm/scan/numba_chunked.py"
GPU = "tinygrad_ssm/scan/cuda.py"

BUGS = [
    # --- the engine-op forms and ssd's checks ---------------------------------------------------------------
    Bug(REF, "below = F.where(np.tri(T, T, -1, dtype=bool), rows, 0.0)",
        "below = F.where(np.tri(T, T, 0, dtype=bool), rows, 0.0)",
        SSD, "segsum includes the diagonal: every decay inside a chunk one step too many"),
    Bug(REF, "state_decay_out = F.exp(a_cumsum)", "state_decay_out = F.exp(a_cumsum - a)",
        SSD, "the entering state's decay to step l misses step l's own decay (an exclusive cumsum)"),
    Bug(REF, "state = state * chunk_decay[:, :, :, z] + states[:, z]",
        "state = state * chunk_decay[:, :, :, 0] + states[:, z]",
        SSD, "every chunk boundary decays the state by the first chunk's total decay"),
    Bug(SEQ, "X = F.reshape(x_t * F.unsqueeze(dt_t, -1), (b, g, r, p, 1))", "X = F.reshape(x_t, (b, g, r, p, 1))",
        SSD, "the sequential step's input not discretised: x_t B_t^T instead of dt_t x_t B_t^T"),
    Bug(API, '    _check_shape("C", C, (b, l, g, n), "(b, l, g, n) like B")\n', "",
        SSD, "ssd no longer checks C's shape"),
    Bug(API, "or isinstance(chunk_size, bool) or chunk_size < 1:", "or isinstance(chunk_size, bool) or chunk_size < 0:",
        SSD, "ssd accepts chunk_size = 0"),
    Bug(API, "dtype = np.result_type(np.float32, *[t.dtype for t in inputs])",
        "dtype = np.result_type(*[t.dtype for t in inputs])",
        SSD, "float16 inputs are scanned in float16 (the float32 floor dropped)"),

    # --- numba_cpu.py: the chunked forward ----------------------------------------------------------------
    Bug(FWD, "        tail[i] = acc\n        acc += a[i]", "        acc += a[i]\n        tail[i] = acc",
        NUMBA_SCAN, "tail_t includes step t's own decay (off by one step, forward and backward)"),
    Bug(FWD, "decays[u + 1] = step                                        # L[u + 1, u]",
        "decays[u + 1] = 1.0                                         # L[u + 1, u]",
        NUMBA_SCAN, "L's first subdiagonal misses its decay exp(a_{u+1})"),
    Bug(FWD, "e_in, out = np.exp(s_incl[t]), y[bi, start + t, hi]",
        "e_in, out = np.exp(s_incl[t] - a[t]), y[bi, start + t, hi]",
        NUMBA_SCAN, "the entering state reaches y_t without step t's decay"),
    Bug(FWD, "S[i, jj] = e_total * S[i, jj] + S_piece[i, jj]", "S[i, jj] = e_total * (S[i, jj] + S_piece[i, jj])",
        NUMBA_SCAN, "a piece's own inputs are decayed once more by the piece's total"),
    Bug(FWD, "kept, state = checkpoints[bi, h_lo + j, k], states[j]",
        "kept, state = checkpoints[bi, h_lo + j, k - 1], states[j]",
        NUMBA_SCAN, "the checkpoint of chunk k is stored in slot k - 1"),
    Bug(FWD, "states[j] = S0[bi, h_lo + j]", "states[j] = S0[bi, h_lo]",
        NUMBA_SCAN, "every head of a block starts from the block's first head's initial state"),
    Bug(FWD, "+ D[hi] * Xq[t, i]", "+ D[hi] * Xd[t, i]",
        NUMBA_SCAN, "the D skip multiplies dt x instead of x"),
    Bug(FWD, "    return abs(v) < np.inf", "    return np.isfinite(v)",
        NUMBA_CAUSAL, "the finiteness check as np.isfinite, which fastmath's reassoc folds to True"),
    Bug(FWD, "                    if _finite(Xd_sum):", "                    if True:",
        NUMBA_CAUSAL, "the forward always multiplies the whole (m, m) product: 0 x NaN reaches earlier outputs"),

    # --- numba_chunked.py: the chunked backward -----------------------------------------------------------
    Bug(BWD, "ddt[bi, t0 + t, hi] += A[hi] * da_t", "ddt[bi, t0 + t, hi] = A[hi] * da_t",
        NUMBA_SCAN, "ddt's A da term overwrites the x . dX term instead of adding to it"),
    Bug(BWD, "dD_parts[bi, hi] += x_dot_dy_sum", "dD_parts[bi, hi] = x_dot_dy_sum",
        NUMBA_SCAN, "dD keeps only the first chunk's sum (= for +=)"),
    Bug(BWD, "dA_parts[bi, hi] += dA_sum", "dA_parts[bi, hi] = dA_sum",
        NUMBA_SCAN, "dA keeps only the first chunk's sum (= for +=)"),
    Bug(BWD, "dS_i[jj] = e_total * dS_i[jj] + local_i[jj]", "dS_i[jj] = dS_i[jj] + local_i[jj]",
        NUMBA_SCAN, "the state's gradient is not decayed across a chunk"),
    Bug(BWD, "(from_state[s] if t == m - 1 else dtype.type(0))", "(from_state[s] if t == m else dtype.type(0))",
        NUMBA_SCAN, "the chunk-end state's term of the segment gradient dropped"),
    Bug(BWD, "out[i] = dX * d + D[hi] * dyq[t, i]", "out[i] = dX * d",
        NUMBA_SCAN, "dx loses the D skip's gradient"),
    Bug(BWD, "                    for s in range(t + 1):\n                        Wsum_t[s] += L_t[s] * G_t[s]",
        "                    for s in range(t):\n                        Wsum_t[s] += L_t[s] * G_t[s]",
        NUMBA_SCAN, "W's diagonal dropped (dB_t and dC_t lose C_t . B_t's own-step term)"),
    Bug(BWD, "dC_t[jj] += E_t[jj]", "dC_t[jj] = E_t[jj]",
        NUMBA_SCAN, "dC keeps the last head's entering-state term only (= for +=)"),
    Bug(BWD, "                if _finite(dy_sum):", "                if True:",
        NUMBA_CAUSAL, "the backward always multiplies M^T dy whole: a NaN dy reaches earlier inputs' gradients"),
    Bug(BWD, "            for t in range(s, m):\n                acc += M[t, s] * V[t, i]",
        "            for t in range(s + 1, m):\n                acc += M[t, s] * V[t, i]",
        NUMBA_CAUSAL, "the masked M^T product of the non-finite path skips the diagonal"),

    # --- cuda.py on the simulator ------------------------------------------------------------------------
    Bug(GPU, "if p > MAX_STATE or n > MAX_STATE:", "if p > MAX_STATE:",
        CUDA, "a state size n over MAX_STATE is no longer refused"),

    # --- fast/fused.py and its kernels -------------------------------------------------------------------
    Bug("tinygrad_ssm/fast/fused.py", "d = grad * slope * inside", "d = grad * slope",
        FUSED, "dt_softplus passes the gradient through an active clip"),
    Bug("tinygrad_ssm/fast/fused.py", "if dt.ndim == 0 or bias.shape != dt.shape[-1:]:", "if dt.ndim == 0:",
        ("tests/fast/test_fused_arguments.py",), "dt_softplus no longer checks the bias's shape"),
    Bug("tinygrad_ssm/fast/fused.py", "return grad_x, dw.sum(axis=0)[kp - k:].T, grad_bias",
        "return grad_x, dw.sum(axis=0)[:k].T, grad_bias",
        FUSED, "the conv's weight gradient takes the padding rows for k not a multiple of 4"),
    Bug("tinygrad_ssm/fast/fused.py", "consts = np.array([0.0, 1.0 / group, 1.0, eps], dtype)",
        "consts = np.array([0.0, 1.0 / d, 1.0, eps], dtype)",
        NORMS, "the gated norm's mean over the whole row instead of its group"),
    Bug("tinygrad_ssm/fast/conv_kernels.py", "if k == 4 and 3 <= t < l - 3:", "if k == 4 and 3 <= t < l - 2:",
        FUSED, "the width-4 backward loop runs one step too far and reads d past the sequence's end"),
    Bug("tinygrad_ssm/fast/conv_kernels.py", "for t in range(t0, min(t1 + kp - 1, l)):",
        "for t in range(t0, min(t1 + kp - 2, l)):",
        FUSED, "the backward recomputes d one step short past a block's end"),
    Bug("tinygrad_ssm/fast/conv_kernels.py", "return (_row(x, r + o, col, c, t + o >= 0 and q >= kp - k, zero),",
        "return (_row(x, r + o, col, c, t + o > 0 and q >= kp - k, zero),",
        FUSED, "the generic conv drops the sequence's first row from the first tap"),
    Bug("tinygrad_ssm/fast/conv_kernels.py", "        if k == 4 and t >= 3:\n            x0, x1, x2, x3 = x[r - 3, col:col + c]"
        ", x[r - 2, col:col + c], x[r - 1, col:col + c], x[r, col:col + c]\n            for ch in range(c):\n"
        "                o[ch]",
        "        if k == 4 and t >= 2:\n            x0, x1, x2, x3 = x[r - 3, col:col + c]"
        ", x[r - 2, col:col + c], x[r - 1, col:col + c], x[r, col:col + c]\n            for ch in range(c):\n"
        "                o[ch]",
        FUSED, "the width-4 forward loop starts at step 2 and reads the row before the sequence"),
    Bug("tinygrad_ssm/fast/norm_kernels.py", "            rs = one / math.sqrt(acc * inv_group + eps)",
        "            rs = one / (math.sqrt(acc * inv_group) + eps)",
        NORMS, "the gated norm's eps added outside the square root"),
    Bug("tinygrad_ssm/fast/norm_kernels.py", "    m = _weighted_dot(g, x, rs, w, zero) * inv_d * rs\n", "    m = _weighted_dot(g, x, rs, w, zero) * inv_d\n",
        NORMS, "the plain RMSNorm backward's mean term misses a factor rs"),
    Bug("tinygrad_ssm/fast/norm_kernels.py", "dzg[ch] = du * yg[ch] * sc * (one + a * (one - sc))",
        "dzg[ch] = du * yg[ch] * sc",
        NORMS, "the gate's gradient uses sigmoid(z) for silu'(z)"),
    Bug("tinygrad_ssm/fast/norm_kernels.py", "                dxr[ch] += gt[ch]", "                dxr[ch] = gt[ch]",
        NORMS, "add_rms_norm's backward overwrites the norm's gradient with the residual's (= for +=)"),

    # --- fast/fast_exp.py ----------------------------------------------------------------------------------
    Bug("tinygrad_ssm/fast/fast_exp.py", "    p = p * r + _F(_INV_FACTORIALS[6])\n", "",
        NORMS, "exp32's Taylor series loses its r^6 term"),
    Bug("tinygrad_ssm/fast/fast_exp.py", "r = (xc - n * _LN2_HI) - n * _LN2_LO", "r = xc - n * _LN2_HI",
        NORMS, "exp's argument reduction drops ln 2's low part"),

    # --- fast/adam_kernel.py, row_kernels.py, row_ops.py, products.py -----------------------------------------
    Bug("tinygrad_ssm/fast/adam_kernel.py", "(mi / (np.sqrt(vi) / bias2_sqrt + eps))",
        "(mi / ((np.sqrt(vi) + eps) / bias2_sqrt))",
        ("tests/fast/test_adam_kernel.py",), "Adam's eps added before the bias correction"),
    Bug("tinygrad_ssm/fast/adam_kernel.py", "f(math.sqrt(1 - beta2 ** t))", "f(1 - beta2 ** t)",
        ("tests/fast/test_adam_kernel.py",), "Adam's second-moment bias correction without its square root"),
    Bug("tinygrad_ssm/fast/adam_kernel.py", "and p.flags.c_contiguous and m.flags.c_contiguous and",
        "and p.flags.c_contiguous and",
        ("tests/fast/test_adam_kernel.py",), "the kernel takes a non-contiguous m (its update lands in a copy)"),
    Bug("tinygrad_ssm/fast/row_kernels.py", "losses[r] = log_s[r] - (row[t] - m) if keep[r] else zero",
        "losses[r] = log_s[r] - row[t] if keep[r] else zero",
        ("tests/fast/test_row_kernels.py",), "cross entropy's loss forgets the row max's shift"),
    Bug("tinygrad_ssm/fast/row_kernels.py", "            o[j] += r[j]", "            o[j] = r[j]",
        ("tests/fast/test_row_kernels.py",), "the embedding gradient keeps one row per repeated id (= for +=)"),
    Bug("tinygrad_ssm/fast/row_ops.py", "and targets.min() >= 0 and targets.max() < logits.shape[1]):",
        "and targets.min() >= 0):",
        ("tests/fast/test_row_kernels.py",), "a target past the classes reaches the kernel unchecked"),
    Bug("tinygrad_ssm/fast/row_ops.py", "            d_logits *= keep[:, None]\n", "",
        ("tests/fast/test_row_kernels.py",), "a retained graph's second backward gives ignored rows a gradient"),
    Bug("tinygrad_ssm/fast/products.py", "lo, hi = bounds[blk], bounds[blk + 1]", "lo, hi = bounds[blk], bounds[blk + 1] - 1",
        ("tests/fast/test_products.py",), "each block of a split product leaves its last row or column unwritten"),
    # --- fast paths that silently fall back to their twins (found by the test audit, 2026-12-07) ------------------
    Bug("tinygrad_ssm/fast/fused.py", "    return all(t is None or t.dtype in KERNEL_DTYPES for t in tensors)", "    return False",
        FUSED, "every fused op runs its engine-op twin: the equality tests compared the twin with itself"),
    Bug("tinygrad_ssm/fast/fused.py", "    if not _kernels_take(x, m, weight) or np.result_type(total, weight.dtype) != total:",
        "    if not _kernels_take(x, m, weight) or np.result_type(total, weight.dtype) != weight.dtype:",
        ("tests/fast/test_fused_dtypes.py",), "add_rms_norm falls back to its twin for a float32 weight on float64 rows"),
    Bug("tinygrad_ssm/optim/adam.py", "        if self.fused and adam_kernel.takes(p, m, v, grad):",
        "        if False and self.fused and adam_kernel.takes(p, m, v, grad):",
        ("tests/fast/test_adam_kernel.py",), "Adam never runs its numba kernel (the bit-for-bit test compared NumPy with itself)"),
    Bug("tinygrad_ssm/fast/products.py", "        if not self.takes:\n            return super().backward(grad)", "        if True:\n            return super().backward(grad)",
        ("tests/fast/test_products.py",), "RowSplitMatmul's gradients are NumPy's products, on one thread"),
    Bug("tinygrad_ssm/fast/products.py", "    return a.ndim == b.ndim == 2 and a.dtype == b.dtype and a.dtype in FLOATS", "    return False",
        ("tests/fast/test_products.py",), "RowSplitMatmul never splits: always NumPy's matmul"),
    Bug("tinygrad_ssm/fast/fused.py", "        linear = v > 20.0", "        linear = v > 5.0",
        ("tests/fast/test_fused.py", "-k", "dt_softplus"), "dt_softplus is the identity from 5, not 20 (the tests drew no v in (5, 20))"),
    Bug("tinygrad_ssm/fast/fused.py", "        return conv(F.cat([history, x], axis=1))[:, k - 1:]", "        return conv(F.cat([history.detach(), x], axis=1))[:, k - 1:]",
        ("tests/fast/test_fused_gradcheck.py",), "a conv continued from a cache gives its history no gradient"),
    Bug("tinygrad_ssm/fast/fused.py", "            return np.concatenate(grads, axis=-1)", "            return np.concatenate(grads[::-1], axis=-1)",
        ("tests/fast/test_fused_gradcheck.py",), "split_last's gradient puts the pieces' gradients in reverse order"),
    # --- kernel 7's fast sum where it cancelled (the numerics audit, 2026-12-07) --------------------------------
    Bug("tinygrad_ssm/scan/cuda_decay.py", "        if EXACT_EVERYWHERE or not abs(run) < INF or not CANCELLED * rounding <= size:",
        "        if EXACT_EVERYWHERE or not abs(run) < INF:", CUDA,
        "the cuda backward keeps the fast sum where strong decay cancelled it: dA wrong in sign in float32"),
    # --- the audits of the optimizers and of the layers against torch (2026-12-07, a later session) -------------
    Bug("tinygrad_ssm/fast/adam_kernel.py", "        if weight < 0.5:                                                 # exp_avg",
        "        if True:                                                 # exp_avg", ("tests/optim/test_step_edges.py", "-k", "beta1"),
        "the fused Adam's first moment as start + w (end - start) always: beta1 = 0 loses a small gradient"),
    Bug("tinygrad_ssm/fast/row_blocks.py", " and start + n * width <= flat.size and col + c <= width:", " and start + n * width <= flat.size:",
        FUSED, "a view whose rows run past its base's rows is read in place: the fused gated norm off by 2.5, no error"),
    Bug("tinygrad_ssm/fast/row_ops.py", "        if self.kernel_grad is None:\n            super()._check_versions()",
        "        if True:\n            super()._check_versions()", ("tests/fast/test_row_kernels.py",),
        "logits changed in place after the fused loss: backward raises where torch gives the gradient"),
    Bug("tinygrad_ssm/scan/numba_chunked.py", "    return out.gradients(B.shape, bool(had_D), bool(had_initial))",
        "    return out.gradients(B.shape, D.size > 0, bool(had_initial))", ("tests/scan/test_ssd_kernels.py", "-k", "no_heads"),
        "with no heads numba_chunked's D.grad is None (D given, empty)"),
    Bug("tinygrad_ssm/scan/__init__.py", "        _check_numeric(\"ssd\", name, value, array)", "        pass",
        ("tests/scan/test_ssd.py", "-k", "bad_arguments"), "a complex input to ssd is refused without naming the argument"),
    # --- 2026-12-07, night: an audit of dtypes across the stack --------------------------------------------------------
    Bug("tinygrad_ssm/fast/fused.py", "    if not _kernels_take(y, z, weight) or len({t.dtype for t in (y, z, weight) if t is not None}) > 1:",
        "    if not _kernels_take(y, z, weight):", ("tests/fast/test_fused_dtypes.py", "-k", "norm"),
        "the fused norm of a float32 y with a float64 weight differs from its twin by 8e-8"),
    Bug("tinygrad_ssm/fast/quantized_kernels.py", "        _rows(Q, S, lo, hi, u, bias, zero, out, Q.shape[1] // NARROW, block // NARROW, True)",
        "        _rows(Q, S, lo, hi, u, bias, zero, out, Q.shape[1] // NARROW, block // VECTOR + 1, True)",
        ("tests/fast/test_quantized_kernels.py",), "int8 blocks of 24 read their scales at the wrong stride"),
    Bug("tinygrad_ssm/scan/__init__.py", "if BACKENDS[name].refuses is None or BACKENDS[name].refuses(b, h, p, n, dtype) is None)",
        "if True)", ("tests/scan/test_ssd.py", "-k", "auto_takes or bad_arguments"), "on a GPU, auto takes cuda for float64 at d_state 192 and the forward fails"),
    Bug("tinygrad_ssm/scan/cuda.py", "    except ValueError as e:\n        return str(e)\n    return None", "    except ValueError as e:\n        return None\n    return None",
        ("tests/scan/test_ssd.py", "-k", "auto_takes or bad_arguments"), "cuda says it takes sizes its shared memory cannot hold"),
    Bug("tinygrad_ssm/scan/__init__.py", "    if A.shape == (b, l, h):  # ssd_minimal_discrete's A", "    if False:  # ssd_minimal_discrete's A",
        ("tests/scan/test_ssd.py", "-k", "auto_takes or bad_arguments"), "ssd_minimal_discrete's A (b, l, h) refused as a bare shape, without the fix"),
    Bug("tinygrad_ssm/fast/norm_kernels.py", "        for ch in range(d):\n            tr[ch] = xr[ch] + mr[ch]\n        rs = one / math.sqrt(_sum_of_squares(tr, zero) * inv_d + eps)",
        "        acc = zero\n        for ch in range(d):\n            tr[ch] = xr[ch] + mr[ch]\n            acc += tr[ch] * tr[ch]\n        rs = one / math.sqrt(acc * inv_d + eps)",
        ("tests/fast/test_kernel_determinism.py",), "the fused add + norm sums in its storing loop: other bits where the allocator puts total after x"),
    Bug("tinygrad_ssm/fast/norm_kernels.py", "    for ch in range(u.shape[0]):\n        u[ch] = y[ch] * z[ch] * sigmoid(z[ch])\n    return _sum_of_squares(u, zero)",
        "    acc = zero\n    for ch in range(u.shape[0]):\n        u[ch] = y[ch] * z[ch] * sigmoid(z[ch])\n        acc += u[ch] * u[ch]\n    return acc",
        ("tests/fast/test_kernel_determinism.py",), "the gated norm sums in its storing loop: other bits where the allocator puts out after z"),
    Bug("tinygrad_ssm/fast/row_kernels.py", "    for j in range(row.size):\n        out[j] = _exp(row[j] - m)\n    s = zero\n    for j in range(out.size):\n        s += out[j]\n",
        "    s = zero\n    for j in range(row.size):\n        out[j] = _exp(row[j] - m)\n        s += out[j]\n",
        ("tests/fast/test_kernel_determinism.py",), "cross entropy sums its exps in the storing loop: the loss in other bits as the gradient's row lies"),
]
