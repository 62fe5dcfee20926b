"""The files of a tokenizer's folder beside its tokenizer.json, as transformers 5 reads them: tokenizer_config.json
and special_tokens_map.json (the special tokens that change how a text is tokenized here, and the settings a
checkpoint's copy keeps for transformers), and what to say of a file or a folder that is no tokenizer.json."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from .io.file_checks import GIT_LFS_FIX, is_git_lfs_pointer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# the keys that change encoding here; split_special_tokens: transformers reads a special token written in a text
# as text
SPECIAL_CONFIG_KEYS = ("bos_token", "eos_token", "add_bos_token", "add_eos_token", "split_special_tokens")
BOS_EOS_KEYS = ("bos_token", "eos_token")           # read from special_tokens_map.json too; a null kept
# tokenizer_config.json's keys not kept in a checkpoint's copy (the rest is, for transformers: pad_token,
# model_max_length, padding_side, chat_template, ...): those transformers' save_pretrained drops (paths of the
# machine it came from), and auto_map (code the copy does not carry)
DROPPED_CONFIG_KEYS = ("name_or_path", "special_tokens_map_file", "tokenizer_file", "device_map",
                       "slow_tokenizer_class", "auto_map")
# what a folder may hold instead of a tokenizer.json: the files of transformers' slow tokenizers
OTHER_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.model", "spiece.model", "vocab.txt")


def configs_beside(folder: Path) -> tuple[dict, dict]:
    """(special, other) of the tokenizer_config.json in `folder`, with special_tokens_map.json's tokens over the
    config's where the config has no added_tokens_decoder, as transformers 5 reads the two (with one it reads the
    config alone). special: SPECIAL_CONFIG_KEYS as stated (an eos_token of null too: no EOS; of the map, bos_token
    and eos_token); other: the rest, which encode and decode here do not use but a checkpoint's copy (and its
    export) keeps: pad_token, unk_token, model_max_length, padding_side, ... (not DROPPED_CONFIG_KEYS)."""
    config = read_json_object(folder / TOKENIZER_CONFIG_FILE)
    if "added_tokens_decoder" not in config:
        config = {**config, **{k: v for k, v in read_json_object(folder / SPECIAL_TOKENS_MAP_FILE).items()
                               if k not in SPECIAL_CONFIG_KEYS or k in BOS_EOS_KEYS}}
    special = {k: config[k] for k in SPECIAL_CONFIG_KEYS
               if k in config and (config[k] is not None or k in BOS_EOS_KEYS)}
    other = {k: v for k, v in config.items() if k not in (*SPECIAL_CONFIG_KEYS, *DROPPED_CONFIG_KEYS)}
    return special, other


# the tokens of tokenizer_config.json that transformers 5 makes special added tokens (one id wherever a text holds
# them, skipped by decode), whatever tokenizer.json says of them (measured with 5.24: a vocabulary token added with
# normalized false, an added one's flag set); its additional_special_tokens it leaves as they are
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_SPECIAL_KEY = "extra_special_tokens"   # transformers 5's: a list, or a dict of names


def with_config_specials(spec: dict, vocab: dict, special_config: dict, other_config: dict) -> bool:
    """Mark special in `spec` (a tokenizer.json, parsed; changed in place) the tokens the config names
    (SPECIAL_TOKEN_KEYS, extra_special_tokens) that `vocab` (token -> id, added tokens too) holds but not as
    special, as transformers does: `a</s>b` was [a, <, /, s, >, b] here and [a, </s>, b] there, and decode showed
    "</s>" where transformers skips it. A named token the vocabulary lacks is left out (transformers would give it
    an id the checkpoint has no row for). Returns whether anything changed."""
    config = {**other_config, **special_config}
    extra = config.get(EXTRA_SPECIAL_KEY)
    named = [config.get(k) for k in SPECIAL_TOKEN_KEYS] + \
        (list(extra.values()) if isinstance(extra, dict) else list(extra) if isinstance(extra, list) else [])
    added = {t.get("content"): t for t in spec.get("added_tokens") or [] if isinstance(t, dict)}
    changed = False
    for token in named:
        content = token.get("content") if isinstance(token, dict) else token
        if not isinstance(content, str) or not content or content not in vocab:
            continue
        if content not in added:
            added[content] = {"id": vocab[content], "content": content, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": False}
            spec.setdefault("added_tokens", []).append(added[content])
        changed |= added[content].get("special") is not True
        added[content]["special"] = True
    return changed


def read_json_object(path: Path) -> dict:
    """The JSON object in `path` ({} where there is none or it is no object)."""
    try:
        stated = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        stated = {}
    return stated if isinstance(stated, dict) else {}


def what_it_is(text: str, path: Path) -> str | None:
    """Why a text the tokenizers library cannot read is no tokenizer.json, where that can be told: a Git LFS pointer,
    or a JSON object of another file of a tokenizer's folder (vocab.json, tokenizer_config.json)."""
    if is_git_lfs_pointer(text.encode("utf-8", errors="replace")):
        return GIT_LFS_FIX
    if text.startswith("\ufeff"):   # the parser said only "expected value at line 1 column 1"
        return ("it starts with a UTF-8 byte order mark, which JSON does not allow (transformers refuses it too); "
                "save it as UTF-8 without one")
    try:
        stated = json.loads(text)
    except ValueError:
        return None
    if not isinstance(stated, dict) or isinstance(stated.get("model"), dict):  # a tokenizer.json, wrong inside
        return None
    if stated and all(isinstance(v, int) for v in stated.values()):             # (it may hold a token "model")
        kind = "a vocab.json (token -> id)"
    elif {"tokenizer_class", "added_tokens_decoder", "model_max_length"} & set(stated):
        kind = "a tokenizer_config.json"
    else:
        kind = "a JSON object"
    beside = path.parent / TOKENIZER_FILE
    return f"it is {kind}; " + (f"give {str(beside)!r}" if beside.is_file() and beside != path else
                                no_tokenizer_json(path.parent))


# what a folder may hold instead of a tokenizer.json: the files of transformers' slow tokenizers
OTHER_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.model", "spiece.model", "vocab.txt")


def no_tokenizer_json(folder: Path) -> str:
    """What to say of a folder that holds no tokenizer.json: the tokenizer files it holds instead, and the one
    command that writes a tokenizer.json from them (where transformers is installed)."""
    found = [name for name in OTHER_TOKENIZER_FILES if (folder / name).is_file()]
    if not found:
        return f"{str(folder)!r} holds no {TOKENIZER_FILE}"
    command = (f"python -c 'import sys; from transformers import AutoTokenizer; "
               f"AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[1])' {shlex.quote(str(folder))}")
    return (f"{str(folder)!r} holds no {TOKENIZER_FILE}, only {', '.join(found)} (a tokenizer in transformers' slow "
            f"format, which this package does not read); write its {TOKENIZER_FILE} once, where transformers is "
            f"installed, with: {command}")
