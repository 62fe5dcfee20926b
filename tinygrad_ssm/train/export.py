"""`python -m tinygrad_ssm export`: a model folder (a run, a checkpoint, any folder from_pretrained reads) written
as a new folder another library loads as it is:

- layout "transformers": transformers.Mamba2ForCausalLM.from_pretrained(OUT) and AutoTokenizer.from_pretrained(OUT)
  (save_pretrained(layout="transformers"); the tokenizer.json the model was trained with; a tokenizer_config.json
  naming PreTrainedTokenizerFast, without which AutoTokenizer takes Mamba-2's default GPTNeoXTokenizer, which adds
  <|endoftext|> and <|padding|> tokens a tokenizer.json of ours may not have);
- layout "mamba_ssm": the package's own save_pretrained folder (mamba_ssm's config keys), with the same tokenizer
  files.

A byte-level model of this package (no tokenizer.json: its ids are the UTF-8 bytes) gets byte_level_tokenizer_json:
each byte its own id, so any tokenizers-based reader gives the ids the model was trained on. generation_config.json
is copied when the model folder has one. The weights are written in the dtype they are stored in, bit for bit (a
bfloat16 folder stays bfloat16), a folder mixing dtypes in the widest of them (which holds every stored value), or
with `dtype` (--dtype) every weight in that one, rounded to nearest; export says so when the written dtype is not
the stored one.

OUT must not exist or be an empty folder, and not be a link: export replaces nothing. It is written as a temporary
folder beside OUT and renamed into place at the end, so a failed export leaves no partial folder behind. An existing
empty OUT is filled, never replaced (its owner, mode, ACLs, and a shell's working directory there stay): the
temporary folder is made inside it and its files moved out one by one, the weights first and config.json last (a
reader finds no config.json before the weights are complete), none over a name that appeared meanwhile.
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..io.atomic_write import new_temporary_folder, write_atomic
from ..io.safetensors import STORED_DTYPES
from ..models.mamba2 import Mamba2LMHeadModel
from ..models.mamba2.checkpoint_config import TOKEN_ID_KEYS, token_id
from ..models.mamba2.pretrained import LAYOUTS, stored_dtypes
from ..tokenizer import BYTES, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from .generate import load_tokenizer_for, resolve_model_folder
from .generation_config import GENERATION_CONFIG_FILE, _read_json
from .starting_point import tokenizer_files

# AutoTokenizer's class for a bare tokenizer.json: what the file says, nothing added (transformers 5.24 maps the
# name to its TokenizersBackend; older versions have the class itself)
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


class ExportError(ValueError):
    """--out cannot be written by export, or the model cannot be written in the layout asked for."""


@dataclass
class Exported:
    out: Path
    source: Path            # the folder the weights were read from (a run folder: its newest checkpoint)
    layout: str
    byte_level: bool        # the tokenizer.json written is byte_level_tokenizer_json's
    files: list[str]
    stored: tuple[str, ...] = ()    # the weights' dtypes in the model folder, when not only the one written
    written: str = ""               # the dtype the weights are written in
    rounded: bool = False           # written narrower than stored (--dtype): rounded to nearest, not the same values


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the tokenizers library's ByteLevel pre-tokenizer maps
    every byte through (its ByteLevel decoder maps back): the printable bytes stand for themselves, the others
    for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def byte_level_tokenizer_json() -> str:
    """A tokenizer.json whose id of each byte is the byte's value: a BPE without merges over the ByteLevel alphabet
    (each byte's character is its token, id = the byte), a ByteLevel pre-tokenizer that neither adds a prefix space
    nor splits, and a ByteLevel decoder. encode(text).ids == list(text.encode("utf-8")); decode inverts it (invalid
    UTF-8 becomes U+FFFD, as ByteTokenizer.decode gives it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()
    assert sorted(table.values()) == sorted(pre_tokenizers.ByteLevel.alphabet()), "the ByteLevel alphabet changed"
    tok = Tokenizer(models.BPE(vocab={char: byte for byte, char in table.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True)


def check_out(out: Path) -> None:
    """--out is new, or an empty folder; never a link, a file, or a folder with anything in it (module docstring)."""
    if os.path.islink(out):
        raise ExportError(f"--out {str(out)!r} is a symbolic link; export writes a new folder of its own and never "
                          f"through a link: give a new path for --out")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {str(out)!r} is a file; give the path of a new folder for --out")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
            raise ExportError(f"--out {str(out)!r} is a non-empty folder (it holds {shown}); export writes only "
                              f"into a new or empty folder and replaces nothing: give a new path for --out, or "
                              f"remove that folder first if it is an earlier export you no longer need")
    for place in out.parents:                   # what export would create above it: no dangling link, no file
        if os.path.islink(place) and not place.exists():
            raise ExportError(f"--out {str(out)!r}: {str(place)!r} is a symbolic link to {os.readlink(place)!r}, "
                              f"which does not exist; give another --out")
        if place.exists() and not place.is_dir():
            raise ExportError(f"--out {str(out)!r}: {str(place)!r} is a file, not a folder; give another --out")


def _token_ids(folder: Path, tokenizer) -> dict:
    """bos / eos / pad ids for transformers' config.json: the model folder's config.json's, else the tokenizer's
    EOS token and the bos_token its tokenizer_config.json names."""
    stated = _read_json(folder / "config.json") or {}
    ids = {k: v for k in TOKEN_ID_KEYS if (v := token_id(stated.get(k), math.inf)) is not None}   # (save checks)
    ids.setdefault("eos_token_id", tokenizer.eos_token_id)
    bos = getattr(tokenizer, "special_config", {}).get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    if isinstance(bos, str) and "bos_token_id" not in ids:
        ids["bos_token_id"] = tokenizer._tok.token_to_id(bos)
    return {k: v for k, v in ids.items() if v is not None}


def _tokenizer_texts(tokenizer) -> tuple[dict[str, str], bool]:
    """(file name -> text, whether the tokenizer.json is the byte-level one made here)."""
    byte_level = tokenizer.name == BYTES
    files = {TOKENIZER_FILE: byte_level_tokenizer_json()} if byte_level else tokenizer_files(tokenizer)
    config = json.loads(files.get(TOKENIZER_CONFIG_FILE, "{}"))
    files[TOKENIZER_CONFIG_FILE] = json.dumps({**config, "tokenizer_class": TOKENIZER_CLASS}, indent=2) + "\n"
    return files, byte_level


# each float dtype's bits: a wider one holds every value of a narrower one exactly (bfloat16 and float16 hold
# different values: both are held by float32)
_WIDTH = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}


def written_dtype(stored: tuple[str, ...], dtype: str | None = None) -> str:
    """The dtype export writes: `dtype` where given, else the one the weights are stored in, or for a folder
    mixing dtypes the narrowest that holds every stored value (float64 if there is any, else float32)."""
    if dtype is not None:
        return dtype
    if len(stored) == 1:
        return stored[0]
    return "float64" if "float64" in stored else "float32"


def export(model: str | os.PathLike, out: str | os.PathLike, layout: str = "transformers",
           tokenizer: str | None = None, backend: str = "auto", dtype: str | None = None) -> Exported:
    """Write the model folder `model` (resolved as generate resolves --model) into the new folder `out`
    (module docstring). `tokenizer`: --tokenizer, a tokenizer.json to use instead of the folder's own; `dtype`:
    --dtype, the dtype every weight is written in."""
    if layout not in LAYOUTS:
        raise ExportError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if dtype is not None and dtype not in STORED_DTYPES:
        raise ExportError(f"--dtype must be one of {', '.join(STORED_DTYPES)}, got {dtype!r}")
    out = Path(out).expanduser().absolute()  # "." has no name to rename a folder onto
    check_out(out)
    folder = resolve_model_folder(model)
    stored = stored_dtypes(folder)
    written = written_dtype(stored, dtype)
    # computed in the dtype that holds every stored value exactly: float32 holds float16's and bfloat16's
    loaded = Mamba2LMHeadModel.from_pretrained(folder, dtype="float64" if "float64" in stored else "float32",
                                               backend=backend)
    tok = load_tokenizer_for(folder, loaded.config.vocab_size, tokenizer)
    if getattr(loaded, "quantized", None) and dtype is not None:
        raise ExportError(f"--model {str(folder)!r} holds {loaded.weights_format}-quantized weights, which are "
                          f"written in that format: leave --dtype out, or export the float model's folder they "
                          f"were quantized from")
    if getattr(loaded, "quantized", None) and layout == "transformers":
        raise ExportError(f"--model {str(folder)!r} holds {loaded.weights_format}-quantized weights, which "
                          f"transformers' Mamba2ForCausalLM cannot read; export the float model's folder it was "
                          f"quantized from, or give --layout mamba_ssm (read by this package only)")
    # (a NaN or inf weight was refused by the load, naming the tensor: nothing is written)
    files, byte_level = _tokenizer_texts(tok)
    loaded.generation_config = None             # the folder's own file is copied as it is (below), once
    generation = folder / GENERATION_CONFIG_FILE
    if generation.is_file():
        _read_json(generation)                  # an unreadable one is named, not copied
        files[GENERATION_CONFIG_FILE] = generation.read_text(encoding="utf-8")
    made = _missing_folders(out.parent)         # removed again if the export fails: it leaves nothing behind
    placed: list[Path] = []
    tmp = None
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            into = out.is_dir()                 # an existing empty folder (check_out): filled, never replaced
            tmp = Path(new_temporary_folder(out if into else out.parent, out.name))
        except FileNotFoundError as e:          # (--out /proc/x) named as the temporary folder, no flag, exit 2
            raise ExportError(f"--out {str(out)!r}: a folder cannot be made there ({e.strerror}); give another "
                              f"--out") from None
        token_ids = _token_ids(folder, tok) if layout == "transformers" else None
        with warnings.catch_warnings(record=True) as said:  # they name the folder as written: --out's name, not tmp's
            warnings.simplefilter("always")
            loaded.save_pretrained(tmp, layout=layout, token_ids=token_ids,
                                   dtype=None if getattr(loaded, "quantized", None) else written)
        for w in said:
            warnings.warn(str(w.message).replace(str(tmp), str(out)), w.category, stacklevel=2)
        for name, text in files.items():
            write_atomic(tmp / name, text)
        if into:
            _move_into(tmp, out, placed)
        else:
            try:
                os.replace(tmp, out)            # onto nothing, or onto an empty folder (POSIX rename)
            except OSError as e:
                if os.path.lexists(out):        # something appeared at --out meanwhile: it is left as it is
                    raise _filled_meanwhile(out) from e
                raise
    except BaseException as e:
        for path in placed:                     # what this export moved into --out, and only that
            if os.path.lexists(path):
                os.unlink(path)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(made):           # the deepest first; one that something else filled meanwhile stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        if tmp is not None and isinstance(e, ValueError) and str(tmp) in str(e):   # named as --out, not the
            raise ExportError(str(e).replace(str(tmp), str(out))) from None         # temporary folder
        raise
    stored = stored if not getattr(loaded, "quantized", None) else ()
    return Exported(out, folder, layout, byte_level, sorted(p.name for p in out.iterdir()),
                    stored if stored != (written,) else (), written,
                    rounded=any(_WIDTH[written] < _WIDTH[kind] or {kind, written} == {"float16", "bfloat16"}
                                for kind in stored))


def _missing_folders(folder: Path) -> list[Path]:
    """The folders `folder.mkdir(parents=True)` would make, the outermost first."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def _filled_meanwhile(out: Path) -> ExportError:
    return ExportError(f"--out {str(out)!r} was created or filled by something else while exporting; it was left "
                       f"as it is and nothing written there: give a new path for --out")


def _move_into(tmp: Path, out: Path, placed: list[Path]) -> None:
    """Move the finished files of `tmp` (inside the empty folder `out`) into `out`, the weights first and
    config.json last, each placed atomically and never over a name that is there (a hard link, then the temporary
    name removed; a rename after a check where the file system has no hard links); then remove `tmp`. Each file
    placed is added to `placed` (export removes them if this fails)."""
    if any(p != tmp for p in out.iterdir()):
        raise _filled_meanwhile(out)
    for name in sorted(os.listdir(tmp), key=lambda n: (n == "config.json", not n.endswith(".safetensors"), n)):
        source, target = tmp / name, out / name
        try:
            os.link(source, target)
        except FileExistsError:
            raise _filled_meanwhile(out) from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if os.path.lexists(target):
                raise _filled_meanwhile(out) from None
            os.rename(source, target)
        placed.append(target)
        if os.path.lexists(source):
            os.unlink(source)
    os.rmdir(tmp)


def describe(result: Exported) -> str:
    """What export prints: where, what, and how the folder is loaded."""
    out = str(result.out)
    lines = [f"exported {result.source} to {out} ({result.layout} layout): {', '.join(result.files)}"]
    if result.layout == "transformers":
        lines += ["load it with transformers:",
                  "  from transformers import AutoTokenizer, Mamba2ForCausalLM",
                  f"  model = Mamba2ForCausalLM.from_pretrained({out!r})",
                  f"  tokenizer = AutoTokenizer.from_pretrained({out!r})"]
    else:
        lines += ["load it with this package: Mamba2LMHeadModel.from_pretrained(...), or "
                  f"python -m tinygrad_ssm generate --model {out}"]
    if result.stored:
        how = "rounded to nearest" if result.rounded else "the same values"
        lines.append(f"the weights are stored as {' and '.join(result.stored)} in {result.source} and written as "
                     f"{result.written} ({how})")
    if result.byte_level:
        lines.append("the model reads bytes: its tokenizer.json gives each byte its own id (ids = "
                     "list(text.encode('utf-8'))), and decodes ids back to the text")
    return "\n".join(lines)
