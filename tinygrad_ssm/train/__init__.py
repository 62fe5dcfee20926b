"""The application: `python -m tinygrad_ssm train / generate / eval / export` (cli.py, its output errors in
output_errors.py), the training loop (loop.py), its step (step.py) and its settings (config.py, checks.py),
where a run starts from (starting_point.py: fresh, --init-from, the tokenizer), checkpoints (checkpoint.py), the
run folder and its log (run_folder.py, log.py), the corpus (data.py), generation from a model folder
(generate.py), eval's scoring (scoring.py), a model folder written for transformers or mamba_ssm (export.py). The
library never imports it."""
from .config import TrainConfig
from .loop import TrainingDiverged, train

__all__ = ["TrainConfig", "TrainingDiverged", "train"]
