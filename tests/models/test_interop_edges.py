"""Saving and loading at the edges an audit against transformers found: '~' in a save path, a built model's
chunk_size, torch's state_dict of a tied model (which holds the head beside the embedding), and token ids that
transformers writes as lists or passes as NumPy ints."""
import json

import numpy as np
import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import CheckpointError
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel


def small(**kw):
    return Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=50, d_state=4, headdim=8, **kw),
                             VarMap(seed=0))


def test_a_save_path_with_a_tilde_is_the_home_folder_as_from_pretrained_reads_it(tmp_path, monkeypatch):
    """save_pretrained('~/m') wrote ./~/m while from_pretrained('~/m') read $HOME/m: an older save there came back."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    model = small()
    model.save_pretrained("~/m")
    assert (tmp_path / "home" / "m" / "config.json").is_file() and not (tmp_path / "~").exists()
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(Mamba2LMHeadModel.from_pretrained("~/m")(ids).data, model(ids).data)


def test_a_built_models_chunk_size_is_checked_when_set(tmp_path):
    """model.config.chunk_size = 0 was taken; decoding ran, save_pretrained wrote a folder from_pretrained refuses,
    and the forward failed naming ssd."""
    model = small()
    for bad in (0, -1, 2.5, None, True):
        with pytest.raises(ValueError, match=rf"Mamba2Config.chunk_size must be a positive int, got {bad!r}"):
            model.config.chunk_size = bad
    model.config.chunk_size = 8                                         # the scan's speed setting: may change
    model.save_pretrained(tmp_path / "m")
    assert Mamba2LMHeadModel.from_pretrained(tmp_path / "m").config.chunk_size == 8


def test_torchs_state_dict_of_a_tied_model_loads_when_its_head_is_the_embedding():
    """torch's state_dict() of a tied MambaLMHeadModel holds lm_head.weight beside the embedding; strict refused it
    as unexpected, where from_pretrained takes the same copy from a file. A head that differs is an untied model's."""
    model, other = small(), Mamba2LMHeadModel(small().config, VarMap(seed=1))
    state = other.state_dict()
    state["lm_head.weight"] = state["backbone.embedding.weight"].copy()
    assert model.load_state_dict(state) == ([], [])
    np.testing.assert_array_equal(model.state_dict()["backbone.embedding.weight"], state["backbone.embedding.weight"])
    state["lm_head.weight"][0, 0] += 1
    before = model.state_dict()
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' differs from 'backbone.embedding.weight', but this "
                                              r"model ties them"):
        model.load_state_dict(state)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())   # nothing written
    untied = small(tie_embeddings=False)
    assert untied.tied_weights == {} and untied.load_state_dict(untied.state_dict()) == ([], [])


def test_token_ids_as_transformers_writes_them_survive_a_load_and_save(tmp_path):
    """A transformers config.json's eos_token_id [2, 3] was dropped by a load and save, and token_ids given as
    NumPy ints were refused as 'not an id of the vocabulary'."""
    model = small()
    model.save_pretrained(tmp_path / "a", layout="transformers",
                          token_ids={"eos_token_id": [2, 3], "bos_token_id": np.int64(1)})
    written = json.loads((tmp_path / "a" / "config.json").read_text())
    assert written["eos_token_id"] == [2, 3] and written["bos_token_id"] == 1
    again = Mamba2LMHeadModel.from_pretrained(tmp_path / "a")
    assert again.token_ids == {"bos_token_id": 1, "eos_token_id": [2, 3]}
    again.save_pretrained(tmp_path / "b", layout="transformers")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["eos_token_id"] == [2, 3]
    for bad in ([], [2, 99], 99, True, "2"):
        with pytest.raises(ValueError, match=r"token_ids\['eos_token_id'\] must be an id of the vocabulary \(0 to "
                                             r"55\), a list of them, or None"):
            model.save_pretrained(tmp_path / "c", layout="transformers", token_ids={"eos_token_id": bad})
    transformers = pytest.importorskip("transformers")
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(tmp_path / "b")
    assert theirs.config.eos_token_id == [2, 3]
