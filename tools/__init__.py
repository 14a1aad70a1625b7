"""One-off measurement scripts, run from a checkout (``python -m tools.NAME``); not installed.
Each wrote figures that docs/ cites; they stay to measure again on another machine."""
