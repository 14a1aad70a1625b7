"""The draft-length policy keeps exploring (issue: gamma auto gave up after a bad start and never
learned again), replayed on hand-made answers (no model: a trace says where the draft agrees with the
target, a cost model says what each pass costs). ``replay`` is the offline replay of the removed
``tools/policy_sim.py`` (``git show c9a328b:tools/policy_sim.py``, which also recorded real traces)."""
import random
from dataclasses import dataclass

import pytest

from csd.block import DRAFT, Block
from csd.costs import CostModel
from csd.lookup import Lookup
from csd.policy import AutoGamma, FixedGamma
from csd.rule import NO_RESCUE, BlockScores, decide


@dataclass
class Trace:
    """One answer: the target's tokens and, at each position, the draft's top-1 and its probability
    after the target's tokens before it."""
    dataset: str
    item_id: str
    target: list[int]
    draft: list[int]
    confidence: list[float]


def replay(trace: Trace, policy, costs) -> dict:
    """The blocks a policy drafts along one answer: tokens, draft tokens, verify passes and the
    cost model's milliseconds."""
    t, d, c = trace.target, trace.draft, trace.confidence
    n, i = len(t), 0
    ms, passes, drafted = 0.0, 0, 0
    while i < n:
        room = n - i - 1
        policy.start()
        m, confs = 0, []
        go = room > 0 and policy.more(0, 1.0)
        while go:
            confs.append(c[i + m])
            m += 1
            if m >= room:
                break
            go = policy.more(m, c[i + m - 1])
        proposed = d[i:i + m]
        t_star = (t[i:i + m + 1] + [0])[:m + 1]
        decision = decide(proposed, BlockScores(t_star, [0.0] * (m + 1), [0.0] * m), lambda x, y: 0, NO_RESCUE)
        policy.observe(Block(passes, DRAFT, proposed, confs, decision=decision))
        kept = decision.n_kept
        ms += m * costs.draft_ms + costs.verify(m + 1)
        passes += 1
        drafted += m
        i += kept + 1
    return {"tokens": n, "ms": ms, "passes": passes, "drafted": drafted}


# a CPU like the ones CI runs on: a draft token costs a third of a 1-token target pass, and a pass of
# up to 12 tokens costs 1.4x a 1-token one
CPU = CostModel({1: 50.0, 2: 52.0, 3: 60.0, 4: 62.0, 6: 66.0, 8: 68.0, 12: 72.0, 16: 90.0, 24: 130.0, 33: 170.0}, 17.0)
DEAR = CostModel({k: 100.0 * k for k in (1, 2, 4, 8, 16, 33)}, 80.0)   # drafting can never pay


def trace(agree, n: int, conf: float = 0.9) -> Trace:
    """An answer of n tokens where the draft agrees with the target at position i iff agree(i)."""
    return Trace("t", "0", list(range(n)), [i if agree(i) else -1 for i in range(n)], [conf] * n)


def rate(tr: Trace, policy, costs=CPU) -> float:
    r = replay(tr, policy, costs)
    return r["tokens"] / r["ms"]


def ar_rate(costs=CPU) -> float:
    return 1 / costs.verify(1)


def test_a_bad_start_does_not_switch_speculation_off():
    """The first 24 tokens are all rejected, the rest agree 90% of the time: auto must find its way
    back to drafting (before, it stopped after a few rejections and never tried again)."""
    rng = random.Random(0)
    good = {i for i in range(24, 400) if rng.random() < 0.9}
    tr = trace(lambda i: i in good, 400)
    p = AutoGamma(CPU, 16)
    r = replay(tr, p, CPU)
    assert r["drafted"] > 200                      # it drafts again after the bad start
    assert r["tokens"] / r["passes"] > 1.8         # 1.0 when it froze
    best_fixed = max(rate(tr, FixedGamma(g)) for g in range(1, 9))
    assert r["tokens"] / r["ms"] > 0.95 * best_fixed


