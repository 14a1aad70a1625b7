"""The command line, ``python -m csd generate|calibrate|prepare|bench|grade|memory|runs`` (installed: ``csd ...``):
the one place that composes the engine, the store and the benchmark. The heavy imports (torch, transformers,
sqlalchemy) happen inside the commands, so ``--help`` is quick."""
from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from csd.config import ConfigError  # noqa: E402
from csd.db.cli import add_runs_parser  # noqa: E402
from csd.memory import MemoryFileError  # noqa: E402

from . import bench, engine, grade, memory  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    prog = "csd" if os.path.basename(sys.argv[0]) == "csd" else "python -m csd"   # the console script, or -m
    ap = argparse.ArgumentParser(prog=prog, description="Calibrated Speculative Decoding explorer")
    sub = ap.add_subparsers(dest="command", required=True)
    engine.add_parsers(sub)     # generate, calibrate, prepare
    bench.add_parser(sub)       # bench
    grade.add_parser(sub)       # grade
    memory.add_parser(sub)      # memory export | import (SGLang's CSD table)
    add_runs_parser(sub)        # runs list | export (the store's own parser)
    return ap


log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # what was typed (a preset refuses its flags)
    logging.basicConfig(level=os.environ.get("CSD_LOG_LEVEL", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    from csd.runtime.pair import ModelLoadError
    try:
        return args.func(args) or 0
    except (ConfigError, ModelLoadError, MemoryFileError, ValueError, FileNotFoundError) as e:
        log.debug("command failed", exc_info=True)        # CSD_LOG_LEVEL=DEBUG shows the traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return 130
