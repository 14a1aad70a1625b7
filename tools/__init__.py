"""Measurement scripts, run from a checkout (``python -m tools.NAME``); not installed. Those whose
figures are committed under docs/bench were removed; ``git show cbc7ebb:tools/NAME.py`` has them."""
