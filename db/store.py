"""The divergence-event store: runs, token events and memory snapshots in any SQLAlchemy database.

``Store.open(url)`` opens the database and upgrades its schema; ``RunRecorder`` writes a run's token events
off the decode loop's path, in batches from a background thread (docs/scale.md).
"""
from __future__ import annotations

import atexit
import os
import sqlite3
import tempfile
import threading
import time
import traceback
import zlib
from collections import deque
from collections.abc import Callable
from itertools import islice
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, insert, make_url, update
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from csd.db.models import CANCELLED, FAILED, FINISHED, MemorySnapshot, RunRow, TokenEventRow, utcnow
from csd.events import OUTPUT_STATUSES, STOP_CANCELLED, RunMetrics, TokenEvent
from csd.memory import CorrectionMemory

ENV_URL = "CSD_DB_URL"
MIGRATIONS = Path(__file__).with_name("migrations")
CONTEXT_CHARS = 40            # output text kept before each token as its context
SQLITE_BUSY_MS = 30_000       # how long a SQLite writer waits for the write lock
_RUN_FIELDS = frozenset(RunRow.__table__.columns.keys()) - {"id"}


class StoreError(RuntimeError):
    """The store could not write what it was given (the message says what is lost)."""


class StoreOpenError(ValueError):
    """The database cannot be opened: a URL that does not parse, a missing driver, a server that does not
    answer, a file that is not a database. Nothing was written to it."""


def run_fields(pair, cfg=None, **fields) -> dict:
    """The columns of a stored run: ``pair``'s models and representations, then ``cfg``'s parameters (a
    ``csd.config.CSDConfig``, if given), then ``fields``."""
    return {**pair.run_fields(), **(cfg.run_fields() if cfg is not None else {}), **fields}


def resolve_url(url: str | None = None) -> str:
    """``url``, else $CSD_DB_URL, else a SQLite file in the user's data directory. A value without a scheme
    (``runs.sqlite3``, ``~/csd.db``) is a SQLite file's path."""
    url = url or os.environ.get(ENV_URL)
    if url and url.lower() == "none":
        raise StoreOpenError("'none' is no database: it turns recording off where a command records (the app, "
                             "generate, calibrate, bench), and a command that reads the store needs one")
    if not url:
        from platformdirs import user_data_dir
        return f"sqlite:///{Path(user_data_dir('csd-explorer')) / 'csd.sqlite3'}"
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def _shown(url: str) -> str:
    """The URL as an error message shows it: without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def alembic_config(url: str | None = None, connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def _clean(s: str | None) -> str | None:
    """Text every engine stores: PostgreSQL refuses NUL, UTF-8 refuses lone surrogates."""
    return None if s is None else s.replace("\x00", "\u2400").encode("utf-8", "replace").decode()


def _make_engine(url: str) -> tuple[Engine, str | None]:
    """An engine for ``url``; in-memory SQLite becomes a private temp file (returned for deletion) so
    that the writer threads and the readers see one database."""
    u = make_url(url)
    scratch = None
    if u.get_backend_name() == "sqlite":
        if u.database in (None, "", ":memory:"):
            fd, scratch = tempfile.mkstemp(prefix="csd-", suffix=".sqlite3")
            os.close(fd)
            u = u.set(database=scratch)
        else:
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(u)
        _sqlite_setup(engine)
    else:
        engine = create_engine(u, pool_pre_ping=True)
    return engine, scratch


def _retry_busy(step: Callable[[], object], wait_ms: int = SQLITE_BUSY_MS) -> None:
    """Run ``step`` until SQLite stops answering "database is locked", for at most ``wait_ms`` (switching to
    WAL reports a competing opener as busy at once, without calling the busy handler)."""
    deadline = time.monotonic() + wait_ms / 1000
    pause = 0.005
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _sqlite_setup(engine: Engine) -> None:
    # SQLAlchemy's recipe for real SQLite transactions (pysqlite's legacy mode does not BEGIN before
    # DDL); writers BEGIN IMMEDIATE so that they queue on busy_timeout instead of failing on upgrade.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        _retry_busy(lambda: cur.execute("PRAGMA journal_mode=WAL"))
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("csd_write") else "BEGIN")


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; concurrent openers wait for each other."""
    with engine.execution_options(csd_write=True).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({zlib.crc32(b'csd-explorer migrations')})")
        command.upgrade(alembic_config(connection=conn), "head")


