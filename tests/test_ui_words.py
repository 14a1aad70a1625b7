"""Issue 68's plain words, on the page as built (tiny models, no browser): one logarithm (the paper's, natural: τ's
slider moves in powers of ten and says so), the paper's symbols folded beside plain words in the tables, no
gradio timer ("0.0s |") drawn over a status line, and the what-if heatmap's colours spanning the rates it holds."""
from __future__ import annotations

import json

import pytest
from ui_fixtures import tiny_services

from csd.ui import build_demo
from csd.ui.figures import make_whatif_figure
from csd.ui.tabs import explore
from csd.ui.tabs.common import describe_tau


@pytest.fixture(scope="module")
def demo():
    return build_demo(tiny_services(None))


def test_one_logarithm_throughout(demo):
    page = json.dumps(demo.get_config_file(), ensure_ascii=False, default=str)
    assert "log₁₀" not in page and "log10 τ" not in page
    assert "τ's power of ten (gate threshold: -2 is τ = 0.01)" in page
    assert describe_tau(-2) == "τ = 0.01  (log τ = -4.61)"
    fig = make_whatif_figure([0, 6], [1e-4, 1e-2, 1.0], [[0.0, 0.01, 0.03], [0.0, 0.0, 0.02]], 6, 0.01, 40)
    assert "log₁₀" not in json.dumps(fig.to_plotly_json(), ensure_ascii=False)
    assert list(fig.layout.xaxis.ticktext) == ["0.0001", "0.001", "0.01", "0.1", "1"]


def test_the_heatmap_colours_span_the_rates_it_holds():
    """Rates of 0-3% were drawn on a 0-100% scale, all in the palest colour."""
    fig = make_whatif_figure([0, 6], [1e-4, 1e-2, 1.0], [[0.0, 0.01, 0.03], [0.0, 0.0, 0.02]], 6, 0.01, 40)
    heat = fig.data[0]
    assert heat.zmin == 0 and heat.zmax == pytest.approx(0.03) and "0 to 3%" in heat.colorbar.title.text


def test_the_tables_say_in_words_what_the_symbols_mean():
    for columns in (explore.EVENT_COLUMNS, explore.MEMORY_COLUMNS):
        assert "the draft's token (x~)" in columns and "the target's choice (t*)" in columns
    assert "how close (logit gap)" in explore.EVENT_COLUMNS


def test_no_gradio_timer_is_drawn_over_a_status_line(demo):
    """Stop's click showed gradio's progress (a stray "0.0s |") over the status line it rewrites."""
    status = {b._id for b in demo.blocks.values() if str(getattr(b, "elem_id", "")).endswith("-status")}
    assert len(status) >= 5
    loud = [fn.api_name or fn.name for fn in demo.fns.values()
            if status & {b._id for b in fn.outputs} and fn.show_progress != "hidden"]
    assert loud == []


def test_the_pareto_chart_says_the_sliders_do_not_change_it():
    """A tester moved λ and τ and saw the Pareto chart stay: it counts every logged divergence, and says so."""
    from csd.ui.figures import make_pareto_figure
    rows = [{"draft_id": 1, "target_id": 2, "draft_text": "a", "target_text": "b", "count": 3, "example_context": ""}]
    title = make_pareto_figure(rows).layout.title.text
    assert "the draft's token x~ → the target's choice t*" in title and "the sliders do not change it" in title
