"""The decode loop on tiny in-process models whose draft is a (perturbed) copy of the target, so
that drafts are accepted often: partial acceptance, full blocks with a bonus, an end token inside
a block, sampling with rescue on, special tokens, sliding-window caches, the lean draft path, the
block-length policy and cancellation. Fast and deterministic; no files."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from conftest import make_pair, perturbed, tiny_model
from csd.config import CSDConfig
from csd.costs import CostModel
from csd.decode import Decoder, prefill_spans
from csd.events import ACCEPTED, BONUS, CORRECTED, REJECTED, RESCUED, RULE_SPECIAL, STOP_CANCELLED, STOP_EOS, STOP_MAX
from csd.memory import CorrectionMemory
from csd.policy import AutoGamma, FixedGamma
from csd.runtime.lm import HFLM, LeanLM

PROMPT = [3, 7, 1, 4]
V = 32


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def target():
    return tiny_model(2)


@pytest.fixture(scope="module")
def close_pair(qwen_tokenizer, target):
    return make_pair(qwen_tokenizer, target, perturbed(target, 0.05))


def run_all(pair, cfg, memory=None, **kw):
    """A whole run; where the test states the costs, the policy plans with them alone (not the run's)."""
    costs = kw.pop("costs", None)
    decoder = Decoder(pair, costs=costs, online_costs=kw.pop("online_costs", costs is None))
    run = decoder.run(PROMPT, cfg, memory or CorrectionMemory(pair.pair_id), **kw)
    list(run)
    return run


def ar_ids(pair, n):
    return run_all(pair, CSDConfig(method="ar", max_new_tokens=n)).token_ids


def test_partial_acceptance_and_bonus_keep_sd_equal_to_ar(close_pair):
    run = run_all(close_pair, CSDConfig(method="sd", gamma=4, max_new_tokens=60))
    assert run.token_ids == ar_ids(close_pair, 60)
    by_block = {}
    for e in run.events:
        by_block.setdefault(e.block, []).append(e)
    partial = [b for b in by_block.values() if b[-1].status == CORRECTED and any(e.status == ACCEPTED for e in b)]
    full = [b for b in by_block.values() if b[-1].status == BONUS and len(b) == 5]
    assert partial, "some block should keep a few draft tokens and then reject one"
    assert full, "some block should keep all four draft tokens and earn the bonus"
    for b in by_block.values():          # one target pass per block, the pass's last event says so
        assert [e.pass_end for e in b] == [False] * (len(b) - 1) + [True]
        assert len({e.block_len for e in b}) == 1 and b[0].block_len <= 4
    assert all(b[0].block_len == 4 for b in list(by_block.values())[:-2])    # shorter only near max_new_tokens
    rej = [e for e in run.events if e.status == REJECTED]
    for e in rej:                        # the rest of the block is reported as discarded, unverified
        assert e.discarded is not None and len(e.discarded) == 4 - 1 - e.index_in_block
    m = run.metrics
    assert m.target_forwards == len(by_block)
    assert m.new_tokens == m.accepted + m.rescued + m.target_forwards
    assert m.divergences == len(rej)


def test_caches_match_a_fresh_pass_after_partial_acceptance(close_pair):
    run = Decoder(close_pair).run(PROMPT, CSDConfig(method="sd", gamma=4, max_new_tokens=40),
                                  CorrectionMemory(close_pair.pair_id))
    checked = 0
    for ev in run:
        if ev.status != CORRECTED:
            continue
        seq = PROMPT + [e.token_id for e in run.events if e.in_output]
        tcache, dcache = run.caches
        assert tcache.get_seq_length() == len(seq) - 1
        with torch.inference_mode():
            fresh = close_pair.target(input_ids=torch.tensor([seq])).logits[0, -1]
            c = copy.deepcopy(tcache)
            cached = close_pair.target(input_ids=torch.tensor([seq[c.get_seq_length():]]), cache=c,
                                       use_cache=True).logits[0, -1]
        torch.testing.assert_close(cached, fresh, rtol=1e-4, atol=1e-4)
        checked += 1
    assert checked >= 2


def test_end_token_inside_a_block_stops_there(qwen_tokenizer, target):
    # the draft is an exact copy: it proposes what the target will say, the end token included
    ref = ar_ids(make_pair(qwen_tokenizer, target, copy.deepcopy(target)), 12)
    eos = ref[3]
    pair = make_pair(qwen_tokenizer, target, copy.deepcopy(target), eos=(eos,))
    cut = ref.index(eos) + 1
    for method in ("sd", "csd"):
        run = run_all(pair, CSDConfig(method=method, gamma=6, max_new_tokens=40))
        assert run.token_ids == ref[:cut] and run.metrics.stopped_by == STOP_EOS
        last = run.events[-1]
        assert last.token_id == eos and last.status == ACCEPTED and last.pass_end and last.special
        assert last.index_in_block < 5, "the end token was accepted inside the block, not as its bonus"
        assert run.metrics.new_tokens == cut and run.metrics.divergences == 0


class AlwaysProposes(HFLM):
    """A draft that always proposes one token (here the end token)."""

    def __init__(self, model, token):
        super().__init__(model)
        self.token = token

    def forward(self, cache, ids, keep):
        logits = super().forward(cache, ids, keep)
        logits[:, self.token] = 1e4
        return logits


def test_special_tokens_are_never_rescued_nor_counted(qwen_tokenizer, target):
    eos = 5
    pair = make_pair(qwen_tokenizer, target, copy.deepcopy(target), eos=(eos,),
                     draft_lm=AlwaysProposes(copy.deepcopy(target), eos))
    memory = CorrectionMemory(pair.pair_id, {(eos, t): 100 for t in range(V)} | {(t, eos): 100 for t in range(V)})
    before = dict(memory.items())
    run = run_all(pair, CSDConfig(method="csd", gamma=4, lam=1, tau=1.0, max_new_tokens=20), memory)
    specials = [e for e in run.events if e.draft_id == eos and e.target_id != eos]
    assert specials, "the draft proposed the end token where the target wanted another"
    for e in specials:
        assert e.status == REJECTED and e.rule == RULE_SPECIAL and e.memory_count is None
    assert not any(e.status == RESCUED for e in run.events)
    assert dict(memory.items()) == before          # nothing about the end token was learned
    assert run.metrics.divergences == len(specials)
    # the scg-only ablation (no memory) refuses them too
    run = run_all(pair, CSDConfig(method="scg-only", gamma=4, tau=1e-9, max_new_tokens=8))
    assert all(e.rule == RULE_SPECIAL for e in run.events if e.status == REJECTED)


def test_sampling_with_rescue_meets_both_thresholds_and_is_reproducible(close_pair):
    memory = CorrectionMemory(close_pair.pair_id, {(a, b): 10 for a in range(V) for b in range(V) if a != b})
    cfg = CSDConfig(method="csd", gamma=4, lam=6, tau=0.05, temperature=1.0, seed=11, max_new_tokens=60)
    a = run_all(close_pair, cfg, memory.copy())
    b = run_all(close_pair, cfg, memory.copy())
    assert a.token_ids == b.token_ids and len(a.token_ids) == 60
    rescued = [e for e in a.events if e.status == RESCUED]
    assert rescued, "sampling rejections with known patterns and a lenient gate should be rescued"
    for e in rescued:
        assert e.memory_count >= 6 and e.gap >= math.log(0.05) and e.token_id == e.draft_id != e.target_id


def test_unseeded_sampling_leaves_the_global_generator_alone(close_pair):
    state = torch.random.get_rng_state()
    run_all(close_pair, CSDConfig(method="sd", temperature=0.8, max_new_tokens=8))
    assert torch.equal(state, torch.random.get_rng_state())


def test_sliding_window_models_roll_back(qwen_tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(4)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                      use_sliding_window=True, sliding_window=6, max_window_layers=0)
    t = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        t.lm_head.weight.mul_(40.0)
    assert "sliding_attention" in t.config.layer_types
    pair = make_pair(qwen_tokenizer, t, perturbed(t, 0.05))
    sd = run_all(pair, CSDConfig(method="sd", gamma=4, max_new_tokens=40))   # far past the window
    assert sd.token_ids == ar_ids(pair, 40)
    assert any(e.status == REJECTED for e in sd.events), "the test needs rollbacks past the window"


def test_lean_draft_is_the_same_function(close_pair, qwen_tokenizer, target):
    draft = close_pair.draft
    hf, lean = HFLM(draft), LeanLM(draft)
    with torch.inference_mode():
        c1, c2 = hf.new_cache(), lean.new_cache(capacity=4)          # the lean cache grows as it goes
        torch.testing.assert_close(lean.forward(c2, PROMPT, 4), hf.forward(c1, PROMPT, 4), rtol=1e-5, atol=1e-5)
        for tok in (9, 2, 11):
            torch.testing.assert_close(lean.forward(c2, [tok], 1), hf.forward(c1, [tok], 1), rtol=1e-5, atol=1e-5)
        hf.crop(c1, 5)
        lean.crop(c2, 5)
        torch.testing.assert_close(lean.forward(c2, [8, 9], 2), hf.forward(c1, [8, 9], 2), rtol=1e-5, atol=1e-5)
    # a reduced vocabulary: logit row i is token vocab_ids[i]
    ids = torch.tensor([0, 3, 5, 8, 13, 21, 30])
    small = LeanLM(draft, vocab_ids=ids)
    with torch.inference_mode():
        full = hf.forward(hf.new_cache(), PROMPT, 1)
        torch.testing.assert_close(small.forward(small.new_cache(), PROMPT, 1), full[:, ids], rtol=1e-5, atol=1e-5)
    # SD with the lean draft (full or reduced vocabulary) still equals AR
    ref = ar_ids(close_pair, 30)
    for lm in (LeanLM(draft), LeanLM(draft, vocab_ids=ids)):
        pair = make_pair(qwen_tokenizer, target, draft, draft_lm=lm)
        assert run_all(pair, CSDConfig(method="sd", gamma=4, max_new_tokens=30)).token_ids == ref


def costs(verify, draft_ms):
    return CostModel({k: verify(k) for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, draft_ms)


def test_auto_gamma_follows_the_costs_and_keeps_sd_exact(close_pair):
    ref = ar_ids(close_pair, 60)
    cheap = costs(lambda k: 100.0 + k, 5.0)               # verifying more is nearly free, drafting is cheap
    dear = costs(lambda k: 100.0 * k, 80.0)                # every token in the pass costs a full pass
    long_run = run_all(close_pair, CSDConfig(method="sd", gamma="auto", gamma_max=12, max_new_tokens=60), costs=cheap)
    short_run = run_all(close_pair, CSDConfig(method="sd", gamma="auto", gamma_max=12, max_new_tokens=60), costs=dear)
    assert long_run.token_ids == ref == short_run.token_ids          # the policy changes the speed, not the output
    assert long_run.metrics.mean_block_len > 4 > short_run.metrics.mean_block_len
    assert 0 < long_run.metrics.policy_s < long_run.metrics.wall_s
    for run in (long_run, short_run):
        lens = [e.block_len for e in run.events if e.pass_end]
        assert all(0 <= n <= 12 for n in lens)


def test_auto_gamma_policy_arithmetic():
    p = AutoGamma(costs(lambda k: 100.0 + k, 5.0), max_len=8)
    p.start()
    assert p.more(0, 1.0) and p.more(3, 0.95)               # confident and cheap: go on
    p = AutoGamma(costs(lambda k: 100.0 + k, 5.0), max_len=8)
    for _ in range(50):                                      # a run where unsure drafts were always rejected
        p.learn([0.15, 0.15], [False, False])
    p.start()
    assert not p.more(1, 0.15)                               # an unsure draft ends the block
    assert not p.more(8, 1.0)                                # never past max_len
    assert FixedGamma(6).more(5, 0.0) and not FixedGamma(6).more(6, 1.0)
    assert [FixedGamma(6).plan(r) for r in (100, 3, -1)] == [6, 3, 0]     # the device loop's block: within room


def test_stop_during_prefill_and_between_draft_and_verify(close_pair):
    dec = Decoder(close_pair)
    run = dec.run(list(range(1, 31)) * 7, CSDConfig(method="sd", max_new_tokens=20), should_stop=lambda: True)
    assert list(run) == [] and run.metrics.stopped_by == STOP_CANCELLED and run.token_ids == []
    calls = {"n": 0}
    prefill_checks = 2 * len(prefill_spans(len(PROMPT) - 1))      # one per prefill pass of each model

    def stop_later():
        calls["n"] += 1
        return calls["n"] > prefill_checks + 2    # prefill, block 1 (before, between), block 2 (before): stop

    run = dec.run(PROMPT, CSDConfig(method="sd", gamma=4, max_new_tokens=40), should_stop=stop_later)
    events = list(run)
    assert run.metrics.stopped_by == STOP_CANCELLED and run.metrics.target_forwards == 1
    assert events and events[-1].pass_end and run.token_ids == [e.token_id for e in events if e.in_output]
    run = dec.run(PROMPT, CSDConfig(method="sd", gamma=4, max_new_tokens=10))
    list(run)
    assert run.metrics.stopped_by == STOP_MAX


def test_default_memory_is_the_pairs(close_pair):
    run = Decoder(close_pair).run(PROMPT, CSDConfig(method="csd", max_new_tokens=4))
    assert isinstance(run.memory, CorrectionMemory) and run.memory.pair_id == close_pair.pair_id


def test_text_of_byte_fallback_tokens_joins_into_characters(qwen_tokenizer):
    from csd.text import Detokenizer
    text = "Hi 🦜 naïve 漢字!"
    ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    d = Detokenizer(qwen_tokenizer)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) == qwen_tokenizer.decode(ids) == text
    assert "" in pieces and not any("\ufffd" in p for p in pieces)   # a split character waits for its bytes


def test_greedy_fixed_block_makes_one_host_transfer_per_block(close_pair):
    run = run_all(close_pair, CSDConfig(method="csd", gamma=4, max_new_tokens=40))
    m = run.metrics
    assert m.host_syncs == m.target_forwards and run.token_ids == ar_ids(close_pair, 40)
    # the policy needs each draft token's confidence on the host: one more transfer per draft token
    auto = run_all(close_pair, CSDConfig(method="sd", gamma="auto", max_new_tokens=40),
                   costs=costs(lambda k: 100.0 + k, 5.0))
    assert auto.metrics.host_syncs == auto.metrics.target_forwards + auto.metrics.draft_forwards


def test_gamma_auto_without_confidences_makes_one_host_transfer_per_block(close_pair, monkeypatch):
    """On a GPU (``SYNC_FREE_AUTO_DEVICES``) gamma auto plans each block from its position keep rates
    and drafts on the device: one host transfer per block, and greedy SD still equals AR. The CPU is
    added to the list here so that the path runs in CI."""
    import csd.decode
    monkeypatch.setattr(csd.decode, "SYNC_FREE_AUTO_DEVICES", ("cpu",))
    cheap, dear = costs(lambda k: 100.0 + k, 5.0), costs(lambda k: 100.0 * k, 80.0)
    long_run = run_all(close_pair, CSDConfig(method="sd", gamma="auto", gamma_max=12, max_new_tokens=40), costs=cheap)
    m = long_run.metrics
    assert m.host_syncs == m.target_forwards and long_run.token_ids == ar_ids(close_pair, 40)
    assert m.mean_block_len > 4                                  # cheap verify passes: long planned blocks
    short_run = run_all(close_pair, CSDConfig(method="csd", gamma="auto", max_new_tokens=40), costs=dear)
    assert short_run.metrics.draft_forwards == 0 and short_run.metrics.host_syncs == short_run.metrics.target_forwards


def test_auto_gamma_plans_from_position_rates():
    p = AutoGamma(costs(lambda k: 100.0 + k, 5.0), max_len=8)
    assert 1 < p.plan(room=100) <= 8                           # cheap drafting, the prior's keep rate
    for _ in range(50):                                        # every position kept so far
        p.learn([], [True] * 8)
    assert p.plan(room=100) == 8 and p.plan(room=3) == 3       # as long as allowed
    p = AutoGamma(costs(lambda k: 100.0 + k, 5.0), max_len=8)
    for _ in range(200):                                       # a run whose second position is always rejected
        p.learn([], [True, False])
    assert p.plan(room=100) == 1
    assert AutoGamma(costs(lambda k: 100.0 * k, 80.0), max_len=8).plan(room=100) == 0    # drafting never pays
    p.learn([0.9], [True])                                  # with a confidence: its bin learns too
    assert p._n[9] == 1 and sum(p._n) == 1


def test_profile_noise_cannot_make_a_short_pass_dearer_than_a_long_one():
    from csd.costs import monotone
    noisy = {1: 364.0, 2: 431.0, 3: 416.0, 4: 136.0, 5: 104.0, 6: 117.0, 7: 169.0}   # measured beside a test run
    clean = monotone(noisy)
    assert list(clean) == sorted(noisy)
    assert all(clean[a] <= clean[b] for a, b in zip(list(clean), list(clean)[1:]))
    assert clean[7] == 169.0 and clean[6] == 117.0 and clean[1] == 104.0      # only slowed values move
    assert all(clean[k] <= noisy[k] for k in noisy)


def test_expected_speedup_spans_one_token_per_block_to_the_bound():
    c = costs(lambda k: 100.0 + 3 * k, 20.0)
    for g in (1, 3, 6, 11):
        assert c.expected(g, 1.0) == pytest.approx(c.bound(g))                     # all kept: the bound
        assert c.expected(g, 0.0) == pytest.approx(c.verify(1) / c.block_ms(g))    # one token per block
        xs = [c.expected(g, a) for a in (0.0, 0.3, 0.6, 0.8, 0.95, 1.0)]
        assert xs == sorted(xs)
    # sampling the block outcome gives the same mean as the closed form
    import random
    rng, a, g = random.Random(0), 0.8, 5
    blocks = [next((i for i in range(g) if rng.random() >= a), g) + 1 for _ in range(40_000)]
    assert sum(blocks) / len(blocks) / c.block_ms(g) * c.verify(1) == pytest.approx(c.expected(g, a), rel=0.02)
    g_best, x_best = c.best_expected(0.8)
    assert x_best <= c.best_bound()[1] and x_best == max(c.expected(g, 0.8) for g in range(1, 33))


def test_the_loop_times_each_block_and_gamma_auto_plans_with_those_costs(close_pair):
    """On the CPU each verified block carries its draft and verify times, and gamma auto (online, the
    decoder's default) moves its costs towards them: the tiny models take about a millisecond a pass,
    not the 100 ms the stated profile says. The output is AR's either way."""
    stated = costs(lambda k: 100.0 + k, 5.0)
    run = run_all(close_pair, CSDConfig(method="sd", gamma="auto", gamma_max=8, max_new_tokens=40), costs=stated,
                  online_costs=True)
    assert run.token_ids == ar_ids(close_pair, 40)
    assert run.policy.verify_scale < 1.0 and run.policy.draft_ms < 5.0     # moved below the stated costs
    fixed = run_all(close_pair, CSDConfig(method="sd", gamma="auto", gamma_max=8, max_new_tokens=40), costs=stated)
    assert fixed.policy.verify_scale == 1.0 and fixed.policy.draft_ms == 5.0      # stated costs alone
