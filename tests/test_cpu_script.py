"""bench/cpu.sh, the one call that measures issue 52's CPU tables on another machine: its plumbing runs here
on one item of a few tokens, so that it fails here, not in the session that finally has that CPU."""
import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_bench_step_writes_both_targets_results_and_no_charts(tmp_path):
    r = subprocess.run(["bash", "bench/cpu.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "STEPS": "bench side nothing", "ITEMS": "gsm8k:1", "TOKENS": "6"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (tmp_path / "log.txt").read_text()
    assert "== bench-default: exit 0" in log and "== bench-pass: exit 0" in log, log[-3000:]
    assert "== side: skipped (no LLAMA_BENCH given)" in log and "unknown step nothing" in log
    reps = {}
    for name in ("bench-default", "bench-pass"):
        files = {p.name for p in (tmp_path / name).iterdir()}
        assert {"results.json.gz", "results.md"} <= files and not any(f.endswith(".html") for f in files)
        res = json.loads(gzip.decompress((tmp_path / name / "results.json.gz").read_bytes()))
        assert set(res["summary"]["gsm8k"]) >= {"ar", "sd", "csd"}
        reps[name] = res["meta"]["representation"]
    assert reps["bench-pass"]["activations"] == "pass"         # the second run is the per-pass int8 target
    assert reps["bench-pass"]["target"] == "int8"
