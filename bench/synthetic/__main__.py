"""``python -m bench.synthetic``: the synthetic benchmark on its own (see ``bench.synthetic.cli``)."""
import sys

from .cli import main

sys.exit(main())
