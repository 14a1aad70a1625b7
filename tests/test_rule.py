"""The acceptance rule as a pure function, on hand-made logits that make every branch certain."""
import math

import numpy as np
import pytest
import torch

from csd.events import (
    ACCEPTED,
    REJECTED,
    RESCUED,
    RULE_GAP_LOW,
    RULE_MATCH,
    RULE_MEMORY_RARE,
    RULE_NO_RESCUE,
    RULE_RESCUE,
    RULE_SPECIAL,
)
from csd.rule import NO_RESCUE, Rescue, decide, rescues
from csd.verify import score_block, verify_sampling

V = 8
LOG_TAU = math.log(0.01)
CSD = Rescue(use_ocm=True, use_scg=True, lam=6, log_tau=LOG_TAU)


def logits(*rows):
    """rows: dicts {token: logit}; every other entry is -10."""
    t = torch.full((len(rows), V), -10.0)
    for i, r in enumerate(rows):
        for k, v in r.items():
            t[i, k] = v
    return t


def counts(table):
    return lambda x, t: table.get((x, t), 0)


def greedy(drafts, lg, count, rescue):
    """Greedy verification as the decode loop does it: the block's scores in one transfer, then the rule."""
    return decide(drafts, score_block(drafts, lg, rescue.scores)[1], count, rescue)


def test_all_match_gives_bonus():
    d = greedy([1, 2], logits({1: 10}, {2: 10}, {3: 10}), counts({}), CSD)
    assert [v.status for v in d.verdicts] == [ACCEPTED, ACCEPTED]
    assert [v.rule for v in d.verdicts] == [RULE_MATCH, RULE_MATCH]
    assert d.n_kept == 2 and d.bonus and d.next_token == 3 and d.observed == ()


def test_rescue_when_memory_and_gate_pass_and_verification_goes_on():
    # position 0: draft 4, target prefers 5 by a gap of 1 (>= log 0.01); pattern seen 6 times
    d = greedy([4, 2], logits({5: 10, 4: 9}, {2: 10}, {7: 10}), counts({(4, 5): 6}), CSD)
    assert [v.status for v in d.verdicts] == [RESCUED, ACCEPTED]
    assert d.verdicts[0].rule == RULE_RESCUE and d.verdicts[0].count == 6
    assert d.verdicts[0].gap == pytest.approx(-1.0)
    assert d.n_kept == 2 and d.bonus and d.next_token == 7
    assert d.observed == ((4, 5),)


def test_memory_too_rare_rejects_and_emits_target_token():
    d = greedy([4, 2], logits({5: 10, 4: 9}, {2: 10}, {7: 10}), counts({(4, 5): 5}), CSD)
    assert [v.status for v in d.verdicts] == [REJECTED]
    assert d.verdicts[0].rule == RULE_MEMORY_RARE
    assert d.n_kept == 0 and not d.bonus and d.next_token == 5 and d.observed == ((4, 5),)


def test_gap_below_log_tau_rejects():
    # gap = -5 < log(0.01) = -4.6
    d = greedy([4], logits({5: 10, 4: 5}, {7: 10}), counts({(4, 5): 100}), CSD)
    assert d.verdicts[0].status == REJECTED and d.verdicts[0].rule == RULE_GAP_LOW
    assert d.next_token == 5


def test_sd_never_rescues_and_ablations_switch_one_module_off():
    lg = logits({5: 10, 4: 5}, {7: 10})
    assert greedy([4], lg, counts({(4, 5): 100}), NO_RESCUE).verdicts[0].rule == RULE_NO_RESCUE
    ocm_only = Rescue(use_ocm=True, use_scg=False, lam=6, log_tau=LOG_TAU)
    assert greedy([4], lg, counts({(4, 5): 6}), ocm_only).verdicts[0].status == RESCUED  # gap ignored
    scg_only = Rescue(use_ocm=False, use_scg=True, lam=6, log_tau=LOG_TAU)
    assert greedy([4], logits({5: 10, 4: 9}, {7: 10}), counts({}), scg_only).verdicts[0].status == RESCUED
    assert greedy([4], lg, counts({}), scg_only).verdicts[0].rule == RULE_GAP_LOW


def test_divergence_counts_after_its_own_decision_within_a_block():
    # the same pattern twice in one block; memory holds 5, lambda 6: the first is rejected...
    lg = logits({5: 10, 4: 9}, {5: 10, 4: 9}, {7: 10})
    d = greedy([4, 4], lg, counts({(4, 5): 5}), CSD)
    assert [v.status for v in d.verdicts] == [REJECTED]
    # ...with lambda 6 and count 6 the first is rescued, and the second sees 6 + 1
    d = greedy([4, 4], lg, counts({(4, 5): 6}), CSD)
    assert [v.count for v in d.verdicts] == [6, 7]
    assert d.observed == ((4, 5), (4, 5))
    # with lambda 7, count 6: first rejected (no self-vouching) even though it would make 7
    d = greedy([4, 4], lg, counts({(4, 5): 6}), Rescue(True, True, 7, LOG_TAU))
    assert [v.status for v in d.verdicts] == [REJECTED]


