"""Calibration of the Online Correction Memory from an unlabeled corpus (CSD, arXiv 2604.13634).

Both models read the same text in one teacher-forced pass each; wherever their greedy
predictions differ, the pair (draft top-1 -> target top-1) is counted. Only positions that
belong to the text and have context are counted: the chat-template tokens and the first
``skip_first`` tokens of every chunk are masked out (unmasked, artefacts such as
'import' -> 'Q' at the start of a chunk dominate the table).

The default corpus ships with Python itself: the prose of ``pydoc_data.topics`` (the topics
whose hash falls in the calibration split; the rest are kept for the prose benchmark) and the
source of standard-library modules.
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from .memory import CorrectionMemory
from .models import ModelPair

Progress = Callable[[str, float], None]
CALIBRATION_INSTRUCTION = "Write the following text."
DEFAULT_MEMORY_FILE = Path(__file__).parent / "data" / "default_memory.json.gz"


# -- corpora -----------------------------------------------------------------------------------
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
    out = []
    for i in range(max(len(prose), len(code))):
        out.extend(x[i] for x in (prose, code) if i < len(x))
    return out


def read_corpus(path: str | Path) -> list[str]:
    """A text file (one document) or JSONL (a "text" field, or the first string field, per line)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read corpus {str(path)!r}: {e}") from None
    if path.suffix in (".jsonl", ".ndjson"):
        texts = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{n}: not valid JSON") from None
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


# -- counting ----------------------------------------------------------------------------------
def _chunks(pair: ModelPair, texts: Iterable[str], chunk_tokens: int, max_chunks: int | None) -> Iterator[list[int]]:
    n = 0
    for text in texts:
        ids = pair.tokenizer(text, add_special_tokens=False)["input_ids"]
        for s in range(0, len(ids) - chunk_tokens + 1, chunk_tokens):
            yield ids[s:s + chunk_tokens]
            n += 1
            if max_chunks is not None and n >= max_chunks:
                return


def chat_prefix(pair: ModelPair) -> list[int]:
    """The chat-template tokens before an assistant answer (masked out of the counts)."""
    return pair.encode_prompt(CALIBRATION_INSTRUCTION, chat=True)


@torch.inference_mode()
def count_divergences(pair: ModelPair, chunk: torch.Tensor, prefix_len: int, skip_first: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Teacher-forced divergences of one batch: (draft ids, target ids, positions counted)."""
    keep = chunk.shape[1] - prefix_len - skip_first + 1          # predictions for text tokens skip_first..end
    d = pair.draft(input_ids=chunk, logits_to_keep=keep).logits[:, :-1].argmax(-1)   # (B, keep - 1)
    t = pair.target(input_ids=chunk, logits_to_keep=keep).logits[:, :-1].argmax(-1)  # (B, keep - 1)
    diff = d != t
    return d[diff], t[diff], d.numel()


def calibrate(pair: ModelPair, texts: Iterable[str], memory: CorrectionMemory | None = None, *,
              chunk_tokens: int = 256, batch_size: int = 4, skip_first: int = 4,
              max_positions: int | None = None, progress: Progress | None = None, corpus_name: str = "") -> CorrectionMemory:
    if pair.draft is None:
        raise ValueError("calibration needs both models")
    if chunk_tokens <= skip_first + 1:
        raise ValueError(f"chunk_tokens must exceed skip_first + 1 ({skip_first + 1})")
    memory = memory if memory is not None else CorrectionMemory(pair.pair_id)
    if memory.pair_id != pair.pair_id:
        raise ValueError(f"the memory belongs to {memory.pair_id!r}, not to {pair.pair_id!r}")
    prefix = chat_prefix(pair)
    per_chunk = chunk_tokens - skip_first
    max_chunks = None if max_positions is None else max(1, -(-max_positions // per_chunk))
    chunks = _chunks(pair, texts, chunk_tokens, max_chunks)
    if max_chunks is None:  # the whole corpus: tokenize it once, and know the total for progress
        chunks = list(chunks)
    total_chunks = max_chunks or len(chunks)
    positions = divergences = done = 0
    batch: list[list[int]] = []

    def flush():
        nonlocal positions, divergences, done
        x = torch.tensor([prefix + c for c in batch], dtype=torch.long, device=pair.target.device)
        ds, ts, n = count_divergences(pair, x, len(prefix), skip_first)
        for a, b in zip(ds.tolist(), ts.tolist()):
            memory.observe(a, b)
        positions += n
        divergences += len(ds)
        done += len(batch)
        batch.clear()
        if progress:
            progress(f"calibrating: {positions} positions, {divergences} divergences", min(1.0, done / max(1, total_chunks)))

    for chunk in chunks:
        batch.append(chunk)
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    if positions == 0:
        raise ValueError(f"the corpus is too short: every text has fewer than {chunk_tokens} tokens")
    prev = memory.meta.get("calibration", [])
    memory.meta["calibration"] = prev + [{"corpus": corpus_name, "positions": positions, "divergences": divergences,
                                           "agreement": 1 - divergences / positions, "chunk_tokens": chunk_tokens,
                                           "skip_first": skip_first, "dtype": str(pair.dtype).removeprefix("torch.")}]
    return memory


def default_memory(pair: ModelPair) -> CorrectionMemory:
    """The shipped memory for the embedded pair; an empty memory for any other pair."""
    if pair.is_embedded and DEFAULT_MEMORY_FILE.exists():
        return CorrectionMemory.load(DEFAULT_MEMORY_FILE, expected_pair=pair.pair_id)
    return CorrectionMemory(pair.pair_id)
