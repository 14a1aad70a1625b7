"""Atomic file writes: a killed process leaves the old file or the new one, never half of one."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, then rename it over
    ``path`` (and flush the directory entry). On any error the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)        # mkstemp makes 0600; these are shareable data files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:                # some file systems do not open directories
        return path
    try:
        os.fsync(dfd)
    except OSError:
        pass                       # fsync on a directory is not supported everywhere; the rename is done
    finally:
        os.close(dfd)
    return path
