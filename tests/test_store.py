"""The divergence-event store on a real SQLite file and a real PostgreSQL server.

PostgreSQL: set CSD_TEST_PG_URL (``.ci/start_postgres.sh`` prints it). Without it these tests skip,
except under CI (env CI set) where they fail. Each PostgreSQL test gets its own schema.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import make_url
from store_fixtures import ev, record, stored

from csd.config import CSDConfig
from csd.db import analytics as A
from csd.db.models import CANCELLED, FAILED, FINISHED, RUNNING, MemorySnapshot
from csd.db.store import CONTEXT_CHARS, Store, run_fields
from csd.events import ACCEPTED, CORRECTED, REJECTED, RESCUED, RULE_MATCH, RULE_RESCUE, RunMetrics, TokenEvent
from csd.memory import CorrectionMemory

ROOT = Path(__file__).resolve().parents[1]


# -- writing -----------------------------------------------------------------------------------
def test_round_trip(store):
    events = [TokenEvent(position=0, token_id=5, text="Hé, \"x\"\n", status=ACCEPTED, block=0, index_in_block=0,
                         draft_id=5, draft_text="Hé, \"x\"\n", target_id=5, target_text="Hé, \"x\"\n",
                         draft_logit=3.25, target_logit=3.25, gap=0.0, memory_count=0, rule=RULE_MATCH,
                         draft_prob=0.5, target_prob=0.75,
                         draft_top=[["Hé", 0.5], ["a", 0.25]], target_top=[["Hé", 0.75]]),
              TokenEvent(position=1, token_id=9, text=" 1", status=RESCUED, block=0, index_in_block=1, draft_id=9,
                         draft_text=" 1", target_id=8, target_text=" one", draft_logit=-1e-300, target_logit=1e300,
                         gap=-math.inf, memory_count=2**31 - 1, rule=RULE_RESCUE)]
    events += [ev(i, block=1 + i // 6, idx=i % 6) for i in range(2, 300)]
    run_id = store.start_run(kind="generate", pair_id="p", draft_name="d", target_name="t", method="csd", gamma=6,
                             lam=6.0, tau=0.01, temperature=0.0, seed=2**40, max_new_tokens=300, prompt="Once",
                             session_id="s1", label="x")
    metrics = RunMetrics(new_tokens=300, target_forwards=50, wall_s=1.5)
    with store.recorder(run_id, batch_size=7) as rec:
        for e in events:
            rec.add(e)
        rec.finish("the output", metrics)
    assert [TokenEvent.from_dict(d) for d in stored(store, run_id)] == events
    run = store.get_run(run_id)
    assert (run.status, run.output_text, run.seed, run.session_id, run.error) == (FINISHED, "the output", 2**40,
                                                                                   "s1", None)
    assert run.metrics == json.loads(json.dumps(metrics.to_dict())) and run.finished_at is not None


def test_context_defaults_to_preceding_output(store):
    events = [ev(0, text="abc"), ev(1, REJECTED, text="X"), ev(1, CORRECTED, text="d"), ev(2, text="e" * 50),
              ev(3, text="f")]
    run_id = record(store, events)
    assert [d["context"] for d in stored(store, run_id)] == ["", "abc", "abc", "abcd", ("abcd" + "e" * 50)[-40:]]
    assert store.get_run(run_id).output_text == "abcd" + "e" * 50 + "f"   # rejected text is not output
    assert CONTEXT_CHARS == 40


def test_text_every_engine_stores(store):
    run_id = record(store, [ev(0, text="a\x00b"), ev(1, text="c\ud800d")], prompt="p\x00")
    assert [d["text"] for d in stored(store, run_id)] == ["a\u2400b", "c?d"]
    assert store.get_run(run_id).prompt == "p\u2400"


def test_cancelled_run_keeps_events(store):
    run_id = store.start_run(method="csd")

    def stream():   # the UI's streaming generator; closing it raises GeneratorExit inside
        with store.recorder(run_id) as rec:
            for i in range(1000):
                rec.add(ev(i))
                yield i

    g = stream()
    for _ in range(150):
        next(g)
    g.close()
    run = store.get_run(run_id)
    assert run.status == CANCELLED and run.finished_at is not None
    assert [d["position"] for d in stored(store, run_id)] == list(range(150))
    assert run.output_text == "".join(f" w{i}" for i in range(150))


def test_keyboard_interrupt_cancels(store):
    run_id = store.start_run(method="sd")
    with pytest.raises(KeyboardInterrupt), store.recorder(run_id) as rec:
        rec.add(ev(0))
        raise KeyboardInterrupt
    assert store.get_run(run_id).status == CANCELLED and len(stored(store, run_id)) == 1


def test_failed_run_records_error(store):
    run_id = store.start_run(method="csd")
    with pytest.raises(ValueError), store.recorder(run_id) as rec:
        for i in range(10):
            rec.add(ev(i))
        raise ValueError("target ran out of memory")
    run = store.get_run(run_id)
    assert (run.status, run.error) == (FAILED, "ValueError: target ran out of memory")
    assert len(stored(store, run_id)) == 10


def test_finish_twice_is_refused(store):
    rec = store.recorder(store.start_run())
    rec.finish("x")
    with pytest.raises(RuntimeError):
        rec.finish("y")


def test_concurrent_recorders_do_not_mix(store):
    n_runs, n_events = 6, 400
    run_ids = [store.start_run(method="csd", label=f"user{k}") for k in range(n_runs)]
    barrier = threading.Barrier(n_runs)
    errors = []

    def user(k: int):
        try:
            barrier.wait()
            with store.recorder(run_ids[k], batch_size=16, flush_interval=0.005) as rec:
                for i in range(n_events):
                    rec.add(ev(i, d=k * 10_000 + i, text=f"u{k}-{i}"))
                    if i % 50 == 0:
                        threading.Event().wait(0.001)
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=user, args=(k,)) for k in range(n_runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, run_id in enumerate(run_ids):
        rows = stored(store, run_id)
        assert [d["text"] for d in rows] == [f"u{k}-{i}" for i in range(n_events)]
        assert [d["seq"] for d in rows] == list(range(n_events))
        assert store.get_run(run_id).status == FINISHED
    assert A.count_events(store) == n_runs * n_events


KILLED_WRITER = r"""
import sys, time
from csd.events import TokenEvent
from csd.db.store import Store

