"""io/text_pieces.py's cut rules for the tokenizer.json layouts of real Mamba-2 checkpoints other than GPT-NeoX's
(built here in the test, no download): a long text tokenized in pieces gives exactly the whole text's ids and byte
ends, on texts that hit each cut's edge cases; a tokenizer no rule covers reads a text whole.

- mistral: Mamba-Codestral's conversion, a byte_fallback BPE, Metaspace("▁", prepend_scheme first, split false),
  no normalizer, TemplateProcessing "<s> $A" (one BPE word per text: cut before a line break);
- llama2: Llama-2's and Mistral-7B-v0.1's, Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer;
- llama3: Split(Llama-3's regex, Isolated) + ByteLevel(use_regex false), ignore_merges, a ByteLevel and a
  "<|begin_of_text|> $A" post_processor (cut after a line break);
- qwen2: the same with Qwen2's regex, an NFC normalizer, a trimming ByteLevel post_processor and no BOS;
- metaspace: Metaspace("▁", prepend_scheme always, split true) (cut before a space).
"""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tinygrad_ssm.io import text_pieces as pieces_module
from tinygrad_ssm import tokenizer as tokenizer_module
from tinygrad_ssm.tokenizer import FileTokenizer, TokenizerError

from tests.support.tokenizers import assert_pieces_equal_whole

LLAMA3_REGEX = next(r for r in pieces_module.SPLIT_REGEXES if r"\p{N}{1,3}" in r)
QWEN2_REGEX = next(r for r in pieces_module.SPLIT_REGEXES if r"\p{N}{1,3}" not in r)
TRAIN_TEXT = ("def main(argv):\n    return f(x, 'y')  # a comment\n\n\tif a == b:\r\n        pass\n"
              "Ünïcode — text ✓ 😀 and   spaces\u00a0here\n<s>x</s>\n" * 40)
KINDS = ("mistral", "llama2", "llama3", "qwen2", "metaspace")


