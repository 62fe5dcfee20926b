"""The parameter registry: every trainable tensor is created through a VarMap and known by its name.

    varmap = VarMap(seed=0)
    vb = VarBuilder.from_varmap(varmap)
    w = vb.pp("layers").pp(0).get((8, 4), "weight", init=init.Randn(0, 0.02))   # "layers.0.weight"

The optimizer, checkpoints (`varmap.save` / `varmap.load`, safetensors) and `gradient_report` all read the
same map, so a tensor made outside it is a tensor nobody trains, saves or checks (candle's VarMap/VarBuilder).
`VarBuilder.from_safetensors(paths)` serves stored tensors through the same `get`, for inference.
`VarMap.uninitialised()` declares a model's variables without drawing them (np.empty), to be filled from a
checkpoint in place (`read_into`); `unfilled()` names what is still unwritten, and `save` refuses while any is.
"""
from __future__ import annotations

import os
from typing import Callable, NamedTuple, Sequence

import numpy as np

from .io.safetensors import CheckpointError, SafetensorsFile, save_file, stored_as
from .autograd.tensor import Tensor, is_float, no_grad

InitFn = Callable[[tuple, np.random.Generator, np.dtype], np.ndarray]


def _float_dtype(dtype, what: str) -> np.dtype:
    if dtype is None:  # the package's default, as Mamba2LMHeadModel's (NumPy's np.dtype(None) would be float64)
        return np.dtype(np.float32)
    if isinstance(dtype, str) and dtype == "bfloat16":
        raise TypeError(f"{what}: bfloat16 has no NumPy dtype; ask for float32 (stored bfloat16 is upcast)")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: dtype {dtype!r} is not a dtype; use float32 or float64") from None
    if not is_float(dtype):
        raise TypeError(f"{what}: variables must be floating point, got dtype {dtype}")
    return dtype


