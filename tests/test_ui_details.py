"""A token's details (the panel a click on a token fills): every reason that decided a rescue or a
rejection, in plain words, from hand-made events; and counts in words ("1 token", not "1 tokens").

The thresholds are the run's (λ = 6, τ = 0.01, so log τ = −4.61); ``csd.rule`` decides: rescued
iff count >= λ and gap >= log τ; a special token is never rescued; SD has no rescue.
"""
from __future__ import annotations

import html
import re

import pytest

from csd import rule
from csd.config import CSDConfig
from csd.events import (
    ACCEPTED,
    CORRECTED,
    REJECTED,
    RESCUED,
    RULE_GAP_LOW,
    RULE_MEMORY_RARE,
    RULE_NO_RESCUE,
    RULE_RESCUE,
    RULE_SPECIAL,
    TokenEvent,
)
from csd.ui import render
from csd.ui.tabs import teach

LAM, TAU = 6, 0.01          # log tau = -4.61
MEMORY = "the memory had seen this swap 2 times, fewer than λ = 6"
GATE = "the target found ␣cat too unlikely (logit gap −5.20, below log τ = −4.61)"


def div(status: str, rule_: str, count: int | None, gap: float | None, draft=" cat", target=" dog", **kw) -> TokenEvent:
    """A divergence: the draft wrote ``draft`` where the target's top-1 was ``target``."""
    return TokenEvent(position=3, token_id=7, text=draft, status=status, block=1, index_in_block=2, draft_id=7,
                      draft_text=draft, target_id=8, target_text=target, gap=gap, memory_count=count, rule=rule_,
                      block_len=4, **kw)


def first_line(ev: TokenEvent, method: str | None = "csd") -> str:
    return render.token_detail(ev, LAM, TAU, method=method).splitlines()[0]


def test_the_engine_decides_these_events_as_the_test_says():
    """The hand-made events are what the rule gives: the reasons below describe real decisions."""
    lt = rule.log_tau(TAU)
    assert not rule.rescues(2, -5.2, LAM, lt) and not rule.rescues(2, -1.0, LAM, lt)
    assert not rule.rescues(9, -5.2, LAM, lt) and rule.rescues(9, -1.0, LAM, lt)
    assert rule.rescue_decision(7, 8, -5.2, 0.0, 2, rule.Rescue.of(True, True, LAM, TAU)) == (False, RULE_MEMORY_RARE)


def test_both_reasons_when_the_memory_and_the_gate_failed():
    line = first_line(div(REJECTED, RULE_MEMORY_RARE, 2, -5.2))
    assert line.startswith("The draft wrote ␣cat, the target preferred ␣dog; rejected because ")
    assert f"{MEMORY} and {GATE}." in line
    assert "memory<lambda" not in render.token_detail(div(REJECTED, RULE_MEMORY_RARE, 2, -5.2), LAM, TAU)
    # the technical lines show both checks failing
    detail = render.token_detail(div(REJECTED, RULE_MEMORY_RARE, 2, -5.2), LAM, TAU, method="csd")
    assert "gate: how close (logit gap z(x~) − z(t*)) = −5.20 vs log τ = −4.61 ✗" in detail
    assert "the draft's token (x~) = " in detail and "the target's choice (t*) = " in detail
    assert "memory: count(x~ → t*) = 2 vs λ = 6 ✗" in detail
    assert "rule:" not in detail


def test_only_the_memory_failed():
    line = first_line(div(REJECTED, RULE_MEMORY_RARE, 2, -1.0))
    assert MEMORY in line and "too unlikely" not in line
    assert "although the gate would have let it through (logit gap −1.00, at or above log τ = −4.61)" in line
    once = first_line(div(REJECTED, RULE_MEMORY_RARE, 1, -1.0))
    assert "had seen this swap 1 time, fewer than λ = 6" in once
    never = first_line(div(REJECTED, RULE_MEMORY_RARE, 0, -1.0))
    assert "the memory had never seen this swap, fewer than λ = 6" in never


def test_only_the_gate_failed():
    line = first_line(div(REJECTED, RULE_GAP_LOW, 9, -5.2))
    assert GATE in line and "fewer than" not in line
    assert "although the memory knew the swap (9 times, λ = 6)" in line


def test_a_special_token_is_never_rescued():
    ev = div(REJECTED, RULE_SPECIAL, None, -0.1, draft="<|im_end|>")
    line = first_line(ev)
    assert "a special token (end of turn, chat template) is never rescued" in line
    assert "memory had" not in line and "too unlikely" not in line
    assert "memory:" not in render.token_detail(ev, LAM, TAU) and "gate:" not in render.token_detail(ev, LAM, TAU)


