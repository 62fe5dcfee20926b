"""The command line's arguments: the subcommands' flags (`build_parser`), the exit statuses, and the checks of
generate's and eval's flags made before any work (train's own are train/checks.py's, made on its TrainConfig), so
that a typo costs no model load."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..io.safetensors import STORED_DTYPES
from ..models.mamba2.pretrained import LAYOUTS
from ..scan import available_backends
from .config import TrainConfig
from .data import DOCUMENT_ENDS
from .generate import DEFAULT_PROMPT_BATCH, not_utf8
from .generation_config import DEFAULT_NEW_TOKENS, DEFAULT_TEMPERATURE
from .eval_report import is_eval_report
from .output_errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_IO, EXIT_OK, EXIT_USAGE  # noqa: F401 (cli's)

EVAL_WINDOW = 512  # eval's --window when it is not given (None: so --training-windows can tell it was given)

_D = TrainConfig()  # the defaults, shown in --help
DTYPES = ("float32", "float64")  # generate's and eval's --dtype: the model's float arrays, as train's --dtype
DTYPE_HELP = (f"the model's dtype, whatever the folder stores: float32 or float64 (exact comparisons, e.g. with "
              f"score() on a float64 model) [{_D.dtype}]")

# (flag, TrainConfig field, type, help); every default is None so that we know what was given explicitly
_TRAIN_FLAGS = [
    ("--data", "data", str, "a text file or a folder of text files (read as bytes; hidden and binary files "
                            "skipped; a .jsonl file, or a .json file given as --data itself: JSON records (an "
                            "array, or one a line), each record's text a document) [default: the "
                            "running Python's standard library .py sources, without site-packages and test suites]"),
    ("--text-field", "text_field", str, f"the field of the records (.jsonl, .json) that holds the text "
                                        f"[{_D.text_field}]"),
    ("--val-data", "val_data", str, "validate on this text file or folder (as --data reads it) and train on all of "
                                    "--data, as transformers' run_clm takes --validation_file [a --val-fraction "
                                    "of --data]"),
    ("--data-seed", "data_seed", int, f"seed of the file order and train/validation split [{_D.data_seed}]"),
    ("--val-fraction", "val_fraction", float, f"fraction of the files (or records) kept for validation, "
                                              f"without --val-data [{_D.val_fraction}]"),
    ("--steps", "steps", int, f"total optimizer steps; also the length of the cosine schedule [{_D.steps}]"),
    ("--batch-size", "batch_size", int, f"sequences per step [{_D.batch_size}]"),
    ("--grad-accum", "grad_accum", int, f"run each step's batch as this many equal micro-batches, one after another, "
                                        f"their gradients summed: the same step (up to rounding) with the "
                                        f"activation memory of one micro-batch [{_D.grad_accum}]"),
    ("--seq-len", "seq_len", int, f"bytes per sequence (tokens when the run has a tokenizer) [{_D.seq_len}]"),
    ("--d-model", "d_model", int, f"model width [{_D.d_model}]"),
    ("--n-layer", "n_layer", int, f"number of Mamba-2 blocks [{_D.n_layer}]"),
    ("--d-state", "d_state", int, f"SSM state size per head [{_D.d_state}]"),
    ("--headdim", "headdim", int, f"channels per SSM head (2*d_model must be a multiple) [{_D.headdim}]"),
    ("--chunk-size", "chunk_size", int, f"SSD chunk length of the reference and cuda backends (the CPU's numba "
                                        f"scan runs chunks of at most 32 steps; results equal up to rounding) "
                                        f"[{_D.chunk_size}]"),
    ("--lr", "lr", float, f"peak learning rate of AdamW [{_D.lr}]"),
    ("--min-lr", "min_lr", float, "learning rate at the end of the cosine decay [--lr / 10]"),
    ("--warmup-steps", "warmup_steps", int, f"steps of linear warmup to --lr (step k of N: --lr * (k + 1) / N, "
                                            f"never 0) [{_D.warmup_steps}]"),
    ("--weight-decay", "weight_decay", float, f"AdamW decoupled weight decay, on the matrices (ndim >= 2) only "
                                                  f"[{_D.weight_decay}]"),
    ("--grad-clip", "grad_clip", float, f"clip the global gradient norm to this [{_D.grad_clip}]"),
    ("--dtype", "dtype", str, f"weights' dtype: float32 or float64 (exact comparisons) [{_D.dtype}]"),
    ("--seed", "seed", int, f"seed of the weight init and the batch sampler [{_D.seed}]"),
    ("--backend", "backend", str, f"SSD scan backend: auto (the fastest available) or one of "
                                  f"{', '.join(available_backends())} [{_D.backend}]"),
    ("--out", "out", str, "run folder for checkpoints, log.jsonl and loss.png [runs/mamba2-DATE-TIME]"),
    ("--eval-every", "eval_every", int, f"validate every this many steps [{_D.eval_every}]"),
    ("--eval-batches", "eval_batches", int, f"validation batches per evaluation [{_D.eval_batches}]"),
    ("--checkpoint-every", "checkpoint_every", int, f"write a checkpoint every this many steps (and at the end) "
                                                    f"[{_D.checkpoint_every}]"),
    ("--keep-checkpoints", "keep_checkpoints", int, f"how many recent checkpoints to keep, besides the one with the "
                                                    f"best validation [{_D.keep_checkpoints}]"),
    ("--sample-bytes", "sample_bytes", int, f"bytes generated for the sample at the end (tokens when the run "
                                             f"has a tokenizer; at most 1,000,000) [{_D.sample_bytes}]"),
    ("--sample-prompt", "sample_prompt", str, "text the sample at the end continues [the first line of the "
                                              "validation text, so it suits any --data]"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinygrad-ssm", allow_abbrev=False, description="Mamba-2 language models on a NumPy "
                                     "autograd engine: train, generate, eval, export.",
                                     epilog=f"exit status: {EXIT_OK} ok, {EXIT_DIVERGED} diverged, {EXIT_USAGE} bad "
                                     f"input, {EXIT_IO} a file could not be written, {EXIT_INTERRUPTED} Ctrl-C or "
                                     f"SIGTERM")
    sub = parser.add_subparsers(dest="command", metavar="{train,generate,eval,export}")
    sub.required = True

    tr = sub.add_parser("train", allow_abbrev=False, help="train a Mamba-2 model, byte-level unless a tokenizer is given, or fine-tune "
                                      "one (--init-from) (defaults: about three minutes on 2 cores)",
                        description="Train a Mamba-2 language model (on bytes, or on the ids of --tokenizer or of "
                                    f"--init-from's tokenizer) with AdamW (betas {_D.beta1}, {_D.beta2}; eps 1e-8), "
                                    "warmup + cosine decay and gradient clipping. Defaults are in brackets; with "
                                    "them a run takes about three minutes on 2 cores.")
    for flag, field, typ, text in _TRAIN_FLAGS:
        metavar = {"data": "PATH", "val_data": "PATH", "out": "DIR", "backend": "NAME", "sample_prompt": "TEXT",
                   "text_field": "NAME"}.get(field, "N" if typ is int else "X")
        tr.add_argument(flag, dest=field, type=typ, default=None, help=text, metavar=metavar)
    tr.add_argument("--init-from", dest="init_from", metavar="DIR", default=None,
                    help="fine-tune: start a new run (step 0, fresh AdamW moments and schedule, its own --out) from "
                         "the weights (and tokenizer) of a model folder (a run, a checkpoint, a save_pretrained / "
                         "mamba_ssm / transformers folder), which is only read; the model flags (and "
                         "--chunk-size, unless given) come from it. "
                         "To continue a run with its optimizer state, use --resume")
    tr.add_argument("--tokenizer", metavar="PATH", default=None,
                    help="tokenize --data with this tokenizer.json ('bytes': raw bytes) [bytes, or --init-from's own]")
    tr.add_argument("--document-end", choices=DOCUMENT_ENDS, default=None,
                    help="eos: tokenize each file of a --data folder (each record of a .jsonl or .json file) alone "
                         "and put "
                         "the tokenizer's EOS token after it, as Mamba's pretraining data marks where a document ends, "
                         "so that the model learns where a text ends (generate stops at the EOS); needs a tokenizer "
                         "[none: the files (records) joined into one text]")
    tr.add_argument("--resume", metavar="DIR", default=None,
                    help="continue the run in DIR (a run folder or one of its checkpoints) with its saved "
                         "settings; N steps + resumed steps give the same weights as one uninterrupted run "
                         "(--data / --val-data may name where the data was moved: its content is checked)")
    tr.add_argument("--stop-at", type=int, metavar="STEP", default=None,
                    help="stop after this step (1 to --steps) with a checkpoint (the schedule still spans "
                         "--steps), to split a run into sessions")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for log files)")
    tr.add_argument("--distributed", action="store_true",
                    help="train data-parallel over MPI (needs mpi4py: pip install \".[distributed]\"); on by "
                         "itself when started by mpiexec with more than one process")
    tr.add_argument("--no-overlap", action="store_true",
                    help="under MPI, allreduce the gradients after the backward instead of during it")

    ge = sub.add_parser("generate", allow_abbrev=False, help="generate text from a model folder, streamed as it is produced",
                        description="Generate text from a model folder: a training run, a checkpoint, a "
                                    "save_pretrained / mamba_ssm / transformers folder, a Hugging Face cache snapshot "
                                    "or a sharded checkpoint. Its tokenizer.json is used (bytes for the package's "
                                    "own byte-level runs); invalid UTF-8 is shown as U+FFFD, and control "
                                    "characters other than newline and tab as \\xNN escapes, so that a sample "
                                    "cannot drive the terminal.")
    ge.add_argument("--model", "--checkpoint", dest="model", required=True, metavar="DIR",
                    help="model folder (a run folder: its newest checkpoint)")
    ge.add_argument("--tokenizer", metavar="PATH", default=None,
                    help="a tokenizer.json (or a folder holding one), or 'bytes' [the model folder's own]")
    ge.add_argument("--prompt", default="", help="text to continue [none: the model starts a fresh line (bytes) "
                                                 "or a document (after the EOS token)]")
    ge.add_argument("--prompt-file", metavar="FILE", default=None,
                    help="the prompt is this file's text, whole (UTF-8, every newline kept; - for standard input): "
                         "for a prompt too long, or of too many lines, for the command line")
    ge.add_argument("--batch-file", metavar="FILE", default=None,
                    help="generate for every prompt in FILE at once (one prompt per line, blank lines skipped; a "
                         ".jsonl or .json file: records {\"prompt\": ...}, one a line or a JSON array, for "
                         "prompts with newlines); the results are "
                         "printed in order, each headed by its number and line. Sampled (temperature > 0), a "
                         "prompt's text depends on its place in its batch (row i draws the step's i-th random "
                         "number, as in transformers): the same --seed gives it another text than --prompt alone; "
                         "greedy decoding gives the same")
    ge.add_argument("--batch-size", type=int, default=None, metavar="N",
                    help=f"--batch-file's prompts decoded together, N at a time, each batch's results printed as it "
                         f"ends (memory grows with N: a sequence's state, ~20 MB at the 130M shape; a batch after "
                         f"the first samples with its own seed drawn from --seed) [{DEFAULT_PROMPT_BATCH}]")
    ge.add_argument("--json", metavar="FILE", default=None,
                    help="also write --batch-file's results as JSON Lines, one object a prompt (index, line, prompt, "
                         "text, new_tokens, finish: eos or length), each batch's as it ends, to a new file (- for "
                         "stdout, which then holds the JSON alone: the texts go to stderr)")
    ge.add_argument("--max-new-tokens", type=int, default=None,
                    help=f"tokens to generate [the model folder's generation_config.json max_new_tokens, or its "
                         f"max_length less the prompt's tokens; else {DEFAULT_NEW_TOKENS}]")
    ge.add_argument("--temperature", type=float, default=None,
                    help=f"divide the logits by this; 0 means greedy [{DEFAULT_TEMPERATURE}; with none of "
                         f"--temperature/--top-k/--top-p/--min-p/--repetition-penalty given, the model folder's "
                         f"generation_config.json's do_sample, temperature, top_k, top_p, min_p and "
                         f"repetition_penalty where it states them]")
    ge.add_argument("--top-k", type=int, default=None, help="sample only among the k likeliest tokens [off, or "
                                                            "as for --temperature]")
    ge.add_argument("--top-p", type=float, default=None, help="sample only within the smallest set of tokens with "
                                                              "probability >= p [off, or as for --temperature]")
    ge.add_argument("--min-p", type=float, default=None, help="sample only among the tokens at least p times as "
                                                              "likely as the likeliest [off, or as for --temperature]")
    ge.add_argument("--repetition-penalty", type=float, default=None,
                    help="make each token the text already holds (prompt included) less likely: its logit divided "
                         "by this when positive, multiplied when negative (transformers'; 1.2 is common) [off, or as "
                         "for --temperature]")
    ge.add_argument("--seed", type=int, default=0, help="sampling seed [%(default)s]")
    ge.add_argument("--ignore-eos", action="store_true", help="go on past the end-of-text tokens (the tokenizer's "
                                                              "and generation_config.json's or config.json's "
                                                              "eos_token_id, all of a list)")
    ge.add_argument("--backend", default="auto", help="SSD scan backend [%(default)s]")
    ge.add_argument("--weights", choices=("float32", "bfloat16", "int8"), default=None,
                    help="decode from 8- or 16-bit weights (quantized at load; a quantized folder loads as saved)")
    ge.add_argument("--dtype", choices=DTYPES, default=_D.dtype, help=DTYPE_HELP)

    ev = sub.add_parser("eval", allow_abbrev=False, help="perplexity and bits per byte of a model on a text file or folder",
                        description="Score a text with a model: perplexity, bits per token and bits per byte. "
                                    "Every token after the first is scored, as transformers' model(ids, labels=ids) "
                                    "scores it (with a tokenizer that puts a BOS such as <s> first, every token of "
                                    "the text); bits per byte are their total bits over the text's bytes after the "
                                    "first token (a file's own bytes: an invalid UTF-8 byte counts one). A folder's "
                                    "files are joined in sorted order as they are (hidden, empty and binary ones left "
                                    "out), with no separator and the state carried across them; --json's "
                                    "\"files\" then gives each "
                                    "file's own figures (the tokens that end in it, given all the text before "
                                    "them), which add up to the totals. The text is read in "
                                    "windows with the model's state carried from one to the next, so every token "
                                    "sees all of the text before it (a state space model needs no overlapping "
                                    "windows) and the numbers do not depend on --window.")
    ev.add_argument("--model", "--checkpoint", dest="model", required=True, metavar="DIR", help="model folder")
    ev.add_argument("--data", metavar="PATH", default=None,
                    help="a text file or a folder of text files (a .jsonl file, or a .json file given as --data "
                         "itself: JSON records, their texts in order) [for a run of this package: its validation "
                         "split]")
    ev.add_argument("--text-field", metavar="NAME", default=None,
                    help=f"as for train: the field of the records (.jsonl, .json) that holds the text "
                         f"[{_D.text_field}]")
    ev.add_argument("--tokenizer", metavar="PATH", default=None, help="as for generate [the model folder's own]")
    ev.add_argument("--window", type=int, default=None, help="tokens per forward pass (memory, not the result) "
                                                             f"[{EVAL_WINDOW}]")
    ev.add_argument("--reset-state", action="store_true",
                    help="start every window from a zero state (how training validates) instead of carrying it")
    ev.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens [all]")
    ev.add_argument("--document-end", choices=DOCUMENT_ENDS, default=None,
                    help="with --data: eos puts the tokenizer's EOS token after each file (each record of a .jsonl "
                         "or .json file), each tokenized alone, as "
                         "train --document-end eos reads its data [none: the files joined into one text; without "
                         "--data, the run's split as the run read it]")
    ev.add_argument("--training-windows", action="store_true",
                    help="a run's checkpoint only, without --data: score its validation split at the windows "
                         "training scores (--seq-len long, --batch-size x --eval-batches of them, each from a zero "
                         "state), which gives the bits per byte training reported for it")
    ev.add_argument("--json", metavar="FILE", default=None, help="also write the report as JSON, to a new file or "
                                                                 "over an earlier report of eval's (- for stdout, "
                                                                 "which then holds the JSON alone: the report "
                                                                 "goes to stderr)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--backend", default="auto", help="SSD scan backend [%(default)s]")
    ev.add_argument("--weights", choices=("float32", "bfloat16", "int8"), default=None,
                    help="decode from 8- or 16-bit weights (quantized at load; a quantized folder loads as saved)")
    # None: float32, or with --training-windows the run's own dtype (training's figure to the bit, not to float32's
    # rounding); cli._eval settles it
    ev.add_argument("--dtype", choices=DTYPES, default=None,
                    help=DTYPE_HELP.removesuffix(f"[{_D.dtype}]") + f"[{_D.dtype}; with --training-windows, the dtype "
                                                                   f"the run trained in]")

    ex = sub.add_parser("export", allow_abbrev=False, help="write a model folder (a run, a checkpoint, any model folder) as a new folder "
                                       "that transformers (or mamba_ssm's layout) loads",
                        description="Write a model folder as a new folder: with --layout transformers (the default) "
                                    "transformers.Mamba2ForCausalLM.from_pretrained(OUT) and "
                                    "AutoTokenizer.from_pretrained(OUT) load it; with --layout mamba_ssm it is the "
                                    "package's own save_pretrained folder. The weights are written in the dtype "
                                    "they are stored in, bit for bit (--dtype to change it); the tokenizer.json the "
                                    "model was trained with is copied (a byte-level "
                                    "model gets one that gives each byte its own id), and generation_config.json "
                                    "when the folder has one. --out must be new or an empty folder: nothing is "
                                    "replaced.")
    ex.add_argument("--model", "--checkpoint", dest="model", required=True, metavar="DIR",
                    help="model folder (a run folder: its newest checkpoint)")
    ex.add_argument("--out", required=True, metavar="NEW_DIR", help="the folder to write (new, or empty)")
    ex.add_argument("--layout", choices=LAYOUTS, default="transformers",
                    help="transformers: its Mamba2 config keys and weight names; mamba_ssm: this package's "
                         "save_pretrained folder [%(default)s]")
    ex.add_argument("--tokenizer", metavar="PATH", default=None,
                    help="as for generate: the tokenizer.json to write [the model folder's own]")
    ex.add_argument("--dtype", choices=STORED_DTYPES, default=None,
                    help="the dtype every weight is written in, rounded to nearest (as torch's .to(dtype)): bfloat16 "
                         "or float16 halve a float32 model's files [the dtype the weights are stored in; a folder "
                         "mixing dtypes: the widest of them, which holds every stored value]")
    return parser


# flag -> (its dest, what it names, what leaving it out means): an empty value (`--data "$DATA"` with DATA unset)
# is refused, not read as Path("") = the current folder (a training set or model folder of whatever is there)
_PATH_FLAGS = {
    "train": {"--data": ("data", "a text file or folder", "the standard library's sources"),
              "--val-data": ("val_data", "a text file or folder", "a --val-fraction of --data"),
              "--out": ("out", "a run folder", "a new folder runs/mamba2-DATE-TIME"),
              "--resume": ("resume", "a run folder or checkpoint", "a new run"),
              "--init-from": ("init_from", "a model folder", "a fresh model"),
              "--tokenizer": ("tokenizer", "a tokenizer.json or 'bytes'", "bytes (or --init-from's own)")},
    "generate": {"--model": ("model", "a model folder", None),
                 "--tokenizer": ("tokenizer", "a tokenizer.json or 'bytes'", "the model folder's own"),
                 "--batch-file": ("batch_file", "a file of prompts", "--prompt"),
                 "--prompt-file": ("prompt_file", "a file holding the prompt (or - for standard input)", "--prompt"),
                 "--json": ("json", "a file to write the results to (or - for stdout)", "no JSON")},
    "eval": {"--model": ("model", "a model folder", None),
             "--data": ("data", "a text file or folder", "a run's validation split"),
             "--tokenizer": ("tokenizer", "a tokenizer.json or 'bytes'", "the model folder's own"),
             "--json": ("json", "a file to write the report to (or - for stdout)", "no JSON")},
    "export": {"--model": ("model", "a model folder", None),
               "--out": ("out", "the path of a new folder", None),
               "--tokenizer": ("tokenizer", "a tokenizer.json or 'bytes'", "the model folder's own")},
}


def empty_path_problems(args) -> list[str]:
    """A message for each path flag given as the empty string, naming the flag and what to give instead."""
    bad = []
    for flag, (dest, what, default) in _PATH_FLAGS[args.command].items():
        if getattr(args, dest) == "":
            instead = f", or leave {flag} out for {default}" if default else ""
            bad.append(f"{flag} '' is an empty path (an unset shell variable?); give {what}{instead}")
    return bad


def train_flag_problems(args) -> list[str]:
    """What train's command line gets wrong on its own (the settings' values are train/checks.py's to judge)."""
    bad = empty_path_problems(args)
    if args.sample_prompt is not None and not_utf8("--sample-prompt", args.sample_prompt):
        bad.append(not_utf8("--sample-prompt", args.sample_prompt))
    return bad


