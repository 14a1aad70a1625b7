"""The model lane: every user's requests for model work, each a ``Job`` from its click to its end, in the order
they came; what the page says about gradio's queue (docs/design.md, "The web app")."""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from . import wait

KINDS = ("generate", "compare", "teach", "calibrate")


@dataclass(eq=False)
class Job:
    ticket: int                       # the order of the request among all users' requests
    session_id: str
    kind: str                         # one of KINDS
    queued_at: float = field(default_factory=time.monotonic)
    seen_at: float = field(default_factory=time.monotonic)   # the page last asked about it (while waiting)
    started_at: float | None = None
    finished_at: float | None = None
    cancel: bool = False              # set by Stop; the running loop polls it (``should_stop``)
    run: object | None = None         # the csd.decode.Run in progress, for its live metrics
    decoder: object | None = None     # the csd.decode.Decoder it runs on (its user's activation scales)
    label: str = ""                   # which part of the job runs (Compare: "AR", "SD", "CSD")
    prompt_tokens: int = 0
    max_tokens: int = 0
    progress: str = ""                # a progress line for work without a Run (calibration)
    summary: str = ""                 # what the job did, once finished
    session_hash: str = ""            # gradio's session of the page that asked (its queued event carries it)
    event: str = ""                   # the api_name of the run the page queues for it
    reached: bool = False             # its event has been seen in gradio's queue
    withdrawn: bool = False           # stopped while waiting, its event taken out of the model's queue
    together: int = 1                 # the runs on the model (itself included) when it started
    ahead: int | None = None          # the fewest requests ever counted ahead of it while it waits

    @property
    def waiting(self) -> bool:
        return self.started_at is None and self.finished_at is None

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.finished_at is None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def elapsed(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self.started_at is None:
            return now - self.queued_at
        return (self.finished_at or now) - self.started_at


@dataclass
class Position:
    """Where a waiting job stands: the jobs that hold the model now (oldest first), how many requests wait for
    it before this one, whichever way they came (a page or the API), and whether gradio's queue holds its run."""
    running: list[Job]
    waiting: int
    queued: bool = False

    def __len__(self) -> int:
        return len(self.running) + self.waiting


class Lane:
    """The unfinished jobs of all sessions; a waiting job that its page stopped asking about for ``stale_s``
    seconds (a closed tab) no longer counts as ahead. ``queue`` (set by the app): gradio's queue of model work,
    (session hash, api_name) of each waiting event, oldest first: only it knows of an API request."""

    def __init__(self, stale_s: float = 30.0, queue: Callable[[], list[tuple[str, str]]] | None = None):
        self.stale_s, self.queue = stale_s, queue
        self._lock = threading.Lock()
        self._tickets = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._took: deque[wait.Ran] = deque(maxlen=20)  # how long the last jobs that ran to their end took
        self.withdraw: Callable[[str, str, int], int] | None = None   # set by the app: see ``take_back``

    def request(self, session_id: str, kind: str, session_hash: str = "", event: str = "") -> Job:
        with self._lock:
            job = Job(next(self._tickets), session_id, kind, session_hash=session_hash, event=event)
            self._jobs[job.ticket] = job
            return job

    def start(self, job: Job) -> None:
        with self._lock:
            job.started_at = time.monotonic()
            self._jobs[job.ticket] = job
            job.together = sum(1 for j in self._jobs.values() if j.running)

    def finish(self, job: Job, summary: str | None = None) -> None:
        with self._lock:
            if summary is not None:
                job.summary = summary
            if job.finished_at is None:
                job.finished_at = time.monotonic()
                if job.started_at is not None and not job.cancel:
                    m = getattr(job.run, "metrics", None) if job.kind == "generate" else None
                    beside = sum(1 for j in self._jobs.values() if j.running)   # itself too, at its end
                    self._took.append(wait.Ran(job.finished_at - job.started_at, getattr(m, "new_tokens", 0),
                                               (job.together + beside) / 2, job.max_tokens if m else 0))
            job.run = None
            self._jobs.pop(job.ticket, None)

    def beside(self, job: Job) -> int:
        """How many other jobs hold the model now (their runs share the machine with ``job``'s)."""
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.running and j is not job)

    def touch(self, job: Job) -> None:
        job.seen_at = time.monotonic()

    def position(self, job: Job) -> Position:
        """The jobs running and the requests waiting before ``job``. With gradio's ``queue``: the events queued
        before its own (every one if its own is not there yet), plus the pages' requests not yet queued that
        came before it; a page's k-th waiting job of a kind is its session's k-th queued event of that name.
        Without: the waiting jobs before it that their pages still ask about."""
        now = time.monotonic()
        events = self.queue() if self.queue is not None else None
        with self._lock:
            jobs = [j for _, j in sorted(self._jobs.items())]
        running = [j for j in jobs if j.running and j is not job]
        if events is None:
            return Position(running, sum(1 for j in jobs if j.ticket < job.ticket and j.waiting
                                         and now - j.seen_at < self.stale_s))
        where: dict[tuple[str, str], list[int]] = {}
        for i, key in enumerate(events):
            where.setdefault(key, []).append(i)
        at: dict[int, int] = {}
        for j in jobs:
            spots = where.get((j.session_hash, j.event))
            if j.waiting and j.session_hash and spots:
                at[j.ticket] = spots.pop(0)
                j.reached = True
        if job.ticket in at:
            return Position(running, at[job.ticket], queued=True)
        early = sum(1 for j in jobs if j.ticket < job.ticket and j.waiting and j.ticket not in at and not j.reached
                    and now - j.seen_at < self.stale_s)
        return Position(running, len(events) + early)

    def estimate(self, waiting: int, running: list[Job], slots: int, now: float | None = None) -> wait.Wait | None:
        """``csd.ui.wait.estimate`` of a request with ``running`` jobs on the model and ``waiting`` before it,
        ``slots`` at a time: from the runs in progress (their live rates) and the last 20 that ran to their end."""
        with self._lock:
            took = list(self._took)
        now = time.monotonic() if now is None else now
        return wait.estimate(waiting, [live(j, now) for j in running], took, slots)

    def take_back(self, jobs: list[Job]) -> int:
        """Take the runs of waiting ``jobs`` (stopped, of one session and kind, oldest first) out of gradio's queue
        of model work, to be ended at once (``withdraw``, set by the app). -> how many were taken out."""
        keys = {(j.session_hash, j.event) for j in jobs if j.waiting and j.session_hash}
        if self.withdraw is None or len(keys) != 1:
            return 0
        (session_hash, event), = keys
        n = self.withdraw(session_hash, event, len(jobs))
        for j in jobs[:n]:
            j.withdrawn = True
        return n

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)


def live(job: Job, now: float) -> wait.Live:
    """A running job as ``csd.ui.wait`` reads it: its live Run's counters (read without a lock)."""
    run = job.run
    m = getattr(run, "metrics", None)
    if m is None or not m.new_tokens:
        return wait.Live(job.elapsed(now), asked=job.max_tokens)
    snap = run.metrics_snapshot()
    writing = snap.wall_s - snap.prefill_s           # since its first token: the prompt's reading is the elapsed's
    return wait.Live(job.elapsed(now), m.new_tokens, job.max_tokens, m.new_tokens / writing if writing > 0 else None)
