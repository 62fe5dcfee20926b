"""This tree against another git revision, in the same run: a training step (--what step), the scan's forward +
backward (--what ssd) or greedy generation's prompt step and decoding steps (--what generate), each side in a
process of its own, the two taking turns round after round, so that a
machine whose speed drifts (a shared one: 10% between hours) slows both alike.

    python benchmarks/dev/ab.py --rev HEAD~1                       # a training step at bench_train_step's shape
    python benchmarks/dev/ab.py --rev 931a76e --shape default      # ... at the default training run's shape
    python benchmarks/dev/ab.py --rev HEAD~1 --what ssd            # tg.ssd forward + backward, the step's shape
    python benchmarks/dev/ab.py --rev HEAD~1 --what ssd --ssd-shape 1,64,2,8,1,8 --rounds 2   # a smoke run
    python benchmarks/dev/ab.py --rev HEAD~1 --what generate       # Mamba-2 130M's shape, 16-token prompt, batch 1
    python benchmarks/dev/ab.py --rev HEAD~1 --what generate --model small --batch 8 --prompt-len 32
    python benchmarks/dev/ab.py --rev HEAD~1 --quick               # tiny shapes, 2 rounds: does it run

The other revision's tree comes from `git archive REV` into a folder of the system's temporary directory named
after its commit (kept, so that its numba kernels compile once: the first run of a revision pays that, inside
the warm-up). This tree is the working tree as it is, uncommitted changes included. Each side is one Python
process started with PYTHONPATH (and the working directory) set to its tree, which checks that it imported
tinygrad_ssm from there. It measures only through the public API, which both layouts have (`tg.Mamba2Config`,
`tg.Mamba2LMHeadModel`, `tg.VarMap`, `tinygrad_ssm.optim.AdamW`, `tg.ssd`, `tg.Tensor`), so REV may be older
than any layout change. Both processes start, build their work and run --warmup untimed repetitions; then each
round asks one side, then the other (the order alternating by round), for one untimed repetition (the caches
the other side left) and --reps timed ones. Per part (step: forward with the loss, backward, optimizer, the
whole step; ssd: forward, backward of sum(y * dy) + sum(final_state * d_final), both; generate: the prompt's step
as generate(prompt, 1), generate(prompt, --new-tokens), and a decoding step as their difference over
--new-tokens - 1) the table gives each
side's median over rounds of its round medians, in wall time, and this tree / REV: the median over rounds of
the ratio of the round medians (its range over rounds beside it), in wall time and in the process's CPU time
(all threads; less disturbed by other jobs). Writes JSON (default benchmarks/results/ab_<what>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the private helpers
from _common import (CONFIG, QUICK_CONFIG, RESULTS, ROOT, SHAPE_130M, nonnegative_int, positive_int,  # noqa: E402
                     write_result)

STEP_SHAPES = {  # name: (n_layer, batch, seq_len, lr)
    "bench": (4, 8, 512, 1e-3),      # bench_train_step.py's model and batch
    "default": (3, 32, 128, 4e-3),   # the default training run's (tinygrad_ssm/train/config.py)
    "quick": (1, 2, 64, 1e-3),
}
SSD_SHAPE = "8,512,8,64,1,64"        # b, l, h, p, g, n: the training step's scan (one layer)
QUICK_SSD_SHAPE = "1,64,2,8,1,8"
PARTS = {"step": ("forward + loss", "backward", "optimizer", "step"), "ssd": ("forward", "backward", "both"),
         "generate": ("prompt: generate(prompt, 1)", "a decoding step", "generate(prompt, new tokens)")}
GEN_MODELS = {  # --what generate: Mamba2Config's arguments (tied embeddings, float32, random weights)
    "130m": dict(SHAPE_130M, chunk_size=256),                           # bench_pretrained_shape's
    "small": dict(CONFIG, chunk_size=64),                               # bench_generate's
    "quick": dict(QUICK_CONFIG, chunk_size=16),
}

# One side: run in the side's tree; reads the spec (JSON) from argv, builds the work, warms up, then answers
# each "round" line on stdin with one JSON line of timings ("AB " first: other output is ignored).
WORKER = r'''
import tinygrad_ssm as tg  # first: its OpenBLAS settings come before NumPy loads
import json, sys, time
import numpy as np

spec = json.loads(sys.argv[1])
say = lambda obj: print("AB " + json.dumps(obj), flush=True)


def clocks():
    return time.perf_counter(), time.process_time()


def step_work():
    from tinygrad_ssm.optim import AdamW
    n_layer, batch, seq_len, lr = spec["n_layer"], spec["batch"], spec["seq_len"], spec["lr"]
    config = tg.Mamba2Config(d_model=spec["d_model"], n_layer=n_layer, vocab_size=256, d_state=64, headdim=64,
                             expand=2, chunk_size=spec["chunk"])
    kw = {} if spec["backend"] == "auto" else {"backend": spec["backend"]}
    model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=0), **kw)
    opt = AdamW(model.varmap.all_vars(), lr=lr)
    data = np.random.default_rng(0).integers(0, 256, (batch, seq_len + 1))
    losses = []

    def rep():
        w0, c0 = clocks()
        opt.zero_grad()
        loss = model.loss(data[:, :-1], data[:, 1:])
        w1, c1 = clocks()
        loss.backward()
        w2, c2 = clocks()
        opt.step()
        w3, c3 = clocks()
        losses.append(float(loss.item()))
        return {"forward + loss": (w1 - w0, c1 - c0), "backward": (w2 - w1, c2 - c1),
                "optimizer": (w3 - w2, c3 - c2), "step": (w3 - w0, c3 - c0)}
    return rep, lambda: {"first_losses": losses[:3]}


def ssd_work():
    b, l, h, p, g, n = spec["ssd_shape"]
    rng = np.random.default_rng(0)
    f = np.dtype(spec["dtype"])
    arrays = [rng.standard_normal((b, l, h, p)), rng.uniform(0.001, 0.1, (b, l, h)), -rng.uniform(0.5, 2.0, h),
              rng.standard_normal((b, l, g, n)), rng.standard_normal((b, l, g, n)), rng.standard_normal(h)]
    arrays = [a.astype(f) for a in arrays]
    dy = tg.Tensor(rng.standard_normal((b, l, h, p)).astype(f))
    d_final = tg.Tensor(rng.standard_normal((b, h, p, n)).astype(f))
    last = {}

    def rep():
        tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
        w0, c0 = clocks()
        y, state = tg.ssd(*tensors, chunk_size=spec["chunk"], backend=spec["backend"])
        w1, c1 = clocks()
        ((y * dy).sum() + (state * d_final).sum()).backward()
        w2, c2 = clocks()
        last["outputs"] = [y.data, state.data] + [t.grad.data for t in tensors]
        return {"forward": (w1 - w0, c1 - c0), "backward": (w2 - w1, c2 - c1), "both": (w2 - w0, c2 - c0)}

    def check():
        np.savez(spec["outputs"], *last["outputs"])
        return {"outputs": spec["outputs"]}
    return rep, check


def generate_work():
    config = tg.Mamba2Config(**spec["gen_model"], tie_embeddings=True)
    model = tg.Mamba2LMHeadModel(config, tg.VarMap(seed=0), dtype="float32")
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (spec["batch"], spec["prompt_len"]))
    n, last = spec["new_tokens"], {}

    def rep():
        w0, c0 = clocks()
        model.generate(ids, 1, temperature=0)
        w1, c1 = clocks()
        last["tokens"] = model.generate(ids, n, temperature=0)
        w2, c2 = clocks()
        per_step = ((w2 - w1) - (w1 - w0)) / (n - 1), ((c2 - c1) - (c1 - c0)) / (n - 1)
        return {"prompt: generate(prompt, 1)": (w1 - w0, c1 - c0), "a decoding step": per_step,
                "generate(prompt, new tokens)": (w2 - w1, c2 - c1)}
    return rep, lambda: {"tokens": np.asarray(last["tokens"]).tolist()}


rep, check = {"step": step_work, "ssd": ssd_work, "generate": generate_work}[spec["what"]]()
for _ in range(spec["warmup"]):
    rep()
say({"file": tg.__file__, **check()})
while sys.stdin.readline().strip() == "round":
    rep()                                                     # untimed: the caches the other side left
    times = [rep() for _ in range(spec["reps"])]
    say({part: [t[part] for t in times] for part in times[0]})
'''


def git(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, **kwargs)


def revision_tree(rev: str, fresh: bool) -> tuple[str, Path]:
    """(commit, folder holding the tree of `rev`), extracted once per commit with git archive."""
    try:
        commit = git("rev-parse", "--verify", f"{rev}^{{commit}}", text=True).stdout.strip()
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"ab.py: {rev!r} is not a git revision here: {e.stderr.strip()}") from None
    folder = Path(tempfile.gettempdir()) / "tinygrad_ssm_ab" / commit
    if fresh and folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    if not (folder / ".complete").exists():
        staging = folder.with_name(f"{commit}.{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        archive = git("archive", commit).stdout
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)
        (staging / ".complete").write_text(rev + "\n")
        try:
            staging.rename(folder)
        except OSError:                                               # another run extracted it meanwhile
            subprocess.run(["rm", "-rf", str(staging)], check=True)
    return commit, folder


class Side:
    """One side's worker process: started, warmed up, then asked for rounds."""

    def __init__(self, label: str, tree: Path, spec: dict, env: dict):
        self.label, self.tree = label, tree
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(spec)], cwd=tree, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        env={**env, "PYTHONPATH": os.pathsep.join(
                                            [str(tree)] + [p for p in [env.get("PYTHONPATH")] if p])})

    def answer(self) -> dict:
        for line in self.process.stdout:
            if line.startswith("AB "):
                return json.loads(line[3:])
        self.stderr.seek(0)
        raise RuntimeError(f"the {self.label} process ({self.tree}) stopped:\n{self.stderr.read()[-3000:]}")

    def ready(self) -> dict:
        hello = self.answer()
        if not Path(hello["file"]).resolve().is_relative_to(self.tree.resolve()):
            raise RuntimeError(f"the {self.label} process imported tinygrad_ssm from {hello['file']}, not from "
                               f"{self.tree}")
        return hello

    def round(self) -> dict:
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.stderr.close()


