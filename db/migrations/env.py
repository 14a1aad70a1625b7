"""Alembic environment of the store. ``csd.db.store`` runs it programmatically with an open connection
(``config.attributes["connection"]``); no alembic.ini is needed.

A new revision after changing ``db/models.py``::

    python -c "from alembic import command; from csd.db.store import alembic_config; \\
        command.revision(alembic_config('sqlite:////tmp/x.sqlite3'), 'what changed', autogenerate=True)"

(run ``csd.db.store.Store.open('sqlite:////tmp/x.sqlite3')`` first so that the scratch database is at head).
"""
from alembic import context
from sqlalchemy import create_engine

from csd.db.models import Base

config = context.config


def _configure(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")  # SQLite cannot ALTER most things
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=Base.metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (conn := config.attributes.get("connection")) is not None:
    _configure(conn)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn:
        _configure(conn)
    engine.dispose()
