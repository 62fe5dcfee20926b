"""The application: `python -m tinygrad_ssm train / generate` (cli.py), the training loop (loop.py) and its
settings (config.py, checks.py), checkpoints (checkpoint.py), the run folder and its log (run_folder.py,
log.py), the byte corpus (data.py), generation from a checkpoint (generate.py). The library never imports it."""
from .config import TrainConfig
from .loop import TrainingDiverged, train

__all__ = ["TrainConfig", "TrainingDiverged", "train"]
