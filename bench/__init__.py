"""The benchmark: datasets and graders (``csd.evaluation.datasets``, ``csd.evaluation.graders``, ``csd.evaluation.sandbox``),
its columns (``csd.bench.methods``), the harness that runs them on the same items (``csd.bench.harness``),
a run's results as data (``csd.bench.results``), its report (``csd.bench.report``), one frontier from runs
done in parts (``csd.bench.merge``), the synthetic GPU benchmark (``csd.bench.synthetic``) and the committed frontier the app shows
(``csd.bench.frontier``); ``csd.bench.io`` holds what they share. Micro-benchmarks of the store
(``tools.store_whatif``, ``tools.store_overhead``) stand outside the package.

It uses the engine (``csd``) and, when asked to record, the store (``db``); neither imports it.
"""
