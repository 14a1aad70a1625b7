"""``grade``: grade one answer to one benchmark item with exactly the benchmark's graders; prints one JSON
object (its fields: docs/grading.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GRADED = ("gsm8k", "humaneval", "champ")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "grade", help="grade one answer to one gsm8k, humaneval or champ item, as the benchmark does",
        description="Grade the answer in --answer-file against one item with the benchmark's own grader "
                    "(csd.evaluation.graders.grade) and print the result as one JSON object.")
    p.add_argument("--dataset", required=True, help=f"one of {', '.join(GRADED)}")
    p.add_argument("--item", required=True,
                   help="item id: gsm8k/N (N = line number in the GSM8K file, from 0), HumanEval/N, "
                        "or a CHAMP problem identifier such as P_Combinatorics_1")
    p.add_argument("--answer-file", required=True, help="file holding the model's answer; - reads stdin")
    p.set_defaults(func=cmd_grade)
    return p


def read_answer(path: str) -> str:
    """The answer text from a file or, for '-', from stdin; a ValueError says why it cannot be read."""
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"cannot read the answer file {path!r}: {reason}") from None


def cmd_grade(args) -> int:
    from csd.evaluation.datasets import DatasetError, get_item
    from csd.evaluation.graders import grade

    if args.dataset not in GRADED:
        raise DatasetError(f"cannot grade dataset {args.dataset!r}: choose {', '.join(GRADED)}")
    item = get_item(args.dataset, args.item)
    text = read_answer(args.answer_file)
    g = grade(item, text)
    print(json.dumps({"dataset": item.dataset, "item_id": item.item_id, "reference": item.reference,
                      "correct": g.correct, "predicted": g.predicted, "detail": g.detail}, ensure_ascii=False))
    return 0
