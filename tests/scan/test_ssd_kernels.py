"""Every kernel backend of the registry (the scan on plain arrays, wrapped by the one SSD op) against the
engine-op reference: forward and every gradient in float64 to 1e-10 on hypothesis-drawn shapes, float32 within
a tolerance derived below, float64 gradcheck, extreme values, a long sequence, what the forward keeps for the
backward, the forward without a backward to come (`inference`); and the numba kernels' own machinery (work items on every thread, inputs read in place, gradients
written into given arrays, the on-disk cache)."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_ssm as tg
from tests.support.gradcheck import gradcheck
from tests.support.scan_inputs import make_inputs, numpy_scan
from tinygrad_ssm.scan import BACKENDS, ssd

KERNELS = [pytest.param(name, marks=pytest.mark.skipif(not record.available(), reason=f"{name} is not available here"))
           for name, record in BACKENDS.items() if record.forward is not None]
NAMES = ["x", "dt", "A", "B", "C", "D", "initial_state"]


def run(backend, inputs, chunk_size, weights):
    """Forward (y, final_state) and the gradients of <w_y, y> + <w_state, final_state> for every given input."""
    tensors = {k: tg.Tensor(v.copy(), requires_grad=True) for k, v in inputs.items() if v is not None}
    y, state = ssd(**tensors, chunk_size=chunk_size, backend=backend)
    ((y * weights[0]).sum() + (state * weights[1]).sum()).backward()
    return y.data, state.data, {k: t.grad.data for k, t in tensors.items()}


def differences(inputs, chunk_size, backend, dtype=np.float64, seed=0):
    """max |kernel - reference (float64)| of y, final_state and each gradient, and the reference's values."""
    rng = np.random.default_rng(seed)
    b, l, h, p = inputs["x"].shape
    weights = rng.standard_normal((b, l, h, p)), rng.standard_normal((b, h, p, inputs["B"].shape[3]))
    ref = run("reference", inputs, chunk_size, weights)
    low = {k: None if v is None else v.astype(dtype) for k, v in inputs.items()}
    got = run(backend, low, chunk_size, weights)
    assert got[0].dtype == dtype and all(g.dtype == dtype for g in got[2].values())
    pairs = {"y": (got[0], ref[0]), "final_state": (got[1], ref[1]), **{k: (got[2][k], ref[2][k]) for k in ref[2]}}
    return {k: (np.abs(a - r).max(), np.abs(r).max()) for k, (a, r) in pairs.items()}


@pytest.mark.parametrize("backend", KERNELS)
@given(b=st.integers(1, 2), q=st.integers(1, 9), chunks=st.integers(0, 3), extra=st.integers(0, 8), g=st.integers(1, 2),
       r=st.integers(1, 3), p=st.integers(1, 4), n=st.integers(1, 5), with_state=st.booleans(), with_D=st.booleans(),
       seed=st.integers(0, 2**16))
def test_forward_and_gradients_equal_the_reference_float64(backend, b, q, chunks, extra, g, r, p, n, with_state,
                                                           with_D, seed):
    """l = chunks q + extra crosses chunk boundaries (and is not a multiple of q when extra > 0)."""
    l = max(1, chunks * q + extra)
    inputs = make_inputs(np.random.default_rng(seed), b=b, l=l, h=g * r, p=p, g=g, n=n, initial_state=with_state)
    if not with_D:
        inputs["D"] = None
    for name, (diff, _) in differences(inputs, q, backend, seed=seed).items():
        assert diff < 1e-10, (name, diff)


@pytest.mark.parametrize("backend", KERNELS)
def test_no_heads_give_every_input_an_empty_gradient_d_included(backend):
    """x (b, l, 0, p) and D (0,): numba_chunked told a D given from none by D.size, so D.grad was None (the
    reference and the cuda backend: an empty (0,) array, as torch)."""
    rng = np.random.default_rng(0)
    inputs = dict(x=np.zeros((1, 4, 0, 2)), dt=np.zeros((1, 4, 0)), A=np.zeros(0), B=rng.standard_normal((1, 4, 1, 3)),
                  C=rng.standard_normal((1, 4, 1, 3)), D=np.zeros(0), initial_state=np.zeros((1, 0, 2, 3)))
    _, _, grads = run(backend, inputs, 2, (1.0, 1.0))
    assert set(grads) == set(NAMES) and grads["D"].shape == (0,)
    np.testing.assert_array_equal(grads["B"], 0)


