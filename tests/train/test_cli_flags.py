"""The command line names the flag at fault (one message per flag), refuses values that cannot work before
any work, guards the terminal against control bytes, stops on non-finite logits naming the step, and tells a
newcomer where the run is and what to do next."""
import argparse
import io
import json
import os
import re
import shlex
import threading
from pathlib import Path

import numpy as np
import pytest

from tinygrad_ssm import Mamba2Config, Mamba2LMHeadModel, VarMap

from tinygrad_ssm.tokenizer import ByteTokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.data import DataError, load_corpus, sample_prompt_from
from tinygrad_ssm.train.generate import escape_controls, read_batch_file
from tinygrad_ssm.models.mamba2.checkpoint_config import PretrainedError
from tinygrad_ssm.models.mamba2.sampling import NonFiniteLogits, sample_next
from tinygrad_ssm.train.log import progress_bar
from tinygrad_ssm.train.loop import TrainConfig, TrainResult, summary
from tinygrad_ssm.train.loop import train

TINY = ["--d-model", "32", "--n-layer", "1", "--d-state", "16", "--headdim", "16", "--batch-size", "2",
        "--seq-len", "32", "--eval-batches", "1", "--sample-bytes", "8", "--no-progress"]
README = Path(__file__).resolve().parents[2] / "README.md"


def run_train(corpus, out, *flags):
    return cli.main(["train", "--data", str(corpus), "--out", str(out), *TINY, *flags])


@pytest.mark.parametrize("flags,message", [
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--lr", "inf"], "--lr must be a finite number, got inf"),
    (["--lr", "0"], "--lr must be in (0, inf), got 0.0"),
    (["--grad-clip", "0"], "--grad-clip must be in (0, inf), got 0.0"),
    (["--weight-decay", "-1"], "--weight-decay must be in [0, inf), got -1.0"),
    (["--val-fraction", "1.5"], "--val-fraction must be in (0, 1), got 1.5"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--data-seed", "-3"], "--data-seed must be >= 0, got -3"),
    (["--sample-bytes", "-1"], "--sample-bytes must be >= 0, got -1"),
    (["--min-lr", "1"], "--min-lr must be in [0, --lr = 0.004], got 1.0"),
    (["--backend", "nope"], "--backend must be 'auto' or one of"),
    (["--steps", "3", "--warmup-steps", "5"], "--warmup-steps 5 is longer than the whole run (--steps 3)"),
    (["--weight-decay", "1e10"], "--weight-decay 10000000000.0 with --lr 0.004: AdamW's decay multiplies the "
                                 "matrices by 1 - lr x weight decay = -4e+07 at each step"),
    (["--dtype", "float16"], "--dtype must be float32 or float64, got 'float16'"),
    (["--stop-at", "0"], "--stop-at must be a step >= 1, got 0"),
    (["--stop-at", "-2"], "--stop-at must be a step >= 1, got -2"),
    (["--steps", "3", "--stop-at", "5"], "--stop-at 5 is past the end of the run (--steps 3)"),
    (["--batch-size", "100000000"], "--batch-size 100000000 x --seq-len 32"),
    (["--d-model", "1000000000", "--headdim", "1000"], "--d-model 1000000000 with --n-layer 1 and --d-state 16 makes "
                                                       "a model whose weights"),
])
def test_bad_train_flags_are_named_before_any_work(corpus, tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert run_train(corpus, out, *flags) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert not out.exists()
    if flags[0] == "--grad-clip":  # one message per flag: nothing about the flags that were fine
        assert "--weight-decay" not in err and "--warmup-steps" not in err and "--sample-bytes" not in err


def test_every_bad_flag_gets_its_own_line(corpus, tmp_path, capsys):
    assert run_train(corpus, tmp_path / "run", "--lr", "nan", "--grad-clip", "0", "--seed", "-1",
                     "--stop-at", "0") == cli.EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert sorted(line.strip().split()[0] for line in lines[1:]) == ["--grad-clip", "--lr", "--seed", "--stop-at"]


def test_a_bad_tokenizer_or_starting_point_is_said_with_the_other_flags(corpus, tmp_path, capsys):
    """A file that is not a tokenizer.json was refused without naming --tokenizer, and problems found while
    reading --tokenizer or --init-from were said alone, the other flags' problems only on the next try (an audit
    of the CLI's flags)."""
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert run_train(corpus, tmp_path / "run", "--tokenizer", str(bad), "--lr", "nan") == cli.EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].strip().startswith(f"--tokenizer {str(bad)!r}: {str(bad)!r} is not a tokenizer.json"), lines
    assert lines[2].strip() == "--lr must be a finite number, got nan", lines
    assert run_train(corpus, tmp_path / "run", "--init-from", str(tmp_path / "nope"), "--seed", "-1") == cli.EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].strip().startswith("--init-from") and lines[2].strip() == "--seed must be >= 0, got -1", lines
    assert run_train(corpus, tmp_path / "run", "--tokenizer", str(bad)) == cli.EXIT_USAGE  # alone: one line
    assert capsys.readouterr().err.startswith(f"error: --tokenizer {str(bad)!r}: ")
    assert not (tmp_path / "run").exists()


