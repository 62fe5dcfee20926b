"""`python -m tinygrad_ssm` / `tinygrad-ssm`: train a Mamba-2 model (bytes, or a tokenizer's ids), fine-tune one,
generate text from it, score a text with it, export it for transformers.

    python -m tinygrad_ssm train                      # about three minutes on 2 cores, on the standard library
    python -m tinygrad_ssm train --resume runs/NAME   # continue a run (bit-identical to never stopping)
    python -m tinygrad_ssm generate --model runs/NAME --prompt "def " --max-new-tokens 300
    python -m tinygrad_ssm eval --model DIR --data FILE               # perplexity, bits per byte
    python -m tinygrad_ssm train --init-from DIR --data FOLDER        # fine-tune a checkpoint
    python -m tinygrad_ssm export --model runs/NAME --out NEW_DIR     # a folder transformers loads
    mpiexec -n 2 python -m tinygrad_ssm train         # data-parallel over MPI ranks (docs/distributed.md)

Exit status: 0 done, 1 training diverged or the model gave NaN/inf logits, 2 bad arguments or data, 74 a file
could not be written (disk full, file size limit, read-only folder, closed output pipe; the last checkpoint is
left as it was), 130 stopped by Ctrl-C or SIGTERM (checkpoint saved).

Every error names the flag (`--lr`), file or key at fault and what would work; a run prints its run folder and
the commands that continue from it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np

from .. import distributed
from ..io.checkpoints import CHECKPOINTS_DIR, CheckpointNotFound, checkpoint_names, resolve_checkpoint
from ..models.mamba2.pretrained import stored_dtypes
from ..models.mamba2.sampling import NonFiniteLogits, PenaltyOverflow
from ..tokenizer import TokenizerError
from .arguments import (DTYPES, EVAL_WINDOW, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_IO, EXIT_OK, EXIT_USAGE,
                        argument_problem, build_parser, eval_flag_problems, export_flag_problems,
                        generate_flag_problems, problems_or_none, train_flag_problems)
from .config import TrainConfig
from .data import DataError
from .generate import (DEFAULT_PROMPT_BATCH, escape_controls, generate_batches, load_model, read_batch_file,
                       prompt_ids, read_prompt_file, stream_text)
from .export import describe as describe_export
from .export import export
from .generation_config import new_token_count, sampling_settings, stop_ids
from .json_records import TEXT_FIELD
from .loop import TrainingDiverged, train
from .mpi_cli import python_cmd, refuse_single_process_commands
from .output_errors import io_cause, say_error, silence_stdout, stdout_name
from .sigint import StopAtOnce
from .scoring import (describe, report_text, read_eval_text, score, score_training_windows,
                      trained_val_bpb, training_dtype, write_report)

# the parser and the exit statuses live in train/arguments.py; callers (tests, scripts) take them from here
__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_DIVERGED", "EXIT_USAGE", "EXIT_IO", "EXIT_INTERRUPTED"]


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _next_steps(result) -> str:
    run = shlex.quote(str(result.out))
    lines = ["", f"run folder: {result.out}", "next:",
             f"  python -m tinygrad_ssm generate --model {run} --max-new-tokens 300   # text from the model",
             f"  python -m tinygrad_ssm eval --model {run}   # its validation split, every token in context",
             f"  {python_cmd()} -m tinygrad_ssm train --resume {run} --steps {2 * result.step}   # train on, to step "
             f"{2 * result.step}",
             f"  python -m tinygrad_ssm export --model {run} --out {shlex.quote(str(result.out) + '-hf')}   # a folder "
             f"transformers loads"]
    if result.best is not None and result.checkpoint is not None and result.best[0] != result.checkpoint:
        lines.append(f"  python -m tinygrad_ssm generate --model {shlex.quote(str(result.best[0]))}   # the checkpoint "
                     f"with the best validation (also for eval, export, train --init-from)")
    return "\n".join(lines)  # (the plot's path, or why there is none, is in the summary just above)


def _train(args) -> int:

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    problem = problems_or_none(train_flag_problems(args))
    if problem:
        return _error(problem)

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
    except KeyboardInterrupt as e:
        print(f"stopped by {e.args[0] if e.args else 'Ctrl-C'}", file=sys.stderr)  # sigint.py names SIGTERM
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
        try:   # and how to go on once there is room (a fuzz of interruptions: the stop said neither)
            last = (f"the last checkpoint {resolve_checkpoint(Path(folder))} is intact; once there is room, continue "
                    f"with: {python_cmd()} -m tinygrad_ssm train --resume {folder}")
        except (OSError, ValueError):
            saved = checkpoint_names(Path(folder))  # complete, but LATEST was not written (a full disk)
            if saved:
                newest = Path(folder) / CHECKPOINTS_DIR / saved[-1]
                last = f"the checkpoint {newest} is complete (continue with --resume {newest})"
    say_error(f"cannot write {where}: {io_cause(e)}; training stopped, {last}")
    return EXIT_IO


def _load(args, for_generation: bool = True):
    """(model, tokenizer) of --model, or the exit status after saying what is wrong."""
    try:
        return load_model(args.model, backend=args.backend, tokenizer=args.tokenizer, weights=args.weights,
                          dtype=args.dtype, for_generation=for_generation), None
    except (CheckpointNotFound, ValueError, OSError) as e:  # TokenizerError and PretrainedError are ValueErrors
        return None, _error(str(e))


def _generate(args) -> int:

    problem = problems_or_none(generate_flag_problems(args))  # before loading: a typo should not cost a load
    if problem:
        return _error(problem)
    try:
        prompts = read_batch_file(args.batch_file) if args.batch_file is not None else None   # (prompts, lines)
        if args.prompt_file is not None:
            args.prompt = read_prompt_file(args.prompt_file)
    except (OSError, ValueError) as e:
        return _error(str(e))
    loaded, code = _load(args)
    if loaded is None:
        return code
    model, tokenizer = loaded
    try:
        _sampling(args, model, tokenizer)  # a generation_config.json setting generate lacks is named before any output
        count = _new_tokens(args, model, prompts is not None)          # and so is a length that leaves nothing
        if callable(count):                                            # (a max_length: the prompts' tokens count)
            count(max(len(prompt_ids(p, tokenizer)) for p in (prompts[0] if prompts is not None else [args.prompt])))
    except (ValueError, TokenizerError) as e:
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
    given = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
             "repetition_penalty": args.repetition_penalty}
    return {**sampling_settings(given, defaults), "seed": args.seed, "stop_at_eos": not args.ignore_eos,
            "eos_token_ids": stop_ids(tokenizer, defaults)}


def _new_tokens(args, model, batch_file: bool = False):
    """The number of tokens to generate, or a function of the prompt's tokens (generation_config.new_token_count)."""
    return new_token_count(args.max_new_tokens, getattr(model, "generation_defaults", None),
                           "the longest prompt of --batch-file" if batch_file else "the prompt")


