"""CSD Explorer. ``csd`` is the engine; beside it stand ``csd.db``, ``csd.ui``, ``csd.cli``, ``csd.bench``
and ``csd.evaluation``: top-level folders in a checkout (whose root joins this package's path here),
inside ``csd`` in the wheel (pyproject.toml's ``package-dir``).
"""
import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) and not _os.path.isdir(
        _os.path.join(__path__[0], "ui")):
    __path__.append(_ROOT)
