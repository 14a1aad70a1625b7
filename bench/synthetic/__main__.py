"""``python -m csd.bench.synthetic``: the synthetic benchmark on its own (see ``csd.bench.synthetic.cli``)."""
import sys

from .cli import main

sys.exit(main())