def test_the_memory_estimate_names_the_size_and_the_machine(corpus, tmp_path, capsys):
    assert run_train(corpus, tmp_path / "run", "--batch-size", "100000000") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "GiB for one training step, more than this machine's" in err and "lower --batch-size or --seq-len" in err


def test_a_sample_too_long_to_ever_end_is_refused():
    """--sample-bytes 1e22: the run trained, saved, then sampled for ever (an audit). Checked as the CLI checks it,
    not by a run, which would not end if the check were lost."""
    from tinygrad_ssm.train.checks import MAX_SAMPLE, train_config_problems
    assert train_config_problems(TrainConfig(sample_bytes=MAX_SAMPLE)) == []
    problems = train_config_problems(TrainConfig(sample_bytes=10 ** 22))
    assert len(problems) == 1 and problems[0].startswith("--sample-bytes must be at most 1,000,000"), problems


def test_flags_are_not_abbreviated_and_a_missing_resume_names_its_flag(corpus, tmp_path, capsys):
    """argparse's prefix matching took train --checkpoint 5 (generate's other name for --model) as
    --checkpoint-every 5; a --resume that does not exist said 'checkpoint path ... does not exist' without the
    flag (an audit of the CLI's flags)."""
    with pytest.raises(SystemExit):
        cli.main(["train", "--checkpoint", "5"])
    assert "unrecognized arguments: --checkpoint 5" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(tmp_path / "nope")]) == cli.EXIT_USAGE
    assert f"--resume: checkpoint path '{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err


def test_a_default_warmup_longer_than_a_short_run_is_shortened_not_refused(corpus, tmp_path, capsys):
    assert run_train(corpus, tmp_path / "run", "--steps", "2") == cli.EXIT_OK  # default warmup is 10


