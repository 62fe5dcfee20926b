"""tokenizer.py and text_stream.py: bytes and tokenizer.json read alike; TextStream never prints half a character and, joined, prints
exactly what decoding every id at once prints; a tokenizer that does not fit a model is refused, naming both sizes."""
import importlib.util
import json
import warnings

import numpy as np

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tinygrad_ssm.text_stream import TextStream
from tinygrad_ssm.tokenizer import ByteTokenizer, FileTokenizer, TokenizerError, check_fits, find_tokenizer, load_tokenizer

TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


def _streamed(tok, ids, context=()) -> list[str]:
    stream = TextStream(tok, context)
    pieces = [stream.push(i) for i in ids]
    return [p for p in pieces + [stream.finish()] if p]


@given(text=TEXTS)
def test_bytes_round_trip_and_stream_in_whole_characters(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    pieces = _streamed(tok, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)  # valid UTF-8 in: no piece holds a cut character


@given(ids=st.lists(st.integers(0, 300), max_size=30))
def test_bytes_stream_of_any_ids_equals_decoding_them_at_once(ids):
    tok = ByteTokenizer()  # invalid UTF-8 and padded-vocabulary ids (>= 256) included: U+FFFD, never an exception
    assert "".join(_streamed(tok, ids)) == tok.decode(ids)


def test_a_stray_byte_is_held_until_it_cannot_start_a_character():
    tok = ByteTokenizer()
    euro = list("€".encode())
    assert _streamed(tok, [ord("a"), *euro, 0xFF, *euro[:2], ord("z")]) == ["a", "€", "\ufffd\ufffdz"]
    assert _streamed(tok, euro[:2]) == ["\ufffd"]  # cut short at the end


@pytest.fixture(scope="module")
def bpe(bpe_tokenizer):
    return FileTokenizer(bpe_tokenizer)


@given(text=TEXTS)
def test_bpe_stream_equals_the_text(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    pieces = _streamed(bpe, ids)
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


@given(ids=st.lists(st.integers(1, 330), max_size=30), context=st.lists(st.integers(1, 319), max_size=6))
def test_bpe_stream_of_any_ids_equals_decoding_them_with_their_context(bpe, ids, context):
    """Ids past the vocabulary (320: a padded one's rows) included."""
    whole, before = bpe.decode(context + ids), bpe.decode(context)
    if whole.startswith(before):  # (a byte-level BPE: always, unless the context ends inside a character)
        assert "".join(_streamed(bpe, ids, context)) == whole[len(before):]


def test_bpe_ids_past_the_vocabulary_are_replaced_where_they_stand_and_the_stream_goes_on(bpe):
    """A padded vocabulary's id (past the tokenizer's 320) is one U+FFFD in its place, and the text after it
    streams as it comes (it was appended at the end, and the stream held everything back from there on)."""
    first, second = bpe.encode("def f(a"), bpe.encode(", b):")
    ids = [*first, 325, *second, 330, *bpe.encode(" x")]
    assert bpe.decode(ids) == "def f(a\ufffd, b):\ufffd x"
    stream = TextStream(bpe)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == bpe.decode(ids) and stream.finish() == ""
    assert "".join(pieces[:len(first) + 1 + len(second)]) == "def f(a\ufffd, b):"


def test_bpe_finds_its_eos_and_skips_it_in_text(bpe):
    assert bpe.eos_token_id == 0 and bpe.vocab_size == 320
    assert bpe.decode([0, *bpe.encode("ab")]) == "ab"


def test_find_tokenizer_reads_the_folder_and_checks_the_vocabulary(bpe_tokenizer, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    assert find_tokenizer(tmp_path, 320).vocab_size == 320          # exactly the model's rows: fits
    with pytest.raises(TokenizerError, match="has 320 tokens but the model .* has a vocabulary of 319"):
        find_tokenizer(tmp_path, 319)                                # one token more than the model has rows
    with pytest.raises(TokenizerError, match="has 320 tokens but the model .* has a vocabulary of 256"):
        find_tokenizer(tmp_path, 256)
    with pytest.raises(TokenizerError, match="holds no tokenizer.json .* vocabulary of 50280 .* --tokenizer"):
        find_tokenizer(tmp_path / "elsewhere", 50280)
    assert find_tokenizer(tmp_path / "elsewhere", 256).name == "bytes"



def test_a_checkpoints_own_tokenizer_comes_before_its_run_folders(bpe_tokenizer, tmp_path):
    """Each checkpoint of a run holds the tokenizer.json it was trained with; the run folder's is read only for a
    checkpoint without one, and the folder two up is never read for a folder that is not a run's checkpoint."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step-000002"
    checkpoint.mkdir(parents=True)
    for folder in (run, checkpoint):
        (folder / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    assert find_tokenizer(checkpoint, 320).name == str(checkpoint / "tokenizer.json")
    (checkpoint / "tokenizer.json").unlink()
    assert find_tokenizer(checkpoint, 320).name == str(run / "tokenizer.json")
    elsewhere = run / "models" / "m"                                  # run/tokenizer.json is two folders up
    elsewhere.mkdir(parents=True)
    with pytest.raises(TokenizerError, match="holds no tokenizer.json"):
        find_tokenizer(elsewhere, 320)


def test_find_tokenizer_takes_the_eos_id_the_model_folder_states(bpe_tokenizer, tmp_path):
    """A transformers config.json's eos_token_id (load_tokenizer_for passes it) over the tokenizer's own EOS name,
    for the folder's tokenizer.json and for --tokenizer's alike."""
    (tmp_path / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    assert find_tokenizer(tmp_path, 320).eos_token_id == 0                      # <|endoftext|>, found by name
    assert find_tokenizer(tmp_path, 320, eos_token_id=5).eos_token_id == 5
    assert find_tokenizer(tmp_path / "elsewhere", 320, override=str(bpe_tokenizer), eos_token_id=5).eos_token_id == 5


def test_a_tokenizer_far_smaller_than_the_models_vocabulary_is_refused(bpe_tokenizer, tmp_path):
    """Padding adds at most PADDING_ROWS rows past a tokenizer's ids: more rows than that mean the tokenizer is
    not the model's (--tokenizer bytes on a BPE model), and most of the model's ids would have no text."""
    (tmp_path / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    assert find_tokenizer(tmp_path, 320 + 128).vocab_size == 320    # padded by 128 rows: the most that fits
    with pytest.raises(TokenizerError, match="has 320 tokens but the model .* has a vocabulary of 449: 129 of its "
                                             "ids would have no text"):
        find_tokenizer(tmp_path, 320 + 129)
    with pytest.raises(TokenizerError, match="has 256 tokens but the model .* vocabulary of 50280: 50024 of"):
        find_tokenizer(tmp_path, 50280, override="bytes")

def test_a_tokenizer_other_than_the_models_own_is_used_with_a_warning(bpe_tokenizer, tmp_path):
    """--tokenizer bytes on a folder whose model was trained on a 320-token BPE fits the size check (320 rows are
    256 + 64 of padding), and every text would come out wrong: the override is taken, with a warning naming both
    tokenizers; one of the same vocabulary, or a folder with no tokenizer of its own, gives none."""
    (tmp_path / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    with pytest.warns(UserWarning, match=r"--tokenizer 'bytes' \(256 tokens\) replaces the tokenizer of the model "
                                         r"in .* \(320 tokens\), which it was trained with"):
        assert find_tokenizer(tmp_path, 320, override="bytes").name == "bytes"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_tokenizer(tmp_path, 320, override=str(bpe_tokenizer)).vocab_size == 320   # the same one
        assert find_tokenizer(tmp_path / "elsewhere", 320, override=str(bpe_tokenizer)).vocab_size == 320
        assert find_tokenizer(tmp_path / "elsewhere", 256, override="bytes").name == "bytes"
    small_run = tmp_path / "small"                                    # a run of ours trained on bytes
    small_run.mkdir()
    with pytest.warns(UserWarning, match=r"\(320 tokens\) replaces .* 'bytes' \(256 tokens\)"):
        find_tokenizer(small_run, 320, override=str(bpe_tokenizer), is_our_run=True)


def test_bad_tokenizer_files_are_named(tmp_path):
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a tokenizer.json the tokenizers library can read"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="has 256 tokens but .* vocabulary of 100"):
        check_fits(ByteTokenizer(), 100, "model")
    with pytest.raises(TokenizerError, match="has 256 tokens but .* vocabulary of 255"):
        check_fits(ByteTokenizer(), 255, "model")
    check_fits(ByteTokenizer(), 256, "model")                         # as many rows as bytes: fits
    check_fits(ByteTokenizer(), 256 + 128, "model")                   # and rows of padding past them
    with pytest.raises(TokenizerError, match="has 256 tokens but .* vocabulary of 3008: 2752 of its ids"):
        check_fits(ByteTokenizer(), 3008, "model")                    # --tokenizer bytes on a BPE model
    assert isinstance(load_tokenizer("bytes"), ByteTokenizer)
    assert np.array_equal(ByteTokenizer().encode("é"), [0xC3, 0xA9])


def test_files_of_another_kind_in_a_tokenizers_place_are_named_with_the_fix(bpe_tokenizer, tmp_path):
    """A Git LFS pointer (a clone made without git-lfs), a vocab.json (with a token "model" in it), a
    tokenizer_config.json, and a folder of a slow tokenizer's files (vocab.json + merges.txt, tokenizer.model) gave
    the JSON parser's "expected value at line 1 column 1" or "holds no tokenizer.json" alone (the tokenizer audit)."""
    lfs = tmp_path / "lfs" / "tokenizer.json"
    lfs.parent.mkdir()
    lfs.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab12\nsize 2113710\n")
    with pytest.raises(TokenizerError, match=r"is a Git LFS pointer, not the file .* git lfs pull"):
        load_tokenizer(lfs)
    slow = tmp_path / "slow"
    slow.mkdir()
    vocab = json.loads(bpe_tokenizer.read_text(encoding="utf-8"))["model"]["vocab"]
    (slow / "vocab.json").write_text(json.dumps({**vocab, "model": len(vocab)}))
    (slow / "merges.txt").write_text("#version: 0.2\n")
    fix = r"holds no tokenizer.json, only vocab.json, merges.txt .* AutoTokenizer.from_pretrained"
    with pytest.raises(TokenizerError, match=r"it is a vocab.json \(token -> id\); .*" + fix):
        load_tokenizer(slow / "vocab.json")
    with pytest.raises(TokenizerError, match=fix):
        load_tokenizer(slow)                                            # --tokenizer DIR
    with pytest.raises(TokenizerError, match=fix):
        find_tokenizer(slow, 320)                                       # --model DIR
    spm = tmp_path / "spm"
    spm.mkdir()
    (spm / "tokenizer.model").write_bytes(b"\n\x0e\n\x05<unk>")
    with pytest.raises(TokenizerError, match=r"only tokenizer.model \(a tokenizer in transformers' slow format"):
        find_tokenizer(spm, 320)
    (tmp_path / "none").mkdir()
    with pytest.raises(TokenizerError, match=r"'.*none' holds no tokenizer.json and its model has a vocabulary of 320"):
        find_tokenizer(tmp_path / "none", 320)
    config = tmp_path / "with_config"
    config.mkdir()
    (config / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    (config / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPTNeoXTokenizer"}))
    with pytest.raises(TokenizerError, match=r"it is a tokenizer_config.json; give '.*with_config/tokenizer.json'"):
        load_tokenizer(config / "tokenizer_config.json")


# fragments whose joins hit every case of a cut: whitespace runs before a line break, a line break before an added
# token (the library splits those out first), invalid and cut UTF-8, a combining accent, Unicode spaces (each lead
# byte that starts one), letters of other scripts (a line may start with one)
FRAGMENTS = [" ", "\n", "\n\n", "\t", "\r", "a", "B", "1", ".", "'", "'s", "é", "\u00a0", "\u2028", "😀", "\u0301",
             "<", "<|endoftext|>", b"\xff", b"\xe2\x82", "ж", "中文", "\u3000", "\u1680", "\u0085", b"\x80", b"\xc2"]
LONG_TEXTS = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=40).map(
    lambda parts: b"".join(p if isinstance(p, bytes) else p.encode() for p in parts))


@pytest.fixture(scope="module")
def byte_level_tokenizers(tmp_path_factory):
    """A BPE that merges whitespace runs with line breaks (ĊĊ, ĠĊĊ, čĊ: a wrong cut changes its tokens), and the
    same laid out as GPT-NeoX's is: an NFC normalizer and a ByteLevel post_processor."""
    from tokenizers import Tokenizer, normalizers, processors

    from tests.support.tokenizers import train_bpe
    folder = tmp_path_factory.mktemp("byte_level")
    path = train_bpe(["word.\n\nnext  \nline \n\n\tx\n<|endoftext|>\n\ny \u00a0\nz\r\n" * 50], folder / "bpe.json",
                     vocab_size=300)
    tok = Tokenizer.from_file(str(path))
    tok.normalizer, tok.post_processor = normalizers.NFC(), processors.ByteLevel(trim_offsets=True)
    tok.save(str(folder / "neox_like.json"))
    return FileTokenizer(path), FileTokenizer(folder / "neox_like.json")


@given(text=LONG_TEXTS, piece_bytes=st.integers(1, 8), cut=st.integers(0, 40))
@example(text=b"ab.\n\nM\ty \n\nz" + b"x" * 16, piece_bytes=1, cut=2)   # cut after a line break: "\n\n" at the end
@example(text=b"a\n\n<|endoftext|>b" + b"x" * 16, piece_bytes=1, cut=3)  # before an added token (two blocks)
@example(text="a \n\n\u00a0b\r\nc".encode() + b"x" * 16, piece_bytes=1, cut=0)  # Unicode spaces, Windows line ends
@example(text="строка\nпривет\n中文\nΩμ\n\u0301é\n\u3000y\n\u2003z\n\u1680v\n\u0085u".encode() + b"x" * 16,
         piece_bytes=1, cut=0)                                        # lines of other scripts; non-ASCII spaces
def test_a_long_text_is_tokenized_in_pieces_into_the_tokens_of_the_whole(byte_level_tokenizers, text, piece_bytes,
                                                                         cut):
    """A text of more than PIECE_BYTES is tokenized a piece at a time, cut before a line break (the library's
    Encoding of a 20 MB text held 3.5 GB), and the pieces give the ids and byte ends of the whole text."""
    from tinygrad_ssm import tokenizer as tokenizer_module
    from tests.support.tokenizers import assert_pieces_equal_whole
    for tok in byte_level_tokenizers:
        assert tok.cuts_in_pieces
        pieces = list(tokenizer_module.text_pieces([text[:cut], text[cut:]], piece_bytes, tok._added))
        assert b"".join(pieces) == text and all(len(p) >= piece_bytes for p in pieces[:-1])
        assert_pieces_equal_whole(tok, text, piece_bytes, cut)


def test_pieces_are_cut_before_line_breaks_only_where_the_whole_text_has_a_token_boundary():
    from tinygrad_ssm.tokenizer import text_pieces
    text = b"aaaa\n\nbbbb cc\n dd\nee\n<|endoftext|>ff\n<x"
    # "\n\n" and "\n " stay whole (cut before them, after a character that is not whitespace), no cut before an
    # added token, nor where the bytes left cannot tell
    assert list(text_pieces([text], 3, (b"<|endoftext|>",))) == [b"aaaa", b"\n\nbbbb cc", b"\n dd",
                                                                b"\nee\n<|endoftext|>ff\n<x"]
    assert list(text_pieces([b"x" * 50], 3)) == [b"x" * 50]            # no line break: one piece


def test_a_tokenizer_whose_pieces_could_differ_reads_the_text_whole(tmp_path, monkeypatch):
    """A Llama-style tokenizer (no pre-tokenizer: a text is one BPE word) whose merges join its line breaks (trained
    on whole texts, "\n" is in its vocabulary) has no cut that is sure to be a token boundary (io/text_pieces.py)."""
    from tests.support.tokenizers import train_byte_fallback
    from tinygrad_ssm import tokenizer as tokenizer_module
    tok = FileTokenizer(train_byte_fallback(["line one\nline two\n" * 20], tmp_path) / "tokenizer.json")
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 4)
    text = b"line one\nline two\nline three\n"
    assert not tok.cuts_in_pieces and len(list(tok.encode_stream([text[:5], text[5:]]))) == 1
    assert np.array_equal(tok.encode_bytes(text), tok.encode(text.decode()))


@pytest.mark.parametrize("stated", ["plain", "added_token"])
def test_tokenizer_configs_eos_token_comes_before_the_usual_names(bpe_tokenizer, tmp_path, stated):
    """tokenizer_config.json's eos_token (a string, or transformers' AddedToken object {"content": ...}) names the
    EOS although the vocabulary also holds <|endoftext|>, one of the usual names looked up without it; its
    special-token keys are kept as stated (a checkpoint copies them), the others not."""
    import json
    import shutil
    shutil.copy(bpe_tokenizer, tmp_path / "tokenizer.json")
    name = FileTokenizer(bpe_tokenizer)._tok.id_to_token(7)
    eos = name if stated == "plain" else {"__type": "AddedToken", "content": name, "special": True}
    config = {"eos_token": eos, "add_bos_token": False, "add_eos_token": True, "model_max_length": 8}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = FileTokenizer(tmp_path / "tokenizer.json")
    assert tok.eos_token_id == 7
    assert tok.special_config == {"eos_token": eos, "add_bos_token": False, "add_eos_token": True}


def test_an_eos_id_past_the_vocabulary_is_refused(bpe_tokenizer):
    """An EOS id (config.json's eos_token_id) must be one of the tokenizer's ids: 0..vocab_size - 1."""
    assert FileTokenizer(bpe_tokenizer, eos_token_id=319).eos_token_id == 319
    for bad in (320, -1):
        with pytest.raises(TokenizerError, match=f"EOS token id {bad} is outside"):
            FileTokenizer(bpe_tokenizer, eos_token_id=bad)


@pytest.mark.parametrize("ordinary", ["vocabulary", "added"])
def test_a_special_eos_comes_before_an_ordinary_token_of_a_usual_name(bpe_tokenizer, tmp_path, ordinary):
    """Without a tokenizer_config.json, the EOS is looked up by the usual names: one that is a special added token
    (Llama-3's <|end_of_text|>) comes before an ordinary BPE token spelled like another (a byte-level vocabulary
    learns "</s>" from text: Qwen2's has it as token 128247), which is no end of a document; so does an added token
    that is not special ("added": decode keeps it as text)."""
    import json

    from tokenizers import AddedToken, Tokenizer
    spec = json.loads(Tokenizer.from_file(str(bpe_tokenizer)).to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|endoftext|>"]
    vocab = spec["model"]["vocab"]
    vocab["</s>"] = vocab.pop("<|endoftext|>")                     # an ordinary token now, and no <|endoftext|>
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken("<|end_of_text|>", special=True)])
    if ordinary == "added":
        tok.add_tokens([AddedToken("</s>", special=False)])
        assert any(t.content == "</s>" and not t.special for t in tok.get_added_tokens_decoder().values())
    tok.save(str(tmp_path / "tokenizer.json"))
    found = FileTokenizer(tmp_path / "tokenizer.json")
    assert found.token_text(found.eos_token_id) == "<|end_of_text|>"


def test_a_tokenizer_configs_eos_token_that_is_no_token_falls_back_to_the_usual_names(bpe_tokenizer, tmp_path):
    """A tokenizer_config.json naming an EOS the file lacks (a chat fine-tune's <|im_end|> beside the base model's
    tokenizer.json) is passed over for the usual names, as before special tokens were looked up first."""
    import json
    import shutil
    shutil.copy(bpe_tokenizer, tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}), encoding="utf-8")
    tok = FileTokenizer(tmp_path / "tokenizer.json")
    assert tok.eos_token_id == FileTokenizer(bpe_tokenizer).eos_token_id == 0          # <|endoftext|>