class Store:
    def __init__(self, engine: Engine, scratch: str | None = None):
        self.engine = engine
        self.session = sessionmaker(engine, expire_on_commit=False)       # reads: ``with store.session() as s``
        self._write_engine = engine.execution_options(csd_write=True)
        self._scratch = scratch
        self.cache: dict = {}        # per-store memo of csd.db.analytics (what-if arrays)

    @classmethod
    def open(cls, url: str | None = None) -> Store:
        """Open (creating if needed) the database at ``resolve_url(url)`` and upgrade its schema; a database that
        cannot be opened raises ``StoreOpenError`` with what to do."""
        url = resolve_url(url)
        try:
            engine, scratch = _make_engine(url)
        except (ArgumentError, NoSuchModuleError, ImportError, OSError) as e:
            raise StoreOpenError(f"cannot open the database {_shown(url)}: {e}. Give a SQLite file's path, or a "
                                 "SQLAlchemy URL such as sqlite:///runs.sqlite3 or postgresql+psycopg://user@host/db "
                                 "(whose driver is installed)") from e
        try:
            upgrade(engine)
        except (SQLAlchemyError, sqlite3.Error) as e:
            engine.dispose()
            reason = getattr(e, "orig", None) or e
            raise StoreOpenError(f"cannot open the database {_shown(url)}: {type(reason).__name__}: {reason}"
                                 .split("\n")[0]) from e
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, scratch)

    def close(self) -> None:
        self.engine.dispose()
        if self._scratch:
            for suffix in ("", "-wal", "-shm"):
                Path(self._scratch + suffix).unlink(missing_ok=True)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_session(self) -> Session:
        """A session whose transactions take the write lock at BEGIN (SQLite) — use for read-modify-write."""
        return Session(self._write_engine, expire_on_commit=False)

    # -- runs ------------------------------------------------------------------------------
    def start_run(self, **fields) -> int:
        """Record a new run (status running); ``fields`` are RunRow columns (``run_fields``). Returns its id."""
        unknown = set(fields) - _RUN_FIELDS
        if unknown:
            raise TypeError(f"unknown run fields: {sorted(unknown)}")
        values = {k: _clean(v) if isinstance(v, str) else v for k, v in fields.items()}
        with self._write_engine.begin() as conn:
            return conn.execute(insert(RunRow).values(**values)).inserted_primary_key[0]

    def finish_run(self, run_id: int, output_text: str | None = None, metrics=None,
                   status: str = FINISHED, error: str | None = None) -> None:
        values = dict(status=status, finished_at=utcnow(), error=_clean(error))
        if output_text is not None:
            values["output_text"] = _clean(output_text)
        if metrics is not None:   # the database border: typed metrics become JSON here
            values["metrics"] = metrics.to_dict() if isinstance(metrics, RunMetrics) else dict(metrics)
        with self._write_engine.begin() as conn:
            conn.execute(update(RunRow).where(RunRow.id == run_id).values(**values))

    def get_run(self, run_id: int) -> RunRow | None:
        with self.session() as s:
            return s.get(RunRow, run_id)

    def recorder(self, run_id: int, **options) -> RunRecorder:
        """The recorder of a started run (``options``: ``RunRecorder``'s batch_size, flush_interval, on_commit)."""
        return RunRecorder(self, run_id, **options)

    def record(self, **fields) -> RunRecorder:
        """Start a run (``fields``: RunRow columns) and return its recorder, for a ``with`` block that calls
        ``rec.add(event)`` per event and ``rec.result(text, metrics)`` at the end."""
        return self.recorder(self.start_run(**fields))

    # -- memory snapshots --------------------------------------------------------------------
    def save_memory(self, memory: CorrectionMemory, run_id: int | None = None, label: str = "") -> int:
        with self._write_engine.begin() as conn:
            return conn.execute(insert(MemorySnapshot).values(
                run_id=run_id, pair_id=_clean(memory.pair_id), label=_clean(label), n_patterns=len(memory),
                total=round(memory.total), counts=memory.to_dict())).inserted_primary_key[0]


