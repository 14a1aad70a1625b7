"""The shipped calibration prompt set: ``python -m csd.evaluation.calibration_set [--out FILE]``.
Math, code and prose prompts for prompt-mode calibration, none sharing an ``NGRAM``-word run with an evaluation
item, one in ``HELDOUT_EVERY`` held out (docs/calibration.md)."""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sysconfig
from collections import Counter
from pathlib import Path

from csd.corpus import PROMPTS_FILE, pydoc_topics

from .datasets import HUMANEVAL_PROMPT, LOADERS, PROSE_EXCERPT_CHARS, _passages, load_gsm8k

NGRAM = 8
HELDOUT_EVERY = 7
CODE_TASKS = 180
DOC_PASSAGES = 120

DOC_TEMPLATES = (
    "Rewrite the following excerpt from the Python documentation as a short tutorial section for "
    "newcomers:\n\n{text}",
    "What are the key points of this documentation excerpt? Answer in a few sentences of plain prose.\n\n{text}",
)
SUBJECT_TEMPLATES = (
    "Write a short paragraph about {s}.",
    "Explain {s} to a curious ten-year-old in a few sentences.",
    "Write a brief, friendly email to a colleague about {s}.",
    "Give three practical tips about {s}, each in one or two sentences.",
)
SUBJECTS = (
    "why the sky is blue", "how bread rises", "the water cycle", "learning a second language", "keeping a garden",
    "how bicycles stay upright", "the history of the printing press", "why cats purr", "saving money each month",
    "how vaccines train the immune system", "planning a weekend hike", "the phases of the moon",
    "how a refrigerator keeps food cold", "writing a good cover letter", "the importance of sleep",
    "how bees make honey", "recycling plastic", "the first steps of a marathon training plan",
    "how tides work", "making a good cup of coffee", "why leaves change colour in autumn", "public libraries",
    "how airplanes fly", "teamwork in a small office", "the life of a lighthouse keeper", "volcanoes",
    "how to give constructive feedback", "the benefits of walking to work", "how a compass works",
    "organising a community clean-up", "the invention of the telephone", "caring for a houseplant",
    "why we have seasons", "how rainbows form", "cooking rice perfectly", "the role of a museum curator",
    "how earthquakes are measured", "choosing a good book for a long trip", "the night sky in winter",
    "how solar panels make electricity", "a visit to a farmers' market", "the habits of octopuses",
    "preparing for a job interview", "how a river shapes a valley", "learning to play the piano as an adult",
    "keeping a journal", "how snowflakes form", "the migration of birds", "working from home productively",
    "the history of the bicycle", "how a camera lens focuses light", "what makes a good friendship",
    "reducing food waste at home", "how chess openings work", "the role of fungi in a forest",
    "time management for students", "how a lock and key work", "why the ocean is salty",
    "the joy of baking with children", "how glaciers move",
)
ROOT_MODULES_SKIP = ("test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "pydoc_data", "tkinter")


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The runs of ``n`` words of a text, lower-cased."""
    w = re.findall(r"\w+", text.lower())
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def eval_ngrams() -> set[tuple[str, ...]]:
    """The word n-grams of every evaluation item's own content (instruction templates excluded)."""
    names = ("gsm8k", "humaneval", "champ", "prose")                    # gsm8k: its eval split
    return {g for name in names for it in LOADERS[name]() for g in ngrams(it.content or it.prompt)}


def _hash(s: str) -> int:
    return int(hashlib.sha1(s.encode()).hexdigest(), 16)


def math_prompts() -> list[dict]:
    return [{"id": it.item_id, "kind": "math", "source": "GSM8K test, calibration split",
             "prompt": it.prompt, "content": it.content} for it in load_gsm8k("calibration")]


def _stdlib_functions() -> list[tuple[str, str]]:
    """(id, stub) for public top-level functions of pure-Python stdlib modules with a docstring."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0].startswith(ROOT_MODULES_SKIP) or any(p.startswith(("_", "test")) for p in rel.parts) \
                or "site-packages" in rel.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
                continue
            doc = ast.get_docstring(node)
            if not doc or not 60 <= len(doc) <= 700 or "deprecated" in doc.lower():
                continue
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            body = "\n".join(("    " + line) if line else "" for line in doc.splitlines())
            stub = f'def {node.name}({ast.unparse(node.args)}){returns}:\n    """{body.strip()}\n    """\n'
            out.append((f"stdlib/{'.'.join(rel.with_suffix('').parts)}.{node.name}", stub))
    return out


def code_prompts(limit: int = CODE_TASKS) -> list[dict]:
    funcs = sorted(_stdlib_functions(), key=lambda f: _hash(f[0]))
    return [{"id": fid, "kind": "code", "source": "Python standard library docstrings",
             "prompt": HUMANEVAL_PROMPT.format(prompt=stub), "content": stub} for fid, stub in funcs[:limit * 2]]


def prose_prompts(limit: int = DOC_PASSAGES) -> list[dict]:
    rows = []
    for name, text in pydoc_topics("calibration"):
        for k, passage in enumerate(_passages(text, PROSE_EXCERPT_CHARS)):
            pid = f"pydoc/{name}/{k}"
            rows.append({"id": pid, "kind": "prose", "source": "Python documentation topics, calibration split",
                         "prompt": DOC_TEMPLATES[_hash(pid) % len(DOC_TEMPLATES)].format(text=passage),
                         "content": passage})
    rows = sorted(rows, key=lambda r: _hash(r["id"]))[:limit * 2]
    return rows + [{"id": f"subject/{i}/{j}", "kind": "prose", "source": "written for this project",
                    "prompt": template.format(s=subject), "content": template.format(s=subject)}
                   for i, subject in enumerate(SUBJECTS) for j, template in enumerate(SUBJECT_TEMPLATES)
                   if (i + j) % 2 == 0]          # two of the four requests per subject


def build() -> list[dict]:
    """The prompt set, in a fixed order, each with its split."""
    banned = eval_ngrams()
    out = []
    for rows, limit in ((math_prompts(), None), (code_prompts(), CODE_TASKS), (prose_prompts(), None)):
        kept = [r for r in rows if not (ngrams(r["content"]) & banned)]
        for r in kept[:limit]:
            split = "heldout" if _hash(r["id"]) % HELDOUT_EVERY == 0 else "calibration"
            out.append({"id": r["id"], "kind": r["kind"], "split": split, "source": r["source"], "prompt": r["prompt"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csd.evaluation.calibration_set", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(PROMPTS_FILE), help=f"where to write the JSONL (default {PROMPTS_FILE})")
    args = ap.parse_args(argv)
    rows = build()
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    counts = Counter((r["kind"], r["split"]) for r in rows)
    print(f"{len(rows)} prompts written to {args.out}: "
          + ", ".join(f"{k} {s} {n}" for (k, s), n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