def test_sd_has_no_rescue():
    line = first_line(div(REJECTED, RULE_NO_RESCUE, 9, -0.1), method="sd")
    assert "this method has no rescue: it keeps a draft token only where the target agrees" in line
    assert "memory had" not in line
    sampled = TokenEvent(position=0, token_id=7, text=" cat", status=REJECTED, block=0, index_in_block=0, draft_id=7,
                         draft_text=" cat", target_id=7, target_text=" cat", rule=RULE_NO_RESCUE)
    assert "rejection sampling did not keep it" in first_line(sampled, method="sd")


def test_a_rescue_names_both_halves_of_the_rule():
    line = first_line(div(RESCUED, RULE_RESCUE, 9, -1.0))
    assert line.startswith("The draft wrote ␣cat, the target preferred ␣dog; kept because ")
    assert ("the memory had seen this swap 9 times (at least λ = 6) and the target found ␣cat close enough "
            "(logit gap −1.00, at or above log τ = −4.61).") in line


def test_the_ablations_name_only_the_module_they_use():
    # memory only: the gate is not part of the rule, even where the gap is low
    ocm = first_line(div(REJECTED, RULE_MEMORY_RARE, 2, -5.2), method="ocm-only")
    assert MEMORY in ocm and "too unlikely" not in ocm
    assert "this method has no gate" in first_line(div(RESCUED, RULE_RESCUE, 9, -5.2), method="ocm-only")
    # gate only: the memory's count is not part of the rule
    scg = first_line(div(REJECTED, RULE_GAP_LOW, 2, -5.2), method="scg-only")
    assert GATE in scg and "fewer than" not in scg and "memory knew" not in scg
    assert "(this method uses no memory)" in render.token_detail(div(REJECTED, RULE_GAP_LOW, 2, -5.2), LAM, TAU,
                                                                 method="scg-only")


def test_unknown_thresholds_fall_back_on_the_logged_rule():
    line = render.plain_sentence(div(REJECTED, RULE_GAP_LOW, 9, -5.2))
    assert "too unlikely (logit gap −5.20, below log τ)" in line


def test_the_details_reach_the_page_escaped_with_the_run_method():
    ev = div(REJECTED, RULE_MEMORY_RARE, 2, -5.2, draft='<b>"x"</b>')
    out = render.render_tokens([ev], cfg=CSDConfig(method="csd", lam=LAM, tau=TAU))
    detail = html.unescape(re.search(r'data-detail="([^"]*)"', out).group(1))
    assert "<b>" not in out.split("data-detail=")[1].split('">')[0]
    assert "fewer than λ = 6 and the target found" in detail
    assert render.render_tokens([ev], cfg=CSDConfig(method="ocm-only", lam=LAM, tau=TAU)).count("too unlikely") == 0


def test_teach_names_both_failures_too():
    """Teach's why column is the first line of the token's details in Generate: one explanation."""
    def why(ev, method):
        out = teach.render_teach_step([ev], step=0, n_steps=1, text_before="", cfg=CSDConfig(method=method, lam=LAM,
                                                                                              tau=TAU))
        return html.unescape(re.search(r'<td class="why">([^<]*)</td>', out).group(1))
    both = div(REJECTED, RULE_MEMORY_RARE, 2, -5.2)
    assert why(both, "csd") == first_line(both, "csd")
    assert "2 times, fewer than λ = 6 and the target found" in why(both, "csd")
    assert "below log τ = −4.61" in why(both, "csd")
    assert "too unlikely" not in why(div(REJECTED, RULE_MEMORY_RARE, 2, -1.0), "csd")
    assert "memory" not in why(div(REJECTED, RULE_GAP_LOW, 2, -5.2), "scg-only")


# -- counts in words ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,word,many,want", [(1, "token", None, "1 token"), (2, "token", None, "2 tokens"),
                                              (0, "token", None, "0 tokens"), (1, "pass", "passes", "1 pass"),
                                              (3, "pass", "passes", "3 passes"), (2048, "token", None, "2,048 tokens")])
def test_plural(n, word, many, want):
    assert render.plural(n, word, many) == want


def test_a_one_token_iteration_says_one_token():
    block = [TokenEvent(position=0, token_id=8, text=" dog", status=CORRECTED, block=0, index_in_block=0,
                        target_id=8, target_text=" dog", block_len=1),
             div(REJECTED, RULE_NO_RESCUE, None, -1.0)]
    block = [block[1], block[0]]
    out = teach.render_teach_step(block, step=0, n_steps=1, text_before="",
                                  cfg=CSDConfig(method="sd", lam=LAM, tau=TAU))
    assert "1 token emitted" in out and "1 tokens" not in out
    acc = TokenEvent(position=0, token_id=1, text=" a", status=ACCEPTED, block=0, index_in_block=0, draft_id=1,
                     draft_text=" a", target_id=1, target_text=" a", block_len=1)
    assert "the draft proposed 1 token," in teach.render_teach_step([acc], step=0, n_steps=1, text_before="",
                                                                    cfg=CSDConfig(method="sd", lam=LAM, tau=TAU))


