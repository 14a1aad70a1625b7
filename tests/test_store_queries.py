"""What the store answers: the Pareto table, what-if, acceptance by position, exports, the ``runs``
command, migrations and SQLite's settings, on a real SQLite file and a real PostgreSQL server
(fixtures: store_fixtures.py)."""
from __future__ import annotations

import argparse
import csv
import io
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, make_url, select
from store_fixtures import ev, record, stored

from csd.db import analytics as A
from csd.db.analytics import Filter
from csd.db.cli import add_runs_parser
from csd.db.models import Base, MemorySnapshot, RunRow, TokenEventRow
from csd.db.store import ENV_URL, Store, StoreOpenError, alembic_config, resolve_url
from csd.events import ACCEPTED, BONUS, CORRECTED, REJECTED, RESCUED, RULE_RESCUE, TokenEvent
from csd.memory import CorrectionMemory


# -- analytics ---------------------------------------------------------------------------------
def pareto_fixture(store) -> tuple[int, int]:
    a = record(store, [ev(0, RESCUED, 10, 20, text="a"), ev(1, ACCEPTED, 10, text="b"),
                       ev(2, REJECTED, 30, 40, text="c"), ev(2, CORRECTED, 40, 40, text="d"),
                       ev(3, REJECTED, 10, 20, text="e"), ev(3, CORRECTED, 20, 20, text="f"),
                       ev(4, RESCUED, 50, 60, text="g"), ev(5, REJECTED, 30, 40, text="h"),
                       ev(5, CORRECTED, 40, 40, text="i"), ev(6, RESCUED, 10, 20, text="j"),
                       ev(7, BONUS, 70, 70, text="k")], method="csd")
    b = record(store, [ev(0, REJECTED, 10, 20, text="x"), ev(0, CORRECTED, 20, 20, text="y")],
               method="sd", session_id="u2")
    return a, b


def test_pareto_table_by_hand(store):
    a, b = pareto_fixture(store)
    rows = A.pareto_table(store, Filter(run_ids=[a]))
    assert [(r.draft_id, r.target_id, r.count) for r in rows] == [(10, 20, 3), (30, 40, 2), (50, 60, 1)]
    assert [r.share for r in rows] == pytest.approx([3 / 6, 2 / 6, 1 / 6])
    assert [r.cumulative_share for r in rows] == pytest.approx([3 / 6, 5 / 6, 1.0])
    assert (rows[0].draft_text, rows[0].target_text) == ("j", " w20")
    assert rows[0].example_context == "abdfgi"         # output before the latest (10 -> 20), event "j"
    assert rows[1].example_context == "abdfg"          # before "h"
    assert A.top_share(rows, 0.2) == pytest.approx(3 / 6)    # top round(0.6) = 1 pattern
    assert A.top_share(rows, 0.5) == pytest.approx(5 / 6)    # top 2 patterns
    assert A.top_share([]) == 0.0
    everything = A.pareto_table(store)
    assert [(r.draft_id, r.count) for r in everything] == [(10, 4), (30, 2), (50, 1)]
    assert everything[0].share == pytest.approx(4 / 7)
    assert [r.count for r in A.pareto_table(store, limit=1)] == [4]


def test_filters(store):
    a, b = pareto_fixture(store)
    n = lambda **kw: A.count_events(store, Filter(**kw))   # noqa: E731
    assert n() == 13
    assert n(run_ids=[b]) == 2 and n(methods=["sd"]) == 2 and n(session_id="u2") == 2
    assert n(methods=["csd"], statuses=[CORRECTED]) == 3
    assert n(pattern=(10, 20)) == 4 and n(pattern=(10, 20), methods=["csd"]) == 3
    assert n(text="W40") == 4                    # case-insensitive, token, draft, target text or context
    assert n(text="abdfgi") == 2                 # matched in the context of "j" and "k"
    assert n(text="%") == 0 and n(text="_") == 0    # LIKE wildcards are literal
    page = A.events(store, Filter(run_ids=[a]), limit=3, offset=2)
    assert [d["text"] for d in page] == ["c", "d", "e"] and page[0]["run_id"] == a