def test_truncation_and_padding_saved_in_the_file_are_not_applied(bpe_tokenizer, tmp_path):
    """A tokenizer.json saved with truncation and padding set (a T5 or BERT fine-tune's, max_length 32) truncates and
    pads every encode in the library; transformers' tokenizer(text) does neither, nor may encode (a training text
    cut to 32 tokens, a prompt padded with <pad>)."""
    text = "def main():\n    return [x * 2 for x in range(10)]\n" * 3
    tok = FileTokenizer(_truncating_and_padding(bpe_tokenizer, tmp_path))
    expected = Tokenizer.from_file(str(bpe_tokenizer)).encode(text).ids      # the same file without them
    assert len(expected) > 8 and tok.encode(text).tolist() == expected
    assert tok.encode_bytes(text.encode()).tolist() == expected
    assert tok.encode("x").tolist() == FileTokenizer(bpe_tokenizer).encode("x").tolist()


def test_truncation_and_padding_saved_in_the_file_are_off_as_in_transformers(bpe_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    path = _truncating_and_padding(bpe_tokenizer, tmp_path)
    text = "def main():\n    return [x * 2 for x in range(10)]\n" * 3
    expected = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))(text)["input_ids"]
    assert len(expected) > 8 and FileTokenizer(path).encode(text).tolist() == expected


