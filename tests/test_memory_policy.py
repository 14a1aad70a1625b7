"""The correction memory's policies (csd.memory.MemoryPolicy): capacity with eviction, counts that decay,
the file round trip, old files as unbounded, malformed policy blocks refused (docs/memory.md)."""
import gzip
import json

import pytest

from csd.memory import DEFAULT_MEMORY_FILE, CorrectionMemory, MemoryFileError, MemoryPolicy

PAIR = "draft->target"


def observe_all(mem, pairs):
    for d, t in pairs:
        mem.observe(d, t)
    return mem


def test_a_capacity_bounds_the_memory_and_the_smallest_count_goes_first():
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(capacity=3))
    observe_all(mem, [(1, 2)] * 5 + [(3, 4)] * 3 + [(5, 6)] * 2)
    mem.observe(7, 8)                               # full: (5, 6) has the smallest count and goes
    assert len(mem) == 3 and mem.evicted == 1
    assert mem.count(5, 6) == 0 and mem.count(7, 8) == 1 and mem.count(1, 2) == 5
    mem.observe(9, 10)                              # the newcomer (7, 8), count 1, is now the smallest
    assert mem.count(7, 8) == 0 and mem.count(9, 10) == 1 and mem.count(3, 4) == 3


def test_ties_in_count_go_least_recently_seen_first():
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(capacity=2))
    observe_all(mem, [(1, 2), (3, 4), (1, 2), (3, 4)])   # both at 2; (1, 2) seen less recently
    mem.observe(5, 6)
    assert mem.count(1, 2) == 0 and mem.count(3, 4) == 2 and mem.count(5, 6) == 1


def test_least_recent_eviction_keeps_the_latest_patterns_whatever_their_counts():
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(capacity=2, evict="recent"))
    observe_all(mem, [(1, 2)] * 9 + [(3, 4), (5, 6)])
    assert mem.count(1, 2) == 0 and len(mem) == 2


def test_counts_halve_every_half_life_of_observed_divergences():
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(half_life=4))
    observe_all(mem, [(1, 2)] * 6)
    assert mem.count(1, 2) == pytest.approx(sum(2 ** (-k / 4) for k in range(6)))
    before = mem.count(1, 2)
    observe_all(mem, [(3, 4)] * 4)                  # four other divergences: one half-life
    assert mem.count(1, 2) == pytest.approx(before / 2)
    assert mem.count(3, 4) == pytest.approx(sum(2 ** (-k / 4) for k in range(4)))


def test_decayed_patterns_are_forgotten_and_the_stored_values_stay_finite():
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(half_life=2))
    mem.observe(1, 2)
    observe_all(mem, [(3, 4)] * 200)                # 100 half-lives, several rescalings
    assert mem.count(1, 2) == 0 and len(mem) == 1 and mem.evicted == 1
    assert mem.count(3, 4) == pytest.approx(1 / (1 - 2 ** -0.5), rel=1e-6)   # the geometric series' limit


def test_a_memory_that_decays_reaches_lambda_only_with_recent_repetition():
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(half_life=10))
    for _ in range(10):                             # (1, 2) every third divergence: it levels off under 6
        observe_all(mem, [(1, 2), (3, 4), (5, 6)])
    assert mem.count(1, 2) < 6
    assert CorrectionMemory(PAIR, policy=MemoryPolicy()).count(1, 2) == 0


@pytest.mark.parametrize("policy", [MemoryPolicy(), MemoryPolicy(capacity=3), MemoryPolicy(half_life=5),
                                    MemoryPolicy(capacity=3, half_life=5), MemoryPolicy(capacity=3, evict="recent")])
def test_save_and_load_keep_the_policy_the_counts_and_the_order(tmp_path, policy):
    mem = CorrectionMemory(PAIR, meta={"note": "x"}, policy=policy)
    observe_all(mem, [(1, 2), (3, 4), (1, 2), (5, 6), (7, 8), (3, 4)])
    back = CorrectionMemory.load(mem.save(tmp_path / "m.json.gz"), expected_pair=PAIR)
    assert back.policy == policy and back.meta == {"note": "x"}
    saved = list(mem.items()) if mem.to_dict().get("policy") else sorted(mem.items())   # unbounded: by count
    got = list(back.items()) if mem.to_dict().get("policy") else sorted(back.items())
    assert [(k, pytest.approx(c, abs=1e-4)) for k, c in got] == saved
    back.observe(9, 10)                             # both forget the same pattern next
    mem.observe(9, 10)
    assert set(dict(back.items())) == set(dict(mem.items()))


def test_an_old_memory_file_loads_unbounded():
    raw = json.loads(gzip.decompress(DEFAULT_MEMORY_FILE.read_bytes()))
    assert "policy" not in raw
    mem = CorrectionMemory.load(DEFAULT_MEMORY_FILE)
    assert mem.policy == MemoryPolicy() and mem.policy.unbounded and len(mem) == len(raw["counts"])
    assert "policy" not in mem.to_dict()           # an unbounded memory writes the old format


