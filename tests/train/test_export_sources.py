"""`python -m tinygrad_ssm export` of folders other than a run's: weights stored in float16 / bfloat16 (written as
float32, which export says: the help said "as stored, bit for bit" and a bfloat16 folder silently doubled), and a
warning of save_pretrained's, which named the temporary folder export writes into instead of --out."""
import json
import struct

import numpy as np
import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.io.safetensors import load_file, save_file
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.train import cli

CONFIG = dict(d_model=32, n_layer=1, vocab_size=256, d_state=16, headdim=16, chunk_size=8)


def _export(capsys, *flags) -> tuple[int, str, str]:
    code = cli.main(["export", *map(str, flags)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write_bf16(path, arrays: dict) -> None:
    """A safetensors file of BF16 tensors (the top 16 bits of each float32), written byte by byte (NumPy has no
    bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, array in arrays.items():
        bits = (np.ascontiguousarray(array, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.mark.parametrize("stored", ["bfloat16", "float16"])
def test_narrow_weights_are_written_as_float32_and_export_says_so(tmp_path, capsys, stored):
    model = Mamba2LMHeadModel(Mamba2Config(**CONFIG), VarMap(seed=4))
    source = tmp_path / "source"
    model.save_pretrained(source)
    weights = {name: t.data for name, t in model.varmap.named_vars()}
    if stored == "bfloat16":
        _write_bf16(source / "model.safetensors", weights)
        want = {n: ((a.view(np.uint32) >> 16) << 16).view(np.float32) for n, a in weights.items()}
    else:
        save_file(source / "model.safetensors", {n: a.astype(np.float16) for n, a in weights.items()})
        want = {n: a.astype(np.float16).astype(np.float32) for n, a in weights.items()}
    code, printed, _ = _export(capsys, "--model", source, "--out", tmp_path / "out", "--layout", "mamba_ssm")
    assert code == cli.EXIT_OK
    assert (f"the weights are stored as {stored} in {source} and written as float32 (the same values; the package "
            f"writes float32 and float64 only)") in printed
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(written) == sorted(want)
    for name, array in want.items():                                    # the stored values, exactly
        assert written[name].dtype == np.float32 and written[name].tobytes() == array.tobytes(), name


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
