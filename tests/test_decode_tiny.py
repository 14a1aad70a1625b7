"""Decode-loop properties on tiny random models: KV caches after rollbacks, and the output
distribution of sampled SD (which must equal the target's)."""
import copy
from collections import Counter

import pytest
import torch

from csd.config import CSDConfig
from csd.costs import CostModel
from csd.decode import Decoder
from csd.events import CORRECTED, REJECTED

PROMPT = [3, 7, 1, 4]


def fresh_last_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def cached_next_logits(model, cache, ids):
    """Feed what the cache lacks to a copy of the cache; logits of the last position."""
    cache = copy.deepcopy(cache)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids[cache.get_seq_length():]]), cache=cache, use_cache=True)
        return out.logits[0, -1].float()


@pytest.mark.parametrize("method", ["sd", "csd"])
def test_kv_caches_match_a_fresh_pass_after_rejections(tiny_pair, one_thread, method):
    run = Decoder(tiny_pair).run(PROMPT, CSDConfig(method=method, gamma=4, max_new_tokens=60))
    checked = 0
    for ev in run:
        if ev.status != CORRECTED:
            continue
        seq = PROMPT + [e.token_id for e in run.events if e.in_output]  # ev included
        tcache, dcache = run.caches
        assert tcache.get_seq_length() == len(seq) - 1  # rolled back to the kept prefix
        assert dcache.get_seq_length() <= len(seq) - 1
        for model, cache in ((tiny_pair.target, tcache), (tiny_pair.draft, dcache)):
            torch.testing.assert_close(cached_next_logits(model, cache, seq), fresh_last_logits(model, seq),
                                       rtol=1e-4, atol=1e-4)
        checked += 1
    assert sum(e.status == REJECTED for e in run.events) == checked
    assert checked >= 5, "the tiny pair should disagree often enough to exercise rollbacks"


def exact_two_token_distribution(model, prompt, temp):
    """P(first two new tokens) under the target at temperature temp, by enumeration."""
    with torch.inference_mode():
        p1 = torch.softmax(fresh_last_logits(model, prompt) / temp, -1)
        out = {}
        for a in range(p1.numel()):
            if p1[a] < 1e-6:
                continue
            p2 = torch.softmax(fresh_last_logits(model, prompt + [a]) / temp, -1)
            for b in range(p2.numel()):
                out[(a, b)] = float(p1[a] * p2[b])
    return out


def sample_pairs(tiny_pair, method, n, temp, prompt=PROMPT, lookup=0, runs=None):
    dec = Decoder(tiny_pair)
    g = torch.Generator().manual_seed(1234)
    seeds = torch.randint(0, 2 ** 31, (n,), generator=g).tolist()
    c = Counter()
    for s in seeds:
        run = dec.run(prompt, CSDConfig(method=method, gamma=3, temperature=temp, max_new_tokens=2, seed=s,
                                        lookup=lookup))
        list(run)
        c[tuple(run.token_ids[:2])] += 1
        if runs is not None:
            runs.append(run)
    return c


def total_variation(counts: Counter, probs: dict) -> float:
    n = sum(counts.values())
    keys = set(counts) | set(probs)
    return 0.5 * sum(abs(counts.get(k, 0) / n - probs.get(k, 0.0)) for k in keys)


def marginal(joint: dict, i: int) -> dict:
    out = {}
    for k, v in joint.items():
        out[k[i]] = out.get(k[i], 0) + v
    return out


