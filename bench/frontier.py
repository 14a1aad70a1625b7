"""The committed frontiers the app's Analyse tab shows (lambda / tau: ``frontier.json``; every
acceptance rule's: ``rivals.json``), shipped as package data in ``csd/bench/data/``. The app calls only this module."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .report import frontier_figure as _figure
from .report import frontier_markdown
from .rivals import figure as rivals_figure  # noqa: F401 (every acceptance rule's speed-up against accuracy)
from .rivals import markdown as rivals_table  # noqa: F401 (its Markdown, the data's text through ``escape``)

DATA = Path(__file__).resolve().parent / "data"
FRONTIER_FILE = DATA / "frontier.json"
RIVALS_FILE = DATA / "rivals.json"

log = logging.getLogger(__name__)


def load(path: str | Path) -> dict | None:
    """A frontier file's data (a dict with a list of ``points``), or None if absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("cannot read the frontier file %s", path, exc_info=True)
        return None
    return data if isinstance(data, dict) and isinstance(data.get("points"), list) else None


def frontier_figure(data: dict):
    """One point per setting of the sweep: tokens per second against accuracy (a Plotly figure)."""
    return _figure(data["points"], data.get("meta"))


def frontier_table(data: dict, escape=str) -> str:
    """The frontier's figures as a Markdown table, the data's text passed through ``escape``."""
    return frontier_markdown(data["points"], data.get("meta"), escape=escape)
