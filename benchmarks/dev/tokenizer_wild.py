"""Checks FileTokenizer against the `tokenizers` library on tokenizer.json files given on the command line (real
ones kept outside the repository: Llama-2, Mistral, Llama-3, Qwen2, GPT-NeoX, T5, BERT...), not in CI:

    python benchmarks/dev/tokenizer_wild.py /tmp/tokwild/*.json [--seeds 20] [--stream 300]

For each file: how it is read (vocabulary, EOS, special tokens added, the rule text_pieces cuts by, if any); then
  encode   FileTokenizer.encode == Tokenizer.encode(text).ids on hostile texts (runs of spaces and line breaks,
           CRLF, tabs, emoji, CJK, combining marks, leading/trailing spaces, the added tokens' own strings, digit
           runs, a long word without spaces, invalid UTF-8 bytes read as U+FFFD);
  pieces   encode_stream's pieces (PIECE_BYTES set small) == the whole text's ids and byte ends;
  stream   TextStream over random ids (a third of them byte-fallback tokens or the added tokens) joined ==
           decode(prompt + ids) less decode(prompt), each printed prefix a prefix of that decode, and the most ids
           a push decodes.
A line per check: ok, or the first counterexample.
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo

SEGMENTS = [" ", "  ", " " * 17, "\n", "\n\n", "\n\n\n ", "\r\n", "\r\n\r\n", "\t", "\t\t x", " \n", "\n ",
            "Hello", " world", "def main():\n    return 1\n", "x" * 3000, "1234567", "9" * 40, " 3.14159",
            "😀", "😀😀👍🏽", "日本語のテキスト", "中文", "e\u0301", "a\u0308\u0323", "\u00a0", "\u2581", "▁▁",
            "don't", "I'm", "\u200b", "Ĳ", "ﬁ", "M", "\nM", "\n\nM", " \nM", "!", "?!...", "'s", "\x00", "\x7f"]


def hostile_text(rng: random.Random, specials: list[str], n: int) -> bytes:
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08 and specials:
            parts.append(rng.choice(specials).encode())
        elif r < 0.10:
            parts.append(bytes([rng.choice([0xff, 0xfe, 0x80, 0xc3, 0xe2, 0xf0])]))
        else:
            parts.append(rng.choice(SEGMENTS).encode())
    return b"".join(parts)


def check_file(path: str, seeds: int, stream_cases: int) -> None:
    import numpy as np
    from tokenizers import Tokenizer

    from tinygrad_ssm import tokenizer as tm
    from tinygrad_ssm.text_stream import TextStream
    lib = Tokenizer.from_file(path)
    lib.no_truncation()             # as FileTokenizer (and transformers' tokenizer(text)) read a file saved with them
    lib.no_padding()
    try:
        tok = tm.FileTokenizer(path)
    except tm.TokenizerError as e:
        print(f"{path}: refused: {e}")
        return
    rule = tok._rule.name if tok._rule is not None else None
    print(f"{path}: vocab {tok.vocab_size}, eos {tok.eos_token_id} "
          f"({tok.token_text(tok.eos_token_id) if tok.eos_token_id is not None else None!r}), adds special tokens "
          f"{tok.adds_special_tokens} {tok._around if tok.cuts_in_pieces else ''}, cut rule {rule}, "
          f"{len(tok.byte_fallback_ids)} byte tokens, {len(tok.skipped_ids)} special ids")
    specials = [t.content for t in lib.get_added_tokens_decoder().values()][:40]
    # encode
    bad = None
    for seed in range(seeds):
        data = hostile_text(random.Random(seed), specials, 60)
        text = tm._utf8_text(data)
        for t in (text, " " + text + " ", text.strip(), text[:50]):
            if list(tok.encode(t)) != lib.encode(t).ids:
                bad = bad or t[:80]
    print(f"  encode: {'ok' if bad is None else 'DIFFERS on ' + repr(bad)}")
    # pieces
    if tok.cuts_in_pieces:
        bad, counts = None, []
        saved = tm.PIECE_BYTES
        try:
            for seed in range(seeds):
                data = hostile_text(random.Random(1000 + seed), specials, 3000)
                whole_ids, whole_ends = tok.encode_bytes_with_ends(data)
                for piece_bytes in (64, 1000, 4096):
                    tm.PIECE_BYTES = piece_bytes
                    got = list(tok.encode_stream([data[i:i + 777] for i in range(0, len(data), 777)]))
                    ids = np.concatenate([i for i, _ in got])
                    ends = np.concatenate([e for _, e in got])
                    counts.append(len(got))
                    if not (np.array_equal(ids, whole_ids) and np.array_equal(ends, whole_ends)):
                        k = next((j for j in range(min(len(ids), len(whole_ids))) if ids[j] != whole_ids[j]),
                                 min(len(ids), len(whole_ids)))
                        bad = bad or (seed, piece_bytes, k, data[max(0, whole_ends[max(k - 1, 0)] - 20):
                                                                 whole_ends[min(k + 3, len(whole_ends) - 1)]])
                if list(whole_ids) != lib.encode(tm._utf8_text(data)).ids:
                    bad = bad or (seed, "whole != library")
        finally:
            tm.PIECE_BYTES = saved
        print(f"  pieces: {'ok' if bad is None else 'DIFFERS ' + repr(bad)} ({min(counts)}..{max(counts)} pieces)")
    else:
        print("  pieces: read whole (no cut rule)")
    # stream
    rng = random.Random(0)
    special_ids = sorted(tok.skipped_ids)
    byte_ids = sorted(tok.byte_fallback_ids)
    prompts = ["", "Hello", " x", "😀", "日本", "a b ", "line\n", "don't"]
    bad, worst, held = None, 0, 0
    for case in range(stream_cases):
        prompt = tok.encode(rng.choice(prompts))
        new = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            if r < 0.3 and byte_ids:
                new.append(rng.choice(byte_ids))
            elif r < 0.35 and special_ids:
                new.append(rng.choice(special_ids))
            else:
                new.append(rng.randrange(tok.vocab_size))
        whole, before = tok.decode([*prompt, *new]), tok.decode(prompt)
        if lib.decode([*prompt, *new]) != whole:
            bad = bad or ("decode != library", prompt.tolist(), new)
        if not whole.startswith(before):
            continue                                   # new bytes ruin the prompt's own run: no stream can match
        stream = TextStream(tok, prompt)
        out = before
        for i in new:
            out += stream.push(i)
            worst = max(worst, len(stream.ids))
            if not whole.startswith(out):
                bad = bad or ("printed text the decode does not start with", prompt.tolist(), new, out, whole)
        out += stream.finish()
        if out != whole:
            bad = bad or ("joined != decode", prompt.tolist(), new, out, whole)
        held += 1
    print(f"  stream: {'ok' if bad is None else 'DIFFERS ' + repr(bad)[:600]} ({held} sequences, at most "
          f"{worst} ids decoded by a push)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--stream", type=int, default=300)
    args = parser.parse_args()
    for path in args.files:
        check_file(path, args.seeds, args.stream)


if __name__ == "__main__":
    main()
