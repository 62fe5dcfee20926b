"""generate reads a model folder's generation_config.json as transformers does: it stops at every id of its
eos_token_id (a list, else config.json's, and the tokenizer's EOS), and takes its sampling settings (temperature,
top_k, top_p, min_p, repetition_penalty) when none of the sampling flags is given."""
import json
import re

import numpy as np
import pytest

from tests.support.checkpoints import write_checkpoint
from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.generate import escape_controls
from tinygrad_ssm.train.generation_config import (DEFAULT_TEMPERATURE, GenerationDefaults, read_generation_defaults,
                                                  sampling_settings, stop_ids)

PROMPT = "line 7: the"
CLI = {"temperature": DEFAULT_TEMPERATURE, "top_k": None, "top_p": None, "min_p": None, "repetition_penalty": None}
NONE = dict.fromkeys(CLI)                                               # no sampling flag given


@pytest.fixture
def folder(bpe_tokenizer, tmp_path):
    """A transformers-layout checkpoint (config.json's eos_token_id 0) with the test's BPE tokenizer.json."""
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=320, d_state=16, headdim=16, chunk_size=16,
                          pad_vocab_size_multiple=16)
    model = Mamba2LMHeadModel(config, VarMap(seed=3))
    path = write_checkpoint("transformers", tmp_path / "m", model, tokenizer_json=bpe_tokenizer)
    stated = json.loads((path / "config.json").read_text())
    _write(path / "config.json", {**stated, "eos_token_id": 0, "bos_token_id": 0})
    return path, model


