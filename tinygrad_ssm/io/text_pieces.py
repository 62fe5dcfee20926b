"""Where a long text may be cut so that a tokenizer.json, piece by piece, gives exactly the ids and byte ends of the
whole text (tokenizer.py's FileTokenizer tokenizes a long text in pieces of PIECE_BYTES: the `tokenizers` library's
Encoding of a whole text holds ~175 bytes of memory per byte of text).

A cut is exact when the library's pipeline never joins across it: the normalizer acts on each character alone, the
pre-tokenizer always ends a pre-token there (the model then tokenizes each pre-token alone), or, with no pre-token
boundary at all (the text is one BPE word), no merge ever joins the symbol beside the cut. One rule per kind
(`cut_rule`), each argued from the library's source (tokenizers' pre_tokenizers/byte_level.rs, split.rs,
metaspace.rs, normalizers/prepend.rs, models/bpe/word.rs and model.rs) and checked by tests/test_tokenizer_pieces.py
against the library on texts that hit each cut's edge cases. A tokenizer no rule proves exact reads a text whole.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import NamedTuple

UNICODE_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})   # they change nothing across a cut before an ASCII
# character: one never composes with the character before it (nor does the space or line break of the rules below)

# GPT-2's pre-tokenizer regex (ByteLevel use_regex), and Llama-3's and Qwen2's (a Split before ByteLevel without one)
SPLIT_REGEXES = frozenset({
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+",                                                                     # Llama-3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"})                                                                    # Qwen2


class CutRule(NamedTuple):
    """`cut`: a zero-width bytes regex; a piece ends where it matches. `drop_to`: for a text tokenized as one BPE
    word, the id of the line break's symbol (never merged): a piece after the first, tokenized alone, gets the
    start-of-text "▁" (a Prepend normalizer's, Metaspace's prepend_scheme) the whole text has only once, so its
    tokens before its first line break (the piece starts with one) are dropped."""
    name: str
    cut: re.Pattern
    drop_to: int | None = None


# A character that is not whitespace (Unicode's White_Space, the regexes' \s), by its bytes: printable ASCII but the
# space, a UTF-8 lead byte of U+00C0-U+0FFF or U+4000 on, a byte no valid character starts with (read as one U+FFFD),
# or a lead byte of U+0080-U+00BF, U+1000-U+3FFF but for the whitespace among them (U+0085, U+00A0, U+1680,
# U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). A Cyrillic, Greek, CJK or kana text's lines start with one,
# as ASCII ones do (with ASCII alone, 5 MB of Russian was read whole: 2.4 GB; with the lead bytes of U+1000-U+3FFF
# left out whole, 8 MB of Japanese whose lines start with kana or 「: 3.4 GB)
NOT_SPACE = (rb"(?:[\x21-\x7e\x80-\xc1\xc3-\xe0\xe4-\xff]|\xc2(?![\x85\xa0])|\xe1(?!\x9a\x80)"
             rb"|\xe2(?!\x80[\x80-\x8a\xa8\xa9\xaf]|\x81\x9f)|\xe3(?!\x80\x80))")
# Just after such a character (one byte at least before; the ASCII controls U+001C-U+001F count as whitespace here,
# as Python's str.isspace has them: no cut is the safe side)
AFTER_NOT_SPACE = (rb"(?<=[\x00-\xff])(?<![\t-\r\x1c-\x20])(?<!\xc2\x85)(?<!\xc2\xa0)(?<!\xe1\x9a\x80)"
                   rb"(?<!\xe2\x80[\x80-\x8a\xa8\xa9\xaf])(?<!\xe2\x81\x9f)(?<!\xe3\x80\x80)")
CUT_REACH = 4   # bytes from a cut on that decide it: the line break and a following character of up to 3 bytes
# ByteLevel on the GPT-2 regex: just before a line break that a character other than whitespace follows, or one
# that such a character precedes (the regex makes that line break a pre-token of its own or the start of one: its
# alternatives that hold whitespace start at the first whitespace character of a run, and none looks behind; the
# whitespace before it forms a pre-token of its own, as at a text's end); a line break also ends any UTF-8 sequence,
# valid or not. (Cut after the line break, "\n\nM" would give the pre-token "\n\n" at a piece's end but "\n", "\n" in
# the whole. Cut before a space, " b" at a piece's start, the library's ByteLevel post_processor trims the space
# from its offsets where it does not in the whole. Cut between whitespace and a line break, "x \n  y" would give
# " " and "\n " where the whole has " \n ".) Indented lines and pretty-printed JSON are cut after their last
# character that is not whitespace.
BYTE_LEVEL = CutRule("byte-level", re.compile(rb"(?=\n" + NOT_SPACE + rb")|" + AFTER_NOT_SPACE + rb"(?=\n)"))
# A Split on Llama-3's/Qwen2's regex: just after a line break that a character other than whitespace follows (a
# piece then starts with it; its first token's byte ends are those of a token inside the whole text, not of a text's
# first token: FileTokenizer._ids_ends with first=False. Cut before the line break instead, "\n\nM" would give "\n",
# "\n" in pieces, "\n\n" whole). Every alternative that holds a line break ends at the last line break of its run
# ("\s*[\r\n]+" takes the whitespace run up to it whenever the run holds one, " ?[^\s\p{L}\p{N}]+[\r\n]*" ends with
# the run, no other holds \r or \n), and the next character starts a match of its own; the regex has no lookbehind,
# so matches from the cut on are the piece's. (With printable ASCII alone after the line break, 4 MB of Russian was
# read whole: +1.7 GB, an audit's figure.)
SPLIT_LINE = re.compile(rb"(?<=\n)(?=" + NOT_SPACE + rb")")
# Metaspace with split: true replaces each space by "▁" and splits before every "▁" (MergedWithNext), so a pre-token
# ends before each space; a piece that starts with one starts with "▁" and gets no prefix, whatever prepend_scheme.
METASPACE_SPACE = re.compile(rb"(?= )")
# One BPE word (no pre-tokenizer, or Metaspace with split: false): just before a line break whose symbol no merge
# holds. BPE merges the lowest-ranked pair first (models/bpe/word.rs); a pair with that symbol is never merged, so
# the merges on either side are those of each side alone, and the symbol stays a token of its own.
ONE_WORD_LINE = re.compile(rb"(?=\n)")


def cut_rule(spec: dict, token_to_id) -> CutRule | None:
    """The rule that cuts texts exactly for the tokenizer.json `spec` (parsed), or None: read texts whole.
    `token_to_id`: the library's lookup (the line break's symbol id for a one-word text)."""
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    pre, norm = spec.get("pre_tokenizer"), spec.get("normalizer")
    if model.get("dropout") or spec.get("truncation") is not None or spec.get("padding") is not None:
        return None                         # random merges; a whole text truncated or padded: pieces differ
    if not _added_tokens_allow(spec):
        return None
    if _unicode_only(norm) and isinstance(pre, dict):
        if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True and \
                pre.get("add_prefix_space") is False:
            return BYTE_LEVEL
        steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
        if isinstance(steps, list) and len(steps) == 2 and all(isinstance(s, dict) for s in steps):
            split, byte_level = steps
            if split.get("type") == "Split" and (split.get("pattern") or {}).get("Regex") in SPLIT_REGEXES and \
                    split.get("behavior") == "Isolated" and split.get("invert") is False and \
                    byte_level.get("type") == "ByteLevel" and byte_level.get("use_regex") is False and \
                    byte_level.get("add_prefix_space") is False:
                return CutRule("split-regex", SPLIT_LINE)
        if pre.get("type") == "Metaspace" and pre.get("split", True) is True and _no_byte_level_post(spec):
            return CutRule("metaspace-split", METASPACE_SPACE)
    one_word = pre is None or isinstance(pre, dict) and pre.get("type") == "Metaspace" and pre.get("split") is False
    if one_word and _prepend_replace_only(norm) and _no_byte_level_post(spec):
        return _one_word_rule(model, token_to_id)
    return None


def _one_word_rule(model: dict, token_to_id) -> CutRule | None:
    """ONE_WORD_LINE for a BPE whose line break is a symbol no merge holds: "\n" itself, or with byte_fallback its
    byte token <0x0A> (model.rs: a character not in the vocabulary becomes its byte tokens, never <unk>, which
    fuse_unk would fuse with its neighbours). ignore_merges (a whole word found in the vocabulary is one token) and
    a word suffix or subword prefix (they mark a word's ends) would tell a piece from the whole."""
    if model.get("type") != "BPE" or model.get("ignore_merges") or model.get("end_of_word_suffix") or \
            model.get("continuing_subword_prefix"):
        return None
    vocab = model.get("vocab") if isinstance(model.get("vocab"), dict) else {}
    symbol = "\n" if "\n" in vocab else "<0x0A>" if model.get("byte_fallback") and "<0x0A>" in vocab else None
    merges = model.get("merges") if isinstance(model.get("merges"), list) else None
    if symbol is None or merges is None:
        return None
    for merge in merges:
        parts = merge.split(" ", 1) if isinstance(merge, str) else merge
        if not isinstance(parts, list) or symbol in parts or any("\n" in str(p) for p in parts):
            return None
    symbol_id = token_to_id(symbol)
    return None if symbol_id is None else CutRule("one-word", ONE_WORD_LINE, int(symbol_id))


def _unicode_only(norm) -> bool:
    return norm is None or isinstance(norm, dict) and norm.get("type") in UNICODE_FORMS


def _prepend_replace_only(norm) -> bool:
    """None, a Unicode form, a Prepend without a line break, a Replace of " " by text without one, or a Sequence of
    those (Llama-2's and Mistral's Prepend("▁") + Replace(" ", "▁")): each changes one character alone, but for the
    Prepend, whose "▁" each piece would get (CutRule.drop_to drops it)."""
    steps = norm.get("normalizers") if isinstance(norm, dict) and norm.get("type") == "Sequence" else [norm]
    return isinstance(steps, list) and all(
        _unicode_only(n) or isinstance(n, dict) and (
            n.get("type") == "Prepend" and "\n" not in str(n.get("prepend")) or
            n.get("type") == "Replace" and n.get("pattern") == {"String": " "} and "\n" not in str(n.get("content")))
        for n in steps)


def _no_byte_level_post(spec: dict) -> bool:
    """A ByteLevel post_processor trims whitespace from a piece's first token's offsets as it does not in the whole
    (the rules that allow it cut before a character that is not whitespace)."""
    post = spec.get("post_processor")
    steps = post.get("processors") if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
    return all(not (isinstance(p, dict) and p.get("type") == "ByteLevel") for p in steps or [])


def _added_tokens_allow(spec: dict) -> bool:
    """No added token that holds a line break or a space or takes the whitespace beside it (lstrip, rstrip) across a
    cut; with a normalizer that changes spaces (Replace, Metaspace's is a pre-tokenizer), none matched in the
    normalized text (normalized: true), whose bytes text_pieces could not find in the raw text."""
    added = [t for t in spec.get("added_tokens") or [] if isinstance(t, dict)]
    rewrites = "Replace" in str(spec.get("normalizer")) or "Prepend" in str(spec.get("normalizer"))
    return all("\n" not in str(t.get("content", "")) and not t.get("lstrip") and not t.get("rstrip") and
               not (rewrites and t.get("normalized")) and
               (" " not in str(t.get("content", "")) or "Metaspace" not in str(spec.get("pre_tokenizer")))
               for t in added)


def special_tokens_around(spec: dict) -> tuple[list, list] | None:
    """The ids a post_processor adds before and after a text ([BOS], []: Llama's TemplateProcessing "<s> $A"), so
    that pieces tokenized without them give the whole text's tokens with them; None for a post_processor that does
    other than add tokens around the one sequence (then the text is read whole). ByteLevel only edits offsets."""
    post = spec.get("post_processor")
    steps = post.get("processors") if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
    before, after, templates = [], [], 0
    for step in steps or []:
        if step is None or isinstance(step, dict) and step.get("type") == "ByteLevel":
            continue
        if not isinstance(step, dict) or step.get("type") != "TemplateProcessing" or templates:
            return None
        templates += 1
        single, specials = step.get("single") or [], step.get("special_tokens") or {}
        where = [i for i, item in enumerate(single) if isinstance(item, dict) and "Sequence" in item]
        if len(where) != 1:
            return None
        try:
            ids = [[int(i) for item in part for i in specials[item["SpecialToken"]["id"]]["ids"]]
                   for part in (single[:where[0]], single[where[0] + 1:])]
        except (KeyError, TypeError, ValueError):
            return None
        before, after = ids
    return before, after


class TooLongWithoutCut(ValueError):
    """A stretch of text longer than text_pieces' max_whole with no place to cut it."""


def text_pieces(blocks, piece_bytes: int, added: tuple = (), cut: re.Pattern = BYTE_LEVEL.cut,
                max_whole: int | None = None) -> Iterator[bytes]:
    """The bytes of `blocks` (an iterable of bytes) joined, in pieces of at least piece_bytes (the last one shorter)
    that each end where `cut` matches, but not where an added token (`added`, UTF-8) reaches the cut, ends at it or
    starts just after it (the library splits those out first, and the whitespace before one ends a text of its own:
    "\n\n<|endoftext|>" has the pre-token "\n\n"; a Prepend normalizer puts "▁" after one); a text with no such cut
    comes out whole, or past `max_whole` bytes raises TooLongWithoutCut (its message says where it starts)."""
    reach = CUT_REACH + max(map(len, added), default=0)  # bytes from a cut on that decide whether it is one
    pending, searched, done = bytearray(), 0, 0  # no cut in pending[:searched]; done: the bytes yielded
    for block in blocks:
        pending += block
        while len(pending) > piece_bytes:
            start = max(piece_bytes, searched)
            while (found := cut.search(pending, start)) is not None and \
                    (_near_added(pending, found.start(), added) or _composes_before(pending, found.start())):
                start = found.start() + 1
            if found is None or len(pending) - found.start() < reach:     # the next block decides
                # none before the last `reach` bytes, whose cuts the next block may make or unmake (a rescan from
                # `start` made a text with no cut quadratic: 155 s for 200 MB against 9.6 for 50)
                searched = max(start, len(pending) - reach) if found is None else found.start()
                searched = min(searched, max(len(pending) - 1, 0))  # the last byte may start a cut
                break
            yield bytes(pending[:found.start()])                       # up to the cut
            done += found.start()
            del pending[:found.start()]
            searched = 0
        if max_whole is not None and len(pending) > max_whole:                # (cut where it could be)
            raise TooLongWithoutCut(f"from byte {done:,} of the text on, {len(pending):,} bytes hold no place where "
                                    f"the tokenizer may be run on pieces")
    if pending:
        yield bytes(pending)


def _composes_before(text: bytearray, cut: int) -> bool:
    """Whether the character before byte `cut` is a combining mark, or one a Unicode normalizer joins with the
    character before it ("a" + U+0301 -> "á", "ｶ" + "ﾞ" -> "ガ" under NFKC): the library gives the joined character
    its first character's offsets, so in the whole text the bytes of the mark ended the next token, in a piece the
    last one (the ids were equal, the byte ends not; found by an audit)."""
    tail = bytes(text[max(cut - 8, 0):cut]).decode("utf-8", "replace")[-2:]   # (a cut ends a UTF-8 sequence)
    if not tail or unicodedata.combining(tail[-1]):
        return bool(tail)
    return len(tail) == 2 and any(unicodedata.normalize(form, tail) != unicodedata.normalize(form, tail[0]) +
                                  unicodedata.normalize(form, tail[1]) for form in ("NFC", "NFKC"))


def _near_added(text: bytearray, cut: int, added: tuple) -> bool:
    """Whether one of the added tokens occurs in `text` over byte `cut`, ending just before it or starting at most a
    byte after it."""
    return any(text.find(t, max(cut - len(t), 0), cut + 1 + len(t)) >= 0 for t in added)