def test_filter_by_target_representation(store):
    """Runs in the exact mode and per pass are told apart (issue 38): the filter and the list of choices."""
    exact = record(store, [ev(0, RESCUED, 10, 20), ev(1, REJECTED, 30, 40)], session_id="u1",
                   representation="int8, activations per token")
    per_pass = record(store, [ev(0, REJECTED, 10, 20)], session_id="u1", representation="int8, activations per pass")
    record(store, [ev(0, REJECTED, 50, 60)], session_id="u2", representation="float32")
    n = lambda **kw: A.count_events(store, Filter(**kw))   # noqa: E731
    assert n(representations=["int8, activations per token"]) == 2 and n(representations=["float32"]) == 1
    assert n(representations=["int8, activations per pass"], session_id="u1") == 1
    assert n(representations=["int8, activations per pass"], session_id="u2") == 0
    assert [r.count for r in A.pareto_table(store, Filter(representations=["int8, activations per pass"]))] == [1]
    assert {d["run_id"] for d in A.events(store, Filter(representations=["int8, activations per token"]))} == {exact}
    assert A.representations(store, "u1") == ["int8, activations per pass", "int8, activations per token"]
    assert A.representations(store) == ["float32", "int8, activations per pass", "int8, activations per token"]
    assert per_pass != exact


def whatif_fixture(store) -> int:
    return record(store, [ev(0, RESCUED, 1, 2, count=7, gap=-1.0), ev(1, REJECTED, 1, 2, count=7, gap=-5.0),
                          ev(2, REJECTED, 3, 4, count=5, gap=-0.5), ev(3, RESCUED, 3, 4, count=6, gap=-4.6),
                          ev(4, REJECTED, 5, 6, count=None, gap=-0.1), ev(5, ACCEPTED, 7, count=9, gap=0.0)])


def test_what_if_by_hand(store):
    whatif_fixture(store)
    w = A.what_if(store, lam=6, tau=0.01)      # log 0.01 = -4.605: rescues -1.0 (count 7), -4.6 (count 6)
    assert (w.total, w.rescued, w.rate, w.by_pattern) == (5, 2, 0.4, {(1, 2): 1, (3, 4): 1})
    w = A.what_if(store, lam=5, tau=0.01)
    assert (w.rescued, list(w.by_pattern.items())) == (3, [((3, 4), 2), ((1, 2), 1)])
    assert A.what_if(store, lam=7, tau=0.001).by_pattern == {(1, 2): 2}
    assert A.what_if(store, lam=0, tau=0).rescued == 4          # unknown memory count: never rescued
    assert A.what_if(store, lam=0, tau=1).rescued == 0          # gap >= 0 only
    assert A.what_if(store, 6, 0.01, Filter(pattern=(1, 2))).total == 2
    grid = A.what_if_grid(store, [5, 6, 7], [0.001, 0.01, 0.5])
    assert grid.rescued.tolist() == [[4, 3, 1], [3, 2, 0], [2, 1, 0]] and grid.total == 5
    assert grid.rate[0, 0] == pytest.approx(0.8)
    with store.session() as s:                                 # a plain Session works too (uncached)
        assert A.what_if(s, 6, 0.01).rescued == 2
    # the cache sees new events
    record(store, [ev(0, REJECTED, 1, 2, count=10, gap=0.0)])
    w = A.what_if(store, lam=6, tau=0.01)
    assert (w.total, w.rescued, w.by_pattern) == (6, 3, {(1, 2): 2, (3, 4): 1})


def test_what_if_empty(store):
    w = A.what_if(store, 6, 0.01)
    assert (w.total, w.rescued, w.rate, w.by_pattern) == (0, 0, 0.0, {})
    assert A.what_if_grid(store, [1, 2], [0.1]).rescued.tolist() == [[0], [0]]


def test_acceptance_by_position(store):
    record(store, [ev(0, ACCEPTED, idx=0), ev(1, ACCEPTED, idx=1), ev(2, REJECTED, idx=2), ev(2, CORRECTED, idx=2),
                   ev(3, RESCUED, block=1, idx=0), ev(4, REJECTED, block=1, idx=1), ev(4, CORRECTED, block=1, idx=1),
                   ev(5, ACCEPTED, block=2, idx=0), ev(6, ACCEPTED, block=2, idx=1), ev(7, BONUS, block=2, idx=6)],
           method="csd")
    record(store, [ev(0, REJECTED, idx=0), ev(0, CORRECTED, idx=0)], method="sd")
    got = {m: [(p.index_in_block, p.kept, p.decided) for p in rows]
           for m, rows in A.acceptance_by_position(store).items()}
    assert got == {"csd": [(0, 3, 3), (1, 2, 3), (2, 0, 1)], "sd": [(0, 0, 1)]}
    assert A.acceptance_by_position(store, Filter(methods=["csd"]))["csd"][1].rate == pytest.approx(2 / 3)
    assert list(A.acceptance_by_position(store, Filter(methods=["sd"]))) == ["sd"]