class RunRecorder:
    """Writes one run's token events in the background: ``add`` appends to a deque, a thread inserts every
    ``batch_size`` events or ``flush_interval`` seconds, one commit per batch. As a context manager it finishes
    the run: failed on an exception, cancelled on GeneratorExit / KeyboardInterrupt or at interpreter exit."""

    MAX_BATCH = 2000   # rows per commit when the writer falls behind

    def __init__(self, store: Store, run_id: int, batch_size: int = 64, flush_interval: float = 0.2,
                 on_commit: Callable[[int], None] | None = None):
        self.store, self.run_id = store, run_id
        self.batch_size, self.flush_interval, self.on_commit = batch_size, flush_interval, on_commit
        self.committed = 0                   # events committed so far (= the next seq)
        self.error: Exception | None = None  # the last write failure, None once a write succeeds
        self._pending: deque = deque()
        self._wake = threading.Event()
        self._stop = False
        self._finished = False
        self._tail = ""                      # last CONTEXT_CHARS of the output text so far
        self._result: tuple | None = None    # (output_text, metrics, status) for a normal exit
        self._output: list[str] = []         # output text so far, for runs that end without one
        self._thread = threading.Thread(target=self._run, name=f"csd-recorder-{run_id}", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def add(self, event: TokenEvent) -> None:
        """Queue one event; its context is the output text of the events added before it."""
        self._pending.append(event)
        if len(self._pending) >= self.batch_size:
            self._wake.set()

    def finish(self, output_text: str | None = None, metrics=None, status: str = FINISHED,
               error: str | None = None) -> None:
        """Write the remaining events, then the run's result. ``output_text`` None = the recorded text."""
        if self._finished:
            raise RuntimeError(f"run {self.run_id} already finished")
        self._finished = True
        atexit.unregister(self._at_exit)
        self._stop = True
        self._wake.set()
        self._thread.join()
        if self._pending:
            raise StoreError(f"run {self.run_id}: {len(self._pending)} events not written: {self.error!r}")
        if output_text is None:
            output_text = "".join(self._output)
        self.store.finish_run(self.run_id, output_text, metrics, status, error)

    def result(self, output_text: str | None, metrics=None, status: str | None = None) -> None:
        """What a normal exit of the ``with`` block records (status: from the metrics if not given)."""
        if status is None:
            status = CANCELLED if isinstance(metrics, RunMetrics) and metrics.stopped_by == STOP_CANCELLED else FINISHED
        self._result = (output_text, metrics, status)

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._finished:
            return False
        text, metrics, status = self._result or (None, None, FINISHED)
        if exc_type is None:
            self.finish(text, metrics, status)
        elif issubclass(exc_type, (GeneratorExit, KeyboardInterrupt)):
            self.finish(text, metrics, status=CANCELLED)
        else:
            self.finish(text, metrics, status=FAILED,
                        error="".join(traceback.format_exception_only(exc_type, exc)).strip())
        return False

    def _at_exit(self) -> None:
        if not self._finished:
            self.finish(status=CANCELLED, error="the process exited before the run finished")

    # -- the writer thread -------------------------------------------------------------------
    def _run(self) -> None:
        retries = 0
        while True:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            stopping = self._stop         # read before writing: all that finish() waits for is queued
            ok = self._write_pending()
            if stopping and (ok or retries == 3):
                return
            retries += stopping

    def _write_pending(self) -> bool:
        while self._pending:
            items = list(islice(self._pending, self.MAX_BATCH))
            tail, n_output = self._tail, len(self._output)
            rows = [self._row(seq, e) for seq, e in enumerate(items, self.committed)]
            try:
                with self.store._write_engine.begin() as conn:
                    conn.execute(insert(TokenEventRow), rows)
            except Exception as e:        # keep the batch queued, retry at the next wake-up
                self._tail = tail
                del self._output[n_output:]
                self.error = e
                return False
            self.error = None
            for _ in items:
                self._pending.popleft()
            self.committed += len(rows)
            if self.on_commit is not None:
                self.on_commit(self.committed)
        return True

    def _row(self, seq: int, e: TokenEvent) -> dict:
        row = vars(e).copy()
        draft_top, target_top = row.pop("draft_top"), row.pop("target_top")
        row.update(run_id=self.run_id, seq=seq, context=_clean(self._tail),
                   text=_clean(e.text), draft_text=_clean(e.draft_text), target_text=_clean(e.target_text),
                   explain=None if draft_top is None and target_top is None
                   else {"draft_top": draft_top, "target_top": target_top})
        if e.status in OUTPUT_STATUSES:
            self._output.append(e.text)
            self._tail = (self._tail + e.text)[-CONTEXT_CHARS:]
        return row


class NullRecorder:
    """The recorder of a run that is not recorded (no store): same surface, does nothing."""
    run_id = None

    def add(self, event: TokenEvent) -> None:
        pass

    def result(self, output_text: str | None, metrics=None, status: str | None = None) -> None:
        pass

    def __enter__(self) -> NullRecorder:
        return self

    def __exit__(self, *exc) -> bool:
        return False


def recording(store: Store | None, **fields) -> RunRecorder | NullRecorder:
    """``store.record(**fields)``, or a ``NullRecorder`` when there is no store."""
    return NullRecorder() if store is None else store.record(**fields)
