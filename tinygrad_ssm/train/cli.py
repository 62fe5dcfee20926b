"""`python -m tinygrad_ssm` / `tinygrad-ssm`: train a Mamba-2 model (bytes, or a tokenizer's ids), fine-tune one,
generate text from it, score a text with it.

    python -m tinygrad_ssm train                      # about three minutes on 2 cores, on the standard library
    python -m tinygrad_ssm train --resume runs/NAME   # continue a run (bit-identical to never stopping)
    python -m tinygrad_ssm generate --model runs/NAME --prompt "def " --max-new-tokens 300
    python -m tinygrad_ssm eval --model DIR --data FILE               # perplexity, bits per byte
    python -m tinygrad_ssm train --init-from DIR --data FOLDER        # fine-tune a checkpoint
    mpiexec -n 2 python -m tinygrad_ssm train         # data-parallel over MPI ranks (docs/distributed.md)

Exit status: 0 done, 1 training diverged or the model gave NaN/inf logits, 2 bad arguments or data, 74 a file
could not be written (disk full, file size limit, read-only folder, closed output pipe; the last checkpoint is
left as it was), 130 stopped by Ctrl-C (checkpoint saved).

Every error names the flag (`--lr`), file or key at fault and what would work; a run prints its run folder and
the commands that continue from it.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import io
import json
import math
import os
import shlex
import sys
from pathlib import Path

import numpy as np

from .. import distributed
from ..io.checkpoints import CHECKPOINTS_DIR, CheckpointNotFound, checkpoint_names, resolve_checkpoint
from ..models.mamba2.sampling import NonFiniteLogits
from ..scan import available_backends
from ..tokenizer import TokenizerError
from .config import TrainConfig
from .data import DataError
from .generate import (escape_controls, generate_batch, load_model, not_utf8, read_batch_file,
                       resolve_model_folder, stream_text)
from .generation_config import DEFAULT_TEMPERATURE, sampling_settings, stop_ids
from .loop import TrainingDiverged, train
from .mpi_cli import python_cmd, refuse_single_process_commands
from .output_errors import io_cause, say_error, silence_stdout, stdout_name
from .scoring import (REPORT_MARK, REPORT_MARK_VALUE, describe, is_eval_report, read_eval_text, score, trained_val_bpb,
                      write_report)

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_IO, EXIT_INTERRUPTED = 0, 1, 2, 74, 130  # 74: sysexits' EX_IOERR

_D = TrainConfig()  # the defaults, shown in --help

# (flag, TrainConfig field, type, help); every default is None so that we know what was given explicitly
_TRAIN_FLAGS = [
    ("--data", "data", str, "a text file or a folder of text files (read as bytes; hidden and binary files "
                            "skipped) [default: the running Python's standard library .py sources, without "
                            "site-packages and test suites]"),
    ("--data-seed", "data_seed", int, f"seed of the file order and train/validation split [{_D.data_seed}]"),
    ("--val-fraction", "val_fraction", float, f"fraction of the files kept for validation [{_D.val_fraction}]"),
    ("--steps", "steps", int, f"total optimizer steps; also the length of the cosine schedule [{_D.steps}]"),
    ("--batch-size", "batch_size", int, f"sequences per step [{_D.batch_size}]"),
    ("--seq-len", "seq_len", int, f"bytes per sequence (tokens when the run has a tokenizer) [{_D.seq_len}]"),
    ("--d-model", "d_model", int, f"model width [{_D.d_model}]"),
    ("--n-layer", "n_layer", int, f"number of Mamba-2 blocks [{_D.n_layer}]"),
    ("--d-state", "d_state", int, f"SSM state size per head [{_D.d_state}]"),
    ("--headdim", "headdim", int, f"channels per SSM head (2*d_model must be a multiple) [{_D.headdim}]"),
    ("--chunk-size", "chunk_size", int, f"SSD chunk length (speed; results equal up to rounding) "
                                        f"[{_D.chunk_size}]"),
    ("--lr", "lr", float, f"peak learning rate of AdamW [{_D.lr}]"),
    ("--min-lr", "min_lr", float, "learning rate at the end of the cosine decay [--lr / 10]"),
    ("--warmup-steps", "warmup_steps", int, f"steps of linear warmup from 0 to --lr [{_D.warmup_steps}]"),
    ("--weight-decay", "weight_decay", float, f"AdamW decoupled weight decay on matrices [{_D.weight_decay}]"),
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
    ("--keep-checkpoints", "keep_checkpoints", int, f"how many recent checkpoints to keep [{_D.keep_checkpoints}]"),
    ("--sample-bytes", "sample_bytes", int, f"bytes generated for the sample at the end (tokens when the run "
                                             f"has a tokenizer) [{_D.sample_bytes}]"),
    ("--sample-prompt", "sample_prompt", str, "text the sample at the end continues [the first line of the "
                                              "validation text, so it suits any --data]"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinygrad-ssm", description="Mamba-2 language models on a NumPy "
                                     "autograd engine: train, generate, eval.", epilog=f"exit status: {EXIT_OK} ok, "
                                     f"{EXIT_DIVERGED} diverged, {EXIT_USAGE} bad input, {EXIT_INTERRUPTED} Ctrl-C")
    sub = parser.add_subparsers(dest="command", metavar="{train,generate,eval}")
    sub.required = True

    tr = sub.add_parser("train", help="train a Mamba-2 model, byte-level unless a tokenizer is given, or fine-tune "
                                      "one (--init-from) (defaults: about three minutes on 2 cores)",
                        description="Train a Mamba-2 language model (on bytes, or on the ids of --tokenizer or of "
                                    "--init-from's tokenizer) with AdamW, warmup + cosine decay and gradient "
                                    "clipping. Defaults are in brackets; with them a run takes about three "
                                    "minutes on 2 cores.")
    for flag, field, typ, text in _TRAIN_FLAGS:
        metavar = {"data": "PATH", "out": "DIR", "backend": "NAME", "sample_prompt": "TEXT"}.get(
            field, "N" if typ is int else "X")
        tr.add_argument(flag, dest=field, type=typ, default=None, help=text, metavar=metavar)
    tr.add_argument("--init-from", dest="init_from", metavar="DIR", default=None,
                    help="fine-tune: start from the weights (and tokenizer) of a model folder (a run, a checkpoint, "
                         "a save_pretrained / mamba_ssm / transformers folder); the model flags come from it")
    tr.add_argument("--tokenizer", metavar="PATH", default=None,
                    help="tokenize --data with this tokenizer.json ('bytes': raw bytes) [bytes, or --init-from's own]")
    tr.add_argument("--resume", metavar="DIR", default=None,
                    help="continue the run in DIR (a run folder or one of its checkpoints) with its saved "
                         "settings; N steps + resumed steps give the same weights as one uninterrupted run")
    tr.add_argument("--stop-at", type=int, metavar="STEP", default=None,
                    help="stop after this step (1 to --steps) with a checkpoint (the schedule still spans "
                         "--steps), to split a run into sessions")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for log files)")
    tr.add_argument("--distributed", action="store_true",
                    help="train data-parallel over MPI (needs mpi4py: pip install \".[distributed]\"); on by "
                         "itself when started by mpiexec with more than one process")
    tr.add_argument("--no-overlap", action="store_true",
                    help="under MPI, allreduce the gradients after the backward instead of during it")

    ge = sub.add_parser("generate", help="generate text from a model folder, streamed as it is produced",
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
    ge.add_argument("--batch-file", metavar="FILE", default=None,
                    help="generate for every prompt in FILE at once (one prompt per line, blank lines skipped; a "
                         ".jsonl file: one {\"prompt\": ...} per line, for prompts with newlines); the results are "
                         "printed in order, each headed by its number and line")
    ge.add_argument("--max-new-tokens", type=int, default=300, help="tokens to generate [%(default)s]")
    ge.add_argument("--temperature", type=float, default=None,
                    help=f"divide the logits by this; 0 means greedy [{DEFAULT_TEMPERATURE}; with none of "
                         f"--temperature/--top-k/--top-p given, the model folder's generation_config.json's "
                         f"do_sample, temperature, top_k and top_p where it states them]")
    ge.add_argument("--top-k", type=int, default=None, help="sample only among the k likeliest tokens [off, or "
                                                            "as for --temperature]")
    ge.add_argument("--top-p", type=float, default=None, help="sample only within the smallest set of tokens with "
                                                              "probability >= p [off, or as for --temperature]")
    ge.add_argument("--seed", type=int, default=0, help="sampling seed [%(default)s]")
    ge.add_argument("--ignore-eos", action="store_true", help="go on past the end-of-text tokens (the tokenizer's "
                                                              "and generation_config.json's or config.json's "
                                                              "eos_token_id, all of a list)")
    ge.add_argument("--backend", default="auto", help="SSD scan backend [%(default)s]")
    ge.add_argument("--weights", choices=("float32", "bfloat16", "int8"), default=None,
                    help="decode from 8- or 16-bit weights (quantized at load; a quantized folder loads as saved)")

    ev = sub.add_parser("eval", help="perplexity and bits per byte of a model on a text file or folder",
                        description="Score every token of a text with a model: perplexity, bits per token and bits "
                                    "per byte. The text is read in windows with the model's state carried from one "
                                    "to the next, so every token sees all of the text before it (a state space "
                                    "model needs no overlapping windows).")
    ev.add_argument("--model", "--checkpoint", dest="model", required=True, metavar="DIR", help="model folder")
    ev.add_argument("--data", metavar="PATH", default=None,
                    help="a text file or a folder of text files [for a run of this package: its validation split]")
    ev.add_argument("--tokenizer", metavar="PATH", default=None, help="as for generate [the model folder's own]")
    ev.add_argument("--window", type=int, default=512, help="tokens per forward pass (memory, not the result) "
                                                            "[%(default)s]")
    ev.add_argument("--reset-state", action="store_true",
                    help="start every window from a zero state (how training validates) instead of carrying it")
    ev.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens [all]")
    ev.add_argument("--json", metavar="FILE", default=None, help="also write the report as JSON, to a new file or "
                                                                 "over an earlier report of eval's (- for stdout, "
                                                                 "which then holds the JSON alone: the report "
                                                                 "goes to stderr)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--backend", default="auto", help="SSD scan backend [%(default)s]")
    ev.add_argument("--weights", choices=("float32", "bfloat16", "int8"), default=None,
                    help="decode from 8- or 16-bit weights (quantized at load; a quantized folder loads as saved)")
    return parser


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _next_steps(result) -> str:
    run = shlex.quote(str(result.out))
    lines = ["", f"run folder: {result.out}", "next:",
             f"  python -m tinygrad_ssm generate --model {run} --max-new-tokens 300   # text from the model",
             f"  python -m tinygrad_ssm eval --model {run}   # its validation split, every token in context",
             f"  {python_cmd()} -m tinygrad_ssm train --resume {run} --steps {2 * result.step}   # train on, to step "
             f"{2 * result.step}"]
    return "\n".join(lines)  # (the plot's path, or why there is none, is in the summary just above)


def _train(args) -> int:

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    if args.sample_prompt is not None and not_utf8("--sample-prompt", args.sample_prompt):
        return _error(not_utf8("--sample-prompt", args.sample_prompt))

    try:  # mpiexec -n N (N > 1) means MPI even without --distributed: N lone copies would clash in one folder
        world = distributed.init() if args.distributed or distributed.launcher_world_size() > 1 else distributed.SINGLE
    except distributed.DistributedError as e:
        return _error(str(e))
    try:
        result = train(TrainConfig(), resume=args.resume, overrides=overrides, stop_at=args.stop_at,
                       progress=not args.no_progress, world=world, overlap=not args.no_overlap)
    except (DataError, CheckpointNotFound, FileExistsError, ValueError) as e:
        if not world.is_root:  # every rank stops; rank 0 says why, naming any other rank that failed
            return EXIT_USAGE
        return _error(str(e))
    except (distributed.RanksDiverged, TrainingDiverged, NonFiniteLogits) as e:
        if world.is_root:  # every rank stopped alike: rank 0 says why, once
            print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print("stopped by Ctrl-C", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # disk full, file size limit, read-only folder: one line, not a traceback
        return _train_io_error(e, args) if world.is_root else EXIT_IO   # rank 0's failed save, said once
    if result.status == "done" and world.is_root:                       # one report for the job
        print(_next_steps(result))
    return EXIT_INTERRUPTED if result.status == "interrupted" else EXIT_OK


def _train_io_error(e: OSError, args) -> int:
    folder = args.out or args.resume
    if e.filename is None and e.errno == errno.EPIPE:                # `train | head`: the run's files are fine
        where = f"to {stdout_name()}"
        silence_stdout()
    else:
        where = e.filename or (f"a file in the run folder {folder}" if folder else "a file of the run")
    last = "no checkpoint had been written yet"
    if folder:
        try:
            last = f"the last checkpoint {resolve_checkpoint(Path(folder))} is intact"
        except (OSError, ValueError):
            saved = checkpoint_names(Path(folder))  # complete, but LATEST was not written (a full disk)
            if saved:
                newest = Path(folder) / CHECKPOINTS_DIR / saved[-1]
                last = f"the checkpoint {newest} is complete (continue with --resume {newest})"
    say_error(f"cannot write {where}: {io_cause(e)}; training stopped, {last}")
    return EXIT_IO


def _generate_flag_problems(args) -> list[str]:

    bad = []
    if args.max_new_tokens < 0:
        bad.append(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.temperature is not None and (not math.isfinite(args.temperature) or args.temperature < 0):
        bad.append(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        bad.append(f"--top-k must be >= 1 (leave it out for no limit), got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        bad.append(f"--top-p must be in (0, 1] (leave it out for no limit), got {args.top_p}")
    if args.seed < 0:
        bad.append(f"--seed must be >= 0, got {args.seed}")
    bad += _backend_problems(args)
    if not_utf8("--prompt", args.prompt):
        bad.append(not_utf8("--prompt", args.prompt))
    if args.batch_file is not None and args.prompt:
        bad.append("--prompt and --batch-file exclude each other (put the prompt into the file)")
    return bad


def _backend_problems(args) -> list[str]:
    if args.backend != "auto" and args.backend not in available_backends():
        return [f"--backend must be 'auto' or one of {', '.join(available_backends())}, got {args.backend!r}"]
    return []


def _eval_flag_problems(args) -> list[str]:
    bad = _backend_problems(args)
    if args.window < 1:
        bad.append(f"--window must be >= 1, got {args.window}")
    if args.max_tokens is not None and args.max_tokens < 1:
        bad.append(f"--max-tokens must be >= 1 (leave it out for the whole text), got {args.max_tokens}")
    if args.json not in (None, "-"):                                   # checked before the text is scored
        path = Path(args.json).expanduser()
        folder = path.parent
        if not args.json or path.is_dir():
            bad.append(f"--json {args.json!r} is a folder; give the path of the file to write (or - for stdout)")
        elif folder.exists() and not folder.is_dir():
            bad.append(f"--json {args.json!r}: {str(folder)!r} is a file, not a folder")
        elif not folder.is_dir():
            bad.append(f"--json {args.json!r}: the folder {str(folder)!r} does not exist")
        elif not os.access(folder, os.W_OK | os.X_OK):
            bad.append(f"--json {args.json!r}: the folder {str(folder)!r} is not writable")
        elif (path.exists() or path.is_symlink()) and not is_eval_report(path):  # e.g. the text, a config.json
            bad.append(f"--json {args.json!r} exists and is not a report eval wrote; give a new file name (eval "
                       f"replaces only its own reports)")
    return bad


def _load(args):
    """(model, tokenizer) of --model, or the exit status after saying what is wrong."""
    try:
        return load_model(args.model, backend=args.backend, tokenizer=args.tokenizer, weights=args.weights), None
    except (CheckpointNotFound, ValueError, OSError) as e:  # TokenizerError and PretrainedError are ValueErrors
        return None, _error(str(e))


def _problems_or_none(bad: list[str]) -> str | None:
    return None if not bad else bad[0] if len(bad) == 1 else "\n  " + "\n  ".join(bad)


def _generate(args) -> int:

    problem = _problems_or_none(_generate_flag_problems(args))  # before loading: a typo should not cost a load
    if problem:
        return _error(problem)
    try:
        prompts = read_batch_file(args.batch_file) if args.batch_file is not None else None   # (prompts, lines)
    except (OSError, ValueError) as e:
        return _error(str(e))
    loaded, code = _load(args)
    if loaded is None:
        return code
    model, tokenizer = loaded
    try:
        _sampling(args, model, tokenizer)  # a generation_config.json setting generate lacks is named before any output
    except ValueError as e:
        return _error(str(e))
    out = sys.stdout
    if hasattr(out, "reconfigure"):
        out.reconfigure(errors="replace")  # U+FFFD on a non-UTF-8 terminal must not crash either
    try:
        if prompts is not None:
            return _generate_batch(model, tokenizer, prompts, args, out)
        return _stream(model, tokenizer, args, out)
    except TokenizerError as e:
        return _error(str(e))
    except OSError as e:  # `generate | head`, `generate > /dev/full`: one line, not a traceback
        where = stdout_name() if e.filename is None else e.filename
        silence_stdout()
        say_error(f"cannot write to {where}: {io_cause(e)}; generation stopped")
        return EXIT_IO


def _sampling(args, model, tokenizer) -> dict:
    defaults = getattr(model, "generation_defaults", None)             # load_model's (generation_config.py)
    given = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    return {**sampling_settings(given, defaults), "seed": args.seed, "stop_at_eos": not args.ignore_eos,
            "eos_token_ids": stop_ids(tokenizer, defaults)}


def _stream(model, tokenizer, args, out) -> int:
    out.write(escape_controls(args.prompt))
    out.flush()
    try:
        for piece in stream_text(model, args.prompt, args.max_new_tokens, tokenizer,
                                 **_sampling(args, model, tokenizer)):
            out.write(escape_controls(piece))  # a control byte must not drive the terminal
            out.flush()
    except KeyboardInterrupt:
        out.write("\n")
        return EXIT_INTERRUPTED
    except NonFiniteLogits as e:
        out.write("\n")
        out.flush()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    out.write("\n")
    out.flush()
    return EXIT_OK


def _generate_batch(model, tokenizer, batch: tuple[list[str], list[int]], args, out) -> int:
    prompts, line_numbers = batch
    try:
        texts = generate_batch(model, prompts, args.max_new_tokens, tokenizer, **_sampling(args, model, tokenizer))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except NonFiniteLogits as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    for i, (prompt, text, line) in enumerate(zip(prompts, texts, line_numbers), 1):
        out.write(f"=== {i}/{len(prompts)}, line {line} ===\n{escape_controls(prompt + text)}\n")
    out.flush()
    return EXIT_OK


def _eval(args) -> int:
    problem = _problems_or_none(_eval_flag_problems(args))
    if problem:
        return _error(problem)
    loaded, code = _load(args)
    if loaded is None:
        return code
    model, tokenizer = loaded
    folder = resolve_model_folder(args.model)
    try:
        text = read_eval_text(args.data, folder, tokenizer)
        report = score(model, tokenizer, text, window=args.window, carry_state=not args.reset_state,
                       max_tokens=args.max_tokens, progress=not args.no_progress)
    except DataError as e:
        return _error(str(e))
    except KeyboardInterrupt:
        print("stopped by Ctrl-C", file=sys.stderr)
        return EXIT_INTERRUPTED
    report["model"] = str(folder)
    report[REPORT_MARK] = REPORT_MARK_VALUE  # what lets a later eval --json replace this file
    # the weights as scored: "float" (the model's dtype) or the quantized format (--weights, or as saved)
    report["weights"] = getattr(model, "weights_format", "float")
    try:
        # with --json -, stdout is the JSON alone (a program reads it), the report goes to stderr
        print(describe(report, trained_val_bpb(folder) if args.data is None else None),
              file=sys.stderr if args.json == "-" else sys.stdout)
        if args.json is not None:
            text = json.dumps(report, indent=1) + "\n"
            if args.json == "-":
                sys.stdout.write(text)
            else:
                write_report(Path(args.json), text)
    except FileExistsError:
        say_error(f"--json {args.json!r}: a file that is not eval's report appeared there while scoring; it was "
                  f"left as it is and the JSON not written (the report is above)")
        return EXIT_IO
    except OSError as e:
        where = e.filename or stdout_name()
        if e.filename is None:
            silence_stdout()
        say_error(f"cannot write {where}: {io_cause(e)}")
        return EXIT_IO
    return EXIT_OK if np.isfinite(report["mean_nats"]) else EXIT_DIVERGED


def _argument_problem(args) -> str | None:
    """The first problem with the flags that the subcommand checks before any work, or None."""
    if args.command == "train":
        return args.sample_prompt is not None and not_utf8("--sample-prompt", args.sample_prompt) or None
    bad = _generate_flag_problems(args) if args.command == "generate" else _eval_flag_problems(args)
    return "; ".join(bad) if bad else None


def _agree_on_arguments(parser, argv) -> tuple[object, int | None]:
    """Under an MPI launcher (mpiexec -n N, N > 1): parse this rank's arguments, then make every rank take the same
    decision, so a rank that stops at its flags never leaves the others waiting in MPI (each rank may be given
    its own command line, or its own environment). Returns (args, None) to go on, or (None, exit status)."""
    captured, args, code = io.StringIO(), None, None
    try:
        with contextlib.redirect_stderr(captured):
            args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's error (status 2), or --help (0): its text is printed below
        code = e.code if isinstance(e.code, int) else EXIT_USAGE
    sys.stderr.write(captured.getvalue())
    sys.stderr.flush()
    lines = captured.getvalue().strip().splitlines()
    problem = (lines[-1] if lines else "stopped at its arguments") if code is not None else _argument_problem(args)
    try:
        world = distributed.init(required=args is not None and args.command == "train")
    except distributed.DistributedError as e:
        return None, _error(str(e))
    if world.size == 1:
        return (args, None) if code is None else (None, code)
    settings = None if args is None else {k: repr(v) for k, v in sorted(vars(args).items())}
    decisions = world.comm.allgather([problem, None if args is None else args.command, settings])
    commands = {c for _, c, _ in decisions if c is not None}
    if len(commands) > 1:
        decisions = [[p or f"was given the command {c!r} (the ranks must run the same one)", c, a]
                     for p, c, a in decisions]
    elif not any(p for p, _, _ in decisions):  # a data-parallel job trains one model: one set of settings
        for r, (_, _, theirs) in enumerate(decisions):
            differ = [k for k in theirs if theirs[k] != decisions[0][2].get(k)]
            if differ:
                decisions[r][0] = "its flags differ from rank 0's: " + ", ".join(
                    f"--{k.replace('_', '-')} {theirs[k]} (rank 0: {decisions[0][2].get(k)})" for k in differ)
    failures = [(r, p) for r, (p, _, _) in enumerate(decisions) if p]
    if not failures:
        return args, None
    if world.is_root:  # one message for the job: which rank stopped, and why (its own text is printed above)
        print("error: " + "; ".join(f"rank {r} of {world.size} stopped at its arguments: {p}" for r, p in failures)
              + "; no rank starts", file=sys.stderr)
    elif problem and code is None:  # a problem found after parsing: this rank says it too
        _error(problem)
    return None, code if code is not None else EXIT_USAGE


def main(argv=None) -> int:
    parser = build_parser()
    if distributed.launcher_world_size() > 1:
        args, code = refuse_single_process_commands(*_agree_on_arguments(parser, argv), EXIT_USAGE)
        if code is not None:
            return code
    else:
        args = parser.parse_args(argv)
    return {"train": _train, "generate": _generate, "eval": _eval}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
