"""The memory policy in the app, as plain handlers on the tiny pair and a real SQLite store: Explore & memory
sets a capacity or a half-life for the session's memory and shows it, an upload keeps a file's policy, a run
records its memory's policy (the divergence table, the CSV), and Analyse's what-if of a memory of N patterns."""
from __future__ import annotations

import csv
import json

import gradio as gr
import pytest
import ui_fixtures
from ui_fixtures import gen

from csd.db import analytics as A
from csd.events import STATUSES
from csd.memory import CorrectionMemory, MemoryPolicy
from csd.ui.tabs import analyse, common, explore

ui_store, ui_gate, ui_services = ui_fixtures.ui_store, ui_fixtures.ui_gate, ui_fixtures.ui_services  # fixtures


def test_a_capacity_set_in_explore_bounds_the_sessions_memory_and_is_shown(services):
    sess = common.ensure_session(services, None)
    before = len(sess.memory)
    assert before > 2
    md, rows, sess = explore.memory_set_policy(services, 2, None, 6, sess)
    assert len(sess.memory) == 2 and sess.memory.policy == MemoryPolicy(capacity=2)
    assert "capacity 2 patterns" in md and "24 bytes" in md and "forgotten so far" in md and len(rows) == 2
    md, _, sess = explore.memory_set_policy(services, None, 50, 6, sess)
    assert sess.memory.policy == MemoryPolicy(half_life=50) and "halve every 50 divergences" in md
    md, _, sess = explore.memory_set_policy(services, None, None, 6, sess)
    assert sess.memory.policy.unbounded and "unbounded" in md
    sess.memory.set_policy(MemoryPolicy(capacity=3))
    md, _, sess = explore.memory_reset(services, "default", 6, sess)   # a reset keeps the session's policy
    assert len(sess.memory) == 3 and "capacity 3 patterns" in md


@pytest.mark.parametrize("capacity, half_life, box", [(0, None, "Memory capacity"), (-4, None, "Memory capacity"),
                                                      (2.5, None, "Memory capacity"), ("ten", None, "Memory capacity"),
                                                      (None, 0, "Memory half-life"), (None, -1, "Memory half-life"),
                                                      (None, "soon", "Memory half-life")])
def test_a_bad_capacity_or_half_life_is_refused_naming_the_box_and_nothing_changes(services, capacity, half_life, box):
    sess = common.ensure_session(services, None)
    counts = dict(sess.memory.items())
    with pytest.raises(gr.Error, match=box):
        explore.memory_set_policy(services, capacity, half_life, 6, sess)
    assert sess.memory.policy.unbounded and dict(sess.memory.items()) == counts


def test_an_uploaded_memory_keeps_its_policy(services, tmp_path):
    mem = CorrectionMemory(services.pair.pair_id, {(1, 2): 7, (3, 4): 2, (5, 6): 1}, policy=MemoryPolicy(capacity=2))
    path = mem.save(tmp_path / "bounded.json.gz")
    md, rows, err, sess = explore.memory_upload(services, str(path), 6, common.ensure_session(services, None))
    assert err == "" and sess.memory.policy == MemoryPolicy(capacity=2) and len(rows) == 2
    assert "capacity 2 patterns" in md
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**mem.to_dict(), "policy": {"capacity": 0}}))
    md, rows, err, sess = explore.memory_upload(services, str(bad), 6, sess)
    assert "bad.json" in err and "capacity must be" in err and sess.memory.policy == MemoryPolicy(capacity=2)


