"""A checkpoint's weights must agree with its config (issue 24, class 5): a stored lm_head.weight that differs
from the embedding under a config that says the two are tied is an error naming the file and the config key
(loading it tied would silently drop the head: logits off by O(1)). An exact copy is still accepted (torch's
state_dict of a tied model holds one). Also: sharded checkpoints in the Hugging Face cache layout
(snapshots/<hash>/ files that are symlinks into ../../blobs/) load (issue 24, class 10)."""
import hashlib
import json
import os

import numpy as np
import pytest

from tinygrad_ssm import Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.pretrained import PretrainedError
from tinygrad_ssm.io.safetensors import save_file

from tests.support.checkpoints import write_transformers_dir
from tests.support.models import IDS, small_model


def _untied_weights_under_a_tied_config(tmp_path, layout):
    """An untied model's weights (lm_head.weight differs from the embedding) with a config saying tied."""
    untied = small_model(seed=3, tie_embeddings=False, dtype="float32")
    if layout == "mamba_ssm":
        untied.save_pretrained(tmp_path)
        config = json.loads((tmp_path / "config.json").read_text())
        config["tie_embeddings"] = True
    else:
        config = write_transformers_dir(tmp_path, untied)
        config["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    return untied


@pytest.mark.parametrize("layout,key", [("mamba_ssm", "tie_embeddings"), ("transformers", "tie_word_embeddings")])
def test_untied_head_under_a_tied_config_is_an_error_naming_file_and_key(tmp_path, layout, key):
    _untied_weights_under_a_tied_config(tmp_path, layout)
    with pytest.raises(PretrainedError) as info:
        Mamba2LMHeadModel.from_pretrained(tmp_path)
    message = str(info.value)
    assert "lm_head.weight" in message and repr(key) in message
    assert str(tmp_path / "model.safetensors") in message           # the file that disagrees


def test_untied_head_in_a_shard_names_that_shard(tmp_path):
    untied = _untied_weights_under_a_tied_config(tmp_path, "mamba_ssm")
    weights = {n: t.data for n, t in untied.varmap.named_vars()}
    (tmp_path / "model.safetensors").unlink()
    save_file(tmp_path / "part-a.safetensors", {n: w for n, w in weights.items() if n != "lm_head.weight"})
    save_file(tmp_path / "part-b.safetensors", {"lm_head.weight": weights["lm_head.weight"]})
    index = {"weight_map": {n: "part-b.safetensors" if n == "lm_head.weight" else "part-a.safetensors"
                            for n in weights}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedError, match=r"part-b\.safetensors.*'tie_embeddings'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("layout", ["mamba_ssm", "transformers"])
def test_tied_config_with_an_exact_copy_of_the_head_still_loads(tmp_path, layout):
    model = small_model(seed=4, tie_embeddings=True, dtype="float32")
    if layout == "mamba_ssm":
        model.save_pretrained(tmp_path)
        embedding_key = "backbone.embedding.weight"
    else:
        write_transformers_dir(tmp_path, model)
        embedding_key = "backbone.embeddings.weight"
    from tinygrad_ssm.io.safetensors import SafetensorsFile
    f = SafetensorsFile(tmp_path / "model.safetensors")
    weights = {n: f.read(n) for n in f.tensors}
    weights["lm_head.weight"] = weights[embedding_key].copy()
    save_file(tmp_path / "model.safetensors", weights)
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(tmp_path)(IDS).data, model(IDS).data)


def test_untied_config_without_a_head_names_the_key(tmp_path):
    model = small_model(seed=5, tie_embeddings=True, dtype="float32")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=r"lm_head\.weight.*'tie_embeddings'"):
        Mamba2LMHeadModel.from_pretrained(tmp_path)


# --- the Hugging Face cache layout (class 10) ---------------------------------------------------------------

def _to_hf_cache(folder, cache_root, commit="0123456789abcdef0123456789abcdef01234567"):
    """Move a checkpoint folder's files into huggingface_hub's cache layout: blobs/<sha256> and
    snapshots/<commit>/<name> -> ../../blobs/<sha256> (relative symlinks). Returns the snapshot folder."""
    repo = cache_root / "models--someone--mamba2-small"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", digest), snapshot / path.name)
    return snapshot


def _sharded(folder, model):
    weights = {n: t.data for n, t in model.varmap.named_vars()}
    if "backbone.embedding.weight" in weights and not (folder / "config.json").read_text().count("d_model"):
        weights["backbone.embeddings.weight"] = weights.pop("backbone.embedding.weight")
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    save_file(folder / "model-00001-of-00002.safetensors", {n: weights[n] for n in names[:6]})
    save_file(folder / "model-00002-of-00002.safetensors", {n: weights[n] for n in names[6:]})
    index = {"metadata": {"total_size": 0},
             "weight_map": {n: f"model-0000{1 + (i >= 6)}-of-00002.safetensors" for i, n in enumerate(names)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("layout", ["mamba_ssm", "transformers"])
def test_sharded_checkpoint_in_the_hf_cache_layout_loads(tmp_path, layout):
    model = small_model(seed=6, tie_embeddings=False, dtype="float32")
    plain = tmp_path / "plain"
    plain.mkdir()
    if layout == "mamba_ssm":
        model.save_pretrained(plain)
    else:
        write_transformers_dir(plain, model)
    _sharded(plain, model)
    snapshot = _to_hf_cache(plain, tmp_path / "hub")
    assert all(p.is_symlink() for p in snapshot.iterdir())
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "hub").rglob("*") if p.is_file())
    loaded = Mamba2LMHeadModel.from_pretrained(snapshot)
    assert np.array_equal(loaded(IDS).data, model(IDS).data)
    after = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "hub").rglob("*") if p.is_file())
    assert after == before                                               # nothing in the cache was written


