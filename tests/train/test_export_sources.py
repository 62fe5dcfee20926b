"""`python -m tinygrad_ssm export` of folders other than a run's: weights stored in float16 / bfloat16 (written in
their own dtype, bit for bit: they were written as float32, twice the bytes), --dtype (widened: the same values, said
so; narrowed: rounded to nearest, said so; a weight float16 cannot hold named, nothing written), and a warning of
save_pretrained's, which named the temporary folder export writes into instead of --out."""
import json
import struct

import numpy as np
import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import SafetensorsFile, bf16_to_float32, float_to_bf16, load_file, save_file
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.export import written_dtype

CONFIG = dict(d_model=32, n_layer=1, vocab_size=256, d_state=16, headdim=16, chunk_size=8)


def _export(capsys, *flags) -> tuple[int, str, str]:
    code = cli.main(["export", *map(str, flags)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write_bf16(path, arrays: dict, float16: tuple = ()) -> None:
    """A safetensors file of BF16 tensors (the top 16 bits of each float32), written byte by byte (NumPy has no
    bfloat16); the names in `float16` as F16."""
    header, blobs, offset = {}, [], 0
    for name, array in arrays.items():
        if name in float16:
            bits, tag = np.asarray(array, "<f2").tobytes(), "F16"
        else:
            bits, tag = (np.ascontiguousarray(array, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes(), "BF16"
        header[name] = {"dtype": tag, "shape": list(array.shape), "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _narrow_source(tmp_path, stored: str) -> tuple:
    """A model folder whose weights are stored as `stored` (bfloat16 or float16), and those values as float32."""
    model = Mamba2LMHeadModel(Mamba2Config(**CONFIG), VarMap(seed=4))
    source = tmp_path / "source"
    model.save_pretrained(source)
    weights = {name: t.data for name, t in model.varmap.named_vars()}
    if stored == "bfloat16":
        _write_bf16(source / "model.safetensors", weights)
        values = {n: ((a.view(np.uint32) >> 16) << 16).view(np.float32) for n, a in weights.items()}
    else:
        save_file(source / "model.safetensors", {n: a.astype(np.float16) for n, a in weights.items()})
        values = {n: a.astype(np.float16).astype(np.float32) for n, a in weights.items()}
    return source, values


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_narrow_weights_are_written_as_stored_bit_for_bit(tmp_path, capsys, stored):
    """A bfloat16 or float16 folder is exported in its own dtype (it was written as float32, twice the bytes)."""
    source, values = _narrow_source(tmp_path, stored)
    code, printed, _ = _export(capsys, "--model", source, "--out", tmp_path / "out", "--layout", "mamba_ssm")
    assert code == cli.EXIT_OK and "stored as" not in printed
    tag = {"bfloat16": "BF16", "float16": "F16"}[stored]
    with SafetensorsFile(source / "model.safetensors") as a, SafetensorsFile(tmp_path / "out" / "model.safetensors") as b:
        assert {i.dtype for i in b.tensors.values()} == {tag}
        assert sorted(a.tensors) == sorted(b.tensors)
        for name, info in a.tensors.items():                            # the stored bits, exactly
            assert b.read_rows(name, 0, info.shape[0]).tobytes() == a.read_rows(name, 0, info.shape[0]).tobytes()
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name, array in values.items():
        assert written[name].astype(np.float32).tobytes() == array.tobytes(), name   # float16 is read as stored


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_dtype_float32_widens_them_and_says_the_values_are_the_same(tmp_path, capsys, stored):
    source, values = _narrow_source(tmp_path, stored)
    code, printed, _ = _export(capsys, "--model", source, "--out", tmp_path / "out", "--layout", "mamba_ssm",
                               "--dtype", "float32")
    assert code == cli.EXIT_OK
    assert f"the weights are stored as {stored} in {source} and written as float32 (the same values)" in printed
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name, array in values.items():
        assert written[name].dtype == np.float32 and written[name].tobytes() == array.tobytes(), name


def test_a_folder_mixing_bfloat16_and_float16_is_written_as_float32(tmp_path, capsys):
    """Neither narrow dtype holds the other's values: float32 holds both, and export says so."""
    source, values = _narrow_source(tmp_path, "bfloat16")
    first = sorted(values)[0]
    _write_bf16(source / "model.safetensors", values, float16=(first,))
    values[first] = values[first].astype(np.float16).astype(np.float32)
    code, printed, _ = _export(capsys, "--model", source, "--out", tmp_path / "out", "--layout", "mamba_ssm")
    assert code == cli.EXIT_OK
    assert (f"the weights are stored as bfloat16 and float16 in {source} and written as float32 (the same values)"
            in printed)
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name, array in values.items():
        assert written[name].dtype == np.float32 and written[name].tobytes() == array.tobytes(), name
    assert written_dtype(("bfloat16", "float32")) == "float32" and written_dtype(("float16", "float64")) == "float64"


def test_dtype_bfloat16_halves_a_float32_run_rounded_to_nearest(stopped_run_like, tmp_path, capsys):
    source, model = stopped_run_like
    code, printed, _ = _export(capsys, "--model", source, "--out", tmp_path / "out", "--dtype", "bfloat16")
    assert code == cli.EXIT_OK
    assert f"the weights are stored as float32 in {source} and written as bfloat16 (rounded to nearest)" in printed
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    assert (tmp_path / "out" / "model.safetensors").stat().st_size < 0.55 * (source / "model.safetensors").stat().st_size
    loaded = Mamba2LMHeadModel.from_pretrained(tmp_path / "out")
    for name, t in model.varmap.named_vars():
        np.testing.assert_array_equal(loaded.varmap[name].data, bf16_to_float32(float_to_bf16(t.data)), err_msg=name)


def test_dtype_float16_names_a_weight_it_cannot_hold_and_writes_nothing(stopped_run_like, tmp_path, capsys):
    source, model = stopped_run_like
    arrays = load_file(source / "model.safetensors")
    arrays["backbone.layers.0.mixer.D"][0] = -1e5
    save_file(source / "model.safetensors", arrays)
    code, _, err = _export(capsys, "--model", source, "--out", tmp_path / "out", "--dtype", "float16")
    assert code != cli.EXIT_OK
    assert "'backbone.layers.0.mixer.D'" in err and "past the largest float16" in err and "float32 or bfloat16" in err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["source"]


@pytest.fixture
def stopped_run_like(tmp_path):
    """A float32 model folder of the package's layout, and its model."""
    model = Mamba2LMHeadModel(Mamba2Config(**CONFIG), VarMap(seed=4))
    model.save_pretrained(tmp_path / "source")
    return tmp_path / "source", model


def test_float32_weights_get_no_such_line(tmp_path, capsys):
    Mamba2LMHeadModel(Mamba2Config(**CONFIG), VarMap(seed=4)).save_pretrained(tmp_path / "source")
    code, printed, _ = _export(capsys, "--model", tmp_path / "source", "--out", tmp_path / "out")
    assert code == cli.EXIT_OK and "stored as" not in printed


def test_a_warning_names_out_not_the_temporary_folder(tmp_path, capsys):
    """A model whose RMSNorm epsilon is not mamba_ssm's, exported in mamba_ssm's layout: save_pretrained's warning
    names --out (it named '.out.XXXX.tmp', a folder gone by the time it is read)."""
    config = Mamba2Config(**CONFIG, rms_norm_eps=1e-3)
    Mamba2LMHeadModel(config, VarMap(seed=4)).save_pretrained(tmp_path / "source", layout="transformers")
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="RMSNorm epsilon") as said:
        assert _export(capsys, "--model", tmp_path / "source", "--out", out, "--layout", "mamba_ssm")[0] == cli.EXIT_OK
    messages = [str(w.message) for w in said if "RMSNorm epsilon" in str(w.message)]
    assert messages and all(f"save_pretrained: {str(out)!r}:" in m and ".tmp" not in m for m in messages)
    assert json.loads((out / "config.json").read_text())["norm_epsilon"] == 1e-3


def test_out_may_be_the_empty_working_folder(tmp_path, capsys, monkeypatch):
    """export --out . in an empty folder failed, saying the folder "was created or filled by something else while
    exporting" (os.replace onto '.', a path with no name, fails)."""
    Mamba2LMHeadModel(Mamba2Config(**CONFIG), VarMap(seed=4)).save_pretrained(tmp_path / "source")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert _export(capsys, "--model", tmp_path / "source", "--out", ".")[0] == cli.EXIT_OK
    assert sorted(p.name for p in (tmp_path / "here").iterdir()) == ["config.json", "model.safetensors",
                                                                     "tokenizer.json", "tokenizer_config.json"]


def test_a_training_checkpoint_says_nothing_of_mamba_ssm(tmp_path, corpus, recwarn):
    """Fine-tuning a model whose RMSNorm epsilon is not 1e-5 warned at every checkpoint that mamba_ssm could not
    load its config.json, naming the checkpoint's temporary folder, gone by then."""
    from tinygrad_ssm.train.loop import TrainConfig, train
    from tests.support.training import TINY, quiet
    config = Mamba2Config(**CONFIG, rms_norm_eps=1e-3)
    Mamba2LMHeadModel(config, VarMap(seed=4)).save_pretrained(tmp_path / "source", layout="transformers")
    cfg = TrainConfig(**{**TINY, "d_model": 32, "n_layer": 1}, steps=2, data=str(corpus), out=str(tmp_path / "run"),
                      init_from=str(tmp_path / "source"))
    assert train(cfg, progress=False, say=quiet).status == "done"
    assert not [w for w in recwarn if "RMSNorm epsilon" in str(w.message)]
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "config.json").read_text())
    assert saved["norm_epsilon"] == 1e-3                                 # the key is still written
