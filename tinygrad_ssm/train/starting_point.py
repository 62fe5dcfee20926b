"""What a run starts from: the tokenizer its text is read with, and the model (fresh, a checkpoint's weights for
fine-tuning with --init-from, or the run's own checkpoint on --resume).

- A fresh run reads bytes (vocabulary 256) unless --tokenizer names a tokenizer.json; the model's vocabulary
  is then the tokenizer's.
- --init-from DIR takes the model folder's weights, its shape (the model flags may not be given), and its
  tokenizer (unless --tokenizer says otherwise; it must fit the model's vocabulary). Its weights are checked
  finite before the run starts: a NaN checkpoint is never trained on.
- Every checkpoint of a run with a tokenizer.json holds a copy of it, so generate, eval and --resume read the
  tokenizer the run used, whatever became of the file it was given; a fine-tuning run's checkpoints also hold
  --init-from's generation_config.json (carried_files), as transformers' Trainer saves the model's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from pathlib import Path

from ..io.checkpoints import CheckpointNotFound
from ..models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from ..models.mamba2.checkpoint_config import PretrainedError, parse_config, read_config
from ..models.mamba2.pretrained import _weight_files, stored_dtypes
from ..models.mamba2.quantized_files import QUANTIZATION_KEY
from ..registry import VarMap
from ..tokenizer import (BYTES, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, ByteTokenizer, FileTokenizer, check_fits,
                         load_tokenizer)
from .generate import config_eos, load_tokenizer_for, resolve_model_folder
from .generation_config import GENERATION_CONFIG_FILE, _read_json

MODEL_SHAPE_FIELDS = ("d_model", "n_layer", "d_state", "headdim")  # what --init-from's checkpoint decides
PAD_VOCAB_MULTIPLE = 16  # a tokenizer's vocabulary is padded to this for the model's embedding (as mamba_ssm does)


def resolve_starting_point(cfg, overrides: dict, say=None) -> None:
    """For a fresh run (in place on cfg): --init-from resolved to its model folder (absolute) and the model's
    shape read from it (a shape in `overrides` other than the checkpoint's refused); --tokenizer (or --init-from's
    own tokenizer) resolved to an absolute file, or bytes.
    `say` is told, in one line, when --dtype was left out and the checkpoint's weights are stored in another
    dtype than the run trains in (a float64 checkpoint trained in float32 lost its precision without a word)."""
    if cfg.init_from is not None:
        folder = resolve_model_folder(cfg.init_from, "--init-from").absolute()
        raw = read_config(folder)
        if QUANTIZATION_KEY in raw:  # its matrices are int8 / bfloat16 codes, not parameters a step can update
            kind = raw[QUANTIZATION_KEY].get("weights") if isinstance(raw[QUANTIZATION_KEY], dict) else "?"
            raise ValueError(f"--init-from {str(folder)!r} holds quantized weights ({kind}), for "
                             f"inference only; fine-tune from the float checkpoint it was made from, then quantize "
                             f"the result")
        config, _ = parse_config(raw)
        given = [f for f in MODEL_SHAPE_FIELDS if f in overrides and overrides[f] != getattr(config, f)]
        if given:  # a setting equal to the checkpoint's (a TrainConfig spelling out the shape) changes nothing
            flags = ", ".join(f"--{f.replace('_', '-')}" for f in given)
            has = ", ".join(f"{f} {getattr(config, f)}" for f in given)
            raise ValueError(f"--init-from {cfg.init_from!r} takes the model's shape from the checkpoint; leave out "
                             f"{flags} (the checkpoint has {has})")
        cfg.init_from = str(folder)
        note = dtype_note(folder, cfg.dtype) if "dtype" not in overrides else None
        if note and say is not None:
            say(note)
        for field in MODEL_SHAPE_FIELDS:
            setattr(cfg, field, getattr(config, field))
        if "chunk_size" not in overrides:   # the checkpoint's (speed only), so its checkpoints and exports keep it
            cfg.chunk_size = config.chunk_size
        # the folder's own tokenizer, or --tokenizer's (fitted to the model, a warning if not the folder's own)
        tok = load_tokenizer_for(folder, config.vocab_size, cfg.tokenizer if "tokenizer" in overrides else None)
        cfg.tokenizer = BYTES if tok.name == BYTES else str(Path(tok.name).absolute())
    if cfg.tokenizer != BYTES:
        tok = load_tokenizer(cfg.tokenizer)      # fails here, naming the flag's file, before any work
        cfg.tokenizer = str(Path(tok.name).absolute())


def dtype_note(folder: Path, dtype: str) -> str | None:
    """What --init-from's run does to weights stored in another dtype than `dtype` (read from the weight files'
    headers; None when they match, or when the folder cannot be read: from_pretrained then says why)."""
    try:
        stored = set(stored_dtypes(folder))
    except (OSError, ValueError):
        return None
    if not stored or stored == {dtype}:
        return None
    narrow = sorted(stored)[0] if len(stored) == 1 and stored < {"float16", "bfloat16"} else None
    keeps = " (--dtype float64 keeps them)" if "float64" in stored and dtype != "float64" else \
        f" (the run's checkpoints hold {dtype}; export --dtype {narrow} writes a fine-tuned folder in {narrow} " \
        f"again)" if narrow else f" (the run's checkpoints hold {dtype})"
    return f"the checkpoint's weights are {' and '.join(sorted(stored))}; training in {dtype}{keeps}"


def starting_files(cfg) -> dict[str, str]:
    """--init-from's files as read, so that a run can be traced to the exact checkpoint: file -> sha256 of each
    weight file from_pretrained read and of the tokenizer.json the run reads (named relative to the --init-from
    folder; a --tokenizer elsewhere by its path). Each file hashed in blocks after the load: no second copy of the
    weights in memory."""
    folder, found = Path(cfg.init_from), {}
    paths = list(_weight_files(folder)[0]) + ([Path(cfg.tokenizer)] if cfg.tokenizer != BYTES else [])
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as f:                                      # (hashlib.file_digest: Python 3.11+)
            while block := f.read(1 << 20):
                digest.update(block)
        found[path.name if path.parent == folder else str(path)] = digest.hexdigest()
    return found


def paths_as_saved(overrides: dict, saved: dict) -> dict:
    """--resume's flags with --data, --init-from and --tokenizer spelled as the saved run spells them when
    they name the same file or folder (resolved as a fresh run resolves them: `corpus` given, /abs/corpus
    saved), so that the comparison is of places, not of spellings. A flag that names another place, or none
    any more, is left as given."""
    out = dict(overrides)
    resolvers = {"data": lambda v: Path(v).expanduser(), "val_data": lambda v: Path(v).expanduser(),
                 "init_from": lambda v: resolve_model_folder(v, "--init-from"),
                 "tokenizer": lambda v: Path(load_tokenizer(v).name)}
    for field, resolve in resolvers.items():
        given, kept = out.get(field), saved.get(field)
        if given is None or kept is None or given == kept or BYTES in (given, kept):
            continue
        try:
            same = resolve(given).resolve() == Path(kept).resolve()
        except (OSError, ValueError):                                    # gone, or not a tokenizer: as given
            continue
        if same:
            out[field] = kept
    return out


def run_vocab_size(cfg, state: dict | None = None) -> int:
    """The embedding rows the run trains (padded as build_model pads them): what train/checks.py's memory
    estimate counts. After resolve_starting_point (a fresh run) or from the saved state (--resume)."""
    if state is not None:
        return Mamba2Config.from_dict(state["model_config"]).padded_vocab_size
    if cfg.init_from is not None:
        return parse_config(read_config(Path(cfg.init_from)))[0].padded_vocab_size
    if cfg.tokenizer == BYTES:
        return ByteTokenizer().vocab_size
    return -(-load_tokenizer(cfg.tokenizer).vocab_size // PAD_VOCAB_MULTIPLE) * PAD_VOCAB_MULTIPLE


def run_tokenizer(cfg, resume_dir: Path | None):
    """The tokenizer of a run: a resumed run's from its checkpoint's copy (the file it was given may be gone)."""
    if cfg.tokenizer == BYTES:
        return ByteTokenizer()
    if resume_dir is None:
        init_folder = Path(cfg.init_from) if cfg.init_from is not None else None
        if init_folder is not None and Path(cfg.tokenizer).parent == init_folder:  # --init-from's own tokenizer
            # with the EOS generate reads there: a transformers config.json's eos_token_id comes first
            return FileTokenizer(cfg.tokenizer, eos_token_id=config_eos(init_folder))
        return load_tokenizer(cfg.tokenizer)
    copy = Path(resume_dir) / TOKENIZER_FILE
    if not copy.is_file():
        raise CheckpointNotFound(f"{str(resume_dir)!r} holds no {TOKENIZER_FILE}, but its run was trained with the "
                                 f"tokenizer {cfg.tokenizer!r}: the checkpoint is incomplete; resume from another one")
    return FileTokenizer(copy)


def shared_tokenizer(cfg, resume_dir: Path | None, world):
    """run_tokenizer on rank 0 (from the checkpoint's copy when resuming); under MPI the other ranks receive its
    text and EOS id from rank 0, so no other machine needs the tokenizer file (nor sees another one)."""
    tokenizer = world.agree(lambda: run_tokenizer(cfg, resume_dir) if world.is_root else None)
    if world.size == 1:
        return tokenizer
    sent = world.broadcast_json(None if not world.is_root or tokenizer.name == BYTES else
                                [tokenizer.name, tokenizer.to_str(), tokenizer.eos_token_id,
                                 tokenizer.special_config, tokenizer.other_config])
    return world.agree(lambda: tokenizer if world.is_root else ByteTokenizer() if sent is None else
                       FileTokenizer(sent[0], sent[2], text=sent[1], special_config=sent[3], other_config=sent[4]))


def build_model(cfg, tokenizer, state: dict | None = None):
    """The model a run trains: the saved run's shape (--resume: the weights are loaded afterwards), the
    --init-from checkpoint's weights, or a fresh one of cfg's shape on the tokenizer's vocabulary."""
    if state is not None:
        config = Mamba2Config.from_dict(state["model_config"])
    elif cfg.init_from is not None:
        try:
            model = Mamba2LMHeadModel.from_pretrained(cfg.init_from, dtype=cfg.dtype, backend=cfg.backend)
        except FileNotFoundError as e:  # a weight file the folder lacks: the flag's problem (the CLI's exit 2), not
            raise PretrainedError(str(e)) from None  # an OSError of the run's own files (exit 74: cannot write)
        # (a NaN or inf weight is refused by from_pretrained itself, naming the tensor: never trained on)
        check_fits(tokenizer, model.config.vocab_size, cfg.init_from)
        model.generation_config = None  # the checkpoints carry the folder's file, or not (carried_files), not the model
        model.config.chunk_size = cfg.chunk_size  # speed only: the results are equal up to rounding
        cfg.init_from_sha256 = starting_files(cfg)  # saved with the run's settings (trainer_state.json, run.json)
        return model
    else:
        padding = {} if tokenizer.name == BYTES else {"pad_vocab_size_multiple": PAD_VOCAB_MULTIPLE}
        config = Mamba2Config(d_model=cfg.d_model, n_layer=cfg.n_layer, vocab_size=tokenizer.vocab_size,
                              d_state=cfg.d_state, headdim=cfg.headdim, chunk_size=cfg.chunk_size, **padding)
    config = dataclasses.replace(config, chunk_size=cfg.chunk_size)
    return Mamba2LMHeadModel(config, varmap=VarMap(seed=cfg.seed), dtype=cfg.dtype, backend=cfg.backend)


def shared_model(cfg, tokenizer, state: dict | None, world):
    """build_model on every rank; but under MPI, --init-from's folder is read by rank 0 alone (as the tokenizer
    is), so no other machine needs it: the others build a model of the config rank 0 sends, whose weights
    (fresh ones, never trained on) the run's broadcast_weights_and_optimizers then replaces with rank 0's."""
    if world.size == 1 or cfg.init_from is None or state is not None:
        return world.agree(build_model, cfg, tokenizer, state)
    model = world.agree(lambda: build_model(cfg, tokenizer) if world.is_root else None)
    config = world.broadcast_json(model.config.to_dict() if world.is_root else None)
    return world.agree(lambda: model if world.is_root else Mamba2LMHeadModel(
        Mamba2Config.from_dict(config), varmap=VarMap(seed=cfg.seed), dtype=cfg.dtype, backend=cfg.backend))


def tokenizer_files(tokenizer) -> dict[str, str]:
    """What a checkpoint stores of its run's tokenizer (file name -> text): the tokenizer.json as read (its
    post_processor decides which special tokens encode adds, a BOS for a Llama-style one, here and in
    transformers), and a tokenizer_config.json with the keys of the one beside the file (bos_token,
    add_bos_token, pad_token, model_max_length, ...: all but DROPPED_CONFIG_KEYS, and special_tokens_map.json's
    tokens it lacks) and its EOS token, which may have come from beside the file or from the
    --init-from folder's config.json (FileTokenizer finds it there again); nothing for bytes."""
    if tokenizer.name == BYTES:
        return {}
    files = {TOKENIZER_FILE: tokenizer.to_str()}
    config = {**tokenizer.other_config, **tokenizer.special_config}
    if tokenizer.eos_token_id is not None:
        config["eos_token"] = tokenizer.token_text(tokenizer.eos_token_id)
    if config:
        files[TOKENIZER_CONFIG_FILE] = json.dumps(config) + "\n"
    return files


def _same_file(a, b) -> bool:
    """Whether files a and b hold the same bytes (a --tokenizer that is a copy of the folder's own)."""
    try:
        return Path(a).read_bytes() == Path(b).read_bytes()
    except OSError:
        return False


def carried_files(cfg, resume_dir: Path | None) -> dict[str, str]:
    """What every checkpoint copies, beside its tokenizer, from the folder the run's weights came from (file name
    -> text): the generation_config.json of --init-from's folder (its sampling settings, length and stop ids,
    which generate and export read), or of the checkpoint a run resumes from. Left out, with a warning, where
    --tokenizer replaced the folder's own tokenizer (by another file, not a copy of it): its stop ids are ids of
    that one. A file that is not a JSON object is refused here, naming it, before the run starts."""
    source = Path(resume_dir) if resume_dir is not None else Path(cfg.init_from) if cfg.init_from else None
    if source is None:
        return {}
    # the tokenizer.json find_tokenizer reads for the folder (a checkpoint's, else its run folder's); none: bytes
    own_files = [f for f in (source / TOKENIZER_FILE, source.parent.parent / TOKENIZER_FILE)[
        :2 if source.parent.name == "checkpoints" else 1] if f.is_file()][:1]
    own = (not own_files if cfg.tokenizer == BYTES else
           any(Path(cfg.tokenizer) == f.absolute() or _same_file(cfg.tokenizer, f) for f in own_files))
    path = source / GENERATION_CONFIG_FILE
    if resume_dir is None and not own:
        if path.is_file():
            warnings.warn(f"--init-from {str(source)!r}: its {GENERATION_CONFIG_FILE} is not kept in the run's "
                          f"checkpoints: its stop ids and settings are for the folder's own tokenizer, which "
                          f"--tokenizer {cfg.tokenizer!r} replaces; give generate the settings as flags", stacklevel=2)
        return {}
    if _read_json(path) is None:
        return {}
    return {GENERATION_CONFIG_FILE: path.read_text(encoding="utf-8")}
