"""What the benchmark's modules share: atomic JSON, figures as text, the time stamp, the command line."""
from __future__ import annotations

import gzip
import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from csd.events import Progress  # noqa: F401 (the benchmark's modules take it from here)
from csd.fileio import atomic_write, read_maybe_gzip

DASH = "–"                                # a figure that was not measured


def write_json(path: str | os.PathLike, data) -> Path:
    """``data`` as indented UTF-8 JSON, atomically: a killed process leaves the previous file or the
    new one, never half of one. A path ending in .gz is written gzipped (a committed run re-rendered)."""
    raw = json.dumps(data, indent=1, ensure_ascii=False).encode("utf-8")
    return atomic_write(path, gzip.compress(raw, mtime=0) if str(path).endswith(".gz") else raw)


def write_outputs(out: str | os.PathLike, name: str, data, text: str) -> None:
    """A tool's outputs: ``out``/``name``.json (``data``) and .md (``text``, also printed)."""
    write_json(Path(out) / f"{name}.json", data)              # atomic_write makes the folder
    (Path(out) / f"{name}.md").write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    print(text)


def read_results_json(path: Path):
    """A run's ``results.json`` from its directory or the file; a committed run (docs/bench) may hold it
    gzipped as ``results.json.gz``, read the same way."""
    if path.is_dir():
        path = path / "results.json" if (path / "results.json").exists() or not (path / "results.json.gz").exists() \
            else path / "results.json.gz"
    return path, json.loads(read_maybe_gzip(path))


def fmt(x, spec: str = ".2f", suffix: str = "", none: str = DASH) -> str:
    """A figure as text: ``fmt(1.234) == "1.23"``, ``fmt(2, ".1f", "x") == "2.0x"``, ``none`` for None."""
    return none if x is None else f"{x:{spec}}{suffix}"


def pct(x, nd: int = 1, none: str = DASH) -> str:
    """A share as a percentage: ``pct(0.1234) == "12.3%"``, ``none`` for None."""
    return none if x is None else f"{100 * x:.{nd}f}%"


def ratio_text(value: float | None, ci=None, none: str = DASH) -> str:
    """A speed-up as every table writes it: ``1.64x (1.49-1.94)``, the ratio of tok/s with its interval
    (left out where there is none), ``none`` where it was not measured."""
    if value is None:
        return none
    return f"{value:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


def ratio(stats: dict, key: str, none: str = DASH) -> str:
    """``ratio_text`` of a summary's speed-up ``key`` and its ``key + "_ci95"``."""
    return ratio_text(stats.get(key), stats.get(key + "_ci95"), none)


def md_table(head: list, rows, left: int = 1) -> list[str]:
    """A Markdown table's lines, ``head`` then ``rows`` (lists of cells): the first ``left`` columns
    left-aligned, the others (figures) right-aligned."""
    def line(cells) -> str:
        return "| " + " | ".join(map(str, cells)) + " |"
    return [line(head), "|" + "---|" * left + "---:|" * (len(head) - left), *map(line, rows)]


def now() -> str:
    """The time stamp of the outputs: UTC, to the second, ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def machine(device, name_key: str = "cpu") -> dict:
    """A run's ``meta.machine``: the processor (or GPU) under ``name_key``, the threads and the versions."""
    import torch
    import transformers

    from csd.runtime.profile import machine_name

    return {name_key: machine_name(device), "device": str(device), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command as typed, for the record: ``python -m MODULE ARGS`` (``argv``: the arguments given to main)."""
    return f"python -m {module} {shlex.join(sys.argv[1:] if argv is None else argv)}".strip()
