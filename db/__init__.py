"""The divergence-event store (SQLAlchemy + Alembic): ``csd.db.store.Store``, ``csd.db.analytics``, and
``csd.db.cli`` (the ``runs`` subcommand's parser, registered by ``csd.cli``).

Importable without torch or gradio.
"""
