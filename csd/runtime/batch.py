"""Several runs decoding together (docs/users.md): one draft step and one verify pass serve every run
waiting for that model. Each run keeps its own loop, caches, rule, memory and events; a run of a
``Batcher.view`` calls ``forward`` on a ``BatchedLM``, which hands the call to the batcher's model thread.
That thread gathers the calls waiting for one model (up to ``window_s``, or until every joined run has
one waiting) into one ``LeanLM.forward_many`` pass. Rows scaled per token compute the same bits alone or
in any batch (``tests/test_batch.py``); a target scaled per pass is not merged with other runs. A run that
starts alone may draft with a ``solo`` draft (ort4: faster for one run, one call a run; docs/users.md)."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

from . import threads

log = logging.getLogger(__name__)

MAX_BATCH_TOKENS = 512      # a pass's rows at most (prefill chunks are up to 256 tokens)


@dataclass(eq=False)
class _Call:
    lm: BatchedLM
    cache: object
    ids: object
    keep: int
    tokens: int
    at: float = field(default_factory=time.monotonic)
    done: Future = field(default_factory=Future)


class BatchedLM:
    """An ``LM`` whose forward passes go through a ``Batcher``; everything else (``__getattr__``) is the model's."""
    shares_passes = True     # a pass's time includes other runs' work: not one run's cost (csd.decode)

    def __init__(self, batcher: Batcher, lm, mode: str = "", is_target: bool = False):
        # is_target: this is a run's view of the shared target, whose cache stands for the run (it joins the
        # runs in flight on its first pass and leaves on release); a draft's view does neither
        self.batcher, self.lm, self.mode, self.is_target = batcher, lm, mode, is_target

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def runs_sharing(self, cache) -> int:
        """How many runs are in flight now, the run of this target ``cache`` included (before its first pass too):
        what each of their blocks is planned for."""
        return self.batcher.runs(id(cache))

    def release(self, cache) -> None:
        """The run is over: it no longer counts as one that may call soon."""
        if self.is_target:
            self.batcher.leave(id(cache))

    def forward(self, cache, ids, keep: int) -> torch.Tensor:
        if self.is_target:                 # a run's target cache stands for the run, from its first pass
            self.batcher.join(id(cache))
        return self.batcher.call(_Call(self, cache, ids, keep, ids.numel() if torch.is_tensor(ids) else len(ids)))


def can_batch(pair) -> bool:
    """Whether runs of this pair can decode together: the lean path, eager (``forward_many``)."""
    return all(lm is None or hasattr(lm, "forward_many") for lm in (pair.target_lm, pair.draft_lm))


