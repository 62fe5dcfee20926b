"""The pieces of the numba decoder (models/mamba2/decode.py, decode_kernels.py) on their edge cases: projections and
heads split in chunks of any size (odd, 1, not dividing the count; big chunks first) for batches around the
4-row blocks, the same bits with and without the helper thread, weights or caches replaced between steps, the
usual state size as a literal, the greedy loop's argmax and the vectorisable exp (fast_exp.py). The decoder's
equality with the engine step in general: tests/models/test_decode.py."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from numba import njit

from tests.support.decode import assert_steps_agree, twin_models
from tests.support.numba_functions import elementwise
from tinygrad_ssm import Tensor
from tinygrad_ssm.fast import claims, decode_kernels
from tinygrad_ssm.fast.fast_exp import exp as fast_exp
from tinygrad_ssm.fast.fast_exp import exp32, silu
from tinygrad_ssm.fast.sampling_kernels import sample_rows
from tinygrad_ssm.fast.vector_width import PREFER_512_BIT
from tinygrad_ssm.models.mamba2 import decode, decode_step
from tinygrad_ssm.models.mamba2.sampling import NonFiniteLogits, sample_next


@given(rows=st.sampled_from([1, 2, 3, 5]), batch=st.integers(1, 6), g=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_any_chunk_of_rows_any_batch_equals_the_engine_step(rows, batch, g, seed):
    """rows weight rows (heads) per chunk (one, odd blocks, blocks not dividing the count: the four-row products'
    and the head pairs' remainders; head pairs across groups with g=2); batch 4..6 runs the four-rows-by-four-
    sequences product and its remainders."""
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(decode, "CHUNK_BYTES", rows * 16 * 8)                  # d_model 16 floats of 8 bytes a row
        mp.setattr(decode, "STATE_CHUNK_BYTES", rows * 4 * 4 * 8)         # a head's state (4, 4) float64
        fast, slow = twin_models(seed=seed, ngroups=g, d_model=16, bias=True)
        chunking = decode._weights(fast).rows
        assert chunking[0][1] == chunking[3] == rows and chunking[0][0] > 0  # small in_proj chunks, heads; big ones
        assert_steps_agree(fast, slow, batch, prompt_len=2, steps=2, seed=seed, tol=1e-10)
    finally:
        mp.undo()


def run_steps(model, batch, steps, seed):
    rng = np.random.default_rng(seed)
    cache = model.allocate_cache(batch)
    model(rng.integers(0, model.config.vocab_size, (batch, 3)), cache)
    logits = [model.step(rng.integers(0, model.config.vocab_size, batch), cache).data for _ in range(steps)]
    return np.stack(logits), [(s.conv.data.copy(), s.ssm.data.copy()) for s in cache.layers]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_helper_thread_changes_no_bit(monkeypatch, dtype):
    """Whoever computes a chunk computes it the same way: one thread alone gives the same bits as two."""
    monkeypatch.setattr(decode, "CHUNK_BYTES", 3 * 16 * 8)
    monkeypatch.setattr(decode, "STATE_CHUNK_BYTES", 3 * 4 * 4 * 8)
    fast, _ = twin_models(dtype=dtype, seed=4, d_model=16)
    monkeypatch.setattr(decode, "helper_threads", lambda: 1)
    together = run_steps(fast, 5, 6, seed=4)
    monkeypatch.setattr(decode, "helper_threads", lambda: 0)
    alone = run_steps(fast, 5, 6, seed=4)
    np.testing.assert_array_equal(together[0], alone[0])
    for (conv_a, ssm_a), (conv_b, ssm_b) in zip(together[1], alone[1]):
        np.testing.assert_array_equal(conv_a, conv_b)
        np.testing.assert_array_equal(ssm_a, ssm_b)


def test_weights_changed_between_steps_are_used():
    """In place (an optimizer step: the same array) or replaced (a new array): the next step reads the new
    values, and the prepared weights are rebuilt only when an array was replaced."""
    fast, slow = twin_models(seed=6)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    token = np.array([1, 2])
    for _ in range(2):
        fast.step(token, cache_f), slow.step(token, cache_s)
    prepared = decode._weights(fast)
    w = fast.layers[0].mixer.in_proj.weight
    w.data *= 1.5                                                       # in place
    np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10, atol=1e-10)
    assert decode._weights(fast) is prepared
    w.data = w.data * 0.5                                               # replaced
    fast.layers[1].mixer.D.data = fast.layers[1].mixer.D.data + 1.0
    np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10, atol=1e-10)
    assert decode._weights(fast) is not prepared
    # replaced on its module (torch's `module.weight = nn.Parameter(...)`): the decoder kept the old tensor's array
    for model in (fast, slow):
        new_weight = Tensor(model.layers[1].mixer.out_proj.weight.data * -2.0)
        model.layers[1].mixer.out_proj.weight = new_weight
    np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10, atol=1e-10)


def test_a_cache_refilled_by_a_prefill_is_read_again():
    """A prefill replaces the cache's state arrays: the decoder must follow them, not its old ones."""
    fast, slow = twin_models(seed=7)
    cache_f, cache_s = fast.allocate_cache(1), slow.allocate_cache(1)
    for prompt in (np.array([[1, 2, 3]]), np.array([[4, 5]])):
        fast(prompt, cache_f), slow(prompt, cache_s)
        for token in (6, 7):
            np.testing.assert_allclose(fast.step(np.array([token]), cache_f).data,
                                       slow.step(np.array([token]), cache_s).data, rtol=1e-10, atol=1e-10)
    assert decode.release(cache_f) is None and decode.release(fast.allocate_cache(1)) is None


exp_all, exp32_all, silu_all = elementwise(fast_exp), elementwise(exp32), elementwise(silu)


def test_fast_exp_is_within_two_ulp_of_exp_and_handles_the_ends():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-708, 709.78, 20000), rng.normal(0, 3, 20000), [0.0, -0.0, 1e-300, 709.78]])
    want = np.exp(x)
    np.testing.assert_allclose(exp_all(x), want, rtol=2 * np.finfo(np.float64).eps, atol=0)
    ends = exp_all(np.array([np.nan, np.inf, -np.inf, 710.0, -708.5, -1000.0]))
    assert math.isnan(ends[0]) and ends[1] == ends[3] == math.inf and (ends[2:] == [0.0, math.inf, 0.0, 0.0]).all()