def _write(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")


def _generate(folder, capsys, *flags) -> str:
    assert cli.main(["generate", "--model", str(folder), "--prompt", PROMPT, "--max-new-tokens", "12",
                     *flags]) == cli.EXIT_OK
    return capsys.readouterr().out


def test_the_stop_ids_come_from_generation_config_else_config_json(folder):
    path, _ = folder
    assert read_generation_defaults(path, 320).eos_token_ids == (0,)              # config.json's
    _write(path / "generation_config.json", {"eos_token_id": [5, 0, 7], "pad_token_id": 1})
    defaults = read_generation_defaults(path, 320)
    assert defaults.eos_token_ids == (5, 0, 7) and defaults.sampling == {}
    tok = FileTokenizer(path / "tokenizer.json")
    assert stop_ids(tok, defaults) == (0, 5, 7)                                   # the tokenizer's EOS first
    _write(path / "generation_config.json", {"eos_token_id": 9})
    assert read_generation_defaults(path, 320).eos_token_ids == (9,)
    _write(path / "generation_config.json", {"eos_token_id": None})                # null: config.json's again
    assert read_generation_defaults(path, 320).eos_token_ids == (0,)


@pytest.mark.parametrize("stated, sampling", [
    ({"do_sample": False, "temperature": 0.5}, {"temperature": 0.0}),
    ({"do_sample": True, "temperature": 0.6, "top_k": 0, "top_p": 1.0}, {"temperature": 0.6, "top_k": None,
                                                                         "top_p": None}),
    ({"top_k": 7, "top_p": 0.9}, {"top_k": 7, "top_p": 0.9}),
    ({"temperature": 0}, {"temperature": 0.0}),                                     # greedy, as stated
    ({"eos_token_id": 3}, {}),
    ({"do_sample": True}, {"temperature": 1.0, "top_k": 50, "top_p": None}),        # transformers' defaults
    ({"do_sample": True, "top_p": 0.9}, {"temperature": 1.0, "top_k": 50, "top_p": 0.9}),
    # top_p 0: transformers keeps the likeliest token alone (it was refused here)
    ({"do_sample": True, "top_p": 0.0}, {"temperature": 0.0, "top_k": 50, "top_p": None}),
    ({"min_p": 0.1, "repetition_penalty": 1.0}, {"min_p": 0.1, "repetition_penalty": None}),
    ({"min_p": 0, "repetition_penalty": 1.3}, {"min_p": None, "repetition_penalty": 1.3}),
    # greedy: transformers drops its warpers (min_p) and keeps its processors (the repetition penalty)
    ({"do_sample": False, "min_p": 0.1, "repetition_penalty": 1.3}, {"temperature": 0.0, "repetition_penalty": 1.3}),
])
def test_the_sampling_settings_stated_apply_when_no_flag_is_given(folder, stated, sampling):
    path, _ = folder
    _write(path / "generation_config.json", stated)
    defaults = read_generation_defaults(path, 320)
    assert defaults.sampling == sampling
    assert sampling_settings(NONE, defaults) == {**CLI, **sampling}
    # one flag given: the CLI's defaults for the others, not the file's
    assert sampling_settings({**NONE, "top_k": 3}, defaults) == {**CLI, "top_k": 3}
    assert sampling_settings({**NONE, "repetition_penalty": 1.1}, defaults) == {**CLI, "repetition_penalty": 1.1}


@pytest.mark.parametrize("stated, message", [
    ({"eos_token_id": [1, 400]}, r"generation_config.json': eos_token_id must be an id or a list of ids in \[0, 320\)"),
    ({"eos_token_id": []}, "eos_token_id must be an id or a list of ids"),
    ({"eos_token_id": 320}, r"eos_token_id must be an id or a list of ids in \[0, 320\)"),   # one past the last row
    ([1, 2], "must hold a JSON object"),
])
def test_a_bad_generation_config_is_named_with_its_key(folder, stated, message, capsys):
    path, _ = folder
    _write(path / "generation_config.json", stated)
    with pytest.raises(ValueError, match=message):
        read_generation_defaults(path, 320)
    assert cli.main(["generate", "--model", str(path), "--prompt", "x"]) == cli.EXIT_USAGE
    assert "generation_config.json" in capsys.readouterr().err


@pytest.mark.parametrize("stated, message", [
    ({"temperature": -1}, "generation_config.json': temperature must be a number >= 0, got -1; fix it, or give "
                          "--temperature"),
    ({"top_k": 2.5}, "top_k must be an int >= 0"),
    ({"top_p": 1.5}, r"top_p must be in \[0, 1\]"),
    ({"top_k": float("inf")}, "top_k must be an int >= 0"),                 # Infinity in the file: was a traceback
    ({"top_k": float("nan")}, "top_k must be an int >= 0"),                 # NaN: an error naming neither
    ({"do_sample": "no"}, "do_sample must be true or false, got 'no'; fix it, or give --temperature"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\] \(0: no filter\), got 1.5; fix it, or give --min-p"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0 .*give --repetition-penalty"),
])
def test_a_bad_sampling_value_is_named_where_the_file_applies_and_a_flag_sets_it_aside(folder, stated, message,
                                                                                       capsys):
    path, _ = folder
    _write(path / "generation_config.json", stated)
    defaults = read_generation_defaults(path, 320)
    with pytest.raises(ValueError, match=message):
        sampling_settings(NONE, defaults)
    assert cli.main(["generate", "--model", str(path), "--prompt", "x", "--max-new-tokens", "2"]) == cli.EXIT_USAGE
    assert "generation_config.json" in capsys.readouterr().err
    # as the message says: a flag gives the CLI's settings, and the file's bad value is not in the way
    assert sampling_settings({**NONE, "temperature": 0.0}, defaults) == {**CLI, "temperature": 0.0}
    assert cli.main(["generate", "--model", str(path), "--prompt", "x", "--max-new-tokens", "2",
                     "--temperature", "0"]) == cli.EXIT_OK