def _truncating_and_padding(bpe_tokenizer, tmp_path):
    """bpe_tokenizer's file saved with truncation and padding to 8 tokens, which the library then applies."""
    lib = Tokenizer.from_file(str(bpe_tokenizer))
    lib.enable_truncation(max_length=8)
    lib.enable_padding(length=8, pad_id=0, pad_token="<|endoftext|>")
    lib.save(str(tmp_path / "tokenizer.json"))
    assert len(lib.encode("x " * 40).ids) == 8 and lib.encode("x").ids[1:] == [0] * 7
    return tmp_path / "tokenizer.json"


def test_a_byte_level_post_processors_trimmed_offsets_are_read_untrimmed(tmp_path):
    """GPT-NeoX's ByteLevel post-processor trims whitespace off offsets: a first token " " spanned no byte, and
    eval counted the text's bytes after it one too many. The ends are the text's own now (each token ends after
    its own bytes); the ids are the library's, and the file a checkpoint copies is the file as given."""
    from tests.support.tokenizers import train_bpe
    path = train_bpe(["hello world the quick brown fox\n\n"] * 50, tmp_path / "tokenizer.json",
                     byte_level_post_processor=True)
    tok = FileTokenizer(path)
    for text in (" hello world", "  hello world", "hello\n\nworld", " h"):
        ids, ends = tok.encode_bytes_with_ends(text.encode())
        assert ids.tolist() == Tokenizer.from_file(str(path)).encode(text).ids
        own = np.cumsum([len(tok.decode(ids[i:i + 1]).encode()) for i in range(len(ids))])   # (n,)
        assert ends.tolist() == own.tolist(), text
    assert tok.to_str() == path.read_text(encoding="utf-8")


