"""The model runtime under the paper's algorithm: loading and converting models (``models``, ``convert``,
``embedded``, ``refs``, ``ggufile``, ``quant``, ``smoothing``), the passes the decode loop calls (``lm``, the
static engine ``static``, runs decoding together ``batch``), the pair as the engine sees it (``pair``),
what passes cost here (``profile``) and threads (``threads``); files are ``csd.fileio``'s.
"""
