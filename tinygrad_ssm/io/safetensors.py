"""Safetensors files, read and written without pickle and without a deep-learning framework.

Format: 8 bytes little-endian header length n, then n bytes of JSON
`{"__metadata__": {str: str}, key: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}`,
then the raw little-endian data (offsets count from the end of the header).

We read the format ourselves (NumPy has no bfloat16, so the library's NumPy API cannot read BF16 files),
validate the whole header against the file's size before reading a byte of data (as strictly as the library:
the tensors cover the data section exactly), keep the file open from then on (a file replaced or moved after
it was opened is not read in its place: the library maps it once), and write through the safetensors library
into a temporary file that replaces the target only once it is complete and synced.
"""
from __future__ import annotations

import json
import math
import os
import stat
import struct
import threading
from dataclasses import dataclass

import numpy as np

from .atomic_write import write_atomic
from .file_checks import GIT_LFS_FIX, GIT_LFS_POINTER, is_git_lfs_pointer, require_regular_file

MAX_HEADER_BYTES = 100_000_000  # the library's own limit (safetensors' MAX_HEADER_SIZE): larger means corrupt

# safetensors dtype tag -> little-endian NumPy dtype; BF16 is stored as raw uint16 and widened on read
_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
FLOAT_TAGS = ("F64", "F32", "F16", "BF16")
# tags of the format that NumPy cannot hold, with their bytes per element: a file may carry them beside the
# tensors we want, so the file opens and only reading one of these is refused (as the library's safe_open)
_UNREADABLE = {"F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "C64": 8}
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

    def not_float_reason(self) -> str | None:
        """None for a float tensor we read, else why it cannot fill a float variable, in words."""
        if self.dtype in _UNREADABLE:
            return f"stored dtype {self.dtype} cannot be read (the float dtypes read: {', '.join(FLOAT_TAGS)})"
        return None if self.is_float else f"stored dtype {self.dtype} is not floating point"


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32: bfloat16 is the top half of a float32, so shift into the high bits."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def float_to_bf16(values: np.ndarray) -> np.ndarray:
    """float values -> bfloat16 bits (uint16), rounded to nearest, ties to even, as torch's .to(torch.bfloat16):
    a float64 value through float32 first (torch does the same); NaN stays a quiet NaN of its sign, a value past
    bfloat16's largest becomes infinity. In slabs of BF16_SLAB values: whole, its temporaries were 5x the array
    (737 MiB for the 130M shape's 147 MiB head)."""
    with np.errstate(over="ignore"):                                    # past float32's range: infinity, as torch
        f32 = np.asarray(values, np.float32)                            # (a 0-d array stays 0-d)
    out = np.empty(f32.shape, np.uint16)
    flat, out_flat = f32.reshape(-1), out.reshape(-1)                   # out's a view; f32's one if contiguous
    for lo in range(0, flat.size, BF16_SLAB):
        bits = flat[lo:lo + BF16_SLAB].view(np.uint32)
        rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        out_flat[lo:lo + BF16_SLAB] = np.where(np.isnan(bits.view(np.float32)), (bits >> 16) | 0x40, rounded)
    return out


BF16_SLAB = 1 << 18


STORED_DTYPES = ("float64", "float32", "float16", "bfloat16")   # what a float array may be stored as


def stored_as(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """The float `array` as it is stored in `dtype` (STORED_DTYPES), rounded to nearest, ties to even: an array of
    that dtype, or for "bfloat16" its bits (uint16, for save_file's `bfloat16`). Checked first (check_storable)."""
    check_storable(name, array, dtype)
    return float_to_bf16(array) if dtype == "bfloat16" else np.asarray(array).astype(dtype, copy=False)


def check_storable(name: str, array: np.ndarray, dtype: str) -> None:
    """Raises ValueError, naming the tensor `name`, when `dtype` is not one of STORED_DTYPES or a finite value of
    `array` would be stored as infinity (float16 past 65,504). Rounding is monotonic, so the largest finite
    magnitude alone decides."""
    if dtype not in STORED_DTYPES:
        raise ValueError(f"store {name!r}: dtype must be one of {', '.join(STORED_DTYPES)}, got {dtype!r}")
    finite = np.abs(array[np.isfinite(array)])
    largest = finite.max() if finite.size else 0.0
    with np.errstate(over="ignore"):                                    # the overflow is what is looked for
        stored = bf16_to_float32(float_to_bf16(largest)) if dtype == "bfloat16" else np.asarray(largest).astype(dtype)
    if np.isinf(stored):
        wider = {"float16": "float32 or bfloat16", "bfloat16": "float32"}.get(dtype, "float64")
        raise ValueError(f"store {name!r}: its values reach {float(largest):.6g} in magnitude, past the largest "
                         f"{dtype}, and would be stored as infinity; store it as {wider}")


class SafetensorsFile:
    """A validated safetensors file: `.tensors` (name -> TensorInfo, file order), `.metadata`, `read(name)`.
    Opening checks the header completely (JSON, dtypes, shapes, offsets inside the file, sizes that match
    the shapes, the data section covered with no gap or overlap), so a corrupt or truncated file fails here,
    naming the file, before any read. The file stays open until `close()` (or the end of a `with` block, or
    garbage collection): every read is of the file that was validated, even if its path is replaced since."""

    def __init__(self, path):
        self.path = os.fspath(path)
        require_regular_file(self.path, "safetensors file", CheckpointError)  # a FIFO would block the open
        self._file = open(self.path, "rb", buffering=0)                  # unbuffered: reads land in place
        self._lock = threading.Lock()                                   # reads seek: one at a time
        try:
            self.tensors, self.metadata, self._data_start = _parse_header(self.path, self._file)
        except BaseException:
            self._file.close()
            raise

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()

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
        native = self._native(info)
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
        native = self._native(info)
        out = np.empty((stop - start, *info.shape[1:]), dtype=native if dtype is None else np.dtype(dtype))
        return self._read_elements(info, out, first=start * math.prod(info.shape[1:]))

    def _native(self, info: TensorInfo) -> np.dtype:
        """The NumPy dtype a stored tensor is read as (BF16 as float32); a dtype NumPy cannot hold is refused."""
        if info.dtype in _UNREADABLE:
            raise CheckpointError(f"{self.path!r}: tensor {info.name!r} has dtype {info.dtype}, which NumPy cannot "
                                  f"hold (readable: {', '.join(_DTYPES)})")
        return np.dtype(np.float32) if info.dtype == "BF16" else _DTYPES[info.dtype].newbyteorder("=")

    def _read_elements(self, info: TensorInfo, out: np.ndarray, first: int) -> np.ndarray:
        """Fill the contiguous `out` with the stored elements first, first + 1, ... (flat, C order), converted.
        A conversion that turns a finite stored value into an infinity (F64 1e300 into float32) is refused before
        anything is written into `out` (a narrowing conversion reads the elements twice: checked, then written)."""
        name, flat = info.name, out.reshape(-1)                         # (n,) a view: out is contiguous
        self._native(info)
        stored = _DTYPES[info.dtype]
        where = lambda: f"{self.path!r}: tensor {name!r}"  # noqa: E731
        with self._lock:
            if self._file.closed:
                raise ValueError(f"{self.path!r} was closed; open it again (SafetensorsFile) to read {name!r}")
            f, offset = self._file, self._data_start + info.begin + first * stored.itemsize
            f.seek(offset)
            if stored == out.dtype and info.dtype != "BF16":             # the same bytes: no conversion
                self._read_exactly(f, flat.view(np.uint8), name)
                return out
            if info.dtype == "BF16" and out.dtype == np.float32:        # widened straight into out's bits
                for start, piece in self._pieces(f, stored, flat.size, name):
                    np.left_shift(piece, 16, out=flat[start:start + piece.size].view(np.uint32), dtype=np.uint32)
                return out
            if _may_overflow(np.float32 if info.dtype == "BF16" else stored, out.dtype):
                scratch = np.empty(min(max(1, READ_PIECE_BYTES // stored.itemsize), flat.size), out.dtype)
                for _, piece in self._pieces(f, stored, flat.size, name):
                    values = bf16_to_float32(piece) if info.dtype == "BF16" else piece
                    converted = scratch[:values.size]
                    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
                        np.copyto(converted, values, casting="unsafe")
                    _check_no_overflow(values, converted, where, out.dtype)
                f.seek(offset)
            for start, piece in self._pieces(f, stored, flat.size, name):
                values = bf16_to_float32(piece) if info.dtype == "BF16" else piece
                with np.errstate(over="ignore", invalid="ignore"):      # (checked above where it can overflow)
                    np.copyto(flat[start:start + values.size], values, casting="unsafe")  # astype's conversion
        return out

    def _pieces(self, f, stored: np.dtype, count: int, name: str):
        """(start, piece) of the next `count` stored elements of the open file f, READ_PIECE_BYTES at a time;
        one buffer, reused: each piece is valid until the next."""
        per_piece = max(1, READ_PIECE_BYTES // stored.itemsize)
        buffer = np.empty(min(per_piece, count), dtype=stored)          # (piece,) the stored dtype
        for start in range(0, count, per_piece):
            piece = buffer[:min(per_piece, count - start)]
            self._read_exactly(f, piece.view(np.uint8), name)
            yield start, piece

    def _read_exactly(self, f, target: np.ndarray, name: str) -> None:
        view, done = memoryview(target), 0  # (bytes,) one read may return less than asked (2 GiB cap on Linux)
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:  # the file shrank after we validated it
                raise CheckpointError(f"{self.path!r}: truncated while reading {name!r}")
            done += n


def _may_overflow(source: np.dtype, target: np.dtype) -> bool:
    """Whether converting `source` values to `target` can make an infinity of a finite value."""
    source, target = np.dtype(source), np.dtype(target)
    if target.kind != "f" or source.kind not in "iuf":
        return False
    largest = np.finfo(source).max if source.kind == "f" else np.iinfo(source).max
    return float(largest) > float(np.finfo(target).max)


def _check_no_overflow(stored: np.ndarray, converted: np.ndarray, where, dtype) -> None:
    """Refuse a conversion that made an infinity of a finite value (a narrowing cast past the dtype's range)."""
    if converted.dtype.kind != "f" or np.isfinite(converted).all():
        return
    made = ~np.isfinite(converted) & np.isfinite(stored)                # (n,) bool
    if made.any():
        at = int(np.argmax(made))
        raise CheckpointError(f"{where()} holds {stored[at]}, beyond the range of {np.dtype(dtype)} (it would load "
                              f"as {converted[at]}): load it into a wider dtype")


def _parse_header(path: str, f):
    def bad(why: str):
        return CheckpointError(f"{path!r} is not a valid safetensors file: {why}")

    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):  # replaced by something else between the check and the open
        raise bad("it is not a regular file")
    size = st.st_size
    head = f.read(8)
    if is_git_lfs_pointer(head + f.read(len(GIT_LFS_POINTER) - 8)):
        raise bad(GIT_LFS_FIX)
    f.seek(8)
    if len(head) < 8:
        raise bad(f"it is {size} bytes long, shorter than the 8-byte header length (truncated?)")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise bad(f"the header length field says {n:,} bytes, over the format's limit of {MAX_HEADER_BYTES:,} "
                  f"(a corrupt file, or not a safetensors file)")
    if 8 + n > size:
        raise bad(f"the header claims {n} bytes but the file has {size - 8} after the length (truncated)")
    header_bytes = f.read(n)
    try:
        header = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=_note_duplicate_keys)
    except (ValueError, RecursionError) as e:  # (an int of 5,000 digits, [[[...]]] 100,000 deep: bare errors before)
        raise bad(f"the header is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    if isinstance(header, _Duplicated):  # JSON keeps the last of two equal keys: which tensor is meant is ambiguous
        raise bad(f"the header names {header.duplicate!r} twice")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise bad(f"__metadata__ must map strings to strings, got {metadata!r:.200}")
    if isinstance(metadata, _Duplicated):
        raise bad(f"__metadata__ names {metadata.duplicate!r} twice")
    data_size = size - 8 - n
    tensors = {}
    for name, entry in header.items():
        if isinstance(entry, _Duplicated):
            raise bad(f"entry {name!r} gives {entry.duplicate!r} twice")
        try:
            tag, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {name!r} needs dtype, shape and data_offsets [begin, end], got {entry!r}") from None
        if not isinstance(tag, str) or (tag not in _DTYPES and tag not in _UNREADABLE):
            raise bad(f"tensor {name!r} has dtype {tag!r}, which is not supported (supported: {', '.join(_DTYPES)})")
        if not all(_is_index(d) for d in shape) or not all(_is_index(o) for o in (begin, end)):
            raise bad(f"tensor {name!r}: shape {list(shape)} and data_offsets {[begin, end]} must be integers >= 0")
        if len(shape) > 64 or any(d >= 2 ** 63 for d in shape):  # NumPy's limits (the library's: a usize each):
            raise bad(f"tensor {name!r}: shape {list(shape)[:8]}{'...' if len(shape) > 8 else ''} has "  # a raw
                      f"{len(shape)} axes or an axis of 2**63 or more; at most 64 axes below 2**63")  # NumPy error
        itemsize = _UNREADABLE[tag] if tag in _UNREADABLE else _DTYPES[tag].itemsize
        expected = math.prod(shape) * itemsize  # Python ints: [2**32, 2**32] cannot wrap around
        if not 0 <= begin <= end or end - begin != expected:
            raise bad(f"tensor {name!r} ({tag}, shape {list(shape)}) needs {expected} bytes, "
                      f"offsets give {end - begin}")
        if end > data_size:
            raise bad(f"tensor {name!r} ends at data byte {end} but the file holds only {data_size} data bytes "
                      f"(truncated)")
        tensors[name] = TensorInfo(name, tag, shape, begin, end)
    _check_covered(tensors, data_size, bad)
    return tensors, metadata, 8 + n


def _check_covered(tensors: dict, data_size: int, bad) -> None:
    """The tensors, in the order of their offsets, must follow one another from data byte 0 to the file's end,
    as the library writes them and requires them (no overlap, no gap, nothing after the last)."""
    at, previous = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < at:
            raise bad(f"tensors {previous!r} and {t.name!r} overlap")
        if t.begin > at:
            raise bad(f"data bytes {at}..{t.begin} belong to no tensor (a gap before {t.name!r})")
        at, previous = t.end, t.name
    if at != data_size:
        raise bad(f"{data_size - at} bytes follow the last tensor's data (the tensors cover {at} of the file's "
                  f"{data_size} data bytes)")


class _Duplicated(dict):
    """A JSON object that named a key twice (`duplicate`): refused where its place in the header is known."""
    duplicate = None


def _note_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            seen = _Duplicated(seen)
            seen.duplicate = key
        seen[key] = value
    return seen


def _is_index(value) -> bool:
    # JSON true is a Python bool, an int subclass: not a size; 2.0 is not one either
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_file(path, dtype=None) -> dict:
    """Every tensor of a safetensors file as name -> ndarray (BF16 widened to float32; `dtype` casts all)."""
    with SafetensorsFile(path) as f:
        return {name: f.read(name, dtype) for name in f.tensors}


def save_file(path, arrays: dict, metadata: dict | None = None, bfloat16: frozenset | set = frozenset()):
    """Write name -> ndarray as safetensors, atomically: a temporary file in the same directory, synced to
    disk, then renamed over `path` (a crash leaves either the old file or the new one, never half of one).
    `bfloat16`: the names whose arrays are bfloat16 bits (uint16, float_to_bf16's), stored as BF16 (the
    safetensors library's NumPy writer has none: _tagged_bfloat16)."""
    path = os.fspath(path)
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(f"save {path!r}: metadata must be a dict of str -> str, got {type(metadata).__name__}")
        bad = {k: v for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise TypeError(f"save {path!r}: metadata must map str -> str, got {bad!r}")
    readable = {dtype.newbyteorder("="): tag for tag, dtype in _DTYPES.items() if tag != "BF16"}
    for name, array in arrays.items():
        if not isinstance(name, str) or not isinstance(array, np.ndarray):
            raise TypeError(f"save {path!r}: need str -> np.ndarray, got {name!r} -> {type(array).__name__}")
        if name == "__metadata__":
            raise ValueError(f"save {path!r}: a tensor may not be named '__metadata__' (the format's header keeps "
                             f"that key for the metadata): rename it")
        if array.dtype.newbyteorder("=") not in readable:
            raise TypeError(f"save {path!r}: tensor {name!r} has dtype {array.dtype}, which a safetensors file read "
                            f"by this package cannot hold (dtypes: {', '.join(str(d) for d in readable)})")
        if name in bfloat16 and array.dtype.newbyteorder("=") != np.uint16:
            raise TypeError(f"save {path!r}: tensor {name!r} is to be stored as BF16 but holds {array.dtype}, not "
                            f"the uint16 bits of bfloat16 (float_to_bf16 gives them)")
    unknown = sorted(set(bfloat16) - set(arrays))
    if unknown:
        raise ValueError(f"save {path!r}: bfloat16 names tensors that are not saved: {unknown}")
    from safetensors.numpy import save as encode  # imported here: only writing needs the library

    # (not np.ascontiguousarray: it turns a 0-d array into shape (1,))
    payload = encode({k: np.array(v, order="C", copy=not v.flags.c_contiguous) for k, v in arrays.items()},
                     metadata=metadata)
    write_atomic(path, _tagged_bfloat16(payload, bfloat16) if bfloat16 else payload)


def _tagged_bfloat16(payload: bytes, names) -> tuple:
    """The library's file with the tensors `names` (written as U16: its NumPy writer has no bfloat16) tagged BF16,
    as write_atomic's pieces: the header re-encoded as the library encodes it (compact JSON, padded with spaces to
    a multiple of 8 bytes), then the same bytes of data, not copied (the offsets count from the header's end)."""
    n = struct.unpack("<Q", payload[:8])[0]
    header = json.loads(payload[8:8 + n])
    for name in names:
        header[name]["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, memoryview(payload)[8 + n:]
