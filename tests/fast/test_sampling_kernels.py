"""The numba sampler (fast/sampling_kernels.py) against its spec, sample_next (NumPy): the same ids for drawn logits
(ties, -inf, float32 and float64, padding past `vocab`), temperatures, top-k, top-p, min-p, repetition penalties
and uniform numbers (the ones sample_next draws from its generator), and the same refusal of rows it cannot sample
from; and the spec against transformers' logits processors."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_ssm.fast.sampling_kernels import sample_rows
from tinygrad_ssm.models.mamba2.sampling import NonFiniteLogits, sample_next


class FixedUniforms:
    """A stand-in for np.random.Generator that hands sample_next the given numbers (b, 1)."""

    def __init__(self, uniforms):
        self.uniforms = uniforms

    def random(self, shape):
        return self.uniforms.reshape(shape)


def numba_ids(logits, vocab, temperature, top_k, top_p, uniforms, min_p=None, penalty=None, seen=None):
    """decode_sampled's call of the sampler: None settings as it passes them (no filter, no penalty)."""
    ids = np.full(logits.shape[0], -7, np.int64)
    if seen is None:
        seen = np.zeros((logits.shape[0], 0), bool)                     # (b, 0): no penalty reads it
    bad = sample_rows(logits, vocab, float(temperature), 0 if top_k is None else top_k,
                      1.0 if top_p is None else float(top_p), float(min_p or 0.0),
                      1.0 if penalty is None else float(penalty), seen, uniforms, ids)
    return ids, bad


# ties (and top_p a share of tied tokens, where `ahead < top_p total` is decided by equality) and filtered tokens
logit = st.one_of(st.floats(-30, 30), st.sampled_from([0.0, 0.0, 1.5, -2.0, -math.inf]))


@given(rows=st.lists(st.lists(logit, min_size=6, max_size=6), min_size=1, max_size=4),
       vocab=st.integers(1, 6), dtype=st.sampled_from([np.float64, np.float32]),
       temperature=st.sampled_from([0.0, 1e-310, 0.3, 1.0, 2.5]), top_k=st.one_of(st.none(), st.integers(1, 7)),
       top_p=st.one_of(st.none(), st.floats(0.01, 1.0), st.sampled_from([0.25, 0.5, 0.75])), data=st.data())
def test_the_numba_sampler_draws_sample_nexts_ids(rows, vocab, dtype, temperature, top_k, top_p, data):
    logits = np.array(rows, dtype)                                      # (b, 6): columns past vocab are padding
    for bi in range(len(rows)):
        logits[bi, data.draw(st.integers(0, vocab - 1))] = data.draw(st.floats(-5, 5))  # a finite value a row
    uniforms = np.array(data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=len(rows),
                                           max_size=len(rows))))
    want = sample_next(logits[:, :vocab], FixedUniforms(uniforms), temperature, top_k, top_p)
    ids, bad = numba_ids(logits, vocab, temperature, top_k, top_p, uniforms)
    assert bad == -1
    np.testing.assert_array_equal(ids, want)


