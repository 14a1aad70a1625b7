"""The divergence-event store (SQLAlchemy + Alembic): ``db.store.Store``, ``db.analytics``, and
``db.cli`` (the ``runs`` subcommand's parser, registered by the top-level ``cli``).

Importable without torch or gradio.
"""
