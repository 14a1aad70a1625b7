"""What calibration reads (``csd.calibration.calibrate``), files only: the shipped prompts (``calibration`` and
``heldout`` splits, built by ``python -m csd.evaluation.calibration_set``) or a user's file; and text:
Python's documentation topics (3 in 4; the rest are the prose benchmark's) and standard-library sources.

It lives beside the paper, not inside ``csd.calibration``, because the runtime reads the same prompts
(``csd.runtime.smoothing`` measures its maxima on them) and the runtime never imports calibration,
which itself imports the runtime."""
from __future__ import annotations

import hashlib
import json
import sysconfig
from itertools import zip_longest
from pathlib import Path

PROMPTS_FILE = Path(__file__).parent / "data" / "calibration_prompts.jsonl"


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {what} {str(path)!r}: {e}") from None


def _json_lines(path: Path, raw: str):
    """(line number, object) of each non-blank line of a JSONL file."""
    for n, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{n}: not valid JSON") from None


def read_prompts(path: str | Path = PROMPTS_FILE, split: str | None = "calibration") -> list[dict]:
    """Prompts as dicts (``prompt``, optional ``id``, ``kind``, ``split``) from JSONL or a text file
    (one prompt per line). ``split``: keep only that split of a file that has one (None: all)."""
    path = Path(path)
    raw = _read(path, "prompts")
    if path.suffix not in (".jsonl", ".ndjson"):
        rows = [{"prompt": line.strip()} for line in raw.splitlines() if line.strip()]
    else:
        rows = []
        for n, obj in _json_lines(path, raw):
            if isinstance(obj, str):
                obj = {"prompt": obj}
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt") or obj.get("text"), str):
                raise ValueError(f"{path}:{n}: expected an object with a 'prompt' string")
            obj.setdefault("prompt", obj.get("text"))
            rows.append(obj)
    if split is not None and any("split" in r for r in rows):
        rows = [r for r in rows if r.get("split") == split]
    if not rows:
        raise ValueError(f"{str(path)!r} holds no prompts" + (f" in split {split!r}" if split else ""))
    return rows


def _topic_split(name: str) -> str:
    """Deterministic split of pydoc topics: 1 in 4 is held out for the prose benchmark."""
    return "eval" if int(hashlib.sha1(name.encode()).hexdigest(), 16) % 4 == 0 else "calibration"


def pydoc_topics(split: str) -> list[tuple[str, str]]:
    from pydoc_data.topics import topics
    return [(k, topics[k]) for k in sorted(topics) if _topic_split(k) == split]


def stdlib_sources(limit: int | None = None) -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.glob("*.py")) if not p.name.startswith(("test", "_"))]
    out = []
    for p in files[:limit]:
        try:
            out.append((p.name, p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return out


def default_corpus() -> list[str]:
    """Prose and code, interleaved so that any prefix of the corpus mixes both."""
    prose = [t for _, t in pydoc_topics("calibration")]
    code = [t for _, t in stdlib_sources()]
    return [t for both in zip_longest(prose, code) for t in both if t is not None]


def read_corpus(path: str | Path) -> list[str]:
    """A text file (one document) or JSONL (a "text" field, or the first string field, per line)."""
    path = Path(path)
    raw = _read(path, "corpus")
    if path.suffix in (".jsonl", ".ndjson"):
        texts = []
        for _n, obj in _json_lines(path, raw):
            text = obj.get("text") if isinstance(obj, dict) else obj
            if not isinstance(text, str) and isinstance(obj, dict):
                text = next((v for v in obj.values() if isinstance(v, str)), None)
            if isinstance(text, str) and text.strip():
                texts.append(text)
    else:
        texts = [raw] if raw.strip() else []
    if not texts:
        raise ValueError(f"corpus {str(path)!r} holds no text")
    return texts