def test_without_fading_a_bad_start_would_freeze_it():
    """The mechanism the previous test guards: with the evidence never fading, the same trace
    drafts almost nothing after the bad start (this is the behaviour the issue reported)."""
    rng = random.Random(0)
    good = {i for i in range(24, 400) if rng.random() < 0.9}
    tr = trace(lambda i: i in good, 400)
    frozen = replay(tr, AutoGamma(CPU, 16, fade=1.0), CPU)
    explores = replay(tr, AutoGamma(CPU, 16), CPU)
    assert frozen["drafted"] < 40 < 200 < explores["drafted"]


def test_a_hopeless_draft_costs_little_against_ar():
    """A draft that never agrees: auto keeps probing, but more and more rarely and one token at a
    time, so it stays within 4% of the target alone (a fixed block loses far more)."""
    tr = trace(lambda i: False, 600)
    assert rate(tr, AutoGamma(CPU, 16)) > 0.96 * ar_rate()
    assert rate(tr, FixedGamma(3)) < 0.8 * ar_rate()


def test_where_drafting_cannot_pay_it_is_never_tried():
    tr = trace(lambda i: True, 200)
    assert replay(tr, AutoGamma(DEAR, 16), DEAR)["drafted"] == 0
    p = AutoGamma(DEAR, 8)
    for _ in range(100):
        p.learn([], [])
    assert p.plan(room=100) == 0 and (p.start() or not p.more(0, 1.0))


def test_a_good_draft_is_used_about_as_well_as_the_best_fixed_block():
    rng = random.Random(1)
    for share in (0.6, 0.8, 0.95):
        agree = {i for i in range(500) if rng.random() < share}
        tr = trace(lambda i, a=agree: i in a, 500)
        best_fixed = max(rate(tr, FixedGamma(g)) for g in range(1, 13))
        assert rate(tr, AutoGamma(CPU, 16)) > 0.95 * best_fixed, share


def test_positions_never_tried_inherit_the_rate_before_them():
    """A draft kept 95% of the time: the deeper positions, never tried at first, inherit the first
    position's rate (not a fixed prior of 0.8), so auto learns to draft long blocks."""
    rng = random.Random(2)
    agree = {i for i in range(500) if rng.random() < 0.95}
    r = replay(trace(lambda i: i in agree, 500), AutoGamma(CPU, 16), CPU)
    assert r["drafted"] / r["passes"] > 5
    p = AutoGamma(CPU, 16)
    for _ in range(30):
        p.learn([], [True])                    # only position 1 tried, always kept
    assert p.position_rate(1) > 0.95 and p.position_rate(8) > 0.9 > 0.8


def test_the_floor_drafts_at_least_that_many_tokens_a_block():
    """The app's "show speculation" mode: even where drafting cannot pay, every block drafts 3."""
    p = AutoGamma(DEAR, 16, floor=3)
    p.start()
    assert p.more(0, 1.0) and p.more(2, 0.01) and not p.more(3, 1.0)
    assert p.plan(room=100) == 3 and p.plan(room=2) == 2
    r = replay(trace(lambda i: False, 100), AutoGamma(DEAR, 16, floor=3), DEAR)
    assert r["passes"] == 100 and r["drafted"] == sum(min(3, 100 - i - 1) for i in range(100))


def _block(size: int, draft_ms: float, verify_ms: float, kept: int):
    """A verified draft block with measured times (the decode loop's record, as csd.block holds it)."""
    from csd.block import Block
    from csd.events import ACCEPTED, REJECTED
    from csd.rule import Decision, Verdict
    verdicts = tuple(Verdict(ACCEPTED if i < kept else REJECTED, "match" if i < kept else "mismatch", 5,
                             5 if i < kept else 6, 1.0, 1.0 if i < kept else 2.0, 0)
                     for i in range(min(size, kept + 1)))
    b = Block(0, proposed=list(range(size)), confidences=[0.9] * size, draft_s=size * draft_ms / 1000,
              draft_steps=size, verify_s=verify_ms / 1000, pass_tokens=size + 1)
    b.decision = Decision(verdicts=verdicts, n_kept=kept, next_token=6, bonus=kept == size, observed=())
    return b