store = Store.open(sys.argv[1])
run_id = store.start_run(kind="bench", method="csd", prompt="killed midway")
print("run", run_id, flush=True)
rec = store.recorder(run_id, batch_size=16, flush_interval=0.01, on_commit=lambda n: print(n, flush=True))
i = 0
while True:
    rec.add(TokenEvent(position=i, token_id=i, text=f" t{i}", status="accepted", block=i // 7, index_in_block=i % 7))
    i += 1
    if i % 16 == 0:
        time.sleep(0.001)
"""


def test_killed_writer_keeps_every_committed_batch(db_url):
    Store.open(db_url).close()     # schema first, so that the writer starts recording at once
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, db_url], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        first = proc.stdout.readline()
        assert first.startswith("run "), proc.stderr.read()
        run_id, committed = int(first.split()[1]), 0
        while committed < 2000:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            committed = int(line)
        os.kill(proc.pid, signal.SIGKILL)
        committed = max([committed, *map(int, proc.stdout.read().split())])   # printed before the kill
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    with Store.open(db_url) as store:
        rows = stored(store, run_id)
        assert len(rows) >= committed              # committed but not yet printed may be there too
        assert [d["seq"] for d in rows] == list(range(len(rows)))
        assert [d["position"] for d in rows] == list(range(len(rows)))
        assert store.get_run(run_id).status == RUNNING
        assert len(stored(store, record(store, [ev(0)]))) == 1     # and the database takes new writes
    if db_url.startswith("sqlite"):
        with sqlite3.connect(make_url(db_url).database) as con:
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert con.execute("PRAGMA foreign_key_check").fetchall() == []


def test_recorder_left_open_at_exit_writes_and_cancels(db_url):
    script = ("import sys\nfrom csd.events import TokenEvent\nfrom csd.db.store import Store\n"
              "store = Store.open(sys.argv[1])\nrec = store.recorder(store.start_run(), flush_interval=60)\n"
              "for i in range(100):\n"
              "    rec.add(TokenEvent(position=i, token_id=i, text='x', status='accepted', block=0,"
              " index_in_block=0))\n")
    subprocess.run([sys.executable, "-c", script, db_url], cwd=ROOT, check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    with Store.open(db_url) as store:
        [run] = A.runs_list(store)
        assert (run["status"], run["n_events"], run["output_text"]) == (CANCELLED, 100, "x" * 100)


def test_memory_snapshot_round_trip(store):
    mem = CorrectionMemory("draft->target", {(1, 2): 7, (3, 4): 2}, {"note": "é"})
    run_id = store.start_run(kind="calibrate", pair_id=mem.pair_id)
    snap = store.save_memory(mem, run_id=run_id, label="calibration")
    with store.session() as s:
        row = s.get(MemorySnapshot, snap)
    back = CorrectionMemory.from_dict(row.counts, mem.pair_id)
    assert back.to_dict() == mem.to_dict()
    assert back.pair_id == mem.pair_id and back.count(1, 2) == 7
    assert (row.pair_id, row.n_patterns, row.total, row.run_id, row.label) == (mem.pair_id, 2, 9, run_id, "calibration")


def test_run_fields_are_the_pair_then_the_config_then_the_caller(store):
    pair = SimpleNamespace(run_fields=lambda: {"pair_id": "d->t", "draft_name": "d", "target_name": "t",
                                               "representation": "int8, activations per token",
                                               "draft_weights": None})
    fields = run_fields(pair, CSDConfig(method="csd", gamma=4, lam=3.0), kind="generate", prompt="p", tau=0.5)
    run = store.get_run(store.start_run(**fields))
    assert (run.kind, run.pair_id, run.draft_name, run.target_name, run.representation, run.draft_weights) == \
        ("generate", "d->t", "d", "t", "int8, activations per token", None)   # no draft: no draft representation
    assert (run.method, run.gamma, run.lam, run.tau, run.prompt) == ("csd", 4, 3.0, 0.5, "p")
    # no config: no parameters
    assert run_fields(pair)["representation"].startswith("int8") and "method" not in run_fields(pair)


def test_start_run_refuses_unknown_fields(store):
    with pytest.raises(TypeError, match="lambda"):
        store.start_run(method="csd", **{"lambda": 6})
