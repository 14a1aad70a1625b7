"""The draft's reduced vocabulary for the embedded pair: ``python -m tools.draft_vocab``.

The draft only proposes, so restricting its output layer to the tokens the target actually writes
changes nothing in SD's output and removes most of the draft's largest matrix (151,936 rows). The
list ranks tokens by their frequency in the target's own calibration answers (``python -m csd
calibrate --vocab-out``), then in the shipped text corpus (Python's documentation and sources);
``default`` rows are used unless ``--draft-vocab N`` says otherwise. Special tokens are always
added at load time (``csd.models.draft_vocab_ids``).
"""
from __future__ import annotations

import argparse
from collections import Counter

from csd.embedded import prepare_embedded
from csd.fileio import read_json, write_json
from csd.models import DRAFT_VOCAB_FILE
from csd.pair import EMBEDDED_PAIR_ID

DEFAULT_SIZE = 32768


def corpus_counts(tokenizer) -> Counter:
    from csd.corpus import default_corpus
    counts: Counter = Counter()
    for text in default_corpus():
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def build(answer_counts: dict[int, int], corpus: Counter, size: int = DEFAULT_SIZE) -> dict:
    """Token ids ranked: every token of the answers by frequency, then the corpus's by frequency."""
    ranked = [t for t, _ in sorted(answer_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    seen = set(ranked)
    ranked += [t for t, _ in corpus.most_common() if t not in seen]
    total = sum(corpus.values())
    top = set(ranked[:size])
    coverage = sum(c for t, c in corpus.items() if t in top) / total if total else None
    return {"pair": EMBEDDED_PAIR_ID, "ids": ranked, "default": size,
            "source": "target answers of the prompt-mode calibration, then the shipped text corpus",
            "corpus_coverage_at_default": coverage}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.draft_vocab", description=__doc__.splitlines()[0])
    ap.add_argument("--answers", required=True, nargs="+", help="token frequencies written by `calibrate --vocab-out`")
    ap.add_argument("--out", default=str(DRAFT_VOCAB_FILE))
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE, help=f"rows used by default (default {DEFAULT_SIZE})")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer
    answers: Counter = Counter()
    for path in args.answers:
        data = read_json(path)
        answers.update({int(t): int(c) for t, c in zip(data["ids"], data["counts"])})
    tok = AutoTokenizer.from_pretrained(prepare_embedded("target"))
    result = build(answers, corpus_counts(tok), args.size)
    write_json(args.out, result)
    print(f"{len(result['ids'])} ranked tokens ({len(answers)} seen in answers); the first {args.size} cover "
          f"{100 * result['corpus_coverage_at_default']:.2f}% of the corpus's tokens; written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
