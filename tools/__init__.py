"""Measurement scripts, run from a checkout (``python -m tools.NAME``); not installed. Those whose
figures are committed under docs/bench and that no open issue still measures with were removed
(``git show cbc7ebb:tools/NAME.py`` and ``git show c9a328b:tools/NAME.py`` have them)."""
