"""Files of JSON records: JSON Lines (.jsonl), and a .json file named as the file itself.

train and eval read such a file of --data as documents, one a record: the string in its "text" field, as Hugging
Face datasets (`load_dataset("json")`) and transformers' run_clm read it (--text-field names another field);
generate --batch-file reads a prompt a record from "prompt".

- A .jsonl file is one JSON object a line, wherever it is (named by --data, or in a --data folder).
- A .json file named as the file itself (`--data set.json`, `--batch-file prompts.json`) holds either a JSON array
  of objects (`[{"text": ...}, ...]`: the whole file is read at once) or one object a line (what datasets'
  `to_json` writes). A .json file inside a --data folder is text like the folder's other files (a code folder's
  package.json, a config), and the corpus says how many were read so: name one as --data to read its records.

A record is known by the line it starts on, in errors and in a corpus's names (`set.jsonl:17`). Lines are cut at
"\\n" alone: a JSON string escapes every control character, but U+0085, U+2028 and U+2029 may stand in it as they
are, and str.splitlines would cut the record there. A record's text goes into the corpus as UTF-8.
"""
from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

SUFFIX = ".jsonl"         # JSON Lines, named or in a folder
NAMED_SUFFIX = ".json"    # records only where the file is named itself (an array of objects, or JSON Lines)
TEXT_FIELD = "text"       # train's and eval's --text-field
_UTF8_BOM = b"\xef\xbb\xbf"
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def is_json_lines(path: str | Path) -> bool:
    """Whether `path` is JSON Lines by its suffix (in any case), so read as records wherever it is."""
    return Path(path).suffix.lower() == SUFFIX


def reads_records(path: str | Path, named: bool) -> bool:
    """Whether `path` is read as records: a .jsonl file always, a .json file when it is the file named (`named`),
    not one found in a folder."""
    return is_json_lines(path) or (named and Path(path).suffix.lower() == NAMED_SUFFIX)


def check_text_field(text_field: str, reads_json_lines: bool, source: str, error: type[Exception] = ValueError) -> None:
    """--text-field names a field of records: `error` where it is given and `source` holds no file of records."""
    if text_field != TEXT_FIELD and not reads_json_lines:
        raise error(f"--text-field names the field of the records of a {SUFFIX} file (or of a {NAMED_SUFFIX} file "
                    f"given as the path itself) that holds the text, and {source!r} holds no such file; leave "
                    f"--text-field out")


def numbered_lines(stream: io.BufferedIOBase | Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line) of a binary file or its bytes' lines, cut at b"\\n" (a file object reads a line at
    a time: memory flat in the file's length); a UTF-8 byte order mark before the first line dropped."""
    for number, line in enumerate(stream, 1):
        yield number, line.removeprefix(_UTF8_BOM) if number == 1 else line


def _layout(suffix: str) -> str:
    """What a file of records with this suffix holds, for the errors' fixes."""
    if suffix == NAMED_SUFFIX:
        return f"a {NAMED_SUFFIX} file holds a JSON array of objects, or one JSON object a line"
    return f"a {SUFFIX} file holds one JSON object a line"