def build_tokenizer(kind: str, folder: Path, texts=(TRAIN_TEXT,), vocab_size: int = 400) -> Path:
    """A tokenizer.json laid out as `kind`'s (the module docstring) in `folder`, trained on `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    folder.mkdir(parents=True, exist_ok=True)
    byte_level = kind in ("llama3", "qwen2")
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] if byte_level else ["<unk>", "<s>", "</s>"]
    if byte_level:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX if kind == "llama3" else QWEN2_REGEX), "isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(list(texts), trainer)
    else:   # trained on lines split at spaces, as SentencePiece's: no line break in the vocabulary (<0x0A> instead)
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="always", split=True)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
        tok.train_from_iterator([line for t in texts for line in t.splitlines()], trainer)
    spec = json.loads(tok.to_str())
    if not byte_level:
        vocab = spec["model"]["vocab"]
        first = max(vocab.values()) + 1
        vocab.update({f"<0x{i:02X}>": first + i for i in range(256)})
        spec["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    bos = specials[0] if byte_level else "<s>"
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [tok.token_to_id(bos)], "tokens": [bos]}}}
    if kind == "mistral":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                 "split": False}
        spec["post_processor"] = template
    elif kind == "llama2":
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        spec["pre_tokenizer"] = None
        spec["post_processor"] = template
    elif kind == "llama3":
        spec["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}, template]}
    elif kind == "qwen2":
        spec["normalizer"] = {"type": "NFC"}
        spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                  "use_regex": False}
    path = folder / "tokenizer.json"
    path.write_text(Tokenizer.from_str(json.dumps(spec)).to_str(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizers_by_kind(tmp_path_factory):
    """Trained on a few standard library files too: merges of line breaks with what is around them (ĊĊ, čĊ, ):Ċ,
    ▁▁), which a wrong cut would split."""
    from tinygrad_ssm.train.data import stdlib_sources
    texts = [TRAIN_TEXT] + [p.read_text(errors="replace")[:30_000] for p in stdlib_sources()[200:203]]
    texts.append(texts[1].replace("\n", "\r\n"))
    folder = tmp_path_factory.mktemp("kinds")
    return {kind: FileTokenizer(build_tokenizer(kind, folder / kind, texts, vocab_size=600)) for kind in KINDS}


# joins hit each rule's cut: line breaks before and after whitespace runs, spaces runs, a text's start and end, the
# added tokens, CRLF, invalid and cut UTF-8, a combining accent, Unicode spaces (each lead byte that starts one),
# letters of other scripts (a line may start with one), "▁" written in the text
FRAGMENTS = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "\r", "a", "B", "1", ".", "'", "'s", "é", "\u00a0", "\u2028",
             "😀", "\u0301", "\u2581", "<", "<s>", "</s>", "<|begin_of_text|>", "def", "return", b"\xff", b"\xe2\x82",
             "ж", "Ωμ", "中文", "\u3000", "\u1680", "\u0085", "\u2003", "\u205f", b"\x80", b"\xc2", "か", "「",
             "\u2029", b"\xe3\x80", "\u202f"]
LONG_TEXTS = st.lists(st.sampled_from(FRAGMENTS), min_size=0, max_size=40).map(
    lambda parts: b"".join(p if isinstance(p, bytes) else p.encode() for p in parts))


@given(text=LONG_TEXTS, piece_bytes=st.integers(1, 8), cut=st.integers(0, 40))
@example(text=b"a\n\nb\n c\nd", piece_bytes=1, cut=0)              # a line break after and before others
@example(text=b"x  y \n z\n", piece_bytes=1, cut=1)                   # space runs, a space after a line break
@example(text=b"<s>\nx</s>\ny\n<s>", piece_bytes=1, cut=0)           # line breaks beside added tokens
@example(text=b"\nstart", piece_bytes=1, cut=0)                       # a line break first
@example(text=b"", piece_bytes=1, cut=0)                              # only the BOS
@example(text="x\n\u3000y\n\u00a0z\n\u2003w\n\u1680v\n\u0085u".encode(), piece_bytes=1, cut=0)  # non-ASCII spaces
@example(text="строка\nпривет\n中文\nΩμ".encode(), piece_bytes=1, cut=0)  # lines of other scripts: cut
@example(text="「かな」\nアイ\n、x\n\u3000y".encode(), piece_bytes=1, cut=0)  # kana and CJK punctuation: cut
@example(text="xa\u0301\nbc\u30a2\u3099\nde\uff76\uff9e\nf".encode(), piece_bytes=1, cut=0)  # marks a normalizer joins
@example(text=b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": "c" \n}\n', piece_bytes=1, cut=0)  # indented lines
def test_each_kind_tokenizes_a_long_text_in_pieces_into_the_tokens_of_the_whole(tokenizers_by_kind, text,
                                                                               piece_bytes, cut):
    text += b"x" * 20     # bytes after the last cut enough to tell it from one beside an added token
    for kind, tok in tokenizers_by_kind.items():
        assert tok.cuts_in_pieces, kind
        assert_pieces_equal_whole(tok, text, piece_bytes, cut)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_cuts_a_varied_text_where_its_rule_says(tokenizers_by_kind, kind):
    """~75 KB of the standard library with CRLF, non-ASCII and invalid bytes, in many pieces."""
    from tinygrad_ssm.train.data import stdlib_sources
    text = b"".join(p.read_bytes() for p in stdlib_sources()[100:104])[:150_000]
    text = text[:50_000] + text[50_000:100_000].replace(b"\n", b"\r\n") + text[100_000:] + \
        "\n  Ünïcode\u00a0— 😀\n".encode() * 50 + b"\xff\xfe x\n" * 30
    tok = tokenizers_by_kind[kind]
    assert assert_pieces_equal_whole(tok, text, 1000) > 25                 # many cuts
    assert assert_pieces_equal_whole(tok, b"word " * 2000 + b"\n" + b" " * 3000, 500) >= 1


def test_the_rule_of_each_kind_and_a_wrong_rule_fails(tokenizers_by_kind, monkeypatch):
    """The rules as argued in text_pieces.py; cut by another kind's rule, the tokens differ (the test can fail)."""
    rules = {kind: tok._rule.name for kind, tok in tokenizers_by_kind.items()}
    assert rules == {"mistral": "one-word", "llama2": "one-word", "llama3": "split-regex", "qwen2": "split-regex",
                     "metaspace": "metaspace-split"}
    text = b"one two\n\nthree  four\n five\nsix"
    for kind, wrong in (("llama3", pieces_module.BYTE_LEVEL.cut), ("qwen2", pieces_module.BYTE_LEVEL.cut),
                        ("mistral", pieces_module.METASPACE_SPACE),
                        ("metaspace", pieces_module.SPLIT_LINE)):
        tok = tokenizers_by_kind[kind]
        monkeypatch.setattr(tok, "_rule", tok._rule._replace(cut=wrong))
        with pytest.raises((AssertionError, RuntimeError)):   # (no line break where drop_to expects one)
            assert_pieces_equal_whole(tok, text, 1)
    tok = tokenizers_by_kind["llama2"]                                  # the "▁" of each piece kept
    monkeypatch.setattr(tok, "_rule", tok._rule._replace(drop_to=None))
    with pytest.raises(AssertionError):
        assert_pieces_equal_whole(tok, text, 1)


