"""The settings of a training run (TrainConfig) and what may change on --resume (their checks: train/checks.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .checks import flag

VOCAB_SIZE = 256  # bytes


@dataclass
class TrainConfig:
    """Everything that defines a run. The defaults are the README's first command: about four minutes on 2 cores.

    How they were chosen (measured on the default corpus, 2 cores). At equal bytes per step, more and shorter
    sequences learn faster in a run this short: validation after 100 steps was 2.35 bits per byte for 8 x 512,
    2.27 for 16 x 256, 2.16 for 32 x 128 (64 x 64 was behind 32 x 128 again: 1.98 against 1.95 at step 200 of
    450). Peak lr 4e-3 beat 3e-3 and 6e-3 (6e-3 ended level with it after 450 steps: 1.728 against 1.727).
    Chunk 64: the fastest at seq_len 128.
    The model: in four minutes a model this small sees about two bytes per parameter, far from the data it
    could use, so fewer layers and more steps win. Final validation for d_model 256, headdim 64:
      4 layers, d_state 64 (1.79M parameters, ~0.48 s a step): 1.727 after 450 steps, 1.687 after 550
      4 layers, d_state 32: 1.732 after 450, 1.698 after 520 (a step 0.88x as long)
      3 layers, d_state 64 (1.36M parameters, ~0.40 s a step): 1.703 after 580, 1.685 after 640
      3 layers, d_state 32: 1.711 after 640 (0.36 s a step)
      2 layers: 1.906 at step 360 of 700, against 1.826 for 3 layers: dropped
    600 steps of the 3-layer model and 12 evaluations: 1.692 in 4 min 16 s once numba's kernels were compiled,
    3 min 40 s since page faults went (fast/heap_reuse.py), 4 min 2 s on a fresh clone with the install and the
    compilation; 3 min 59 s (the README's figures) on a slower day, when the kernels of the step's other parts
    made a step 0.88x the previous one's (benchmarks/bench_step_ab.py, interleaved): left at 600, so the
    README's command stays within four minutes. On a slow hour of the shared machine (10,632 tokens/s against
    11,824) the same 600 steps took 4 min 27 s on a fresh clone: the machine's speed, not the code's (a step
    0.96-0.99x the previous release's, interleaved); the release after, 3 min 57 s and 12,004 tokens/s.
    With the chunked scan backward (scan/numba_chunked.py, a step 0.90x) 660 steps take the wall time 600 took:
    1.679 against 1.692 (and 720 steps 1.670), so the default is 660. On a fast hour of the machine the 660 steps
    took 2 min 42 s with the kernels compiled; expect about four minutes on a fresh clone at a normal hour, more
    at a slow one. Before the
    scan and fused kernels the engine-op path trained 150 steps of the 4-layer model to 2.02 in that time; with
    the kernels of the release before, 300 steps to 1.80.
    """

    # data
    data: str | None = None  # None: the running interpreter's standard library sources
    data_seed: int = 0  # file order and train/validation split; separate from `seed` so runs compare
    val_fraction: float = 0.05
    # model
    d_model: int = 256
    n_layer: int = 3
    d_state: int = 64
    headdim: int = 64
    chunk_size: int = 64  # SSD chunk: 64 is ~3x faster than the official 256 at seq_len 512 on CPU
    dtype: str = "float32"  # of the weights; float64 for exact comparisons
    # optimisation
    steps: int = 660
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 4e-3
    min_lr: float | None = None  # None: lr / 10
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0  # weight init and batch sampling
    backend: str = "auto"
    # bookkeeping
    out: str = ""  # run folder; "" -> runs/mamba2-<date>-<time>
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    sample_bytes: int = 300
    sample_prompt: str = ""  # "" -> the first line of the validation text (see data.sample_prompt_from)

    # flags that may differ on --resume without changing the weights the run produces
    RESUME_SAFE = ("out", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "sample_bytes",
                   "sample_prompt", "backend")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"TrainConfig: unknown fields {sorted(unknown)}")
        return cls(**d)


def _resume_config(saved: dict, overrides: dict) -> TrainConfig:
    cfg = TrainConfig.from_dict(saved)
    changed = {k: v for k, v in overrides.items() if getattr(cfg, k) != v}
    bad = sorted(k for k in changed if k not in TrainConfig.RESUME_SAFE and k != "steps")
    if bad:
        raise ValueError("--resume continues the saved run; these settings differ from it and would change "
                         "what it computes: " + ", ".join(f"{flag(k)} (saved {getattr(cfg, k)!r}, given "
                                                          f"{changed[k]!r})" for k in bad))
    return dataclasses.replace(cfg, **changed)