def test_a_capacity_applied_to_a_larger_memory_keeps_the_strongest():
    mem = CorrectionMemory.load(DEFAULT_MEMORY_FILE)
    counts = sorted((c for _k, c in mem.items()), reverse=True)
    mem.set_policy(MemoryPolicy(capacity=100))
    assert len(mem) == 100 and sorted((c for _k, c in mem.items()), reverse=True) == counts[:100]
    assert mem.nbytes == 1200


@pytest.mark.parametrize("block, words", [
    ({"capacity": 0}, "capacity must be a whole number from 1 to 100,000,000"),
    ({"capacity": -5}, "capacity must be a whole number from 1 to 100,000,000"),
    ({"capacity": "10"}, "capacity must be a whole number from 1 to 100,000,000"),
    ({"capacity": 2.5}, "capacity must be a whole number from 1 to 100,000,000"),
    ({"half_life": 0}, "half-life must be between 1 and 100,000,000"),
    ({"half_life": float("inf")}, "half-life must be between 1 and 100,000,000"),
    ({"evict": "random"}, "eviction rule"),
    ({"capacity": 5, "size": 3}, "expected an object"),
    ([5], "expected an object"),
])
def test_a_malformed_policy_block_is_refused_naming_the_file_and_nothing_changes(tmp_path, block, words):
    path = tmp_path / "bad.json"
    raw = json.dumps({"format": "csd-explorer-memory", "version": 1, "pair": PAIR, "meta": {},
                      "counts": [[1, 2, 3]], "policy": block}, allow_nan=True)
    path.write_text(raw)
    with pytest.raises(MemoryFileError) as e:
        CorrectionMemory.load(path)
    assert str(path) in str(e.value) and words in str(e.value) and "policy" in str(e.value)
    assert path.read_text() == raw


def test_fractional_counts_only_in_a_memory_that_decays(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": "csd-explorer-memory", "version": 1, "pair": PAIR, "counts": [[1, 2, 2.5]]}))
    with pytest.raises(MemoryFileError, match="whole numbers"):
        CorrectionMemory.load(path)


def test_the_policy_refuses_bad_values_in_a_sentence():
    for kw in ({"capacity": 0}, {"capacity": True}, {"half_life": -1}, {"half_life": "x"}):
        with pytest.raises(ValueError, match="must be "):
            MemoryPolicy(**kw)
    assert MemoryPolicy().describe().startswith("unbounded")
    assert "1,000 patterns" in MemoryPolicy(capacity=1000).describe()
    assert "halve every 500" in MemoryPolicy(half_life=500).describe()


# -- the SGLang table and the command line ---------------------------------------------------------
def test_the_sglang_table_carries_the_counts_as_they_stand_and_the_policy(tmp_path):
    from csd.calibration.sglang_table import EMBEDDED_VOCAB, export_memory, import_table
    mem = CorrectionMemory(PAIR, policy=MemoryPolicy(capacity=3, half_life=2))
    observe_all(mem, [(1, 2)] * 4 + [(3, 4)] * 2 + [(5, 6), (7, 8)])
    assert len(mem) == 3
    path = export_memory(mem, tmp_path / "t.jsonl", EMBEDDED_VOCAB, 6)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["metadata"]["memory_policy"] == {"capacity": 3, "half_life": 2, "evict": "count"}
    assert {(r["lhs_token"], r["rhs_token"]): r["freq"] for r in rows[1:]} == {k: round(c) for k, c in mem.items()}
    back = import_table(path, PAIR, EMBEDDED_VOCAB)
    assert back.policy == mem.policy and len(back) == 3


def test_a_malformed_policy_in_a_table_is_refused_naming_the_file(tmp_path):
    from csd.calibration.sglang_table import EMBEDDED_VOCAB, import_table
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"type": "metadata", "metadata": {"memory_policy": {"capacity": -1}}}) + "\n"
                    + json.dumps({"lhs_token": 1, "rhs_token": 2, "freq": 3}) + "\n")
    with pytest.raises(MemoryFileError, match="t.jsonl.*capacity must be"):
        import_table(path, PAIR, EMBEDDED_VOCAB)


@pytest.mark.parametrize("command", ["generate --prompt hi", "calibrate --mode text", "bench --limit 1"])
@pytest.mark.parametrize("flag, value", [("--memory-capacity", "0"), ("--memory-capacity", "-3"),
                                         ("--memory-capacity", "ten"), ("--memory-capacity", "2.5"),
                                         ("--memory-half-life", "0"), ("--memory-half-life", "-1"),
                                         ("--memory-half-life", "soon"), ("--memory-half-life", "nan"),
                                         ("--memory-capacity", "1e9"), ("--memory-half-life", "1e9")])
def test_the_command_line_refuses_a_bad_policy_before_any_model_and_writes_nothing(tmp_path, capsys, command,
                                                                                  flag, value):
    from csd.cli import main
    out = tmp_path / "out"
    extra = {"generate": ["--save-memory", str(out / "m.json")], "calibrate": ["--out", str(out / "m.json")],
             "bench": ["--out", str(out)]}[command.split()[0]]
    rc = main([*command.split(), f"{flag}={value}", *extra, "--db", str(tmp_path / "runs.sqlite3")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{flag} must be " in err and "100,000,000" in err and "loaded" not in err
    assert not out.exists() and not (tmp_path / "runs.sqlite3").exists()