def test_a_byte_level_first_token_inside_a_character_ends_after_its_own_bytes(bpe_tokenizer):
    """A text that starts with a character a byte-level BPE splits ("日" as "æĹ" + "¥", a BOM as "ï" + "»¿") counted
    the first token as covering nothing, so eval's bytes after the first token were the whole text's (22 for
    22 bytes, not 20). Its end is now its own bytes (as transformers' tokens give them); the other tokens' ends are
    unchanged, and a first token that is a whole character is as before."""
    tok = FileTokenizer(bpe_tokenizer)
    assert tok.byte_level
    lib = Tokenizer.from_file(str(bpe_tokenizer))
    for text in ("日本語 state space\n", "\ufeffhello world\n", "x日本語\n"):
        data = text.encode()
        ids, ends = tok.encode_bytes_with_ends(data)
        encoding = lib.encode(text)
        assert ids.tolist() == encoding.ids
        first_bytes = len(encoding.tokens[0])                     # ByteLevel: one character of a token per byte
        assert ends[0] == first_bytes and ends[-1] == len(data), text
        assert (np.diff(ends) >= 0).all()
    ids, ends = tok.encode_bytes_with_ends(b"\xff\xfeab")          # invalid bytes: U+FFFD's 3 token bytes, 1 of ours
    assert ends[0] <= 1 and ends[-1] == 4


