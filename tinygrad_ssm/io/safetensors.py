"""Safetensors files, read and written without pickle and without a deep-learning framework.

Format: 8 bytes little-endian header length n, then n bytes of JSON
`{"__metadata__": {str: str}, key: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}`,
then the raw little-endian data (offsets count from the end of the header).

We read the format ourselves (NumPy has no bfloat16, so the library's NumPy API cannot read BF16 files),
validate the whole header against the file's size before reading a byte of data, and write through the
safetensors library into a temporary file that replaces the target only once it is complete and synced.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from .atomic_write import write_atomic
from .file_checks import require_regular_file

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the library's own limit: a larger header means a corrupt file

# safetensors dtype tag -> little-endian NumPy dtype; BF16 is stored as raw uint16 and widened on read
_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
FLOAT_TAGS = ("F64", "F32", "F16", "BF16")
READ_PIECE_BYTES = 1 << 20  # read_into's conversion buffer: small next to a weight, large next to a read's overhead


class CheckpointError(ValueError):
    """A safetensors file that is corrupt, truncated, or does not fit the variables it is loaded into."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str          # the safetensors tag, e.g. "F32", "BF16"
    shape: tuple
    begin: int          # byte offsets into the data section
    end: int

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_TAGS


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32: bfloat16 is the top half of a float32, so shift into the high bits."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


