"""JSON Lines (.jsonl): one JSON object a line, the text in one of its fields.

train and eval read a .jsonl file of --data as documents, one a record: the string in its "text" field, as Hugging
Face datasets and transformers' run_clm read such a file (--text-field names another field); generate --batch-file
reads a prompt a record from "prompt".

Lines are cut at "\\n" alone: a JSON string escapes every control character, but U+0085, U+2028 and U+2029 may stand
in it as they are, and str.splitlines would cut the record there. A record's text goes into the corpus as UTF-8.
"""
from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

SUFFIX = ".jsonl"
TEXT_FIELD = "text"  # train's and eval's --text-field
_UTF8_BOM = b"\xef\xbb\xbf"
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def is_json_lines(path: str | Path) -> bool:
    """Whether `path` is read as JSON Lines (its suffix, in any case)."""
    return Path(path).suffix.lower() == SUFFIX


def check_text_field(text_field: str, reads_json_lines: bool, source: str, error: type[Exception] = ValueError) -> None:
    """--text-field names a field of .jsonl records: `error` where it is given and `source` holds no such file."""
    if text_field != TEXT_FIELD and not reads_json_lines:
        raise error(f"--text-field names the field of a {SUFFIX} file's records that holds the text, and {source!r} "
                    f"holds no {SUFFIX} file; leave --text-field out")


def numbered_lines(stream: io.BufferedIOBase | Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line) of a binary file or its bytes' lines, cut at b"\\n" (a file object reads a line at
    a time: memory flat in the file's length); a UTF-8 byte order mark before the first line dropped."""
    for number, line in enumerate(stream, 1):
        yield number, line.removeprefix(_UTF8_BOM) if number == 1 else line


def field_values(lines: Iterable[tuple[int, bytes | str]], field: str, source: str, missing: str,
                 error: type[Exception] = ValueError) -> Iterator[tuple[int, str]]:
    """(line number, the string in `field`) of each record of the numbered lines, blank lines skipped; `error`
    (naming `source` and the line, what is wrong and the fix) for a line that is not a JSON object with a string
    in `field`; `missing`: the fix where a record lacks the field."""
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{source} line {number}"
        if number == 1 and isinstance(line, bytes) and line[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise error(f"{source} is UTF-16 (it starts with a UTF-16 byte order mark); convert it to UTF-8 (e.g. "
                        f"iconv -f utf-16 -t utf-8)")
        try:
            record = json.loads(line)
        except UnicodeDecodeError:                                       # (a ValueError too: first)
            raise error(f"{where} is not UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        except ValueError as e:
            reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise error(f"{where} is not JSON ({reason}); a {SUFFIX} file holds one JSON object a line (to read "
                        f"the file as plain text, give it another suffix, e.g. .txt)") from None
        if not isinstance(record, dict):
            raise error(f"{where} is a JSON {_JSON_TYPES.get(type(record), type(record).__name__)}, not an object "
                        f"{{\"{field}\": \"...\"}}")
        if field not in record:
            fields = ", ".join(json.dumps(k) for k in list(record)[:8]) + (", ..." if len(record) > 8 else "")
            raise error(f"{where} has no {json.dumps(field)} field (its fields: {fields or 'none'}); {missing}")
        value = record[field]
        if not isinstance(value, str):
            raise error(f"{where}: its {json.dumps(field)} is a JSON "
                        f"{_JSON_TYPES.get(type(value), type(value).__name__)}, not a string")
        yield number, value


def record_texts(stream: io.BufferedIOBase | Iterable[bytes], field: str, source: str,
                 error: type[Exception] = ValueError) -> Iterator[tuple[int, bytes]]:
    """(line number, UTF-8 bytes of the text) of each record of a JSON Lines file of --data (`field_values`)."""
    missing = ("give --text-field the name of the field that holds the text (or, to read the file as plain text, "
               "give it another suffix, e.g. .txt)" if field == TEXT_FIELD else
               "check --text-field, or give every record that field")
    for number, text in field_values(numbered_lines(stream), field, source, missing, error):
        try:
            yield number, text.encode("utf-8")
        except UnicodeEncodeError as e:      # an escape such as "\ud800": half of a UTF-16 pair, no character
            raise error(f"{source} line {number}: its {json.dumps(field)} holds an unpaired surrogate "
                        f"(\\u{ord(text[e.start]):04x}), which is no character and has no UTF-8 form; fix the "
                        f"escape in the file") from None