def _stream(model, tokenizer, args, out) -> int:
    count = _new_tokens(args, model)
    count = count(len(prompt_ids(args.prompt, tokenizer))) if callable(count) else count
    out.write(escape_controls(args.prompt))
    out.flush()
    try:
        for piece in stream_text(model, args.prompt, count, tokenizer,
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
    except PenaltyOverflow as e:  # --repetition-penalty (or generation_config.json's) too near 0
        out.write("\n")
        out.flush()
        return _error(str(e))
    out.write("\n")
    out.flush()
    return EXIT_OK


def _generate_batch(model, tokenizer, batch: tuple[list[str], list[int]], args, out) -> int:
    """--batch-file: each batch's texts printed as it ends (on stderr with --json -), and with --json its results as
    JSON Lines, to a file created at the first batch's end (a failed load or first batch leaves no file)."""
    prompts, line_numbers = batch
    size = args.batch_size or DEFAULT_PROMPT_BATCH
    shown = sys.stderr if args.json == "-" else out                     # --json -: stdout holds the JSON alone
    done, results_file = 0, None
    try:
        for results in generate_batches(model, prompts, _new_tokens(args, model, True), tokenizer, batch_size=size,
                                        **_sampling(args, model, tokenizer)):
            records = []
            for prompt, result, line in zip(prompts[done:], results, line_numbers[done:]):
                done += 1
                shown.write(f"=== {done}/{len(prompts)}, line {line} ===\n{escape_controls(prompt + result.text)}\n")
                if args.json is not None:
                    records.append(json.dumps({"index": done, "line": line, "prompt": prompt, "text": result.text,
                                               "new_tokens": result.new_tokens, "finish": result.finish},
                                              ensure_ascii=False) + "\n")
            shown.flush()
            if records:
                results_file = results_file or (out if args.json == "-" else  # new: "x" never opens a file of the
                                                open(Path(args.json).expanduser(), "x", encoding="utf-8"))  # user's
                results_file.writelines(records)
                results_file.flush()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except NonFiniteLogits as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except PenaltyOverflow as e:
        return _error(str(e))
    finally:
        if results_file is not None and results_file is not out:
            results_file.close()
    return EXIT_OK


def _eval(args) -> int:
    problem = problems_or_none(eval_flag_problems(args))
    if problem:
        return _error(problem)
    dtype_given = args.dtype is not None
    if args.dtype is None:  # --training-windows: the run's dtype, in which its figure is training's to the bit
        args.dtype = (training_dtype(args.model) if args.training_windows else None) or DTYPES[0]
    loaded, code = _load(args, for_generation=False)
    if loaded is None:
        return code
    model, tokenizer = loaded
    folder = model.loaded_from  # (resolved again, a save meanwhile named its newer checkpoint in the report)
    if not dtype_given and model.dtype != np.float64 and "float64" in stored_dtypes(folder):  # said, not silent
        print(f"note: {folder}'s weights are float64; scored in {model.dtype} (--dtype float64 scores them as "
              f"stored)", file=sys.stderr)
    try:
        if args.training_windows:
            report, text = score_training_windows(model, tokenizer, folder), None
        else:
            text = read_eval_text(args.data, folder, tokenizer, args.document_end or "none",
                                  args.text_field or TEXT_FIELD)
            window = EVAL_WINDOW if args.window is None else args.window
            report = score(model, tokenizer, text, window=window, carry_state=not args.reset_state,
                           max_tokens=args.max_tokens, progress=not args.no_progress)
    except DataError as e:
        return _error(str(e))
    except TokenizerError as e:  # raised as the text is read: a stretch the tokenizer cannot take in pieces
        return _error(f"--data {args.data!r}: {e}")
    except KeyboardInterrupt as e:
        print(f"stopped by {e.args[0] if e.args else 'Ctrl-C'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if text is not None and text.read.non_utf8_note():  # as training's corpus line says it; on stderr (--json -)
        print(f"{text.source}: {text.read.non_utf8_note()}", file=sys.stderr)
    report["model"] = str(folder)
    # the weights as scored: "float" (the model's dtype) or the quantized format (--weights, or as saved)
    report["weights"] = getattr(model, "weights_format", "float")
    report["dtype"] = str(model.dtype)  # --dtype: float64 gives score()'s numbers on a float64 model
    # (a control character in a file's name must not drive the terminal either)
    summary = escape_controls(describe(report, trained_val_bpb(folder) if args.data is None else None))
    if not np.isfinite(report["mean_nats"]):  # no figure to report, and NaN is not JSON: an earlier report stays
        print(summary, file=sys.stderr)
        say_error(f"the model's loss on this text is {report['mean_nats']} (its logits hold NaN or inf: the weights "
                  f"of {str(folder)!r} are damaged or diverged); no report was written")
        return EXIT_DIVERGED
    if args.json not in (None, "-"):  # the file first: a closed stdout (eval ... | head) must not lose it
        try:
            write_report(Path(args.json).expanduser(), report_text(report))  # its mark lets a later eval replace it
        except FileExistsError:
            print(summary)
            say_error(f"--json {args.json!r}: a file that is not eval's report appeared there while scoring; it was "
                      f"left as it is and the JSON not written (the report is above)")
            return EXIT_IO
        except OSError as e:
            print(summary)
            say_error(f"cannot write {e.filename or args.json}: {io_cause(e)}")
            return EXIT_IO
    try:
        # with --json -, stdout is the JSON alone (a program reads it), the report goes to stderr
        print(summary, file=sys.stderr if args.json == "-" else sys.stdout)
        if args.json == "-":
            sys.stdout.write(report_text(report))
    except OSError as e:
        where = stdout_name()                                           # before it points at /dev/null
        silence_stdout()
        written = f"; the report was written to {args.json}" if args.json not in (None, "-") else ""
        say_error(f"cannot write {where}: {io_cause(e)}{written}")
        return EXIT_IO
    return EXIT_OK


def _export(args) -> int:
    problem = problems_or_none(export_flag_problems(args))
    if problem:
        return _error(problem)
    try:
        result = export(args.model, args.out, layout=args.layout, tokenizer=args.tokenizer, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:  # a missing model folder or weights (CheckpointNotFound is one);
        # ExportError, PretrainedError, TokenizerError are ValueErrors
        return _error(str(e))
    except OSError as e:  # disk full, read-only folder: the temporary folder is gone, --out left as it was
        say_error(f"cannot write --out {args.out}: {io_cause(e)}; nothing was exported there")   # (not the temporary
        return EXIT_IO                                                                          # folder's name)
    try:
        print(escape_controls(describe_export(result)))                # (as generate prints text)
    except OSError as e:  # > /dev/full, a closed pipe: one line, not a traceback; the export itself is whole
        where = stdout_name()
        silence_stdout()
        say_error(f"cannot write {where}: {io_cause(e)}; the export to {args.out} is complete")
        return EXIT_IO
    return EXIT_OK


ASKED_FOR_HELP = "asked for --help"   # a rank that printed the help stops there, and with it the job


def _print_texts(out: str, err: str) -> None:
    """What argparse printed (--help on stdout, an error on stderr), printed now."""
    for stream, text in ((sys.stdout, out), (sys.stderr, err)):
        stream.write(text)
        stream.flush()


def _agree_on_arguments(parser, argv) -> tuple[object, int | None]:
    """Under an MPI launcher (mpiexec -n N, N > 1): parse this rank's arguments, then make every rank take the same
    decision, so a rank that stops at its flags never leaves the others waiting in MPI (each rank may be given
    its own command line, or its own environment). Returns (args, None) to go on, or (None, exit status)."""
    captured, help_text, args, code = io.StringIO(), io.StringIO(), None, None
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(help_text):
            args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's error (status 2), or --help (0): its text is printed below
        code = e.code if isinstance(e.code, int) else EXIT_USAGE
    texts = (help_text.getvalue(), captured.getvalue())
    lines = captured.getvalue().strip().splitlines()
    if code is None:
        problem = argument_problem(args)
    else:
        problem = ASKED_FOR_HELP if code == 0 else lines[-1] if lines else "stopped at its arguments"
    try:
        world = distributed.init(required=args is not None and args.command == "train")
    except distributed.DistributedError as e:
        _print_texts(*texts)
        return None, _error(str(e))
    roots = texts if world.size == 1 else world.comm.bcast(texts if world.is_root else None, root=0)
    if world.is_root or texts != roots:  # once for the job (--help was printed N times), or a rank's own that differs
        _print_texts(*texts)
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
    # one message for the job, which rank stopped and why (its own text is printed above); none for --help alone
    if world.is_root and any(p != ASKED_FOR_HELP for _, p in failures):
        print("error: " + "; ".join(f"rank {r} of {world.size} stopped at its arguments: {p}" for r, p in failures)
              + "; no rank starts", file=sys.stderr)
    elif problem and code is None:  # a problem found after parsing: this rank says it too
        _error(problem)
    return None, code if code is not None else EXIT_USAGE


def main(argv=None) -> int:
    if sys.stderr is None:   # 2>&-: Python then has no sys.stderr; an error has nowhere to go, the exit status says it
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:   # >&-: every command writes there (generate its text, eval and export their report)
        say_error("standard output is closed (>&-); give it a place: > FILE, or > /dev/null to drop it")
        return EXIT_IO
    parser = build_parser()
    if distributed.launcher_world_size() > 1:
        args, code = refuse_single_process_commands(*_agree_on_arguments(parser, argv), EXIT_USAGE)
        if code is not None:
            return code
    else:
        args = parser.parse_args(argv)
    command = {"train": _train, "generate": _generate, "eval": _eval, "export": _export}[args.command]
    # Every command checks what it computes for non-finite values and says so in one line (training diverged,
    # NaN logits, a NaN eval): NumPy's overflow and invalid-value warnings printed before it were noise
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _run_command(command, args)


def _run_command(command, args) -> int:
    if args.command == "train":  # it takes Ctrl-C and SIGTERM over itself (sigint.py: a checkpoint first)
        return command(args)
    with StopAtOnce() as stop:  # SIGTERM as Ctrl-C: exit 130, no partial --json file
        try:
            code = command(args)
        except TypeError as e:
            interrupt = stop.as_interrupt(e)                            # numba swallowed the KeyboardInterrupt
            if interrupt is None:
                raise
            print(f"\nstopped by {interrupt.args[0]}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except KeyboardInterrupt as e:   # one the command does not take itself (while a model folder loads)
            print(f"\nstopped by {e.args[0] if e.args else 'Ctrl-C'}", file=sys.stderr)
            return EXIT_INTERRUPTED
    if stop.raised is not None and code != EXIT_INTERRUPTED:
        # raised inside a callback that dropped it ("Exception ignored on calling ctypes callback": numba's compiler
        # caching a kernel): the command ran on to its end, and exit 0 hid the Ctrl-C (an audit of the CLI)
        say_error(f"{stop.raised} came while numba compiled, which lost it, so the command ran to its end")
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
