"""The model runtime under the paper's algorithm: loading and converting models (``models`` and what it uses), the
passes the decode loop calls (``lm``, ``static``, ``batch``), the pair as the engine sees it (``pair``), what passes
cost here (``profile``) and threads (``threads``)."""
