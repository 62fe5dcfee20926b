"""models/mamba2/evaluation.py: a text scored in windows with the state carried equals one plain forward over it
(float64, 1e-10) whatever the window, on the fused model and the engine-op one; bad arguments are named."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.models import small_config
from tinygrad_ssm import Mamba2LMHeadModel, VarMap
from tinygrad_ssm.models.mamba2.evaluation import evaluate, evaluate_pieces

MODELS = {fused: Mamba2LMHeadModel(small_config(), VarMap(seed=0), dtype="float64", fused=fused)
          for fused in (True, False)}


@given(n=st.integers(2, 90), window=st.integers(1, 100), fused=st.booleans(), seed=st.integers(0, 2**16))
def test_windows_with_the_state_carried_equal_one_forward(n, window, fused, seed):
    model = MODELS[fused]
    ids = np.random.default_rng(seed).integers(0, 50, n)                  # (n,)
    whole = float(model.loss(ids[None, :-1], ids[None, 1:]).data)
    result = evaluate(model, ids, window)
    assert result.tokens == n - 1 and result.windows == -(-(n - 1) // window)
    assert abs(result.mean_nats - whole) < 1e-10
    assert result.perplexity == pytest.approx(np.exp(whole)) and result.bits_per_token == pytest.approx(
        whole / np.log(2))



def test_bits_per_byte_are_the_texts_total_bits_over_its_bytes():
    """41 ids scored: 40 predictions. Over the 40 bytes they stand for (a byte model's), bits per byte equal bits
    per token; over 80 bytes (two bytes a token) half of them: the total, not the mean, over the bytes."""
    result = evaluate(MODELS[True], np.random.default_rng(2).integers(0, 50, 41), 16)
    assert result.tokens == 40
    assert result.bits_per_byte(40) == pytest.approx(result.bits_per_token, rel=1e-12)
    assert result.bits_per_byte(80) == pytest.approx(result.bits_per_token / 2, rel=1e-12)
    assert result.bits_per_byte(np.int64(40)) == result.bits_per_byte(40)
    for wrong in (0, -5, 40.0, True):   # 0 was a bare ZeroDivisionError, -5 a negative figure
        with pytest.raises(ValueError, match=f"bits_per_byte: n_bytes must be an int >= 1.*got {wrong!r}"):
            result.bits_per_byte(wrong)

def test_resetting_the_state_scores_each_window_alone():
    model, ids = MODELS[True], np.random.default_rng(1).integers(0, 50, 41)
    alone = [float(model.loss(ids[None, s:s + 10], ids[None, s + 1:s + 11]).data) for s in range(0, 40, 10)]
    assert abs(evaluate(model, ids, 10, carry_state=False).mean_nats - np.mean(alone)) < 1e-10


@pytest.mark.parametrize("ids,window,message", [
    (np.zeros((2, 3), np.int64), 4, "ids must be a 1-D array"),
    (np.zeros(1, np.int64), 4, "at least 2 tokens"),
    (np.zeros(5, np.float64), 4, "ids must be a 1-D array of token ids"),
    (np.zeros(5, np.int64), 0, "window must be an int >= 1"),
    # the last id is only a target: -100 (cross entropy's ignore_index) was skipped but counted, silently
    (np.array([1, 2, -100]), 4, r"ids must be token ids in \[0, \d+\), got -100 at position 2"),
    (np.array([1, 2, -1]), 4, r"got -1 at position 2"),
])
def test_bad_arguments_are_named(ids, window, message):
    with pytest.raises(ValueError, match=message):
        evaluate(MODELS[True], ids, window)


@given(n=st.integers(2, 60), window=st.integers(1, 20), cuts=st.lists(st.integers(0, 60), max_size=6),
       carry_state=st.booleans())
def test_ids_given_in_pieces_score_as_the_whole(n, window, cuts, carry_state):
    """eval reads a long text a piece at a time (its memory flat in the text's length): the windows, so the
    numbers, are those of the whole ids, however the pieces fall (empty ones too)."""
    model, ids = MODELS[True], np.random.default_rng(n).integers(0, 50, n)
    bounds = [0, *sorted(cuts), n]
    pieces = [ids[a:b] for a, b in zip(bounds, bounds[1:])]
    whole = evaluate(model, ids, window, carry_state=carry_state)
    assert evaluate_pieces(model, iter(pieces), window, carry_state=carry_state) == whole


def test_pieces_are_read_as_they_are_scored():
    """A window is scored as soon as its ids have come: the pieces are not gathered first."""
    model, scored, read = MODELS[True], [], []

    def pieces():
        for start in range(0, 40, 8):
            read.append(len(scored))
            yield np.arange(start, start + 8) % 50

    evaluate_pieces(model, pieces(), 4, progress=scored.append)
    assert read == [0, 1, 3, 5, 7]                                        # windows scored before each piece came
    with pytest.raises(ValueError, match="at least 2 tokens"):
        evaluate_pieces(model, iter([np.zeros(1, np.int64), np.zeros(0, np.int64)]), 4)


def test_a_bad_id_in_a_later_piece_is_named_at_its_position_in_the_text():
    vocab = MODELS[True].config.padded_vocab_size
    with pytest.raises(ValueError, match=rf"got {vocab} at position 7"):
        evaluate_pieces(MODELS[True], [np.arange(5), np.array([1, 2, vocab])], window=2)