@pytest.mark.parametrize("text, kind", [
    ("", A.PUNCTUATION), ("\n\n", A.PUNCTUATION), (" ", A.PUNCTUATION), (",", A.PUNCTUATION),
    (".", A.PUNCTUATION), ("_(", A.PUNCTUATION), ("—", A.PUNCTUATION), (" $", A.PUNCTUATION),
    ("42", A.DIGITS_MATH), (" 3.14", A.DIGITS_MATH), ("1,", A.DIGITS_MATH), ("+", A.DIGITS_MATH),
    (" =", A.DIGITS_MATH), ("≤", A.DIGITS_MATH), ("٣", A.DIGITS_MATH),
    (" the", A.WORDS), ("ing", A.WORDS), ("'t", A.WORDS), ("élan", A.WORDS), ("日本", A.WORDS),
    ("x1", A.OTHER), ("😀", A.OTHER), ("Hello,", A.OTHER), ("\ufffd", A.OTHER),
])
def test_token_kind(text, kind):
    assert A.token_kind(text) == kind


def test_rescued_by_kind(store):
    texts = [",", "\n", " 42", "+", " the", "ing", "x1", "😀"]
    record(store, [ev(i, RESCUED, text=t) for i, t in enumerate(texts)] + [ev(9, REJECTED, text="the")])
    assert A.rescued_by_kind(store) == {A.PUNCTUATION: 2, A.DIGITS_MATH: 2, A.WORDS: 2, A.OTHER: 2}
    assert A.rescued_by_kind(store, Filter(pattern=(4, 5))) == {A.PUNCTUATION: 0, A.DIGITS_MATH: 0, A.WORDS: 1,
                                                             A.OTHER: 0}


# -- export and the command line ----------------------------------------------------------------
EXPORT_EVENTS = [ev(0, text='a, "quoted"\nline', draft_top=[["a", 0.5]], target_top=[["b", 0.25]]),
                 ev(1, RESCUED, 3, 4, text="é", count=6, gap=-0.25, rule=RULE_RESCUE, draft_prob=0.125)]