def test_generate_stops_at_any_eos_of_the_folder_and_the_batch_file_too(folder, capsys, tmp_path):
    path, model = folder
    tok = FileTokenizer(path / "tokenizer.json")
    ids = tok.encode(PROMPT)
    free = model.generate(ids[None], 12, temperature=0, vocab_size=320)[0, len(ids):]
    free = free[:list(free).index(0)] if 0 in free else free
    assert len(free) > 4, "the test needs a longer greedy continuation"
    stop = int(free[3])
    first = list(free).index(stop)
    _write(path / "generation_config.json", {"eos_token_id": [0, stop]})
    want = escape_controls(PROMPT + tok.decode(free[:first])) + "\n"
    assert _generate(path, capsys, "--temperature", "0") == want
    (tmp_path / "prompts.txt").write_text(PROMPT + "\n")
    assert cli.main(["generate", "--model", str(path), "--batch-file", str(tmp_path / "prompts.txt"),
                     "--max-new-tokens", "12", "--temperature", "0"]) == cli.EXIT_OK
    assert capsys.readouterr().out == f"=== 1/1, line 1 ===\n{want}"
    ignored = _generate(path, capsys, "--temperature", "0", "--ignore-eos")
    assert ignored.startswith(escape_controls(PROMPT + tok.decode(free[:first]) + tok.token_text(stop)))


def test_generation_configs_greedy_applies_without_flags(folder, capsys):
    path, _ = folder
    greedy = _generate(path, capsys, "--temperature", "0")
    assert _generate(path, capsys, "--seed", "1") != greedy               # the CLI samples by default
    _write(path / "generation_config.json", {"do_sample": False})
    assert _generate(path, capsys, "--seed", "1") == greedy
    assert _generate(path, capsys, "--seed", "1", "--top-k", "1000") != greedy   # a flag: the CLI's defaults


def test_the_cli_stops_where_transformers_generate_stops(folder, capsys):
    """transformers' generate with the folder's defaults (generation_config.json: eos_token_id a list, do_sample
    false): the same ids up to its first EOS; the CLI prints their text and stops there."""
    torch = pytest.importorskip("torch", reason="torch is an optional reference")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    path, model = folder
    tok = FileTokenizer(path / "tokenizer.json")
    ids = tok.encode(PROMPT)
    free = model.generate(ids[None], 12, temperature=0, vocab_size=320)[0, len(ids):]
    stop = int(free[2])
    _write(path / "generation_config.json", {"eos_token_id": [0, stop], "do_sample": False, "pad_token_id": 1})
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        out = theirs.generate(torch.tensor(ids[None]), max_new_tokens=12)[0, len(ids):].tolist()
    assert out[-1] in (0, stop) and not set(out[:-1]) & {0, stop}
    np.testing.assert_array_equal(out, free[:len(out)])
    assert _generate(path, capsys) == escape_controls(PROMPT + tok.decode(out[:-1])) + "\n"


def test_defaults_of_a_folder_without_files_are_the_clis(tmp_path):
    assert read_generation_defaults(tmp_path, 10) == GenerationDefaults()
    assert sampling_settings(NONE, None) == CLI and CLI["temperature"] == 0.8


@pytest.mark.parametrize("stated, named", [({"do_sample": True, "typical_p": 0.9}, "typical_p 0.9"),
                                           ({"no_repeat_ngram_size": 3, "num_beams": 4},
                                            "no_repeat_ngram_size 3, num_beams 4"),
                                           ({"do_sample": False, "min_length": 10, "stop_strings": "z",
                                             "encoder_repetition_penalty": 2.0},
                                            "encoder_repetition_penalty 2.0, min_length 10, stop_strings 'z'")])
