"""Data files: where the engine keeps what it makes once (``cache_dir``), atomic writes (a killed
process leaves the old file or the new one, never half of one) and JSON that is gzipped when the
name ends in ``.gz`` (read by its magic bytes, so a plain file with a ``.gz`` name still loads)."""
from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path


def cache_dir() -> Path:
    """Where converted models, measured profiles and smoothing maxima are kept: the user cache
    directory, or ``CSD_CACHE_DIR``."""
    env = os.environ.get("CSD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("csd-explorer"))


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
    try:                           # the directory entry too, where the file system can (the rename is done)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


GZIP_MAGIC = b"\x1f\x8b"


def write_json(path: str | os.PathLike, obj) -> Path:
    """``obj`` as JSON, gzipped (reproducibly: no time stamp) when the name ends in ``.gz``; atomic."""
    payload = json.dumps(obj).encode()
    if str(path).endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    return atomic_write(path, payload)


def read_maybe_gzip(path: str | os.PathLike) -> bytes:
    """The file's bytes, decompressed when they are gzip. OSError when it cannot be read;
    ValueError when it is damaged or truncated gzip."""
    raw = Path(path).read_bytes()
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{Path(path).name}: a damaged or truncated gzip file ({e})") from None
    return raw


def read_or_raise(path: str | os.PathLike, error: type[Exception], what: str = "") -> bytes:
    """``read_maybe_gzip``, its failures raised as ``error``: "cannot read {what}'path': why", or the damage."""
    try:
        return read_maybe_gzip(path)
    except OSError as e:
        raise error(f"cannot read {what}{str(path)!r}: {e.strerror}") from None
    except ValueError as e:
        raise error(str(e)) from None


def read_json(path: str | os.PathLike):
    """JSON from a plain or gzipped file (OSError: unreadable; ValueError: damaged or not JSON)."""
    return json.loads(read_maybe_gzip(path))
