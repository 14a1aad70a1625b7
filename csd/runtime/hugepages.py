"""Weights kept in memory that the kernel can map with 2 MB pages (Linux's transparent huge pages).

A step streams every weight of a model once. With the usual 4 KB pages, the target's 1 GB covers 250,000 pages,
so the CPU has to walk its page tables again every 4 KB that it streams. With 2 MB pages it walks once every 2 MB.
(numpy advises its own arrays of 4 MB or more for huge pages, so before the arena only the blocks of a matrix
repacked in one piece could get them.) On an AMD EPYC (Zen 4, 2 cores) the arena made the draft's step 4-7% and
the target's 1-token pass 3-5% faster, at the same bits (docs/bench/hugepages/README.md).

Linux gives 2 MB pages to a private anonymous mapping that asks for them with ``madvise(MADV_HUGEPAGE)``, where
``/sys/kernel/mm/transparent_hugepage/enabled`` says ``always`` or ``madvise`` (the usual default). An ``Arena``
hands out pieces of such mappings. Where the system gives no huge pages (another OS, the setting ``never``), the
same mappings simply hold 4 KB pages: the weights are the same bytes either way, so nothing else changes.
"""
from __future__ import annotations

import logging
import mmap
import os

import torch

log = logging.getLogger(__name__)

HUGE = 2 << 20                  # the size and alignment of a huge page on x86-64 and most ARM64 kernels
CHUNK = 64 << 20                # one mapping holds this much unless a single tensor needs more
ALIGN = 64                      # each tensor starts on its own cache line
ENV = "CSD_HUGEPAGES"           # "0" keeps the weights in ordinary memory (to compare the two)


def supported() -> bool:
    """Whether the weights go to huge-page mappings here: Linux with ``MADV_HUGEPAGE``, unless ``CSD_HUGEPAGES=0``."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE") and os.environ.get(ENV, "1") != "0"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Arena:
    """Copies tensors into mappings advised for huge pages, one after another (a bump allocator).

    A mapping is freed when the last tensor placed in it is gone: each tensor holds a reference to its mapping.
    """

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self._start = 0             # the offset of the first 2 MB boundary in the current mapping
        self._used = 0              # bytes handed out from there
        self._size = 0              # bytes usable from there

    def _open(self, at_least: int) -> None:
        size = _round_up(max(CHUNK, at_least), HUGE)
        # a private mapping: a shared one would be shmem, which has its own (usually off) huge-page setting
        m = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        address = torch.frombuffer(m, dtype=torch.uint8, count=1).data_ptr()
        start = -address % HUGE
        try:
            m.madvise(mmap.MADV_HUGEPAGE, start, size)
        except OSError as e:        # a kernel built without transparent huge pages: 4 KB pages, same bytes
            log.debug("madvise(MADV_HUGEPAGE) refused (%s): the weights stay on 4 KB pages", e)
        self._map, self._start, self._used, self._size = m, start, 0, size

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor in the arena (an ordinary one where the arena is off)."""
        n = torch.Size(shape).numel() * dtype.itemsize
        if not supported() or n == 0:
            return torch.empty(shape, dtype=dtype)
        if self._map is None or self._used + n > self._size:
            self._open(n)
        out = torch.frombuffer(self._map, dtype=torch.uint8, count=n, offset=self._start + self._used)
        self._used += _round_up(n, ALIGN)
        return out.view(dtype).view(shape)

    def place(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of the CPU tensor ``t`` in the arena (``t`` itself where the arena is off)."""
        if not supported() or t.numel() == 0:
            return t
        return self.empty(tuple(t.shape), t.dtype).copy_(t)