def test_exp32_and_a_float32_silu_are_within_two_float32_ulp_and_handle_the_ends():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-86, 88.5, 20000), rng.normal(0, 3, 20000), [0.0, -0.0, 1e-30, 88.5, -86.0]])
    x = x.astype(np.float32)
    x64 = x.astype(np.float64)
    eps = np.finfo(np.float32).eps
    assert exp32_all(x).dtype == silu_all(x).dtype == np.float32                  # float32 lanes throughout
    np.testing.assert_allclose(exp32_all(x), np.exp(x64), rtol=2 * eps, atol=0)
    np.testing.assert_allclose(silu_all(x), x64 / (1 + np.exp(-x64)), rtol=2 * eps, atol=1e-37)
    ends = exp32_all(np.array([np.nan, np.inf, -np.inf, 89.0, -86.5, -1000.0], np.float32))
    assert math.isnan(ends[0]) and ends[1] == ends[3] == math.inf and (ends[2:] == [0.0, math.inf, 0.0, 0.0]).all()
    gates = silu_all(np.array([np.nan, np.inf, 100.0, -100.0], np.float32))
    assert math.isnan(gates[0]) and gates[1] == math.inf and gates[2] == 100.0 and gates[3] == 0.0
    np.testing.assert_array_equal(silu_all(x64), x64 / (1 + exp_all(-x64)))       # float64 keeps its own


@given(rows=st.lists(st.lists(st.sampled_from([0.0, 1.5, -2.0, 1.5, math.nan, math.inf, -math.inf]), min_size=5,
                              max_size=5), min_size=1, max_size=3), vocab=st.integers(1, 5))
def test_the_generation_loops_argmax_is_sample_nexts(rows, vocab):
    """sample_rows at temperature 0 over logits[:, :vocab]: np.argmax's first largest where sample_next's greedy
    choice succeeds, a bad row exactly where it raises (NaN, +inf, or no finite value in a row); columns past
    vocab never count."""
    logits = np.array(rows, np.float32)
    ids = np.full(len(rows), -1, np.int64)
    ok = sample_rows(logits, vocab, 0.0, 0, 1.0, 0.0, 1.0, np.zeros((len(rows), 0), bool), np.zeros(len(rows)), ids) < 0
    try:
        want = sample_next(logits[:, :vocab], np.random.default_rng(0), temperature=0)
    except NonFiniteLogits:
        assert not ok
    else:
        assert ok and ids.tolist() == want.tolist()


