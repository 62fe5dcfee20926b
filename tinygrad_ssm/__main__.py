"""python -m tinygrad_ssm: see cli.py."""
import sys

from .cli import main

sys.exit(main())
