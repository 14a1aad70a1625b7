"""How long a waiting request will wait, from what the model lane does now: a pure unit (no clock, no lane), fed
the runs in progress and the last runs that ended (``csd.ui.lane.Lane.estimate`` gathers them). The method, in
words: docs/users.md ("a waiting request's status line")."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from statistics import median

from .render import plural

# a run's token takes this much longer for each other run decoding beside it (csd.runtime.batch): 8 at once about 4
# times a run alone, the machine's tokens about 2x (docs/cpu.md: 8 runs at once 16.9-21.3 tok/s, alone 8.4-9.6)
SLOWER = 3 / 7
STEADY = 4            # tokens a run writes before its live rate counts
SPREAD = (0.8, 1.25)   # the range around the central guess: within 2x of the wait whenever that guess is within 1.6x


def beside(k: float) -> float:
    """How much slower a run's token is with ``k`` runs decoding together than alone."""
    return 1 + SLOWER * (max(1.0, k) - 1)


@dataclass(frozen=True)
class Ran:
    """A run that ended: its seconds on the model, the new tokens it wrote (0: unknown, a calibration), and how many
    runs decoded together while it ran (itself included), and the tokens it asked for (0: unknown)."""
    seconds: float
    tokens: int = 0
    together: float = 1.0
    asked: int = 0


@dataclass(frozen=True)
class Live:
    """A run on the model now: seconds since it started, tokens written, tokens it may write (0: unknown),
    and its live rate in tokens per second since its first token (None: no token yet)."""
    elapsed: float
    done: int = 0
    asked: int = 0
    rate: float | None = None


@dataclass(frozen=True)
class Wait:
    low: float           # seconds until the request starts, at the quick end and the slow end
    high: float
    ended: int           # how many ended runs it is drawn from
    running: int         # and how many in progress


def per_token(running: list[Live], ended: list[Ran], k: float) -> float | None:
    """Seconds a run's token takes with ``k`` runs decoding together: the runs in progress at their live rates, else
    the runs that ended (their prompts included), each scaled from the runs that decoded beside it to ``k``."""
    now = [1 / r.rate for r in running if r.rate and r.done >= STEADY]   # since their first token
    if now:
        return median(now) * beside(k) / beside(len(running))
    past = [r.seconds / r.tokens * beside(k) / beside(r.together) for r in ended if r.tokens and r.seconds > 0]
    return median(past) if past else None


def estimate(waiting: int, running: list[Live], ended: list[Ran], slots: int) -> Wait | None:
    """Seconds (a low-high ``Wait``) until a request starts with ``running`` runs on the model, ``waiting`` before it,
    ``slots`` at a time; None while nothing measures a run yet. Each waiting request is taken to ask for the tokens the
    runs in progress asked for (else what the last runs wrote): nothing knows a waiting request's own, since the lane
    learns a job's tokens when its handler starts and gradio keeps a queued request's inputs in its private event
    data (a run in progress ends by its own ask). A waiting request is taken to write the share of its ask that the
    last runs wrote before their end of text, at a token's time with the runs that will decode beside it
    (``per_token``), after reading its prompt as long as the runs in progress took to read theirs."""
    slots = max(1, slots)
    k = min(slots, len(running) + waiting)            # runs decoding together while the requests ahead run
    spt = per_token(running, ended, k)
    asked = [r.asked for r in running if r.asked] or [r.tokens for r in ended if r.tokens]
    durations = [r.seconds for r in ended if r.seconds > 0]
    shares = sorted(min(1.0, r.tokens / r.asked) for r in ended if r.asked and r.tokens) or [1.0]
    share = median(shares)
    steady = [r for r in running if r.rate and r.done >= STEADY]
    reading = median([r.elapsed - r.done / r.rate for r in steady] or [0.0])   # a prompt's reading, before a token
    if spt is not None and asked:
        each = max(0.0, reading) + share * median(asked) * spt
    elif durations:                                   # only calibrations measured: how long they took
        each = median(durations)
    else:
        return None
    def left(r: Live, part: float) -> float:
        if r not in steady:                           # no token yet: a run's time, and more the longer it takes
            return max(each - r.elapsed, 0.25 * r.elapsed)
        to_write = max(part * r.asked - r.done, 0.25 * (r.asked - r.done), 0)   # at its rate, with those beside
        return to_write / r.rate * beside(k) / beside(len(running))

    # of several runs, the first to end is likely one that stops early: the j-th to end is given the j-th of
    # len(running) + 1 quantiles of the shares the last runs wrote of what they asked for
    order = sorted(running, key=lambda r: left(r, share))
    ends = [left(r, shares[min(len(shares) - 1, int(len(shares) * (j + 1) / (len(order) + 1)))])
            for j, r in enumerate(order)]
    free = sorted(ends)[:slots] + [0.0] * (slots - min(slots, len(ends)))
    heapq.heapify(free)
    for _ in range(waiting):
        heapq.heappush(free, heapq.heappop(free) + each)
    mid = free[0]
    return Wait(SPREAD[0] * mid, SPREAD[1] * mid, len(durations), len(running))


def _secs(s: float) -> str:
    if s < 90:
        return f"{max(1, round(s))} s"
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def describe(w: Wait | None, waiting: int) -> str:
    """The estimate for the status line ("; about 40 s more", "; about 2-5 min more") and what it comes from; "any
    moment" only with no request before it; a range when the high end is 1.5 times the low one and 10 s more."""
    if w is None:
        return ""
    basis = [f"the last {plural(w.ended, 'run')}" if w.ended else "",
             ("the one running" if w.running == 1 else f"the {w.running} running") if w.running else ""]
    basis = " and ".join(b for b in basis if b)
    if w.high < 1 and not waiting:
        return f"; any moment now, from {basis}"
    low, high = max(1.0, w.low), max(1.0, w.high)
    if high >= 1.5 * low and high - low >= 10:
        a, b = _secs(low), _secs(high)
        span = f"{a.split()[0]}-{b}" if a.split()[1:] == b.split()[1:] else f"{a} to {b}"
        return f"; about {span} more, from {basis}"
    return f"; about {_secs((low + high) / 2)} more, from {basis}"
