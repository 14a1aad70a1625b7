"""The command line on the real embedded pair, recording to a real SQLite file."""
import csv
import io
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from csd.memory import CorrectionMemory
from csd.runtime.pair import EMBEDDED_PAIR_ID

pytestmark = pytest.mark.slow


def cli(*args, timeout=900):
    r = subprocess.run([sys.executable, "-m", "csd", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_generate_json_records_and_exports(tmp_path):
    db = f"sqlite:///{tmp_path / 'runs.sqlite3'}"
    r = cli("generate", "--prompt", "Write a Python function that reverses a string.", "--method", "csd", "--json",
            "--max-new-tokens", "16", "--db", db)
    out = json.loads(r.stdout)
    assert out["text"] and len(out["token_ids"]) == 16 == out["metrics"]["new_tokens"]
    assert {"target_forwards", "mean_accepted_length", "rescued", "wall_s"} <= set(out["metrics"])
    m = out["metrics"]
    assert out["config"]["lookup"] == 16    # the command line copies from the context unless --lookup 0
    # each target pass adds one token of its own (no EOS within 16 here), besides the kept draft tokens and copies
    kept = m["accepted"] + m["rescued"] + m["lookup_kept"]
    assert m["new_tokens"] == kept + m["target_forwards"] or m["stopped_by"] == "eos"
    statuses = [e["status"] for e in out["events"]]
    assert set(statuses) <= {"accepted", "rescued", "rejected", "corrected", "bonus"}
    assert [e["token_id"] for e in out["events"] if e["status"] != "rejected"] == out["token_ids"]

    runs = cli("runs", "list", "--db", db).stdout
    assert "csd" in runs and "finished" in runs and "lookup" in runs.splitlines()[0]
    from csd.db import analytics
    from csd.db.store import Store
    with Store.open(db) as store:
        assert analytics.runs_list(store)[0]["lookup"] == 16          # the run records its copy length
    exported = cli("runs", "export", "1", "--format", "csv", "--db", db).stdout
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [r["status"] for r in rows] == statuses


def test_calibrate_writes_a_memory_bound_to_the_pair(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in [
        "The quick brown fox jumps over the lazy dog. " * 30,
        "def add(a, b):\n    return a + b\n\n" * 30]))
    out = tmp_path / "mem.json.gz"
    # two chunks of 64 tokens: each position counted costs both models' passes over it (the lean pair
    # that decodes: no transformers copy is built, tests/test_engine_real.py)
    positions = 100
    r = cli("calibrate", "--corpus", str(corpus), "--out", str(out), "--max-positions", str(positions),
            "--chunk-tokens", "64", "--no-db")
    assert "calibrating" in r.stderr and "positions" in r.stderr
    mem = CorrectionMemory.load(out, expected_pair=EMBEDDED_PAIR_ID)
    info = mem.meta["calibration"][-1]
    assert info["positions"] >= positions and info["divergences"] == mem.total


def test_profile_prints_the_bound_and_the_expected_speedup():
    out = json.loads(cli("profile", "--json").stdout)
    bound, best = out["bound"], out["best"]
    assert set(bound) == {str(g) for g in range(1, 33)}
    assert best["speedup"] == pytest.approx(max(bound.values())) and bound[str(best["gamma"])] == best["speedup"]
    exp = out["expected"]
    assert list(exp) == ["0.6", "0.7", "0.8", "0.9"]
    speedups = [exp[a]["speedup"] for a in exp]
    assert speedups == sorted(speedups) and speedups[-1] <= best["speedup"]
    assert all(1 <= exp[a]["gamma"] <= 32 for a in exp)


def test_profile_drafts_times_each_way_to_run_a_local_draft(tmp_path, qwen_tokenizer):
    """``profile --drafts`` loads the draft in float32 (from a folder here; the embedded pair from its GGUF
    file) beside the mapped int8 pair, and times each way to run it."""
    import os

    from conftest import tiny_model
    d = tmp_path / "tiny"
    tiny_model(2, vocab=len(qwen_tokenizer)).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    r = subprocess.run([sys.executable, "-m", "csd", "profile", "--drafts", "--draft", str(d), "--target", str(d)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "CSD_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-3000:]
    listed = r.stdout.split("draft options (ms per token):")[1].splitlines()
    times = dict(line.strip().rsplit(None, 1) for line in listed
                 if line.strip())
    assert {"hf float32", "lean int8, full vocabulary", "hf int8"} <= {k.strip() for k in times}
    assert all(float(v) > 0 for v in times.values())