def test_sampled_sd_matches_target_distribution(tiny_pair, one_thread):
    """Two-token sequences from SD at temperature 1 vs the target's exact joint distribution.
    Tolerance: total variation < 0.06 on the joint and < 0.04 on each position's marginal,
    with N = 2000 draws (fixed seed). The draft's own distribution is far from the target's
    (TV > 0.3), so a verifier that leaked the draft's distribution would fail."""
    temp, n = 1.0, 2000
    exact_t = exact_two_token_distribution(tiny_pair.target, PROMPT, temp)
    exact_d = exact_two_token_distribution(tiny_pair.draft, PROMPT, temp)
    assert 0.5 * sum(abs(exact_t.get(k, 0) - exact_d.get(k, 0)) for k in set(exact_t) | set(exact_d)) > 0.3
    sd = sample_pairs(tiny_pair, "sd", n, temp)
    tv = total_variation(sd, exact_t)
    assert tv < 0.06, f"SD's samples are {tv:.3f} away from the target's joint distribution"
    for i in (0, 1):
        tv_i = total_variation(Counter(marginal(sd, i)), marginal(exact_t, i))
        assert tv_i < 0.04, f"position {i}: SD's samples are {tv_i:.3f} away from the target's marginal"
    # the test can fail: the draft's own samples are rejected by the same tolerance
    assert total_variation(Counter({k: round(v * n) for k, v in exact_d.items()}), exact_t) > 0.06


def test_sampled_runs_are_reproducible_with_a_seed(tiny_pair, one_thread):
    dec = Decoder(tiny_pair)
    a = dec.run(PROMPT, CSDConfig(method="sd", temperature=0.8, seed=7, max_new_tokens=20))
    b = dec.run(PROMPT, CSDConfig(method="sd", temperature=0.8, seed=7, max_new_tokens=20))
    list(a), list(b)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20


def test_sampled_copies_keep_the_target_distribution(tiny_pair, one_thread):
    """Copies from the context while sampling: the prompt ends with a 3-gram seen before, so every
    run's first pass verifies the copied token that followed it (a point-mass proposal). Kept with
    probability p(x), replaced by a draw from p without x otherwise: the two new tokens must still
    follow the target's joint distribution. Accepting copies outright would put the copied token's
    mass near 1 at the first position, which the marginal check rejects."""
    prompt, copied, temp, n = [10, 4, 6, 15, 10, 4, 6], 15, 1.0, 2000   # p(copy) = 0.29 under the tiny target
    exact = exact_two_token_distribution(tiny_pair.target, prompt, temp)
    first = marginal(exact, 0)
    assert 0.05 < first.get(copied, 0.0) < 0.6, "the copied token should be neither rare nor certain"
    runs = []
    got = sample_pairs(tiny_pair, "sd", n, temp, prompt=prompt, lookup=8, runs=runs)
    assert all(r.metrics.lookup_blocks >= 1 for r in runs), "every run should start with a copy"
    kept = sum(r.metrics.lookup_kept for r in runs) / n
    assert abs(kept - first[copied]) < 0.04, f"copies kept {kept:.3f} of the time, p(copy) = {first[copied]:.3f}"
    # this joint is flatter than the other test's: 2,000 exact draws are 0.044 away from it on average
    # (0.055 at most in 20 tries), so the joint's tolerance is 0.07; a verifier that drew the
    # replacement from p instead of p without the copy would move the first marginal by 0.2
    assert total_variation(got, exact) < 0.07
    for i in (0, 1):
        assert total_variation(Counter(marginal(got, i)), marginal(exact, i)) < 0.04


def test_calibration_answers_stop_at_the_context(tiny_pair):
    """Calibration answers with the engine's AR runs: an answer stops at the model's context (256 here), a
    prompt that fills it gets none, and the rest are the target's greedy tokens."""
    from csd.calibration.calibrate import answer_prompts
    full, near, short = [1] * 256, [2] * 253, [3, 4, 5]
    answers = answer_prompts(tiny_pair, [full, near, short], 6)
    assert answers[0] == [] and len(answers[1]) == 3 and len(answers[2]) == 6
    run = Decoder(tiny_pair).run(short, CSDConfig(method="ar", max_new_tokens=6))
    list(run)
    assert answers[2] == run.token_ids


def greedy_tokens(run) -> list[int]:
    return [e.token_id for e in run if e.in_output]


def test_a_draft_that_never_drafts_never_reads_the_prompt(tiny_pair, one_thread):
    """Gamma auto on costs where drafting never pays: the host's draft leaves the prompt unread (it would read it
    when it first drafts), the run does no draft step at all, and its answer is AR's."""
    dear = CostModel({k: 10.0 * k for k in range(1, 18)}, draft_ms=1e6)
    prompt = PROMPT * 6
    run = Decoder(tiny_pair, costs=dear, online_costs=False).run(
        prompt, CSDConfig(method="sd", gamma="auto", max_new_tokens=24))
    tokens = greedy_tokens(run)
    assert run.caches[1].get_seq_length() == 0
    assert run.metrics.draft_forwards == 0
    ar = Decoder(tiny_pair).run(prompt, CSDConfig(method="ar", max_new_tokens=24))
    assert tokens == greedy_tokens(ar)


