"""``runs list`` and ``runs export`` for the command line (hooked into ``python -m csd``)."""
from __future__ import annotations

import argparse
import sys

from csd.db.analytics import Filter, export_csv, export_jsonl, runs_list
from csd.db.store import Store


def add_runs_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``runs list`` and ``runs export RUN_ID --format csv|jsonl [--out FILE]`` (each with --db)."""
    runs = subparsers.add_parser("runs", help="list and export recorded runs")
    sub = runs.add_subparsers(dest="runs_command", metavar="{list,export}", required=True)
    # SUPPRESS: a --db given to a parent parser is not overwritten by these defaults.
    db = dict(metavar="URL|FILE", default=argparse.SUPPRESS,
              help="SQLAlchemy database URL or a SQLite file's path (default: $CSD_DB_URL, else a SQLite file in "
                   "the user data dir)")

    p = sub.add_parser("list", help="the latest runs, newest first")
    p.add_argument("--db", **db)
    p.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    p.set_defaults(func=cmd_runs_list)

    p = sub.add_parser("export", help="a run's token events as CSV or JSON lines")
    p.add_argument("run_id", type=int)
    p.add_argument("--db", **db)
    p.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    p.add_argument("--out", metavar="FILE", help="output file (default: stdout)")
    p.set_defaults(func=cmd_runs_export)
    return runs


def _fmt(v) -> str:
    """A table cell: a dash for a missing value, a float in its shortest form (0.5, not 0.500000)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _cell(column: str, value) -> str:
    """A run's value as the list shows it: the time to the second, gamma "auto" (stored as 0) by name."""
    if column == "created_at" and value is not None:
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if column == "gamma" and value == 0:
        return "auto"
    return _fmt(value)


def cmd_runs_list(args) -> int:
    if getattr(args, "limit", 20) < 1:
        raise ValueError("--limit must be at least 1")
    with Store.open(getattr(args, "db", None)) as store:
        runs = runs_list(store, getattr(args, "limit", 20))
    cols = ("id", "created_at", "kind", "method", "pair_id", "representation", "gamma", "lam", "tau", "lookup",
            "status", "n_events", "label")
    table = [cols] + [tuple(_cell(c, r[c]) for c in cols) for r in runs]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return 0


def cmd_runs_export(args) -> int:
    export = export_csv if args.format == "csv" else export_jsonl
    out = getattr(args, "out", None)
    with Store.open(getattr(args, "db", None)) as store:
        if store.get_run(args.run_id) is None:
            print(f"no run {args.run_id} in {store.engine.url.render_as_string(hide_password=True)}",
                  file=sys.stderr)
            return 1
        n = export(store, Filter(run_ids=(args.run_id,)), sys.stdout if out in (None, "-") else out)
    if out not in (None, "-"):
        print(f"{n} events of run {args.run_id} written to {out}", file=sys.stderr)
    return 0
