"""Synthetic benchmark: AR, SD and CSD on the project's engine with randomly initialised models of
real architectures and a draft of set acceptance, for a GPU machine without model files (docs/gpu.md).

    python -m csd.bench.synthetic --synthetic-config 1.5b --max-new-tokens 128 --limit 3 --out synthetic-1.5b
"""
from .cli import add_synthetic_args, main, run_from_args
from .models import ARCHS, PAIRS, ScriptedDraft, build_model, make_pair
from .run import SyntheticConfig, run_synthetic, scripted_run

__all__ = ["ARCHS", "PAIRS", "ScriptedDraft", "SyntheticConfig", "add_synthetic_args", "build_model", "main",
           "make_pair", "run_from_args", "run_synthetic", "scripted_run"]