HUGE_PAGE = 2 << 20   # bytes: a transparent huge page on x86-64 Linux


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """nbytes as a uint8 array that starts on a HUGE_PAGE boundary, inside an allocation of whole huge pages and
    one more (the room to start on a boundary, never touched), so that Linux can map all of it in huge pages."""
    buffer = np.empty((-(-nbytes // HUGE_PAGE) + 1) * HUGE_PAGE, np.uint8)
    start = -buffer.ctypes.data % HUGE_PAGE
    return buffer[start:start + nbytes]


def _shape(shape, what: str) -> tuple:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 0 for d in shape):
        raise ValueError(f"{what}: shape must be non-negative ints, got {shape}")
    return tuple(int(d) for d in shape)


def _check_name(name, what: str, noun: str = "name") -> str:
    """A variable's name: dot-separated parts, none empty; '__metadata__' is the safetensors header's own key."""
    if (not isinstance(name, str) or name in ("", "__metadata__") or "" in name.split(".")   # a lone surrogate:
            or any("\ud800" <= c <= "\udfff" for c in name)):    # the save failed with a bare UnicodeEncodeError
        raise ValueError(f"{what}: the {noun} must be a non-empty string of dot-separated parts, none empty, in "
                         f"text UTF-8 can store and not '__metadata__' (safetensors keeps that key), got {name!r}")
    return name


def _real_values(value, target_dtype, what: str) -> np.ndarray:
    """`value` as an array of `target_dtype`: real numbers only (no strings, complex, objects), and no finite
    value turned into an infinity by the cast (1e300 into float32), each refused naming `what`."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":
        raise TypeError(f"{what}: need real numbers, got an array of dtype {array.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(target_dtype, copy=False)
    if array.dtype.kind in "fiu" and not np.isfinite(cast).all():  # an integer too: 70000 into float16
        made = ~np.isfinite(cast) & np.isfinite(array)
        if made.any():
            raise ValueError(f"{what}: the value {array.reshape(-1)[np.argmax(made.reshape(-1))]} is beyond the range "
                             f"of {np.dtype(target_dtype)}")
    return cast


class LoadResult(NamedTuple):
    """What `VarMap.load(strict=False)` could not load: names, and (name, file shape, variable shape, why) with
    why "shape" or the stored dtype's problem."""
    missing: list
    unexpected: list
    mismatched: list


class VarMap:
    """An ordered map name -> leaf Tensor (requires_grad=True), with the one random generator (`rng`) that
    initialises them all."""

    def __init__(self, seed: int = 0):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, (bool, np.bool_)) or seed < 0:
            raise ValueError(f"VarMap: seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._vars: dict[str, Tensor] = {}
        self._unfilled: set[str] | None = None  # None: variables are initialised when created
        self._slots: dict[str, np.ndarray] = {}  # path -> its place in a reserved block (reserve_block)

    @classmethod
    def uninitialised(cls) -> VarMap:
        """A VarMap whose `get` creates each variable as np.empty (its `init` is checked, not called): for a
        model whose every weight is about to be read from a checkpoint, so loading neither draws random
        weights nor holds them next to the stored ones. Until written (`read_into`, `set_one`, `load`) a
        variable is listed by `unfilled()`; `save` and `state_dict` refuse while any is."""
        varmap = cls(seed=0)
        varmap._unfilled = set()
        return varmap

    def unfilled(self) -> list[str]:
        """The variables created uninitialised and not written since, in creation order (empty otherwise)."""
        return [] if not self._unfilled else [name for name in self._vars if name in self._unfilled]

    def _require_filled(self, what: str):
        names = self.unfilled()
        if names:
            raise ValueError(f"{what}: {len(names)} variable(s) of this uninitialised VarMap were never written, "
                             f"their values are whatever memory np.empty gave: {', '.join(names[:5])}"
                             f"{', ...' if len(names) > 5 else ''} (read them from a checkpoint first)")

    # --- the map ----------------------------------------------------------------------------------------
    def all_vars(self) -> list[Tensor]:
        return list(self._vars.values())

    def named_vars(self) -> list[tuple[str, Tensor]]:
        return list(self._vars.items())

    def names(self) -> list[str]:
        return list(self._vars)

    def __len__(self):
        return len(self._vars)

    def __contains__(self, name):
        return name in self._vars

    def __iter__(self):
        return iter(self._vars)

    def __getitem__(self, name: str) -> Tensor:
        if not isinstance(name, str):
            raise TypeError(f"VarMap[{name!r}]: variables are named by str (e.g. 'backbone.norm_f.weight')")
        try:
            return self._vars[name]
        except KeyError:
            raise KeyError(f"cannot find {name!r} in VarMap ({len(self)} variables{self._similar(name)})") from None

    def _similar(self, name: str) -> str:
        tail = name.rsplit(".", 1)[-1]
        close = [n for n in self._vars if n.rsplit(".", 1)[-1] == tail][:5]
        return f"; similar: {', '.join(close)}" if close else ""

    def num_parameters(self) -> int:
        return sum(t.numel() for t in self._vars.values())

    def state_dict(self) -> dict[str, np.ndarray]:
        """name -> a copy of each variable's array."""
        self._require_filled("state_dict")
        return {name: t.data.copy() for name, t in self._vars.items()}

    def __repr__(self):
        state = f"{len(self.unfilled())} unfilled" if self._unfilled is not None else f"seed={self.seed}"
        return f"VarMap({len(self)} variables, {self.num_parameters():,} parameters, {state})"

    # --- creating and setting ---------------------------------------------------------------------------
    def get(self, shape, path: str, init: InitFn | None = None, dtype="float32") -> Tensor:
        """The variable `path`: created with `init` (drawing from `self.rng`) on first request, the same
        tensor afterwards. A later request with another shape or dtype is an error naming the path."""
        _check_name(path, "VarMap.get")
        shape = _shape(shape, f"VarMap.get {path!r}")
        dtype = _float_dtype(dtype, f"VarMap.get {path!r}")
        existing = self._vars.get(path)
        if existing is not None:
            if existing.shape != shape:
                raise ValueError(f"shape mismatch on {path}: requested {shape} <> existing {existing.shape}")
            if existing.dtype != dtype:
                raise TypeError(f"dtype mismatch on {path}: requested {dtype} <> existing {existing.dtype}")
            return existing
        if init is None:
            raise ValueError(f"VarMap.get: {path!r} does not exist yet and no init was given; pass init= "
                             f"(e.g. init.Randn(0, 0.02) or init.Const(0)) - there is no silent default")
        if not callable(init):
            raise TypeError(f"VarMap.get {path!r}: init must be callable fn(shape, rng, dtype), got {init!r}")
        slot = self._slots.pop(path, None)                              # a place in a reserve_block block
        if slot is not None and (slot.shape != shape or slot.dtype != dtype):
            slot = None
        if self._unfilled is not None:
            self._unfilled.add(path)
            array = np.empty(shape, dtype=dtype) if slot is None else slot   # written by read_into / set_one / load
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # a value past the dtype's range: refused below
                drawn = np.asarray(init(shape, self.rng, dtype))
            if drawn.dtype.kind not in "fiub":
                raise TypeError(f"VarMap.get {path!r}: init {init!r} returned an array of dtype {drawn.dtype}, "
                                f"not real numbers")
            if drawn.shape != shape:
                raise ValueError(f"VarMap.get {path!r}: init {init!r} returned shape {drawn.shape}, expected {shape}")
            array = np.empty(shape, dtype=dtype) if slot is None else slot
            with np.errstate(over="ignore", invalid="ignore"):
                array[...] = drawn
            if not np.isfinite(array).all():  # Const(1e6) in float16 gave inf (set_one and load refuse such values)
                raise ValueError(f"VarMap.get {path!r}: init {init!r} gave values that are not finite in {dtype} "
                                 f"(beyond its range, or NaN): use a wider dtype or a smaller init")
        tensor = Tensor(array, requires_grad=True)
        self._vars[path] = tensor
        return tensor

    def reserve_block(self, paths: Sequence[str], shape, dtype="float32") -> None:
        """Place the variables `paths`, each of `shape` and `dtype`, one after another in one block of memory
        that starts on a HUGE_PAGE boundary and is rounded up to whole huge pages, when `get` creates them (it
        fills them as ever; an uninitialised VarMap leaves them to be written). Why: Linux maps a large
        allocation in huge pages only where whole aligned ones fit inside it, so each of 24 separate in_proj
        matrices had its ends in 4 KB pages, and decoding, which streams every weight once a token, read them
        slower (benchmarks/dev/weight_placement.py: a step 0.93x the time with in_proj's and out_proj's packed
        this way). Costs under a huge page per block beyond its bytes. Paths already created keep their arrays;
        for fewer than HUGE_PAGE bytes in all nothing is reserved (plain arrays)."""
        shape = _shape(shape, "VarMap.reserve_block")
        dtype = _float_dtype(dtype, "VarMap.reserve_block")
        paths = [p for p in paths if p not in self._vars]
        size = int(np.prod(shape, dtype=np.int64))
        nbytes = len(paths) * size * dtype.itemsize
        if nbytes < HUGE_PAGE:
            return
        block = huge_page_buffer(nbytes).view(dtype)
        for i, path in enumerate(paths):
            self._slots[path] = block[i * size:(i + 1) * size].reshape(shape)

    def set_one(self, name: str, value):
        """Copy `value` into the existing variable `name`, in place (the same Tensor object stays registered)."""
        if name not in self._vars:
            raise KeyError(f"cannot find {name} in VarMap")
        target = self._vars[name]
        if value is None:
            raise TypeError(f"set_one {name!r}: need an array or Tensor of shape {target.shape}, got None")
        array = _real_values(value.data if isinstance(value, Tensor) else value, target.dtype, f"set_one {name!r}")
        if array.shape != target.shape:
            raise ValueError(f"set_one {name!r}: value has shape {array.shape}, variable has shape {target.shape}")
        with no_grad():
            target.copy_(array)
        self._filled(name)

    def read_into(self, name: str, stored: SafetensorsFile, key: str | None = None):
        """Read tensor `key` (default: `name`) of the safetensors file `stored` straight into the variable
        `name`'s array, converting its dtype piece by piece (F16 / BF16 are upcast): no full-size temporary.
        Only floating-point tensors are read, as by `load`."""
        if name not in self._vars:
            raise KeyError(f"cannot find {name} in VarMap")
        target, key = self._vars[name], name if key is None else key
        info = stored.info(key)
        if info.shape != target.shape:
            raise ValueError(f"read_into {name!r}: {stored.path!r} stores {key!r} with shape {info.shape}, the "
                             f"variable has shape {target.shape}")
        if info.not_float_reason() is not None:
            raise CheckpointError(f"read_into {name!r}: {stored.path!r} stores {key!r} with "
                                  f"{info.not_float_reason()}")
        with no_grad():  # an in-place write like copy_: checked the same way and the version bumped
            target._inplace("read_into", lambda: stored.read_into(key, target.data))
        self._filled(name)

    def _filled(self, name: str):
        if self._unfilled:
            self._unfilled.discard(name)

    # --- checkpoints ------------------------------------------------------------------------------------
    def save(self, path, metadata: dict | None = None, rename=None, dtype: str | None = None):
        """Write every variable to `path` as safetensors, atomically (temporary file, fsync, rename).
        `rename`: name -> the name it is stored under (another layout's names for the same weights). `dtype`:
        every variable stored in "float64", "float32", "float16" or "bfloat16", rounded to nearest (a value
        past float16's range is refused, naming the variable); None: each in its own dtype, bit for bit."""
        self._require_filled(f"save {os.fspath(path)!r}")
        rename = rename or (lambda name: name)
        stored_names = {}
        for name in self._vars:  # two variables under one stored name: the second would replace the first unsaid
            other = stored_names.setdefault(rename(name), name)
            if other != name:
                raise ValueError(f"save {os.fspath(path)!r}: rename gives {other!r} and {name!r} the same stored name "
                                 f"{rename(name)!r}; one would be lost: give each its own name")
        arrays = {rename(name): t.data if dtype is None else stored_as(name, t.data, dtype)
                  for name, t in self._vars.items()}
        save_file(path, arrays, metadata, bfloat16=set(arrays) if dtype == "bfloat16" else set())

    def load(self, path, strict: bool = True):
        """Fill the existing variables in place from a safetensors file: BF16/F16 are upcast, F64 into a float32
        variable rounds (as torch's load_state_dict); a value beyond the variable's dtype's range is refused.

        Everything is checked before anything is written: on any error the variables are unchanged.
        strict=True raises one CheckpointError listing every missing, unexpected and mismatched key with
        shapes; strict=False loads the keys that match and returns LoadResult(missing, unexpected, mismatched)."""
        path = os.fspath(path)
        with SafetensorsFile(path) as stored:
            missing = [name for name in self._vars if name not in stored]
            unexpected = [name for name in stored.tensors if name not in self._vars]
            mismatched, loadable = [], []
            for name, var in self._vars.items():
                info = stored.tensors.get(name)
                if info is None:
                    continue
                why = info.not_float_reason() or ("shape" if info.shape != var.shape else None)
                if why is None:
                    loadable.append(name)
                else:
                    mismatched.append((name, info.shape, var.shape, why))
            if strict and (missing or unexpected or mismatched):
                raise CheckpointError(_load_report(path, missing, unexpected, mismatched, len(self)))
            self._check_writable(loadable, f"load {path!r}")
            arrays = {name: stored.read(name, self._vars[name].dtype) for name in loadable}  # all read, then write
        self._write_all(arrays)
        if not strict:
            return LoadResult(missing, unexpected, mismatched)
        return None

    def load_state_dict(self, state_dict, strict: bool = True) -> LoadResult:
        """Copy name -> array (or Tensor) into the variables in place, as torch's `module.load_state_dict`: every
        value is checked (real numbers, its shape, no finite value made infinite by the cast to the variable's
        dtype) before any is written. A wrong shape is refused even with strict=False (as torch's); strict=True
        also refuses missing and unexpected names. Returns LoadResult(missing, unexpected, mismatched=[])."""
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise TypeError(f"load_state_dict: need a mapping name -> array, got {type(state_dict).__name__}")
        missing = [name for name in self._vars if name not in state_dict]
        unexpected = [name for name in state_dict.keys() if name not in self._vars]
        if strict and (missing or unexpected):
            raise CheckpointError(_load_report(None, missing, unexpected, [], len(self), source="state dict",
                                               hint="use strict=False to load the names that match"))
        arrays, wrong_shape = {}, []
        for name in self._vars:
            if name not in state_dict:
                continue
            value = state_dict[name]
            if value is None:
                raise TypeError(f"load_state_dict: {name!r} is None; need an array of shape {self._vars[name].shape}")
            array = _real_values(value.data if isinstance(value, Tensor) else value, self._vars[name].dtype,
                                 f"load_state_dict {name!r}")
            if array.shape != self._vars[name].shape:
                wrong_shape.append((name, array.shape, self._vars[name].shape, "shape"))
            arrays[name] = array
        if wrong_shape:
            raise CheckpointError(_load_report(None, [], [], wrong_shape, len(self), source="state dict",
                                               hint="strict=False loads no wrong shape either, as torch's"))
        self._check_writable(arrays, "load_state_dict")
        self._write_all(arrays)
        return LoadResult(missing, unexpected, [])

    def _check_writable(self, names, where: str):
        """Each variable about to be written holds a writable float array (its .data may have been replaced):
        checked for all before the first is written, so that a failure leaves every variable as it was."""
        for name in names:
            var = self._vars[name]
            if not var.data.flags.writeable or var.dtype.kind != "f":
                what, fix = (("a read-only array", f"varmap[{name!r}].data = varmap[{name!r}].data.copy()")
                             if var.dtype.kind == "f" else
                             (f"dtype {var.dtype}, not floating point",
                              f"varmap[{name!r}].data = np.zeros({var.shape}, np.float32)"))
                raise CheckpointError(f"{where}: variable {name!r} holds {what} (its .data was replaced); "
                                      f"nothing was loaded: give it a writable float array first, e.g. {fix}")

    def _write_all(self, arrays: dict):
        with no_grad():
            for name, array in arrays.items():
                self._vars[name].copy_(array)
                self._filled(name)


def _load_report(path, missing, unexpected, mismatched, n_vars, source: str = "file",
                 hint: str = "use strict=False to load the keys that match") -> str:
    where = f"load {path!r}" if source == "file" else "load_state_dict"
    lines = [f"{where}: the {source} does not match the VarMap ({n_vars} variables); nothing was loaded"]
    if mismatched:
        lines.append(f"  mismatched ({len(mismatched)}):")
        for name, stored_shape, shape, why in mismatched:
            extra = "" if why == "shape" else f" ({why})"
            lines.append(f"    {name}: {source} {stored_shape} vs variable {shape}{extra}")
    if missing:
        lines.append(f"  missing from the {source} ({len(missing)}): {', '.join(missing)}")
    if unexpected:
        lines.append(f"  unexpected in the {source} ({len(unexpected)}): {', '.join(unexpected)}")
    lines.append(f"  ({hint})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# VarBuilder: a prefix and a dtype over a source of tensors (a VarMap, or safetensors files)

class _SafetensorsSource:
    """Stored tensors served by name; each is read once and the same Tensor is returned afterwards (so a
    tied weight fetched twice is one tensor). Tensors are plain (no requires_grad): this is for inference;
    to train from a checkpoint, build the model on a VarMap and call `varmap.load`."""

    def __init__(self, paths):
        paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if not paths:
            raise ValueError("VarBuilder.from_safetensors: no files given")
        self.files, self.where = [], {}
        for path in paths:
            f = SafetensorsFile(path)
            for name in f.tensors:
                if name in self.where:
                    raise CheckpointError(f"{name!r} is stored in both {self.where[name].path!r} and {f.path!r}")
                self.where[name] = f
            self.files.append(f)
        self.cache: dict[tuple, Tensor] = {}

    def describe(self) -> str:
        return ", ".join(repr(f.path) for f in self.files)

    def contains(self, path: str) -> bool:
        return path in self.where

    def get(self, shape, path, init, dtype) -> Tensor:
        f = self.where.get(path)
        if f is None:
            raise KeyError(f"cannot find tensor {path!r} in {self.describe()}")
        info = f.tensors[path]
        if info.shape != shape:
            raise ValueError(f"shape mismatch for {path} in {f.path!r}: requested {shape} <> stored {info.shape}")
        key = (path, dtype.str)
        why = info.not_float_reason()
        if why is not None:  # an I64 2**24 + 1 became 16777216.0 (load and read_into refuse it too)
            raise CheckpointError(f"VarBuilder.from_safetensors: {path!r} in {f.path!r}: {why}; a variable is "
                                  f"floating point")
        if key not in self.cache:
            self.cache[key] = Tensor(f.read(path, dtype))
        return self.cache[key]


class _VarMapSource:
    def __init__(self, varmap: VarMap):
        self.varmap = varmap

    def contains(self, path: str) -> bool:
        return path in self.varmap

    def get(self, shape, path, init, dtype) -> Tensor:
        return self.varmap.get(shape, path, init, dtype)


class VarBuilder:
    """A view of a tensor source under a name prefix: `vb.pp("mixer").get((h,), "D", init=init.Const(1))`
    asks the source for "<prefix>.mixer.D"."""

    def __init__(self, source, prefix: str = "", dtype="float32"):
        self._source = source
        self.prefix = prefix
        self.dtype = _float_dtype(dtype, "VarBuilder")

    @classmethod
    def from_varmap(cls, varmap: VarMap, dtype="float32") -> "VarBuilder":
        if not isinstance(varmap, VarMap):
            raise TypeError(f"VarBuilder.from_varmap: need a VarMap, got {type(varmap).__name__}")
        return cls(_VarMapSource(varmap), "", dtype)

    @classmethod
    def from_safetensors(cls, paths: str | os.PathLike | Sequence, dtype="float32") -> "VarBuilder":
        """Serve the tensors stored in one or more safetensors files (headers validated now, data read on
        first `get`), converted to `dtype` (F16 and BF16 are upcast)."""
        return cls(_SafetensorsSource(paths), "", dtype)

    @property
    def varmap(self) -> VarMap | None:
        return self._source.varmap if isinstance(self._source, _VarMapSource) else None

    def path(self, name: str = "") -> str:
        """The full, dot-joined name of `name` under this builder's prefix."""
        return ".".join(p for p in (self.prefix, str(name)) if p != "")

    def pp(self, prefix) -> "VarBuilder":
        """A builder whose names start with this one's prefix then `prefix` (ints allowed: `vb.pp(3)`)."""
        if isinstance(prefix, (int, np.integer)) and not isinstance(prefix, (bool, np.bool_)) and prefix >= 0:
            prefix = str(int(prefix))
        if not isinstance(prefix, str):
            raise TypeError(f"VarBuilder.pp: prefix must be a str or an int >= 0 (a layer's index), got {prefix!r}")
        _check_name(prefix, "VarBuilder.pp", "prefix")
        return VarBuilder(self._source, self.path(prefix), self.dtype)

    push_prefix = pp

    def to_dtype(self, dtype) -> "VarBuilder":
        """The same source and prefix, creating/reading variables in another dtype."""
        return VarBuilder(self._source, self.prefix, dtype)

    def contains(self, name: str) -> bool:
        return self._source.contains(self.path(name))

    def get(self, shape, name: str, init: InitFn | None = None, dtype=None) -> Tensor:
        """The tensor `<prefix>.<name>` of this shape; `init` creates it in a VarMap on first request
        (a safetensors source ignores it). `dtype` overrides the builder's for this one tensor."""
        _check_name(name, "VarBuilder.get")
        path = self.path(name)
        shape = _shape(shape, f"VarBuilder.get {path!r}")
        dtype = self.dtype if dtype is None else _float_dtype(dtype, f"VarBuilder.get {path!r}")
        return self._source.get(shape, path, init, dtype)

    def __repr__(self):
        return f"VarBuilder(prefix={self.prefix!r}, dtype={self.dtype})"


__all__ = ["VarMap", "VarBuilder", "LoadResult", "CheckpointError"]
