"""The corpus reader's old name, kept while ``ui/tabs/explore.py`` and ``cli/engine.py`` still import it:
the reader is ``csd.corpus`` (the runtime reads it too, and the runtime never imports ``csd.calibration``).
Remove this module once nothing imports ``csd.calibration.corpus``."""
from ..corpus import PROMPTS_FILE, default_corpus, pydoc_topics, read_corpus, read_prompts, stdlib_sources

__all__ = ["PROMPTS_FILE", "default_corpus", "pydoc_topics", "read_corpus", "read_prompts", "stdlib_sources"]