def compare_outputs(old: str, new: str) -> float:
    """The largest difference of the two sides' scan outputs and gradients, relative to each array's largest."""
    import numpy as np
    with np.load(old) as a, np.load(new) as b:
        return max(float(np.abs(a[k] - b[k]).max() / max(float(np.abs(a[k]).max()), 1e-30)) for k in a.files)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", required=True, help="the git revision to time this tree against")
    p.add_argument("--what", choices=sorted(PARTS), default="step", help="[%(default)s]")
    p.add_argument("--shape", choices=[s for s in STEP_SHAPES if s != "quick"], default="bench",
                   help="step: the model and batch [%(default)s]")
    p.add_argument("--batch", type=positive_int, help="step: batch size (instead of the shape's); generate: [1]")
    p.add_argument("--seqlen", type=positive_int, help="step: sequence length (instead of the shape's)")
    p.add_argument("--n-layer", type=positive_int, help="step: layers (instead of the shape's)")
    p.add_argument("--d-model", type=positive_int, default=256, help="step: [%(default)s]")
    p.add_argument("--ssd-shape", default=SSD_SHAPE, help="ssd: b,l,h,p,g,n [%(default)s]")
    p.add_argument("--model", choices=[m for m in GEN_MODELS if m != "quick"], default="130m",
                   help="generate: the model's shape [%(default)s]")
    p.add_argument("--prompt-len", type=positive_int, default=16, help="generate: prompt tokens per row [%(default)s]")
    p.add_argument("--new-tokens", type=positive_int, default=33, help="generate: new tokens per call [%(default)s]")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="ssd: [%(default)s]")
    p.add_argument("--chunk", type=positive_int, default=64, help="chunk_size [%(default)s]")
    p.add_argument("--backend", default="auto", help="the scan backend (a name both revisions have) [%(default)s]")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds, the sides taking turns [%(default)s]")
    p.add_argument("--reps", type=positive_int, default=5, help="timed repetitions per side and round [%(default)s]")
    p.add_argument("--warmup", type=nonnegative_int, default=2,
                   help="untimed repetitions first (compilation) [%(default)s]")
    p.add_argument("--threads", type=positive_int, help="every pool's threads in both processes (default: theirs)")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny shapes, 2 rounds of 2 after 1")
    p.add_argument("--fresh", action="store_true", help="extract REV's tree again (and recompile its kernels)")
    p.add_argument("--json", help="where to write (default benchmarks/results/ab_<what>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.reps, args.warmup = 2, 2, 1
    n_layer, batch, seq_len, lr = STEP_SHAPES["quick" if args.quick else args.shape]
    if args.what == "generate" and args.new_tokens < 2:
        raise SystemExit(f"ab.py: --new-tokens must be at least 2 (a decoding step is the difference of "
                         f"generate(prompt, N) and generate(prompt, 1)), got {args.new_tokens}")
    batch = batch if args.what == "step" else 1
    spec = dict(what=args.what, n_layer=args.n_layer or n_layer, batch=args.batch or batch,
                seq_len=args.seqlen or seq_len, lr=lr, d_model=64 if args.quick else args.d_model,
                ssd_shape=[int(v) for v in (QUICK_SSD_SHAPE if args.quick and args.ssd_shape == SSD_SHAPE
                                            else args.ssd_shape).split(",")],
                dtype=args.dtype, chunk=args.chunk, backend=args.backend, warmup=args.warmup, reps=args.reps,
                gen_model=GEN_MODELS["quick" if args.quick else args.model], prompt_len=args.prompt_len,
                new_tokens=args.new_tokens)
    if len(spec["ssd_shape"]) != 6:
        raise SystemExit(f"ab.py: --ssd-shape wants b,l,h,p,g,n, got {args.ssd_shape!r}")
    env = dict(os.environ)
    if args.threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            env[var] = str(args.threads)
    commit, old_tree = revision_tree(args.rev, args.fresh)
    old_label, new_label = f"{args.rev} ({commit[:7]})", "this tree"
    print(f"{args.what}: this tree ({ROOT}) against {old_label} ({old_tree}); starting both sides "
          f"(the first run of a revision compiles its kernels)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"old": Side(old_label, old_tree, dict(spec, outputs=f"{tmp}/old.npz"), env),
                 "new": Side(new_label, ROOT, dict(spec, outputs=f"{tmp}/new.npz"), env)}
        try:
            hello = {name: side.ready() for name, side in sides.items()}
            times = {"old": [], "new": []}                             # per side: per round {part: [(wall, cpu)]}
            for r in range(args.rounds):
                for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    times[name].append(sides[name].round())
                last = PARTS[args.what][-1]
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{sides[n].label} {statistics.median(w for w, _ in times[n][-1][last]):.4f} s"
                    for n in ("old", "new")), flush=True)
        finally:
            for side in sides.values():
                side.close()
        agreement = None
        if args.what == "ssd":
            agreement = compare_outputs(hello["old"]["outputs"], hello["new"]["outputs"])
    rows, per_part = [], {}
    for part in PARTS[args.what]:
        med = {n: [[statistics.median(t[k] for t in rnd[part]) for k in (0, 1)] for rnd in times[n]] for n in times}
        wall = [new[0] / old[0] for old, new in zip(med["old"], med["new"])]
        cpu = [new[1] / old[1] for old, new in zip(med["old"], med["new"])]
        per_part[part] = dict(old_s=statistics.median(m[0] for m in med["old"]),
                              new_s=statistics.median(m[0] for m in med["new"]),
                              ratio_wall=statistics.median(wall), ratio_cpu=statistics.median(cpu),
                              ratios_wall=wall, ratios_cpu=cpu)
        pp = per_part[part]
        rows.append([part, round(pp["old_s"] * 1e3, 3), round(pp["new_s"] * 1e3, 3), round(pp["ratio_wall"], 3),
                     f"{min(wall):.3f}-{max(wall):.3f}", round(pp["ratio_cpu"], 3)])
    if args.what == "step":
        shape = (f"{spec['n_layer']} layers, d_model {spec['d_model']}, batch {spec['batch']} x {spec['seq_len']}, "
                 f"AdamW")
        first = {n: hello[n].get("first_losses") for n in hello}
        check = f"first losses: {old_label} {first['old']}, this tree {first['new']}"
    elif args.what == "ssd":
        shape = "b,l,h,p,g,n = {}, {}".format(",".join(map(str, spec["ssd_shape"])), spec["dtype"])
        check = f"outputs and gradients agree to {agreement:.1e} (relative to each array's largest)"
    else:
        name = "quick" if args.quick else args.model
        model = "Mamba-2 130M's shape" if name == "130m" else f"the {name} model"
        shape = (f"{model}, batch {spec['batch']}, a {spec['prompt_len']}-token prompt, greedy, "
                 f"{spec['new_tokens']} new tokens")
        same = hello["old"]["tokens"] == hello["new"]["tokens"]
        check = f"the two sides generated {'the same' if same else 'DIFFERENT'} tokens"
    what = {"step": "A training step", "ssd": "The scan (tg.ssd)", "generate": "Generation"}[args.what]
    settings = "" if args.what == "generate" else f", chunk {spec['chunk']}, backend {spec['backend']}"
    title = (f"{what}, this tree against {old_label}: {shape}{settings}; {args.rounds} rounds of {args.reps} after "
             f"{args.warmup}")
    notes = ["ms: each side's median over rounds of its round medians; this / REV: the median over rounds of the "
             "ratio of the round medians (wall time, and the process's CPU time over all threads)", check]
    return write_result(args.json or RESULTS / f"ab_{args.what}.json", f"ab_{args.what}", title,
                        ["part", f"{args.rev} ms", "this tree ms", "this / REV", "rounds", "this / REV (cpu)"],
                        rows, notes, rev=args.rev, commit=commit, spec=spec, per_part=per_part, times=times,
                        max_relative_difference=agreement)


if __name__ == "__main__":
    sys.exit(main() and 0)
