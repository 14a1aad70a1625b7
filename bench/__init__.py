"""The benchmark: its columns (``methods``), the harness (``harness``), results as data (``results``),
the report (``report``), merged and rivals' frontiers (``merge``, ``rivals``), the synthetic GPU
benchmark (``synthetic``) and the shipped frontiers the app shows (``frontier``). docs/benchmarks.md,
"How the benchmark measures", says how. It uses ``csd`` and ``csd.db``; neither imports it.
"""