def test_a_run_records_its_memory_policy_in_the_table_and_the_csv(services, store, tmp_path):
    sess = common.ensure_session(services, None)
    explore.memory_set_policy(services, 5, None, 6, sess)
    *_, final = gen(services, sess)
    sess = final[-1]
    rows, *_ = explore.explore_events(services, common.SCOPE_SESSION, sess.last.run_id, list(STATUSES), "any", "",
                                      "any", sess)
    assert rows and {r[explore.EVENT_COLUMNS.index("memory")] for r in rows} == {"capacity 5"}
    button, _ = explore.export_events_csv(services, common.SCOPE_SESSION, sess.last.run_id, list(STATUSES), "any",
                                          "", "any", sess)
    with open(button["value"], newline="") as fh:
        assert {r["memory_policy"] for r in csv.DictReader(fh)} == {"capacity 5"}
    assert len(sess.memory) <= 5                     # what the run kept, and what it saves
    saved = CorrectionMemory.load(sess.memory.save(tmp_path / "after.json.gz"))
    assert len(saved) <= 5 and saved.policy == MemoryPolicy(capacity=5)


def test_the_capacity_what_if_counts_the_rescues_of_the_strongest_patterns(services, store):
    sess = common.ensure_session(services, None)
    *_, final = gen(services, sess)
    sess = final[-1]
    f, _ = common.scope_filter(services, sess, common.SCOPE_SESSION)
    d = A.cached_divergences(store, f)
    full = int(d.rescued_mask(6, 10 ** -0.5).sum())
    assert full > 0
    assert A.capacity_what_if(d, len(d.patterns), 6, 10 ** -0.5) == (full, full)
    one, _ = A.capacity_what_if(d, 1, 6, 10 ** -0.5)
    assert 0 < one <= full
    md, _ = analyse.capacity_what_if(services, common.SCOPE_SESSION, 1, 6, -0.5, sess)
    assert f"would have rescued **{one}** of the {full}" in md
    with pytest.raises(gr.Error, match="Memory of N patterns must be a whole number from 1 to 100,000,000; got 0."):
        analyse.capacity_what_if(services, common.SCOPE_SESSION, 0, 6, -0.5, sess)


@pytest.mark.parametrize("capacity, got", [("abc", 'got "abc"'), ("1e9", 'got "1e9"'), (1e9, "got 1,000,000,000"),
                                           (2.5, "got 2.5"), (0, "got 0")])
def test_apply_keeps_its_refusal_beside_the_boxes_and_changes_nothing(services, capacity, got):
    """Apply on the page: the refusal is a line beside the boxes (not only a toast), what was typed stays in them."""
    sess = common.ensure_session(services, None)
    md, rows, cap, half, note, sess = explore.memory_apply(services, capacity, None, 6, sess)
    said = f"Not applied: Memory capacity must be a whole number from 1 to 100,000,000; {got}."
    assert said in note.replace("&quot;", '"') and 'data-state="stopped"' in note
    assert cap == gr.update() and half == gr.update() and sess.memory.policy.unbounded and "unbounded" in md


def test_after_an_upload_reset_or_apply_the_boxes_show_the_memorys_policy(services, tmp_path):
    sess = common.ensure_session(services, None)
    *_, cap, half, note, sess = explore.memory_apply(services, "300", "50", 6, sess)
    assert (cap, half) == ("300", "50") and "Applied: capacity 300 patterns" in note
    plain = CorrectionMemory(services.pair.pair_id, {(1, 2): 7}).save(tmp_path / "plain.json")
    md, *_ = explore.memory_upload(services, str(plain), 6, sess)
    assert "Policy: **unbounded (the paper's)**" in md
    assert explore.policy_boxes(services, sess)[:2] == ("", "")
    explore.memory_apply(services, 1000, None, 6, sess)
    explore.memory_reset(services, "clear", 6, sess)
    assert explore.policy_boxes(services, sess)[:2] == ("1,000", "")


def test_a_source_calibrated_twice_is_named_once():
    cal = [{"mode": "prompts", "source": "shipped prompt set", "prompts": 360, "positions": 63254},
           {"mode": "prompts", "source": "shipped prompt set", "prompts": 349, "positions": 65890},
           {"mode": "text", "corpus": "notes.txt", "positions": 100}]
    assert explore._calibration_lines(cal) == ["shipped prompt set: 709 prompts, 129,144 positions (2 calibrations)",
                                                "notes.txt: 100 positions"]
