"""Special tokens as transformers adds them: FileTokenizer.encode is transformers' tokenizer(text)["input_ids"] for
a Llama-style tokenizer.json (TemplateProcessing "<s> $A": a BOS first), one that appends </s>, one without a
post_processor, and GPT-NeoX's (ByteLevel post_processor: nothing added, nothing changed). Prompts, eval and
a checkpoint's copy of the tokenizer follow; a special token covers none of eval's bytes."""
import json
import zlib

import numpy as np
import pytest

from tests.support.tokenizers import train_bpe, train_byte_fallback
from tinygrad_ssm.tokenizer import FileTokenizer
from tinygrad_ssm.train.generate import prompt_ids
from tinygrad_ssm.train.starting_point import tokenizer_files

TRAINING_TEXTS = ["héllo wörld ça va? naïve café 日本語 the state space model decodes one token at a time " * 20,
                  "def main():\n    return [x * 2 for x in range(10)]  # a comment, with punctuation!\n" * 20]
PROMPTS = ["", "The state space model", "héllo 😀 wörld", " two  spaces\nand a line", "<s> written </s>"]
LLAMA = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# (post_processor, tokenizer_config.json): transformers 5.24 keeps tokenizer.json's post_processor whatever
# add_bos_token / add_eos_token say (from_pretrained drops them when there is a tokenizer.json)
CASES = {"bos": ("bos", {**LLAMA, "add_bos_token": True}),
         "bos_flag_false": ("bos", {**LLAMA, "add_bos_token": False}),
         "eos": ("eos", {**LLAMA, "add_eos_token": True}),
         "none_flag_true": ("none", {**LLAMA, "add_bos_token": True}),
         "none": ("none", LLAMA)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {name: train_byte_fallback(TRAINING_TEXTS, tmp_path_factory.mktemp(name), template=template, config=config)
           for name, (template, config) in CASES.items()}
    neox = tmp_path_factory.mktemp("neox")
    train_bpe(TRAINING_TEXTS, neox / "tokenizer.json", byte_level_post_processor=True)
    (neox / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                            "bos_token": "<|endoftext|>"}))
    out["neox"] = neox
    return out


def auto_tokenizer(folder):
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("case", [*CASES, "neox"])
def test_encode_adds_the_special_tokens_transformers_adds(folders, case):
    ours, theirs = FileTokenizer(folders[case] / "tokenizer.json"), auto_tokenizer(folders[case])
    for text in PROMPTS:
        assert ours.encode(text).tolist() == theirs(text)["input_ids"], text
    added = len(ours.encode("x")) - len(ours._tok.encode("x", add_special_tokens=False).ids)
    assert ours.adds_special_tokens == (added > 0) == (case in ("bos", "bos_flag_false", "eos"))


def test_a_llama_prompt_starts_with_bos_and_an_empty_one_is_bos_alone(folders):
    tok = FileTokenizer(folders["bos"] / "tokenizer.json")
    ids = prompt_ids("The state space model", tok)
    assert ids[0] == 1 and ids[1:].tolist() == tok._tok.encode("The state space model", add_special_tokens=False).ids
    assert prompt_ids("", tok).tolist() == [1]
    assert prompt_ids("", FileTokenizer(folders["none"] / "tokenizer.json")).tolist() == [2]   # its EOS, as before


def test_gpt_neox_adds_nothing_and_keeps_its_fingerprint(folders):
    path = folders["neox"] / "tokenizer.json"
    tok = FileTokenizer(path)
    for text in PROMPTS:
        assert tok.encode(text).tolist() == tok._tok.encode(text, add_special_tokens=False).ids
    assert prompt_ids("", tok).tolist() == [tok.eos_token_id]
    # the fingerprint a run saved before special tokens were added: such runs still resume
    assert tok.fingerprint() == f"crc32:{zlib.crc32(path.read_text(encoding='utf-8').encode('utf-8')):08x}"
    bos = FileTokenizer(folders["bos"] / "tokenizer.json")
    assert bos.fingerprint().endswith("+special-tokens")       # its data now starts with <s>: not the old run's


@pytest.mark.parametrize("case", ["bos", "eos", "none", "neox"])
def test_added_special_tokens_cover_no_bytes(folders, case):
    tok = FileTokenizer(folders[case] / "tokenizer.json")
    data = "héllo 😀 wörld\ncafé".encode() + b"\xff tail"
    ids, ends = tok.encode_bytes_with_ends(data)
    assert len(ids) == len(ends) and ends[-1] == len(data)
    assert (np.diff(ends) >= 0).all() and ends[0] >= 0
    special = [i for i, t in enumerate(ids) if int(t) in (1, 2) and case != "neox"]
    if case == "bos":
        assert special == [0] and ends[0] == 0                  # eval scores every byte after the BOS
    if case == "eos":
        assert special == [len(ids) - 1] and ends[-1] == ends[-2]