def test_stop_at_must_come_after_the_resumed_step(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_train(corpus, out, "--steps", "3", "--stop-at", "2") == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--stop-at", "2", "--no-progress"]) == cli.EXIT_USAGE
    assert "--stop-at 2 is not after the checkpoint being resumed (step 2); give a step in [3, 3]" in \
        capsys.readouterr().err
    assert cli.main(["train", "--resume", str(out), "--stop-at", "4", "--no-progress"]) == cli.EXIT_USAGE
    assert "--stop-at 4 is past the end of the run (--steps 3); give a step in [3, 3]" in capsys.readouterr().err
    code = cli.main(["train", "--resume", str(out), "--steps", "2", "--stop-at", "1", "--no-progress"])
    assert code == cli.EXIT_USAGE
    assert "--stop-at 1 is not after the checkpoint being resumed (step 2); the run has done all its --steps 2; " \
           "raise --steps to train on" in capsys.readouterr().err
    state = sorted((out / "checkpoints").rglob("*.json"))
    before = [p.read_bytes() for p in state]
    assert cli.main(["train", "--resume", str(out), "--steps", "1", "--no-progress"]) == cli.EXIT_USAGE
    assert "--steps 1 is before the checkpoint being resumed (step 2)" in capsys.readouterr().err
    assert [p.read_bytes() for p in state] == before                    # the checkpoint left as it was
    with pytest.raises(ValueError, match="--stop-at must be a step >= 1, got 0"):  # the API says the same
        train(TrainConfig(data=str(corpus), out=str(tmp_path / "api")), stop_at=0, progress=False)


def test_a_finished_run_prints_its_folder_and_the_next_commands_which_work(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_train(corpus, out, "--steps", "1") == cli.EXIT_OK
    stdout = capsys.readouterr().out
    assert f"run folder: {out}" in stdout and f"curves: {out / 'loss.png'}" in stdout
    commands = [line.split("#")[0].split() for line in stdout.splitlines() if "python -m tinygrad_ssm" in line]
    generate = next(c for c in commands if c[3] == "generate")
    resume = next(c for c in commands if c[3] == "train")
    assert cli.main(generate[3:] + ["--max-new-tokens", "4"]) == cli.EXIT_OK
    capsys.readouterr()
    assert resume[4:6] == ["--resume", shlex.quote(str(out))]
    assert cli.main(resume[3:] + ["--no-progress"]) == cli.EXIT_OK  # trains on to step 2
    assert "final validation" in capsys.readouterr().out
    final = sorted((out / "checkpoints" / "step-000002").iterdir())
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in final]
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == cli.EXIT_OK   # nothing left to do
    assert "final validation" in capsys.readouterr().out
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in final] == before   # the checkpoint as it was
    export = next(c for c in commands if c[3] == "export")
    assert cli.main(export[3:]) == cli.EXIT_OK
    assert (Path(str(out) + "-hf") / "config.json").is_file() and (Path(str(out) + "-hf") / "tokenizer.json").is_file()


def test_the_sample_prompt_comes_from_the_data(corpus, tmp_path, capsys):
    result = train(TrainConfig(d_model=32, n_layer=1, d_state=16, headdim=16, batch_size=2, seq_len=32,
                               eval_batches=1, sample_bytes=4, steps=1, data=str(corpus), out=str(tmp_path / "r")),
                   progress=False, say=lambda m: None)
    val = load_corpus(str(corpus)).val
    prompt = sample_prompt_from(val)
    assert prompt and prompt == bytes(val[:len(prompt)]).decode() and not prompt.startswith("def ")
    assert result.sample.startswith(prompt) and len(result.sample.encode()) >= len(prompt) + 1
    assert sample_prompt_from(np.frombuffer(b"\n\n  \nhello world\nmore", np.uint8)) == "hello world"
    assert sample_prompt_from(np.frombuffer("€€€".encode(), np.uint8), max_bytes=4) == "€"  # whole characters


def test_control_bytes_are_escaped_and_newlines_and_tabs_kept():
    assert escape_controls("a\x1b[2J\x07b\n\tc\r\x7f\x9b€\ufffd") == "a\\x1b[2J\\x07b\n\tc\\x0d\\x7f\\x9b€\ufffd"
    result = TrainResult("done", 1, Path("r"), Path("r/c"), 2.0, 1.0, 64, 1.0, 1.0, 64.0, 4.0, None,
                         sample="def x\x1b[31m\x08\n")
    text = summary(result)
    assert "def x\\x1b[31m\\x08\n" in text and "\x1b" not in text and "\x08" not in text


class _FixedModel:
    def __init__(self, data):
        self.data = data

    def generate_stream(self, input_ids, max_new_tokens, **sampling):
        for b in self.data[:max_new_tokens]:
            yield np.array([b])


