"""``memory export`` / ``memory import``: a correction memory as SGLang's CSD table and back
(``csd.calibration.sglang_table``; the format and what SGLang does with it: docs/scale.md). Neither loads a model."""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

from csd.config import LAM, TAU

from .common import number

# the tau written as SGLang's prob_ratio: any number above 0, as export took it (a run's tau is at most 1)
TABLE_TAU = replace(TAU, hi=None)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("memory", help="export a correction memory as an SGLang CSD table, or import one",
                              description="Move a correction memory to and from SGLang's CSD runtime "
                                          "(--speculative-csd-table-path). No model is loaded.")
    sub = p.add_subparsers(dest="memory_command", required=True)

    ex = sub.add_parser("export", help="write a memory (the shipped one by default) as an SGLang CSD table",
                        description="Write every pattern of the memory as an SGLang table entry (key, lhs_token "
                                    "= the draft's token, rhs_token = the target's, freq = its count, allow). "
                                    "The metadata names the pair, the tokenizer and lambda.")
    ex.add_argument("file", metavar="FILE.json|FILE.jsonl", help="the table to write (JSON lines for .jsonl)")
    ex.add_argument("--format", required=True, choices=["sglang"], help="the table format (sglang)")
    ex.add_argument("--memory", default=None, help="memory file to export (default: the shipped memory)")
    ex.add_argument("--lam", type=number(LAM, "--lam"), default=None,
                    help="lambda written to the metadata (default: the memory's calibration lambda, else 6); "
                         "SGLang's --speculative-csd-freq-threshold takes its ceiling")
    ex.add_argument("--tau", type=number(TABLE_TAU, "--tau"), default=None,
                    help="tau written to the metadata as prob_ratio (SGLang's --speculative-csd-prob-ratio is tau)")
    add_vocab_args(ex)
    ex.set_defaults(func=cmd_export)

    im = sub.add_parser("import", help="read an SGLang CSD table or saved delta file into a memory file",
                        description="Read an SGLang table (.json, or .jsonl with a metadata line) or a delta "
                                    "file saved by --speculative-csd-delta-save-path into a memory that "
                                    "generate --memory, calibrate --memory and the app take. Entries with allow "
                                    "false keep their counts and are listed in the memory's meta.")
    im.add_argument("file", metavar="FILE", help="the SGLang table or delta file (.json or .jsonl)")
    im.add_argument("--out", required=True, help="memory file to write (.json or .json.gz)")
    im.add_argument("--force", action="store_true",
                    help="take a table whose metadata names another tokenizer or vocabulary size")
    add_vocab_args(im)
    im.set_defaults(func=cmd_import)
    return p


def add_vocab_args(p) -> None:
    p.add_argument("--pair", default=None,
                   help="the model pair's id (default: the memory's pair for export, the embedded pair for import)")
    p.add_argument("--tokenizer", default=None,
                   help="the tokenizer's name (needed for a pair other than the embedded one)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="ids in the tokenizer's vocabulary (needed for a pair other than the embedded one)")


def vocabulary(pair_id: str, tokenizer: str | None, size: int | None):
    """The embedded pair's vocabulary, or the one the flags describe."""
    from csd.calibration.sglang_table import EMBEDDED_VOCAB, Vocabulary
    from csd.runtime.pair import EMBEDDED_PAIR_ID
    if size is not None and size <= 0:
        raise ValueError(f"--vocab-size must be a positive count, got {size}")
    if pair_id == EMBEDDED_PAIR_ID and tokenizer is None and size in (None, EMBEDDED_VOCAB.size):
        return EMBEDDED_VOCAB
    if tokenizer is None or size is None:
        raise ValueError(f"pair {pair_id!r} is not the embedded pair: give --tokenizer and --vocab-size")
    return Vocabulary(tokenizer, size)


def cmd_export(args) -> int:
    from csd.calibration.sglang_table import export_memory, memory_lambda, table_suffix
    from csd.memory import DEFAULT_MEMORY_FILE, CorrectionMemory

    table_suffix(args.file)                   # a wrong name is refused before anything is read
    memory = CorrectionMemory.load(args.memory or DEFAULT_MEMORY_FILE)
    if args.pair:
        memory.check_pair(args.pair)
    vocab = vocabulary(memory.pair_id, args.tokenizer, args.vocab_size)
    lam = memory_lambda(memory) if args.lam is None else args.lam
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"lambda must be a count >= 0, got {lam!r}")
    path = export_memory(memory, args.file, vocab, lam, args.tau)
    print(f"wrote {path}: {len(memory):,} entries, {memory.total:,.0f} counted divergences, "
          f"{memory.n_candidates(lam):,} at freq >= {lam:g}; tokenizer {vocab.tokenizer}; "
          f"serve with --speculative-csd-freq-threshold {math.ceil(lam)}", file=sys.stderr)
    return 0


def cmd_import(args) -> int:
    from csd.calibration.sglang_table import disallowed, import_table
    from csd.memory import CorrectionMemory
    from csd.runtime.pair import EMBEDDED_PAIR_ID

    if not args.out.endswith((".json", ".json.gz")):
        raise ValueError(f"--out is a memory file named .json or .json.gz, not {args.out!r}")
    pair_id = args.pair or EMBEDDED_PAIR_ID
    memory = import_table(args.file, pair_id, vocabulary(pair_id, args.tokenizer, args.vocab_size), args.force)
    CorrectionMemory.save(memory, args.out)
    sg = memory.meta["sglang"]
    notes = [f"{len(disallowed(memory)):,} marked allow=false"]
    if sg["duplicates"]:
        notes.append(f"{sg['duplicates']:,} repeated pairs summed")
    if sg["metadata"].get("content") == "raw_delta_counts":
        notes.append("a delta file (raw_delta_counts)")
    print(f"wrote {args.out}: {len(memory):,} patterns, {memory.total:,.0f} counted divergences for pair "
          f"{pair_id} ({'; '.join(notes)})", file=sys.stderr)
    return 0