@pytest.mark.parametrize("top_k", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_top_k_draws_exactly_the_k_largest_logits_on_both_samplers(top_k, dtype):
    """Uniform numbers spread over [0, 1) draw every one of the k largest logits and nothing else (the k-th largest
    itself included), on sample_next and its numba twin alike: a handful of drawn examples rarely tell a sampler
    that keeps k - 1 tokens from one that keeps k."""
    logits = np.tile(np.array([0.3, 2.0, -1.0, 1.1, 0.7, 1.6], dtype), (200, 1))  # (200, 6), distinct values
    uniforms = (np.arange(200) + 0.5) / 200                                       # (200,) over [0, 1)
    largest = set(np.argsort(-logits[0])[:top_k].tolist())
    want = sample_next(logits, FixedUniforms(uniforms), 1.0, top_k, None)
    ids, bad = numba_ids(logits, 6, 1.0, top_k, None, uniforms)
    assert bad == -1
    assert set(want.tolist()) == largest
    np.testing.assert_array_equal(ids, want)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("row", [[0.0, math.nan, 1.0], [0.0, math.inf, 1.0], [-math.inf] * 3])
def test_the_numba_sampler_refuses_the_rows_sample_next_refuses(row, temperature):
    logits = np.array([[0.0, 1.0, 2.0], row])
    with pytest.raises(NonFiniteLogits, match="batch row 1"):
        sample_next(logits, np.random.default_rng(0), temperature)
    assert numba_ids(logits, 3, temperature, None, None, np.zeros(2))[1] == 1


def test_the_numba_sampler_on_a_real_vocabulary_matches_the_generator_stream():
    """50k logits of float32, the uniforms drawn as sample_next draws them from one seed."""
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((3, 50_304)) * 3).astype(np.float32)
    for kw in ({"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.0, "top_k": 40}, {"temperature": 1.0, "top_k": 1}):
        want = sample_next(logits[:, :50_280], np.random.default_rng(5), **kw)
        ids, bad = numba_ids(logits, 50_280, kw["temperature"], kw.get("top_k"), kw.get("top_p"),
                             np.random.default_rng(5).random(3))
        assert bad == -1
        np.testing.assert_array_equal(ids, want)


@pytest.mark.parametrize("top_p", [0.25, 0.5, 0.75])
def test_top_p_on_tied_tokens_keeps_the_share_of_them_it_reaches(top_p):
    """Four equal logits: the kept tokens are those whose weight ahead is below top_p of the total (exactly 1,
    2 or 3 of them: `ahead < top_p total` is decided by an equality here), whatever the uniform number; the
    higher ids are kept first (transformers' order: a stable ascending sort, the lowest removed first)."""
    logits = np.zeros((1, 4))
    seen = set()
    for u in np.linspace(0, 1, 41, endpoint=False):
        want = sample_next(logits, FixedUniforms(np.array([u])), 1.0, None, top_p)
        ids, _ = numba_ids(logits, 4, 1.0, None, top_p, np.array([u]))
        assert ids[0] == want[0]
        seen.add(int(ids[0]))
    assert seen == set(range(4 - int(top_p * 4), 4))


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-300])
def test_a_tiny_temperature_draws_the_largest_logit_on_both_samplers(temperature):
    """logits / 1e-310 overflowed to inf, inf - inf turned every weight NaN, and both samplers drew token 0 for
    ever; the temperature's limit at 0 is the argmax (a uniform draw among tied largest logits)."""
    logits = np.array([[1.0, 3.0, 2.0], [5.0, -1.0, 5.0], [-2.0, -1e300, -3.0]])
    uniforms = np.array([0.3, 0.9, 0.5])
    want = np.array([1, 2, 0])
    np.testing.assert_array_equal(sample_next(logits, FixedUniforms(uniforms), temperature), want)
    np.testing.assert_array_equal(numba_ids(logits, 3, temperature, None, None, uniforms)[0], want)


class GridUniforms:
    """Uniform numbers spread evenly over [0, 1), one a row: every token of probability > 1/n is drawn."""

    def random(self, shape):
        return ((np.arange(shape[0]) + 0.5) / shape[0]).reshape(shape)


def transformers_scores(logits, temperature, top_k, top_p, min_p=None, penalty=None, seen_ids=()):
    """logits (V,) float64 as transformers' generate processes them, in its order: the repetition penalty on the
    ids seen_ids, then the warpers temperature, top-k, top-p, min-p."""
    torch = pytest.importorskip("torch", reason="torch is an optional reference")
    lp = pytest.importorskip("transformers.generation.logits_process",
                             reason="transformers is an optional reference")
    scores = torch.tensor(logits[None], dtype=torch.float64)
    if penalty is not None:
        scores = lp.RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([list(seen_ids)], dtype=torch.long), scores)
    if temperature != 1.0:
        scores = lp.TemperatureLogitsWarper(temperature)(None, scores)
    if top_k is not None:
        scores = lp.TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1:
        scores = lp.TopPLogitsWarper(top_p)(None, scores)
    if min_p is not None:
        scores = lp.MinPLogitsWarper(min_p)(None, scores)
    return scores[0].numpy()


def transformers_kept(logits, temperature, top_k, top_p, min_p=None):
    """The ids transformers' warpers leave finite."""
    return set(np.flatnonzero(np.isfinite(transformers_scores(logits, temperature, top_k, top_p, min_p))).tolist())


@pytest.mark.parametrize("logits, top_p", [(np.log([0.5, 0.25, 0.25]), 0.75), (np.log([0.25, 0.25, 0.5]), 0.75),
                                           (np.log([0.4, 0.3, 0.3]), 0.5), (np.zeros(4), 0.5),
                                           (np.array([1.0, 0.0, 1.0, 0.0, 1.0]), 0.3)])
