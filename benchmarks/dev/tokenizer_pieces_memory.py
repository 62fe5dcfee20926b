"""Peak memory of tokenizing a long text whole vs in pieces (tokenizer.py's PIECE_BYTES), for the tokenizer.json
layouts of tests/test_tokenizer_pieces.py (built there, trained on the standard library), and a check that the
pieces give the whole text's ids and byte ends. Each measurement runs in a fresh process (ru_maxrss is a peak).

    python benchmarks/dev/tokenizer_pieces_memory.py --mb 20            # every kind, whole and pieces
    python benchmarks/dev/tokenizer_pieces_memory.py --mb 5 --check     # pieces == whole, ids and ends
"""
import argparse
import os
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo
KINDS = ("mistral", "llama2", "llama3", "metaspace")


def corpus(mb: float) -> bytes:
    """`mb` MB of the standard library's sources, with CRLF, non-ASCII, invalid bytes and long lines mixed in."""
    from tinygrad_ssm.train.data import stdlib_sources
    parts, size, extra = [], 0, ("\r\n  Ünïcode\u00a0— 😀 text\r\n".encode() + b"\xff\xfe\x80 x\n" + b" " * 300 +
                                 b"\n" + b"x" * 5000 + b"\n")
    files = stdlib_sources()
    for i in range(10 ** 6):                              # the standard library again if it is not enough
        data = files[i % len(files)].read_bytes()
        parts.append(data if i % 3 else data.replace(b"\n", b"\r\n"))
        parts.append(extra)
        size += len(data) + len(extra)
        if size >= mb * 1e6:
            break
    return b"".join(parts)[:int(mb * 1e6)]


def build(folder: Path) -> dict:
    from tests.test_tokenizer_pieces import build_tokenizer
    from tinygrad_ssm.train.data import stdlib_sources
    texts = [p.read_text(errors="replace") for p in stdlib_sources()[:60]]
    return {k: str(build_tokenizer(k, folder / k, texts, vocab_size=2000)) for k in KINDS}


def measure(path: str, data_path: str, mode: str) -> None:
    """In this process: encode the file whole or in pieces, print peak RSS over the baseline after reading."""
    from tinygrad_ssm import tokenizer as tokenizer_module
    tok = tokenizer_module.FileTokenizer(path)
    data = Path(data_path).read_bytes()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "whole":
        ids, _ = tok.encode_bytes_with_ends(data)
    else:
        assert tok.cuts_in_pieces, path
        ids = [i for i, _ in tok.encode_stream([data])]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, "extra_peak_mb": (peak - base) / 1024, "seconds": time.perf_counter() - start,
                      "pieces": 1 if mode == "whole" else len(ids)}))


def check(paths: dict, data: bytes, piece_bytes: int) -> None:
    import numpy as np

    from tinygrad_ssm import tokenizer as tokenizer_module
    for kind, path in paths.items():
        tok = tokenizer_module.FileTokenizer(path)
        whole_ids, whole_ends = tok.encode_bytes_with_ends(data)
        tokenizer_module.PIECE_BYTES = piece_bytes
        streamed = list(tok.encode_stream([data[i:i + 65536] for i in range(0, len(data), 65536)]))
        ok = np.array_equal(np.concatenate([i for i, _ in streamed]), whole_ids) and \
            np.array_equal(np.concatenate([e for _, e in streamed]), whole_ends)
        print(f"{kind}: rule {tok._rule.name}, {len(streamed)} pieces of >= {piece_bytes} B, {len(whole_ids)} tokens,"
              f" pieces == whole (ids and ends): {ok}")
        assert ok, kind


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--check", action="store_true", help="compare pieces with the whole instead of memory")
    parser.add_argument("--piece-bytes", type=int, default=4096, help="--check's piece size (the memory runs use "
                        "the library's own, tokenizer.PIECE_BYTES)")
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure(*args.measure)
    with tempfile.TemporaryDirectory() as tmp:
        paths, data = build(Path(tmp)), corpus(args.mb)
        if args.check:
            return check(paths, data, args.piece_bytes)
        (Path(tmp) / "text").write_bytes(data)
        print(f"text: {len(data) / 1e6:.1f} MB")
        for kind, path in paths.items():
            for mode in ("whole", "pieces"):
                out = subprocess.run([sys.executable, __file__, "--measure", path, str(Path(tmp) / "text"), mode],
                                     capture_output=True, text=True)
                print(kind, out.stdout.strip() or out.stderr.strip()[-500:])


if __name__ == "__main__":
    main()
