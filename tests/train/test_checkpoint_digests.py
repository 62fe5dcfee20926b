"""A training checkpoint records each of its files' size and SHA-256 in trainer_state.json ("files"), and every
reader checks them before it uses a file: a file damaged on disk after the save (its last pages zeroed, cut short)
is refused by name. Before, a model.safetensors whose last 4 KiB were zeros loaded and generated from the zeros:
zeros are finite, so the NaN checks passed them (found by an audit of the run folders, 2026-12-07)."""
import hashlib
import json
import os
import threading

import pytest

from tinygrad_ssm import Mamba2LMHeadModel
from tinygrad_ssm.io.checkpoints import CheckpointDamaged, check_file_digests
from tinygrad_ssm.train import checkpoint as ckpt
from tinygrad_ssm.train import cli


def _zero_the_end(path, n=4096):
    """The last `n` bytes of the file become zeros; its size stays."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - n)
        f.write(bytes(n))


def _state(checkpoint):
    return json.loads((checkpoint / "trainer_state.json").read_text())


def test_a_checkpoint_records_each_of_its_files_size_and_sha256(run):
    checkpoint = run / "checkpoints" / "step-000002"
    record = _state(checkpoint)["files"]
    assert set(record) == set(os.listdir(checkpoint)) - {"trainer_state.json"}
    assert {"config.json", "model.safetensors", "optimizer.safetensors"} <= set(record)
    for name, digest in record.items():
        data = (checkpoint / name).read_bytes()
        assert digest == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name


def test_weights_zeroed_at_the_end_are_refused_by_from_pretrained_generate_and_resume(run, capsys):
    weights = run / "checkpoints" / "step-000002" / "model.safetensors"
    _zero_the_end(weights)
    log_before = (run / "log.jsonl").read_bytes()
    with pytest.raises(CheckpointDamaged, match=r"model.safetensors' is damaged: its SHA-256 differs from the one "
                                                r"saved .* use another checkpoint \(this run's: \['step-000001', "
                                                r"'step-000002'\]\)"):
        Mamba2LMHeadModel.from_pretrained(run)
    assert cli.main(["generate", "--model", str(run), "--prompt", "a", "--max-new-tokens", "2"]) == cli.EXIT_USAGE
    assert "model.safetensors' is damaged" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    assert "model.safetensors' is damaged" in capsys.readouterr().err
    assert (run / "log.jsonl").read_bytes() == log_before                  # nothing written
    Mamba2LMHeadModel.from_pretrained(run / "checkpoints" / "step-000001")  # the other checkpoint is whole


def test_an_optimizer_file_cut_short_is_refused_on_resume_naming_the_sizes(run, capsys):
    moments = run / "checkpoints" / "step-000002" / "optimizer.safetensors"
    size = os.path.getsize(moments)
    os.truncate(moments, size - 8)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"optimizer.safetensors' is damaged: {size - 8:,} bytes where {size:,} were saved" in err, err


def test_a_checkpoint_saved_before_the_record_loads_unchecked(run):
    checkpoint = run / "checkpoints" / "step-000002"
    state = _state(checkpoint)
    del state["files"]
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with open(checkpoint / "config.json", "a") as f:
        f.write("\n")                                # another size: not read as damage without a record
    assert ckpt.load_trainer_state(checkpoint)["step"] == 2
    Mamba2LMHeadModel.from_pretrained(checkpoint)


@pytest.mark.parametrize("record", [{"model.safetensors": {"bytes": -1, "sha256": "0" * 64}},
                                    {"model.safetensors": {"bytes": 1, "sha256": "XYZ"}}, ["model.safetensors"],
                                    {"/x": {"bytes": 1, "sha256": "0" * 64}},   # /dev/zero was read for ever: a
                                    {"../x": {"bytes": 1, "sha256": "0" * 64}}])  # name of the folder's own only
def test_a_malformed_record_is_named(run, record):
    checkpoint = run / "checkpoints" / "step-000002"
    state = _state(checkpoint)
    state["files"] = record
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(ckpt.CheckpointNotFound, match=r"trainer_state.json' is damaged: 'files' must be file "
                                                      r"names mapped to"):
        ckpt.load_trainer_state(checkpoint)
    with pytest.raises(CheckpointDamaged, match=r"'files' must map file names to"):
        Mamba2LMHeadModel.from_pretrained(checkpoint)


@pytest.mark.parametrize("fifo", ["model.safetensors", "trainer_state.json"])
def test_a_named_pipe_in_place_of_a_recorded_file_is_refused_not_read(run, fifo):
    """The digest check opened each recorded file without checking its kind: a named pipe in place of
    model.safetensors (or of trainer_state.json itself) hung from_pretrained and resume for ever."""
    checkpoint = run / "checkpoints" / "step-000002"
    state = (checkpoint / "trainer_state.json").read_text()
    os.remove(checkpoint / fifo)
    os.mkfifo(checkpoint / fifo)
    for call in (lambda: check_file_digests(checkpoint, state=json.loads(state) if fifo == "model.safetensors" else
                                            None),
                 lambda: Mamba2LMHeadModel.from_pretrained(checkpoint)):
        error = _unless_it_hangs(call, checkpoint / fifo)
        assert isinstance(error, CheckpointDamaged) and "is a named pipe (FIFO), not a regular file" in str(error)


def _unless_it_hangs(call, fifo, seconds=20.0):
    """The exception `call` raises, run in a thread; a call still blocked on the pipe after `seconds` fails the test
    (its reader is let go first: a writer opens the pipe and closes it, so the read ends)."""
    outcome = {}

    def run():
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"the call blocked on the named pipe {fifo} for {seconds:.0f} s")
    return outcome.get("error")


@pytest.mark.parametrize("change", [
    lambda s: s["sampler"]["bit_generator"]["state"].__setitem__("state", s["sampler"]["bit_generator"]["state"]["state"] + 1),
    lambda s: s["train_config"].__setitem__("lr", s["train_config"]["lr"] * 1.0000001),
    lambda s: s.__setitem__("tokens", s["tokens"] + 64)], ids=["sampler", "lr", "tokens"])
def test_a_trainer_state_changed_since_the_save_is_refused_and_one_changed_on_purpose_loads(run, capsys, change):
    """The "files" digests cover every file but trainer_state.json itself: one digit of the sampler's state
    changed by hand was resumed without a word, 11 weights and 22 moments off the run at the end (an audit)."""
    checkpoint = run / "checkpoints" / "step-000002"
    state = _state(checkpoint)
    assert state["state_sha256"] == hashlib.sha256(json.dumps(
        {k: v for k, v in state.items() if k not in ("files", "state_sha256")}, sort_keys=True,
        separators=(",", ":")).encode()).hexdigest()
    change(state)
    (checkpoint / "trainer_state.json").write_text(json.dumps(state, indent=1))
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE
    assert ("trainer_state.json' is damaged: its content differs from the one saved (its 'state_sha256'); resume "
            "from another checkpoint (this run's: ['step-000001', 'step-000002'])") in capsys.readouterr().err
    with pytest.raises(CheckpointDamaged, match="state_sha256"):
        Mamba2LMHeadModel.from_pretrained(checkpoint)
    del state["state_sha256"]                                     # changed on purpose: the fix the message names
    (checkpoint / "trainer_state.json").write_text(json.dumps(state, indent=1))
    assert ckpt.load_trainer_state(checkpoint)["step"] == 2
