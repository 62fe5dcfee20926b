"""The numba decoding step (models/mamba2/decode.py, the model's `step` when fused=True) against the engine's step
(fused=False) on the same weights: logits and cache states equal to 1e-10 in float64, for any group count,
batch > 1, biases and dt limits; float32 stays float32; generation gives the same tokens."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.decode import assert_steps_agree, twin_models
from tinygrad_ssm import Tensor
from tinygrad_ssm.models.mamba2 import decode
from tinygrad_ssm.models.mamba2.sampling import NonFiniteLogits


@given(g=st.sampled_from([1, 2, 4]), r=st.integers(1, 2), batch=st.integers(1, 3), prompt_len=st.integers(0, 6),
       bias=st.booleans(), conv_bias=st.booleans(), d_conv=st.integers(2, 4),
       dt_limit=st.sampled_from([(0.0, math.inf), (0.05, 0.3)]), tied=st.booleans(), seed=st.integers(0, 2**16))
def test_decode_step_equals_engine_step_float64(g, r, batch, prompt_len, bias, conv_bias, d_conv, dt_limit, tied,
                                                seed):
    headdim = 4
    fast, slow = twin_models(seed=seed, ngroups=g, d_model=g * r * headdim // 2, headdim=headdim, d_conv=d_conv,
                             bias=bias, conv_bias=conv_bias, dt_limit=dt_limit, tie_embeddings=tied)
    assert_steps_agree(fast, slow, batch, prompt_len, steps=3, seed=seed, tol=1e-10)


def test_decode_step_float32_stays_float32():
    fast, slow = twin_models(dtype="float32", seed=3)
    assert_steps_agree(fast, slow, batch=4, prompt_len=5, steps=4, seed=3, tol=2e-5)
    assert all(layer.ssm.dtype == np.float32 for layer in fast.allocate_cache(1).layers)


def test_generate_uses_the_decoder_and_gives_the_reference_tokens(monkeypatch):
    """Greedy and every sampling setting run in numba blocks (decode_sampled) after the short prompt's one step,
    and give the reference's tokens (the engine's step + sample_next) for the same seed."""
    fast, slow = twin_models(seed=5, vocab_size=30)
    prompt = np.random.default_rng(5).integers(0, 30, (3, 4))
    calls = {"prompt": [], "step": [], "sampled": []}
    for name, module in (("prompt", "generation"), ("step", "model"), ("sampled", "generation")):
        real = getattr(decode, f"decode_{name}")
        monkeypatch.setattr(f"tinygrad_ssm.models.mamba2.{module}.decode_{name}",
                            lambda *a, name=name, real=real: calls[name].append(a[1].shape) or real(*a))
    np.testing.assert_array_equal(fast.generate(prompt, 6, temperature=0), slow.generate(prompt, 6, temperature=0))
    assert calls == {"prompt": [(3, 4)], "step": [], "sampled": [(3,)]}  # the short prompt, then 5 steps in numba
    settings = [{"top_k": 1}, {"temperature": 1.0, "top_k": 5}, {"temperature": 0.8, "top_p": 0.9},
                {"temperature": 1.3, "top_k": 7, "top_p": 0.5}, {"temperature": 1.0}]
    for kw in settings:
        np.testing.assert_array_equal(fast.generate(prompt, 40, seed=2, **kw), slow.generate(prompt, 40, seed=2, **kw))
    assert calls["step"] == [] and len(calls["sampled"]) == 1 + 2 * len(settings)    # blocks of 32, then 7


@pytest.mark.parametrize("kw", [{"temperature": 0, "repetition_penalty": 1.8},
                                {"temperature": 0, "repetition_penalty": 0.6},
                                {"temperature": 1.0, "min_p": 0.2},
                                {"temperature": 0.9, "top_k": 8, "top_p": 0.9, "min_p": 0.05,
                                 "repetition_penalty": 1.3}])
@pytest.mark.parametrize("block", [3, 32])
def test_min_p_and_the_repetition_penalty_give_the_reference_tokens_in_numba_blocks(monkeypatch, kw, block):
    """The decoder's blocks mark each drawn token as seen, across blocks, as the per-token path (the engine's step
    and sample_next) does: the same tokens for the same seed, each row penalising its own prompt and tokens."""
    monkeypatch.setattr("tinygrad_ssm.models.mamba2.generation.TOKEN_BLOCK", block)
    fast, slow = twin_models(seed=7, vocab_size=30)
    prompt = np.random.default_rng(7).integers(0, 30, (3, 5))
    np.testing.assert_array_equal(fast.generate(prompt, 40, seed=3, **kw), slow.generate(prompt, 40, seed=3, **kw))


def test_a_greedy_repetition_penalty_is_applied_to_the_prompt_and_every_token_so_far():
    """An independent reference of the rule: each step's logits from the engine's step, every id of the row's
    prompt and of its tokens so far divided by the penalty where positive, multiplied where negative, then the
    argmax; the decoder gives its tokens, which a strong penalty keeps from repeating the unpenalised ones."""
    fast, slow = twin_models(seed=11, vocab_size=30)
    prompt, penalty = np.array([[4, 9, 4, 17], [2, 2, 3, 5]]), 2.5
    cache = slow.allocate_cache(2)
    logits = slow(prompt, cache).data[:, -1]                            # (2, V) after the prompt
    rows, want = [set(p.tolist()) for p in prompt], []
    for _ in range(12):
        scores = logits[:, :30].copy()                                   # (2, 30)
        for r, seen in enumerate(rows):
            ids = sorted(seen)
            scores[r, ids] = np.where(scores[r, ids] < 0, scores[r, ids] * penalty, scores[r, ids] / penalty)
        token = np.argmax(scores, axis=-1)                               # (2,)
        want.append(token)
        for r in range(2):
            rows[r].add(int(token[r]))
        logits = slow.step(token, cache).data
    want = np.stack(want, axis=1)                                        # (2, 12)
    got = fast.generate(prompt, 12, temperature=0, repetition_penalty=penalty)[:, 4:]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, fast.generate(prompt, 12, temperature=0)[:, 4:])


@given(block=st.integers(1, 4), batch=st.integers(1, 9), new=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_greedy_generation_in_blocks_gives_the_reference_tokens(block, batch, new, seed):
    """decode_sampled's blocks (each fed the last token of the one before) give the engine step's greedy tokens."""
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr("tinygrad_ssm.models.mamba2.generation.TOKEN_BLOCK", block)
        fast, slow = twin_models(seed=seed, vocab_size=30, ngroups=1)
        prompt = np.random.default_rng(seed).integers(0, 30, (batch, 3))
        np.testing.assert_array_equal(fast.generate(prompt, new, temperature=0),
                                      slow.generate(prompt, new, temperature=0))
    finally:
        mp.undo()


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "top_k": 1}])
@pytest.mark.parametrize("block", [2, 32])
def test_generation_stops_at_the_step_whose_logits_are_not_finite(monkeypatch, block, sampling):
    """The embedding row of a greedy token (the 4th or later, new to the sequence) made NaN (untied head: the
    logits stay finite until that token is fed back): generation yields the tokens up to it, then names the
    step after; the inner loop's argmax agrees with the reference's."""
    monkeypatch.setattr("tinygrad_ssm.models.mamba2.generation.TOKEN_BLOCK", block)
    fast, slow = twin_models(seed=9, vocab_size=30, tie_embeddings=False)
    prompt = np.array([[1, 2, 3]])
    want = slow.generate(prompt, 12, temperature=0)[0, 3:]
    k = next(k for k in range(3, 12) if want[k] not in want[:k] and want[k] not in prompt)
    fast.embedding.weight.data[want[k]] = np.nan
    got = []
    with pytest.raises(NonFiniteLogits, match=rf"step {k + 2} \(token {k + 2} of 12, after {k + 1} generated"):
        for token in fast.generate_stream(prompt, 12, **sampling):
            got.append(int(token[0]))
    assert got == list(want[:k + 1])


def test_a_generation_stopped_at_non_finite_logits_counts_the_step_that_found_them():
    """decode_sampled feeds the token whose embedding row is NaN and stops at that step's logits: the cache and the
    session's step numbers advance by the steps run (the tokens, and that one), as the cache's states did."""
    fast, slow = twin_models(seed=9, vocab_size=30, tie_embeddings=False)
    prompt = np.array([[1, 2, 3]])
    want = slow.generate(prompt, 12, temperature=0)[0, 3:]
    k = next(k for k in range(3, 12) if want[k] not in want[:k] and want[k] not in prompt)
    fast.embedding.weight.data[want[k]] = np.nan
    cache = fast.allocate_cache(1)
    for t in prompt[0]:
        fast.step(np.array([t]), cache)                                 # the decoder's step: numbers 0, 1, 2
    tokens, logits = decode.decode_sampled(fast, want[:1], cache, 30, 0.0, None, None, np.zeros((11, 1)))
    assert tokens[:, 0].tolist() == list(want[1:k + 1]) and np.isnan(logits).any()
    assert cache.seqlen_offset == 3 + k + 1 == cache._decode_session.step_count


def test_a_copied_weight_is_taken_again_after_an_in_place_update():
    """A parameter the decoder cannot read as it is (here Fortran-ordered) is copied into its layout; the copy
    cannot see an in-place update of the parameter (an optimizer step), so the decoder takes the weights again at
    every step: the next step's logits are the engine's with the updated weight."""
    fast, slow = twin_models(seed=6)
    weight = fast.layers[0].mixer.in_proj.weight                        # one tensor, shared by the twins
    weight.data = np.asfortranarray(weight.data)
    token = np.array([3, 4])
    with pytest.warns(RuntimeWarning, match=r"decoding copies backbone.layers.0.mixer.in_proj.weight \(float64, strided\) at "
                                            r"every step.*np.array\(param.data, dtype='float64', order='C'\)"):
        fast.step(token, fast.allocate_cache(2))                        # said once (the user can give the layout)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # once: not again at the next steps
        for _ in range(2):
            np.testing.assert_allclose(fast.step(token, fast.allocate_cache(2)).data,
                                       slow.step(token, slow.allocate_cache(2)).data, rtol=1e-10, atol=1e-10)
            weight.data[...] *= 1.5                                     # in place: the same array
            assert not weight.data.flags.c_contiguous


def test_a_weight_no_one_can_write_is_copied_once(tmp_path):
    """A parameter on a file mapped read-only (np.load(mmap_mode="r")) is copied into the decoder's layout (numba
    takes a read-only array as another type) once: nothing can change it in place, so the copy stays right. It
    was copied again at every step, 8-50x slower (found by an audit of serving from Python)."""
    import warnings
    fast, slow = twin_models(seed=7)
    weight = fast.norm_f.weight
    np.save(tmp_path / "norm_f.npy", weight.data)
    weight.data = np.load(tmp_path / "norm_f.npy", mmap_mode="r")
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # no warning: nothing is copied each step
        for t in range(3):
            token = np.array([t, t + 1])
            np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10,
                                       atol=1e-10)
            if t == 0:
                weights = decode._weights(fast)
            assert decode._weights(fast) is weights                     # taken once


def test_decode_rejects_a_cache_of_another_shape():
    fast, _ = twin_models(seed=1)
    cache = fast.allocate_cache(2)
    cache.layers[1].conv = type(cache.layers[1].conv)(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"decode: cache conv state has shape \(2, 3, 4\) and dtype float64, "
                                         r"expected \(2, 48, 4\)"):
        fast.step(np.array([1, 2]), cache)                             # the decoder checks every layer's states
    with pytest.raises(ValueError, match=r"decode: cache conv state has shape \(2, 3, 4\)"):
        decode.decode_step(fast, np.array([1, 2]), cache)                 # called on its own too
    with pytest.raises(ValueError, match=r"Mamba2LMHeadModel: cache layer 1 holds conv \(2, 3, 4\)"):
        fast(np.array([[1], [2]]), cache)                                 # and the model's forward before it runs


def test_decode_replaces_a_non_contiguous_state_once():
    fast, slow = twin_models(seed=2)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    wide = np.zeros((2, 8, 4, 2 * 4))
    cache_f.layers[0].ssm = type(cache_f.layers[0].ssm)(wide[..., ::2])   # a strided view: copied, not written through
    token = np.array([3, 4])
    np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10, atol=1e-10)
    assert cache_f.layers[0].ssm.data.flags.c_contiguous and not wide.any()


def test_generation_prefills_a_long_prompt_and_steps_a_short_one_to_the_same_tokens(monkeypatch):
    fast, slow = twin_models(seed=8, vocab_size=30)
    prompt = np.random.default_rng(8).integers(0, 30, (2, 5))
    want = slow.generate(prompt, 4, temperature=0)
    for limit in (9, 10):                                           # the chunked-scan prefill, then the decoder
        monkeypatch.setattr("tinygrad_ssm.models.mamba2.generation.PROMPT_STEP_TOKENS", limit)
        np.testing.assert_array_equal(fast.generate(prompt, 4, temperature=0), want)


def test_sessions_on_the_same_weights_call_the_entry_points_the_first_one_found():
    """The first generate finds the compiled entry points of the prompt's step and of the token blocks (numba's
    dispatch types every argument at each call); later sessions on the same weights, with another batch, prompt
    length and sampling, call them directly and still give the engine's tokens. PROFILE must be an array of the
    type the entry points were compiled for."""
    fast, slow = twin_models(seed=4, vocab_size=30)
    weights = decode._weights(fast)
    assert weights.entry_points == {}
    one = np.random.default_rng(4).integers(0, 30, (1, 3))
    np.testing.assert_array_equal(fast.generate(one, 5, temperature=0), slow.generate(one, 5, temperature=0))
    helper = {decode._helper} if decode.helper_threads() else set()    # the helper thread's loop
    found = {decode._lead, decode._sampled} | helper
    assert set(weights.entry_points) == found
    assert all(entry is not dispatcher for dispatcher, entry in weights.entry_points.items())
    three = np.random.default_rng(5).integers(0, 30, (3, 6))
    for kw in ({"temperature": 0}, {"temperature": 1.0, "top_k": 5, "seed": 3}):
        np.testing.assert_array_equal(fast.generate(three, 7, **kw), slow.generate(three, 7, **kw))
    assert decode._weights(fast) is weights and set(weights.entry_points) == found
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode, "PROFILE", np.zeros(len(decode.PROFILE_PHASES), np.int32))
        with pytest.raises(ValueError, match=r"decode.PROFILE must be None or a writable np.zeros\(6, np.int64\)"):
            fast.generate(one, 3, temperature=0)
        mp.setattr(decode, "PROFILE", np.zeros(len(decode.PROFILE_PHASES), np.int64))
        np.testing.assert_array_equal(fast.generate(one, 5, temperature=0), slow.generate(one, 5, temperature=0))
        assert (decode.PROFILE > 0).any()                               # counted through the entry points


def test_a_steps_logits_are_kept_after_the_next_step():
    """The logits a step returns are the caller's: the next step (which reuses the session's buffers) leaves them."""
    fast, slow = twin_models(seed=3)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    tokens = [np.array([t, t + 1]) for t in range(3)]
    got = [fast.step(token, cache_f).data for token in tokens]
    want = [slow.step(token, cache_s).data for token in tokens]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_a_state_replaced_in_one_layer_only_is_read():
    """Replacing one later layer's state (not a prefill's every layer) makes the decoder follow the new array."""
    fast, slow = twin_models(seed=7)
    cache_f, cache_s = fast.allocate_cache(2), slow.allocate_cache(2)
    token = np.array([1, 2])
    fast.step(token, cache_f), slow.step(token, cache_s)
    new = np.random.default_rng(7).standard_normal(cache_f.layers[1].ssm.shape)
    cache_f.layers[1].ssm, cache_s.layers[1].ssm = Tensor(new.copy()), Tensor(new.copy())
    for _ in range(2):
        np.testing.assert_allclose(fast.step(token, cache_f).data, slow.step(token, cache_s).data, rtol=1e-10,
                                   atol=1e-10)
        np.testing.assert_allclose(cache_f.layers[1].ssm.data, cache_s.layers[1].ssm.data, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fused", [True, False])
def test_a_child_forked_while_a_thread_advanced_the_cache_can_step_it(fused):
    """fork() while another thread of the parent was stepping a cache: the child inherited the hold and no
    thread to drop it, and refused the cache for good, "being advanced by another thread" (found by an audit of
    serving from Python: 8 of 10 forks). In the parent the hold still stands."""
    import os
    import threading
    model = twin_models(seed=3)[0 if fused else 1]
    cache = model.allocate_cache(1)
    model.step(np.array([1]), cache)
    inside, leave = threading.Event(), threading.Event()

    def advancing_thread():
        with cache.advancing("the parent's step"):
            inside.set()
            leave.wait(10)
    worker = threading.Thread(target=advancing_thread)
    worker.start()
    try:
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:                                                    # the child: the hold is no thread's here
            try:
                model.step(np.array([2]), cache)
                os._exit(0 if cache.seqlen_offset == 2 else 1)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with pytest.raises(RuntimeError, match="being advanced by another thread"):
            model.step(np.array([2]), cache)                            # the parent's thread still holds it
    finally:
        leave.set()
        worker.join()


def test_a_hold_just_taken_by_another_thread_is_not_taken_for_a_parents():
    """Between its acquire and its note of the process (advancing), another thread's hold is still this process's:
    refused, not dropped as a hold left by a fork."""
    import threading
    model = twin_models(seed=3)[0]
    cache = model.allocate_cache(1)                                     # never advanced: no note yet
    taken, leave = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (cache._in_use.acquire(), taken.set(), leave.wait(10),
                                              cache._in_use.release()))
    worker.start()
    try:
        assert taken.wait(10)
        with pytest.raises(RuntimeError, match="being advanced by another thread"):
            model.step(np.array([1]), cache)
    finally:
        leave.set()
        worker.join()


@pytest.mark.parametrize("fused", [True, False])
def test_a_cache_advanced_by_another_thread_is_refused(fused):
    """Two threads stepping one cache hung the process in the fused decoder (the session's step counters crossed)
    and, unfused, left states that matched no order of the steps (found by an audit of threads): while one call
    advances a cache, another thread's step or prefill on it is refused."""
    import threading
    model = twin_models(seed=3)[0 if fused else 1]
    cache = model.allocate_cache(1)
    errors = []

    def other_thread():
        for call in (lambda: model.step(np.array([1]), cache), lambda: model(np.array([[1, 2]]), cache)):
            try:
                call()
            except RuntimeError as e:
                errors.append(str(e))
    with cache.advancing("a step of the first thread"):
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert len(errors) == 2 and all("being advanced by another thread" in e and "allocate_cache" in e for e in errors)
    assert cache.seqlen_offset == 0 and not cache.layers[0].ssm.data.any()     # nothing was advanced
    model.step(np.array([1]), cache)                                     # free again: steps as usual
    assert cache.seqlen_offset == 1


@pytest.mark.parametrize("fused", [True, False])
def test_a_hold_a_ctrl_c_left_on_the_cache_is_dropped_by_the_threads_next_call(fused):
    """A Ctrl-C between advancing's acquire and its `try` left the cache held: every later step, of the same thread
    too, was refused as "being advanced by another thread" (found with real signals by an audit of long-running
    use). The thread's next call takes the cache and, at its end, drops every hold it has."""
    import threading
    model = twin_models(seed=3)[0 if fused else 1]
    cache = model.allocate_cache(1)
    cache._in_use.acquire()                                              # what the interrupted call left behind
    model.step(np.array([1]), cache)
    assert cache.seqlen_offset == 1
    other = threading.Thread(target=lambda: model.step(np.array([2]), cache))
    other.start()
    other.join()                                                         # another thread may take it now
    assert cache.seqlen_offset == 2


def test_a_module_replaced_on_the_model_is_what_the_decoder_reads():
    """mixer.out_proj replaced by another Linear after a generate: the decoder's prepared weights checked the old
    module's parameters (unchanged) and went on with them (found by an audit)."""
    from tinygrad_ssm import VarBuilder, VarMap, nn
    fast, _ = twin_models(seed=4)
    ids = np.array([[3, 9, 27]])
    fast.generate(ids, 3, temperature=0)                                 # the decoder's weights are prepared
    old = fast.layers[0].mixer.out_proj
    vb = VarBuilder.from_varmap(VarMap(seed=5), dtype=fast.dtype)
    fast.layers[0].mixer.out_proj = nn.Linear(vb.pp("other"), old.in_features, old.out_features, bias=False,
                                              fused=True)
    fast.layers[0].mixer.out_proj.weight.data *= 30
    cache = fast.allocate_cache(1)
    fast(ids[:, :2], cache)                                              # prefill (the fused forward)
    np.testing.assert_allclose(fast.step(ids[:, 2], cache).data, fast(ids).data[:, -1], rtol=1e-10, atol=1e-10)


class _Lora:
    """A LoRA wrapper as users write them: the base Linear's call plus x A^T B^T, with the base's .weight exposed."""

    def __init__(self, base, rank=2, seed=0):
        rng = np.random.default_rng(seed)
        self.base, self.weight = base, base.weight
        self.A = Tensor(rng.standard_normal((rank, base.in_features)) * 0.3)
        self.B = Tensor(rng.standard_normal((base.out_features, rank)) * 0.3)

    def __call__(self, x):
        return self.base(x) + (x @ self.A.T) @ self.B.T


@pytest.mark.parametrize("where", ["in_proj", "lm_head", "subclass"])
def test_a_wrapper_the_decoder_cannot_compute_is_refused_and_decodes_unfused(where):
    """A LoRA wrapper around in_proj (or lm_head) exposes the base's .weight: the fused decoder read it and skipped
    the wrapper's call, and step and generate gave another model's logits and tokens (0.45 off; found by an audit),
    where forward and loss used the adapter. Now decoding names the module and the fix, and with model.fused = False
    it decodes through the layers' own calls: the forward's tokens."""
    from tinygrad_ssm import nn
    fast, _ = twin_models(seed=6, vocab_size=30, tie_embeddings=where != "lm_head")
    mixer = fast.layers[0].mixer
    if where == "in_proj":
        mixer.in_proj, named = _Lora(mixer.in_proj), "backbone.layers.0.mixer.in_proj is a _Lora, not a Linear"
    elif where == "lm_head":
        fast.lm_head, named = _Lora(fast.lm_head), "lm_head is a _Lora, not a Linear"
    else:
        class Scaled(nn.Linear):                                        # a subclass with a call of its own
            def __call__(self, x):
                return super().__call__(x) * 2.0
        mixer.out_proj.__class__ = Scaled
        named = "backbone.layers.0.mixer.out_proj is a Scaled, not a Linear"
    ids = np.array([[3, 9, 27, 4]])
    with pytest.raises(ValueError, match=f"decoding: {named}: the fused decoder .* model.fused = False"):
        next(iter(fast.generate_stream(ids, 3, temperature=0)))
    with pytest.raises(ValueError, match=named):
        fast.step(ids[:, 0], fast.allocate_cache(1))
    fast.fused = False
    tokens = fast.generate(ids, 3, temperature=0)                        # (1, 4 + 3)
    for i in range(3):                                                   # each new token the forward's argmax
        assert tokens[0, 4 + i] == int(np.argmax(fast(tokens[:, :4 + i]).data[0, -1, :30]))
