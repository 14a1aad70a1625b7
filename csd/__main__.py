"""``python -m csd ...``: the command line lives in the top-level ``cli`` package, which composes
the engine with the store and the benchmark (the engine itself never imports them)."""
import sys

from csd.cli import main

sys.exit(main())
