"""mamba_ssm's own checkpoints (state-spaces/mamba2-130m and siblings) ship their weights as pytorch_model.bin, a
pickle, which the package never reads: from_pretrained names the file and gives the command that converts it to
model.safetensors once, and that very command (run where torch is installed) gives a folder that loads to the
weights torch saved."""
import hashlib
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tinygrad_ssm import Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.pretrained import pickle_conversion_command

from tests.support.models import IDS, small_model


def _conversion_error(directory) -> str:
    with pytest.raises(FileNotFoundError) as caught:
        Mamba2LMHeadModel.from_pretrained(directory)
    return str(caught.value)


@pytest.mark.parametrize("files", [["pytorch_model.bin"],
                                   ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]])
def test_a_folder_of_pickles_is_named_with_the_command_that_converts_it(tmp_path, files):
    small_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    for name in files:
        (tmp_path / name).write_bytes(b"not read")   # never opened: the name alone decides
    message = _conversion_error(tmp_path)
    assert files[0] in message and "pickle" in message and "model.safetensors" in message
    assert message.endswith(pickle_conversion_command(tmp_path))
    assert f"with this command, which writes {str(tmp_path / 'model.safetensors')!r}: python -c " in message
    assert "Hugging Face cache" not in message


def _torch_state_dict(model, torch):
    """The state dict mamba_ssm's save_pretrained pickles: its names, and the tied head as the embedding itself."""
    state = {name: torch.from_numpy(t.data.copy()) for name, t in model.varmap.named_vars()}
    state["lm_head.weight"] = state["backbone.embedding.weight"]      # one storage, as in torch's state_dict
    return state


@pytest.mark.parametrize("shards", [1, 2])
def test_the_command_in_the_message_converts_the_pickle_to_the_same_weights(tmp_path, shards):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors.torch")
    folder = tmp_path / "a folder's \"name\" with spaces, $HOME and [x]"     # quoted for the shell, escaped for glob
    model = small_model(seed=3, dtype="float32")
    model.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    state = _torch_state_dict(model, torch)
    names = sorted(state)
    for i in range(shards):
        part = {n: state[n] for n in names[i::shards]}
        torch.save(part, folder / ("pytorch_model.bin" if shards == 1 else f"pytorch_model-0000{i + 1}-of-00002.bin"))
    message = _conversion_error(folder)
    command = shlex.split(message[message.index("python -c "):])
    assert command[0] == "python"
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = Mamba2LMHeadModel.from_pretrained(folder)
    for name, t in model.varmap.named_vars():
        assert np.array_equal(loaded.varmap[name].data, t.data), name
    assert np.array_equal(loaded(IDS).data, model(IDS).data)


def test_a_cache_snapshot_is_converted_in_place_and_the_message_says_so(tmp_path):
    """A Hugging Face cache's snapshot, its files links into blobs/: the message says the file goes into the
    snapshot, beside the links; the command writes it there and the repository folder then loads."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors.torch")
    model, source = small_model(seed=5, dtype="float32"), tmp_path / "source"
    model.save_pretrained(source)
    (source / "model.safetensors").unlink()
    torch.save(_torch_state_dict(model, torch), source / "pytorch_model.bin")
    repo, commit = tmp_path / "hub" / "models--org--mamba2-tiny", "c" * 40
    snapshot = repo / "snapshots" / commit
    for folder in (repo / "blobs", repo / "refs", snapshot):
        folder.mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    for path in source.iterdir():                                        # as huggingface_hub lays a download out
        blob = hashlib.sha256(path.read_bytes()).hexdigest()
        (repo / "blobs" / blob).write_bytes(path.read_bytes())
        os.symlink(f"../../blobs/{blob}", snapshot / path.name)
    message = _conversion_error(repo)
    assert (f"which writes {str(snapshot / 'model.safetensors')!r} inside the Hugging Face cache's snapshot, beside "
            f"its links") in message and message.endswith(pickle_conversion_command(snapshot))
    command = shlex.split(message[message.index("python -c "):])
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (snapshot / "model.safetensors").is_file() and not (snapshot / "model.safetensors").is_symlink()
    assert np.array_equal(Mamba2LMHeadModel.from_pretrained(repo)(IDS).data, model(IDS).data)


class _RunsCode:
    """Unpickled, it makes a folder: what any code a pickle names could do."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_the_command_runs_no_code_a_pickle_holds(tmp_path):
    """The command loads with torch's weights_only loader: a pickle that names a function to call (os.mkdir here)
    is refused, and the function never runs."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors.torch")
    folder, marker = tmp_path / "model", tmp_path / "the pickle ran code"
    folder.mkdir()
    torch.save({"w": torch.zeros(2), "x": _RunsCode(str(marker))}, folder / "pytorch_model.bin")
    command = shlex.split(pickle_conversion_command(folder))
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "weights_only" in done.stderr, done.stderr
    assert not marker.exists() and not (folder / "model.safetensors").exists()