def test_single_file_checkpoint_in_the_hf_cache_layout_loads(tmp_path):
    model = small_model(seed=7, dtype="float32")
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    snapshot = _to_hf_cache(plain, tmp_path / "hub")
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(snapshot)(IDS).data, model(IDS).data)


def test_index_naming_a_file_outside_the_folder_is_refused_and_a_shard_linked_elsewhere_loads(tmp_path):
    """A shard that is a file of the folder loads wherever its symlink leads (an old --local-dir download links into
    the cache, weights kept on another disk), as model.safetensors does and transformers does: it was refused as
    "outside its folder", naming paths inside it. An index entry that names a path out of the folder is refused."""
    model = small_model(seed=8, tie_embeddings=False, dtype="float32")
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    _sharded(plain, model)
    snapshot = _to_hf_cache(plain, tmp_path / "hub")
    # a shard that is a symlink out of the cache repository (to another folder on the disk)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = snapshot / "model-00002-of-00002.safetensors"
    (elsewhere / "x.safetensors").write_bytes(shard.read_bytes())
    shard.unlink()
    os.symlink(elsewhere / "x.safetensors", shard)
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(snapshot)(IDS).data, model(IDS).data)
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: f"./{f}" for n, f in index["weight_map"].items()}      # as some writers spell them
    (snapshot / "model.safetensors.index.json").unlink()
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(snapshot)(IDS).data, model(IDS).data)
    # and an index entry with a path that leaves the folder
    shard.unlink()
    os.symlink(os.path.join("..", "..", "blobs", "nothing"), shard)
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: "../../../../elsewhere/x.safetensors" for n in index["weight_map"]}
    (snapshot / "model.safetensors.index.json").unlink()
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedError, match="outside"):
        Mamba2LMHeadModel.from_pretrained(snapshot)


def test_a_snapshot_whose_blobs_are_gone_names_the_dangling_links(tmp_path):
    """A Hugging Face cache snapshot copied or pruned without its blobs: its files are links to nothing, and the
    load said "has neither model.safetensors nor model.safetensors.index.json" or "config.json does not exist"."""
    model = small_model(seed=8, tie_embeddings=False, dtype="float32")
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    snapshot = _to_hf_cache(plain, tmp_path / "hub")
    blob = (snapshot / "model.safetensors").resolve()
    blob.unlink()
    with pytest.raises(FileNotFoundError, match=r"model.safetensors' is a link to '.*blobs.*', which is missing .*"
                                                r"fetch the folder again"):
        Mamba2LMHeadModel.from_pretrained(snapshot)
    (snapshot / "config.json").resolve().unlink()
    with pytest.raises(FileNotFoundError, match=r"config.json' is a link to '.*blobs.*', which is missing"):
        Mamba2LMHeadModel.from_pretrained(snapshot)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded)
    _sharded(sharded, model)
    shard = sorted(sharded.glob("model-*.safetensors"))[0]
    shard.rename(tmp_path / "elsewhere.safetensors")
    shard.symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(PretrainedError, match=r"names shard\(s\) missing .*; '.*model-00001.*' is a link to "
                                              r"'.*gone.safetensors', which is missing"):
        Mamba2LMHeadModel.from_pretrained(sharded)


def test_a_single_weight_file_beside_an_index_is_read_with_a_warning(tmp_path):
    """A stale model.safetensors beside a newer index and its shards was read without a word (as transformers reads
    it): the load now says it holds both and which it read."""
    model, old = (small_model(seed=seed, tie_embeddings=False, dtype="float32") for seed in (8, 9))
    model.save_pretrained(tmp_path / "new")
    _sharded(tmp_path / "new", model)
    old.save_pretrained(tmp_path / "old")
    (tmp_path / "new" / "model.safetensors").write_bytes((tmp_path / "old" / "model.safetensors").read_bytes())
    with pytest.warns(UserWarning, match=r"holds both model.safetensors and model.safetensors.index.json: reading "
                                         r"model.safetensors, as transformers does"):
        loaded = Mamba2LMHeadModel.from_pretrained(tmp_path / "new")
    assert np.array_equal(loaded(IDS).data, old(IDS).data)


def test_a_save_into_a_sharded_checkpoints_folder_is_refused_leaving_it_whole(tmp_path):
    """save_pretrained into a folder holding a sharded checkpoint left its index and shards beside the new
    model.safetensors: a stale model that every later load warned of (found by an audit)."""
    model = small_model(seed=4, dtype="float32")
    weights = {n: t.data for n, t in model.varmap.named_vars()}
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    save_file(tmp_path / "model-00001-of-00001.safetensors", weights)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": dict.fromkeys(weights, "model-00001-of-00001.safetensors")}))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(PretrainedError, match=r"holds a sharded checkpoint \(model.safetensors.index.json and its "
                                              r"shards\), which a save here would leave beside the new"):
        small_model(seed=5, dtype="float32").save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