@pytest.mark.parametrize("case", ["bos_flag_false", "eos", "neox"])
def test_a_checkpoints_copy_of_the_tokenizer_adds_the_same_special_tokens(folders, case, tmp_path):
    source = FileTokenizer(folders[case] / "tokenizer.json")
    for name, text in tokenizer_files(source).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    copy = FileTokenizer(tmp_path / "tokenizer.json")
    assert copy.special_config == source.special_config and copy.fingerprint() == source.fingerprint()
    theirs = auto_tokenizer(folders[case])
    for text in PROMPTS:
        want = theirs(text)["input_ids"]
        assert copy.encode(text).tolist() == want == auto_tokenizer(tmp_path)(text)["input_ids"]


def test_logits_and_eval_follow_transformers_with_a_bos(folders, tmp_path):
    """The next-token logits after a prompt and eval's scores are transformers' (which start from <s>)."""
    torch = pytest.importorskip("torch", reason="torch is an optional reference")
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    from tests.support.checkpoints import write_transformers_dir
    from tinygrad_ssm.models.mamba2 import Mamba2Config, Mamba2LMHeadModel
    from tinygrad_ssm.models.mamba2.evaluation import evaluate
    from tinygrad_ssm.registry import VarMap

    tok = FileTokenizer(folders["bos"] / "tokenizer.json")
    config = Mamba2Config(d_model=32, n_layer=2, vocab_size=tok.vocab_size, d_state=8, headdim=8, chunk_size=8,
                          pad_vocab_size_multiple=8)
    model = Mamba2LMHeadModel(config, varmap=VarMap(seed=3), dtype="float32")
    write_transformers_dir(tmp_path, model)
    theirs = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path)).eval()
    hf_tok = auto_tokenizer(folders["bos"])
    text = "héllo wörld, the state space model"
    hf_ids = hf_tok(text)["input_ids"]
    assert prompt_ids(text, tok).tolist() == hf_ids
    with torch.no_grad():
        out = theirs(torch.tensor([hf_ids]), labels=torch.tensor([hf_ids]))
    ours = model(prompt_ids(text, tok)[None]).data[0, -1, :tok.vocab_size]
    np.testing.assert_allclose(ours, out.logits[0, -1, :tok.vocab_size].numpy(), atol=2e-4, rtol=2e-4)
    result = evaluate(model, tok.encode_bytes_with_ends(text.encode())[0])
    assert result.tokens == len(hf_ids) - 1                      # the first text token, predicted from <s>, too
    assert result.mean_nats == pytest.approx(out.loss.item(), rel=1e-4)


def test_resuming_a_run_whose_tokenizer_now_adds_a_bos_says_so(folders, tmp_path):
    """A run begun when encode added no special tokens saved the plain fingerprint: its data now starts with <s>,
    so --resume is refused, naming the tokenizer (not a changed corpus) and what to do."""
    from tinygrad_ssm.train.config import TrainConfig
    from tinygrad_ssm.train.loop import _load_data

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TRAINING_TEXTS[0] * 3 + TRAINING_TEXTS[1] * 3, encoding="utf-8")
    tok = FileTokenizer(folders["bos"] / "tokenizer.json")
    cfg = TrainConfig(data=str(corpus), seq_len=8, batch_size=2, val_fraction=0.3)
    _, fingerprint = _load_data(cfg, None, tok)
    old = {**fingerprint, "tokenizer": fingerprint["tokenizer"].removesuffix("+special-tokens")}
    with pytest.raises(ValueError, match=r"--resume: the tokenizer .* now tokenizes the data otherwise .* "
                                         r"start a new run, or fine-tune the checkpoint with --init-from"):
        _load_data(cfg, {"data_fingerprint": old}, tok)
    assert _load_data(cfg, {"data_fingerprint": fingerprint}, tok)[1] == fingerprint


@pytest.mark.parametrize("key", ["pad_token", "unk_token", "sep_token", "cls_token", "mask_token", "eos_token",
                                 "extra_special_tokens"])
def test_tokens_the_config_names_are_special_as_transformers_makes_them(tmp_path, key):
    """A token tokenizer_config.json names (pad_token, ..., extra_special_tokens) that tokenizer.json holds in its
    vocabulary only was split into pieces where transformers reads it as one special id, and decode showed it where
    transformers skips it (found by an audit); a named token the vocabulary lacks gets no new id."""
    train_bpe(TRAINING_TEXTS, tmp_path / "tokenizer.json", byte_level_post_processor=True)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    token = next(t for t in sorted(vocab, key=lambda t: (-len(t), t)) if t.isalpha() and t.isascii())   # e.g. "state"
    named = [token, "<never-seen>"] if key == "extra_special_tokens" else token
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                key: named}))
    tok = FileTokenizer(tmp_path / "tokenizer.json")
    text = f"x{token}y"
    ids = tok.encode(text).tolist()
    assert ids == tok.encode("x").tolist() + [vocab[token]] + tok.encode("y").tolist(), ids
    assert tok.decode(ids) == "xy" and tok.vocab_size == max(vocab.values()) + 1
    transformers = pytest.importorskip("transformers", reason="transformers is an optional reference")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    if key != "extra_special_tokens":                # there transformers gives "<never-seen>" a new id
        assert theirs(text)["input_ids"] == ids and theirs.decode(ids, skip_special_tokens=True) == "xy"
