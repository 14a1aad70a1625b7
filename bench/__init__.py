"""The benchmark: its columns (``methods``), the harness (``harness``), results as data (``results``),
the report (``report``), the rivals' frontier (``rivals``), the figures check (``figures``), alarms
(``alarms``), the speed waterfall (``waterfall``), the synthetic GPU benchmark (``synthetic``) and the
shipped frontiers the app shows (``frontier``). docs/benchmarks.md,
"How the benchmark measures", says how. It uses ``csd`` and ``csd.db``; neither imports it.
"""
