"""SGLang's CSD table, both ways: a ``CorrectionMemory`` written as the table that SGLang's
``--speculative-csd-table-path`` reads, and a table (or a saved delta file) read back into a memory.

The format, as read in SGLang's code (docs/scale.md names the commits and lines): metadata and entries, as
one JSON value or JSON lines (by the ``.jsonl`` suffix); an entry is ``lhs_token`` (the draft's token),
``rhs_token`` (the target's) or their ``key`` = lhs << 32 | rhs, ``freq`` and ``allow``. A delta file alike.
No torch here; every refusal is a ``TableError`` (a ``MemoryFileError``) naming the line."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..fileio import atomic_write, read_maybe_gzip, read_or_raise
from ..memory import CorrectionMemory, MemoryFileError, MemoryPolicy
from ..runtime.pair import EMBEDDED, EMBEDDED_PAIR_ID

MAX_TOKEN_ID = (1 << 31) - 1          # SGLang's CSD_MAX_TOKEN_ID: an id is packed into 32 bits
CONTENT_TABLE, CONTENT_DELTA = "csd_pair_frequency", "raw_delta_counts"
PRODUCER = "csd-explorer"


class TableError(MemoryFileError):
    """A file is not an SGLang CSD table, or does not fit the pair's vocabulary or tokenizer."""


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer a table's ids belong to: its name (as a server's ``--tokenizer-path`` would give it),
    the number of ids, and other names for the same tokenizer."""
    tokenizer: str
    size: int
    aliases: tuple[str, ...] = ()

    def accepts(self, name: str) -> bool:
        """Whether ``name`` (a hub id or a path) names this tokenizer: the same name, or the same last part."""
        def last(s: str) -> str:
            return s.rstrip("/").rsplit("/", 1)[-1].lower()
        return any(name.strip().lower() == n.lower() or last(name) == last(n) for n in (self.tokenizer, *self.aliases))


# The embedded pair: both Qwen2.5-Coder models share one tokenizer (151,936 ids; MODELS.md).
EMBEDDED_VOCAB = Vocabulary("Qwen/Qwen2.5-Coder-1.5B-Instruct", 151_936, aliases=(
    "Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", EMBEDDED["target"].name, EMBEDDED["draft"].name))


def vocabulary_of(pair) -> Vocabulary:
    """The vocabulary of a loaded ``ModelPair``: the embedded one's, or the target's name and size."""
    if pair.pair_id == EMBEDDED_PAIR_ID:
        return EMBEDDED_VOCAB
    name = getattr(pair.tokenizer, "name_or_path", "") or pair.target_name
    return Vocabulary(str(name), int(pair.target_lm.vocab_size), aliases=(pair.target_name,))


def pack(draft: int, target: int) -> int:
    return draft << 32 | target


def unpack(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


@dataclass
class Table:
    """A parsed table: counts and allow flags by (draft id, target id), the file's metadata, and how many
    entries repeated a pair already seen (their counts are summed)."""
    freq: dict[tuple[int, int], int] = field(default_factory=dict)
    allow: dict[tuple[int, int], bool] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    duplicates: int = 0

    def __len__(self) -> int:
        return len(self.freq)

    def add(self, pair: tuple[int, int], freq: int, allow: bool) -> None:
        if pair in self.freq:
            self.duplicates += 1
        self.freq[pair] = self.freq.get(pair, 0) + freq
        self.allow[pair] = self.allow.get(pair, True) and allow


def _whole(value, what: str, where: str) -> int:
    """A JSON whole number (an integral float too, as SGLang's ``int()`` takes it), not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise TableError(f"{where}: {what} must be a whole number, not {json.dumps(value)[:40]}")
    return int(value)


def _token(value, what: str, where: str, vocab: Vocabulary | None) -> int:
    i = _whole(value, what, where)
    if i < 0 or i > MAX_TOKEN_ID:
        raise TableError(f"{where}: {what} {i} is not a token id (0 to {MAX_TOKEN_ID})")
    if vocab is not None and i >= vocab.size:
        raise TableError(f"{where}: token id {i} ({what}) is beyond the vocabulary of {vocab.tokenizer}: "
                         f"{vocab.size:,} ids (0 to {vocab.size - 1:,})")
    return i


def _entry(rec, where: str, vocab: Vocabulary | None) -> tuple[tuple[int, int], int, bool]:
    """One entry -> ((draft, target), freq, allow). ``key`` wins over the ids in SGLang; here both
    must agree. ``draft_token``/``residual_token`` are a later version's names for lhs/rhs."""
    if not isinstance(rec, dict):
        raise TableError(f"{where}: an entry must be a JSON object, not {json.dumps(rec)[:40]}")
    lhs = rec.get("lhs_token", rec.get("draft_token"))
    rhs = rec.get("rhs_token", rec.get("residual_token"))
    if "key" in rec:
        key = _whole(rec["key"], "key", where)
        if key < 0:
            raise TableError(f"{where}: key {key} is negative (-1 is SGLang's empty slot)")
        d, t = unpack(key)
        if key >> 63 or (lhs is not None and _whole(lhs, "lhs_token", where) != d) \
                or (rhs is not None and _whole(rhs, "rhs_token", where) != t):
            raise TableError(f"{where}: key {key} is lhs {d}, rhs {t}, but the entry's ids say {lhs}, {rhs}")
        d, t = _token(d, "lhs_token (from key)", where, vocab), _token(t, "rhs_token (from key)", where, vocab)
    elif lhs is None or rhs is None:
        raise TableError(f"{where}: an entry needs lhs_token and rhs_token, or key")
    else:
        d, t = _token(lhs, "lhs_token", where, vocab), _token(rhs, "rhs_token", where, vocab)
    freq = _whole(rec.get("freq", 1), "freq", where)
    if freq < 0:
        raise TableError(f"{where}: freq {freq} is negative")
    allow = rec.get("allow", True)
    if not isinstance(allow, bool):
        raise TableError(f"{where}: allow must be true or false, not {json.dumps(allow)[:40]}")
    return (d, t), freq, allow


def _metadata(rec: dict, where: str) -> dict:
    """The metadata line's object: SGLang reads ``"metadata"`` under it; flat keys are taken too."""
    md = rec.get("metadata", {})
    if not isinstance(md, dict):
        raise TableError(f"{where}: 'metadata' must be a JSON object")
    return {**{k: v for k, v in rec.items() if k not in ("type", "metadata")}, **md}


def parse_table(text: str, jsonl: bool, vocab: Vocabulary | None = None) -> Table:
    """A table from its text; ``jsonl``: one JSON value a line (SGLang decides by the ``.jsonl`` suffix). Refused
    (``TableError``) with the line number: malformed JSON, an entry that is not one, an id outside ``vocab``."""
    table = Table()
    if jsonl:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TableError(f"line {n}: malformed JSON ({e.msg}, column {e.colno})") from None
            if isinstance(rec, dict) and rec.get("type") == "metadata":
                table.metadata.update(_metadata(rec, f"line {n}"))
                continue
            table.add(*_entry(rec, f"line {n}", vocab))
        return table
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        raise TableError(f"line {e.lineno}: malformed JSON ({e.msg}, column {e.colno})") from None
    if isinstance(payload, dict):
        if "entries" not in payload:
            raise TableError("not an SGLang CSD table: a JSON object needs 'entries' (and 'metadata')")
        md, records = payload.get("metadata") or {}, payload["entries"]
        if not isinstance(md, dict) or not isinstance(records, list):
            raise TableError("not an SGLang CSD table: 'metadata' must be an object and 'entries' a list")
        table.metadata.update(md)
    elif isinstance(payload, list):
        records = payload
    else:
        raise TableError("not an SGLang CSD table: expected a JSON object or a list of entries")
    for n, rec in enumerate(records):
        if isinstance(rec, dict) and rec.get("type") == "metadata":
            table.metadata.update(_metadata(rec, f"entry {n}"))
            continue
        table.add(*_entry(rec, f"entry {n}", vocab))
    return table


def read_table(path: str | os.PathLike, vocab: Vocabulary | None = None) -> Table:
    """``parse_table`` on a file (gzip allowed); JSON lines when the name ends in ``.jsonl`` (or ``.jsonl.gz``).
    An empty or blank file, or a table without one entry, is refused (``TableError`` naming the file)."""
    path = Path(path)
    try:
        text = read_or_raise(path, TableError).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TableError(f"{path.name} is not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise TableError(f"{path.name} is empty (no bytes, or only blank lines): not an SGLang CSD table; "
                         "nothing was loaded")
    table = parse_table(text, path.name.removesuffix(".gz").endswith(".jsonl"), vocab)
    if not len(table):
        raise TableError(f"{path.name} holds no entries: an empty SGLang CSD table; nothing was loaded")
    return table


# -- table <-> memory --------------------------------------------------------------------------
def check_tokenizer(metadata: dict, vocab: Vocabulary, force: bool = False) -> None:
    """Refuse a table whose metadata names another tokenizer (or vocabulary size), unless ``force``."""
    if force:
        return
    name, size = metadata.get("tokenizer", metadata.get("tokenizer_path")), metadata.get("vocab_size")
    if name is not None and not vocab.accepts(str(name)):
        raise TableError(f"the table's metadata names tokenizer {name!r}, not {vocab.tokenizer!r}: "
                         "its ids would mean other tokens (--force takes it anyway)")
    if isinstance(size, int) and not isinstance(size, bool) and size != vocab.size:
        raise TableError(f"the table's metadata gives a vocabulary of {size:,} ids, not {vocab.size:,} "
                         f"({vocab.tokenizer}) (--force takes it anyway)")


def table_to_memory(table: Table, pair_id: str, vocab: Vocabulary, force: bool = False,
                    source: str = "") -> CorrectionMemory:
    """A memory of ``pair_id`` with the table's counts. Entries with ``allow`` false are kept with
    their counts and listed in ``meta["sglang"]["disallowed"]`` (written back as allow false)."""
    check_tokenizer(table.metadata, vocab, force)
    disallowed = sorted([d, t] for (d, t), ok in table.allow.items() if not ok)
    meta = {"sglang": {"source": source, "metadata": table.metadata, "entries": len(table),
                       "duplicates": table.duplicates, "disallowed": disallowed, "forced": bool(force),
                       "tokenizer": vocab.tokenizer}}
    policy = MemoryPolicy.from_dict(table.metadata.get("memory_policy"))   # written by memory_to_table
    return CorrectionMemory(pair_id, dict(table.freq), meta, policy)


def disallowed(memory: CorrectionMemory) -> set[tuple[int, int]]:
    """The patterns an imported table marked ``allow`` false."""
    sg = memory.meta.get("sglang")
    rows = sg.get("disallowed") if isinstance(sg, dict) else None
    return {(int(d), int(t)) for d, t in rows} if isinstance(rows, list) else set()


def memory_lambda(memory: CorrectionMemory, default: float = 6) -> float:
    """The lambda a memory was calibrated with (its latest calibration), else ``default``."""
    cal = memory.meta.get("calibration")
    last = cal[-1] if isinstance(cal, list) and cal else {}
    lam = last.get("lambda") if isinstance(last, dict) else None
    return float(lam) if isinstance(lam, (int, float)) and not isinstance(lam, bool) else float(default)


def memory_to_table(memory: CorrectionMemory, vocab: Vocabulary, lam: float, tau: float | None = None) -> Table:
    """The memory as a table: every pattern, ``freq`` its count, ``allow`` false where an imported table
    said so. The metadata names the pair, the tokenizer and lambda (``freq_threshold``, the name SGLang's
    later runtime writes), keeping the keys of an imported table's metadata that it does not set."""
    table, lam = Table(), int(lam) if float(lam).is_integer() else float(lam)
    sg = memory.meta.get("sglang")
    old = sg.get("metadata") if isinstance(sg, dict) else None
    draft, _, target = memory.pair_id.partition("->")
    table.metadata = {**(old if isinstance(old, dict) else {}), "content": CONTENT_TABLE, "producer": PRODUCER,
                      "pair": memory.pair_id, "draft": draft, "target": target, "tokenizer": vocab.tokenizer,
                      "vocab_size": vocab.size, "freq_threshold": lam, "lambda": lam}
    if tau is not None:
        table.metadata["prob_ratio"] = tau
    if not memory.policy.unbounded:     # SGLang ignores it; an import here restores it
        table.metadata["memory_policy"] = memory.policy.to_dict()
    else:
        table.metadata.pop("memory_policy", None)
    blocked = disallowed(memory)
    for (d, t), c in memory.items():
        for what, i in (("draft", d), ("target", t)):
            if i >= vocab.size:
                raise TableError(f"pattern {d}:{t}: token id {i} ({what}) is beyond the vocabulary of "
                                 f"{vocab.tokenizer}: {vocab.size:,} ids")
        table.add((d, t), round(c), (d, t) not in blocked)     # a decayed count as it stands, to the nearest
    return table


def render_table(table: Table, jsonl: bool) -> bytes:
    """The table as SGLang writes it: entries sorted by key, each with key, lhs_token, rhs_token, freq and
    allow; one entry a line in both forms."""
    rows = [json.dumps({"key": pack(d, t), "lhs_token": d, "rhs_token": t, "freq": table.freq[(d, t)],
                        "allow": table.allow[(d, t)]}) for d, t in sorted(table.freq, key=lambda p: pack(*p))]
    if jsonl:
        head = json.dumps({"type": "metadata", "metadata": table.metadata}, ensure_ascii=False)
        return "".join(line + "\n" for line in [head, *rows]).encode()
    head = '{"metadata": ' + json.dumps(table.metadata, ensure_ascii=False) + ', "entries": ['
    return "\n".join([head, ",\n".join(rows), "]}", ""]).encode()


def table_suffix(path: str | os.PathLike) -> bool:
    """True for ``.jsonl``, False for ``.json``; anything else is refused."""
    name = Path(path).name
    if name.endswith(".jsonl"):
        return True
    if name.endswith(".json"):
        return False
    raise TableError(f"an SGLang table is named .json or .jsonl (SGLang reads JSON lines by the suffix), "
                     f"not {name!r}")


def export_memory(memory: CorrectionMemory, path: str | os.PathLike, vocab: Vocabulary, lam: float,
                  tau: float | None = None) -> Path:
    """Write ``memory`` as an SGLang table at ``path`` (.json or .jsonl), atomically."""
    jsonl = table_suffix(path)
    return atomic_write(path, render_table(memory_to_table(memory, vocab, lam, tau), jsonl))


def import_table(path: str | os.PathLike, pair_id: str, vocab: Vocabulary, force: bool = False) -> CorrectionMemory:
    """Read an SGLang table or delta file into a memory of ``pair_id`` (nothing is written)."""
    try:
        return table_to_memory(read_table(path, vocab), pair_id, vocab, force, source=Path(path).name)
    except TableError:
        raise
    except MemoryFileError as e:                      # the metadata's memory_policy
        raise TableError(f"{path}: {e}") from None


def is_table(path: str | os.PathLike) -> bool:
    """Whether a file is meant as an SGLang table rather than this project's memory: named ``.jsonl``, or JSON that
    is a list of objects or an object with ``entries`` and no ``format``; malformed JSON named ``.json`` too (the
    table reader names the line). Anything else is left to the memory loader (its refusals say what one is)."""
    name = Path(path).name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        return True
    try:
        payload = json.loads(read_maybe_gzip(path))
    except (OSError, ValueError) as e:
        return isinstance(e, json.JSONDecodeError) and name.endswith(".json")
    if isinstance(payload, list):
        return all(isinstance(rec, dict) for rec in payload)
    return isinstance(payload, dict) and "entries" in payload and "format" not in payload


def load_memory_or_table(path: str | os.PathLike, pair_id: str, vocab: Vocabulary,
                         force: bool = False) -> CorrectionMemory:
    """A memory file of this project, or an SGLang table (.json/.jsonl) read into one."""
    if is_table(path):
        return import_table(path, pair_id, vocab, force)
    return CorrectionMemory.load(path, expected_pair=pair_id)