def test_what_transformers_reads_beside_the_file_special_tokens_map_and_split_special_tokens(tmp_path):
    """special_tokens_map.json's eos_token was never read (a guessed "<|endoftext|>" was taken instead), and
    tokenizer_config.json's split_special_tokens was ignored (a special token written in the text became its id,
    where transformers reads its characters). Found by the tokenizer audit (2026-12-06)."""
    from tokenizers import AddedToken
    from tests.support.tokenizers import train_bpe
    path = train_bpe(["hello world the quick brown fox\n\n"] * 50, tmp_path / "tokenizer.json")
    lib = Tokenizer.from_file(str(path))
    lib.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    lib.save(str(path))
    im_end = lib.token_to_id("<|im_end|>")
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    assert FileTokenizer(path).eos_token_id == im_end                  # it was <|endoftext|>'s 0
    # transformers 5 reads special_tokens_map.json over tokenizer_config.json, unless the config has an
    # added_tokens_decoder (then only the config); a null eos_token is no EOS (the usual names were looked up)
    configs = [({"eos_token": "<|endoftext|>"}, im_end), ({"eos_token": "<|endoftext|>", "added_tokens_decoder": {}}, 0),
               ({"eos_token": None, "added_tokens_decoder": {}}, None)]
    for config, eos in configs:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
        assert FileTokenizer(path).eos_token_id == eos, config
        if importlib.util.find_spec("transformers"):
            import transformers
            assert transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path)).eos_token_id == eos, config
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    text = "hello<|endoftext|>world"
    assert 0 in FileTokenizer(path).encode(text).tolist()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"split_special_tokens": True}))
    split = FileTokenizer(path)
    assert 0 not in split.encode(text).tolist() and split.decode(split.encode(text)) == text
    assert split.special_config["split_special_tokens"] is True        # kept in a checkpoint's copy
    transformers = pytest.importorskip("transformers")
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert split.encode(text).tolist() == theirs(text)["input_ids"]