def parsed_records(lines: Iterable[tuple[int, bytes | str]], source: str, error: type[Exception] = ValueError,
                   suffix: str = SUFFIX) -> Iterator[tuple[int, object]]:
    """(the line it starts on, the parsed JSON value) of each record of the numbered lines: one a line, blank lines
    skipped; for a .json file (`suffix`) whose first character is "[", the items of that one array (the rest of
    the file read at once). `error` names `source`, the line and the fix where a record is not JSON."""
    lines = iter(lines)
    for number, line in lines:
        if not line.strip():
            continue
        if number == 1 and isinstance(line, bytes) and line[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise error(f"{source} is UTF-16 (it starts with a UTF-16 byte order mark); convert it to UTF-8 (e.g. "
                        f"iconv -f utf-16 -t utf-8)")
        if suffix == NAMED_SUFFIX and line.lstrip()[:1] in (b"[", "["):
            blank = "\n" * (number - 1)                                  # the array's lines keep their numbers
            yield from _array_items(blank, line, (rest for _, rest in lines), source, error)
            return
        where = f"{source} line {number}"
        try:
            yield number, json.loads(line)
        except UnicodeDecodeError:                                       # (a ValueError too: first)
            raise error(f"{where} is not UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        except ValueError as e:
            reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            whole = _one_object(line, lines) if suffix == NAMED_SUFFIX and number == 1 else None
            if whole is not None:
                raise error(f"{source} is one JSON object (its fields: {_fields(whole)}), not records: "
                            f"{_layout(suffix)}; where the records are a list in one field, write that list to "
                            f"the file") from None
            raise error(f"{where} is not JSON ({reason}); {_layout(suffix)} (to read the file as plain text, give "
                        f"it another suffix, e.g. .txt)") from None


def _one_object(first: bytes | str, rest: Iterator[tuple[int, bytes | str]]) -> dict | None:
    """The file as one JSON object, when it is one spread over several lines (else None)."""
    parts = [first, *(line for _, line in rest)]
    try:
        whole = json.loads(b"".join(parts) if isinstance(first, bytes) else "\n".join(parts))
    except ValueError:
        return None
    return whole if isinstance(whole, dict) else None


def _array_items(blank: str, first: bytes | str, rest: Iterable[bytes | str], source: str,
                 error: type[Exception]) -> Iterator[tuple[int, object]]:
    """(the line it starts on, value) of each item of the one JSON array that `first` opens and `rest` continues;
    `blank` stands for the blank lines before it."""
    if isinstance(first, bytes):
        data = b"".join([first, *rest])
        try:
            text = blank + data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = len(blank) + data.count(b"\n", 0, e.start) + 1
            raise error(f"{source} line {line} is not UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t "
                        f"utf-8)") from None
    else:
        text = blank + "\n".join([first, *rest])

    def skip_space(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    line, counted = 1, 0                                                 # the line at offset `counted`

    def line_of(i: int) -> int:                                          # offsets only grow: each newline counted once
        nonlocal line, counted
        line, counted = line + text.count("\n", counted, i), i
        return line

    decoder = json.JSONDecoder()
    i = skip_space(skip_space(0) + 1)                                    # past "["
    if text[i:i + 1] == "]":
        i += 1
    else:
        while True:
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise error(f"{source} line {e.lineno} is not JSON ({e.msg}); {_layout(NAMED_SUFFIX)}") from None
            yield line_of(i), value
            i = skip_space(end)
            if text[i:i + 1] == ",":
                i = skip_space(i + 1)
                continue
            if text[i:i + 1] == "]":
                i += 1
                break
            raise error(f"{source} line {line_of(i)}: its array goes on without a ',' between two items, or ends "
                        f"without a ']'; {_layout(NAMED_SUFFIX)}")
    if skip_space(i) < len(text):
        raise error(f"{source} line {line_of(skip_space(i))} holds more after the array's closing ']'; "
                    f"{_layout(NAMED_SUFFIX)}")


def _fields(record: dict) -> str:
    return ", ".join(json.dumps(k) for k in list(record)[:8]) + (", ..." if len(record) > 8 else "") or "none"


def field_values(records: Iterable[tuple[int, object]], field: str, source: str, missing: str,
                 error: type[Exception] = ValueError) -> Iterator[tuple[int, str]]:
    """(line number, the string in `field`) of each parsed record (`parsed_records`); `error` (naming `source` and
    the line, what is wrong and the fix) for a record that is not a JSON object with a string in `field`;
    `missing`: the fix where a record lacks the field."""
    for number, record in records:
        where = f"{source} line {number}"
        if not isinstance(record, dict):
            raise error(f"{where} is a JSON {_JSON_TYPES.get(type(record), type(record).__name__)}, not an object "
                        f"{{\"{field}\": \"...\"}}")
        if field not in record:
            nested = [k for k, v in record.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
            inside = (f"; {json.dumps(nested[0])} holds a list of objects: where those are the records, write that "
                      f"list to the file" if nested else "")
            raise error(f"{where} has no {json.dumps(field)} field (its fields: {_fields(record)}{inside}); {missing}")
        value = record[field]
        if not isinstance(value, str):
            raise error(f"{where}: its {json.dumps(field)} is a JSON "
                        f"{_JSON_TYPES.get(type(value), type(value).__name__)}, not a string")
        yield number, value


def record_texts(stream: io.BufferedIOBase | Iterable[bytes], field: str, source: str,
                 error: type[Exception] = ValueError, suffix: str = SUFFIX) -> Iterator[tuple[int, bytes]]:
    """(line number, UTF-8 bytes of the text) of each record of a file of --data (`parsed_records`, `field_values`);
    `suffix`: the file's (.jsonl, or .json for a file named as the path itself)."""
    missing = ("give --text-field the name of the field that holds the text (or, to read the file as plain text, "
               "give it another suffix, e.g. .txt)" if field == TEXT_FIELD else
               "check --text-field, or give every record that field")
    records = parsed_records(numbered_lines(stream), source, error, suffix)
    for number, text in field_values(records, field, source, missing, error):
        try:
            yield number, text.encode("utf-8")
        except UnicodeEncodeError as e:      # an escape such as "\ud800": half of a UTF-16 pair, no character
            raise error(f"{source} line {number}: its {json.dumps(field)} holds an unpaired surrogate "
                        f"(\\u{ord(text[e.start]):04x}), which is no character and has no UTF-8 form; fix the "
                        f"escape in the file") from None
