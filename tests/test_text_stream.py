"""The text generate streams (train/generate.py's _text_of, which stream_text and --batch-file's generate_batch both
go through), for a byte-level BPE (GPT-NeoX's kind) and a byte-fallback one (Llama's <0xNN> tokens, whose
ByteFallback decoder turns a whole invalid run of byte tokens into one U+FFFD each): joined, the pieces are the
decode of the prompt and all the ids less the prompt's text, and every piece ends where that decode can go on
(never half a character, never text a later byte changes)."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support.tokenizers import train_bpe, train_byte_fallback
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train.generate import _text_of, generate_batch

TEXTS = ["héllo wörld ça va? naïve café 日本語 the state space model decodes one token at a time " * 20,
         "def main():\n    return [x * 2 for x in range(10)]  # a comment, with punctuation!\n" * 20]
PROMPTS = ["héllo wörld", "x", "😀", "a b", " 日本", "café ", "", "😀😀", "漢字"]  # (runs past STREAM_CONTEXT)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    fallback = FileTokenizer(train_byte_fallback(TEXTS, folder / "llama") / "tokenizer.json")
    byte_level = FileTokenizer(train_bpe(TEXTS, folder / "neox.json", byte_level_post_processor=True))
    assert len(fallback.byte_fallback_ids) == 256 and not byte_level.byte_fallback_ids
    return {"byte_fallback": fallback, "byte_level": byte_level}


def _check(tok, prompt_text: str, new: list[int]):
    prompt = tok.encode(prompt_text)
    new = [i for i in new if i != tok.eos_token_id]
    whole, before = tok.decode([*prompt, *new]), tok.decode(prompt)
    # a prompt that ends in byte tokens (😀 for the byte-fallback one) and new byte tokens that make its run
    # invalid change the prompt's own text: no stream can print the difference, so that case is left out here
    assume(whole.startswith(before))
    pieces = list(_text_of(tok, prompt, iter(new), True))
    assert "".join(pieces) == whole[len(before):]
    out = before
    for piece in pieces[:-1]:
        out += piece
        assert whole.startswith(out) and not piece.endswith("\ufffd"), pieces   # no text a later id changes


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["byte_fallback", "byte_level"]), prompt=st.sampled_from(PROMPTS),
       new=st.lists(st.one_of(st.integers(0, 10**6), st.integers(0, 10**6).map(lambda i: -1 - i % 256)),
                    min_size=1, max_size=14))
def test_the_stream_joined_is_the_decode_of_all_ids(tokenizers, kind, prompt, new):
    """Random ids, half of them byte tokens (<0xNN> for the byte-fallback tokenizer, the last 256 ids of the
    byte-level one): the ids that ruin a run, a run cut short, bytes of characters split across tokens."""
    tok = tokenizers[kind]
    byte_ids = sorted(tok.byte_fallback_ids) or list(range(tok.vocab_size - 256, tok.vocab_size))
    ids = [byte_ids[-1 - i] if i < 0 else i % tok.vocab_size for i in new]
    _check(tok, prompt, ids)


def test_an_invalid_run_is_printed_once_as_the_decode_prints_it(tokenizers):
    """The QA cases: D2 BD is a character, but D2 BD FF is an invalid run (three U+FFFD in the decode, where the
    stream printed the character and one U+FFFD); 7C 21 C3 printed '|!' and then '�' for three U+FFFD."""
    tok = tokenizers["byte_fallback"]
    b = {x: tok._tok.token_to_id(f"<0x{x:02X}>") for x in range(256)}
    prompt = tok.encode("a")
    for run in ([0xD2, 0xBD, 0xFF], [0x7C, 0x21, 0xC3], [0xC3, 0xA9, 0xE2], [0xC3, 0xA9]):
        for tail in ([], tok.encode("x")[-1:].tolist()):
            ids = [b[x] for x in run] + tail
            pieces = list(_text_of(tok, prompt, iter(ids), True))
            assert "".join(pieces) == tok.decode([*prompt, *ids])[len(tok.decode(prompt)):]
            assert len(pieces) == 1                              # held until a non-byte token (or the end)
    ids = [b[0xC3], b[0xA9], *tok.encode("x y").tolist()[1:]]
    pieces = list(_text_of(tok, prompt, iter(ids), True))
    assert pieces[0].startswith("é") and "".join(pieces) == tok.decode([*prompt, *ids])[1:]



def test_a_special_token_inside_a_byte_run_does_not_end_it(tokenizers):
    """decode skips a special token, so the byte tokens on either side of it form one run (C3 A9 <s> FF decodes as
    the invalid run C3 A9 FF: three U+FFFD): the stream holds the run across the special token, never printing the
    'é' that the next byte turns into U+FFFD."""
    tok = tokenizers["byte_fallback"]
    b = {x: tok._tok.token_to_id(f"<0x{x:02X}>") for x in range(256)}
    prompt = tok.encode("a")
    specials = sorted(tok.skipped_ids - {tok.eos_token_id})
    assert specials
    for special in specials:
        ids = [b[0xC3], b[0xA9], special, b[0xFF]]
        whole = tok.decode([*prompt, *ids])[len(tok.decode(prompt)):]
        assert whole == "\ufffd" * 3
        assert list(_text_of(tok, prompt, iter(ids), True)) == [whole]

def test_a_prompt_ending_in_a_byte_run_longer_than_the_context_is_decoded_with_all_of_it(tokenizers):
    """The stream decodes the prompt's last ids with the new ones; cut inside the prompt's byte run (😀😀: eight
    byte tokens, more than STREAM_CONTEXT), that run is invalid alone and a new byte token that continues it (y) came
    out as U+FFFD where the decode of all ids has 'y' (漢字: six byte tokens, cut inside 漢; 😀😀 happens to be cut
    between its characters, but is checked too)."""
    tok = tokenizers["byte_fallback"]
    b = {x: tok._tok.token_to_id(f"<0x{x:02X}>") for x in range(256)}
    for text in ("漢字", "😀😀"):
        prompt = tok.encode(text)
        assert all(i in tok.byte_fallback_ids for i in prompt[-len(text.encode()):])
        ids = [b[ord("y")], *tok.encode("x y").tolist()[-1:]]
        whole = tok.decode([*prompt, *ids])
        assert whole.startswith(text + "y")
        assert "".join(_text_of(tok, prompt, iter(ids), True)) == whole[len(tok.decode(prompt)):]


def test_the_prompts_byte_run_is_followed_back_across_a_special_token_inside_it(tokenizers):
    """A special token inside the prompt's byte run (E6 BC <s> A2 E5 AD 97: decode skips it, the run is 漢字) does
    not end it: the context goes back to the run's start (E6), or its cut run A2 E5 AD 97 is invalid and a new byte
    token that continues it (y) came out as U+FFFD."""
    tok = tokenizers["byte_fallback"]
    b = {x: tok._tok.token_to_id(f"<0x{x:02X}>") for x in range(256)}
    run = "漢字".encode()
    special = max(tok.skipped_ids)
    prompt = np.array([*tok.encode("a"), b[run[0]], b[run[1]], special, *(b[x] for x in run[2:])])
    ids = [b[ord("y")], *tok.encode("x y").tolist()[-1:]]
    whole = tok.decode([*prompt, *ids])
    assert whole.startswith(tok.decode(prompt)) and tok.decode(prompt).endswith("漢字") and "字y" in whole
    assert "".join(_text_of(tok, prompt, iter(ids), True)) == whole[len(tok.decode(prompt)):]


@pytest.mark.parametrize("kind", ["byte_fallback", "byte_level"])
def test_a_prompt_ending_in_special_tokens_keeps_the_space_before_the_first_new_word(tokenizers, kind):
    """decode skips special tokens, and Llama's decoder strips the space of the first token with text (Strip, as a
    Metaspace decoder does): a context of special tokens alone (a prompt ending in STREAM_CONTEXT of them) gave the
    first new word without the space the decode of all ids has."""
    tok = tokenizers[kind]
    special = max(tok.skipped_ids)
    prompt = np.array([*tok.encode("a b"), *[special] * 6])
    space = "\u2581" if kind == "byte_fallback" else "\u0120"            # a space as the vocabulary writes it
    ids = [tok._tok.token_to_id(t) for t in (space, "t", "h", "e")] * 2     # " the" twice
    whole = tok.decode([*prompt, *ids])
    assert whole.endswith("b the the")
    assert "".join(_text_of(tok, prompt, iter(ids), True)) == whole[len(tok.decode(prompt)):]

def test_the_batch_file_path_prints_the_same_text(tokenizers):
    """generate_batch decodes each row through the same _text_of: a byte-fallback row is its decode too."""
    tok = tokenizers["byte_fallback"]
    b = {x: tok._tok.token_to_id(f"<0x{x:02X}>") for x in range(256)}
    rows = [[b[0xD2], b[0xBD], b[0xFF], 100], [b[0xC3], b[0xA9], 101, b[0xE2]]]

    class Fixed:                                                 # generate's output: each prompt, then its row
        def generate(self, prompts, n, **kw):
            return [np.concatenate([p, r]) for p, r in zip(prompts, rows)]

    texts = [result.text for result in generate_batch(Fixed(), ["a", "b"], 4, tok, temperature=0)]
    for prompt, row, text in zip(["a", "b"], rows, texts):
        ids = tok.encode(prompt)
        assert text == tok.decode([*ids, *row])[len(tok.decode(ids)):]