def test_generate_escapes_control_bytes_on_the_terminal(monkeypatch, capsys):
    monkeypatch.setattr("tinygrad_ssm.train.cli.load_model",
                        lambda path, **kw: (_FixedModel(b"\x1b]0;pwn\x07ok\n\t."), ByteTokenizer()))
    assert cli.main(["generate", "--checkpoint", "x", "--prompt", "p\x1b", "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out == "p\\x1b\\x1b]0;pwn\\x07ok\n\t.\n"


@pytest.mark.parametrize("flags,message", [
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--top-k", "0"], "--top-k must be >= 1 (leave it out for no limit), got 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--min-p", "1.5"], "--min-p must be in [0, 1] (leave it out for no filter), got 1.5"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be a finite number > 0 (1 = none;"),
    (["--repetition-penalty", "inf"], "--repetition-penalty must be a finite number > 0"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1"),
    (["--backend", "nope"], "--backend must be 'auto' or one of"),
    (["--prompt", "caf" + os.fsdecode(b"\xe9")],
     "--prompt holds the byte 0xe9 (character 3), which is not valid UTF-8"),
    (["--prompt", "p", "--batch-file", "prompts.txt"], "--prompt and --batch-file exclude each other"),
])
def test_bad_generate_flags_are_named(tmp_path, capsys, flags, message):
    assert cli.main(["generate", "--checkpoint", str(tmp_path / "missing"), *flags]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "top_k" not in err and "temperature must be a number" not in err


@pytest.mark.parametrize("flags,message", [
    (["--window", "0"], "--window must be >= 1, got 0"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1 (leave it out for the whole text), got 0"),
    (["--backend", "nope"], "--backend must be 'auto' or one of"),
])
def test_bad_eval_flags_are_named_before_the_model_is_loaded(tmp_path, capsys, flags, message):
    assert cli.main(["eval", "--model", str(tmp_path / "missing"), *flags]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "does not exist" not in err          # the flags first: no model looked for


def test_bad_sample_prompt_is_named(corpus, tmp_path, capsys):
    bad = os.fsdecode(b"\xff")
    assert run_train(corpus, tmp_path / "run", "--sample-prompt", bad) == cli.EXIT_USAGE
    assert "--sample-prompt holds the byte 0xff" in capsys.readouterr().err


def nan_model_folder(tmp_path):
    model = Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=256, d_state=4, headdim=8,
                                           chunk_size=8), VarMap(seed=0))
    model.save_pretrained(tmp_path / "nan")
    model.varmap["backbone.norm_f.weight"].data[:] = np.nan  # as another tool may have saved it (save_pretrained
    model.varmap.save(tmp_path / "nan" / "model.safetensors")  # refuses): the file's weights themselves
    return tmp_path / "nan"


def test_nan_weights_stop_generation_naming_the_step(tmp_path, capsys, monkeypatch):
    """A folder of NaN weights is refused at load, naming the tensor (it loaded, and every logit was NaN); weights
    made NaN in memory stop generation at its first step, naming it (greedy used to return token 0 forever)."""
    folder = nan_model_folder(tmp_path)
    assert cli.main(["generate", "--checkpoint", str(folder), "--max-new-tokens", "5"]) == cli.EXIT_USAGE
    assert "tensor 'backbone.norm_f.weight' holds 16 non-finite value(s)" in capsys.readouterr().err
    with pytest.raises(PretrainedError, match=r"'backbone.norm_f.weight' holds 16 non-finite value\(s\) .* in '.*"
                                              r"model.safetensors'; the model would compute NaN"):
        Mamba2LMHeadModel.from_pretrained(folder)

    def nan_model():
        model = Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=256, d_state=4, headdim=8,
                                               chunk_size=8), VarMap(seed=0))
        model.varmap["backbone.norm_f.weight"].data[:] = np.nan
        return model
    monkeypatch.setattr("tinygrad_ssm.train.cli.load_model", lambda path, **kw: (nan_model(), ByteTokenizer()))
    assert cli.main(["generate", "--checkpoint", "x", "--max-new-tokens", "5"]) == cli.EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "generate: step 1 (token 1 of 5, after the prompt)" in err and "NaN" in err
    for temperature in (0.0, 1.0):
        with pytest.raises(NonFiniteLogits, match="step 1"):
            nan_model().generate(np.array([[65]]), 3, temperature=temperature)


