"""Prompts that begin alike read their beginning once: the app's runs keep the target's keys and values of the
prompts they read, and a run whose prompt begins as a kept one copies those rows instead of computing them again.

A class that sends the lecturer's example prompt reads it once, and every chat shares the template's first lines.
A run whose whole prompt is being read by another run in flight waits for that reading and copies it (8 users who
click at once send the same prompt at once). Only a target whose every row is computed on its own takes part (the
GGUF blocks, ``csd.runtime.kquant``: a token's keys and values do not depend on which pass computed them), so a
copied row is the row the run would have computed, bit for bit, and its answer does not change
(``tests/test_prompt_rows.py``).

A run never copies what its own session read: a user who compares AR with CSD on one prompt, one after the other,
sees each read the prompt, as the comparison's timing assumes. The command line and the benchmark never share rows
between runs.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable

import torch

from ..events import common_prefix

BUDGET_TOKENS = 4096    # prompt tokens kept at most (the embedded target's rows: 57 KB a token, about 235 MB)


class PromptRows:
    """The target's rows of the prompts read lately (least recently used first out), shared by the app's runs.
    ``owner``: who asks (a session); a run copies only what another owner read or is reading."""

    def __init__(self, budget_tokens: int = BUDGET_TOKENS):
        self.budget = budget_tokens
        self._cond = threading.Condition()
        # prompt -> (keys, values, who read it last)
        self._kept: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor, object]] = OrderedDict()
        self._reading: dict[tuple[int, ...], Counter] = {}     # prompts being read now: by whom, how many runs

    @staticmethod
    def takes_part(lm) -> bool:
        """Whether ``lm`` (or the model behind a batcher's view) computes each row on its own: its rows can be
        shared."""
        inner = getattr(lm, "lm", lm)
        return getattr(inner, "impl", "") == "kquant"

    def tokens(self) -> int:
        """Prompt tokens whose rows are kept."""
        with self._cond:            # reentrant: done() asks while it holds the lock
            return sum(len(k) for k in self._kept)

    def clear(self) -> None:
        with self._cond:
            self._kept.clear()

    def fill(self, lm, cache, ids: list[int], check_stop: Callable[[], None], owner: object) -> int:
        """Copy into the empty ``cache`` the kept rows of the longest beginning of ``ids`` that another owner read,
        after waiting for another owner's run in flight that reads the very same ``ids``; -> how many rows were
        copied. The run then counts as reading ``ids`` until ``done``. ``check_stop`` raises where the run is
        stopped while it waits."""
        key = tuple(ids)
        with self._cond:
            while self._read_by_other(key, owner) and not self._kept_by_other(key, owner):
                self._cond.wait(0.05)
                check_stop()
            n, rows = self._longest(key, owner)
            self._reading.setdefault(key, Counter())[owner] += 1
        if n:
            k, v = rows
            lm.load_rows(cache, k[:, :, :n], v[:, :, :n])
        return n

    def done(self, lm, cache, ids: list[int], read: bool, owner: object) -> None:
        """The run's reading of ``ids`` ended; ``read``: it completed, and ``cache`` holds their rows to keep. A
        prompt kept already keeps its rows and its first reader (a run that copied it whole has nothing new, and
        must not make the first reader's own prompt copyable to that reader)."""
        key = tuple(ids)
        with self._cond:
            kept = key in self._kept
        rows = lm.rows(cache, len(ids)) if read and ids and not kept else None
        with self._cond:
            readers = self._reading[key]
            readers[owner] -= 1
            if readers[owner] <= 0:
                del readers[owner]
            if not readers:
                del self._reading[key]
            if rows is not None and key not in self._kept:
                self._kept[key] = (*rows, owner)
            if key in self._kept:
                self._kept.move_to_end(key)
                while len(self._kept) > 1 and self.tokens() > self.budget:
                    self._kept.popitem(last=False)
            self._cond.notify_all()

    def _read_by_other(self, key: tuple[int, ...], owner: object) -> bool:
        return any(who != owner for who in self._reading.get(key, ()))

    def _kept_by_other(self, key: tuple[int, ...], owner: object) -> bool:
        return key in self._kept and self._kept[key][2] != owner

    def _longest(self, key: tuple[int, ...], owner: object):
        best, rows, hit = 0, None, None
        for kept, (k, v, who) in self._kept.items():
            if who == owner:
                continue
            n = common_prefix(kept, key)
            if n > best:
                best, rows, hit = n, (k, v), kept
        if hit is not None:
            self._kept.move_to_end(hit)
        return best, rows