def test_online_costs_follow_what_the_run_measures():
    """A machine busier than its profile: blocks whose draft costs 4x and whose verify pass costs 1.5x
    what the profile says move the policy's costs there, and with them its plan: at 3 of 4 tokens kept
    drafting 3 pays at the profile's costs (4 tokens in 113 ms against 1 in 50), at the run's at most 1."""
    quiet = AutoGamma(CPU, 16, online=True)
    busy = AutoGamma(CPU, 16, online=True)
    for _ in range(30):                                   # the same acceptance for both: 3 of 4 kept
        quiet.observe(_block(4, CPU.draft_ms, CPU.verify(5), 3))
        busy.observe(_block(4, 4 * CPU.draft_ms, 1.5 * CPU.verify(5), 3))
    assert quiet.draft_ms == pytest.approx(CPU.draft_ms) and quiet.verify_scale == pytest.approx(1.0)
    assert busy.draft_ms == pytest.approx(4 * CPU.draft_ms, rel=0.01)
    assert busy.verify_scale == pytest.approx(1.5, rel=0.01)
    assert quiet.plan(16) == 3 and busy.plan(16) <= 1
    offline = AutoGamma(CPU, 16)                            # the default: the profile alone
    offline.observe(_block(4, 4 * CPU.draft_ms, 1.5 * CPU.verify(5), 3))
    assert offline.draft_ms == CPU.draft_ms and offline.verify_scale == 1.0


def test_a_step_that_also_read_copied_tokens_is_not_a_draft_tokens_cost():
    """After blocks of copies from the context, the draft's first step also reads the copied tokens: a pass of many,
    which the block keeps apart (``Block.catch_up_s``), so the draft's cost stays its 1-token steps'. Taken for
    a token's cost (before 2026-12-07: 17-68 ms against an 8 ms step on the AVX2 path) it made gamma auto stop
    drafting after a run or two; a block whose only step read copies teaches the draft's cost nothing."""
    p = AutoGamma(CPU, 16, online=True)
    for _ in range(30):
        b = _block(4, CPU.draft_ms, CPU.verify(5), 3)
        b.draft_s, b.draft_steps, b.catch_up_s = 3 * CPU.draft_ms / 1000, 3, 0.09
        p.observe(b)
        lone = _block(1, CPU.draft_ms, CPU.verify(2), 1)
        lone.draft_s, lone.draft_steps, lone.catch_up_s = 0.0, 0, 0.09
        p.observe(lone)
    assert p.draft_ms == pytest.approx(CPU.draft_ms)


def test_an_untimed_block_leaves_the_costs_alone():
    """On a GPU the loop does not time blocks (the calls return before the work ends): nothing moves."""
    p = AutoGamma(CPU, 16, online=True)
    b = _block(4, 3 * CPU.draft_ms, 2 * CPU.verify(5), 3)
    b.draft_s = b.verify_s = None
    p.observe(b)
    assert p.draft_ms == CPU.draft_ms and p.verify_scale == 1.0