@pytest.mark.parametrize("d_state", [64, 63])
def test_the_usual_state_size_a_literal_equals_the_engine_step(d_state):
    """d_state 64 runs the head update with the size as a compile-time literal (unrolled); 63 the general loop."""
    fast, slow = twin_models(seed=11, d_state=d_state, ngroups=1)
    assert_steps_agree(fast, slow, batch=3, prompt_len=2, steps=2, seed=11, tol=1e-10)


@given(n_rows=st.integers(1, 3000), small=st.integers(1, 64),
       share=st.sampled_from([0.0, 0.2, 0.45, decode.BIG_SHARE, 0.5]))
def test_chunks_tile_the_rows_once(n_rows, small, share):
    """Two big chunks (a multiple of the small size, or none; half each for the norms), then small ones: [0, n_rows)
    exactly, in order."""
    big = int(n_rows * share) // small * small
    bounds = [decode_step._chunk(c, n_rows, big, small) for c in range(decode_step._n_chunks(n_rows, big, small))]
    assert bounds[0][0] == 0 and bounds[-1][1] == n_rows
    assert all(lo < hi for lo, hi in bounds) and all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert all(hi - lo == big for lo, hi in bounds[:2]) if big else all(hi - lo <= small for lo, hi in bounds)


@given(rows=st.sampled_from([1, 3, 5]), batch=st.integers(1, 5), prompt_len=st.integers(1, 6), g=st.sampled_from([1, 2]),
       helper=st.booleans(), seed=st.integers(0, 2**16))
@example(rows=3, batch=3, prompt_len=4, g=2, helper=False, seed=5)    # several sequences of several tokens
def test_a_prompt_in_one_step_equals_the_engine_forward(rows, batch, prompt_len, g, helper, seed):
    """decode_prompt takes a prompt's tokens as rows of one step (token-major, each sequence's conv and heads in
    order): its logits and caches equal the engine's chunked forward over the prompt (float64, 1e-10), with
    projections and heads in chunks of any size and rows past the 4-row blocks; steps after it agree too."""
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(decode, "CHUNK_BYTES", rows * 16 * 8)
        mp.setattr(decode, "STATE_CHUNK_BYTES", rows * 4 * 4 * 8)
        mp.setattr(decode, "helper_threads", lambda: int(helper))
        fast, slow = twin_models(seed=seed, ngroups=g, d_model=16, bias=True)
        ids = np.random.default_rng(seed).integers(0, fast.config.vocab_size, (batch, prompt_len))
        cache_f, cache_s = fast.allocate_cache(batch), slow.allocate_cache(batch)
        logits_f = decode.decode_prompt(fast, ids, cache_f)
        logits_s = slow(ids, cache_s).data[:, -1]
        np.testing.assert_allclose(logits_f, logits_s, rtol=1e-10, atol=1e-10)
        assert cache_f.seqlen_offset == cache_s.seqlen_offset == prompt_len
        for lf, ls in zip(cache_f.layers, cache_s.layers):
            np.testing.assert_allclose(lf.conv.data, ls.conv.data, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(lf.ssm.data, ls.ssm.data, rtol=1e-10, atol=1e-10)
        token = np.arange(batch) % fast.config.vocab_size
        np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10,
                                   atol=1e-10)
    finally:
        mp.undo()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_prompt_step_is_the_same_bits_with_and_without_the_helper(monkeypatch, dtype):
    monkeypatch.setattr(decode, "CHUNK_BYTES", 3 * 16 * 8)
    monkeypatch.setattr(decode, "STATE_CHUNK_BYTES", 3 * 4 * 4 * 8)
    fast, _ = twin_models(dtype=dtype, seed=6, d_model=16)
    ids = np.random.default_rng(6).integers(0, fast.config.vocab_size, (5, 7))
    results = []
    for helpers in (1, 0):
        monkeypatch.setattr(decode, "helper_threads", lambda helpers=helpers: helpers)
        cache = fast.allocate_cache(5)
        logits = decode.decode_prompt(fast, ids, cache)
        results.append([logits] + [a for s in cache.layers for a in (s.conv.data.copy(), s.ssm.data.copy())])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@njit