def test_a_tokenizer_no_rule_proves_reads_a_text_whole(tokenizers_by_kind, tmp_path, monkeypatch):
    """A one-word BPE whose merges join the line break (no cut is a token boundary for sure) or that looks a whole
    word up in its vocabulary first (ignore_merges: a piece may be one), a
    Metaspace pre-tokenizer with a ByteLevel post_processor, Llama-3's Split with another regex: each reads a text
    whole. A tokenizer.json saved truncating is read without truncation (as transformers reads it): it cuts as its
    kind does, and the pieces are the whole text's ids, all of them."""
    from tokenizers import Tokenizer
    base = json.loads(tokenizers_by_kind["llama2"].to_str())
    merged = json.loads(json.dumps(base))
    merged["model"]["vocab"]["\n"] = len(merged["model"]["vocab"])
    merged["model"]["vocab"]["\n\n"] = len(merged["model"]["vocab"])
    merged["model"]["merges"].append(["\n", "\n"])
    whole_word = json.loads(json.dumps(base))
    whole_word["model"]["ignore_merges"] = True
    metaspace = json.loads(tokenizers_by_kind["metaspace"].to_str())
    metaspace["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                   "use_regex": True}
    other_regex = json.loads(tokenizers_by_kind["llama3"].to_str())
    other_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    truncating = json.loads(json.dumps(base))
    truncating["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 4)
    text = b"line one\n\nline two\nline three\n"
    for i, spec in enumerate([merged, whole_word, metaspace, other_regex, truncating]):
        path = tmp_path / f"{i}.json"
        path.write_text(Tokenizer.from_str(json.dumps(spec)).to_str(), encoding="utf-8")
        tok = FileTokenizer(path)
        assert tok.cuts_in_pieces == (spec is truncating), i
        assert (len(list(tok.encode_stream([text[:5], text[5:]]))) > 1) == (spec is truncating)
        assert np.array_equal(tok.encode_bytes(text), tok.encode(text.decode()))
    assert len(tok.encode(text.decode())) > 8
    assert np.array_equal(np.concatenate([i for i, _ in tok.encode_stream([text])]), tok.encode(text.decode()))


def test_special_tokens_before_and_after_a_text_come_once(tokenizers_by_kind, tmp_path):
    """A "<s> $A </s>" post_processor: the first piece gets the BOS, the last the EOS (at the text's end), as the
    whole text has them; an empty text gives both alone."""
    from tokenizers import Tokenizer
    spec = json.loads(tokenizers_by_kind["llama2"].to_str())
    template = spec["post_processor"]
    template["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}})
    template["special_tokens"]["</s>"] = {"id": "</s>", "ids": [2], "tokens": ["</s>"]}
    path = tmp_path / "tokenizer.json"
    path.write_text(Tokenizer.from_str(json.dumps(spec)).to_str(), encoding="utf-8")
    tok = FileTokenizer(path)
    assert tok.cuts_in_pieces and tok._around == ([1], [2])
    text = b"first line\nsecond  line\n\nthird\n" * 20
    assert assert_pieces_equal_whole(tok, text, 50) > 5
    ids, ends = tok.encode_bytes_with_ends(text)
    assert ids[0] == 1 and ids[-1] == 2 and ends[0] == 0 and ends[-1] == len(text)
    assert_pieces_equal_whole(tok, b"", 1)


def test_cut_rule_refuses_each_layout_a_cut_would_change(tokenizers_by_kind):
    """Each condition of cut_rule, one at a time on a spec it accepts: a ByteLevel that adds a prefix space (each
    piece would get one), BPE dropout (random merges), an added token that takes the whitespace before it
    (lstrip), a one-word BPE with a merge of its line break's byte token, a Prepend of a line break; and
    special_tokens_around on two templates, or a template holding the text twice."""
    byte_level = {"model": {"type": "BPE"}, "normalizer": None, "post_processor": None, "added_tokens": [],
                  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}
    llama2 = json.loads(tokenizers_by_kind["llama2"].to_str())
    lookup = tokenizers_by_kind["llama2"]._tok.token_to_id
    assert pieces_module.cut_rule(byte_level, lookup) == pieces_module.BYTE_LEVEL
    assert pieces_module.cut_rule(llama2, lookup).name == "one-word"

    def variant(spec, edit):
        spec = json.loads(json.dumps(spec))
        edit(spec)
        return pieces_module.cut_rule(spec, lookup)

    assert variant(byte_level, lambda s: s["pre_tokenizer"].update(add_prefix_space=True)) is None
    assert variant(byte_level, lambda s: s["model"].update(dropout=0.1)) is None
    assert variant(byte_level, lambda s: s["added_tokens"].append({"content": "<x>", "lstrip": True})) is None
    assert variant(byte_level, lambda s: s["added_tokens"].append({"content": "<x>", "rstrip": True})) is None
    assert variant(byte_level, lambda s: s["added_tokens"].append({"content": "<x>"})) == pieces_module.BYTE_LEVEL
    assert variant(llama2, lambda s: s["model"]["merges"].append(["<0x0A>", "a"])) is None
    assert variant(llama2, lambda s: s["normalizer"]["normalizers"][0].update(prepend="\n")) is None

    template = llama2["post_processor"]
    assert pieces_module.special_tokens_around({"post_processor": template}) == ([1], [])
    assert pieces_module.special_tokens_around({"post_processor": {"type": "Sequence",
                                                                   "processors": [template, template]}}) is None
    twice = json.loads(json.dumps(template))
    twice["single"].append({"Sequence": {"id": "A", "type_id": 0}})
    assert pieces_module.special_tokens_around({"post_processor": twice}) is None


def test_special_tokens_parsed_otherwise_than_the_library_adds_them_read_a_text_whole(tokenizers_by_kind, tmp_path,
                                                                                    monkeypatch):
    """The ids special_tokens_around reads are checked against what the library adds to a probe text: a parse that
    disagrees (here made so) is not trusted, and the text is read whole."""
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizers_by_kind["llama2"].to_str(), encoding="utf-8")
    assert FileTokenizer(path).cuts_in_pieces
    monkeypatch.setattr(tokenizer_module, "special_tokens_around", lambda spec: ([2], []))   # </s>, not <s>
    assert not FileTokenizer(path).cuts_in_pieces


def test_a_text_with_no_cut_is_searched_once_not_again_at_every_block():
    """Each block's search started again where the first began, so a text with no cut took quadratic time (155 s
    for 200 MB of one line against 9.6 s for 50; found by an audit): the bytes searched now stay within a few
    times the text's, however many blocks it comes in."""
    from tinygrad_ssm.io.text_pieces import BYTE_LEVEL, text_pieces
    searched = []

    class Counted:
        def search(self, text, start):
            searched.append(len(text) - start)
            return BYTE_LEVEL.cut.search(text, start)
    blocks = [b"\0" * 1024] * 64 + [b"\nx" + b"\0" * 1024]              # one cut, at the very end
    pieces = list(text_pieces(iter(blocks), 1024, (b"<|endoftext|>",), Counted()))
    assert b"".join(pieces) == b"".join(blocks) and len(pieces) == 2
    assert sum(searched) < 3 * len(b"".join(blocks)), sum(searched)


def test_lines_that_start_with_letters_of_other_scripts_are_cut():
    """The byte-level rule cut only before a line break that printable ASCII follows: a Russian or Chinese text,
    whose lines start otherwise, was tokenized whole (2.4 GB for 5 MB; found by an audit). A line break that
    whitespace follows (U+00A0, U+3000, ...) is still no cut: the regex joins the two."""
    from tinygrad_ssm.io.text_pieces import BYTE_LEVEL
    text = "строка\nпривет\n中文\nΩμ \n\u00a0x \n\u3000y\u3000\n\u2003z\u2029\n é\u00a0\n「か」 \nア".encode()
    cuts = [m.start() for m in BYTE_LEVEL.cut.finditer(text)]
    assert [text[c + 1:c + 4].decode(errors="replace")[:1] for c in cuts] == ["п", "中", "Ω", "「", "ア"]
    from tinygrad_ssm.io.text_pieces import SPLIT_LINE      # Llama-3's, Qwen2's: after the line break
    cuts = [m.start() for m in SPLIT_LINE.finditer(text)]   # (printable ASCII alone: 4 MB of Russian read whole)
    assert [text[c:c + 3].decode(errors="replace")[:1] for c in cuts] == ["п", "中", "Ω", "「", "ア"]


def test_indented_lines_are_cut_after_their_last_character_that_is_not_whitespace():
    """Lines that all start with whitespace (indented prose, pretty-printed JSON) and 「 or kana (the lead byte of
    U+3000 was left out whole) had no cut: a text of them was read whole (8 MB of Japanese: 3.4 GB; 34 MB of JSON
    refused); a line break after whitespace stays no cut ("x \n  y": the whole has the pre-token " \n ")."""
    from tinygrad_ssm.io.text_pieces import BYTE_LEVEL
    text = b'{\n  "a": [\n    1, \n    2\n  ]\t\n}'
    cuts = [m.start() for m in BYTE_LEVEL.cut.finditer(text)]
    assert [text[c - 1:c + 1] for c in cuts] == [b"{\n", b"[\n", b"2\n", b"\t\n"]   # the last: "}" follows


def test_a_text_read_whole_that_needs_more_memory_than_the_machine_has_is_refused(tmp_path, monkeypatch):
    """A tokenizer with no cut rule read any text whole, however long: 16 MB took 1.4 GB (a Llama-style BPE; a BERT
    WordPiece 2.8 GB), and a bigger file ran the machine out of memory with no word (an audit). A text whose memory at
    the least rate measured (WHOLE_TEXT_BYTES_PER_BYTE) exceeds what is available is refused with the fix; others
    are read whole, exactly."""
    from tests.support.tokenizers import train_byte_fallback
    tok = FileTokenizer(train_byte_fallback(["line one\nline two\n" * 20], tmp_path) / "tokenizer.json")
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 64)
    monkeypatch.setattr(tokenizer_module, "available_memory", lambda: 1000 * tokenizer_module.WHOLE_TEXT_BYTES_PER_BYTE)
    fits, too_long = b"line one\n" * 110, b"line one\n" * 112                    # 990 and 1,008 bytes
    assert not tok.cuts_in_pieces
    assert np.array_equal(tok.encode_bytes(fits), tok.encode(fits.decode()))
    assert np.array_equal(np.concatenate([ids for ids, _ in tok.encode_stream([fits[:500], fits[500:]])]),
                          tok.encode(fits.decode()))
    want = r"a text of 0 MB to tokenize whole with .*tokenizer.json', which has no rule .* --document-end eos"
    with pytest.raises(TokenizerError, match=want):
        tok.encode_bytes(too_long)
    with pytest.raises(TokenizerError, match=want):
        list(tok.encode_stream([too_long[:500], too_long[500:]]))
    monkeypatch.setattr(tokenizer_module, "available_memory", lambda: None)    # unknown (not Linux): never refused
    assert np.array_equal(tok.encode_bytes(too_long), tok.encode(too_long.decode()))


def test_a_stretch_with_no_place_to_cut_past_the_limit_is_refused_saying_where(bpe_tokenizer, monkeypatch):
    """A text with no line break that a non-space character follows (one line of 20 MB, a file of NULs) was
    tokenized whole: 4 GB for 20 MB, and a bigger one ran the machine out of memory (an audit's figures). Past
    MAX_WHOLE_BYTES such a stretch is refused, naming where it starts and the fix; shorter ones are read whole."""
    monkeypatch.setattr(tokenizer_module, "PIECE_BYTES", 64)
    monkeypatch.setattr(tokenizer_module, "MAX_WHOLE_BYTES", 1000)
    tok = FileTokenizer(bpe_tokenizer)
    lines = b"".join(b"line %d of text\n" % i for i in range(60))         # ~900 bytes, cut every line
    one_line = b"word " * 300                                           # 1,500 bytes, no cut
    whole = tok.encode_bytes(lines + b"word " * 150)                    # under the limit: read whole, exactly
    assert np.array_equal(whole, np.asarray(tok._tok.encode((lines + b"word " * 150).decode()).ids))
    with pytest.raises(TokenizerError, match=r"from byte 9\d\d of the text on, 1,\d{3} bytes hold no place where the "
                                             r"tokenizer may be run on pieces .* break the text into lines"):
        tok.encode_bytes(lines + one_line)


def test_no_cut_after_a_character_a_normalizer_joins_with_the_one_before():
    """An NFC normalizer gives "a" + U+0301 the offsets of "a": the whole text's "\\n" token ended after the accent's
    bytes, a piece's last token did (equal ids, other byte ends; found by an audit). No cut there, nor after any
    combining mark, nor after a halfwidth voiced mark (NFKC joins it with the kana before)."""
    from tinygrad_ssm.io.text_pieces import BYTE_LEVEL, text_pieces
    for joined in ("a\u0301", "e\u0323\u0302", "\uff76\uff9e", "\u1100\u1161"):
        text = f"first line\nx{joined}\nnext line\nlast".encode()
        pieces = list(text_pieces([text], 4, cut=BYTE_LEVEL.cut))
        assert not any(p.endswith(joined.encode()) for p in pieces[:-1]), (joined, pieces)
        assert len(pieces) == 3 and b"".join(pieces) == text, pieces
