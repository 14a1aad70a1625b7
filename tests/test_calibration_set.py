"""The shipped calibration prompt set: reproducible from what ships here, and disjoint from every
evaluation item of every dataset the benchmark uses (no shared run of 8 words)."""
import json
from collections import Counter

import pytest

from csd.corpus import PROMPTS_FILE, read_prompts
from csd.evaluation import calibration_set as C
from csd.evaluation.datasets import gsm8k_split, load_dataset


@pytest.fixture(scope="module")
def shipped():
    return [json.loads(line) for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_shipped_file_is_what_the_builder_makes(shipped):
    assert shipped == C.build(), "rebuild it: python -m csd.evaluation.calibration_set"


def test_no_word_8gram_shared_with_any_evaluation_item(shipped):
    banned = C.eval_ngrams()
    assert len(banned) > 50_000                  # the check has something to bite on
    for row in shipped:
        shared = C.ngrams(row["prompt"]) & banned
        # the benchmark's own instructions ("Solve the following math problem step by step ...") are
        # shared on purpose; the item's content is not
        content = row["prompt"].split("\n\n", 1)[-1]
        assert not (C.ngrams(content) & banned), (row["id"], sorted(shared)[:3])
    # and the check would catch a leak: an evaluation question is caught by it
    leak = load_dataset("gsm8k", 1)[0].content
    assert C.ngrams(leak) & banned


def test_kinds_splits_and_the_benchmark_never_draws_them(shipped):
    kinds = Counter((r["kind"], r["split"]) for r in shipped)
    for kind in ("prose", "code", "math"):
        assert kinds[(kind, "calibration")] >= 100 and kinds[(kind, "heldout")] >= 15
    ids = {r["id"] for r in shipped}
    assert len(ids) == len(shipped)
    math_ids = {r["id"] for r in shipped if r["kind"] == "math"}
    assert all(gsm8k_split(i) == "calibration" for i in math_ids)
    assert not math_ids & {it.item_id for it in load_dataset("gsm8k", None)}
    assert len(read_prompts(PROMPTS_FILE, "calibration")) + len(read_prompts(PROMPTS_FILE, "heldout")) == len(shipped)
    assert {it.item_id for it in load_dataset("heldout", None)} == {r["id"] for r in shipped if r["split"] == "heldout"}