def test_every_byte_of_a_text_ends_in_some_token(tmp_path):
    """An NFC normalizer (GPT-NeoX's tokenizer.json has one) maps a composed character to its first character's
    offsets: a text ending in a combining accent ended a byte short (bits per byte over too few bytes); a ByteLevel
    post-processor inside a Sequence (Llama-3's) still trimmed a first space token's offsets to nothing."""
    from tokenizers import normalizers, processors
    from tests.support.tokenizers import train_bpe
    path = train_bpe(["hello world caf\u00e9 the quick brown fox\n\n"] * 50, tmp_path / "tokenizer.json")
    lib = Tokenizer.from_file(str(path))
    lib.normalizer = normalizers.NFC()
    lib.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True)])
    lib.save(str(path))
    tok = FileTokenizer(path)
    for text in ("x cafe\u0301", "x \u1100\u1161\u11a8 \u1100\u1161", "  x", "hello world"):
        data = text.encode()
        ids, ends = tok.encode_bytes_with_ends(data)
        assert ids.tolist() == lib.encode(text).ids
        assert ends[-1] == len(data) and (np.diff(ends) >= 0).all(), (text, ends)
    assert tok.encode_bytes_with_ends(b"  x")[1].tolist() == [1, 2, 3]    # the first space covers its byte
    assert tok.to_str() == path.read_text(encoding="utf-8")             # the file as given, for a checkpoint


