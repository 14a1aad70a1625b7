"""The benchmark: datasets and graders (``bench.datasets``, ``bench.graders``, ``bench.sandbox``),
its columns (``bench.methods``), the harness that runs them on the same items (``bench.harness``),
a run's results as data (``bench.results``), its report (``bench.report``), one frontier from runs
done in parts (``bench.merge``), the synthetic GPU benchmark (``bench.synthetic``), fidelity of the
target's representations (``bench.fidelity``) and micro-benchmarks of the store
(``bench.store_whatif``, ``bench.store_overhead``); ``bench.io`` holds what they share.

It uses the engine (``csd``) and, when asked to record, the store (``db``); neither imports it.
"""
