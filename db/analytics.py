"""Analytics over the logged token events: pure functions of a Store (or a Session) and a Filter.

A divergence is a decided draft position where the draft token x~ differs from the target's
top-1 t* (status rescued, relaxed or rejected). What-if replays the CSD rule of arXiv 2604.13634 on the
logged values: a divergence is rescued iff memory_count >= lambda and gap >= log(tau); ``what_if_rule``
replays any run rule (``csd.rule.Rescue``: CSD, SD, an ablation or a rival) with the same functions.
"""
from __future__ import annotations

import csv
import json
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import Session

from csd.db.models import RunRow as Run
from csd.db.models import TokenEventRow as E
from csd.events import ACCEPTED, DIVERGENCE_STATUSES, REJECTED, RELAXED, RESCUED, RULE_SPECIAL, TokenEvent
from csd.rule import Rescue, log_tau, rescues
from csd.rule import top_share as _top_share

ROW_FIELDS = ["run_id", "seq", *(f.name for f in fields(TokenEvent)), "context",   # one exported event
              "memory_policy"]                                                  # its run's (csd.memory)
_COLUMNS = [c for c in ROW_FIELDS if c not in ("draft_top", "target_top", "memory_policy")]


@dataclass(frozen=True)
class Filter:
    """Which events to look at; None = any. Lists are turned into tuples (a Filter is a cache key)."""
    run_ids: tuple[int, ...] | None = None
    methods: tuple[str, ...] | None = None
    statuses: tuple[str, ...] | None = None
    pattern: tuple[int, int] | None = None   # (draft_id, target_id)
    text: str | None = None                  # substring of the token, draft, target text or context
    session_id: str | None = None
    representations: tuple[str, ...] | None = None   # the runs' target representations (with an int8 one's scales)

    def __post_init__(self):
        for name in ("run_ids", "methods", "statuses", "pattern", "representations"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    def apply(self, q: Select, runs_joined: bool = False) -> Select:
        """Add this filter's conditions to a select over token_events (joining runs when needed)."""
        if not runs_joined and (self.methods, self.session_id, self.representations) != (None, None, None):
            q = q.join(Run, Run.id == E.run_id)
        if self.run_ids is not None:
            q = q.where(E.run_id.in_(self.run_ids))
        if self.methods is not None:
            q = q.where(Run.method.in_(self.methods))
        if self.session_id is not None:
            q = q.where(Run.session_id == self.session_id)
        if self.representations is not None:
            q = q.where(Run.representation.in_(self.representations))
        if self.statuses is not None:
            q = q.where(E.status.in_(self.statuses))
        if self.pattern is not None:
            q = q.where(E.draft_id == self.pattern[0], E.target_id == self.pattern[1])
        if self.text:
            needle = self.text.lower()
            q = q.where(or_(*(func.lower(c).contains(needle, autoescape=True)
                              for c in (E.text, E.draft_text, E.target_text, E.context))))
        return q


ANY = Filter()


@contextmanager
def _session(source) -> Iterator[Session]:
    """A Session from a Store (opened and closed here) or the caller's own Session."""
    with (nullcontext(source) if isinstance(source, Session) else source.session()) as s:
        yield s


def _divergences(f: Filter, *cols) -> Select:
    return f.apply(select(*cols).where(E.status.in_(DIVERGENCE_STATUSES)))


# -- Pareto table of divergence patterns ---------------------------------------------------------
@dataclass
class ParetoRow:
    draft_id: int
    draft_text: str
    target_id: int
    target_text: str
    count: int
    share: float
    cumulative_share: float
    example_context: str       # the output text before the pattern's latest occurrence


def pareto_table(source, f: Filter = ANY, limit: int | None = None) -> list[ParetoRow]:
    """Divergence patterns (x~ -> t*) by count, most frequent first (shares are over all patterns)."""
    g = _divergences(f, E.draft_id, E.target_id, func.count().label("n"), func.max(E.id).label("example")) \
        .group_by(E.draft_id, E.target_id).subquery()
    q = select(g.c.draft_id, E.draft_text, g.c.target_id, E.target_text, g.c.n, E.context) \
        .join(E, E.id == g.c.example).order_by(g.c.n.desc(), g.c.draft_id, g.c.target_id)
    with _session(source) as s:
        rows = s.execute(q).all()
    total = sum(r.n for r in rows)
    out, cum = [], 0
    for r in rows[:limit]:
        cum += r.n
        out.append(ParetoRow(r.draft_id, r.draft_text or "", r.target_id, r.target_text or "", r.n,
                             r.n / total, cum / total, r.context))
    return out


def top_share(rows: list[ParetoRow], fraction: float = 0.2) -> float:
    """Share of divergences covered by the top ``fraction`` of patterns (the paper reports 69% at 0.2)."""
    return _top_share([r.count for r in rows], fraction)


# -- What-if: rescues under other lambda / tau -------------------------------------------------
@dataclass
class Divergences:
    """The logged divergences of a filter as arrays (NaN where a count or gap was not logged)."""
    count: np.ndarray            # memory_count at decision time (float, NaN = unknown)
    gap: np.ndarray              # z(x~) - z(t*) (NaN = unknown)
    pattern: np.ndarray          # index into ``patterns`` per divergence
    patterns: list[tuple[int, int]]
    scores: dict[str, np.ndarray] | None = None   # what the rivals read, by Relax.keeps's names (``rivals=True``)
    special: np.ndarray | None = None             # a special token on either side: never kept (``rivals=True``)

    def __len__(self) -> int:
        return len(self.count)

    def rescued_mask(self, lam: float, tau: float) -> np.ndarray:
        return rescues(self.count, self.gap, lam, log_tau(tau))   # NaN compares False: never rescued

    def kept_mask(self, rule: Rescue) -> np.ndarray:
        """The divergences ``rule`` would keep (a rival's needs ``rivals=True``; unlogged scores: never kept)."""
        if rule.relax is None:
            return np.asarray(rule.keeps_logged(count=self.count, gap=self.gap), dtype=bool) & np.ones(len(self), bool)
        if self.scores is None:
            raise ValueError("load the divergences with rivals=True to replay a rival's rule")
        return np.asarray(rule.keeps_logged(gap=self.gap, **self.scores), dtype=bool) & ~self.special


def _driver_rows(s: Session, q: Select) -> list[tuple]:
    """Rows as the driver's plain tuples: for 100k rows several times cheaper than SQLAlchemy Rows."""
    conn = s.connection()
    c = q.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = c.construct_params()
    if c.positional:
        params = tuple(params[k] for k in c.positiontup)
    dbapi = conn.connection.driver_connection
    cur = dbapi.cursor(binary=True) if conn.dialect.driver == "psycopg" else dbapi.cursor()   # binary: faster floats
    try:
        cur.execute(str(c), params)
        return cur.fetchall()
    finally:
        cur.close()


# what a rival reads (csd.rule.Relax.keeps's names) and the column that logs it
_RIVAL_COLUMNS = {"p_x": E.target_prob, "target_rank": E.target_rank, "entropy": E.entropy,
                  "top3_entropy": E.top3_entropy, "index": E.index_in_block, "block_len": E.block_len,
                  "matches_after": E.matches_after}


def load_divergences(source, f: Filter = ANY, rivals: bool = False) -> Divergences:
    """The filter's divergences as arrays; ``rivals``: also what the rivals read (a wider read: the
    what-if columns of CSD come from an index alone)."""
    extra = [*_RIVAL_COLUMNS.values(), case((E.rule == RULE_SPECIAL, 1), else_=0)] if rivals else []
    q = _divergences(f, E.memory_count, E.gap, E.draft_id, E.target_id, *extra)
    with _session(source) as s:
        a = np.array(_driver_rows(s, q), dtype=float).reshape(-1, 4 + len(extra))   # None -> NaN
    ids = np.nan_to_num(a[:, 2:4], nan=-1).astype(np.int64) + 1       # token ids < 2**31; None -> 0
    keys, inverse = np.unique(ids[:, 0] << 32 | ids[:, 1], return_inverse=True)   # 1-D: 50x faster than axis=0
    patterns = [(int(k >> 32) - 1, int(k & 0xFFFFFFFF) - 1) for k in keys]
    d = Divergences(a[:, 0], a[:, 1], inverse.reshape(-1), patterns)
    if rivals:
        d.scores = {name: a[:, 4 + j] for j, name in enumerate(_RIVAL_COLUMNS)}
        d.special = a[:, -1] == 1
    return d


def cached_divergences(source, f: Filter = ANY, rivals: bool = False) -> Divergences:
    """``load_divergences``, memoised on a Store per filter until events are written or runs deleted."""
    if isinstance(source, Session):
        return load_divergences(source, f, rivals)
    with source.session() as s:   # cheap: two index lookups and a count of the (small) runs table
        version = tuple(s.execute(select(select(func.max(E.id)).scalar_subquery(),
                                         select(func.max(Run.id)).scalar_subquery(),
                                         select(func.count()).select_from(Run).scalar_subquery())).one())
    key = ("divergences", f, rivals)
    hit = source.cache.get(key)
    if hit is None or hit[0] != version:
        if len(source.cache) > 32:
            source.cache.clear()
        hit = source.cache[key] = (version, load_divergences(source, f, rivals))
    return hit[1]


@dataclass
class WhatIf:
    lam: float
    tau: float
    total: int                   # logged divergences
    rescued: int                 # of which the rule would rescue
    by_pattern: dict[tuple[int, int], int] = field(default_factory=dict)   # rescued > 0, most first

    @property
    def rate(self) -> float:
        return self.rescued / self.total if self.total else 0.0


def what_if(source, lam: float, tau: float, f: Filter = ANY) -> WhatIf:
    d = cached_divergences(source, f)
    return _what_if(d, d.rescued_mask(lam, tau), lam, tau)


def what_if_rule(source, rule: Rescue, f: Filter = ANY) -> WhatIf:
    """How many logged divergences ``rule`` (CSD, SD, an ablation or a rival: ``CSDConfig.rule()``) would
    keep; ``rescued`` counts them whatever the rule calls a keep. A rival's scores that a run did not log
    count as not kept (``unscored`` says how many lack them)."""
    d = cached_divergences(source, f, rivals=rule.relax is not None)
    return _what_if(d, d.kept_mask(rule), rule.lam, float(np.exp(rule.log_tau)))


def unscored(source, rule: Rescue, f: Filter = ANY) -> int:
    """Logged divergences (special tokens aside) that lack a score the rival ``rule`` reads."""
    if rule.relax is None:
        return 0
    d = cached_divergences(source, f, rivals=True)
    missing = np.zeros(len(d), bool)
    for name in rule.relax.reads:
        missing |= np.isnan(d.gap if name == "gap" else d.scores[name])
    return int((missing & ~d.special).sum())


def _what_if(d: Divergences, mask: np.ndarray, lam: float, tau: float) -> WhatIf:
    per = np.bincount(d.pattern[mask], minlength=len(d.patterns))
    order = np.argsort(-per, kind="stable")
    by_pattern = {d.patterns[i]: int(per[i]) for i in order[:np.count_nonzero(per)]}
    return WhatIf(lam, tau, len(d), int(mask.sum()), by_pattern)


def capacity_what_if(d: Divergences, capacity: int, lam: float, tau: float) -> tuple[int, int]:
    """What a memory of ``capacity`` patterns would have rescued on logged divergences: it keeps the patterns
    with the largest logged counts (csd.memory's eviction: the smallest count goes), so a divergence is rescued
    when the rule rescues it and its pattern is among those. -> (rescued with the capacity, rescued unbounded)."""
    mask = d.rescued_mask(lam, tau)
    strength = np.zeros(len(d.patterns))
    np.maximum.at(strength, d.pattern, np.nan_to_num(d.count, nan=0.0))
    kept = np.zeros(len(d.patterns), bool)
    kept[np.argsort(-strength, kind="stable")[:max(0, int(capacity))]] = True
    return int((mask & kept[d.pattern]).sum()), int(mask.sum())


@dataclass
class WhatIfGrid:
    lams: list[float]
    taus: list[float]
    rescued: np.ndarray          # (len(lams), len(taus))
    total: int

    @property
    def rate(self) -> np.ndarray:
        return self.rescued / self.total if self.total else np.zeros_like(self.rescued, dtype=float)


def what_if_grid(source, lams, taus, f: Filter = ANY) -> WhatIfGrid:
    return grid_of(cached_divergences(source, f), lams, taus)


def grid_of(d: Divergences, lams, taus) -> WhatIfGrid:
    """The rescues of ``d`` at every (lambda, tau): ``what_if_grid`` on arrays already in hand (the
    app's memory scope gives them another memory's counts)."""
    lam = np.asarray(lams, dtype=float)[:, None]                                  # (L, 1)
    lt = np.array([log_tau(t) for t in taus])[:, None]                            # (T, 1)
    by_lam = rescues(d.count[None, :], 0.0, lam, -np.inf, use_scg=False)          # (L, N): the memory test
    by_tau = rescues(0.0, d.gap[None, :], 0.0, lt, use_ocm=False)                 # (T, N): the gate test
    rescued = by_lam.astype(float) @ by_tau.T.astype(float)                       # (L, T), exact below 2**53
    return WhatIfGrid(list(lams), list(taus), rescued.astype(np.int64), len(d))


# -- Acceptance by position, rescued tokens by kind ---------------------------------------------
@dataclass
class PositionRate:
    index_in_block: int
    kept: int                    # accepted + rescued + relaxed
    decided: int                 # accepted + rescued + relaxed + rejected

    @property
    def rate(self) -> float:
        return self.kept / self.decided if self.decided else 0.0


def acceptance_by_position(source, f: Filter = ANY) -> dict[str, list[PositionRate]]:
    """Per method: for each draft position in the block, kept / decided draft tokens."""
    kept = func.sum(case((E.status.in_((ACCEPTED, RESCUED, RELAXED)), 1), else_=0))
    q = f.apply(select(Run.method, E.index_in_block, kept, func.count()).join(Run, Run.id == E.run_id)
                .where(E.status.in_((ACCEPTED, RESCUED, RELAXED, REJECTED))), runs_joined=True) \
        .group_by(Run.method, E.index_in_block).order_by(Run.method, E.index_in_block)
    out: dict[str, list[PositionRate]] = {}
    with _session(source) as s:
        for method, index, k, n in s.execute(q):
            out.setdefault(method or "", []).append(PositionRate(index, int(k), n))
    return out


PUNCTUATION, DIGITS_MATH, WORDS, OTHER = "punctuation/whitespace", "digits/math", "words", "other"
KINDS = (PUNCTUATION, DIGITS_MATH, WORDS, OTHER)
_MATH = set("+-*/=<>^%±×÷")
_PUNCT_CATEGORIES = {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sc", "Sk"}   # not So (emoji, ©): other


def token_kind(text: str | None) -> str:
    """Kind of a token's text: whitespace or punctuation, digits and math symbols, words, other."""
    s = (text or "").strip()
    if not s:
        return PUNCTUATION                                  # whitespace only
    if all(c.isdigit() or c in _MATH or c in ".," or unicodedata.category(c) == "Sm" for c in s) \
            and (any(c.isdigit() for c in s) or all(c in _MATH or unicodedata.category(c) == "Sm" for c in s)):
        return DIGITS_MATH
    if all(unicodedata.category(c) in _PUNCT_CATEGORIES or c.isspace() for c in s):
        return PUNCTUATION
    if any(c.isalpha() for c in s) and all(c.isalpha() or c in "'’-" for c in s):
        return WORDS
    return OTHER


def rescued_by_kind(source, f: Filter = ANY) -> dict[str, int]:
    """Rescued tokens counted by the kind of the draft token's text (every kind present, maybe 0)."""
    text = func.coalesce(E.draft_text, E.text)
    q = f.apply(select(text, func.count()).where(E.status == RESCUED)).group_by(text)
    out = dict.fromkeys(KINDS, 0)
    with _session(source) as s:
        for t, n in s.execute(q):
            out[token_kind(t)] += n
    return out


# -- Listing and export -----------------------------------------------------------------------
def _event_dict(row, memory_policy: str | None) -> dict:
    d = {c: getattr(row, c) for c in _COLUMNS}
    explain = row.explain or {}
    d["draft_top"], d["target_top"] = explain.get("draft_top"), explain.get("target_top")
    d["memory_policy"] = memory_policy
    return {k: d[k] for k in ROW_FIELDS}


@dataclass(frozen=True)
class LoggedEvent:
    """A stored token event: the engine's own ``TokenEvent`` and where the store keeps it."""
    run_id: int
    seq: int                     # order within the run, from 0
    context: str                 # ~40 characters of output text before the token
    event: TokenEvent
    memory_policy: str | None = None   # the run's memory policy (csd.memory.MemoryPolicy.label; None: not recorded)


def logged_events(source, f: Filter = ANY, limit: int | None = 100, offset: int = 0) -> list[LoggedEvent]:
    """Events as typed records, in run and decision order (what the app draws and the figures use)."""
    return [LoggedEvent(d["run_id"], d["seq"], d["context"], TokenEvent.from_dict(d), d["memory_policy"])
            for d in events(source, f, limit, offset)]


def events(source, f: Filter = ANY, limit: int | None = 100, offset: int = 0) -> list[dict]:
    """Events as flat dicts (the TokenEvent fields plus run_id, seq and context), in run and decision
    order: the shape of an exported row (CSV, JSON lines). ``logged_events`` gives typed records."""
    return list(_iter_events(source, f, limit, offset))


def count_events(source, f: Filter = ANY) -> int:
    with _session(source) as s:
        return s.scalar(f.apply(select(func.count()).select_from(E)))


def _iter_events(source, f: Filter, limit: int | None = None, offset: int = 0) -> Iterator[dict]:
    q = f.apply(select(E, Run.memory_policy).join(Run, Run.id == E.run_id), runs_joined=True)
    q = q.order_by(E.run_id, E.seq).limit(limit).offset(offset)
    with _session(source) as s:
        for r, policy in s.execute(q.execution_options(yield_per=2000)):
            yield _event_dict(r, policy)


def _export(source, f: Filter, file, as_csv: bool) -> int:
    """The filter's events to a path or an open text file, as CSV or JSON lines; returns how many."""
    n = 0
    opened = open(file, "w", newline="", encoding="utf-8") if isinstance(file, (str, Path)) else nullcontext(file)
    with opened as fh:
        w = csv.DictWriter(fh, ROW_FIELDS) if as_csv else None
        if w is not None:
            w.writeheader()
        for d in _iter_events(source, f):
            n += 1
            if w is None:
                fh.write(json.dumps(d, ensure_ascii=False) + "\n")
            else:   # the top-k lists as JSON in their cells
                w.writerow(d | {k: "" if d[k] is None else json.dumps(d[k], ensure_ascii=False)
                                for k in ("draft_top", "target_top")})
    return n


def export_csv(source, f: Filter, file) -> int:
    """Write the filter's events as CSV (draft_top / target_top as JSON) to a path or text file; returns how many."""
    return _export(source, f, file, as_csv=True)


def export_jsonl(source, f: Filter, file) -> int:
    """Write the filter's events as JSON lines to a path or text file; returns the number written."""
    return _export(source, f, file, as_csv=False)


def runs_list(source, limit: int | None = 50, session_id: str | None = None) -> list[dict]:
    """The latest runs, newest first, with their number of logged events."""
    n_events = select(func.count()).where(E.run_id == Run.id).correlate(Run).scalar_subquery()
    q = select(Run, n_events.label("n_events")).order_by(Run.id.desc()).limit(limit)
    if session_id is not None:
        q = q.where(Run.session_id == session_id)
    cols = Run.__table__.columns.keys()
    with _session(source) as s:
        return [{**{c: getattr(run, c) for c in cols}, "n_events": n} for run, n in s.execute(q)]


def representations(source, session_id: str | None = None) -> list[str]:
    """The target representations the runs recorded (an int8 target's with its activation scales), sorted."""
    q = select(Run.representation).distinct().where(Run.representation.is_not(None))
    if session_id is not None:
        q = q.where(Run.session_id == session_id)
    with _session(source) as s:
        return sorted(s.scalars(q))
