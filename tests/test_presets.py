"""The paper's CSD as one named preset: ``--preset paper`` on the command line and the ``csd-paper``
column of the benchmark, beside this project's defaults (gamma auto, copies on)."""
from __future__ import annotations

import pytest

from csd.config import PRESETS, ConfigError, CSDConfig


def test_the_paper_preset_is_the_papers_reported_settings():
    # ../shared/PAPER.md: lambda 6, tau 0.01, gamma 6; the paper has no copies and no adaptive block
    assert PRESETS["paper"] == {"method": "csd", "gamma": 6, "gamma_min": 0, "lam": 6.0, "tau": 0.01, "lookup": 0}
    paper = CSDConfig(**PRESETS["paper"]).validated()
    plain = CSDConfig()
    assert (paper.gamma, paper.lam, paper.tau, paper.lookup) == (plain.gamma, plain.lam, plain.tau, plain.lookup)


def test_the_bench_column_csd_paper_runs_the_preset_beside_the_defaults():
    from csd.bench.methods import make_methods
    base = CSDConfig(gamma="auto", lookup=16, lam=3, tau=0.1)
    cols = {m.name: m.cfg for m in make_methods("ar,csd,csd-paper", base)}
    assert cols["csd"].gamma == "auto" and cols["csd"].lookup == 16 and cols["csd"].lam == 3
    p = cols["csd-paper"]
    assert (p.method, p.gamma, p.lam, p.tau, p.lookup, p.gamma_min) == ("csd", 6, 6.0, 0.01, 0, 0)
    assert p.max_new_tokens == base.max_new_tokens              # what is not the method's stays the run's


def test_apply_preset_sets_its_fields_and_refuses_a_flag_it_sets():
    from csd.cli.engine import apply_preset
    cfg = apply_preset(CSDConfig(gamma="auto", lookup=16, max_new_tokens=7), "paper", ["--prompt", "x"])
    assert (cfg.gamma, cfg.lookup, cfg.lam, cfg.tau, cfg.max_new_tokens) == (6, 0, 6.0, 0.01, 7)
    with pytest.raises(ConfigError, match="drop --gamma"):
        apply_preset(CSDConfig(), "paper", ["--gamma=3"])
    with pytest.raises(ConfigError, match="cannot run with --method sd"):
        apply_preset(CSDConfig(method="sd"), "paper", [])


@pytest.mark.parametrize("argv,needle", [
    (["--preset", "paper", "--tau", "0.5"], "drop --tau or the preset"),
    (["--preset", "paper", "--method", "sd"], "cannot run with --method sd"),
])
def test_generate_refuses_a_preset_beside_its_own_flags_before_any_model(no_models, capsys, argv, needle):
    import csd.cli as cli
    assert cli.main(["generate", "--prompt", "x", "--no-db", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_generate_help_names_the_preset(capsys):
    import csd.cli as cli
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    assert "--preset {paper}" in capsys.readouterr().out
