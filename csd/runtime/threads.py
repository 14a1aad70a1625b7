"""Who uses the CPU's threads (why, measured: docs/design.md, "One team of CPU threads": libgomp gives every thread that
runs torch a team of workers, and more teams than CPUs make each parallel region sleep). A process whose model runs on
another thread than the one that loaded it (the app) ends the loader's team (``hand_back``), gives the model's thread
the cores (``own_cores``) and keeps every other thread to one (``one_core``)."""
from __future__ import annotations

import ctypes
import functools
import os

import torch

OMP_PAUSE_HARD = 2      # omp_pause_resource_t: the calling thread's workers end (OpenMP 5.0)


def _mapped_files() -> list[str]:
    """The paths of the files mapped into this process (``/proc/self/maps``; OSError where there is none)."""
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            cols = line.split(None, 5)         # address, perms, offset, device, inode, path
            if len(cols) == 6:
                paths.append(cols[5].strip())
    return paths


@functools.cache
def _libgomp():
    """The GNU OpenMP runtime torch loaded, or None (another runtime, or none)."""
    try:
        paths = [path for path in _mapped_files() if "libgomp" in path]
        lib = ctypes.CDLL(paths[0]) if paths else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "omp_pause_resource_all") else None


def hand_back() -> bool:
    """End the calling thread's OpenMP worker threads (its next parallel operation starts new ones).
    False where torch does not run on libgomp, or inside a parallel region."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_HARD) == 0


def own_cores(n: int) -> None:
    """This thread's torch operations run on ``n`` threads."""
    torch.get_num_threads()     # torch sets a thread's count on its first use: first, so it cannot undo this
    torch.set_num_threads(n)


def one_core() -> None:
    """This thread's torch operations, and those of threads that start using torch from now on, run on
    one thread; its own workers end. Threads that already hold their count (``own_cores``) keep it."""
    own_cores(1)
    hand_back()


def defer(step: int = 5) -> None:
    """Lower this thread's scheduling priority by ``step`` (Linux: per thread, its workers inherit it), so that short
    work on other threads (a page's event loop) does not wait behind it on busy cores. Where allowed."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + step))
    except (AttributeError, OSError):
        pass