def test_logits_turning_non_finite_later_name_that_step(tmp_path):
    model = Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=256, d_state=4, headdim=8,
                                           chunk_size=8), VarMap(seed=0))
    real_step, calls = model.step, []

    def step(ids, cache):
        calls.append(1)
        out = real_step(ids, cache)
        if len(calls) == 2:
            out.data[0, 7] = np.inf
        return out

    model.step = step
    with pytest.raises(NonFiniteLogits, match=r"step 3 \(token 3 of 6, after 2 generated tokens\).*\+inf"):
        model.generate(np.array([[65]]), 6, seed=0)


@pytest.mark.parametrize("row", [[np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf]])
def test_sample_next_refuses_what_it_cannot_sample_from(row):
    logits = np.array([[0.0, 1.0], row])
    with pytest.raises(NonFiniteLogits, match="batch row 1"):
        sample_next(logits, np.random.default_rng(0), temperature=1.0)
    with pytest.raises(NonFiniteLogits, match="batch row 1"):
        sample_next(logits, np.random.default_rng(0), temperature=0.0)
    ok = np.array([[0.0, -np.inf]])  # -inf for a token that is merely impossible is fine
    assert sample_next(ok, np.random.default_rng(0)).tolist() == [0]


def test_the_eta_leaves_out_the_first_step():
    clock = [0.0]
    bar = progress_bar(total=100, file=io.StringIO(), unit="step")
    bar._time = lambda: clock[0]
    clock[0] = 60.0  # the first step: numba compiling, 60 s
    bar.update(1)
    assert "?" in bar.format_meter(**bar.format_dict).split("<")[1]  # unknown, not 99 x 60 s
    for _ in range(4):  # then 1 s a step
        clock[0] += 1.0
        bar.update(1)
    d = bar.format_dict
    assert d["rate"] == pytest.approx(1.0)
    assert "01:35" in bar.format_meter(**d)  # 95 steps left at 1 s each


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")
def test_a_fifo_as_data_fails_at_once(tmp_path):
    fifo = tmp_path / "data.txt"
    os.mkfifo(fifo)
    errors = []

    def load():
        try:
            load_corpus(str(fifo))
        except DataError as e:
            errors.append(str(e))

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():
        with open(fifo, "wb"):
            pass
        pytest.fail("load_corpus blocked on a FIFO")
    assert errors and "data.txt" in errors[0] and "regular file" in errors[0]
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "folder" / "pipe.txt")
    (tmp_path / "folder" / "text.txt").write_bytes(b"hello world\n" * 50)
    assert load_corpus(str(tmp_path / "folder")).train_files  # a pipe inside a folder is skipped


def test_readme_and_help_give_the_same_duration():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts = {"README": README.read_text(), "--help": parser.format_help(),
             "train --help": sub.choices["train"].format_help(), "module docstring": cli.__doc__}
    for where, text in texts.items():
        text = " ".join(text.split())
        assert "about three minutes" in text, where
        assert not any(s in text for s in ("~5 minutes", "five minutes", "four minutes", "~4 minutes")), where


