"""The model lane: every user's requests for model work, each a ``Job`` from its click to its end, in the order
they came; what the page says about gradio's queue (docs/design.md, "The web app")."""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

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


class Lane:
    """The unfinished jobs of all sessions. A waiting job that its page stopped asking about for
    ``stale_s`` seconds (a closed tab, a request the queue refused) no longer counts as ahead."""

    def __init__(self, stale_s: float = 30.0):
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._tickets = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._took: deque[float] = deque(maxlen=20)     # how long the last jobs that ran to their end took

    def request(self, session_id: str, kind: str) -> Job:
        with self._lock:
            job = Job(next(self._tickets), session_id, kind)
            self._jobs[job.ticket] = job
            return job

    def start(self, job: Job) -> None:
        with self._lock:
            job.started_at = time.monotonic()
            self._jobs[job.ticket] = job

    def finish(self, job: Job, summary: str | None = None) -> None:
        with self._lock:
            if summary is not None:
                job.summary = summary
            if job.finished_at is None:
                job.finished_at = time.monotonic()
                if job.started_at is not None and not job.cancel:
                    self._took.append(job.finished_at - job.started_at)
            job.run = None
            self._jobs.pop(job.ticket, None)

    def touch(self, job: Job) -> None:
        job.seen_at = time.monotonic()

    def ahead(self, job: Job) -> list[Job]:
        """The jobs before this one that hold or wait for the model (oldest first)."""
        now = time.monotonic()
        with self._lock:
            return [j for t, j in sorted(self._jobs.items()) if t < job.ticket and j is not job and
                    (j.running or now - j.seen_at < self.stale_s)]

    def estimate(self, ahead: int, slots: int) -> tuple[float, int] | None:
        """(seconds until a job with ``ahead`` jobs before it starts, ``slots`` at a time each taking the median
        of the last jobs' durations; how many jobs that median is of); None before any job has ended."""
        with self._lock:
            took = sorted(self._took)
        if not took:
            return None
        slots = max(1, slots)
        rounds = -(-(ahead - slots + 1) // slots) if ahead >= slots else 0
        return took[len(took) // 2] * rounds, len(took)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)