def test_a_setting_generate_lacks_is_refused_where_the_files_settings_apply(folder, stated, named, capsys):
    """transformers applies typical_p, beams, n-gram bans...; sampling without them would silently give another
    distribution than the folder states. Named where the file's settings would apply; a sampling flag (the CLI's
    settings, not the file's) generates as usual."""
    path, _ = folder
    _write(path / "generation_config.json", stated)
    defaults = read_generation_defaults(path, 320)
    with pytest.raises(ValueError, match=f"states {named}, which generate does not implement; give a sampling flag "
                                         f"\\(--temperature, --top-k, --top-p, --min-p, --repetition-penalty\\)"):
        sampling_settings(NONE, defaults)
    assert sampling_settings({**NONE, "temperature": 0.5}, defaults)["temperature"] == 0.5
    assert cli.main(["generate", "--model", str(path), "--prompt", "x"]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert named in captured.err and captured.out == ""
    _generate(path, capsys, "--temperature", "0.5")


def test_the_neutral_values_of_those_settings_change_nothing(folder):
    path, _ = folder
    _write(path / "generation_config.json", {"repetition_penalty": 1.0, "num_beams": 1, "min_p": None,
                                             "bad_words_ids": None, "suppress_tokens": [], "do_sample": False})
    defaults = read_generation_defaults(path, 320)
    assert defaults.unsupported == ()
    assert sampling_settings(NONE, defaults) == {**CLI, "temperature": 0.0}


def test_do_sample_alone_takes_transformers_defaults():
    """{"do_sample": true} samples with what transformers' generate fills in (it sampled at the CLI's 0.8)."""
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    from tinygrad_ssm.train.generation_config import TRANSFORMERS_SAMPLING
    theirs = transformers.GenerationConfig._get_default_generation_params()
    assert TRANSFORMERS_SAMPLING == {"temperature": theirs["temperature"], "top_k": theirs["top_k"],
                                     "top_p": None if theirs["top_p"] == 1.0 else theirs["top_p"]}


@pytest.mark.parametrize("penalty", [0.5, 1.5])
def test_a_repetition_penalty_of_the_folder_generates_what_transformers_generates(folder, capsys, penalty):
    """generation_config.json's greedy decoding with a repetition_penalty (transformers applies it without sampling
    too): transformers' generate and ours give the same ids, which differ from plain greedy (below 1 the prompt's
    and the text's ids are favoured, above 1 a repeat is avoided), and the CLI without flags prints their text."""
    torch = pytest.importorskip("torch", reason="torch is an optional reference")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    path, model = folder
    tok = FileTokenizer(path / "tokenizer.json")
    ids = tok.encode(PROMPT)
    _write(path / "generation_config.json", {"do_sample": False, "repetition_penalty": penalty, "eos_token_id": 0})
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        out = theirs.generate(torch.tensor(ids[None]), max_new_tokens=24)[0, len(ids):].tolist()
    ours = model.generate(ids[None], 24, temperature=0, repetition_penalty=penalty, vocab_size=320, eos_token_id=0)
    np.testing.assert_array_equal(ours[0, len(ids):], out)
    plain = model.generate(ids[None], 24, temperature=0, vocab_size=320, eos_token_id=0)[0, len(ids):]
    assert not np.array_equal(plain, out)
    shown = out[:12]                                                    # the CLI's 12 tokens, up to an EOS
    shown = shown[:shown.index(0)] if 0 in shown else shown
    assert _generate(path, capsys) == escape_controls(PROMPT + tok.decode(shown)) + "\n"


def test_the_min_p_and_repetition_penalty_flags_reach_generate(folder, capsys):
    """--min-p 1 keeps the likeliest token alone, so sampling at the CLI's temperature prints greedy's text;
    --repetition-penalty prints the text of generate's ids with that penalty (and another than without it)."""
    path, model = folder
    greedy = _generate(path, capsys, "--temperature", "0")
    assert _generate(path, capsys, "--seed", "1") != greedy
    assert _generate(path, capsys, "--seed", "1", "--min-p", "1") == greedy
    tok = FileTokenizer(path / "tokenizer.json")
    ids = tok.encode(PROMPT)
    new = model.generate(ids[None], 12, temperature=0, repetition_penalty=0.5, vocab_size=320)[0, len(ids):].tolist()
    new = new[:new.index(0)] if 0 in new else new                       # config.json's eos_token_id 0
    penalised = _generate(path, capsys, "--temperature", "0", "--repetition-penalty", "0.5")
    assert penalised == escape_controls(PROMPT + tok.decode(new)) + "\n" != greedy


def test_eval_reads_no_generation_config(folder, tmp_path, capsys):
    """eval refused a folder whose generation_config.json generate would refuse (a trailing comma, an eos id past
    the vocabulary), though it never uses the file; transformers loads such a folder."""
    path, _ = folder
    text = tmp_path / "t.txt"
    text.write_text("line 7: the quick brown fox\n" * 4)
    for stated in ('{"eos_token_id": 0,}', '{"eos_token_id": [0, 50281]}'):
        (path / "generation_config.json").write_text(stated)
        assert cli.main(["eval", "--model", str(path), "--data", str(text)]) == cli.EXIT_OK
        assert cli.main(["generate", "--model", str(path), "--prompt", "x"]) == cli.EXIT_USAGE
        assert "generation_config.json" in capsys.readouterr().err


def _generated_count(path, capsys, *flags) -> list[int]:
    """--batch-file of two prompts (3 and ~11 tokens), --ignore-eos, greedy: each prompt's new_tokens."""
    prompts = path.parent / "prompts.txt"
    prompts.write_text("a b\n" + PROMPT + " end\n")
    code = cli.main(["generate", "--model", str(path), "--batch-file", str(prompts), "--json", "-", "--ignore-eos",
                     "--temperature", "0", *flags])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    return [json.loads(line)["new_tokens"] for line in out.splitlines()]


def test_the_files_max_new_tokens_or_max_length_is_the_length_without_the_flag(folder, capsys):
    """transformers generates the file's max_new_tokens, else max_length less the (padded) prompt; the CLI generated
    its own 300 whatever the file said. The flag still wins."""
    path, model = folder
    tok = FileTokenizer(path / "tokenizer.json")
    longest = len(tok.encode(PROMPT + " end"))
    _write(path / "generation_config.json", {"max_new_tokens": 5, "max_length": 50})
    assert _generated_count(path, capsys) == [5, 5]
    assert _generated_count(path, capsys, "--max-new-tokens", "7") == [7, 7]
    _write(path / "generation_config.json", {"max_length": longest + 4})
    assert _generated_count(path, capsys) == [4, 4]                     # the batch's longest prompt counts
    ids = tok.encode(PROMPT)                                            # --prompt alone: max_length less its own
    want = model.generate(ids[None], longest + 4 - len(ids), temperature=0, vocab_size=320)[0, len(ids):]
    assert cli.main(["generate", "--model", str(path), "--prompt", PROMPT, "--temperature", "0",
                     "--ignore-eos"]) == cli.EXIT_OK
    assert capsys.readouterr().out == escape_controls(PROMPT + tok.decode(want)) + "\n"


@pytest.mark.parametrize("stated, message", [
    ({"max_length": 3}, r"max_length 3 \(prompt and new tokens together\), and the prompt has \d+ tokens: nothing is "
                        r"left to generate; give --max-new-tokens"),
    ({"max_new_tokens": -1}, r"generation_config.json': max_new_tokens must be an int >= 0, got -1; fix it, or give "
                             r"--max-new-tokens"),
    ({"max_new_tokens": "5"}, r"max_new_tokens must be an int >= 0, got '5'"),
    ({"max_length": True}, r"max_length must be an int >= 1, got True")])
def test_a_length_that_cannot_apply_is_refused_before_any_output_and_the_flag_sets_it_aside(folder, capsys, stated,
                                                                                            message):
    path, _ = folder
    _write(path / "generation_config.json", stated)
    assert cli.main(["generate", "--model", str(path), "--prompt", PROMPT]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and re.search(message, captured.err)
    assert _generate(path, capsys, "--temperature", "0")                 # --max-new-tokens 12 given: runs
    if "max_length" in stated and stated["max_length"] == 3:            # a --batch-file: its longest prompt named
        prompts = path.parent / "prompts.txt"
        prompts.write_text("a\n" + PROMPT + "\n")
        assert cli.main(["generate", "--model", str(path), "--batch-file", str(prompts)]) == cli.EXIT_USAGE
        captured = capsys.readouterr()
        assert captured.out == "" and re.search(r"max_length 3 \(prompt and new tokens together\), and the longest "
                                                r"prompt of --batch-file has \d+ tokens: nothing is left", captured.err)