class SafetensorsFile:
    """A validated safetensors file: `.tensors` (name -> TensorInfo, file order), `.metadata`, `read(name)`.
    Opening checks the header completely (JSON, dtypes, shapes, offsets inside the file, sizes that match
    the shapes, no overlaps), so a corrupt or truncated file fails here, naming the file, before any read."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.tensors, self.metadata, self._data_start = _parse_header(self.path)

    def keys(self):
        return list(self.tensors)

    def __contains__(self, name):
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path!r}: no tensor named {name!r} (the file holds {len(self.tensors)} tensors)")
        return info

    def read(self, name: str, dtype=None) -> np.ndarray:
        """The stored array (a fresh, writable copy), BF16 widened to float32, then cast to `dtype` if given."""
        info = self.info(name)
        native = np.float32 if info.dtype == "BF16" else _DTYPES[info.dtype].newbyteorder("=")
        return self.read_into(name, np.empty(info.shape, dtype=native if dtype is None else np.dtype(dtype)))

    def read_into(self, name: str, out: np.ndarray) -> np.ndarray:
        """Read the stored tensor `name` straight into `out` (an existing array of its shape, C-contiguous and
        writable) and return `out`. Stored bytes of out's dtype are read into it directly; any other dtype
        (F16 / BF16 / F64 -> float32, ...) is converted as `astype` would, through one buffer of at most
        READ_PIECE_BYTES, so loading a checkpoint never holds a second full-size copy of a tensor."""
        info = self.info(name)
        if not isinstance(out, np.ndarray):
            raise TypeError(f"read_into {name!r}: out must be a NumPy array, got {type(out).__name__}")
        if out.shape != info.shape:
            raise ValueError(f"read_into {name!r}: out has shape {out.shape} but {self.path!r} stores shape "
                             f"{info.shape}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"read_into {name!r}: out must be C-contiguous and writable (read into a fresh "
                             f"np.empty, then copy)")
        return self._read_elements(info, out, first=0)

    def read_rows(self, name: str, start: int, stop: int, dtype=None) -> np.ndarray:
        """Rows start:stop of the stored tensor's first axis, as `read(name, dtype)[start:stop]` but reading
        only those rows: to go through a large tensor in bounded pieces."""
        info = self.info(name)
        if not info.shape or not 0 <= start <= stop <= info.shape[0]:
            raise ValueError(f"read_rows {name!r}: need 0 <= start <= stop <= rows of {self.path!r}'s shape "
                             f"{info.shape}, got {start}:{stop}")
        native = np.float32 if info.dtype == "BF16" else _DTYPES[info.dtype].newbyteorder("=")
        out = np.empty((stop - start, *info.shape[1:]), dtype=native if dtype is None else np.dtype(dtype))
        return self._read_elements(info, out, first=start * math.prod(info.shape[1:]))

    def _read_elements(self, info: TensorInfo, out: np.ndarray, first: int) -> np.ndarray:
        """Fill the contiguous `out` with the stored elements first, first + 1, ... (flat, C order), converted."""
        name, flat = info.name, out.reshape(-1)                         # (n,) a view: out is contiguous
        stored = _DTYPES[info.dtype]
        with open(self.path, "rb", buffering=0) as f:                   # unbuffered: the bytes land in place
            f.seek(self._data_start + info.begin + first * stored.itemsize)
            if stored == out.dtype and info.dtype != "BF16":             # the same bytes: no conversion
                self._read_exactly(f, flat.view(np.uint8), name)
                return out
            per_piece = max(1, READ_PIECE_BYTES // stored.itemsize)
            buffer = np.empty(min(per_piece, flat.size), dtype=stored)  # (piece,) the stored dtype
            for start in range(0, flat.size, per_piece):
                piece = buffer[:min(per_piece, flat.size - start)]
                self._read_exactly(f, piece.view(np.uint8), name)
                into = flat[start:start + piece.size]
                if info.dtype == "BF16" and out.dtype == np.float32:    # widened straight into out's bits
                    np.left_shift(piece, 16, out=into.view(np.uint32), dtype=np.uint32)
                else:
                    values = bf16_to_float32(piece) if info.dtype == "BF16" else piece
                    np.copyto(into, values, casting="unsafe")           # astype's conversion
        return out

    def _read_exactly(self, f, target: np.ndarray, name: str) -> None:
        view, done = memoryview(target), 0  # (bytes,) one read may return less than asked (2 GiB cap on Linux)
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:  # the file shrank after we validated it
                raise CheckpointError(f"{self.path!r}: truncated while reading {name!r}")
            done += n


def _parse_header(path: str):
    def bad(why: str):
        return CheckpointError(f"{path!r} is not a valid safetensors file: {why}")

    size = require_regular_file(path, "safetensors file", CheckpointError)  # a FIFO would block the read
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"it is {size} bytes long, shorter than the 8-byte header length (truncated?)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise bad(f"the header claims {n} bytes but the file has {size - 8} after the length "
                      f"(truncated or corrupt)")
        header_bytes = f.read(n)
    try:
        header = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as e:  # JSON keeps the last of two equal keys: which tensor is meant is ambiguous
        raise bad(f"the header names {e.args[0]!r} twice") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise bad("__metadata__ must map strings to strings")
    data_size = size - 8 - n
    tensors = {}
    for name, entry in header.items():
        try:
            tag, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {name!r} needs dtype, shape and data_offsets [begin, end], got {entry!r}") from None
        if not isinstance(tag, str) or tag not in _DTYPES:
            raise bad(f"tensor {name!r} has dtype {tag!r}, which is not supported (supported: {', '.join(_DTYPES)})")
        if not all(_is_index(d) for d in shape) or not all(_is_index(o) for o in (begin, end)):
            raise bad(f"tensor {name!r}: shape {list(shape)} and data_offsets {[begin, end]} must be integers >= 0")
        expected = math.prod(shape) * _DTYPES[tag].itemsize  # Python ints: [2**32, 2**32] cannot wrap around
        if not 0 <= begin <= end or end - begin != expected:
            raise bad(f"tensor {name!r} ({tag}, shape {list(shape)}) needs {expected} bytes, "
                      f"offsets give {end - begin}")
        if end > data_size:
            raise bad(f"tensor {name!r} ends at data byte {end} but the file holds only {data_size} data bytes "
                      f"(truncated)")
        tensors[name] = TensorInfo(name, tag, shape, begin, end)
    spans = sorted((t.begin, t.end, t.name) for t in tensors.values() if t.end > t.begin)
    for (_, end0, name0), (begin1, _, name1) in zip(spans, spans[1:]):
        if begin1 < end0:
            raise bad(f"tensors {name0!r} and {name1!r} overlap")
    return tensors, metadata, 8 + n


class _DuplicateKey(Exception):
    pass


def _refuse_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def _is_index(value) -> bool:
    # JSON true is a Python bool, an int subclass: not a size; 2.0 is not one either
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_file(path, dtype=None) -> dict:
    """Every tensor of a safetensors file as name -> ndarray (BF16 widened to float32; `dtype` casts all)."""
    f = SafetensorsFile(path)
    return {name: f.read(name, dtype) for name in f.tensors}


def save_file(path, arrays: dict, metadata: dict | None = None):
    """Write name -> ndarray as safetensors, atomically: a temporary file in the same directory, synced to
    disk, then renamed over `path` (a crash leaves either the old file or the new one, never half of one)."""
    path = os.fspath(path)
    if metadata is not None:
        bad = {k: v for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise TypeError(f"save {path!r}: metadata must map str -> str, got {bad!r}")
    for name, array in arrays.items():
        if not isinstance(name, str) or not isinstance(array, np.ndarray):
            raise TypeError(f"save {path!r}: need str -> np.ndarray, got {name!r} -> {type(array).__name__}")
    from safetensors.numpy import save as encode  # imported here: only writing needs the library

    # (not np.ascontiguousarray: it turns a 0-d array into shape (1,))
    payload = encode({k: np.array(v, order="C", copy=not v.flags.c_contiguous) for k, v in arrays.items()},
                     metadata=metadata)
    write_atomic(path, payload)