def test_export_csv_and_jsonl(store, tmp_path):
    run_id = record(store, EXPORT_EVENTS)
    record(store, [ev(0, text="other run")])
    f = Filter(run_ids=[run_id])
    assert A.export_csv(store, f, tmp_path / "e.csv") == 2
    with open(tmp_path / "e.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == A.ROW_FIELDS
    assert [r["text"] for r in rows] == ['a, "quoted"\nline', "é"]
    assert (rows[0]["run_id"], rows[0]["seq"], rows[1]["gap"], rows[1]["memory_count"]) == (str(run_id), "0",
                                                                                           "-0.25", "6")
    assert json.loads(rows[0]["draft_top"]) == [["a", 0.5]] and rows[1]["draft_top"] == ""
    assert rows[1]["context"] == 'a, "quoted"\nline'

    buf = io.StringIO()
    assert A.export_jsonl(store, f, buf) == 2
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [TokenEvent.from_dict(d) for d in lines] == EXPORT_EVENTS
    assert [(d["run_id"], d["seq"]) for d in lines] == [(run_id, 0), (run_id, 1)]


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="csd")
    parser.add_argument("--db")            # as the lead's top-level parser may have one
    add_runs_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_runs_list_and_export(db_url, tmp_path, capsys):
    with Store.open(db_url) as store:
        fixed = record(store, EXPORT_EVENTS, method="sd", gamma=6, representation="float32")
        run_id = record(store, EXPORT_EVENTS, method="scg-only", label="my-label", gamma=0,
                        representation="int8, activations per token")
    assert cli("runs", "list", "--db", db_url) == 0
    out = capsys.readouterr().out.splitlines()
    head = out[0].split()
    assert head[:3] == ["id", "created_at", "kind"] and "representation" in head
    assert out[1].split()[0] == str(run_id) and "scg-only" in out[1] and "my-label" in out[1]
    assert "int8, activations per token" in out[1]
    g = out[0].index("gamma")                               # gamma "auto" (stored as 0) reads as auto
    assert out[1][g:].split()[0] == "auto" and out[2][g:].split()[0] == "6" and out[2].split()[0] == str(fixed)
    assert cli("--db", db_url, "runs", "list") == 0          # --db before the subcommand is kept
    assert str(run_id) in capsys.readouterr().out

    assert cli("runs", "export", str(run_id), "--format", "jsonl", "--db", db_url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [TokenEvent.from_dict(json.loads(line)) for line in lines] == EXPORT_EVENTS
    out_file = tmp_path / "run.csv"
    assert cli("runs", "export", str(run_id), "--db", db_url, "--out", str(out_file)) == 0
    assert "2 events" in capsys.readouterr().err
    with open(out_file, newline="", encoding="utf-8") as fh:
        assert len(list(csv.DictReader(fh))) == 2
    assert cli("runs", "export", str(run_id + 99), "--db", db_url) == 1
    assert f"no run {run_id + 99}" in capsys.readouterr().err


# -- opening and migrations ---------------------------------------------------------------------
def test_open_upgrades_an_old_empty_database(db_url):
    engine = create_engine(db_url)
    if engine.dialect.name == "sqlite":           # an existing SQLite file with no schema at all
        with sqlite3.connect(make_url(db_url).database) as con:
            con.execute("CREATE TABLE unrelated (x INTEGER)")
    assert "runs" not in inspect(engine).get_table_names()
    with Store.open(db_url) as store:
        store.start_run(method="csd")
    names = set(inspect(engine).get_table_names())
    assert {"runs", "token_events", "memory_snapshots", "alembic_version"} <= names
    from alembic.script import ScriptDirectory
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head == "0007"                         # the newest migration (the representation columns renamed)
    with engine.connect() as c:
        assert c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head
    # downgraded to the empty schema, the next open upgrades it again
    from alembic import command
    with engine.begin() as c:
        command.downgrade(alembic_config(connection=c), "base")
    assert "runs" not in inspect(engine).get_table_names()
    with engine.begin() as c:                     # a database made by the first release (schema 0001) ...
        command.upgrade(alembic_config(connection=c), "0001")
        c.exec_driver_sql("INSERT INTO runs (created_at, kind, pair_id, prompt, status, label) "
                          "VALUES ('2026-11-29 00:00:00', 'generate', 'p', 'old', 'finished', '')")
    with Store.open(db_url) as store:             # ... is upgraded in place and keeps its runs
        assert [(r["prompt"], r["lookup"], r["memory_policy"]) for r in A.runs_list(store)] == [("old", None, None)]
        record(store, [ev(0, REJECTED, 3, 4)])
    with engine.begin() as c:
        command.downgrade(alembic_config(connection=c), "base")
    with Store.open(db_url) as store:
        assert A.runs_list(store) == []
        Store.open(db_url).close()                  # opening an up-to-date database again is fine
    engine.dispose()


def test_a_database_from_before_the_representation_record_keeps_its_runs(db_url):
    """Revision 0007 renames runs.target_repr and draft_repr to the record's names, keeping their values."""
    from alembic import command
    engine = create_engine(db_url)
    with engine.begin() as c:
        command.upgrade(alembic_config(connection=c), "0006")
        c.exec_driver_sql("INSERT INTO runs (created_at, kind, pair_id, prompt, status, label, target_repr, "
                          "draft_repr) "
                          "VALUES ('2026-12-04 00:00:00', 'generate', 'p', 'old', 'finished', '', "
                          "'int8, activations per token', 'int4')")
    with Store.open(db_url) as store:
        run = store.get_run(A.runs_list(store)[0]["id"])
        assert (run.prompt, run.representation, run.draft_weights) == ("old", "int8, activations per token", "int4")
        assert A.representations(store) == ["int8, activations per token"]
    with engine.begin() as c:
        command.downgrade(alembic_config(connection=c), "base")
    engine.dispose()


def test_concurrent_opens_of_a_new_database(db_url, tmp_path):
    # Several rounds, each on a new database: the race (two openers switching a new SQLite file to
    # WAL at once) failed about one round in fifty with eight openers before _retry_busy.
    rounds = 6 if db_url.startswith("sqlite") else 1
    for k in range(rounds):
        url = f"sqlite:///{tmp_path / f'race{k}.sqlite3'}" if db_url.startswith("sqlite") else db_url
        errors = []

        def open_and_write(url=url, errors=errors):
            try:
                with Store.open(url) as store:
                    record(store, [ev(i) for i in range(20)])
            except Exception as e:   # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=open_and_write) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, (k, errors)
        with Store.open(url) as store:
            assert [r["n_events"] for r in A.runs_list(store)] == [20] * 8


def test_retry_busy_waits_out_locked_and_nothing_else():
    from csd.db.store import _retry_busy
    calls = []

    def fails(message, times):
        def step():
            calls.append(message)
            if len(calls) <= times:
                raise sqlite3.OperationalError(message)
        return step

    _retry_busy(fails("database is locked", 2), wait_ms=5_000)
    assert len(calls) == 3                                     # waited out two "locked" answers
    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        _retry_busy(fails("no such table: x", 99), wait_ms=5_000)
    assert len(calls) == 1                                     # any other error is raised at once
    calls.clear()
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _retry_busy(fails("database is locked", 10**9), wait_ms=200)
    assert 1 < len(calls) and time.monotonic() - t0 < 5       # gives up after its wait


def test_migration_matches_models(store):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    with store.engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []


def test_sqlite_pragmas(tmp_path):
    with Store.open(f"sqlite:///{tmp_path / 'sub' / 'dir' / 'x.sqlite3'}") as store, store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000


def test_in_memory_sqlite_is_one_database():
    with Store.open("sqlite://") as store:
        run_id = record(store, [ev(i) for i in range(100)])
        assert len(stored(store, run_id)) == 100
        scratch = store._scratch
    assert not Path(scratch).exists()


def test_url_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_URL, "sqlite:///from-env.sqlite3")
    assert resolve_url("sqlite:///arg.sqlite3") == "sqlite:///arg.sqlite3"
    assert resolve_url() == "sqlite:///from-env.sqlite3"
    monkeypatch.delenv(ENV_URL)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert resolve_url() == f"sqlite:///{tmp_path / 'data' / 'csd-explorer' / 'csd.sqlite3'}"
    with Store.open() as store:
        assert store.start_run() == 1
    assert (tmp_path / "data" / "csd-explorer" / "csd.sqlite3").exists()


