"""python -m tinygrad_ssm: see train/cli.py."""
import sys

try:
    from .train.cli import main  # numba and the kernels load here: a second or more
except KeyboardInterrupt:        # Ctrl-C meanwhile: exit 130 (train/output_errors.py's), as later, no traceback
    sys.exit(130)
sys.exit(main())