def generate_flag_problems(args) -> list[str]:

    bad = empty_path_problems(args)
    if args.max_new_tokens is not None and args.max_new_tokens < 0:
        bad.append(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.temperature is not None and (not math.isfinite(args.temperature) or args.temperature < 0):
        bad.append(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        bad.append(f"--top-k must be >= 1 (leave it out for no limit), got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        bad.append(f"--top-p must be in (0, 1] (leave it out for no limit), got {args.top_p}")
    if args.min_p is not None and not 0 <= args.min_p <= 1:
        bad.append(f"--min-p must be in [0, 1] (leave it out for no filter), got {args.min_p}")
    if args.repetition_penalty is not None and not 0 < args.repetition_penalty < math.inf:
        bad.append(f"--repetition-penalty must be a finite number > 0 (1 = none; > 1 makes repeats less likely), "
                   f"got {args.repetition_penalty}")
    if args.seed < 0:
        bad.append(f"--seed must be >= 0, got {args.seed}")
    bad += _backend_problems(args)
    if not_utf8("--prompt", args.prompt):
        bad.append(not_utf8("--prompt", args.prompt))
    if args.batch_file is not None and args.prompt:
        bad.append("--prompt and --batch-file exclude each other (put the prompt into the file)")
    if args.prompt_file is not None and args.prompt:
        bad.append("--prompt and --prompt-file exclude each other (give the prompt one way)")
    if args.prompt_file is not None and args.batch_file is not None:
        bad.append("--prompt-file and --batch-file exclude each other (a --batch-file holds every prompt)")
    if args.batch_size is not None and args.batch_file is None:
        bad.append("--batch-size counts the prompts of --batch-file decoded together; give --batch-file FILE, or "
                   "leave --batch-size out")
    if args.batch_size is not None and args.batch_size < 1:
        bad.append(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.json is not None and args.batch_file is None:
        bad.append("--json writes the results of --batch-file's prompts; give --batch-file FILE (a file of one line "
                   "for one prompt), or leave --json out")
    problem = json_path_problem(args.json, lambda path: False, "is not generate's to replace; give a new file name")
    return bad + ([problem] if problem else [])


def _backend_problems(args) -> list[str]:
    if args.backend != "auto" and args.backend not in available_backends():
        return [f"--backend must be 'auto' or one of {', '.join(available_backends())}, got {args.backend!r}"]
    return []


def eval_flag_problems(args) -> list[str]:
    bad = empty_path_problems(args) + _backend_problems(args)
    if args.window is not None and args.window < 1:
        bad.append(f"--window must be >= 1, got {args.window}")
    if args.text_field is not None and args.data is None:
        bad.append("--text-field applies to --data; without it eval reads the run's validation split as the run read "
                   "it (with its --text-field): leave --text-field out")
    if args.document_end is not None and args.data is None:
        bad.append("--document-end applies to --data; without it eval reads the run's validation split as the run "
                   "read it (with the EOS token after each file where the run put one): leave --document-end out")
    if args.training_windows:  # training's own windows: their length and state are the run's, the text its split
        given = [flag for flag, value in (("--data", args.data), ("--window", args.window),
                                          ("--reset-state", args.reset_state), ("--max-tokens", args.max_tokens))
                 if value not in (None, False)]
        if given:
            bad.append(f"--training-windows scores the run's validation split at training's windows; leave out "
                       f"{', '.join(given)}")
    if args.max_tokens is not None and args.max_tokens < 1:
        bad.append(f"--max-tokens must be >= 1 (leave it out for the whole text), got {args.max_tokens}")
    problem = json_path_problem(args.json, is_eval_report, "is not a report eval wrote; give a new file name (eval "
                                                           "replaces only its own reports)")
    return bad + ([problem] if problem else [])   # checked before the text is scored


def json_path_problem(value: str | None, replaceable, exists: str) -> str | None:
    """What is wrong with --json's path (a file to write; "-": stdout), or None: a folder, a missing or unwritable
    folder, or an existing file that `replaceable(path)` does not allow replacing (`exists` says so, and the fix)."""
    if value in (None, "-", ""):
        return None
    path = Path(value).expanduser()
    folder = path.parent
    if path.is_dir():
        return f"--json {value!r} is a folder; give the path of the file to write (or - for stdout)"
    if folder.exists() and not folder.is_dir():
        return f"--json {value!r}: {str(folder)!r} is a file, not a folder"
    if not folder.is_dir():
        return f"--json {value!r}: the folder {str(folder)!r} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--json {value!r}: the folder {str(folder)!r} is not writable"
    if (path.exists() or path.is_symlink()) and not replaceable(path):   # e.g. the text, a config.json
        return f"--json {value!r} exists and {exists}"
    return None


def export_flag_problems(args) -> list[str]:
    return empty_path_problems(args)


def problems_or_none(bad: list[str]) -> str | None:
    return None if not bad else bad[0] if len(bad) == 1 else "\n  " + "\n  ".join(bad)


def argument_problem(args) -> str | None:
    """The first problem with the flags that the subcommand checks before any work, or None."""
    bad = {"train": train_flag_problems, "generate": generate_flag_problems, "eval": eval_flag_problems,
           "export": export_flag_problems}[args.command](args)
    return "; ".join(bad) if bad else None