# float32: each entry is a sum of at most l n products per step, accumulated through l decaying steps; a float32
# rounding is eps = 6e-8 relative, so a kernel as accurate as the float32 spec is off by a small multiple of
# eps * sqrt(number of terms) relative to the entries' scale. We allow 4 eps sqrt(l n p) relative to the
# largest entry: 1.2e-5 at l = 41, n = p = 4 (measured: the kernel <= 5e-7 (dA), the float32 reference <= 8e-7).
@pytest.mark.parametrize("backend", KERNELS)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_float32_within_rounding_of_the_float64_reference(backend, with_state):
    inputs = make_inputs(np.random.default_rng(12), b=2, l=41, h=4, p=4, g=2, n=4, initial_state=with_state)
    tolerance = 4 * np.finfo(np.float32).eps * np.sqrt(41 * 4 * 4)
    for name, (diff, scale) in differences(inputs, 8, backend, dtype=np.float32).items():
        assert diff <= tolerance * scale, (name, diff / scale, tolerance)


@pytest.mark.parametrize("backend", KERNELS)
@pytest.mark.parametrize("g", [1, 2])
def test_gradcheck_every_input(backend, g):
    """Central finite differences of the kernel op itself (both outputs, all seven inputs), l = 7 across
    chunks of 3."""
    inputs = make_inputs(np.random.default_rng(13 + g), b=2, l=7, h=2, p=2, g=g, n=3, initial_state=True)

    def both_outputs(*tensors):
        y, state = ssd(**dict(zip(NAMES, tensors)), chunk_size=3, backend=backend)
        return tg.cat([tg.functional.flatten(y), tg.functional.flatten(state)])

    assert gradcheck(both_outputs, *inputs.values())