def test_no_plural_is_made_by_hand_in_the_app():
    """Counts go through render.plural: no "{n} token{'s' if ...}" left to get wrong."""
    from pathlib import Path
    for path in (Path(render.__file__).parent).rglob("*.py"):
        src = path.read_text()
        assert not re.search(r"""['"]s['"] if\b|['"]s are['"] if\b""", src), path


def test_one_of_a_kind_reads_in_the_singular():
    from csd.config import CSDConfig
    from csd.events import RunMetrics
    from csd.ui.state import RunView
    from csd.ui.tabs import compare
    one = div(REJECTED, RULE_MEMORY_RARE, 2, -5.2)
    assert "0 of 1 divergence in the last answer" in render.whatif_summary([one], LAM, TAU)
    assert "1 changed decision is outlined" in render.whatif_summary([one], 2, 1e-4)
    assert "1 draft token rejected" in render.run_summary([one])
    view = RunView(None, "p", True, CSDConfig(method="sd"), done=True,
                   metrics=RunMetrics(new_tokens=1, target_forwards=1, wall_s=0.5))
    assert "**SD**: 1 target pass for 1 token, 0.50 s" in compare._compare_caption("sd", view, None, None)


def test_teach_table_carries_its_scroll_hint():
    """The hint is in the page's HTML; the script shows it only where the table is wider than its box."""
    acc = TokenEvent(position=0, token_id=1, text=" a", status=ACCEPTED, block=0, index_in_block=0, draft_id=1,
                     draft_text=" a", target_id=1, target_text=" a", block_len=1)
    out = teach.render_teach_step([acc], step=0, n_steps=1, text_before="",
                                  cfg=CSDConfig(method="sd", lam=LAM, tau=TAU))
    assert re.search(r'<div class="csd-scroll-box"><div class="csd-scroll-hint">[^<]*scroll[^<]*→</div>'
                     r'<div class="csd-scroll"><table>', out)
    css = render.CSS
    assert re.search(r"\.csd-scroll-hint \{ display: none;", css)
    assert '.csd-scroll-box[data-scrolls="more"] .csd-scroll-hint' in css and "data-scrolls" in render.JS


def test_positions_in_a_block_are_counted_as_they_stand():
    """A bonus token follows the block's drafts: it is no draft position ("draft position 5 of 4" was said); a
    correction takes a rejected draft's place; an AR token names no draft position."""
    from csd.events import BONUS, CORRECTED, TARGET
    from csd.ui.render import token_detail

    def place(status, index, block_len, draft_id=None):
        ev = TokenEvent(position=9, token_id=4, text=" x", status=status, block=2, index_in_block=index,
                        draft_id=draft_id, block_len=block_len)
        return token_detail(ev, 6, 0.01).splitlines()[1]
    assert place(BONUS, 4, 4).endswith("verify pass 3, after the 4 drafted tokens")
    assert place(ACCEPTED, 3, 4, draft_id=4).endswith("verify pass 3, draft position 4 of 4")
    assert place(CORRECTED, 1, 4).endswith("verify pass 3, in place of draft position 2 of 4")
    assert place(TARGET, 0, None).endswith("verify pass 3")
    for status, index, n in ((BONUS, 4, 4), (BONUS, 1, 1), (CORRECTED, 3, 4), (ACCEPTED, 0, 4)):
        line = place(status, index, n, draft_id=4 if status == ACCEPTED else None)
        m = re.search(r"position (\d+) of (\d+)", line)
        assert m is None or int(m.group(1)) <= int(m.group(2)), line


@pytest.mark.parametrize("method,saved", [("csd", "rescued"), ("lossy", "relaxed")])
def test_every_percentage_names_what_it_counts(method, saved):
    """The cards said "79% accepted" where the status line said "81% of drafts were kept" (rescues included):
    each share says which it counts, and kept = accepted + rescued (or relaxed) is a card of its own."""
    from csd.events import RunMetrics
    from csd.ui.export import render_metrics
    m = RunMetrics(new_tokens=120, target_forwards=30, drafted=100, accepted=79, wall_s=10.0,
                   **{"rescued" if saved == "rescued" else "relaxed": 2})
    page = html.unescape(render_metrics(m, method=method))
    cells = re.findall(r'<div class="v">([^<]*)</div><div class="k">([^<]*)</div>', page)
    shares = [(v, k) for v, k in cells if v.endswith("%")]
    assert shares and all(re.match(r"(accepted|rescued|relaxed|kept)\b", k) for _, k in shares), shares
    assert ("81%", f"kept = accepted + {saved} (81 of 100 drafted)") in shares
    assert ("79%", "accepted: draft = target (79 of 100 drafted)") in shares
