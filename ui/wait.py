"""How long a waiting request will wait, from what the model lane does now: a pure unit (no clock, no lane), fed
the runs in progress and the last runs that ended (``csd.ui.lane.Lane.estimate`` gathers them). The method, in
words: docs/users.md ("a waiting request's status line")."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from statistics import median

import numpy as np

from .render import plural


@dataclass(frozen=True)
class Ran:
    """A run that ended: its seconds on the model and the new tokens it wrote (0: unknown, a calibration)."""
    seconds: float
    tokens: int = 0


@dataclass(frozen=True)
class Live:
    """A run on the model now: seconds since it started, tokens written, tokens it may write (0: unknown),
    and its live rate in tokens per second (None: no token yet)."""
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


def left_of(run: Live, typical: tuple[float, float]) -> tuple[float, float]:
    """(low, high) seconds until a run in progress ends; ``typical``: a run's usual (low, high) duration."""
    if run.rate and run.asked > run.done:
        left = (run.asked - run.done) / run.rate          # at its own rate, to the tokens it asked for
        # it may end sooner (an end of text), when runs usually end, but not in less than half of that
        return max(0.5 * left, min(left, typical[0] - run.elapsed)), left
    if run.rate:                                          # written all it asked for: ending now
        return 0.0, 0.0
    # no token yet (the prompt, or a calibration): when runs usually end, and past that a quarter of its time
    # and more, so the guess grows while it runs longer than promised
    return (max(typical[0], 1.25 * run.elapsed) - run.elapsed, max(typical[1], 1.5 * run.elapsed) - run.elapsed)


def estimate(waiting: int, running: list[Live], ended: list[Ran], slots: int) -> Wait | None:
    """Seconds (a low-high ``Wait``) until a request starts with ``running`` runs on the model, ``waiting`` before it,
    ``slots`` at a time; None while no run has ended or written a token (no measure of a run's length yet)."""
    slots = max(1, slots)
    durations = [r.seconds for r in ended if r.seconds > 0]
    # what the runs in progress are on course to take, at their live rate
    projected = [r.elapsed + (r.asked - r.done) / r.rate for r in running if r.rate and r.asked > r.done]
    if not durations and not projected:
        return None
    past = [r.tokens / r.seconds for r in ended if r.tokens and r.seconds > 0]
    now = [r.rate for r in running if r.rate]
    slow = min(10.0, max(1.0, median(past) / median(now))) if past and now else 1.0   # the load of now
    sample = [d * slow for d in durations] + projected
    q1, q3 = np.quantile(sample, [0.25, 0.75])        # the quartiles, linear between the nearest samples
    typical = (float(q1), max(float(q3), median(sample)))
    ends = [left_of(r, typical) for r in running][:slots]
    out = []
    for end, each in ((0, typical[0]), (1, typical[1])):
        free = [e[end] for e in ends] + [0.0] * (slots - len(ends))
        heapq.heapify(free)
        for _ in range(waiting):
            heapq.heappush(free, heapq.heappop(free) + each)
        out.append(free[0])
    return Wait(out[0], max(out), len(durations), len(running))


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