@pytest.mark.parametrize("backend", KERNELS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk", [8, 32])
def test_extreme_legal_values_stay_finite(backend, dtype, chunk):
    """dt up to 10 and A down to -100: decays of exp(-1000) underflow to 0 (and products of many decays do, in the
    pieces of the CPU forward); nothing may become inf or NaN, and in float64 the result still equals the
    reference."""
    rng = np.random.default_rng(14)
    inputs = make_inputs(rng, b=2, l=29, h=4, p=3, g=2, n=4)
    inputs["dt"] = rng.uniform(0.0, 10.0, inputs["dt"].shape)
    inputs["dt"][:, ::5] = 10.0
    inputs["A"] = np.array([-100.0, -1e-3, -10.0, -100.0])
    diffs = differences(inputs, chunk, backend, dtype=dtype)
    for name, (diff, scale) in diffs.items():
        assert np.isfinite(diff) and np.isfinite(scale), name
        if dtype == np.float64:
            assert diff <= 1e-10 * max(1.0, scale), (name, diff, scale)


@pytest.mark.parametrize("backend", KERNELS)
def test_long_sequence_float32(backend):
    """l = 65,536 at b = h = 1 in float32 (slow decays, so the state carries far): finite, and y and the final
    state within float32 rounding of the float64 recurrence."""
    rng = np.random.default_rng(15)
    l = 65_536
    inputs = make_inputs(rng, b=1, l=l, h=1, p=2, g=1, n=4)
    inputs["dt"] = rng.uniform(0.001, 0.1, (1, l, 1))
    inputs["A"] = np.array([-0.5])
    y64, state64 = numpy_scan(**inputs)
    tensors = {k: tg.Tensor(v.astype(np.float32), requires_grad=True) for k, v in inputs.items()}
    y, state = ssd(**tensors, backend=backend)
    (y.sum() + state.sum()).backward()
    assert np.abs(y.data - y64).max() <= 1e-5 * np.abs(y64).max()
    assert np.abs(state.data - state64).max() <= 1e-5 * np.abs(state64).max()
    for name, t in tensors.items():
        assert np.isfinite(t.grad.data).all(), name


@pytest.mark.parametrize("backend", KERNELS)
def test_saved_for_backward_holds_chunk_states_not_step_states(backend):
    """What the forward keeps for the backward is at most the inputs (or copies of them), one (p, n) state per
    head at each chunk boundary (the CPU kernels keep the c states entering the chunks, the CUDA kernels the c + 1
    boundaries, the final state among them), one number per head and chunk (the CUDA kernels' chunk log decays),
    plus a few bytes: never l states (here 8 times more than the chunk states)."""
    b, l, h, chunk = 2, 64, 4, 8
    inputs = make_inputs(np.random.default_rng(16), b=b, l=l, h=h, p=3, g=2, n=5)
    arrays = [inputs[k] for k in NAMES]
    y, state, saved = BACKENDS[backend].forward(*arrays, chunk)
    distinct = {id(a): a for a in saved}.values()
    saved_bytes = sum(getattr(a, "nbytes", 0) for a in distinct)
    chunks = l // chunk
    boundary_states_bytes = (chunks + 1) * state.nbytes                 # b h p n floats each
    per_chunk_bytes = b * chunks * h * y.itemsize
    allowed = sum(a.nbytes for a in arrays) + boundary_states_bytes + per_chunk_bytes + 64
    assert saved_bytes <= allowed, (saved_bytes, allowed)
    assert allowed - sum(a.nbytes for a in arrays) < l * state.nbytes / 4   # l states would not fit, by far


INFERENCE_KERNELS = [pytest.param(name, marks=pytest.mark.skipif(not record.available(), reason=f"{name} is not "
                                                                                                "available here"))
                     for name, record in BACKENDS.items() if record.inference is not None]


@pytest.mark.parametrize("backend", INFERENCE_KERNELS)
@given(b=st.integers(1, 2), q=st.integers(1, 40), chunks=st.integers(0, 3), extra=st.integers(0, 20),
       g=st.integers(1, 2), r=st.integers(1, 3), p=st.integers(1, 4), n=st.integers(1, 5), with_state=st.booleans(),
       with_D=st.booleans(), seed=st.integers(0, 2**16))
def test_inference_equals_the_reference_and_the_forward_float64(backend, b, q, chunks, extra, g, r, p, n, with_state,
                                                                with_D, seed):
    """A kernel backend's `inference` (what ssd runs when no input needs a gradient): y and final_state equal the
    reference in float64 to 1e-10, and are the same bits as its forward's."""
    l = max(1, chunks * q + extra)
    inputs = make_inputs(np.random.default_rng(seed), b=b, l=l, h=g * r, p=p, g=g, n=n, initial_state=with_state)
    if not with_D:
        inputs["D"] = None
    args = [inputs[k] for k in NAMES]
    y, state = BACKENDS[backend].inference(*args, q)
    y_ref, state_ref = ssd(**{k: tg.Tensor(v) for k, v in inputs.items() if v is not None}, chunk_size=q,
                           backend="reference")
    assert np.abs(y - y_ref.data).max() < 1e-10 and np.abs(state - state_ref.data).max() < 1e-10
    forward_y, forward_state, _ = BACKENDS[backend].forward(*args, q)
    np.testing.assert_array_equal(y, forward_y)
    np.testing.assert_array_equal(state, forward_state)


@pytest.mark.parametrize("backend", INFERENCE_KERNELS)
def test_ssd_runs_inference_when_no_input_needs_a_gradient(monkeypatch, backend):
    """ssd calls the backend's inference when no input requires a gradient or under no_grad (nothing is kept for
    a backward that cannot come), and its forward when an input requires one, with grad mode on."""
    import dataclasses
    calls = []
    record = BACKENDS[backend]

    def spy(kind, fn):
        return lambda *args: calls.append(kind) or fn(*args)
    monkeypatch.setitem(BACKENDS, backend, dataclasses.replace(record, inference=spy("inference", record.inference),
                                                               forward=spy("forward", record.forward)))
    inputs = make_inputs(np.random.default_rng(18), b=1, l=9, h=2, p=2, g=1, n=3, initial_state=True)
    plain = ssd(**{k: tg.Tensor(v) for k, v in inputs.items()}, chunk_size=4, backend=backend)
    assert calls == ["inference"] and not plain[0].requires_grad
    wanting = {k: tg.Tensor(v, requires_grad=k == "B") for k, v in inputs.items()}
    recorded = ssd(**wanting, chunk_size=4, backend=backend)
    assert calls[-1] == "forward" and recorded[0].requires_grad
    with tg.no_grad():
        inside = ssd(**wanting, chunk_size=4, backend=backend)
    assert calls[-1] == "inference" and not inside[0].requires_grad
    for got, want in zip(plain + inside, recorded + recorded):
        np.testing.assert_array_equal(got.data, want.data)


# --- the numba CPU kernels' own machinery ------------------------------------------------------------------

from tinygrad_ssm.scan import numba_chunked, numba_cpu  # noqa: E402


def test_numba_work_items_go_to_whichever_thread_claims_them(monkeypatch):
    """Every thread claims the kernels' work items from one counter (numba_cpu._on_threads): the outputs and
    gradients are the same bits on one thread, on all of numba's threads, when the pool's threads are held up
    elsewhere (the caller then claims every item itself and does not wait for them), and in two Python threads
    running scans at once."""
    import numba

    from tinygrad_ssm.fast import row_blocks
    rng = np.random.default_rng(21)
    inputs = make_inputs(rng, b=3, l=23, h=4, p=5, g=2, n=3)
    args = [inputs[k] for k in ("x", "dt", "A", "B", "C", "D", "initial_state")]
    dy, d_final = rng.standard_normal(inputs["x"].shape), rng.standard_normal(inputs["initial_state"].shape)

    def run():
        y, state, saved = numba_chunked.forward(*args, 8)
        return [y, state, *numba_chunked.backward(saved, dy, d_final)]
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_WORK", 1 << 60)
    one_thread = run()
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_WORK", 0)
    before = numba.get_num_threads()
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    try:
        results = [run() for _ in range(3)]
        if row_blocks._pool is not None:
            release = threading.Event()
            held = [row_blocks._pool.submit(release.wait, 30) for _ in range(row_blocks._pool._max_workers)]
            try:
                start = time.perf_counter()
                results.append(run())
                assert time.perf_counter() - start < 5
            finally:
                release.set()
                for f in held:
                    f.result()
        # two Python threads running scans at once (numba's workqueue layer is not thread-safe): the same bits
        concurrent = [None, None]

        def in_thread(i):
            concurrent[i] = run()
        threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        results += concurrent
    finally:
        numba.set_num_threads(before)
    for result in results:
        for got, want in zip(result, one_thread):
            np.testing.assert_array_equal(got, want)


@given(q=st.integers(numba_cpu.PIECE - 3, 2 * numba_chunked.MAX_CHUNK), extra=st.integers(0, 20), r=st.integers(1, 7),
       p=st.integers(1, 6), n=st.integers(1, 6), with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_numba_forward_pieces_and_head_blocks(q, extra, r, p, n, with_state, seed):
    """The forward cuts each chunk of q = min(chunk_size, MAX_CHUNK) steps into ceil(q / PIECE) near-equal pieces
    (two pieces of 8 and 9 for q = 17; the last chunk shorter) and a group's heads into blocks (the last block
    may hold fewer heads, or none). Chunk sizes around and past PIECE and MAX_CHUNK, against the reference; and
    every number of head blocks from 1 to r + 1 gives the same bits."""
    l = 2 * min(q, numba_chunked.MAX_CHUNK) + extra
    inputs = make_inputs(np.random.default_rng(seed), b=2, l=l, h=2 * r, p=p, g=2, n=n, initial_state=with_state)
    for name, (diff, _) in differences(inputs, q, "numba_chunked", seed=seed).items():
        assert diff < 1e-10, (name, diff)
    args = [inputs[k] for k in NAMES]
    runs = []
    with pytest.MonkeyPatch.context() as patch:
        for blocks in range(1, r + 2):
            patch.setattr(numba_cpu, "head_blocks", lambda *_, blocks=blocks: blocks)
            runs.append(numba_chunked.forward(*args, q))
    for y, state, saved in runs[1:]:
        np.testing.assert_array_equal(y, runs[0][0])
        np.testing.assert_array_equal(state, runs[0][1])
        np.testing.assert_array_equal(saved[6], runs[0][2][6])          # the checkpoints


def test_head_blocks_give_every_thread_several_items():
    """Blocks of a group's heads per (batch, group): at least ITEMS_PER_THREAD items per thread where the heads
    allow, at most one block per head, at least one."""
    per = numba_cpu.ITEMS_PER_THREAD
    assert numba_cpu.head_blocks(b=1, g=1, r=24, threads=2) == 2 * per           # the 130M shape at batch 1
    assert numba_cpu.head_blocks(b=8, g=1, r=8, threads=2) == 1                   # 8 items already
    assert numba_cpu.head_blocks(b=1, g=1, r=3, threads=2) == 3                   # no more blocks than heads
    assert numba_cpu.head_blocks(b=64, g=4, r=2, threads=16) == 1


@given(p=st.integers(2, 5), n=st.integers(2, 5), g=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_numba_reads_the_pieces_of_one_array_in_place(p, n, g, seed):
    """x, B, C as the model hands them over (column pieces of the conv's output, dt and dy pieces too) are read
    where they lie, not copied, and give the same bits as contiguous copies of them. (A piece one column wide
    is copied: NumPy gives its length-1 axis no meaningful stride.)"""
    b, l, h = 2, 7, 2 * g
    rng = np.random.default_rng(seed)
    xBC = rng.standard_normal((b, l, h * p + 2 * g * n + 3))            # x | B | C | 3 columns nobody reads
    x = xBC[..., :h * p].reshape(b, l, h, p)
    B = xBC[..., h * p:h * p + g * n].reshape(b, l, g, n)
    C = xBC[..., h * p + g * n:h * p + 2 * g * n].reshape(b, l, g, n)
    dt_dy = rng.uniform(0.01, 0.5, (b, l, h + h * p))
    dt, dy = dt_dy[..., :h], dt_dy[..., h:].reshape(b, l, h, p)
    A, D = -rng.uniform(0.5, 2.0, h), rng.standard_normal(h)
    for piece in (x, B, C, dt, dy):
        rows, col = numba_cpu._rows_of(piece)
        assert not piece.flags.c_contiguous and np.shares_memory(rows, piece)
        np.testing.assert_array_equal(rows[:, col:col + piece[0, 0].size].reshape(piece.shape), piece)
    d_final = rng.standard_normal((b, h, p, n))
    in_place = numba_chunked.forward(x, dt, A, B, C, D, None, 3)
    copies = numba_chunked.forward(*(np.ascontiguousarray(a) for a in (x, dt, A, B, C, D)), None, 3)
    for got, want in zip(in_place[:2], copies[:2]):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(numba_chunked.backward(in_place[2], dy, d_final),
                         numba_chunked.backward(copies[2], np.ascontiguousarray(dy), d_final)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["pieces", "fortran"])
def test_numba_backward_into_given_arrays(layout):
    """backward(..., into=(dx, dB, dC)) returns those arrays holding the same bits as a plain backward: pieces of
    one array are written by the kernel itself; arrays the kernel cannot write as rows (Fortran order) get the
    result copied in."""
    rng = np.random.default_rng(17)
    inputs = make_inputs(rng, b=2, l=9, h=4, p=3, g=2, n=2)
    args = [inputs[k] for k in ("x", "dt", "A", "B", "C", "D", "initial_state")]
    y, state, saved = numba_chunked.forward(*args, 4)
    dy, d_final = rng.standard_normal(y.shape), rng.standard_normal(state.shape)
    plain = numba_chunked.backward(saved, dy, d_final)
    shapes = [inputs["x"].shape, inputs["B"].shape, inputs["C"].shape]
    if layout == "pieces":
        widths = [int(np.prod(sh[2:])) for sh in shapes]
        grad = np.full((2, 9, sum(widths) + 1), np.nan)                 # one gradient array, as a split's
        edges = np.cumsum([0] + widths)
        into = tuple(grad[..., a:b].reshape(sh) for a, b, sh in zip(edges, edges[1:], shapes))
    else:
        into = tuple(np.asfortranarray(np.full(sh, np.nan)) for sh in shapes)
    got = numba_chunked.backward(saved, dy, d_final, into=into)
    assert all(g is i for g, i in zip((got[0], got[3], got[4]), into))
    for g, want in zip(got, plain):
        np.testing.assert_array_equal(g, want)


INTO_KERNELS = [pytest.param(name, marks=pytest.mark.skipif(not record.available(), reason=f"{name} is not available"))
                for name, record in BACKENDS.items() if record.backward_into]


@pytest.mark.parametrize("backend", INTO_KERNELS)
@pytest.mark.parametrize("ngroups", [1, 2])
def test_backward_writes_into_the_split_gradient(monkeypatch, backend, ngroups):
    """In the model x, B and C are reshaped pieces of one split_last: a kernel backend with backward_into writes
    dx, dB, dC straight into that split's gradient array (the split then copies nothing for them), and every
    parameter's gradient has the same bits as with new arrays copied across (backward_into off)."""
    import dataclasses

    from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
    from tinygrad_ssm.fast import fused

    ids = np.random.default_rng(3).integers(0, 50, (2, 13))
    seen = []
    plain_backward, plain_same_view = BACKENDS[backend].backward, fused._same_view

    def spy_backward(saved, dy, d_final, into=(None, None, None)):
        out = plain_backward(saved, dy, d_final, into=into)
        wrote_into = all(i is not None for i in into) and all(o is i for o, i in zip(out[:1] + out[3:5], into))
        seen.append(("into", wrote_into))
        return out

    def spy_same_view(g, slot):
        same = plain_same_view(g, slot)
        seen.append(("in place", same))
        return same

    def gradients(into: bool):
        seen.clear()
        monkeypatch.setitem(BACKENDS, backend, dataclasses.replace(BACKENDS[backend], backward_into=into,
                                                                   backward=spy_backward))
        config = Mamba2Config(d_model=16, n_layer=2, vocab_size=50, d_state=4, headdim=8, ngroups=ngroups, chunk_size=8,
                              pad_vocab_size_multiple=8)
        model = Mamba2LMHeadModel(config, VarMap(seed=5), dtype="float32", backend=backend)
        model.loss(ids, np.roll(ids, -1, 1)).backward()
        return ({name: t.grad.data for name, t in model.varmap.named_vars()},
                [ok for kind, ok in seen if kind == "into"], sum(ok for kind, ok in seen if kind == "in place"))

    monkeypatch.setattr(fused, "_same_view", spy_same_view)
    copied, into_calls, in_place_off = gradients(False)
    assert into_calls and not any(into_calls)
    written, into_calls, in_place_on = gradients(True)
    assert into_calls and all(into_calls)                               # every layer's scan wrote in place
    assert in_place_on == in_place_off + 3 * len(into_calls)            # x, B, C: the split copied nothing
    assert copied.keys() == written.keys()
    for name in copied:
        np.testing.assert_array_equal(written[name], copied[name], err_msg=name)


CACHE_PROBE = textwrap.dedent("""
    import json, time
    import numpy as np
    start = time.perf_counter()
    from tinygrad_ssm.scan import numba_chunked, numba_cpu
    rng = np.random.default_rng(0)
    b, l, h, p, g, n = 1, 5, 2, 2, 1, 3
    args = [rng.standard_normal(s) for s in [(b, l, h, p), (b, l, h), (h,), (b, l, g, n), (b, l, g, n), (h,), (b, h, p, n)]]
    y, state, saved = numba_chunked.forward(*args, 4)
    numba_chunked.backward(saved, np.ones_like(y), np.ones_like(state))
    kernels = [numba_cpu.forward_kernel, numba_chunked.backward_kernel]
    print(json.dumps(dict(seconds=time.perf_counter() - start, hits=[sum(k.stats.cache_hits.values()) for k in kernels],
                          misses=[sum(k.stats.cache_misses.values()) for k in kernels])))
""")


def test_numba_fresh_process_loads_the_compiled_kernels_from_the_cache():
    """Run the kernels in a subprocess twice: the second finds both compiled in numba's on-disk cache."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    runs = [json.loads(subprocess.run([sys.executable, "-c", CACHE_PROBE], env=env, check=True, capture_output=True,
                                      text=True).stdout.splitlines()[-1]) for _ in range(2)]
    first, second = runs
    assert second["misses"] == [0, 0] and all(hit >= 1 for hit in second["hits"]), runs


def test_numba_chunked_runs_scipys_blas_on_one_thread_and_restores_it():
    """The chunked kernels' products are small and run on the kernel's own threads: SciPy's OpenBLAS (the one
    numba's np.dot calls) is on one thread while the kernel runs and back to what it was afterwards."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def scipy_blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas" and "scipy" in
                lib["filepath"] and "numpy" not in lib["filepath"]]
    numba_cpu.on_single_threaded_blas(lambda: None)                    # loads SciPy's OpenBLAS
    if not scipy_blas_threads():
        pytest.skip("SciPy's BLAS is not an OpenBLAS that threadpoolctl finds here")
    with threadpool_limits(2, user_api="blas"):
        seen = numba_cpu.on_single_threaded_blas(scipy_blas_threads)
        assert set(seen) == {1}                                         # one thread inside
        assert set(scipy_blas_threads()) == {2}                         # the setting before, restored
