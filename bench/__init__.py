"""The benchmark: its columns, the harness, results as data, reports, the synthetic GPU benchmark, the measuring
tools and the shipped frontiers the app shows (docs/design.md; how it measures: docs/benchmarks.md). It uses
``csd`` and ``csd.db``; neither imports it."""