def test_a_path_is_a_sqlite_file(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert resolve_url("runs.sqlite3") == f"sqlite:///{tmp_path / 'runs.sqlite3'}"
    assert resolve_url("~/x.db") == f"sqlite:///{Path('~/x.db').expanduser()}"
    with Store.open(str(tmp_path / "sub" / "runs.db")) as store:
        assert store.start_run() == 1
    with Store.open("sub/runs.db") as store:               # the same file, relative to the working directory
        assert store.start_run() == 2
    with pytest.raises(StoreOpenError, match="'none' is no database"):
        Store.open("none")                                  # not a file named none
    from csd.cli.common import open_store
    assert open_store(argparse.Namespace(no_db=False, db="none")) is None     # the commands read it as the app does
    assert open_store(argparse.Namespace(db="NONE")) is None                  # the app's options: no --no-db
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("url, words", [
    ("bogus://x", "Can't load plugin"),                                    # no such dialect
    ("sqlite:///{tmp}", "unable to open database file"),                   # a directory
    ("{tmp}/notes.txt", "file is not a database"),                         # a file that is not SQLite
])
def test_a_database_that_cannot_be_opened_says_why_and_is_left_as_it_was(tmp_path, url, words):
    notes = tmp_path / "notes.txt"
    notes.write_text("a user's own file\n" * 20)
    before = notes.read_bytes()
    with pytest.raises(StoreOpenError, match="cannot open the database") as e:
        Store.open(url.format(tmp=tmp_path))
    assert words in str(e.value)
    assert isinstance(e.value, ValueError)       # the command line's "error: ..." line, exit status 2
    assert notes.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_deleting_a_run_deletes_its_events(store):
    run_id = record(store, [ev(i) for i in range(5)])
    snap = store.save_memory(CorrectionMemory("p"), run_id=run_id)
    with store.write_session() as s, s.begin():
        s.delete(s.get(RunRow, run_id))
    with store.session() as s:
        assert s.scalar(select(TokenEventRow.id).where(TokenEventRow.run_id == run_id)) is None
        row = s.get(MemorySnapshot, snap)
    assert (row.pair_id, row.run_id) == ("p", None)          # the snapshot outlives its run