def test_top_p_keeps_the_tied_tokens_transformers_keeps(logits, top_p):
    """Among tokens of equal probability at the nucleus' edge the higher id stays (transformers sorts ascending,
    stably, and removes from the bottom): [0.5, 0.25, 0.25] at top_p 0.75 keeps ids 0 and 2, not 0 and 1."""
    n = 4000
    rows = np.repeat(logits[None], n, axis=0)
    drawn = set(sample_next(rows, GridUniforms(), 1.0, None, top_p).tolist())
    ids, bad = numba_ids(rows, len(logits), 1.0, None, top_p, GridUniforms().random((n, 1))[:, 0])
    assert bad == -1 and set(ids.tolist()) == drawn
    assert drawn == transformers_kept(logits, 1.0, None, top_p)


@given(logits=st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.0, 1.0, 2.5]), min_size=2, max_size=8),
       temperature=st.sampled_from([0.5, 1.0, 1.5]), top_k=st.one_of(st.none(), st.integers(1, 4)),
       top_p=st.one_of(st.none(), st.sampled_from([0.1, 0.3, 0.5, 0.8, 0.95])))
def test_the_drawable_ids_are_those_transformers_warpers_keep(logits, temperature, top_k, top_p):
    """Small-integer logits (many ties): the set of ids either sampler can draw is the set transformers keeps."""
    logits = np.array(logits)
    n = 2000
    rows = np.repeat(logits[None], n, axis=0)
    drawn = set(sample_next(rows, GridUniforms(), temperature, top_k, top_p).tolist())
    ids, _ = numba_ids(rows, len(logits), temperature, top_k, top_p, GridUniforms().random((n, 1))[:, 0])
    assert set(ids.tolist()) == drawn
    kept = transformers_kept(logits, temperature, top_k, top_p)
    # a kept token of probability below 1/n may go undrawn: compare to those the grid reaches
    probs = np.exp(logits / temperature - np.max(logits / temperature))
    probs = np.where(np.isin(np.arange(len(logits)), list(kept)), probs, 0)
    assert drawn == {i for i in kept if probs[i] / probs.sum() > 2 / n}


# --- min_p and the repetition penalty ----------------------------------------------------------------------------

@given(rows=st.lists(st.lists(logit, min_size=6, max_size=6), min_size=1, max_size=4),
       vocab=st.integers(1, 6), dtype=st.sampled_from([np.float64, np.float32]),
       temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]), top_k=st.one_of(st.none(), st.integers(1, 7)),
       top_p=st.one_of(st.none(), st.sampled_from([0.25, 0.5, 0.9])),
       min_p=st.one_of(st.none(), st.floats(0, 1), st.sampled_from([0.0, 0.1, 0.5, 1.0])),
       penalty=st.one_of(st.none(), st.floats(0.05, 20), st.sampled_from([1.0, 1.3, 0.7])), data=st.data())
def test_the_numba_sampler_draws_sample_nexts_ids_with_min_p_and_a_penalty(rows, vocab, dtype, temperature, top_k,
                                                                           top_p, min_p, penalty, data):
    logits = np.array(rows, dtype)                                      # (b, 6): columns past vocab are padding
    for bi in range(len(rows)):
        logits[bi, data.draw(st.integers(0, vocab - 1))] = data.draw(st.floats(-5, 5))  # a finite value a row
    seen = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=vocab, max_size=vocab),
                                       min_size=len(rows), max_size=len(rows))), bool).reshape(len(rows), vocab)
    uniforms = np.array(data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=len(rows),
                                           max_size=len(rows))))
    want = sample_next(logits[:, :vocab], FixedUniforms(uniforms), temperature, top_k, top_p, min_p, penalty, seen)
    penalised = penalty is not None and penalty != 1
    ids, bad = numba_ids(logits, vocab, temperature, top_k, top_p, uniforms, min_p, penalty,
                         seen if penalised else None)
    assert bad == -1
    np.testing.assert_array_equal(ids, want)


