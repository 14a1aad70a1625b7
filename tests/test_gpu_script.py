"""bench/gpu.sh, the script a lent GPU runs (each start of that machine costs minutes of a 15-minute
budget), runs here on the CPU with CPU-sized steps: its plumbing fails here, not there."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_sh(out: Path, **env) -> str:
    r = subprocess.run(["bash", "bench/gpu.sh", str(out), "cpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return (out / "log.txt").read_text()


def test_the_profile_step_writes_kernels_a_pass(tmp_path):
    log = _gpu_sh(tmp_path, STEPS="profile", PROFILE_PAIRS="tiny")
    assert "== profile: exit 0" in log
    prof = json.loads((tmp_path / "profile" / "profile.json").read_text())
    calls = prof["pairs"][0]["calls"]
    assert set(calls) == {"draft step", "draft block of 6", "verify pass of 1", "verify pass of 7"}
    assert all(c["computing_ops"] > 0 and c["wall_ms"] > 0 for c in calls.values())
    assert calls["draft block of 6"]["computing_ops"] >= calls["draft step"]["computing_ops"]
    assert prof["machine"] and prof["command"].startswith("python -m csd.bench.synthetic.kernel_profile")


def test_a_spent_budget_skips_the_steps_left(tmp_path):
    log = _gpu_sh(tmp_path, STEPS="profile tiny", TOTAL_S="5", PROFILE_PAIRS="tiny")
    assert "== profile: skipped" in log and "== tiny: skipped" in log
    assert not (tmp_path / "profile").exists()
