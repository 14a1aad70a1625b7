"""The divergence-event store (SQLAlchemy + Alembic): ``store``, ``analytics`` and ``cli`` (the ``runs``
subcommand's parser). Importable without torch or gradio."""