def test_train_help_states_the_optimizer_the_run_builds_and_what_init_from_starts():
    """A transformers user assumes AdamW's betas (0.9, 0.999), a warmup from lr 0 and decay on every tensor; the
    help said none of the run's own choices, nor that --init-from starts fresh moments where --resume continues."""
    from tinygrad_ssm.optim import WarmupCosine
    from tinygrad_ssm.train.optimizers import build_optimizers
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["train"].format_help().split())
    model = Mamba2LMHeadModel(Mamba2Config(d_model=16, n_layer=1, vocab_size=256, d_state=4, headdim=8), VarMap())
    opts = build_optimizers(model, TrainConfig())
    assert {o.weight_decay for o in opts.values()} == {TrainConfig().weight_decay, 0.0}
    assert all(p.ndim >= 2 for _, p in opts["decay"].params) and all(p.ndim < 2 for _, p in opts["no_decay"].params)
    stated = re.search(r"AdamW \(betas ([\d.]+), ([\d.]+); eps ([\d.e-]+)\)", text)
    assert stated is not None, text
    for opt in opts.values():
        assert tuple(map(float, stated.groups())) == (opt.beta1, opt.beta2, opt.eps)
    assert "weight decay, on the matrices (ndim >= 2) only" in text
    assert WarmupCosine(1.0, 4, 10)(0) == 1 / 4 and "--lr * (k + 1) / N, never 0" in text
    assert "start a new run (step 0, fresh AdamW moments and schedule, its own --out)" in text
    assert "which is only read" in text and "To continue a run with its optimizer state, use --resume" in text


