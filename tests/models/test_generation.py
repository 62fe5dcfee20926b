"""Generation's batches (models/mamba2/generation.py): a ragged batch (a list of prompts of different lengths) gives
each row the tokens its prompt gives alone, eos_token_id ends rows and the stream, bad prompts are named by
their row, and a prompt is processed with the LM head on its last position only."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.decode import twin_models
from tinygrad_ssm.models.mamba2 import generation


def alone(model, prompts, n, **kw):
    return [model.generate(np.array(p)[None], n, **kw)[0] for p in prompts]


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4), fused=st.booleans(),
       prompt_step_tokens=st.sampled_from([1, 8, 512]), seed=st.integers(0, 2**16))
def test_a_ragged_batch_gives_each_row_its_prompts_own_tokens(lengths, fused, prompt_step_tokens, seed):
    """Greedy, and top_k=1 sampling (whose draws cannot change a token); prompts in one numba step or through
    the chunked scan (PROMPT_STEP_TOKENS), the decoder or the engine's step."""
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(generation, "PROMPT_STEP_TOKENS", prompt_step_tokens)
        models = twin_models(seed=seed % 7, vocab_size=30)
        model = models[0] if fused else models[1]
        rng = np.random.default_rng(seed)
        prompts = [rng.integers(0, 30, n).tolist() for n in lengths]
        for kw in ({"temperature": 0}, {"temperature": 1.0, "top_k": 1, "seed": seed},
                   {"temperature": 0, "repetition_penalty": 1.7}):               # each row its own prompt's ids
            got = model.generate(prompts, 5, **kw)
            assert isinstance(got, list) and all(g.dtype == np.int64 and g.ndim == 1 for g in got)
            for g, want in zip(got, alone(model, prompts, 5, **kw)):
                np.testing.assert_array_equal(g, want)
    finally:
        mp.undo()


def test_a_ragged_batch_of_one_samples_as_its_prompt_alone():
    """One row takes each step's one uniform number, as the prompt alone does: any setting, the same tokens."""
    fast, _ = twin_models(seed=3, vocab_size=30)
    kw = {"temperature": 1.2, "top_p": 0.8, "seed": 4}
    np.testing.assert_array_equal(fast.generate([[5, 6, 7]], 20, **kw)[0], fast.generate([5, 6, 7], 20, **kw)[0])


def test_eos_finishes_rows_and_then_the_stream():
    fast, _ = twin_models(seed=6, vocab_size=30)
    prompts = [[1, 2, 3], [4], [7, 8, 9, 10, 11]]
    free = alone(fast, prompts, 12, temperature=0)
    new = [row[len(p):] for row, p in zip(free, prompts)]
    eos = int(new[0][2])                                                # row 0 meets it at its 3rd new token
    firsts = [int(np.argmax(row == eos)) if (row == eos).any() else None for row in new]
    stream = np.stack(list(fast.generate_stream(prompts, 12, temperature=0, eos_token_id=eos)))   # (steps, b)
    ends = [12 if f is None else f for f in firsts]
    assert len(stream) == (max(ends) + 1 if None not in firsts else 12)  # stops once every row is finished
    for r, row in enumerate(stream.T):
        stop = ends[r]
        np.testing.assert_array_equal(row[:stop + 1], new[r][:stop + 1][:len(row)])
        assert (row[stop:] == eos).all()                              # a finished row holds eos
    got = fast.generate(prompts, 12, temperature=0, eos_token_id=eos)
    for g, p, row, f in zip(got, prompts, new, firsts):
        np.testing.assert_array_equal(g, np.concatenate([p, row if f is None else row[:f + 1]]))


def test_eos_on_an_array_batch_ends_when_every_row_has_it():
    fast, _ = twin_models(seed=6, vocab_size=30)
    prompt = np.array([[1, 2, 3], [3, 2, 1]])
    free = fast.generate(prompt, 12, temperature=0)
    eos = int(free[0, 4])
    if eos in free[1, 3:]:
        last = max(int(np.argmax(free[r, 3:] == eos)) for r in range(2))
        out = fast.generate(prompt, 12, temperature=0, eos_token_id=eos)
        assert out.shape == (2, 3 + last + 1) and (out[:, -1] == eos).all()
    out = fast.generate(prompt[:1], 12, temperature=0, eos_token_id=eos)
    np.testing.assert_array_equal(out, free[:1, :5])                  # one row: ends at its first eos