def test_a_run_with_few_tokens_left_does_not_read_a_long_prompt_into_the_draft(tiny_pair, one_thread):
    """Gamma auto where a drafted token pays for itself but the draft's first reading of the prompt (24 rows,
    paid once) does not pay over 3 tokens: the run never drafts and its draft never reads the prompt; over 60
    tokens the same reading is worth it and the run drafts."""
    costs = CostModel({**{k: 10.0 for k in range(1, 9)}, 16: 80.0, 33: 250.0}, draft_ms=2.0)
    prompt = PROMPT * 6
    short = Decoder(tiny_pair, costs=costs, online_costs=False).run(
        prompt, CSDConfig(method="sd", gamma="auto", max_new_tokens=3))
    tokens = greedy_tokens(short)
    assert short.metrics.draft_forwards == 0 and short.caches[1].get_seq_length() == 0
    ar = Decoder(tiny_pair).run(prompt, CSDConfig(method="ar", max_new_tokens=3))
    assert tokens == greedy_tokens(ar)
    long = Decoder(tiny_pair, costs=costs, online_costs=False).run(
        prompt, CSDConfig(method="sd", gamma="auto", max_new_tokens=60))
    greedy_tokens(long)
    assert long.metrics.draft_forwards > 0 and long.caches[1].get_seq_length() >= len(prompt) - 1


@pytest.mark.parametrize("method", ["sd", "csd"])
def test_a_draft_reads_the_prompt_when_it_first_drafts(tiny_pair, one_thread, method):
    """Gamma auto on costs where drafting pays: the draft reads the prompt before its first step, its cache then
    gives what a fresh pass gives after every rejection, and greedy SD writes AR's answer."""
    cheap = CostModel({k: 10.0 for k in range(1, 18)}, draft_ms=0.01)
    prompt = PROMPT * 6
    run = Decoder(tiny_pair, costs=cheap, online_costs=False).run(
        prompt, CSDConfig(method=method, gamma="auto", max_new_tokens=40))
    checked = 0
    for ev in run:
        if ev.status != CORRECTED:
            continue
        seq = prompt + [e.token_id for e in run.events if e.in_output]
        dcache = run.caches[1]
        assert len(prompt) - 1 <= dcache.get_seq_length() <= len(seq) - 1
        torch.testing.assert_close(cached_next_logits(tiny_pair.draft, dcache, seq),
                                   fresh_last_logits(tiny_pair.draft, seq), rtol=1e-4, atol=1e-4)
        checked += 1
    assert run.metrics.draft_forwards > 0 and checked >= 3
    assert run.metrics.prefill_s > 0
    if method == "sd":
        ar = Decoder(tiny_pair).run(prompt, CSDConfig(method="ar", max_new_tokens=40))
        assert [e.token_id for e in run.events if e.in_output] == greedy_tokens(ar)


def test_a_step_that_reads_copied_tokens_is_kept_apart_from_the_draft_steps(tiny_pair, one_thread):
    """The host's draft, 12 tokens behind the sequence (copies from the context came since it last drafted): its
    first step reads them all, and that pass goes to the block's catch-up, not to its timed 1-token steps."""
    from csd.block import Block
    from csd.events import RunMetrics
    from csd.policy import FixedGamma
    from csd.propose import HostDraft
    lm = tiny_pair.draft_lm
    cache = lm.new_cache()
    seq = PROMPT * 4
    lm.forward(cache, seq[:4], 1)
    block = Block(1, start=len(seq))
    HostDraft(lm, cache, FixedGamma(3), RunMetrics(), frozenset()).propose(block, seq, 10)
    assert block.size == 3 and block.draft_steps == 2
    assert block.catch_up_s > 0 and block.draft_s > 0
    assert lm.length(cache) == len(seq) + 2