def test_the_memory_estimate_counts_the_runs_vocabulary():
    """A tokenizer's or a checkpoint's vocabulary (issue 23: 50,280 for GPT-NeoX's BPE) is in the estimate: a batch
    that fits with 256 bytes is refused with 50,288 rows, and the message names the vocabulary."""
    from tinygrad_ssm.train.checks import physical_memory_bytes, step_memory_bytes, train_config_problems
    have = physical_memory_bytes()
    if have is None:
        pytest.skip("this platform does not tell its memory")
    one = step_memory_bytes(TrainConfig(batch_size=1))
    cfg = TrainConfig(batch_size=max(1, have // (4 * one)))            # a quarter of the memory with bytes
    assert train_config_problems(cfg) == []
    refused = train_config_problems(cfg, vocab_size=50288)
    assert len(refused) == 1 and f"--n-layer {cfg.n_layer}, vocabulary 50,288) needs about" in refused[0], refused


def test_a_chunk_size_past_the_sequence_costs_what_a_chunk_of_the_sequence_does():
    """--chunk-size 100000000 with --seq-len 32 was refused as needing 334 GiB, blaming --batch-size and --seq-len:
    a chunk is at most the sequence, and the scan takes it so (found by a fuzz of the command line)."""
    from tinygrad_ssm.train.checks import step_memory_bytes, train_config_problems
    cfg = TrainConfig(batch_size=2, seq_len=32, chunk_size=10**8)
    assert step_memory_bytes(cfg) == step_memory_bytes(TrainConfig(batch_size=2, seq_len=32, chunk_size=32))
    assert train_config_problems(cfg) == []


def test_eval_of_a_runs_own_split_refuses_data_changed_since_training(corpus, tmp_path, capsys):
    """Without --data, eval rebuilt the run's validation split from its --data folder as it is now: with files
    added it scored a training file as "the validation split"; with the data gone it blamed a --data flag the
    user never gave."""
    data = tmp_path / "data"
    data.mkdir()
    lines = corpus.read_bytes().splitlines(keepends=True)
    for i in range(6):
        (data / f"part{i}.txt").write_bytes(b"".join(lines[i * 50:(i + 1) * 50]))
    assert run_train(data, tmp_path / "run", "--steps", "1", "--val-fraction", "0.2") == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(tmp_path / "run"), "--no-progress"]) == cli.EXIT_OK
    assert "the validation split of" in capsys.readouterr().out
    (data / "part6.txt").write_bytes(b"".join(lines[:40]))
    assert cli.main(["eval", "--model", str(tmp_path / "run"), "--no-progress"]) == cli.EXIT_USAGE
    assert f"the data this run trained on ('{data}') has changed since" in capsys.readouterr().err
    for f in data.iterdir():
        f.unlink()
    data.rmdir()
    assert cli.main(["eval", "--model", str(tmp_path / "run"), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"the data this run trained on ('{data}') cannot be read now" in err and "give --data PATH" in err


def test_eval_json_replaces_only_its_own_reports(stopped_run, corpus, tmp_path, capsys):
    """--json FILE overwrote any file: the text being scored, or the model's config.json."""
    text = tmp_path / "notes.txt"
    text.write_bytes(corpus.read_bytes()[:3000])
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    for target in (text, link):
        before = target.read_bytes() if target.exists() else None
        assert cli.main(["eval", "--model", str(stopped_run), "--data", str(text), "--json", str(target),
                         "--no-progress"]) == cli.EXIT_USAGE
        assert "exists and is not a report eval wrote; give a new file name" in capsys.readouterr().err
        assert (target.read_bytes() if target.exists() else None) == before and target.is_symlink() == (target == link)
    report = tmp_path / "report.json"
    for window in ("64", "32"):  # the second run replaces the first one's report
        assert cli.main(["eval", "--model", str(stopped_run), "--data", str(text), "--json", str(report),
                         "--window", window, "--no-progress"]) == cli.EXIT_OK
        assert json.loads(report.read_text())["window"] == int(window)


def test_eval_json_leaves_a_file_that_appeared_while_scoring(stopped_run, corpus, tmp_path, capsys, monkeypatch):
    """The check ran before scoring, the write after it: a user's file created meanwhile was replaced."""
    from tinygrad_ssm.train import scoring
    text, report = tmp_path / "notes.txt", tmp_path / "report.json"
    text.write_bytes(corpus.read_bytes()[:2000])
    real_score = scoring.score

    def score_while_the_user_writes(*args, **kwargs):
        report.write_text("USER FILE")
        return real_score(*args, **kwargs)

    monkeypatch.setattr(cli, "score", score_while_the_user_writes)
    assert cli.main(["eval", "--model", str(stopped_run), "--data", str(text), "--json", str(report),
                     "--no-progress"]) == cli.EXIT_IO
    assert "a file that is not eval's report appeared there while scoring; it was left as it is" in \
        capsys.readouterr().err
    assert report.read_text() == "USER FILE" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt",
                                                                                                "report.json"]


@pytest.mark.parametrize("suffix,body", [(".txt", b"hello\r\nworld\r\n"), (".jsonl", b'{"prompt": "hello"}\n')])
def test_a_batch_files_byte_order_mark_is_not_part_of_its_first_prompt(tmp_path, suffix, body):
    """Notepad's "UTF-8 with BOM": the mark went into the first prompt of a text file (and a .jsonl was refused)."""
    path = tmp_path / f"prompts{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + body)
    prompts, lines = read_batch_file(str(path))
    assert prompts[0] == "hello" and lines[0] == 1


@pytest.mark.parametrize("command,flag", [
    ("train", "--data"), ("train", "--out"), ("train", "--resume"), ("train", "--init-from"), ("train", "--tokenizer"),
    ("generate", "--tokenizer"), ("generate", "--batch-file"), ("generate", "--prompt-file"), ("eval", "--model"),
    ("eval", "--data"),
    ("eval", "--json")])
def test_an_empty_path_is_refused_by_name_not_read_as_the_current_folder(stopped_run, corpus, tmp_path, monkeypatch,
                                                                         capsys, command, flag):
    """`--data "$DATA"` with DATA unset: Path("") is the current folder, which train read as its corpus (and
    eval scored), and `--out ""` trained into runs/ there without a word."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's own file, which no command may read or write beside")
    base = {"train": ["train", "--data", str(corpus), "--out", str(tmp_path / "run"), *TINY, "--steps", "1"],
            "generate": ["generate", "--model", str(stopped_run)], "eval": ["eval", "--model", str(stopped_run)]}
    assert cli.main([*base[command], flag, ""]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{flag} '' is an empty path (an unset shell variable?); give " in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