@pytest.mark.parametrize("prompts,message", [
    ([[1, 2], []], r"input_ids\[1\] is empty"),
    ([[1, 2], [3, 40]], r"input_ids\[1\] must be in \[0, 40\), got min 3 max 40"),
    ([[1, 2], [-1]], r"input_ids\[1\] must be in \[0, 40\)"),
    ([[1.0, 2.0], [3]], r"input_ids\[0\] must be a 1-D sequence of ints, got dtype float64"),
    ([[1, 2], [[3, 4]]], r"input_ids\[1\] must be a 1-D sequence of ints, got dtype int64 shape \(1, 2\)"),
    ([[1, 2], [3, [4]]], r"input_ids\[1\] must be a 1-D sequence of ints, got dtype object"),
    ([], r"input_ids is an empty list"),
])
def test_bad_prompts_are_named_by_their_row(prompts, message):
    fast, _ = twin_models(seed=1)
    with pytest.raises(ValueError, match=message):
        fast.generate_stream(prompts, 3)                                # at the call, not at the first next()
    with pytest.raises(ValueError, match=message):
        fast.generate(prompts, 3)


@pytest.mark.parametrize("eos", [-1, 40, 1.5, True, [], [1, 40], [1, True], "3", {3}])
def test_a_bad_eos_token_id_is_named(eos):
    fast, _ = twin_models(seed=1)
    with pytest.raises(ValueError, match=r"eos_token_id must be None, an int in \[0, 40\) or a non-empty sequence"):
        fast.generate_stream([[1, 2]], 3, eos_token_id=eos)
    with pytest.raises(ValueError, match=r"eos_token_id must be None, an int in \[0, 40\)"):
        fast.generate([[1, 2]], 3, eos_token_id=eos)


@pytest.mark.parametrize("fused", [True, False])
def test_a_list_of_eos_ids_ends_each_row_at_the_first_of_any_and_holds_it(fused):
    """transformers stops a row at any id of a list eos_token_id (a generation_config.json may list several): a
    finished row holds the EOS it produced, and generate's ragged rows are cut after it."""
    models = twin_models(seed=6, vocab_size=30)
    model = models[0] if fused else models[1]
    prompts = [[1, 2, 3], [4], [7, 8, 9, 10, 11]]
    new = [row[len(p):] for row, p in zip(alone(model, prompts, 12, temperature=0), prompts)]
    eos = [int(new[0][2]), int(new[1][1]), 29]                       # rows 0 and 1 meet different ones
    firsts = [next((i for i, t in enumerate(row) if t in eos), None) for row in new]
    stream = np.stack(list(model.generate_stream(prompts, 12, temperature=0, eos_token_id=eos)))   # (steps, b)
    for r, row in enumerate(stream.T):
        f = firsts[r]
        if f is None:
            np.testing.assert_array_equal(row, new[r][:len(row)])
            continue
        np.testing.assert_array_equal(row[:f + 1], new[r][:f + 1])
        assert (row[f:] == new[r][f]).all()                             # holds the one it produced
    if None not in firsts:
        assert len(stream) == max(firsts) + 1
    got = model.generate(prompts, 12, temperature=0, eos_token_id=np.array(eos))
    for g, p, row, f in zip(got, prompts, new, firsts):
        np.testing.assert_array_equal(g, np.concatenate([p, row if f is None else row[:f + 1]]))
    single = model.generate(prompts, 12, temperature=0, eos_token_id=(eos[0],))
    np.testing.assert_array_equal(single[0], model.generate(prompts, 12, temperature=0, eos_token_id=eos[0])[0])


