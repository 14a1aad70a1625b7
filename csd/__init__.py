"""CSD Explorer. ``csd`` is the engine; beside it stand ``csd.db``, ``csd.ui``, ``csd.cli``, ``csd.bench``
and ``csd.evaluation``: top-level folders in a checkout, inside ``csd`` once installed. One mapping names
them both ways, pyproject.toml's ``package-dir``: the wheel copies by it, and a checkout reaches them by it
through the editable install of the README's set-up (``pip install -r requirements.txt -e .``).
"""
