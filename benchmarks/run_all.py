"""Run every benchmark script, then write docs/benchmarks.md: each script's table, the machine's facts and
the plots (PNG, matplotlib), from the JSON files the scripts write (layout: benchmarks/_common.py).

    python benchmarks/run_all.py            # everything (about 35 minutes on 2 cores)
    python benchmarks/run_all.py --quick    # a smoke run of every script (~4 minutes on 2 cores), written to a
                                            # temporary folder: the committed results and report stay as they are
    python benchmarks/run_all.py --report-only   # rewrite docs/benchmarks.md from the JSON already there

A script whose optional reference (torch, transformers, mpi4py) is missing still runs its own side.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, ROOT, format_cell

# (script, its title in the report, extra arguments): in the order the report shows them
SCRIPTS = (
    ("bench_ssd.py", "The scan: forward + backward against PyTorch's chunked SSD", []),
    ("bench_train_step.py", "A training step against transformers", ["--threads", "2"]),
    ("bench_generate.py", "Generation against transformers", ["--threads", "2"]),
    ("bench_pretrained_shape.py", "Mamba-2 130M's shape against transformers: generation, prompt, eval, fine-tuning",
     ["--threads", "2"]),
    ("bench_grad_accum.py", "Gradient accumulation: a step of the same batch in micro-batches (130M's shape)",
     ["--threads", "2"]),
    ("bench_quantized.py", "Decoding from int8 and bfloat16 weights against float32 (130M's shape)",
     ["--threads", "2"]),
    ("bench_many_caches.py", "Decoding many caches in turn (a server's conversations)", ["--threads", "2"]),
    ("bench_load.py", "Loading a checkpoint: peak memory and time", []),
    ("bench_import_order.py", "The same speed whatever the user imported first", ["--threads", "2"]),
    ("bench_fused.py", "The fused mixer ops against their engine-op twins", ["--threads", "2"]),
    ("bench_step_parts.py", "The step's optimizer, embedding, loss and residual adds: kernels against NumPy",
     ["--threads", "2"]),
    ("bench_scaling.py", "Scaling with sequence length", []),
    ("bench_engine_overhead.py", "Engine overhead per op", []),
    ("bench_distributed.py", "Data-parallel training over MPI", []),
    ("parity_transformers.py", "Training parity with transformers (float64)", []),
)
QUICK = {"parity_transformers.py": ["--steps", "10"], "bench_fused.py": ["--repeats", "2"],
         "bench_step_parts.py": ["--rounds", "3"],
         "bench_distributed.py": ["--steps", "3", "--skip", "1"]}
# the scripts run by hand, listed at the end of the report: (command, what it does)
BY_HAND = (
    ("benchmarks/profile_step.py", "where one training step's time goes, by share (scan, matmuls, fused ops, "
     "optimizer, the graph walk), and the cores each kept busy"),
    ("benchmarks/profile_decode.py", "where a generated token's time goes in the numba decoder, phase by phase"),
    ("benchmarks/gpu_check.py", "the \"cuda\" scan backend on an NVIDIA GPU: correctness against the CPU, then "
     "speed beside PyTorch (`NUMBA_ENABLE_CUDASIM=1 ... --tiny`: the correctness part on the simulator)"),
)
DEV_TOOLS = (
    ("benchmarks/dev/ab.py --rev REV [--what step|ssd|generate]", "this tree against another git revision (any "
     "layout), each side in a process of its own on the public API, interleaved rounds: the ratio per part "
     "(generate: the prompt's step and a decoding step)"),
    ("benchmarks/dev/bench_ssd_backends.py [--a A --b B] [--step]", "two scan backends of this tree interleaved in "
     "one process: kernels on arrays, engine-op backends through autograd; optionally whole training steps"),
    ("benchmarks/dev/model_step.py", "time and peak memory (tracemalloc) of one forward + backward of the LM"),
    ("benchmarks/dev/equality_report.py", "float64 max differences between the scan's equivalent forms and the "
     "LM's decoding paths (the numbers behind tests/scan/test_ssd.py and tests/models/test_mamba2.py)"),
    ("benchmarks/dev/numpy_protocols.py", "NumPy's protocols on a Tensor (np.asarray, np.exp, masks, ...) against "
     "the same work on its ndarray"),
    ("benchmarks/dev/weight_placement.py", "decoding at batch 1 with the large weights placed as allocated, each in "
     "2 MiB-aligned huge pages, or in_proj's and out_proj's packed in one aligned block each: one process, sides "
     "taking turns"),
    ("benchmarks/dev/decode_chunking.py", "the numba decoder's chunking of its projections (the small chunks' size, "
     "the big chunks' share) switched between calls in one process, rounds beside a bandwidth probe"),
    ("benchmarks/dev/decode_ceiling.py", "how close batch-1 decoding can come to the bandwidth limit: a plain read "
     "of the step's weights (the ceiling of any decoder), the decoder's own kernels streaming its weights and "
     "states with no phases, its real step, and the probe"),
    ("benchmarks/dev/tokenizer_pieces_memory.py [--mb N] [--check]", "peak memory and time of tokenizing a long "
     "text whole against in pieces, for each tokenizer.json layout tinygrad_ssm/io/text_pieces.py cuts (Mistral's, "
     "Llama-2's, Llama-3's, Metaspace's), each in a fresh process; --check holds the pieces' ids and byte ends to "
     "the whole text's"),
    ("benchmarks/dev/tokenizer_wild.py FILE.json ... [--seeds N] [--stream N]", "tokenizer.json files kept outside the "
     "repository (Llama-2's, Mistral's, Llama-3's, Qwen2's, GPT-NeoX's, T5's, BERT's) against the tokenizers library: "
     "encode on hostile texts, pieces against the whole text, TextStream over random ids against decode"),
    ("benchmarks/dev/inject_bugs.py AREA [--only N ...] [--list]", "bugs injected by hand, one at a time, from the "
     "lists in `benchmarks/dev/injected_bugs/` (a text of a file replaced, the tests that should fail): caught, "
     "survived or broken for each, the file written back after each"),
)
# llama.cpp beside these figures, by hand: it is not a dependency, and nothing here builds or downloads it
LLAMA_CPP_SCRIPT = "bench_llama_cpp.py"
LLAMA_CPP = (
    "llama.cpp is the fastest CPU engine for Mamba-2 we know of. `benchmarks/bench_llama_cpp.py` puts it beside "
    "us on the same weights, with a llama.cpp build of your own (run_all.py does not run it; the table below is "
    "that script's last result):",
    "",
    "```bash",
    "python benchmarks/bench_llama_cpp.py --export DIR                 # the weights, mamba_ssm's layout",
    "python convert_hf_to_gguf.py DIR --outtype f32 --outfile DIR/f32.gguf      # in llama.cpp's checkout;",
    "python convert_hf_to_gguf.py DIR --outtype q8_0 --outfile DIR/q8_0.gguf    # its gguf-py importable",
    "python benchmarks/bench_llama_cpp.py --model DIR --llama-bench PATH_TO/llama-bench",
    "```",
    "",
)
LLAMA_CPP_AFTER = (
    "Three runs on 2026-12-05 on a Xeon with 2 MB of L2 a core (this table is the first): float32 decoding "
    "1.14-1.17x llama.cpp's speed and the 512-token prompt 1.69-1.82x; with 8-bit weights decoding 1.65-1.70x and "
    "the prompt 1.54-1.60x. Three runs on 2026-12-04 on an AMD EPYC: float32 1.17-1.42x and 1.30-1.37x, 8-bit "
    "1.29-1.42x and 0.97-1.14x. Our 8-bit prompt runs at float32's speed: the forward dequantizes blocks of weights "
    "to float32 and multiplies in float32 (docs/kernels.md, \"Decoding from 8-bit weights\"), where llama.cpp's Q8_0 "
    "products multiply int8 by int8. The weights came from `--export`, llama.cpp from the copy in llama-cpp-python "
    "0.3.36's source package, built for the CPU: on the EPYC with GGML_NATIVE; on the Xeon, whose -march=native "
    "build died of an illegal instruction in its Q8_0 path (AMX, which the CPU lists but this VM does not run), with "
    "GGML_NATIVE=OFF and its AVX-512 options on (GGML_AVX512, _VBMI, _VNNI, _BF16, GGML_AVX_VNNI), AMX off; "
    "float32 ran at the native build's speed (pp512 637-683 against 647-654 tokens/s, tg32 48.4 against 47.8-48.6).",
)
DOC = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "images"
OUT = RESULTS   # where the scripts write their JSON; --quick: a temporary folder, with its report and images


def run_scripts(quick: bool) -> dict:
    """Run each script in its own process; {script: seconds or an error text}."""
    status = {}
    here = Path(__file__).parent
    for i, (script, title, extra) in enumerate(SCRIPTS, 1):
        if not (here / script).exists():
            status[script] = "missing"
            continue
        name = Path(script).stem
        cmd = [sys.executable, str(here / script), *extra, "--json", str(OUT / f"{name}.json")]
        if quick:
            cmd += QUICK.get(script, ["--quick"])
        print(f"[{i}/{len(SCRIPTS)}] {script}: {title} ...", flush=True)
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=here, text=True, capture_output=True)
        seconds = time.perf_counter() - start
        tail = "\n".join(l for l in out.stdout.splitlines() if not l.startswith("[transformers]"))
        print(tail[-4000:])
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            status[script] = f"failed (exit {out.returncode}) after {seconds:.0f} s"
        else:
            status[script] = seconds
        print(f"[{i}/{len(SCRIPTS)}] {script}: {status[script] if isinstance(status[script], str) else f'{seconds:.0f} s'}",
              flush=True)
    return status


def as_report(script: str, result: dict) -> dict:
    """A result in the common layout (benchmarks/_common.py), from the layouts some scripts write."""
    if "columns" in result:
        return result
    adapt = {"bench_ssd.py": _ssd, "bench_train_step.py": _train_step, "bench_generate.py": _generate,
             "bench_distributed.py": _distributed, "bench_quantized.py": _quantized}.get(script)
    return adapt(result) if adapt else result


def _ssd(r: dict) -> dict:
    shape = r["main_shape"]
    rows = [[name, row["median_s"], row.get("ratio_to_torch", "-"), row["gflops"]] for name, row in r["main"].items()]
    notes = [f"float32 matmul peak measured in the same run: {r['machine']['float32_matmul_gflops']:.0f} GFLOP/s "
             f"(NumPy); GFLOP/s of the scan counts {r['flops_per_step']} for forward + backward",
             "fitted exponent of time in l: " + ", ".join(f"{k} {v:.2f}" for k, v in r.get("fitted_exponent", {}).items())]
    if "memory" in r:
        notes.append("peak memory above the inputs / (inputs + outputs + their gradients): " + ", ".join(
            f"{k} {v['peak_over_io']:.2f}x" for k, v in r["memory"].items() if isinstance(v, dict)))
    prof = r.get("numba_profile_one_thread")
    if prof and "forward_s" in prof:
        notes.append(f"numba kernels alone, one thread: forward {prof['forward_s']:.3f} s, backward "
                     f"{prof['backward_s']:.3f} s (chunk {prof['chunk']})")
    elif prof:                                                          # a result of the recurrence's backward
        notes.append("numba kernels alone, one thread: forward {:.3f} s, backward {:.3f} s (recompute pass {:.3f} s, "
                     "adjoint sweep {:.3f} s)".format(prof["forward_chunk64_s"], prof["backward_chunk64_s"],
                                                      prof["recompute_pass_s"], prof["adjoint_sweep_s"]))
    here = _backends_here()
    gone = [name for name in r["main"] if here is not None and not name.startswith("torch") and name not in here]
    if gone:
        notes.append(f"backends of this run removed since: {', '.join(gone)} (python benchmarks/bench_ssd.py "
                     "measures those of this tree)")
    plots = []
    if r.get("scaling"):
        lengths = sorted(r["scaling"], key=int)
        names = [n for n in r["scaling"][lengths[0]] if not n.startswith("torch_")]
        plots.append({"file": "bench_ssd_scaling.png", "title": "The scan, forward + backward, vs sequence length",
                      "xlabel": "sequence length l", "ylabel": "seconds", "logx": True, "logy": True,
                      "series": {n: [[int(l), r["scaling"][l][n]["median_s"]] for l in lengths if n in r["scaling"][l]]
                                 for n in names}})
    return {"title": f"b={shape['b']} l={shape['l']} h={shape['h']} p={shape['p']} g={shape['g']} n={shape['n']}, "
                     f"float32, median of {r['repeats']}", "columns": ["backend", "median s", "/ PyTorch", "GFLOP/s"],
            "rows": rows, "notes": notes, "plots": plots}


def _backends_here() -> set | None:
    """The names of the scan backends this tree registers; None where tinygrad_ssm does not import."""
    try:
        from tinygrad_ssm.scan import BACKENDS
    except ImportError:
        return None
    return set(BACKENDS)


def _rows_of(r: dict, keys):
    return [[name] + [row.get(k, "-") for k in keys] for name, row in r["rows"].items()]


def _train_step(r: dict) -> dict:
    return {"title": f"batch {r['batch']} x {r['seqlen']}, {r['parameters']:,} parameters, float32, {r['threads']} "
                     f"threads, median of {next(iter(r['rows'].values()))['runs']}",
            "columns": ["side", "median s", "min s", "max s", "tokens/s", "peak MiB added", "/ transformers' best"],
            "rows": _rows_of(r, ["median_s", "min_s", "max_s", "tokens_per_s", "peak_added_mib",
                                 "vs_transformers_best"]),
            "notes": [f"max logit difference between the sides: {r['max_logit_difference']:.2g}",
                      f"our scan backend: {r['our_backend']}"], "plots": []}


def _generate(r: dict) -> dict:
    rows = _rows_of(r, ["median_s", "tokens_per_s", "peak_added_mib", "x_transformers", "greedy_tokens_agreeing"])
    return {"title": f"greedy, prompt {r['prompt_len']} tokens, {r['new_tokens']} new tokens, {r['threads']} threads",
            "columns": ["side", "median s", "tokens/s", "peak MiB added", "x transformers", "tokens equal to theirs"],
            "rows": rows, "notes": [], "plots": [{
                "file": "bench_generate.png", "title": "Generation speed (greedy)", "xlabel": "batch",
                "ylabel": "tokens/s", "logx": False, "logy": True,
                "series": {side: [[int(name.rsplit(" ", 1)[1]), row["tokens_per_s"]] for name, row in r["rows"].items()
                                  if name.startswith(side + " batch")] for side in ("tinygrad_ssm", "transformers")}}]}


def _quantized(r: dict) -> dict:
    return {"title": f"d_model {r['shape']['d_model']}, {r['shape']['n_layer']} layers, int8 block {r['block']}, "
                     f"{r['threads']} threads, read bandwidth {r['read_bandwidth_gb_s']} GB/s",
            "columns": ["weights, task", "tokens/s", "x float32", "seconds", "MB read per step", "bandwidth limit tok/s"],
            "rows": _rows_of(r, ["tokens_per_s", "x_float32", "seconds", "resident_mb", "bandwidth_limit_tokens_per_s"]),
            "notes": ["perplexity on random ids (random weights): " + ", ".join(
                          f"{k} {v}" for k, v in r["perplexity_random_ids"].items()),
                      "eval tokens/s (windows of 512): " + ", ".join(
                          f"{k} {v}" for k, v in r.get("eval_tokens_per_s", {}).items()),
                      "a trained model (the README's default run, its 781,931-byte validation split, measured by "
                      "`eval --weights`): perplexity float32 3.149550, bfloat16 3.149585, int8 3.149618 (+0.002%)",
                      "the ratios move between runs on a shared machine (float32 at b=1 sometimes reads part of "
                      "its weights from the caches and runs above its bandwidth limit); docs/kernels.md, "
                      "\"Decoding from 8-bit weights\", gives every run of the session and the profile of a "
                      "token"], "plots": []}


def _distributed(r: dict) -> dict:
    base = r["runs"][0]["tokens_per_s"]
    rows = [[f"{run['ranks']} x {run['threads_per_rank']} thread(s)",
             "-" if run["overlap"] is None else ("overlap" if run["overlap"] else "no overlap"),
             run["tokens_per_s"], run["tokens_per_s"] / base,
             "-" if run.get("finish_s") is None else run["finish_s"] * 1e3] for run in r["runs"]]
    bare = r.get("bare_allreduce", {})
    return {"title": f"ranks x threads on {r['cpus']} cores, global batch {r['config']['batch_size']} x "
                     f"{r['config']['seq_len']}", "columns": ["configuration", "allreduce", "tokens/s", "vs first row",
                                                              "allreduce wait ms/step"],
            "rows": rows, "notes": [f"the whole gradient ({bare.get('megabytes', 0):.1f} MB, {bare.get('buckets')} "
                                    f"buckets) allreduced alone: {bare.get('allreduce_s', 0) * 1e3:.1f} ms"] if bare
            else [], "plots": []}


def markdown_table(columns, rows) -> str:
    """The cells as the scripts' printed tables have them (_common.format_cell: 5,090, not 5.09e+03)."""
    lines = ["| " + " | ".join(map(str, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def draw(plot: dict) -> str | None:
    """One plot of the result's `plots` -> its path relative to docs/, or None without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(6, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, points in plot["series"].items():
        xs, ys = zip(*points) if points else ((), ())
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log" if plot.get("logx") else "linear")
    ax.set_yscale("log" if plot.get("logy") else "linear")
    ax.set(title=plot["title"], xlabel=plot["xlabel"], ylabel=plot["ylabel"])
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    IMAGES.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGES / plot["file"])
    return f"images/{plot['file']}"


def gpu_check_section() -> list[str]:
    """The last `benchmarks/gpu_check.py` result (run by hand on a GPU machine), if one is in results/."""
    path = OUT / "gpu_check.json"
    lines = ["## The CUDA scan backend on a GPU", "", "`python benchmarks/gpu_check.py --json "
             "benchmarks/results/gpu_check.json` (by hand, on a machine with an NVIDIA GPU)", ""]
    if not path.exists():
        return lines + ["No result yet.", ""]
    r = json.loads(path.read_text())
    checks = [f"{dtype} worst {max(c['max_relative_error'].values()):.1e} (tolerance {c['tolerance']:.0e}, "
              f"{'ok' if c['ok'] else 'FAILED'})" for dtype, c in r["check"]["dtypes"].items()]
    shape = ", ".join(f"{k}={v}" for k, v in r["timed_shape"].items())
    lines += [f"On {r.get('device', 'a GPU')}: forward and every gradient against {r['check']['cpu_backend']} "
              f"({'; '.join(checks)}). Times at {shape}, chunk {r['timed_chunk_size']}, arrays already on the GPU, "
              "best of the repeats, beside the script's PyTorch chunked SSD (ssd_minimal's algorithm, autograd "
              "backward):", ""]
    rows = [[t["dtype"], 1e3 * t["cuda_forward_s"], 1e3 * t["torch_forward_s"],
             t["torch_forward_s"] / t["cuda_forward_s"], 1e3 * t["cuda_forward_backward_s"],
             1e3 * t["torch_forward_backward_s"], t["torch_forward_backward_s"] / t["cuda_forward_backward_s"],
             t["cuda_forward_TFLOPs"]] for t in r["timings"]]
    columns = ["dtype", "forward ms", "torch forward ms", "speedup", "fwd+bwd ms", "torch fwd+bwd ms", "speedup",
               "forward TFLOP/s"]
    return lines + [markdown_table(columns, rows), ""]


def write_report(status: dict | None, quick: bool) -> Path:
    results = {}
    for script, _, _ in SCRIPTS:
        path = OUT / f"{Path(script).stem}.json"
        if path.exists():
            results[script] = as_report(script, json.loads(path.read_text()))
    lines = ["# Benchmarks", "",
             "Generated by `python benchmarks/run_all.py` from the JSON files in `benchmarks/results/` (each script "
             "prints the same table and can be run alone). Timings are medians after warm-up; ratios are measured "
             "in the same run, since the machine is shared and noisy. Never asserted in tests.", ""]
    if quick:
        lines += ["**This is a `--quick` smoke run: few sizes and repeats; the figures are not the report's.**", ""]
    # the result files may come from different machines (the shared machine changes between sessions): each
    # section says its own, and this list gives each machine's details once, newest run first
    machines = sorted((r["machine"] for r in results.values() if "cpu" in r.get("machine", {})),
                      key=lambda m: m["date"], reverse=True)
    if machines:
        lines += ["## The machines", ""]
        for cpu in dict.fromkeys(m["cpu"] for m in machines):
            m = next(m for m in machines if m["cpu"] == cpu)              # its newest run
            versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
            lines += [f"- {cpu}, {m['cores']} cores; BLAS {m['blas']}; {versions}; {m['platform']} "
                      f"(its newest run: {m['date']})"]
        lines += [""]
    for script, title, _ in SCRIPTS:
        if not (Path(__file__).parent / script).exists():
            continue
        lines += [f"## {title}", "", f"`python benchmarks/{script}`", ""]
        r = results.get(script)
        if r is None or "columns" not in r:
            why = status.get(script, "not run") if status else "no result file"
            lines += [f"No result ({why}).", ""]
            continue
        if status and isinstance(status.get(script), str):              # failed or missing this time
            lines += [f"**This run of the script {status[script]}: the table is its last result's.**", ""]
        machine = r.get("machine", {})
        if "cpu" in machine:
            lines += [f"Measured on {machine['cpu']} ({machine['cores']} cores), {machine['date']}.", ""]
        lines += [r.get("title", ""), "", markdown_table(r["columns"], r["rows"]), ""]
        for extra in r.get("extra_tables", []):
            lines += [extra["title"], "", markdown_table(extra["columns"], extra["rows"]), ""]
        lines += [f"- {note}" for note in r.get("notes", [])] + [""]
        for plot in r.get("plots", []):
            image = draw(plot)
            if image:
                lines += [f"![{plot['title']}]({image})", ""]
    lines += ["## Against llama.cpp", "", f"`python benchmarks/{LLAMA_CPP_SCRIPT} --model DIR --llama-bench PATH`",
              "", *LLAMA_CPP]
    llama = OUT / f"{Path(LLAMA_CPP_SCRIPT).stem}.json"
    if llama.exists():
        r = json.loads(llama.read_text())
        lines += [r["title"], "", markdown_table(r["columns"], r["rows"]), ""]
        lines += [f"- {note}" for note in r.get("notes", [])] + [""]
    else:
        lines += ["No result yet.", ""]
    lines += [*LLAMA_CPP_AFTER, ""]
    lines += gpu_check_section()
    lines += ["## Run by hand (benchmarks/)", "", "Not run by run_all.py, no figures here; each prints its own "
              "report (`--help` for its options).", ""]
    lines += [f"- `python {command}`: {what}" for command, what in BY_HAND] + [""]
    lines += ["## Developer tools (benchmarks/dev/)", "", "One-off A/B and profiling tools used while changing the "
              "code; their results are records, not the report's.", ""]
    lines += [f"- `python {command}`: {what}" for command, what in DEV_TOOLS] + [""]
    DOC.write_text("\n".join(lines))
    return DOC


def main(argv=None):
    global OUT, DOC, IMAGES
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--quick", action="store_true", help="a smoke run of every script (~4 minutes on 2 cores), "
                        "its JSON, report and plots in a temporary folder (the committed ones are not touched)")
    parser.add_argument("--report-only", action="store_true", help="only rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.quick and args.report_only:
        parser.error("--quick and --report-only exclude each other (--report-only rewrites the committed report)")
    if args.quick:
        OUT = Path(tempfile.mkdtemp(prefix="run_all_quick_"))
        DOC, IMAGES = OUT / "benchmarks.md", OUT / "images"
        print(f"--quick: results, report and plots go to {OUT}")
    start = time.perf_counter()
    status = None if args.report_only else run_scripts(args.quick)
    doc = write_report(status, args.quick)
    print(f"wrote {doc} ({time.perf_counter() - start:.0f} s in all)")
    failed = [s for s, v in (status or {}).items() if isinstance(v, str) and v.startswith("failed")]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