class Batcher:
    """The one thread that runs a pair's model passes for every run of its views."""

    # window_s: how long a pass waits for the calls of runs in flight that have none waiting yet (a run alone never
    # waits); 40 ms gathered about 7 of 8 runs a pass where 10 ms gathered 4 (docs/bench/gguf-epyc4/README.md)
    def __init__(self, pair, window_s: float = 0.04, solo=None):
        if not can_batch(pair):
            raise ValueError("runs decode together on the lean path only (an eager LeanLM target and draft)")
        self.pair, self.window_s, self.solo = pair, window_s, solo     # solo: ``pair`` with another draft
        if hasattr(pair.draft_lm, "int8_per_row"):
            pair.draft_lm.int8_per_row()    # an int8 draft's rows scaled on their own: a batch cannot change them
        self._cond = threading.Condition()
        self._pending: list[_Call] = []
        self._in_flight: set[int] = set()   # the runs in flight (their target caches' ids)
        self._closed = False
        self.sizes: Counter = Counter()     # (model role, runs served) -> passes made
        self.busy_s: Counter = Counter()    # model role -> seconds its passes took
        self.rows: Counter = Counter()      # model role -> token rows its passes took
        ready = threading.Event()
        self.threads = torch.get_num_threads()     # the model thread's (its creator's count: csd.runtime.threads)
        self._thread = threading.Thread(target=self._serve, args=(self.threads, ready), name="csd-batcher",
                                        daemon=True)
        self._thread.start()
        ready.wait()        # the model thread holds its cores before the caller's next step (csd.runtime.threads)

    def view(self, mode: str = "", solo: bool = False):
        """The pair as a run sees it, its passes made here; ``mode``: an int8 target's activation scales."""
        mode, base = mode or self.pair.rep.activations, self.solo if solo and self.solo is not None else self.pair
        return replace(base, target_lm=BatchedLM(self, self.pair.target_lm, mode, is_target=True),
                       draft_lm=None if base.draft_lm is None else BatchedLM(self, base.draft_lm),
                       rep=base.rep.with_activations(mode))

    def idle(self) -> bool:     # no run in flight: the next may take the solo draft (two that start at once both may)
        return not (self._in_flight or self._pending)

    def waiting(self) -> int:
        """How many calls wait for the model thread now."""
        with self._cond:
            return len(self._pending)

    def runs(self, run: int) -> int:
        """The runs in flight, ``run`` (a target cache's id) counted whether or not it has joined yet."""
        with self._cond:
            return len(self._in_flight | {run})

    def join(self, run: int) -> None:
        with self._cond:
            self._in_flight.add(run)

    def leave(self, run: int) -> None:
        with self._cond:
            self._in_flight.discard(run)
            self._cond.notify_all()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the model thread once the calls already waiting are served, and wait for it (the app's
        shutdown: ``csd_app.main``). A call made after this raises ``RuntimeError``. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the model thread still serves calls."""
        return self._thread.is_alive()

    def call(self, c: _Call) -> torch.Tensor:
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed: the app is shutting down")
            self._pending.append(c)
            self._cond.notify_all()
        return c.done.result()

    # -- the model thread ----------------------------------------------------------------------
    def _serve(self, cores: int, ready: threading.Event) -> None:
        threads.defer()                 # the page's light work first when it needs a core (csd.runtime.threads)
        threads.own_cores(cores)        # the creating thread's count, whatever other threads are given later
        ready.set()
        while batch := self._gather():
            self._run(batch)

    def _gather(self) -> list[_Call]:
        """Wait for calls, then up to ``window_s`` for every joined run's; take the first and its pass-mates.
        Nothing (an empty list) once the batcher is closed and no call waits: the model thread ends."""
        with self._cond:
            while not self._pending:
                if self._closed:
                    return []
                self._cond.wait()
            deadline = self._pending[0].at + self.window_s
            while not self._closed and len(self._pending) < len(self._in_flight):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            # drafts first: the verify passes then gather every run (runs fall into step)
            first = next((c for c in self._pending if not c.lm.is_target), self._pending[0])
            # a target pass with one activation scale per pass is not merged with other runs' rows
            alone = first.lm.is_target and first.lm.mode == "pass" and self.pair.rep.target == "int8"
            # the first call is always taken, even one of more rows than a pass's budget (a draft catching up on
            # a long stretch it did not draft): a call that fitted no pass would never be served
            batch, tokens = [], 0
            for c in list(self._pending):
                fits = c is first or tokens + c.tokens <= MAX_BATCH_TOKENS
                if c.lm.lm is first.lm.lm and c.lm.mode == first.lm.mode and fits and not (alone and batch):
                    batch.append(c)
                    tokens += c.tokens
                    self._pending.remove(c)
            return batch

    def _run(self, batch: list[_Call]) -> None:
        """One pass for the batch; if it fails, each call again alone (a failed pass moved no cache)."""
        first = batch[0]
        try:
            if first.lm.is_target and first.lm.mode and first.lm.mode != self.pair.rep.activations:
                self.pair.set_activations(first.lm.mode)
            t0 = time.perf_counter()
            out = first.lm.lm.forward_many([c.cache for c in batch], [c.ids for c in batch], [c.keep for c in batch])
            elapsed = time.perf_counter() - t0
        except Exception as e:
            if len(batch) > 1:
                for c in batch:
                    self._run([c])
                return
            log.exception("a model pass failed")
            first.done.set_exception(e)
            return
        role = "target" if first.lm.is_target else "draft"
        self.sizes[(role, len(batch))] += 1
        self.busy_s[role] += elapsed
        self.rows[role] += sum(c.tokens for c in batch)
        for c, logits in zip(batch, out):
            c.done.set_result(logits)

    def stats(self) -> dict:
        """Per model: passes made, calls served (calls / passes is how many runs a pass served), the widest pass,
        the token rows its passes took and the seconds they took on the model thread."""
        out = {role: dict(passes=0, calls=0, widest=0, rows=self.rows[role], seconds=round(self.busy_s[role], 3))
               for role, _ in self.sizes}
        for (role, n), k in self.sizes.items():
            d = out[role]
            d["passes"], d["calls"], d["widest"] = d["passes"] + k, d["calls"] + n * k, max(d["widest"], n)
        return out
