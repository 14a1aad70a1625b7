"""Synthetic benchmark: AR, SD and CSD measured by the project's own engine (``csd.decode``) on
randomly initialised models with real architectures, where no weights can travel (a GPU machine
without network or model cache). Calibrated Speculative Decoding: arXiv 2604.13634.

On a GPU machine (on an NVIDIA H200, 2026-11-30: about 110 s for the 1.5B pair with 3 prompts and one
timed run each, 150 s for the 7B target; ``bench/gpu.sh`` runs the set, README "GPU" has the figures):

    python -m csd.bench.synthetic --synthetic-config 1.5b --max-new-tokens 128 --limit 3 --out synthetic-1.5b
    python -m csd bench --synthetic --synthetic-config 1.5b --max-new-tokens 128 --limit 3 --out synthetic-1.5b

The first needs only torch, transformers and numpy; the second, the ``csd`` command line, also
imports the store (sqlalchemy), which the GPU image lacks. The 7B target: ``--synthetic-config 7b``.

``models``: the architectures, their random weights and the scripted draft (what is real, what is
made up); ``run``: the runs, until each follows its script; ``report``: the figures and the table;
``cli``: the options. Outputs in ``out_dir``: ``results.json``
(``summary["synthetic-<config>"][method]["tokens_per_s"]`` as in the normal benchmark) and
``results.md`` (the printed table).
"""
from .cli import add_synthetic_args, main, run_from_args
from .models import ARCHS, PAIRS, ScriptedDraft, build_model, make_pair
from .run import SyntheticConfig, run_synthetic, scripted_run

__all__ = ["ARCHS", "PAIRS", "ScriptedDraft", "SyntheticConfig", "add_synthetic_args", "build_model", "main",
           "make_pair", "run_from_args", "run_synthetic", "scripted_run"]
