"""A run on a BPE tokenizer (trained in the test), and what a user with a checkpoint does with it: generate text (equal
to decoding generate's ids), eval (equal to one plain forward), fine-tune with --init-from (starting from the
checkpoint's weights exactly, resumable like any run)."""
import json
import shutil
import warnings

import numpy as np
import pytest

from tests.support.checkpoints import LAYOUTS, write_checkpoint
from tests.support.tokenizers import corpus_texts, train_byte_fallback
from tests.support.training import TINY, quiet
from tinygrad_ssm import VarMap
from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
from tinygrad_ssm.models.mamba2.evaluation import evaluate
from tinygrad_ssm.tokenizer import FileTokenizer, TokenizerError
from tinygrad_ssm.train import cli
from tinygrad_ssm.train.batches import BatchSampler
from tinygrad_ssm.train.data import load_corpus, tokenize
from tinygrad_ssm.train.generate import escape_controls, load_model, stream_text
from tinygrad_ssm.train.loop import TrainConfig, train

SETTINGS = dict(TINY, dtype="float64", steps=2)


@pytest.fixture(scope="module")
def bpe_run(corpus, bpe_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe") / "run"
    result = train(TrainConfig(**SETTINGS, data=str(corpus), out=str(out), tokenizer=str(bpe_tokenizer)),
                   overrides={"tokenizer": str(bpe_tokenizer)}, progress=False, say=quiet)
    assert result.status == "done"
    return out


def test_the_run_trains_on_tokens_and_keeps_its_tokenizer(bpe_run, bpe_tokenizer):
    checkpoint = bpe_run / "checkpoints" / "step-000002"
    assert (checkpoint / "tokenizer.json").read_bytes() == bpe_tokenizer.read_bytes()
    model, tok = load_model(bpe_run)
    assert model.config.vocab_size == 320 and model.config.padded_vocab_size == 320 and tok.vocab_size == 320
    bpe_tokenizer_moved = bpe_tokenizer.with_name("moved.json")  # the run needs the file it was given no more
    shutil.move(bpe_tokenizer, bpe_tokenizer_moved)
    try:
        assert load_model(bpe_run)[1].vocab_size == 320
    finally:
        shutil.move(bpe_tokenizer_moved, bpe_tokenizer)


def test_generate_prints_the_decoded_ids(bpe_run, capsys):
    model, tok = load_model(bpe_run)
    prompt = "line 12: the"
    ids = tok.encode(prompt)
    expected = model.generate(ids[None], 12, temperature=0)[0, len(ids):]
    cut = list(expected).index(0) if 0 in expected else len(expected)  # EOS (id 0) ends the text
    assert cli.main(["generate", "--model", str(bpe_run), "--prompt", prompt, "--max-new-tokens", "12",
                     "--temperature", "0"]) == cli.EXIT_OK
    assert capsys.readouterr().out == escape_controls(prompt + tok.decode(expected[:cut])) + "\n"


def test_eval_equals_one_plain_forward_whatever_the_window(bpe_run, corpus, capsys):
    tok = load_model(bpe_run)[1]
    model = Mamba2LMHeadModel.from_pretrained(bpe_run, dtype="float64")
    ids = tok.encode_bytes(corpus.read_bytes())
    plain = float(model.loss(ids[None, :-1], ids[None, 1:]).data)  # one forward over the whole text
    for window in (1, 7, 64, 4096):  # float64: the windows with the state carried are that forward
        assert abs(evaluate(model, ids, window).mean_nats - plain) < 1e-10
    assert evaluate(model, ids, 16, carry_state=False).mean_nats > plain + 1e-3  # each window forgets the past

    model32 = Mamba2LMHeadModel.from_pretrained(bpe_run)  # what the CLI loads: float32
    plain32 = float(model32.loss(ids[None, :-1], ids[None, 1:]).data)
    for window in ("7", "4096"):
        assert cli.main(["eval", "--model", str(bpe_run), "--data", str(corpus), "--window", window, "--json", "-",
                         "--no-progress"]) == cli.EXIT_OK
        out = capsys.readouterr().out
        report = json.loads(out)
        assert report["tokens"] == len(ids) - 1 and report["mean_nats"] == pytest.approx(plain32, rel=1e-6)
        first_token_bytes = len(tok.decode(ids[:1]).encode())
        assert report["bits_per_byte"] == pytest.approx(report["mean_nats"] * report["tokens"] / np.log(2) /
                                                        (len(corpus.read_bytes()) - first_token_bytes))


def test_eval_counts_the_files_own_bytes_with_or_without_max_tokens(bpe_run, tmp_path, capsys):
    """With --max-tokens the bytes were counted by decoding the ids: an invalid byte counted as U+FFFD's three,
    a special token written in the text as none, so bits per byte changed though every token was scored."""
    text = tmp_path / "mixed.txt"
    text.write_bytes(b"line 1: caf\xe9 and \xff\xfe <|endoftext|> then \xe2\x9c\x93 done\n" * 20)
    reports = []
    for extra in ([], ["--max-tokens", "100000"]):
        assert cli.main(["eval", "--model", str(bpe_run), "--data", str(text), "--json", "-", "--no-progress",
                         *extra]) == cli.EXIT_OK
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0]["bytes"] == reports[1]["bytes"] == len(text.read_bytes()) - len(b"line")  # "line": token 0
    assert reports[0]["bits_per_byte"] == reports[1]["bits_per_byte"]
    tok = load_model(bpe_run)[1]
    ids, ends = tok.encode_bytes_with_ends(text.read_bytes())
    assert cli.main(["eval", "--model", str(bpe_run), "--data", str(text), "--json", "-", "--no-progress",
                     "--max-tokens", "30"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["bytes"] == ends[30] - ends[0]
    assert len(b"".join(tok.token_text(i).encode() for i in ids[:1])) == ends[0] == 4


def test_eval_defaults_to_the_runs_validation_split(bpe_run, capsys):
    assert cli.main(["eval", "--model", str(bpe_run), "--no-progress"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "validation split" in out and "training reported" in out


def test_eval_of_the_runs_split_with_another_tokenizer_names_the_tokenizer_not_the_data(bpe_run, capsys):
    """--tokenizer bytes on a BPE run: eval said the run's data had changed since (files added, removed or edited),
    though it had not (found by a fuzz of the command line)."""
    with pytest.warns(UserWarning, match="--tokenizer 'bytes' .* replaces the tokenizer of the model"):
        assert cli.main(["eval", "--model", str(bpe_run), "--tokenizer", "bytes", "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--tokenizer bytes is not the tokenizer this run trained with" in err and "has changed" not in err, err


def test_fine_tuning_keeps_the_models_end_of_text_token(bpe_tokenizer, corpus, tmp_path, capsys):
    """A transformers folder states its EOS in config.json (or tokenizer_config.json): the checkpoints copied
    only tokenizer.json, so generate from the fine-tuned run stopped at another token or none."""
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=320, d_state=16, headdim=16, chunk_size=16)
    folder = write_checkpoint("transformers", tmp_path / "hf", Mamba2LMHeadModel(config, VarMap(seed=3)),
                              tokenizer_json=bpe_tokenizer)
    hf_config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf_config, "eos_token_id": 7}))
    assert load_model(folder)[1].eos_token_id == 7  # not <|endoftext|>'s 0: the config says 7
    settings = {k: v for k, v in SETTINGS.items() if k not in ("d_model", "n_layer", "d_state", "headdim")}
    run = tmp_path / "run"
    assert train(TrainConfig(**settings, data=str(corpus), out=str(run), init_from=str(folder)), progress=False,
                 say=quiet).status == "done"
    assert load_model(run)[1].eos_token_id == 7
    assert train(resume=str(run), overrides={"steps": 3}, progress=False, say=quiet).status == "done"
    assert load_model(run)[1].eos_token_id == 7



def test_init_from_refuses_a_tokenizer_larger_than_the_models_vocabulary(bpe_tokenizer, corpus, tmp_path):
    """--init-from a model of 256 ids with --tokenizer of 320 tokens: ids 256 and up would have no embedding row.
    Refused before any work, naming both sizes, and no run folder is made."""
    folder = tmp_path / "byte_model"
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=256, d_state=16, headdim=16, chunk_size=16)
    Mamba2LMHeadModel(config, VarMap(seed=3)).save_pretrained(folder)
    settings = {k: v for k, v in SETTINGS.items() if k not in ("d_model", "n_layer", "d_state", "headdim")}
    cfg = TrainConfig(**settings, data=str(corpus), out=str(tmp_path / "run"), init_from=str(folder),
                      tokenizer=str(bpe_tokenizer))
    with pytest.raises(TokenizerError, match="has 320 tokens but the model in .* has a vocabulary of 256"):
        train(cfg, overrides={"tokenizer": str(bpe_tokenizer)}, progress=False, say=quiet)
    assert not (tmp_path / "run").exists()

def _first_batch_loss(model, cfg, corpus_path, tok) -> float:
    corpus = tokenize(load_corpus(str(corpus_path), seed=cfg.data_seed, val_fraction=cfg.val_fraction), tok)
    x, y = BatchSampler(corpus.train, cfg.batch_size, cfg.seq_len, seed=cfg.seed).next_batch()
    return float(model.loss(x, y).data)


def test_fine_tuning_starts_from_the_checkpoint_and_resumes_like_any_run(bpe_run, corpus, tmp_path):
    start = bpe_run / "checkpoints" / "step-000002"
    before = Mamba2LMHeadModel.from_pretrained(start, dtype="float64")
    settings = {k: v for k, v in SETTINGS.items() if k not in ("d_model", "n_layer", "d_state", "headdim")}
    seen = []

    def first_weights(info):
        if info.step == 1:
            seen.append(info.loss)

    whole = train(TrainConfig(**settings, data=str(corpus), out=str(tmp_path / "whole"), init_from=str(bpe_run)),
                  progress=False, say=quiet, callback=first_weights)
    cfg = TrainConfig(**settings, data=str(corpus))
    tok = FileTokenizer(start / "tokenizer.json")
    assert seen[0] == _first_batch_loss(before, cfg, corpus, tok)  # step 1's loss: the checkpoint's own weights
    state = json.loads((whole.checkpoint / "trainer_state.json").read_text())
    assert state["train_config"]["init_from"] == str(start)
    assert {k: state["train_config"][k] for k in ("d_model", "n_layer", "d_state", "headdim")} == \
        {k: TINY[k] for k in ("d_model", "n_layer", "d_state", "headdim")}
    assert (whole.checkpoint / "tokenizer.json").is_file()

    split = tmp_path / "split"
    train(TrainConfig(**settings, data=str(corpus), out=str(split), init_from=str(bpe_run)), stop_at=1,
          progress=False, say=quiet)
    resumed = train(resume=str(split), progress=False, say=quiet)
    a = Mamba2LMHeadModel.from_pretrained(whole.checkpoint, dtype="float64").varmap.state_dict()
    b = Mamba2LMHeadModel.from_pretrained(resumed.checkpoint, dtype="float64").varmap.state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_init_from_refuses_model_flags_and_a_tokenizer_that_does_not_fit(bpe_run, corpus, tmp_path, capsys):
    base = ["train", "--init-from", str(bpe_run), "--data", str(corpus), "--out", str(tmp_path / "x"), "--steps", "1"]
    for flag in ("--d-model", "--n-layer", "--d-state", "--headdim"):             # each is the checkpoint's
        assert cli.main([*base, flag, "8"]) == cli.EXIT_USAGE
        assert f"takes the model's shape from the checkpoint; leave out {flag}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.warns(UserWarning, match=r"--tokenizer 'bytes' \(256 tokens\) replaces .* \(320 tokens\)"):
        assert cli.main(["generate", "--model", str(bpe_run), "--tokenizer", "bytes"]) == cli.EXIT_OK  # 256 <= 320
    capsys.readouterr()
    quantized = Mamba2LMHeadModel.from_pretrained(bpe_run)
    quantized.quantize("int8")
    quantized.save_pretrained(tmp_path / "q8")  # it crashed with a traceback, after a false warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main([*base[:2], str(tmp_path / "q8"), *base[3:], "--tokenizer", "bytes"]) == cli.EXIT_USAGE
    assert "holds quantized weights (int8), for inference only; fine-tune from the float checkpoint" in \
        capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_init_from_with_another_tokenizer_warns_naming_both(bpe_run, corpus, tmp_path, capsys):
    """--init-from's --tokenizer went unchecked against the folder's own: a 320-row BPE model fine-tuned on bytes
    started with no word. It runs (the override is the user's call), warning once, naming both tokenizers."""
    out = tmp_path / "bytes-run"
    with pytest.warns(UserWarning, match=r"--tokenizer 'bytes' \(256 tokens\) replaces the tokenizer of the model in "
                                         r".*\(320 tokens\)") as caught:
        assert cli.main(["train", "--init-from", str(bpe_run), "--data", str(corpus), "--out", str(out), "--steps",
                         "1", "--tokenizer", "bytes", "--no-progress"]) == cli.EXIT_OK
    assert sum("replaces the tokenizer" in str(w.message) for w in caught) == 1
    assert load_model(out)[1].name == "bytes"                          # the run trained, and on bytes


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(stopped_run, bpe_tokenizer, capsys):
    assert cli.main(["generate", "--model", str(stopped_run), "--tokenizer", str(bpe_tokenizer)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "has 320 tokens" in err and "vocabulary of 256" in err


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generate_and_eval_read_every_layout_with_its_tokenizer(layout, bpe_tokenizer, corpus, tmp_path, capsys):
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=320, d_state=16, headdim=16, chunk_size=16,
                          pad_vocab_size_multiple=16)
    model = Mamba2LMHeadModel(config, VarMap(seed=3))
    folder = write_checkpoint(layout, tmp_path / layout, model, tokenizer_json=bpe_tokenizer)
    tok = FileTokenizer(bpe_tokenizer)
    ids = tok.encode("line 7: the")
    expected = model.generate(ids[None], 10, temperature=0)[0, len(ids):]
    cut = list(expected).index(0) if 0 in expected else len(expected)
    assert cli.main(["generate", "--model", str(folder), "--prompt", "line 7: the", "--max-new-tokens", "10",
                     "--temperature", "0"]) == cli.EXIT_OK
    assert capsys.readouterr().out == escape_controls("line 7: the" + tok.decode(expected[:cut])) + "\n"
    assert cli.main(["eval", "--model", str(folder), "--data", str(corpus), "--max-tokens", "200", "--json", "-",
                     "--no-progress"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    text_ids = tok.encode_bytes(corpus.read_bytes())[:201]
    plain = float(model.loss(text_ids[None, :-1], text_ids[None, 1:]).data)
    assert json.loads(out)["mean_nats"] == pytest.approx(plain, rel=1e-6)


def test_a_padded_vocabularys_rows_are_never_sampled_and_the_cache_repository_folder_is_read(bpe_tokenizer, tmp_path,
                                                                                             capsys):
    """A transformers config states its vocabulary padded (here 336 rows for the tokenizer's 320): generate
    samples only ids the tokenizer has, even where a padding row's logit is the largest. And --model may name a
    Hugging Face cache's repository folder (models--org--name), read at the snapshot its refs/main names."""
    config = Mamba2Config(d_model=32, n_layer=1, vocab_size=336, d_state=16, headdim=16, chunk_size=16,
                          pad_vocab_size_multiple=16, tie_embeddings=False)
    model = Mamba2LMHeadModel(config, VarMap(seed=4))
    model.lm_head.weight.data[320:] = 50 * model.lm_head.weight.data[:16]  # padding rows: the likeliest logits
    snapshot = write_checkpoint("hf_cache", tmp_path / "cache", model, tokenizer_json=bpe_tokenizer)
    tok = FileTokenizer(bpe_tokenizer)
    ids = tok.encode("line 7: the")
    assert model.generate(ids[None], 10, temperature=0)[0, len(ids):].max() >= 320   # without the limit
    expected = model.generate(ids[None], 10, temperature=0, vocab_size=320)[0, len(ids):]
    cut = list(expected).index(0) if 0 in expected else len(expected)
    for folder in (snapshot, snapshot.parents[1]):                    # the snapshot, the repository folder
        assert cli.main(["generate", "--model", str(folder), "--prompt", "line 7: the", "--max-new-tokens", "10",
                         "--temperature", "0"]) == cli.EXIT_OK
        assert capsys.readouterr().out == escape_controls("line 7: the" + tok.decode(expected[:cut])) + "\n"


class _Stub:
    """A model whose generate_stream yields given ids, as Mamba2LMHeadModel's does (b = 1)."""

    def __init__(self, ids):
        self.ids = ids

    def generate_stream(self, prompt, max_new_tokens, vocab_size=None, **sampling):
        return (np.array([i]) for i in self.ids[:max_new_tokens])


def test_ignore_eos_writes_each_eos_as_its_token_between_documents(bpe_tokenizer):
    tok = FileTokenizer(bpe_tokenizer)
    first, second = list(tok.encode("ab cd")), list(tok.encode("ef"))
    stub = _Stub([*first, 0, *second])
    assert "".join(stream_text(stub, "x", 20, tok)) == "ab cd"                       # stops at the EOS
    assert "".join(stream_text(stub, "x", 20, tok, stop_at_eos=False)) == "ab cd<|endoftext|>ef"


def test_ignore_eos_ends_each_document_whole_and_starts_the_next_afresh(corpus, tmp_path):
    """A Llama-style tokenizer: the byte run held back before an EOS ("é", not in the vocabulary) is written before
    it, and the text after it decodes as a new document (its first word without the space a context would give)."""
    tok = FileTokenizer(train_byte_fallback(corpus_texts(corpus), tmp_path / "llama") / "tokenizer.json")

    def plain(text):                                                       # as a model generates them: no BOS
        return list(tok._tok.encode(text, add_special_tokens=False).ids)

    first, second = plain("the fox é"), plain("lazy dog")
    assert tok.decode(second) == "lazy dog" and tok.decode([*first, *second]).endswith("é lazy dog")
    stub = _Stub([*first, tok.eos_token_id, *second])
    # after the prompt "x" the first word has its space; after the EOS the next document's first word has none
    assert "".join(stream_text(stub, "x", 40, tok, stop_at_eos=False)) == " the fox é</s>lazy dog"


def test_batch_file_gives_each_prompt_its_own_text(bpe_run, tmp_path, capsys):
    prompts = ["line 3", "line 250: the quick brown", 'a "quoted"\nprompt']
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in prompts) + "\n")
    alone = []
    for prompt in prompts:
        assert cli.main(["generate", "--model", str(bpe_run), "--prompt", prompt, "--max-new-tokens", "9",
                         "--temperature", "0"]) == cli.EXIT_OK
        alone.append(capsys.readouterr().out)
    assert cli.main(["generate", "--model", str(bpe_run), "--batch-file", str(tmp_path / "prompts.jsonl"),
                     "--max-new-tokens", "9", "--temperature", "0"]) == cli.EXIT_OK
    assert capsys.readouterr().out == "".join(f"=== {i}/3, line {i} ===\n{text}" for i, text in enumerate(alone, 1))
    (tmp_path / "prompts.txt").write_text("\n".join(["", *prompts[:2], "  ", ""]))   # blank lines: skipped
    assert cli.main(["generate", "--model", str(bpe_run), "--batch-file", str(tmp_path / "prompts.txt"),
                     "--max-new-tokens", "9", "--temperature", "0"]) == cli.EXIT_OK
    assert capsys.readouterr().out == f"=== 1/2, line 2 ===\n{alone[0]}=== 2/2, line 3 ===\n{alone[1]}"
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n[1, 2]\n')
    assert cli.main(["generate", "--model", str(bpe_run), "--batch-file", str(tmp_path / "bad.jsonl")]) == \
        cli.EXIT_USAGE
    assert "line 2 is a JSON array, not an object {\"prompt\": \"...\"}" in capsys.readouterr().err


def test_batch_file_decodes_batch_size_prompts_at_a_time_and_prints_each_batch_as_it_ends(bpe_run, tmp_path,
                                                                                            monkeypatch):
    """2,000 prompts decoded as one batch held 2,000 states at once (~38 GB at the 130M shape) and printed nothing
    until the end: --batch-size N decodes N at a time. Greedy text does not depend on N; sampled text of a file of
    up to N prompts is the one batch's, and a later batch draws its own numbers (the same prompt at the same place
    in two batches is not sampled alike)."""
    import io
    import sys

    from tinygrad_ssm.train import generate as gen
    prompts = ["one", "two", "three", "four", "five"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    real, sizes = gen.generate_batch, []

    def spy(model, batch, *args, **kwargs):
        sizes.append((len(batch), sys.stdout.getvalue().count("=== ")))  # (its prompts, results printed before)
        return real(model, batch, *args, **kwargs)

    def run(*flags):
        monkeypatch.setattr(sys, "stdout", io.StringIO())
        assert cli.main(["generate", "--model", str(bpe_run), "--batch-file", str(tmp_path / "p.txt"),
                         "--max-new-tokens", "6", *flags]) == cli.EXIT_OK
        return sys.stdout.getvalue()

    monkeypatch.setattr(gen, "generate_batch", spy)
    greedy = run("--temperature", "0")
    assert sizes == [(5, 0)]
    sizes.clear()
    assert run("--temperature", "0", "--batch-size", "2") == greedy
    assert sizes == [(2, 0), (2, 2), (1, 4)]                  # each batch's results printed before the next runs
    sampled = run("--temperature", "1", "--seed", "3")
    assert run("--temperature", "1", "--seed", "3", "--batch-size", "5") == sampled
    (tmp_path / "p.txt").write_text("same\n" * 4)
    texts = run("--temperature", "1", "--seed", "3", "--batch-size", "2").split("=== ")[1:]
    assert texts[0].split("\n", 1)[1] != texts[2].split("\n", 1)[1]   # rows 0 and 2: other draws


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--prompt", "x", "--batch-size", "4"], "--batch-size counts the prompts of --batch-file"),
])
def test_batch_size_is_checked(bpe_run, tmp_path, capsys, flags, message):
    (tmp_path / "p.txt").write_text("a\n")
    batch = [] if "--prompt" in flags else ["--batch-file", str(tmp_path / "p.txt")]
    assert cli.main(["generate", "--model", str(bpe_run), *batch, *flags]) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_eval_at_training_windows_gives_what_training_reported(bpe_run, capsys, dtype):
    """--training-windows scores the run's split at training's own windows (here 2 of 32 BPE tokens, from zero
    states), through training's tokens per byte: the bits per byte its trainer_state.json holds, to the bit when
    loaded in the run's float64 (the same computation), to float32's rounding when loaded in float32."""
    checkpoint = bpe_run / "checkpoints" / "step-000002"
    reported = json.loads((checkpoint / "trainer_state.json").read_text())["val_bpb"]
    assert cli.main(["eval", "--model", str(bpe_run), "--training-windows", "--json", "-", "--dtype", dtype]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["training_windows"] and report["windows"] == 2 and report["tokens"] == 2 * SETTINGS["seq_len"]
    if dtype == "float64":
        assert report["bits_per_byte"] == reported
    else:
        assert report["bits_per_byte"] == pytest.approx(reported, rel=1e-5) and report["bits_per_byte"] != reported
    assert f"training reported {reported:.4f} bits per byte for this checkpoint, on these windows" in out.err
    for window in ("64", "512"):    # 512 is eval's own default: given, it is still not training's window
        assert cli.main(["eval", "--model", str(bpe_run), "--training-windows", "--window", window]) == cli.EXIT_USAGE
        assert "leave out --window" in capsys.readouterr().err


def test_training_windows_load_the_run_in_its_own_dtype_unless_told(bpe_run, capsys):
    """Left out, --dtype is the run's (float64 here) with --training-windows, so the figure is training's to the
    bit as the line under it says (it was float32's, 1e-7 off); a plain eval stays float32."""
    reported = json.loads((bpe_run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["val_bpb"]
    assert cli.main(["eval", "--model", str(bpe_run), "--training-windows", "--json", "-", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "float64" and report["bits_per_byte"] == reported
    assert cli.main(["eval", "--model", str(bpe_run), "--json", "-", "--no-progress", "--max-tokens", "8"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["dtype"] == "float32" and plain["training_windows"] is False
    assert list(plain) == list(report)                                  # one set of keys, in one order, either way