# a CPU's costs where a pass of many rows is compute-bound: a 1-token pass is mostly the weights' reading (the fixed
# 20 ms), and each row adds 6.5 ms of arithmetic (the embedded target on 2 cores of an AMD EPYC reads so)
ROWS = CostModel({k: 20.0 + 6.5 * k for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, 8.0)


def test_runs_that_share_passes_split_the_weights_reading_and_pay_their_rows():
    """``CostModel.shared``: one run alone pays what the profile says; one of n runs pays 1/n of a pass's fixed part
    (20 ms here) and all of its own rows' arithmetic, so each extra token of a block costs what it costs alone."""
    assert ROWS.shared(1) is ROWS
    eight = ROWS.shared(8)
    assert eight.verify(1) == pytest.approx(20.0 / 8 + 6.5)
    for k in (1, 2, 5, 16):
        assert eight.verify(k + 1) - eight.verify(k) == pytest.approx(ROWS.verify(k + 1) - ROWS.verify(k))
    # the draft's step is split in the target's proportion: 20 of its 26.5 ms are the fixed part
    assert eight.draft_ms == pytest.approx(8.0 - 8.0 * 20.0 / 26.5 * (1 - 1 / 8))
    assert ROWS.verify(1) == pytest.approx(26.5)         # the profile itself is left as it was


# a CPU whose small passes are the weights' reading (30 ms, their rows' arithmetic hidden behind it) and whose long
# passes are compute-bound at 6.5 ms a row, as the gguf target's on 2 cores of an AMD EPYC (docs/bench/gguf-epyc5)
READS = CostModel({k: max(30.0, 6.5 * k) for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, 8.0)


def test_one_of_eight_pays_the_rows_of_a_pass_of_eight_blocks():
    """Among 8 runs a pass holds 8 blocks: a run's share of a k-token block is verify(8k) / 8, so on a CPU whose
    small passes hide their rows behind the weights' reading, a run's extra token costs a whole compute-bound row
    (6.5 ms), not the nothing it costs a run alone; the draft's step is split as a 1-token pass is."""
    eight = READS.shared(8)
    assert READS.verify(2) - READS.verify(1) == 0.0                   # alone, a second token is free
    assert eight.verify(1) == pytest.approx(52.0 / 8)                 # a pass of 8 rows, split 8 ways
    assert eight.verify(2) - eight.verify(1) == pytest.approx(6.5)    # among 8, it costs its row
    assert eight.draft_ms == pytest.approx(8.0 * (52.0 / 8) / 30.0)
    two = READS.shared(2)
    assert two.verify(1) == pytest.approx(15.0) and two.verify(2) == pytest.approx(15.0)   # 4 rows hide too


def test_copies_stop_where_a_pass_of_many_runs_is_compute_bound():
    """Copies kept 3 times in 4: a run alone copies (a second token rides free on the weights' reading); one of 8
    runs does not, since a copied token then costs a row of arithmetic and brings 0.75 of a token, less than a
    plain step's share brings; one of 2 still does."""
    lk = Lookup(8, READS)
    for i in range(40):
        lk.observe_copies(8, 8 if i % 4 else 0)
    cand = list(range(8))
    assert len(lk.choose(cand)) >= 2
    lk.share(8)
    assert lk.choose(cand) == []
    lk.share(2)
    assert len(lk.choose(cand)) >= 1


def test_a_run_among_eight_drafts_less_and_that_pays_among_eight():
    """The same answers (the draft agrees 80% of the time), planned alone and as one of 8 runs that share every
    pass: among 8, a drafted token's rows weigh more against a plain step's share, so the plan drafts less, and its
    tokens a ms, counted at the shared costs, beat the plan made for a run alone."""
    rng = random.Random(3)
    agree = {i for i in range(500) if rng.random() < 0.8}
    tr = trace(lambda i: i in agree, 500)
    shared = ROWS.shared(8)
    alone = replay(tr, AutoGamma(ROWS, 16), ROWS)
    as_if_alone = replay(tr, AutoGamma(ROWS, 16), shared)          # a run among 8 that plans as if alone
    among = AutoGamma(ROWS, 16)
    among.share(8)
    planned = replay(tr, among, shared)
    assert planned["drafted"] < 0.6 * alone["drafted"]
    assert planned["tokens"] / planned["ms"] > 1.05 * as_if_alone["tokens"] / as_if_alone["ms"]
    assert planned["tokens"] / planned["ms"] > 0.98 / shared.verify(1)       # and no worse than plain steps
    among.share(1)                                                  # alone again: the run's own costs
    assert among.costs is ROWS and among.draft_ms == ROWS.draft_ms


# a pass of many rows is compute-bound at 4 ms a row past the 8th; a 1-token pass 30 ms, a draft step 10 ms
LONG = CostModel({1: 30.0, 2: 31.0, 4: 33.0, 8: 37.0, 16: 69.0, 33: 137.0}, 10.0)


def _keeps_well(p: AutoGamma) -> AutoGamma:
    """A policy that has seen the draft kept at every position 9 times in 10."""
    for i in range(30):
        kept = [True] * 6 if i % 10 else [True] * 3 + [False]
        p.learn([0.95] * len(kept), kept)
    return p


def test_the_drafts_first_reading_of_a_long_prompt_is_weighed_before_drafting():
    """A host's draft reads the prompt only when it first drafts (csd.decode.Run._draft_catch_up). That reading is
    a pass of the prompt's rows, paid once: with many tokens left to write it is a small share of each and drafting
    pays; with few left, or a very long prompt, each token would carry too much of it and the block stays a plain
    step. Once the draft has what it lacks (``owe`` of 0 rows) drafting pays again."""
    p = _keeps_well(AutoGamma(LONG, 16))
    p.start()
    assert p.more(0, 1.0)                                  # nothing owed: drafting pays
    p.start()
    p.owe(150, 500)                                        # a 150-token prompt, 500 tokens to write
    assert p.more(0, 1.0)
    p.start()
    p.owe(150, 4)                                          # the same prompt, 4 tokens left
    assert not p.more(0, 1.0)
    p.start()
    p.owe(3000, 100)                                       # a very long prompt
    assert not p.more(0, 1.0)
    p.start()                                              # a new block forgets what the last one owed
    assert p.more(0, 1.0)
    p.start()
    p.owe(0, 4)
    assert p.more(0, 1.0)


def test_what_the_draft_owes_scales_as_the_profiles_rows_and_weighs_on_the_first_token_only():
    """The reading of n rows costs the draft's step times verify(n) / verify(1), at the run's own costs (a shared
    pass does not split a run's rows), and once the block drafts, its later tokens weigh nothing owed."""
    p = _keeps_well(AutoGamma(LONG, 16))
    p.start()
    p.owe(150, 100)
    assert p._owed == pytest.approx(10.0 * LONG.verify(150) / LONG.verify(1) / 100)
    p.share(8)
    p.start()
    p.owe(150, 100)
    assert p._owed == pytest.approx(10.0 * LONG.verify(150) / LONG.verify(1) / 100)
    p.share(1)
    p.start()
    p.owe(150, 10)
    assert p.more(0, 1.0) is False
    assert p.more(1, 0.95)                                 # drafting already: the reading is paid


def test_a_run_among_eight_that_finds_itself_alone_for_a_moment_does_not_start_drafting():
    """docs/bench/avx2-epyc8, native: a profile whose second token looked nearly free (37.9 and 38.8 ms) made a run
    of 8 at once that was briefly alone draft, and its first drafting step read its whole prompt in a pass shared
    with the others (8 at once made 1.01x one run). Alone with that profile and an int8 draft's 23.5 ms step,
    the draft's first reading of a 150-token prompt, spread over the 120 tokens left, no longer pays."""
    # docs/bench/avx2-epyc8/native/profile-slow-spell.json, rounded
    slow = CostModel({1: 37.86, 2: 38.83, 3: 38.83, 4: 47.27, 5: 50.04, 6: 62.13, 7: 62.13, 8: 62.13, 10: 81.42,
                      12: 88.32, 16: 112.0, 24: 166.62, 33: 227.79}, 23.46, pass_overhead_ms=0.86)
    p = AutoGamma(slow, 16)
    for i in range(50):                                    # the first position kept 64% of the time
        p.learn([0.9], [i % 25 < 16])
    p.start()
    assert p.more(0, 1.0)                                  # without the reading it looks worth it
    p.start()
    p.owe(150, 120)
    assert not p.more(0, 1.0)
