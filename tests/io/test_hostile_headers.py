"""Files that are damaged or hostile at the edges an audit of the safetensors readers found: a JSON header nested
past Python's depth or holding an int of 5,000 digits (bare RecursionError / ValueError), the same in config.json
and trainer_state.json, a step count that is not 0-d, and a save_pretrained whose weights fail (its new config was
left beside the old weights, and loaded as one model)."""
import errno
import json
import struct

import numpy as np
import pytest

from tinygrad_ssm import VarMap
from tinygrad_ssm.io.checkpoints import CheckpointNotFound
from tinygrad_ssm.io.safetensors import CheckpointError, load_file
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.checkpoint_config import PretrainedError, read_config

TENSOR = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


def write(path, header: bytes):
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.float32([1.5, -2]).tobytes())
    return path


@pytest.mark.parametrize("extra, what", [(b',"__x":' + b"[" * 100000 + b"]" * 100000 + b"}", "RecursionError"),
                                         (b',"v":' + b"9" * 5000 + b"}", "ValueError")])
def test_a_header_python_cannot_parse_is_named_as_the_files(tmp_path, extra, what):
    path = write(tmp_path / "m.safetensors", TENSOR + extra)
    with pytest.raises(CheckpointError, match=rf"m.safetensors.*the header is not valid JSON \({what}"):
        load_file(path)
    config = tmp_path / "config.json"
    config.write_text('{"d_model": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(PretrainedError, match=r"config.json' is not valid JSON \(RecursionError"):
        read_config(tmp_path)


def test_a_trainer_state_python_cannot_parse_and_a_step_count_not_0d_are_named(tmp_path):
    from tinygrad_ssm.train.checkpoint import check_optimizer_steps, load_trainer_state
    from tinygrad_ssm.io.checkpoints import CHECKPOINT_FILES
    checkpoint = tmp_path / "step-000001"
    checkpoint.mkdir()
    for name in CHECKPOINT_FILES:                                      # present: the state is what is read
        (checkpoint / name).write_bytes(b"")
    (checkpoint / "trainer_state.json").write_text('{"step": ' + "9" * 5000 + "}")
    with pytest.raises(CheckpointNotFound, match=r"cannot read .*trainer_state.json': ValueError"):
        load_trainer_state(checkpoint)
    with pytest.raises(CheckpointNotFound, match=r"optimizer.safetensors' is damaged: 'decay/state/w/step' is not a "
                                                 r"step count"):
        check_optimizer_steps(checkpoint, 2, {"decay/state/w/step": np.array([2, 2])})


def test_a_save_whose_weights_fail_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    config = dict(d_model=16, n_layer=1, vocab_size=50, d_state=4, headdim=8)
    first = Mamba2LMHeadModel(Mamba2Config(**config), VarMap(seed=0))
    first.save_pretrained(tmp_path / "m")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    second = Mamba2LMHeadModel(Mamba2Config(**config, chunk_size=32), VarMap(seed=3))

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(second.varmap, "save", full_disk)
    for layout in ("mamba_ssm", "transformers"):
        with pytest.raises(OSError, match="No space left"):
            second.save_pretrained(tmp_path / "m", layout=layout)
        assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before   # no pending file either
    assert Mamba2LMHeadModel.from_pretrained(tmp_path / "m").config.chunk_size == 256
    monkeypatch.undo()
    second.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["ssm_cfg"]["chunk_size"] == 32


def test_a_users_file_of_the_pending_configs_name_is_left_alone(tmp_path):
    """save_pretrained wrote its new config aside as `.config.json.pending`, a fixed name: a user's file of that name
    in the folder was replaced, then removed. The name is new now (created exclusively), and nothing else is left."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / ".config.json.pending").write_text("the user's")
    model = Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=50, d_state=4, headdim=8), VarMap(seed=0))
    model.save_pretrained(folder)
    assert (folder / ".config.json.pending").read_text() == "the user's"
    assert sorted(p.name for p in folder.iterdir()) == [".config.json.pending", "config.json", "model.safetensors"]


@pytest.mark.parametrize("shape", [[1] * 65 + [2], [0, 2 ** 63, 2]])
def test_a_shape_numpy_cannot_hold_is_named_as_the_files(tmp_path, shape):
    """65 axes, or a zero-size tensor with an axis of 2**63, passed the checks and failed reading with NumPy's
    'maximum supported dimension' or 'array is too big', naming neither the file nor the tensor."""
    size = 8 if 0 not in shape else 0
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, size]}}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * size)
    with pytest.raises(CheckpointError, match=r"m.safetensors.*tensor 'w': shape .* at most 64 axes below 2\*\*63"):
        load_file(path)