@pytest.mark.parametrize("fused", [True, False])
def test_a_long_prompt_goes_through_the_chunked_scan_with_the_head_on_its_last_position(monkeypatch, fused):
    models = twin_models(seed=2, vocab_size=30)
    model = models[0] if fused else models[1]
    monkeypatch.setattr(generation, "PROMPT_STEP_TOKENS", 4)
    monkeypatch.setattr(generation, "decode_prompt", lambda *a: pytest.fail("a long prompt took the one step"))
    rows = []
    real_head = type(model)._head
    monkeypatch.setattr(type(model), "_head", lambda self, x: rows.append(x.shape) or real_head(self, x))
    prompt = np.arange(1, 10)[None] % 30                                # (1, 9): 9 tokens > 4
    out = model.generate(prompt, 3, temperature=0)
    assert rows[0] == (1, model.config.d_model)                         # the prefill's head: last position only
    np.testing.assert_array_equal(out[:, 9:], models[1].generate(prompt, 3, temperature=0)[:, 9:])


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("batch,window,widths", [(1, 4, [4, 4, 3]), (2, 4, [2] * 5 + [1]), (3, 4, [1] * 11)])
def test_a_long_prompt_is_prefilled_in_windows_with_the_logits_of_one_forward(monkeypatch, fused, batch, window,
                                                                              widths):
    """One forward over a whole prompt held its activations: 6.3 GB for 400,000 tokens at d_model 256 (380 MB in
    windows). Windows of PREFILL_WINDOW tokens over the batch, the state carried, give the forward's logits."""
    model = twin_models(seed=3, vocab_size=30)[0 if fused else 1]
    monkeypatch.setattr(generation, "PROMPT_STEP_TOKENS", 1)
    monkeypatch.setattr(generation, "PREFILL_WINDOW", window)
    seen, block = [], type(model.layers[0])
    real_call = block.__call__
    monkeypatch.setattr(block, "__call__", lambda self, x, *a: seen.append(x.shape[1]) or real_call(self, x, *a))
    prompt = np.random.default_rng(batch).integers(0, 30, (batch, 11))
    cache, logits = generation.prefill(model, prompt)
    assert seen[::len(model.layers)] == widths and cache.seqlen_offset == 11
    monkeypatch.setattr(block, "__call__", real_call)
    np.testing.assert_allclose(logits, model(prompt).data[:, -1], rtol=1e-10, atol=1e-10)
    whole = model.allocate_cache(batch)
    model(prompt, whole)
    for ours, theirs in zip(cache.layers, whole.layers):
        np.testing.assert_allclose(ours.ssm.data, theirs.ssm.data, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(ours.conv.data, theirs.conv.data, rtol=1e-10, atol=1e-10)


def test_a_wide_models_long_prompt_takes_the_chunked_scan(monkeypatch):
    from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap
    assert generation.prompt_step_tokens(64) == generation.prompt_step_tokens(256) == 512
    assert generation.prompt_step_tokens(768) == 170                   # the 130M shape: 512 // 3
    steps = []
    real = generation.decode_prompt
    monkeypatch.setattr(generation, "decode_prompt", lambda *a: steps.append(a[1].shape) or real(*a))
    wide = Mamba2LMHeadModel(Mamba2Config(d_model=512, n_layer=1, vocab_size=40, d_state=8, headdim=32),
                             VarMap(seed=1))
    ids = np.random.default_rng(0).integers(0, 40, (1, 300))
    wide.generate(ids[:, :256], 1, temperature=0)                       # 256 <= 512 * 256 / 512: one step
    wide.generate(ids, 1, temperature=0)                                # 300 > 256: the chunked scan
    assert steps == [(1, 256)]


@pytest.mark.parametrize("fused", [True, False])
def test_vocab_size_keeps_sampling_below_it(fused):
    """A transformers config states its vocabulary padded past the tokenizer's (50,288 rows for 50,280 tokens):
    vocab_size=n samples only ids below n, at every setting, in the decoder and the engine's step alike; the
    same draws without it reach the rows past n."""
    model = twin_models(seed=3, vocab_size=40)[0 if fused else 1]
    prompts = np.random.default_rng(3).integers(0, 40, (4, 3))
    for kw in ({"temperature": 2.0, "seed": 1}, {"temperature": 2.0, "top_k": 30, "seed": 2},
               {"temperature": 2.0, "top_p": 0.99, "seed": 3}):
        limited = model.generate(prompts, 40, vocab_size=25, **kw)[:, 3:]
        free = model.generate(prompts, 40, **kw)[:, 3:]
        assert limited.max() < 25 and free.max() >= 25
    greedy = model.generate(prompts, 5, temperature=0, vocab_size=1)[:, 3:]
    assert (greedy == 0).all()


@pytest.mark.parametrize("fused", [True, False])
def test_the_padding_rows_of_a_mamba_ssm_vocabulary_are_never_sampled(fused):
    """A mamba_ssm config pads its vocabulary (37 tokens -> 48 embedding rows): by default only ids below
    config.vocab_size are drawn, though the head gives the padding rows logits too (here a fair share of the
    probability at this temperature, so draws that included them would reach them)."""
    model = twin_models(seed=4, vocab_size=37, pad_vocab_size_multiple=16)[0 if fused else 1]
    assert model.config.padded_vocab_size == 48
    prompts = np.random.default_rng(4).integers(0, 37, (4, 3))
    scaled = model(prompts).data[:, -1] / 3.0                            # (4, 48) the first draw's logits / T
    p = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    assert (p[:, 37:].sum(axis=-1) / p.sum(axis=-1)).min() > 0.05
    for kw in ({"temperature": 3.0, "seed": 5}, {"temperature": 3.0, "top_p": 0.999, "seed": 6},
               {"temperature": 3.0, "top_k": 47, "seed": 7}):
        assert model.generate(prompts, 40, **kw)[:, 3:].max() < 37


@pytest.mark.parametrize("seed", ["x", -1, 1.5, True])
def test_a_bad_seed_is_named(seed):
    model = twin_models(seed=0, vocab_size=40)[0]
    with pytest.raises(ValueError, match="seed must be None or an int >= 0"):
        model.generate(np.array([[1, 2]]), 2, seed=seed)


@pytest.mark.parametrize("vocab_size", [0, -1, 2.5, True, "8"])
def test_a_bad_vocab_size_is_named(vocab_size):
    model = twin_models(seed=0, vocab_size=40)[0]
    with pytest.raises(ValueError, match="vocab_size must be None or an int >= 1"):
        model.generate(np.array([[1, 2]]), 2, vocab_size=vocab_size)


@pytest.mark.parametrize("kw, message", [({"temperature": True}, "temperature must be a number >= 0"),
                                         ({"temperature": False}, "temperature must be a number >= 0"),
                                         ({"top_p": True}, "top_p must be None or in"),
                                         ({"top_k": True}, "top_k must be None or an int >= 1"),
                                         ({"min_p": True}, "min_p must be None or in"),
                                         ({"repetition_penalty": True}, "repetition_penalty must be None or a")])
def test_a_bool_sampling_setting_is_refused(kw, message):
    """True is an int in Python: temperature=True was read as 1.0 while top_k=True was refused."""
    model = twin_models(seed=0, vocab_size=40)[0]
    with pytest.raises(ValueError, match=message):
        model.generate(np.array([[1, 2]]), 2, **kw)


@pytest.mark.parametrize("kw, message", [
    ({"max_length": 9}, r"max_length=9 is not taken .*counts the prompt too.*pass max_new_tokens=7 \(the prompt has 2"),
    ({"max_length": 9.0}, r"max_length=9.0 is not taken .*pass max_new_tokens \(the prompt has 2 tokens\)"),
    ({"max_new_tokens": 3, "do_sample": False}, "do_sample=False is not taken: temperature=0 is greedy"),
    ({"max_new_tokens": 3, "num_beams": 4}, r"num_beams=4 \(beam search\) is not implemented"),
    ({"max_new_tokens": 3, "output_scores": True}, "output_scores=True is not taken: no scores are returned"),
    ({"max_new_tokens": 3, "return_dict_in_generate": True}, "return_dict_in_generate=True is not taken"),
    ({"max_new_tokens": 3, "attention_mask": np.ones((1, 2))}, "attention_mask=.* pass the prompts unpadded"),
    ({"max_new_tokens": 3, "pad_token_id": 0}, "pad_token_id=0 is not taken: a finished row holds the EOS id"),
    ({"max_new_tokens": 3, "num_beams": True}, "num_beams=True"),
    ({"max_new_tokens": 3, "typo_p": 0.5}, "unexpected keyword argument 'typo_p'"),
    ({}, r"max_new_tokens \(the number of tokens to generate after the prompt\) is required"),
])
@pytest.mark.parametrize("call", ["generate", "generate_stream"])
def test_another_librarys_generate_argument_is_refused_by_name_with_the_fix(kw, message, call):
    """mamba_ssm's generate(input_ids, max_length, top_k, top_p, min_p, temperature, repetition_penalty, ...) and
    transformers' settings that generate does not take: each one that would change the result is named, never
    dropped (Python's own 'unexpected keyword argument' said nothing of what to pass instead), at the call, not at
    the first next()."""
    model = twin_models(seed=0, vocab_size=40)[0]
    with pytest.raises(TypeError, match=message):
        getattr(model, call)(np.array([[1, 2]]), **kw)


def test_max_length_of_a_ragged_batch_names_the_prompts_lengths():
    model = twin_models(seed=0, vocab_size=40)[0]
    with pytest.raises(TypeError, match=r"pass max_new_tokens \(the prompts have 1 to 3 tokens\)"):
        model.generate([[1], [1, 2, 3]], max_length=9)


@pytest.mark.parametrize("neutral", [{"min_p": 0.0}, {"min_p": 0}, {"repetition_penalty": 1.0}, {"num_beams": 1},
                                     {"num_return_sequences": 1}, {"output_scores": False},
                                     {"return_dict_in_generate": False}, {"no_repeat_ngram_size": 0},
                                     {"min_new_tokens": 0}, {"max_length": None}])
def test_another_librarys_neutral_setting_is_accepted_and_changes_nothing(neutral):
    model = twin_models(seed=0, vocab_size=40)[0]
    prompt = np.array([[1, 2, 3]])
    assert np.array_equal(model.generate(prompt, 5, seed=4, **neutral), model.generate(prompt, 5, seed=4))


@pytest.mark.parametrize("kw, hint", [({"top_k": 0}, "None is no limit: mamba_ssm's and transformers' top_k=0"),
                                      ({"top_p": 0.0}, "None is no filter, mamba_ssm's top_p=0.0")])
def test_the_other_libraries_off_values_of_top_k_and_top_p_are_explained(kw, hint):
    model = twin_models(seed=0, vocab_size=40)[0]
    with pytest.raises(ValueError, match=hint):
        model.generate(np.array([[1, 2]]), 2, **kw)


@pytest.mark.parametrize("fused", [True, False])
def test_a_top_k_of_the_vocabulary_or_more_keeps_every_token(fused):
    """top_k=10**20 reached the numba sampler as an int64 and failed with numba's TypingError; any k >= the
    vocabulary filters nothing, so it draws what top_k=None draws."""
    model = twin_models(seed=3, vocab_size=40)[0 if fused else 1]
    prompts = np.random.default_rng(3).integers(0, 40, (2, 3))
    free = model.generate(prompts, 12, temperature=1.5, seed=4)
    for k in (40, 10**20):
        assert np.array_equal(model.generate(prompts, 12, temperature=1.5, top_k=k, seed=4), free)
    assert not np.array_equal(model.generate(prompts, 12, temperature=1.5, top_k=2, seed=4), free)


@pytest.mark.parametrize("fused", [True, False])
def test_a_repetition_penalty_that_overflows_a_logit_is_named_not_blamed_on_the_weights(fused):
    """repetition_penalty=1e-310 divided a positive logit past float64's range: the +inf was reported as the
    checkpoint's ("check the checkpoint for NaN/inf weights")."""
    model = twin_models(seed=3, vocab_size=40)[0 if fused else 1]
    prompt = np.arange(20)[None]                                          # many seen tokens, some with logits > 0
    with pytest.raises(ValueError, match=r"repetition_penalty 1e-310 divides the logit .* past float64's range; "
                                         r"give a penalty nearer 1"):
        model.generate(prompt, 3, temperature=0, repetition_penalty=1e-310)
    assert model.generate(prompt, 3, temperature=0, repetition_penalty=1e-3).shape == (1, 23)


@pytest.mark.parametrize("fused", [True, False])
def test_a_huge_repetition_penalty_that_leaves_no_token_is_named_not_blamed_on_the_weights(fused):
    """repetition_penalty=1e308 times every seen logit, all < 0, made the row all -inf: "the model's weights or input
    are not finite ... check the checkpoint" (found by an audit)."""
    model = twin_models(seed=3, vocab_size=40)[0 if fused else 1]
    model.varmap["backbone.norm_f.weight"].data[...] *= 10               # the logits x 10: some below -1.8
    first = next(t for t in range(40) if model(np.array([[t, 0]])).data[0, -1, 0] < -1.8)   # id 0's, then
    with pytest.raises(ValueError, match=r"repetition_penalty 1e\+308 multiplies every finite logit of batch row 0 "
                                         r"\(each of a token seen, each < 0\) past float64's range"):
        model.generate([first, 0], 1, temperature=0, vocab_size=1, repetition_penalty=1e308)
    logits = np.array([[-2.0, 3.0]])
    from tinygrad_ssm.models.mamba2.sampling import sample_next
    assert sample_next(logits, np.random.default_rng(0), 0, repetition_penalty=1e308, seen=np.array([[True, False]])) \
        .tolist() == [1]                                                   # a token left: no error, as transformers


@pytest.mark.parametrize("fused", [True, False])
def test_sampling_settings_given_as_fractions_or_numpy_numbers_sample_as_floats(fused):
    """temperature=Fraction(1, 2) or repetition_penalty=Fraction(3, 2) passed the checks (numbers.Real), then
    failed inside NumPy ("loop of ufunc does not support argument 0 of type float which has no callable exp")."""
    from fractions import Fraction
    model = twin_models(seed=3, vocab_size=40)[0 if fused else 1]
    prompt = np.arange(5)[None]
    as_floats = model.generate(prompt, 6, temperature=0.5, top_p=0.75, repetition_penalty=1.5, top_k=30, seed=2)
    for kw in (dict(temperature=Fraction(1, 2), top_p=Fraction(3, 4), repetition_penalty=Fraction(3, 2)),
               dict(temperature=np.float32(0.5), top_p=np.float64(0.75), repetition_penalty=np.float16(1.5),
                    top_k=np.int8(30))):
        assert np.array_equal(model.generate(prompt, 6, **{"top_k": 30, **kw}, seed=2), as_floats), kw
