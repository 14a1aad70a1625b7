"""CSD Explorer. ``csd`` is the engine (the rule, the loop, the models); beside it stand the store
(``csd.db``), the app (``csd.ui``), the command line (``csd.cli``), the benchmark (``csd.bench``) and
the evaluation it grades with (``csd.evaluation``).

In a checkout those five live in top-level folders (``db/``, ``ui/``, ``cli/``, ``bench/``,
``evaluation/``) beside ``csd/``; the wheel installs them inside ``csd`` (pyproject.toml's
``package-dir``), so that it puts no other top-level name into site-packages. Here the checkout's
root joins this package's path, so ``csd.ui`` is ``ui/`` in both.
"""
import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) and not _os.path.isdir(
        _os.path.join(__path__[0], "ui")):
    __path__.append(_ROOT)
