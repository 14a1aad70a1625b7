"""The divergence-event store (SQLAlchemy + Alembic): ``db.store.Store``, ``db.analytics``, ``db.cli``.

Importable without torch or gradio.
"""