@pytest.mark.parametrize("penalty", [0.5, 1.3, 3.0])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_penalised_row_is_sampled_as_transformers_repetition_penalty_makes_it(penalty, temperature):
    """Logits of both signs, half the ids seen: greedy takes transformers' argmax, and at temperature 1 the grid's
    draws (n evenly spread uniform numbers) fall on each id as often as its probability there says, to 1/n: the
    penalty divides a seen positive logit and multiplies a seen negative one, on both samplers."""
    logits = np.array([2.0, -1.0, 1.5, -0.5, 0.8, -2.0, 0.1, 1.9])      # (8,) distinct, both signs
    seen_ids = [0, 1, 4, 6]
    seen = np.isin(np.arange(8), seen_ids)[None]                          # (1, 8)
    theirs = transformers_scores(logits, 1.0, None, None, penalty=penalty, seen_ids=seen_ids)
    n = 4000
    rows = np.repeat(logits[None], n, axis=0)
    drawn = sample_next(rows, GridUniforms(), temperature, repetition_penalty=penalty, seen=np.repeat(seen, n, 0))
    ids, bad = numba_ids(rows, 8, temperature, None, None, GridUniforms().random((n, 1))[:, 0], None, penalty,
                         np.repeat(seen, n, 0))
    assert bad == -1
    np.testing.assert_array_equal(ids, drawn)
    if temperature == 0:
        assert set(drawn.tolist()) == {int(np.argmax(theirs))}
        assert (int(np.argmax(theirs)) != int(np.argmax(logits))) == (penalty > 1)   # the seen 2.0 falls below 1.9
    else:
        probs = np.exp(theirs - theirs.max()) / np.exp(theirs - theirs.max()).sum()
        np.testing.assert_allclose(np.bincount(drawn, minlength=8) / n, probs, atol=1.0 / n + 1e-12)


@given(logits=st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.0, 1.0, 2.5]), min_size=2, max_size=8),
       temperature=st.sampled_from([0.5, 1.0, 1.5]), top_k=st.one_of(st.none(), st.integers(1, 4)),
       top_p=st.one_of(st.none(), st.sampled_from([0.3, 0.8])), min_p=st.sampled_from([0.05, 0.2, 0.5, 1.0]))
def test_the_drawable_ids_with_min_p_are_those_transformers_warpers_keep(logits, temperature, top_k, top_p, min_p):
    """min_p after top-k and top-p, as transformers' MinPLogitsWarper comes after them: a token stays if its
    probability is at least min_p times the likeliest's (min_p 1 keeps the likeliest and its ties)."""
    logits = np.array(logits)
    n = 2000
    rows = np.repeat(logits[None], n, axis=0)
    drawn = set(sample_next(rows, GridUniforms(), temperature, top_k, top_p, min_p).tolist())
    ids, _ = numba_ids(rows, len(logits), temperature, top_k, top_p, GridUniforms().random((n, 1))[:, 0], min_p)
    assert set(ids.tolist()) == drawn
    kept = transformers_kept(logits, temperature, top_k, top_p, min_p)
    probs = np.exp(logits / temperature - np.max(logits / temperature))
    probs = np.where(np.isin(np.arange(len(logits)), list(kept)), probs, 0)
    assert drawn == {i for i in kept if probs[i] / probs.sum() > 2 / n}


@pytest.mark.parametrize("kw, message", [
    ({"min_p": -0.1}, r"min_p must be None or in \[0, 1\]"), ({"min_p": 1.5}, "min_p must be"),
    ({"min_p": True}, "min_p must be"), ({"repetition_penalty": 0.0}, "repetition_penalty must be None or a finite"),
    ({"repetition_penalty": -1.2}, "repetition_penalty must be"), ({"repetition_penalty": math.inf}, "repetition_pen"),
    ({"repetition_penalty": math.nan}, "repetition_penalty must be"), ({"repetition_penalty": True}, "repetition_p"),
])
def test_a_bad_min_p_or_repetition_penalty_is_named(kw, message):
    from tinygrad_ssm.models.mamba2.sampling import check_sampling_args
    with pytest.raises(ValueError, match=message):
        check_sampling_args(1.0, None, None, **kw)


@pytest.mark.parametrize("seen", [None, np.zeros((1, 2), bool)])
def test_a_penalty_without_the_seen_ids_of_the_logits_shape_is_named(seen):
    """np.where(None, penalised, logits) penalises nothing: a penalty with no table, or one of another shape, is
    refused rather than silently left out."""
    with pytest.raises(ValueError, match=r"a repetition_penalty needs seen, a bool array of the logits' shape "
                                         r"\(1, 3\)"):
        sample_next(np.zeros((1, 3)), np.random.default_rng(0), 1.0, repetition_penalty=1.3, seen=seen)