def now_cycles():
    return claims.cycles()


def test_the_phase_profile_of_single_steps_fits_in_the_steps(monkeypatch):
    """The same for steps alone (little but the numba call around the phases), on a model whose heads take a good
    share of a step: a stamp not moved after a phase counts that phase twice, more than the call's overhead."""
    monkeypatch.setattr(decode, "helper_threads", lambda: 0)
    fast, _ = twin_models(seed=2, d_model=64, d_state=256, headdim=32, ngroups=1, n_layer=4, vocab_size=64)
    cache, ids = fast.allocate_cache(8), np.arange(8)
    decode.decode_step(fast, ids, cache)                                # compiled before the profile starts
    decode.release(cache)                                               # the next session takes PROFILE
    monkeypatch.setattr(decode, "PROFILE", np.zeros(len(decode.PROFILE_PHASES), np.int64))
    took = 0
    for _ in range(20):
        start = now_cycles()
        decode.decode_step(fast, ids, cache)
        took += now_cycles() - start
    assert (decode.PROFILE > 0).all() and decode.PROFILE.sum() <= took


def test_the_phase_profile_adds_up_to_no_more_than_the_calls_took(monkeypatch):
    """With decode.PROFILE set, each phase's cycles are counted from the end of the phase before it: together
    they fit inside the cycles the generation took (a stamp overwritten inside a phase would count from 0)."""
    fast, _ = twin_models(seed=2, d_model=16)
    prompt = np.random.default_rng(2).integers(0, fast.config.vocab_size, (3, 4))
    fast.generate(prompt, 3, temperature=0)                              # compiled before the profile starts
    monkeypatch.setattr(decode, "PROFILE", np.zeros(len(decode.PROFILE_PHASES), np.int64))
    start = now_cycles()
    fast.generate(prompt, 5, temperature=0)
    took = now_cycles() - start
    assert (decode.PROFILE > 0).all() and decode.PROFILE.sum() <= took


@njit(cache=False)
def _weight_rows(W, lo, hi, u, bias, zero, out):
    decode_kernels.weight_rows(W, lo, hi, u, bias, zero, out)


@given(rows=st.integers(1, 23), k=st.integers(1, 70), batch=st.integers(1, 13), lo=st.integers(0, 23),
       hi=st.integers(0, 23), seed=st.integers(0, 2**16))
def test_float_rows_of_any_range_equal_the_float64_product(rows, k, batch, lo, hi, seed):
    """weight_rows on float64 weights: rows [lo, hi) of u @ W^T + bias, through the 4 x 4 blocks (which prefetch
    the next block's rows, up to the range's end, and take the batch rows left over with the same four weight
    rows), or below batch 4 two weight rows from the range's two halves against each batch row (_matvec_halves),
    and the single sums after them; the rest untouched."""
    rng = np.random.default_rng(seed)
    W, u, bias = rng.standard_normal((rows, k)), rng.standard_normal((batch, k)), rng.standard_normal(rows)
    lo, hi = min(lo, rows), min(max(lo, hi), rows)
    out = np.full((batch, rows), np.nan)
    _weight_rows(W, lo, hi, u, bias, 0.0, out)
    np.testing.assert_allclose(out[:, lo:hi], u @ W[lo:hi].T + bias[lo:hi], rtol=1e-10, atol=1e-10)
    assert np.isnan(np.delete(out, np.s_[lo:hi], axis=1)).all()


@pytest.mark.parametrize("batch", range(1, 10))
@pytest.mark.parametrize("lo, hi", [(1, 11), (1, 10)])
def test_float_rows_at_every_batch_remainder_equal_the_float64_product(batch, lo, hi):
    """Every batch size up to two blocks and a remainder, deterministically (the drawn test above takes 15
    examples in CI): weight rows [1, 11) are two blocks of four and two single rows, or two halves of five;
    [1, 10) two blocks and one single row, or two halves of four and one single row; the batch rows are 4 x 4
    blocks and 0-3 rows left over (_four_sums inside the blocks), or all through _matvec_halves below 4."""
    rng = np.random.default_rng(batch)
    W, u, bias = rng.standard_normal((12, 37)), rng.standard_normal((batch, 37)), rng.standard_normal(12)
    out = np.full((batch, 12), np.nan)
    _weight_rows(W, lo, hi, u, bias, 0.0, out)
    np.testing.assert_allclose(out[:, lo:hi], u @ W[lo:hi].T + bias[lo:hi], rtol=1e-10, atol=1e-10)
    assert np.isnan(np.delete(out, np.s_[lo:hi], axis=1)).all()


