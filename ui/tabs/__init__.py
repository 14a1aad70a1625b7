"""The app's tabs, one module each: ``generate``, ``compare``, ``analyse``, ``explore`` (Explore &
memory) and ``teach``, each holding that tab's handlers and its ``build(page)``, which lays the
tab out and wires its events; ``common``, ``jobs`` and ``page`` hold what the tabs share.

A handler is a plain function from component values (and the session) to new values, so the
tests call them directly; ``csd.ui.app.build_demo`` composes the tabs.
"""
