"""An SGLang CSD table uploaded in the Explore & memory tab, and Analyse's charts of it (the memory scope),
on the tiny pair (``ui_fixtures``) and a real SQLite store."""
from __future__ import annotations

import html
import json
import math
import re

import plotly.graph_objects as go
import pytest
import ui_fixtures
from ui_fixtures import gen

from csd.calibration.sglang_table import vocabulary_of
from csd.db import analytics as A
from csd.ui.state import RunSettings
from csd.ui.tabs import analyse, common, explore

ui_store, ui_gate, ui_services = ui_fixtures.ui_store, ui_fixtures.ui_gate, ui_fixtures.ui_services  # fixtures


def _upload(services, path, sess):
    return explore.memory_upload(services, str(path), 6, sess)


def _rescued(summary: str) -> int:
    return int(re.search(r"would rescue \*\*(\d+)\*\*", summary).group(1))


def test_an_sglang_table_uploads_and_analyse_shows_it(services, tmp_path):
    sess = list(gen(services, max_new=32))[-1][-1]        # a run: logged divergences, with their gaps
    div = A.load_divergences(services.store, A.Filter(session_id=sess.session_id))
    assert len(div) > 0
    # a server's table over the session's own patterns: the first two admitted (9 >= lambda 6), one
    # of them marked allow=false, the rest below lambda
    pats = div.patterns
    counts = {p: (9 if i < 2 else 1) for i, p in enumerate(pats)}
    lines = [json.dumps({"type": "metadata", "metadata": {"tokenizer": services.pair.target_name}})]
    for i, ((d, t), c) in enumerate(counts.items()):
        rec = {"key": d << 32 | t} if i == 0 else {"lhs_token": d, "rhs_token": t}
        lines.append(json.dumps({**rec, "freq": c, "allow": i != 1}))
    table = tmp_path / "server.jsonl"
    table.write_text("\n".join(lines) + "\n")

    logged = analyse.analyse(services, common.SCOPE_SESSION, RunSettings(lam=6, log10_tau=-0.5), sess)[4]
    md, rows, err, sess = _upload(services, table, sess)
    assert err == "" and dict(sess.memory.items()) == counts
    assert "server.jsonl" in md and "1 entry marked allow=false" in md
    assert rows[0][3] == 9                                   # the memory table shows the table's counts

    scope = [*common.scopes(services), common.SCOPE_MEMORY]
    assert common.SCOPE_MEMORY in scope
    pareto, gaps, pos, heat, summary, *_ , sess = analyse.analyse(
        services, common.SCOPE_MEMORY, RunSettings(lam=6, log10_tau=-0.5), sess)
    assert all(isinstance(f, go.Figure) for f in (pareto, gaps, pos, heat))
    assert sorted(pareto.data[0].y, reverse=True) == sorted(counts.values(), reverse=True)[:30]
    assert "server.jsonl" in summary and f"{len(counts)} patterns" in summary
    # the gap and what-if charts decide the session's divergences with the table's counts
    lt = math.log(10 ** -0.5)
    want = sum(1 for k, g in zip(div.pattern, div.gap) if counts[pats[k]] >= 6 and g >= lt)
    assert _rescued(summary) == want
    assert 0 < want < _rescued(logged)          # the runs' own counts (8 for every pattern) rescue more
    assert len(heat.data) >= 1 and len(gaps.data) >= 1

    # an empty memory rescues nothing, whatever the runs' own counts were
    sess.memory = type(sess.memory)(services.pair.pair_id)
    assert _rescued(analyse.analyse(services, common.SCOPE_MEMORY, RunSettings(lam=6, log10_tau=-0.5), sess)[4]) == 0


def test_a_bad_sglang_table_upload_is_refused_and_the_memory_kept(services, tmp_path):
    sess = common.ensure_session(services, None)
    before = dict(sess.memory.items())
    size = vocabulary_of(services.pair).size
    cases = {
        "big.jsonl": (json.dumps({"lhs_token": 1, "rhs_token": size + 5}) + "\n",
                      f"token id {size + 5} (rhs_token) is beyond the vocabulary of "
                      f"{services.pair.target_name}: {size} ids"),
        "broken.json": ('{"entries": [\n{"lhs_token": 1,\n"rhs_token": }]}', "line 3: malformed JSON"),
        "other.jsonl": ('{"type": "metadata", "metadata": {"tokenizer": "gpt2"}}\n{"lhs_token": 1, "rhs_token": 2}\n',
                        "names tokenizer 'gpt2'"),
        "empty.jsonl": ("", "empty.jsonl is empty"), "blank.jsonl": ("\n \n", "blank.jsonl is empty"),
        "empty.json": ("", "empty.json is empty"), "none.json": ("[]", "none.json holds no entries"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.warns(UserWarning, match="Memory not loaded"):
            md, rows, err, sess = _upload(services, tmp_path / name, sess)
        assert message in html.unescape(err), name
        assert str(tmp_path) not in err and dict(sess.memory.items()) == before