def test_the_product_blocks_ask_llvm_for_512_bit_vectors_and_prefetch():
    """_matvec_blocks (the batch products' inner blocks) carries the function attribute that lets LLVM use
    512-bit vectors (batch-8 decoding ran 7% faster with it on an AVX-512 Xeon), and on a CPU with AVX-512 its
    machine code does use zmm registers; the sums below batch 4 (_matvec_halves) and the one-row sums keep the
    default width (two adjacent rows with 512-bit vectors streamed 29-30 GB/s against 35.5-36.4 with 256). It
    prefetches the next block's weight rows. Compiled afresh here: a function loaded from numba's cache has no IR
    to inspect."""
    import llvmlite.binding as llvm
    fresh = dict(decode_kernels._JIT, cache=False)
    blocks, dot = njit(**fresh)(decode_kernels._matvec_blocks.py_func), njit(**fresh)(decode_kernels._dot.py_func)
    f = np.float32
    W, u, bias, out = np.ones((8, 32), f), np.ones((4, 32), f), np.zeros(8, f), np.zeros((4, 8), f)
    blocks(W, 0, 8, u, bias, f(0), out)
    np.testing.assert_array_equal(out, 32)
    ir = blocks.inspect_llvm(blocks.signatures[0])
    assert PREFER_512_BIT in ir
    assert "@llvm.prefetch" in ir                                      # the next block's rows (fast/prefetch.py)
    dot(W, 0, u, 0, f(0))
    assert PREFER_512_BIT not in dot.inspect_llvm(dot.signatures[0])
    halves = njit(**fresh)(decode_kernels._matvec_halves.py_func)
    halves(W, 0, 8, u[:1], bias, f(0), out)
    np.testing.assert_array_equal(out[0], 32)
    assert PREFER_512_BIT not in halves.inspect_llvm(halves.signatures[0])
    if "+avx512f" in llvm.get_host_cpu_features().flatten().split(","):
        assert "zmm" in blocks.inspect_asm(blocks.signatures[0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_models_of_any_layer_count_share_one_compilation(dtype):
    """The decoder's argument types hold no model size (typed Lists, not tuples whose type is their length): a
    model of 2 layers and one of 3 (and other widths) step, prompt and decode greedily through the functions
    compiled for the first, so numba compiles (and caches on disk) once per dtype."""
    functions = (decode._lead, decode._sampled)                        # _step is compiled into them
    prompt = np.array([[1, 2, 3]])
    twin_models(dtype=dtype, seed=1, n_layer=2)[0].generate(prompt, 3, temperature=0)
    compiled = [set(f.signatures) for f in functions]
    assert all(len(sigs) >= 1 for sigs in compiled)
    for overrides in ({"n_layer": 3}, {"n_layer": 1, "d_model": 8, "d_state": 2, "vocab_size": 17}):
        twin_models(dtype=dtype, seed=1, **overrides)[0].generate(prompt, 3, temperature=0)
        assert [set(f.signatures) for f in functions] == compiled


def interrupt_as_each_call_returns(monkeypatch):
    """A Ctrl-C that lands just as the decoder's numba call returns (its work done), until monkeypatch.undo()."""
    real_call = decode._Session.call

    def returns_then_interrupted(self, dispatcher, args):
        real_call(self, dispatcher, args)
        raise KeyboardInterrupt

    monkeypatch.setattr(decode._Session, "call", returns_then_interrupted)


def test_a_step_after_one_interrupted_as_it_returned_does_its_work(monkeypatch):
    """A Ctrl-C lands as the numba call returns: the step had run, but its step number was not counted, so the
    next step reused it, found every chunk already claimed, and left the cache as it was."""
    fast, slow = twin_models(seed=8)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    fast.step(np.array([1, 2]), cache_f), slow.step(np.array([1, 2]), cache_s)
    interrupt_as_each_call_returns(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        fast.step(np.array([3, 4]), cache_f)
    monkeypatch.undo()
    slow.step(np.array([3, 4]), cache_s)                                # the interrupted step had run
    for token in ([5, 6], [7, 8]):
        np.testing.assert_allclose(fast.step(np.array(token), cache_f).data, slow.step(np.array(token), cache_s).data,
                                   rtol=1e-10, atol=1e-10)


def test_a_step_interrupted_before_its_kernel_started_is_not_counted(monkeypatch):
    """A Ctrl-C that lands while numba reads the step's arguments (its unboxing runs Python code: the interrupt
    comes out as TypeError "can't unbox a List as a <NULL>") stops the step before it runs. The session counted
    it anyway: the next step's number had no claims behind it, and that step waited for ever, holding the cache
    (found by an audit of long-running use, with real signals)."""
    fast, slow = twin_models(seed=8)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    fast.step(np.array([1, 2]), cache_f), slow.step(np.array([1, 2]), cache_s)

    def fails_before_the_kernel(self, dispatcher, args):
        raise TypeError("can't unbox a <class 'numba.typed.typedlist.List'> as a <NULL>")

    monkeypatch.setattr(decode._Session, "call", fails_before_the_kernel)
    with pytest.raises(TypeError, match="as a <NULL>"):
        fast.step(np.array([3, 4]), cache_f)
    monkeypatch.undo()
    assert cache_f._decode_session.step_count == 1                     # one step ran (counted 2, the next hung)
    for token in ([5, 6], [7, 8]):                                     # the failed step left the cache as it was
        np.testing.assert_allclose(fast.step(np.array(token), cache_f).data, slow.step(np.array(token), cache_s).data,
                                   rtol=1e-10, atol=1e-10)


def test_the_decoder_never_indexes_its_typed_lists_from_python(monkeypatch):
    """Indexing a numba typed List from Python compiles numba's getitem (not cached on disk) in every new process:
    0.3 s of the first generate, and a Ctrl-C inside that compile broke numba's typing, so that every later
    generate of the process failed (found by an audit of long-running use)."""
    from numba.typed import List

    def indexed(self, i):
        raise AssertionError("a typed List was indexed from Python")

    monkeypatch.setattr(List, "__getitem__", indexed)
    fast, slow = twin_models(seed=8)
    prompt = np.array([[1, 2, 3]])
    assert fast.generate(prompt, 4, temperature=0).tolist() == slow.generate(prompt, 4, temperature=0).tolist()


def test_a_token_block_after_one_interrupted_as_it_returned_does_its_work(monkeypatch):
    """The same for decode_sampled's block of n steps: interrupted as it returned, all n step numbers are counted
    (it ran them all), so the next step does its work."""
    fast, slow = twin_models(seed=8)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    fast.step(np.array([1, 2]), cache_f), slow.step(np.array([1, 2]), cache_s)
    interrupt_as_each_call_returns(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        decode.decode_sampled(fast, np.array([3, 4]), cache_f, 40, 0.0, None, None, np.zeros((3, 2)))
    monkeypatch.undo()
    token = np.array([3, 4])
    for _ in range(3):                                                  # the block's greedy steps, in the engine
        token = np.argmax(slow.step(token, cache_s).data[:, :40], axis=-1)
    for token in ([5, 6], [7, 8]):
        np.testing.assert_allclose(fast.step(np.array(token), cache_f).data, slow.step(np.array(token), cache_s).data,
                                   rtol=1e-10, atol=1e-10)


def test_a_token_block_stopped_early_and_interrupted_as_it_returned_counts_the_steps_it_ran(monkeypatch):
    """A block that stopped at non-finite logits after k + 1 of its n steps, interrupted as it returned: the
    session counts the k + 1 step numbers it used, not n (the claims of the next step would be behind its number)."""
    fast, slow = twin_models(seed=9, vocab_size=30, tie_embeddings=False)
    prompt = np.array([[1, 2, 3]])
    want = slow.generate(prompt, 12, temperature=0)[0, 3:]
    k = next(k for k in range(3, 12) if want[k] not in want[:k] and want[k] not in prompt)
    fast.embedding.weight.data[want[k]] = np.nan                        # the step after token k's is not finite
    cache = fast.allocate_cache(1)
    for t in prompt[0]:
        fast.step(np.array([t]), cache)                                 # step numbers 0, 1, 2
    interrupt_as_each_call_returns(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        decode.decode_sampled(fast, want[:1], cache, 30, 0.0, None, None, np.zeros((11, 1)))
    monkeypatch.undo()
    assert cache._decode_session.step_count == 3 + k + 1
