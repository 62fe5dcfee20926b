"""Mamba-2 checkpoints on disk: `config.json` + `model.safetensors` (or shards listed in
`model.safetensors.index.json`), in either of the two layouts real weights come in:

- mamba_ssm: config {d_model, n_layer, vocab_size, ssm_cfg: {layer: "Mamba2", ...}, pad_vocab_size_multiple,
  tie_embeddings, ...}; weights backbone.embedding.weight, backbone.layers.{i}.*, backbone.norm_f.weight.
- Hugging Face transformers: config {hidden_size, num_hidden_layers, state_size, head_dim, num_heads, n_groups,
  expand, conv_kernel, ..., time_step_limit, tie_word_embeddings}, vocab_size already padded; weights
  backbone.embeddings.weight (with an s), the same layer keys, lm_head.weight when not tied. Its config may
  hold the JSON token Infinity or {"__float__": "Infinity"}.

`save_pretrained` writes either: the mamba_ssm layout by default, the transformers one (layout="transformers") for
transformers' Mamba2ForCausalLM.from_pretrained. float16 / bfloat16 weights are upcast. No pickle anywhere.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import warnings
from pathlib import Path

import numpy as np

from ...io.atomic_write import written_aside
from ...io.checkpoints import CHECKPOINTS_DIR, check_file_digests, resolve_checkpoint
from ...io.file_checks import broken_link, require_regular_file
from ...io.finite import non_finite_problems
from ...io.hub_cache import hub_snapshot
from ...io.safetensors import CheckpointError, SafetensorsFile, check_storable
from ...registry import VarMap
from .checkpoint_config import (CONFIG_NAME, NotMambaSsmLoadableWarning, PretrainedError, mamba_ssm_config,
                                parse_config, read_config, transformers_config)
from .config import Mamba2Config

WEIGHTS_NAME, INDEX_NAME = "model.safetensors", "model.safetensors.index.json"
GENERATION_CONFIG_NAME = "generation_config.json"   # transformers' sampling settings and stop ids
# --- weights ------------------------------------------------------------------------------------------------

def _weight_files(directory: Path) -> tuple[list[Path], dict | None]:
    """(the safetensors files to read, the index's weight_map: tensor name -> file name; None for one file)."""
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    for path in (single, index):
        if why := broken_link(path):  # was "has neither model.safetensors nor ...": it has, as a link to nothing
            raise FileNotFoundError(f"from_pretrained: {why}")
    if single.exists():
        if index.exists():  # which one is stale cannot be told from here; transformers reads model.safetensors too
            warnings.warn(f"from_pretrained: {str(directory)!r} holds both {WEIGHTS_NAME} and {INDEX_NAME}: reading "
                          f"{WEIGHTS_NAME}, as transformers does; remove the stale one", stacklevel=4)
        return [single], None
    if index.exists():
        require_regular_file(index, "from_pretrained: weight index", PretrainedError)
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise PretrainedError(f"from_pretrained: {str(index)!r} is not a JSON object with a 'weight_map' "
                                  f"({type(e).__name__}: {str(e)[:200]})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise PretrainedError(f"from_pretrained: {str(index)!r}: 'weight_map' must map names to file names")
        if not weight_map:
            raise PretrainedError(f"from_pretrained: {str(index)!r}: 'weight_map' is empty (it names no weights)")
        weight_map = {k: os.path.normpath(v) for k, v in weight_map.items()}   # "./model-00001-of-00002..." too
        names = sorted(set(weight_map.values()))
        files = [directory / name for name in names]
        outside = [name for name in names if Path(name).name != name or name in (".", "..")]
        if outside:  # an index must not point a load at files elsewhere on the disk; a file of the folder that is a
            # symlink (a Hugging Face cache's snapshot, an old --local-dir download, weights kept on another disk) is
            # the folder's own, as model.safetensors is
            raise PretrainedError(f"from_pretrained: {str(index)!r} names files outside its folder: {outside[:3]}"
                                  f" (each must be a file name in the folder)")
        absent = [name for name, f in zip(names, files) if not f.exists()]
        if absent:
            links = [why for why in (broken_link(directory / name) for name in absent) if why]
            raise PretrainedError(f"from_pretrained: {str(index)!r} names shard(s) missing from the folder: "
                                  f"{', '.join(absent[:3])} (an incomplete download? fetch the folder again)"
                                  + (f"; {links[0]}" if links else ""))
        return files, weight_map
    pickles = sorted(p.name for p in directory.glob("pytorch_model*.bin"))
    if pickles:  # mamba_ssm's own checkpoints (state-spaces/mamba2-*) ship only pytorch_model.bin
        raise FileNotFoundError(f"from_pretrained: {str(directory)!r} holds {', '.join(pickles[:3])}, PyTorch's pickle "
                                f"format, which this package never reads (unpickling can run code), and neither "
                                f"{WEIGHTS_NAME} nor {INDEX_NAME}; convert it once, where PyTorch and safetensors "
                                f"are installed, with this command, which writes {str(directory / WEIGHTS_NAME)!r}"
                                f"{_in_cache_note(directory)}: {pickle_conversion_command(directory)}")
    raise FileNotFoundError(f"from_pretrained: {str(directory)!r} has neither {WEIGHTS_NAME} nor {INDEX_NAME} "
                            f"(only safetensors is read: no pickle)")


_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # safetensors' tags


def stored_dtypes(directory) -> tuple[str, ...]:
    """The dtypes a resolved folder's weight files store (NumPy's names, bfloat16 included), sorted; only the
    headers are read."""
    stored = set()
    for path in _weight_files(Path(directory))[0]:
        with SafetensorsFile(path) as f:
            stored.update(_DTYPE_NAMES.get(info.dtype, info.dtype) for info in f.tensors.values())
    return tuple(sorted(stored))


def _in_cache_note(directory: Path) -> str:
    """Where the conversion's file goes when `directory` is a Hugging Face cache's snapshot (its files links into
    blobs/): into the snapshot, a file of its own; the cache's tools (scan-cache, delete-cache) count and delete it
    with the snapshot, and a newer revision's snapshot needs its own."""
    if directory.parent.name != "snapshots" or not (directory.parent.parent / "blobs").is_dir():
        return ""
    return (" inside the Hugging Face cache's snapshot, beside its links (a file of its own, which "
            "`hf cache rm` removes with the snapshot; another revision needs it again)")


def pickle_conversion_command(directory: Path) -> str:
    """The shell command that writes a folder's pytorch_model*.bin as its model.safetensors: torch's weights_only
    loader (it builds tensors and runs no other code), every shard into one file, each tensor cloned because
    mamba_ssm's tied head and embedding share storage, which safetensors refuses to write."""
    script = ("import glob, sys, torch; from safetensors.torch import save_file; d = sys.argv[1]; "
              "save_file({k: v.clone() for f in sorted(glob.glob(glob.escape(d) + \"/pytorch_model*.bin\")) "
              "for k, v in torch.load(f, map_location=\"cpu\", weights_only=True).items()}, "
              f'd + "/{WEIGHTS_NAME}")')
    return f"python -c {shlex.quote(script)} {shlex.quote(str(directory))}"


def _check_index(directory: Path, weight_map: dict, stored: dict) -> None:
    """The index must say where each tensor is (as transformers reads it: each key from the file the index
    names, so a stale index is a missing key there): a key in no shard, or in another shard than named, and a
    stored tensor the index leaves out, are named."""
    index = str(directory / INDEX_NAME)
    nowhere = [key for key in weight_map if key not in stored]
    elsewhere = [key for key, name in weight_map.items()
                 if key in stored and Path(stored[key].path).name != name]
    unlisted = [key for key in stored if key not in weight_map]
    for keys, what in ((nowhere, "lists tensors no shard holds"), (elsewhere, "names the wrong shard for"),
                       (unlisted, "leaves out tensors the shards hold")):
        if keys:
            where = [f"{k} (in {Path(stored[k].path).name})" if k in stored else k for k in keys[:3]]
            raise PretrainedError(f"from_pretrained: {index!r} {what}: {', '.join(where)}"
                                  f"{', ...' if len(keys) > 3 else ''}; the index does not describe these shards "
                                  f"(fetch the folder again)")


def resolve_pretrained_folder(directory) -> Path:
    """A from_pretrained folder as given, a Hugging Face cache's repository folder (-> the snapshot its
    refs/main names), or a training run folder / checkpoint (-> the newest checkpoint, as the CLI's
    --checkpoint resolves it)."""
    directory = Path(directory).expanduser()
    if not directory.exists():
        raise FileNotFoundError(f"from_pretrained: {str(directory)!r} does not exist; give a folder on disk (the "
                                f"package downloads nothing: fetch a hub model with `hf download "
                                f"ORG/NAME --local-dir DIR` first)")
    if not directory.is_dir():
        raise FileNotFoundError(f"from_pretrained: {str(directory)!r} is a file; give the folder that holds "
                                f"{CONFIG_NAME} and the weights")
    directory = hub_snapshot(directory) or directory
    if (directory / CONFIG_NAME).exists():
        return directory
    if (directory / CHECKPOINTS_DIR).is_dir() or directory.name == CHECKPOINTS_DIR:  # a run, or its checkpoints/
        return resolve_checkpoint(directory)  # CheckpointNotFound (a FileNotFoundError) names what is wrong
    return directory


def _size_keys(config: Mamba2Config, layout: str) -> list:
    """(key as the layout's config.json spells it, value) of the sizes that decide the weights' shapes."""
    ssm = "" if layout == "transformers" else "ssm_cfg."
    names = (("hidden_size", "state_size", "n_groups", "head_dim", "conv_kernel") if layout == "transformers" else
             ("d_model", ssm + "d_state", ssm + "ngroups", ssm + "headdim", ssm + "d_conv"))
    values = (config.d_model, config.d_state, config.ngroups, config.headdim, config.d_conv)
    return [*zip(names, values), (ssm + "expand", config.expand), ("vocab_size", config.vocab_size)]


EMBEDDING = "backbone.embedding.weight"


def _stored_name(name: str, layout: str) -> str:
    """Our (mamba_ssm) parameter name -> the name stored in a checkpoint of `layout`."""
    if layout == "transformers" and name == EMBEDDING:
        return "backbone.embeddings.weight"
    return name


HEAD = "lm_head.weight"
_LAYER_KEY = re.compile(r"backbone\.layers\.(\d+)\.")


def load_pretrained(cls, directory, dtype="float32", backend: str = "auto", fused: bool = True):
    opened = []  # the weight files, closed when the load ends, failed or not (a kept error kept them open)
    try:
        return _load_pretrained(cls, directory, dtype, backend, fused, opened)
    finally:
        for f in opened:
            f.close()


def read_finite(varmap, name: str, f, key: str, directory) -> None:
    """varmap[name] read from tensor `key` of the open file f, then checked finite (~0.03 s for the 130M shape's
    516 MB): a NaN or inf weight (a float16 save of weights past 65,504 stores inf) made every logit NaN, no error
    saying why."""
    varmap.read_into(name, f, key)
    bad = non_finite_problems([(key, varmap[name])])
    if bad:
        raise PretrainedError(f"from_pretrained: {str(directory)!r}: {bad[0]} in {f.path!r}; the model would compute "
                              f"NaN: load the checkpoint these weights were made from (a run's: an earlier "
                              f"RUN/checkpoints/step-N)")


def _load_pretrained(cls, directory, dtype, backend, fused, opened: list):
    directory = resolve_pretrained_folder(directory)
    config, layout = parse_config(read_config(directory))
    stored = {}
    files, weight_map = _weight_files(directory)
    # a training checkpoint recorded each file's SHA-256 when it was saved: a file damaged since is refused
    check_file_digests(directory, [CONFIG_NAME, *(p.name for p in files)])
    for path in files:
        f = SafetensorsFile(path)  # the header only: validated against the file's size
        opened.append(f)
        for name in f.tensors:
            if name in stored:
                raise CheckpointError(f"from_pretrained: {name!r} is stored twice ({stored[name].path!r}, {f.path!r})")
            stored[name] = f
    if weight_map is not None:
        _check_index(directory, weight_map, stored)
    # every size in the config is checked against the stored headers before anything is allocated: a config
    # with d_model = 10**9 fails here, not after trying to allocate hundreds of GiB; n_layer first, as
    # param_shapes lists every layer's weights
    stored_layers = {int(m.group(1)) for m in map(_LAYER_KEY.match, stored) if m}
    if not stored_layers and layout == "transformers" and any(_LAYER_KEY.match("backbone." + k) for k in stored):
        raise PretrainedError(f"from_pretrained: the weights in {str(directory)!r} are a Mamba2Model's (the backbone "
                              f"alone: 'layers.0...' without the 'backbone.' prefix of Mamba2ForCausalLM's, which "
                              f"this package loads); write them as Mamba2ForCausalLM's once, where transformers is "
                              f"installed: Mamba2ForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR)")
    if config.n_layer > len(stored_layers):  # (fewer: the extra stored layers are named as unexpected below)
        key = "n_layer" if layout == "mamba_ssm" else "num_hidden_layers"
        raise PretrainedError(f"from_pretrained: {CONFIG_NAME} gives {key!r} = {config.n_layer} but the weights in "
                              f"{str(directory)!r} hold {len(stored_layers)} layers; the config does not describe "
                              f"these weights")
    wanted = {_stored_name(name, layout): (name, shape) for name, shape in config.param_shapes().items()}
    tie_key = "tie_embeddings" if layout == "mamba_ssm" else "tie_word_embeddings"
    missing = [key for key in wanted if key not in stored]
    if missing:
        why = (f" ({CONFIG_NAME} gives {tie_key!r} = false: an untied model needs its own lm_head.weight; if the "
               f"head is the embedding, the config should say {tie_key!r}: true)" if HEAD in missing else "")
        raise PretrainedError(f"from_pretrained: {str(directory)!r} ({layout} layout) is missing {len(missing)} "
                              f"weight(s): {', '.join(missing[:10])}{why}")
    ignorable = {HEAD} if config.tie_embeddings else set()  # a tied head may be stored as a copy
    unexpected = sorted(set(stored) - set(wanted) - ignorable)
    if unexpected:
        raise PretrainedError(f"from_pretrained: {str(directory)!r} ({layout} layout) holds weights the config does "
                              f"not describe: {', '.join(unexpected[:10])}")
    for key, (_, shape) in wanted.items():
        info = stored[key].tensors[key]
        if tuple(info.shape) != tuple(shape):
            sizes = ", ".join(f"{name} {value}" for name, value in _size_keys(config, layout))
            raise PretrainedError(f"from_pretrained: weight {key!r} has shape {tuple(info.shape)} but the config "
                                  f"gives {tuple(shape)} ({CONFIG_NAME} does not describe these weights: it gives "
                                  f"{sizes}; a key it leaves out takes its default)")
        if info.not_float_reason() is not None:
            raise PretrainedError(f"from_pretrained: weight {key!r} in {stored[key].path!r}: {info.not_float_reason()}")
    if config.tie_embeddings and HEAD in stored:
        _check_tied_copy(stored, _stored_name("backbone.embedding.weight", layout), directory, tie_key)
    # built without drawing random weights (np.empty), then each stored tensor is read straight into its
    # parameter: one copy of the weights in memory, never two (benchmarks/bench_load.py measures it)
    model = cls(config, VarMap.uninitialised(), dtype=dtype, backend=backend, fused=fused)
    assert model.varmap.names() == [name for name, _ in wanted.values()], "Mamba2Config.param_shapes is stale"
    for key, (name, _) in wanted.items():
        read_finite(model.varmap, name, stored[key], key, directory)  # F16 / BF16 are upcast here, piece by piece
    unfilled = model.varmap.unfilled()
    if unfilled:  # no parameter may keep np.empty's garbage: the model would compute nonsense silently
        raise PretrainedError(f"from_pretrained: {str(directory)!r}: the model has parameters the weights did not "
                              f"fill: {', '.join(unfilled[:10])}")
    return model


def _check_tied_copy(stored: dict, embedding_key: str, directory: Path, tie_key: str) -> None:
    """A tied config whose weights also hold lm_head.weight: accepted only when the head is an exact copy of
    the embedding (as torch's state_dict of a tied model stores it). A different head means the weights are of
    an untied model: loading them tied would silently drop the head, so the file and the config key are named."""
    head_file, embedding_file = stored[HEAD], stored[embedding_key]
    head_info, embedding_info = head_file.tensors[HEAD], embedding_file.tensors[embedding_key]
    why = None
    if tuple(head_info.shape) != tuple(embedding_info.shape):
        why = f"has shape {tuple(head_info.shape)}, the embedding {tuple(embedding_info.shape)}"
    elif not _same_values(head_file, HEAD, embedding_file, embedding_key):
        why = f"differs from the embedding {embedding_key!r}"
    if why is not None:
        raise PretrainedError(
            f"from_pretrained: {head_file.path!r} holds {HEAD!r}, which {why}, but "
            f"{str(directory / CONFIG_NAME)!r} gives {tie_key!r} = true (the head is the embedding): the weights are "
            f"those of an untied model and loading them tied would drop the head; set {tie_key!r} to false if "
            f"the head is meant, or remove {HEAD!r} from the weights")


COMPARE_PIECE_BYTES = 1 << 20  # per tensor and piece: the check must not hold two full copies of the vocabulary


def _same_values(file_a: SafetensorsFile, key_a: str, file_b: SafetensorsFile, key_b: str) -> bool:
    """Whether two stored tensors of one shape hold the same values (NaN equal to NaN), read a block of rows at a
    time: whole, as float64, the two copies of a 50k x 768 embedding alone took 2 x 309 MB."""
    rows, shape = file_a.tensors[key_a].shape[0], file_a.tensors[key_a].shape
    step = max(1, COMPARE_PIECE_BYTES // (8 * max(1, math.prod(shape[1:]))))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        if not np.array_equal(file_a.read_rows(key_a, start, stop, np.float64),
                              file_b.read_rows(key_b, start, stop, np.float64), equal_nan=True):
            return False
    return True


LAYOUTS = ("mamba_ssm", "transformers")  # parse_config's names of the two layouts


def save_pretrained(model, directory, layout: str = "mamba_ssm", token_ids: dict | None = None,
                    dtype: str | None = None):
    """Write config.json and model.safetensors into `directory` (created if needed) in `layout`:

    - "mamba_ssm": its config keys and weight names. A model whose RMSNorm epsilon is not mamba_ssm's 1e-5 (a
      transformers checkpoint may set layer_norm_epsilon) gets a 'norm_epsilon' key, which this package reads and
      mamba_ssm's MambaConfig refuses (it hard-codes 1e-5, so it could not compute that model): a warning says so.
    - "transformers": what transformers.Mamba2ForCausalLM.from_pretrained reads (checkpoint_config.
      transformers_config; backbone.embeddings.weight; lm_head.weight only when untied: transformers' own save
      of a tied model leaves it out and ties it at load). `token_ids`: its bos/eos/pad_token_id, where known.
    Either way the weights are stored as they are (their dtype, bit for bit), or with `dtype` ("float64",
    "float32", "float16", "bfloat16") every one in that dtype, rounded to nearest (as torch's .to(dtype)); a
    weight past float16's range is refused before anything is written."""
    if layout not in LAYOUTS:
        raise ValueError(f"save_pretrained: layout must be one of {LAYOUTS}, got {layout!r}")
    directory = prepare_save_folder(directory, model.varmap.named_vars(), dtype)
    if layout == "transformers":
        stored = dtype or str(model.varmap[EMBEDDING].data.dtype)
        text = json.dumps(transformers_config(model.config, stored, token_ids), indent=2)
        save_config_and_weights(directory, text, lambda: model.varmap.save(
            directory / WEIGHTS_NAME, metadata={"format": "pt"}, rename=lambda name: _stored_name(name, layout),
            dtype=dtype))
        return
    config = mamba_ssm_config(model.config)
    if "norm_epsilon" in config:
        warnings.warn(f"save_pretrained: {str(directory)!r}: the model's RMSNorm epsilon is {config['norm_epsilon']}, "
                      f"not mamba_ssm's 1e-5: config.json gets 'norm_epsilon', which tinygrad_ssm reads and mamba_ssm "
                      f"does not (its MambaConfig refuses the key)", NotMambaSsmLoadableWarning, stacklevel=4)
    text = json.dumps(config, indent=2)
    save_config_and_weights(directory, text, lambda: model.varmap.save(directory / WEIGHTS_NAME,
                                                                       metadata={"format": "pt"}, dtype=dtype))


def save_config_and_weights(directory: Path, config_text: str, save_weights) -> None:
    """config.json and the weights replaced together, as far as a folder allows: the new config written aside
    first (a full disk fails there, before anything is replaced), the weights replaced (save_weights(): an atomic
    write), then the config renamed over the old one. A save whose weights failed left the new config beside the
    old weights, and from_pretrained loaded that mix without a word (an audit of the safetensors files)."""
    with written_aside(directory / CONFIG_NAME, config_text + "\n"):
        save_weights()


def prepare_save_folder(directory, tensors, dtype: str | None = None) -> Path:
    """What every save of a model folder (this one, quantized_files.save_quantized) checks before it writes: a
    folder, not a file; no link and no other program's config.json replaced (_check_replaceable); every float
    tensor of (name, array) `tensors` finite, and storable in `dtype` where one is given (check_storable).
    Creates the folder; returns it as a Path."""
    directory = Path(directory).expanduser()   # as from_pretrained reads it ('~/m' was saved into ./~/m)
    if directory.exists() and not directory.is_dir():
        raise PretrainedError(f"save_pretrained: {str(directory)!r} is a file; give a folder (it is created if "
                              f"needed) for {CONFIG_NAME} and {WEIGHTS_NAME}")
    if directory.is_symlink() and not directory.exists():  # makedirs would say only "[Errno 17] File exists"
        raise PretrainedError(f"save_pretrained: {str(directory)!r} is a dangling symbolic link (to "
                              f"{os.readlink(directory)!r}, which does not exist); nothing was written: create the "
                              f"folder it points to, remove the link, or save into another folder")
    _check_replaceable(directory)
    tensors = list(tensors)
    bad = non_finite_problems(tensors)
    if bad:  # a folder from_pretrained would load without a word, every logit NaN
        raise PretrainedError(f"save_pretrained: {'; '.join(bad[:3])}; nothing was written to {str(directory)!r}")
    if dtype is not None:
        for name, array in tensors:
            try:
                check_storable(name, array if isinstance(array, np.ndarray) else array.data, dtype)   # or a Tensor
            except ValueError as e:
                raise PretrainedError(f"save_pretrained: {e}; nothing was written to {str(directory)!r}") from None
    os.makedirs(directory, exist_ok=True)
    return directory


def _check_replaceable(directory: Path) -> None:
    """save_pretrained replaces config.json and model.safetensors in a model folder (as transformers does), never
    a link, nor the files of a folder whose config.json is not a Mamba-2 model's: those are the user's."""
    names = (CONFIG_NAME, WEIGHTS_NAME)
    links = [name for name in names if (directory / name).is_symlink()]
    if links:
        raise PretrainedError(f"save_pretrained: {str(directory / links[0])!r} is a symbolic link; nothing is "
                              f"written through a link: remove it, or save into another folder")
    # a sharded checkpoint's index and shards stayed beside the new model.safetensors: a stale model, which every
    # later load warned of (transformers deletes the shards; this package removes nothing it did not write)
    if os.path.lexists(directory / INDEX_NAME):
        raise PretrainedError(f"save_pretrained: {str(directory)!r} holds a sharded checkpoint ({INDEX_NAME} and "
                              f"its shards), which a save here would leave beside the new {WEIGHTS_NAME}; save into "
                              f"another folder, or remove them first")
    if not any(os.path.lexists(directory / name) for name in names):
        return
    try:
        with warnings.catch_warnings():  # a key it ignores is still a Mamba-2 model's config
            warnings.simplefilter("ignore")
            parse_config(read_config(directory))
    except (OSError, ValueError) as e:
        held = " and ".join(name for name in names if os.path.lexists(directory / name))
        raise PretrainedError(f"save_pretrained: {str(directory)!r} holds {held} of something other than a Mamba-2 "
                              f"model ({e}); they were left as they are: save into another folder") from None