def test_sampling_accepts_with_probability_min_1_p_over_q():
    """Token 1 has q = 0.8 under the draft and p = 0.5 under the target: accepted with probability
    p/q = 0.625; token 2 (q = 0.2 < p = 0.5) always. Measured over 4000 draws (fixed seed)."""
    p = torch.zeros(2, V)
    p[0, 1], p[0, 2], p[1, 3] = 0.5, 0.5, 1.0
    q = torch.zeros(1, V)
    q[0, 1], q[0, 2] = 0.8, 0.2
    g = torch.Generator().manual_seed(0)
    acc = [verify_sampling([1], q, p, torch.log(p), counts({}), NO_RESCUE, g).verdicts[0].status == ACCEPTED
           for _ in range(4000)]
    assert abs(sum(acc) / len(acc) - 0.625) < 0.03
    always = [verify_sampling([2], q, p, torch.log(p), counts({}), NO_RESCUE, g) for _ in range(200)]
    assert all(d.verdicts[0].status == ACCEPTED and d.bonus and d.next_token == 3 for d in always)
    # a rejected token 1 is replaced from norm(max(0, p - q)) = token 2 only
    rejected = [d for d in (verify_sampling([1], q, p, torch.log(p), counts({}), NO_RESCUE, g) for _ in range(400))
                if d.verdicts[0].status == REJECTED]
    assert rejected and all(d.next_token == 2 for d in rejected)


def test_sampling_rejection_draws_from_residual():
    # draft puts all mass on token 1, target has none there: always rejected, replacement from p
    p = torch.softmax(logits({2: 10}, {3: 10}), -1)
    q = torch.zeros(1, V)
    q[0, 1] = 1.0
    g = torch.Generator().manual_seed(0)
    d = verify_sampling([1], q, p, torch.log(p), counts({}), NO_RESCUE, g)
    assert d.verdicts[0].status == REJECTED and d.next_token == 2 and not d.bonus


def test_gate_at_exact_equality_rescues():
    # gap = 9 - 10 = -1.0 exactly; tau = e^-1, so log tau = -1.0: the gate's ">=" lets it through
    tau = math.exp(-1.0)
    assert math.log(tau) == -1.0
    at = Rescue.of(True, True, lam=6, tau=tau)
    assert greedy([4], logits({5: 10, 4: 9}, {7: 10}), counts({(4, 5): 6}), at).verdicts[0].status == RESCUED
    above = Rescue.of(True, True, lam=6, tau=math.nextafter(tau, 1.0))
    assert greedy([4], logits({5: 10, 4: 9}, {7: 10}), counts({(4, 5): 6}), above).verdicts[0].rule == RULE_GAP_LOW
    # the memory at exact equality too: count == lambda passes, count == lambda - 1 does not
    assert rescues(6, -1.0, 6, -2.0) and not rescues(5, -1.0, 6, -2.0)


def test_special_tokens_are_refused_and_not_observed():
    special = Rescue.of(True, True, lam=0, tau=1e-9, special={5})
    d = greedy([4, 2], logits({5: 10, 4: 9.9}, {2: 10}, {7: 10}), counts({(4, 5): 100}), special)
    assert d.verdicts[0].status == REJECTED and d.verdicts[0].rule == RULE_SPECIAL
    assert d.verdicts[0].count is None and d.observed == () and d.next_token == 5
    d = greedy([5], logits({4: 10, 5: 9.9}, {7: 10}), counts({(5, 4): 100}), special)   # x~ special
    assert d.verdicts[0].rule == RULE_SPECIAL and d.observed == ()


def test_rescues_on_arrays_is_the_same_rule():
    count = np.array([6, 5, np.nan, 7, 9])
    gap = np.array([-1.0, -1.0, -1.0, -9.0, np.nan])
    assert rescues(count, gap, 6, LOG_TAU).tolist() == [True, False, False, False, False]
    for c, g, want in zip(count, gap, [True, False, False, False, False]):
        assert rescues(None if np.isnan(c) else int(c), None if np.isnan(g) else float(g), 6, LOG_TAU) is want
    grid = rescues(count[None, None, :], gap[None, None, :], np.array([0, 6, 8])[:, None, None],
                   np.array([LOG_TAU, 0.0])[None, :, None])                   # (lam, tau, event)
    assert grid.shape == (3, 2, 5) and grid[1, 0].tolist() == [True, False, False, False, False]
    assert not grid[:, 1].any() and grid[0, 0].tolist() == [True, True, False, False, False]
    assert not rescues(count, gap, 6, LOG_TAU, use_ocm=False, use_scg=False).any()