def test_a_vocabulary_with_gaps_in_its_ids_counts_up_to_its_highest_id(bpe_tokenizer, tmp_path):
    """vocab_size counted the vocabulary's entries: a tokenizer.json whose ids skip some (one token moved to id 600
    of 283) fitted a model of too few rows, and training failed at the first forward on an id the message did not
    tie to the tokenizer. It is the highest id + 1 now, so check_fits refuses the small model, naming both sizes."""
    spec = json.loads(bpe_tokenizer.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    moved = max(vocab, key=vocab.get)
    text = Tokenizer.from_file(str(bpe_tokenizer)).decode([vocab[moved]])
    count = Tokenizer.from_file(str(bpe_tokenizer)).get_vocab_size(with_added_tokens=True)
    vocab[moved] = count + 300
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    tok = FileTokenizer(tmp_path / "tokenizer.json")
    assert count + 300 in tok.encode(text).tolist()
    assert tok.vocab_size == count + 301
    with pytest.raises(TokenizerError, match=f"has {count + 301} tokens but the model .* vocabulary of {count}"):
        check_fits(tok, count, tmp_path)


@pytest.mark.parametrize("kind", ["dangling link", "folder"])
def test_a_broken_tokenizer_json_in_a_model_folder_is_named_not_taken_for_none(tmp_path, kind):
    """A tokenizer.json that is a link into a removed blob (a snapshot copied without its cache), or a folder, was
    read as no tokenizer at all: bytes for a model of 256 ids without a word, 'holds no tokenizer.json' for more."""
    own = tmp_path / "tokenizer.json"
    if kind == "folder":
        own.mkdir()
    else:
        own.symlink_to(tmp_path / "blobs" / "abc123")
    want = r"is a link to '.*blobs/abc123', which is missing" if kind != "folder" else "is not a regular file"
    for vocab_size in (256, 50280):
        with pytest.raises(TokenizerError, match=want):
            find_tokenizer(tmp_path, vocab_size)


def test_an_unreadable_tokenizer_file_is_named(bpe_tokenizer, tmp_path, monkeypatch):
    """A tokenizer.json that cannot be read (no permission, an I/O error) gave AttributeError: 'FileTokenizer' object
    has no attribute '_json' (the parser's error message read the text that was never read)."""
    import pathlib
    path = tmp_path / "tokenizer.json"
    path.write_bytes(bpe_tokenizer.read_bytes())
    real = pathlib.Path.read_text

    def refused(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(pathlib.Path, "read_text", refused)
    for load in (lambda: load_tokenizer(str(path)), lambda: find_tokenizer(tmp_path, 320)):
        with pytest.raises(TokenizerError, match=f"cannot read the tokenizer '{path}': Permission denied"):
            load()


def test_a_tokenizer_json_with_a_byte_order_mark_says_so(bpe_tokenizer, tmp_path):
    """A tokenizer.json saved with a UTF-8 BOM got the parser's bare "expected value at line 1 column 1"."""
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"\xef\xbb\xbf" + bpe_tokenizer.read_bytes())
    with pytest.raises(TokenizerError, match="it starts with a UTF-8 byte order mark, which JSON does not allow"):
        load_tokenizer(str(path))


def test_tokenizer_paths_name_a_dangling_link_a_folder_and_take_a_hub_cache_repository(bpe_tokenizer, tmp_path):
    """--tokenizer of a snapshot whose tokenizer.json links to a pruned blob said "holds no tokenizer.json" (and of
    the link itself "no such file"), of a folder named tokenizer.json "holds no tokenizer.json", and of a Hugging
    Face cache's repository folder (models--ORG--NAME, as --model takes) "holds no tokenizer.json"."""
    snapshot = tmp_path / "pruned" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").symlink_to("../../blobs/0123")
    for link in (snapshot, snapshot / "tokenizer.json"):
        with pytest.raises(TokenizerError, match=r"tokenizer.json' is a link to '../../blobs/0123', which is missing"):
            load_tokenizer(str(link))
    (tmp_path / "x" / "tokenizer.json").mkdir(parents=True)
    with pytest.raises(TokenizerError, match=r"x/tokenizer.json' is not a file"):
        load_tokenizer(str(tmp_path / "x" / "tokenizer.json"))
    repo = tmp_path / "models--EleutherAI--gpt-neox-20b"
    (repo / "snapshots" / "c0ffee").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    (repo / "snapshots" / "c0ffee" / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    tok = load_tokenizer(str(repo))
    assert tok.path == repo / "snapshots" / "c0ffee" / "tokenizer.json" and tok.vocab_size == 320
    (repo / "refs" / "main").write_text("other")
    with pytest.raises(TokenizerError, match=r"has refs/main 'other', which is not in snapshots/; pass one of its "
                                             r"snapshots instead"):
        load_tokenizer(str(repo))
