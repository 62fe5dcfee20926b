"""Random-weight checkpoints in every layout from_pretrained reads, written here (no downloads), for the tests of
loading checkpoints (tests/models/test_pretrained.py, test_config_files.py, test_checkpoint_agreement.py):

    path = write_checkpoint(layout, directory, model, tokenizer_json=None)   # layout in LAYOUTS
    Mamba2LMHeadModel.from_pretrained(path)

- "save_pretrained": our own save_pretrained folder (mamba_ssm layout: config.json + model.safetensors);
- "transformers": Hugging Face transformers' folder (its config names, backbone.embeddings.weight);
- "hf_cache": a Hugging Face hub cache, models--org--name/{refs/main, blobs/<sha256>, snapshots/<commit>/}, the
  snapshot's files symlinks to ../../blobs/<sha256> (transformers layout); the path returned is the snapshot;
- "sharded": the save_pretrained folder with its weights split into model-00001-of-00002.safetensors, ... and
  model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}), as transformers'
  save_pretrained writes a large model.
"""
import hashlib
import json
import math
import shutil
import tempfile
from pathlib import Path

from tinygrad_ssm.io.safetensors import load_file, save_file

LAYOUTS = ("save_pretrained", "transformers", "hf_cache", "sharded")
HF_REPO = "org/name"
HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"   # a snapshot's folder is named after its commit


def write_checkpoint(layout: str, directory, model, tokenizer_json=None, shards: int | None = None) -> Path:
    """Write `model` into `directory` in `layout` (one of LAYOUTS), tokenizer.json copied in when given; returns
    the path to pass to from_pretrained. `shards`: how many weight files (default 2 for "sharded", else 1)."""
    directory = Path(directory)
    shards = (2 if layout == "sharded" else 1) if shards is None else shards
    if layout == "hf_cache":
        return write_hf_cache(directory, model, tokenizer_json, shards=shards)
    directory.mkdir(parents=True, exist_ok=True)
    if layout in ("save_pretrained", "sharded"):
        model.save_pretrained(directory)
    elif layout == "transformers":
        write_transformers_dir(directory, model)
    else:
        raise ValueError(f"write_checkpoint: unknown layout {layout!r}; choose one of {LAYOUTS}")
    if shards > 1:
        shard_weights(directory, shards)
    if tokenizer_json is not None:
        shutil.copyfile(tokenizer_json, directory / "tokenizer.json")
    return directory


def write_transformers_dir(directory, model, infinity_style="token", dtype=None):
    """The model as Hugging Face transformers stores a Mamba-2 checkpoint."""
    c = model.config
    config = {
        "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"],
        "hidden_size": c.d_model, "num_hidden_layers": c.n_layer, "vocab_size": c.padded_vocab_size,
        "state_size": c.d_state, "head_dim": c.headdim, "num_heads": c.nheads, "n_groups": c.ngroups,
        "expand": c.expand, "conv_kernel": c.d_conv, "chunk_size": c.chunk_size, "use_bias": c.bias,
        "use_conv_bias": c.conv_bias, "layer_norm_epsilon": c.rms_norm_eps, "rms_norm": True,
        "hidden_act": "silu", "residual_in_fp32": True, "time_step_min": c.dt_min, "time_step_max": c.dt_max,
        "time_step_floor": c.dt_init_floor, "tie_word_embeddings": c.tie_embeddings, "pad_token_id": 0,
        "time_step_limit": [c.dt_limit[0], c.dt_limit[1] if math.isfinite(c.dt_limit[1]) or infinity_style == "token"
                            else {"__float__": "Infinity"}],
    }
    text = json.dumps(config, indent=2)                                 # writes the bare token Infinity
    if math.isinf(c.dt_limit[1]):
        assert ("Infinity" in text) and (infinity_style == "token") == ('"__float__"' not in text)
    (directory / "config.json").write_text(text)
    weights = {}
    for name, t in model.varmap.named_vars():
        key = "backbone.embeddings.weight" if name == "backbone.embedding.weight" else name
        weights[key] = t.data.astype(dtype or t.dtype)
    save_file(directory / "model.safetensors", weights)
    return config


def shard_weights(directory, shards: int = 2):
    """Replace directory/model.safetensors by `shards` files of consecutive tensors and the index naming them."""
    directory = Path(directory)
    weights = load_file(directory / "model.safetensors")               # (F32 / F64 kept as stored)
    names = list(weights)
    per_shard = math.ceil(len(names) / shards)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        group = names[i * per_shard:(i + 1) * per_shard]
        save_file(directory / file, {n: weights[n] for n in group}, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, file))
    index = {"metadata": {"total_size": sum(a.nbytes for a in weights.values())}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "model.safetensors").unlink()


def write_hf_cache(cache_dir, model, tokenizer_json=None, repo: str = HF_REPO, commit: str = HF_COMMIT,
                   shards: int = 1) -> Path:
    """The model (transformers layout) as huggingface_hub's cache holds a download of `repo` at `commit`: each
    file's bytes in blobs/<sha256>, the snapshot's file a relative symlink to it, refs/main naming the commit.
    Returns the snapshot folder."""
    repo_dir = Path(cache_dir) / f"models--{repo.replace('/', '--')}"
    snapshot, blobs = repo_dir / "snapshots" / commit, repo_dir / "blobs"
    for folder in (snapshot, blobs, repo_dir / "refs"):
        folder.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)                     # (no newline, as the hub writes it)
    with tempfile.TemporaryDirectory() as staging:
        files = write_checkpoint("transformers", staging, model, tokenizer_json, shards=shards)
        for path in sorted(files.iterdir()):
            blob = blobs / hashlib.sha256(path.read_bytes()).hexdigest()
            shutil.move(path, blob)
            (snapshot / path.name).symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot
