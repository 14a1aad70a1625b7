"""The benchmark: datasets and graders (``bench.datasets``, ``bench.graders``, ``bench.sandbox``),
the harness that runs every method on the same items (``bench.harness``), its report
(``bench.report``), and micro-benchmarks of the store (``bench.store_whatif``, ``bench.store_overhead``).

It uses the engine (``csd``) and, when asked to record, the store (``db``); neither imports it.
"""
