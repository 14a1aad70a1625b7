"""The app's tabs, one module each (handlers and ``build(page)``); ``common``, ``jobs``, ``page`` and ``inputs``
hold what they share (docs/design.md, "The web app")."""
