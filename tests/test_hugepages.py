"""Weights on 2 MB pages (``csd.runtime.hugepages``): the arena hands back the same values, each tensor on its own
cache line, its mappings advised for huge pages; ``CSD_HUGEPAGES=0`` keeps ordinary memory; a model loaded from a
GGUF file holds its matrices there, and gives the same logits as one loaded without the arena."""
from __future__ import annotations

import gc
import mmap
import weakref

import pytest
import torch

from csd.runtime import hugepages, kquant
from csd.runtime.embedded import assembled

needs_linux = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="MADV_HUGEPAGE is Linux's")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@needs_linux
def test_the_arena_gives_back_the_values_aligned_and_advised_for_huge_pages():
    arena = hugepages.Arena()
    src = [torch.randn(1000), torch.arange(77, dtype=torch.int16), torch.randint(0, 255, (3, 5, 7), dtype=torch.uint8)]
    placed = [arena.place(t) for t in src]
    for a, b in zip(src, placed):
        assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b)
        assert b.data_ptr() != a.data_ptr()
        assert b.data_ptr() % hugepages.ALIGN == 0
    assert placed[0].data_ptr() % hugepages.HUGE == 0          # a fresh mapping starts on a 2 MB boundary
    assert "hg" in vm_flags(placed[0].data_ptr())               # madvise(MADV_HUGEPAGE) took
    placed[1][0] = 5                                           # the arena's memory is the tensor's own
    assert placed[1][0] == 5 and src[1][0] == 0


@needs_linux
def test_a_tensor_larger_than_a_chunk_gets_a_mapping_of_its_own():
    arena = hugepages.Arena()
    small = arena.place(torch.ones(10))
    big = arena.place(torch.zeros(hugepages.CHUNK // 4 + 3))     # more than a chunk of float32
    assert torch.equal(big, torch.zeros_like(big)) and small.sum() == 10
    assert big.data_ptr() % hugepages.HUGE == 0


@needs_linux
def test_a_mapping_is_freed_with_the_last_tensor_in_it():
    arena = hugepages.Arena()
    t = arena.place(torch.ones(4096))
    gone = weakref.ref(arena._map)
    arena._map = None               # the arena moves on (as after its last tensor)
    assert gone() is not None       # the tensor still holds it
    del t
    gc.collect()
    assert gone() is None


def test_switched_off_the_arena_keeps_ordinary_memory(monkeypatch):
    monkeypatch.setenv(hugepages.ENV, "0")
    t = torch.randn(100)
    assert hugepages.Arena().place(t) is t
    assert not hugepages.supported()


@needs_linux
def test_a_gguf_models_matrices_live_in_the_arena_and_give_the_same_logits(monkeypatch):
    """The draft's matrices (its reduced output layer too) in huge-page mappings; the same model in ordinary memory
    gives the same bits, for a 1-token step and a pass of 5."""
    vocab = torch.arange(0, 151936, 7)
    with assembled("draft") as path:
        models = {}
        for env in ("1", "0"):
            monkeypatch.setenv(hugepages.ENV, env)
            models[env] = kquant.lean_from_gguf(path, vocab)
    qkv = models["1"].layers[0][1]
    assert isinstance(qkv, kquant.KQuantLinear)
    assert "hg" in vm_flags(qkv.parts[0].packed["qw"].data_ptr())
    assert "hg" in vm_flags(models["1"].head.parts[0].packed["qw"].data_ptr())
    # (no claim about the copy in ordinary memory: numpy advises its own arrays of 4 MB or more for huge pages, and
    # heap memory it once advised keeps the flag for whatever is allocated there later)
    out = {}
    for env, lm in models.items():
        cache = lm.new_cache()
        out[env] = [lm.forward(cache, list(range(1000, 1040)), 1), lm.forward(cache, [3, 4, 5, 6, 7], 5)]
    assert all(torch.equal(a, b) for a, b in zip(out["1"], out["0"]))
