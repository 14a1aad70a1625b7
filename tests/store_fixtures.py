"""The store tests' databases and events (test_store.py, test_store_queries.py): a real SQLite file
or a new schema on a real PostgreSQL server (CSD_TEST_PG_URL; ``.ci/start_postgres.sh`` prints it), and
hand-made events to record in them."""
from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import create_engine, make_url

from csd.db import analytics as A
from csd.db.analytics import Filter
from csd.db.store import Store
from csd.events import ACCEPTED, TokenEvent

PG_ENV = "CSD_TEST_PG_URL"


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def pg_base_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        msg = (f"{PG_ENV} is not set: run .ci/start_postgres.sh (as root) and export the URL it prints, "
               "e.g. postgresql+psycopg://csd:csd@127.0.0.1:5432/csd_test")
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, empty database: a SQLite file, or a new schema on the PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'csd.sqlite3'}"
        return
    base = request.getfixturevalue("pg_base_url")
    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as c:
        c.exec_driver_sql(f"CREATE SCHEMA {schema}")
    yield make_url(base).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)
    with admin.begin() as c:
        c.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    admin.dispose()


@pytest.fixture
def store(db_url):
    with Store.open(db_url) as s:
        yield s


def ev(i: int, status: str = ACCEPTED, d: int | None = None, t: int | None = None, *, text: str | None = None,
       count: int | None = None, gap: float | None = None, block: int = 0, idx: int = 0, **kw) -> TokenEvent:
    d = i if d is None else d
    t = (d if status == ACCEPTED else d + 1) if t is None else t
    text = f" w{d}" if text is None else text
    return TokenEvent(position=i, token_id=d, text=text, status=status, block=block, index_in_block=idx,
                      draft_id=d, draft_text=text, target_id=t, target_text=f" w{t}", memory_count=count, gap=gap,
                      **kw)


def record(store: Store, events, **run) -> int:
    run_id = store.start_run(**{"method": "csd", **run})
    with store.recorder(run_id) as rec:
        for e in events:
            rec.add(e)
    return run_id


def stored(store: Store, run_id: int) -> list[dict]:
    return A.events(store, Filter(run_ids=[run_id]), limit=None)
