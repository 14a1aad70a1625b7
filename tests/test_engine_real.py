"""The engine on the real embedded Qwen2.5-Coder 0.5B/1.5B pair, in float32."""
import pytest
import torch

from csd.config import CSDConfig
from csd.decode import Decoder
from csd.events import CORRECTED, REJECTED, RESCUED, RULE_SPECIAL
from csd.memory import CorrectionMemory

PROMPTS = {
    "prose": "In two sentences, explain why the sky looks blue.",
    "code": "Write a Python function that checks whether a number is prime.",
    "math": "A shop sells pencils at 3 for 1 dollar. How many dollars do 27 pencils cost? Answer briefly.",
}
STORY = "Write a long story about a lighthouse keeper and his cat."  # prose that runs past N tokens
N = 40
# the answers the equivalence tests compare: each float32 token costs a target pass in AR and another
# in transformers' generate (0.6 s each on a CPU without AVX-512), and 24 tokens of each prompt give
# speculation blocks to accept and reject
N_EQ = 24


@pytest.fixture(scope="module")
def decoder(real_pair):
    return Decoder(real_pair)


@pytest.fixture(scope="module")
def sd_run(real_pair, decoder):
    """Greedy SD's finished run on a prompt of PROMPTS (N_EQ new tokens), made once per prompt: the
    equivalence test and the unreachable-lambda test check the same run."""
    runs = {}

    def get(kind: str):
        if kind not in runs:
            run = decoder.run(real_pair.encode_prompt(PROMPTS[kind]), CSDConfig(method="sd", max_new_tokens=N_EQ))
            list(run)
            runs[kind] = run
        return runs[kind]
    return get


@pytest.mark.parametrize("kind", PROMPTS)
def test_greedy_sd_equals_ar_equals_transformers_generate(real_pair, decoder, sd_run, kind):
    ids = real_pair.encode_prompt(PROMPTS[kind])
    ar = decoder.run(ids, CSDConfig(method="ar", max_new_tokens=N_EQ))
    list(ar)
    sd = sd_run(kind)
    with torch.inference_mode():
        hf = real_pair.target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_EQ,
                                       eos_token_id=list(real_pair.eos_ids), pad_token_id=real_pair.eos_ids[0])
    hf_ids = hf[0, len(ids):].tolist()
    assert ar.token_ids == hf_ids
    assert sd.token_ids == hf_ids
    assert ar.metrics.target_forwards == len(ar.token_ids)
    assert sd.metrics.target_forwards < len(sd.token_ids)  # speculation saved target passes
    assert sd.metrics.rescued == 0


def test_csd_with_unreachable_lambda_is_sd(real_pair, decoder, sd_run):
    ids = real_pair.encode_prompt(PROMPTS["prose"])
    sd = sd_run("prose")
    memory = CorrectionMemory(real_pair.pair_id)
    csd = decoder.run(ids, CSDConfig(method="csd", lam=10 ** 9, max_new_tokens=N_EQ), memory)
    list(csd)
    assert csd.token_ids == sd.token_ids
    assert csd.metrics.rescued == 0 and csd.metrics.target_forwards == sd.metrics.target_forwards
    # every divergence was still counted online, except those with a special token (never counted)
    assert memory.total == sum(e.status == REJECTED and e.rule != RULE_SPECIAL for e in csd.events) > 0


def test_csd_rescues_exactly_where_memory_and_gate_allow(real_pair, decoder):
    """What the method guarantees on one prompt, whatever CPU computes the draft: with every
    pattern SD stumbled on seeded at count lambda, CSD follows SD's tokens up to SD's first
    divergence and rescues it there if (and only if) the gate passes; every rescue meets both
    thresholds and keeps the draft token. Whether CSD then needs fewer target passes is not
    guaranteed on one prompt (a rescue changes the context of all that follows): the benchmark
    measures that over many items."""
    lam, tau = 6, 0.01
    log_tau = CSDConfig(tau=tau).log_tau
    ids = real_pair.encode_prompt(STORY)
    sd = decoder.run(ids, CSDConfig(method="sd", max_new_tokens=N))
    list(sd)
    rejected = [e for e in sd.events if e.status == REJECTED]
    assert rejected, "40 tokens of a story give the draft and the target something to disagree on"
    first = rejected[0]
    counts = {(e.draft_id, e.target_id): lam for e in rejected}
    memory = CorrectionMemory(real_pair.pair_id, counts)
    csd = decoder.run(ids, CSDConfig(method="csd", lam=lam, tau=tau, max_new_tokens=N), memory)
    list(csd)

    # identical up to SD's first divergence, then decided by the rule on the same logits
    n_same = first.position
    assert csd.token_ids[:n_same] == sd.token_ids[:n_same]
    at = next(e for e in csd.events if e.position == first.position and e.draft_id is not None
              and e.status in (RESCUED, REJECTED))
    assert (at.draft_id, at.target_id) == (first.draft_id, first.target_id)
    assert at.memory_count >= lam
    assert at.gap == pytest.approx(first.gap, abs=1e-4)
    assert at.status == (RESCUED if first.gap >= log_tau else REJECTED)

    rescued = [e for e in csd.events if e.status == RESCUED]
    assert csd.metrics.rescued == len(rescued)
    for e in rescued:  # each rescue satisfied both thresholds and kept the draft token
        assert e.memory_count >= lam and e.gap >= log_tau and e.token_id == e.draft_id != e.target_id
    for e in csd.events:  # and every refusal names the threshold it failed
        if e.status == REJECTED:
            assert e.memory_count < lam or e.gap < log_tau
    # the memory learned every divergence of the run, after its own decision
    assert memory.total == sum(counts.values()) + sum(e.is_divergence for e in csd.events)


def test_events_are_complete_and_consistent(real_pair, decoder):
    ids = real_pair.encode_prompt(PROMPTS["code"])
    run = decoder.run(ids, CSDConfig(method="csd", max_new_tokens=24, explain=True),
                      CorrectionMemory(real_pair.pair_id))
    evs = list(run)
    out = [e for e in evs if e.in_output]
    assert [e.token_id for e in out] == run.token_ids
    assert [e.position for e in out] == list(range(len(out)))
    assert "".join(e.text for e in out) == real_pair.tokenizer.decode(run.token_ids)
    for e in evs:
        assert e.target_top and len(e.target_top) == 5
        if e.draft_id is not None:
            assert e.draft_top and e.gap == pytest.approx(e.draft_logit - e.target_logit)
            assert e.target_top[0][0] == e.target_text      # t* is the top of the target's distribution
        if e.status == CORRECTED:
            assert e.token_id == e.target_id
    m = run.metrics
    assert m.new_tokens == len(run.token_ids) == 24
    assert m.target_forwards == len({e.block for e in evs})
    assert 0 < m.mean_accepted_length <= CSDConfig().gamma + 1
    assert m.bookkeeping_s < m.wall_s
    assert len(m.per_position_acceptance) == CSDConfig().gamma


def test_cancelled_run_keeps_what_it_made(real_pair, decoder):
    run = decoder.run(real_pair.encode_prompt(PROMPTS["code"]), CSDConfig(method="sd", max_new_tokens=64))
    for i, _ in enumerate(run):
        if i == 5:
            break
    run.close()
    assert run.metrics.stopped_by == "cancelled"
    assert 0 < len(run.token_ids) < 64
    assert run.token_ids == [e.token_id for e in run.events if e.in_output]


def test_calibration_reads_with_the_models_that_decode(real_pair):
    """Both calibration modes count with the pair's own models (the draft's lean path and reduced vocabulary),
    never building a second, transformers copy of the draft (before: 12-13 GB resident and about two minutes
    for the embedded pair, where the models decode in 2.5 GB)."""
    from dataclasses import replace

    from csd.calibration.calibrate import calibrate, calibrate_prompts, draft_predictions
    # the session's pair as it loads, without the transformers copies an earlier test may have built: a copy, so
    # that the shared fixture keeps what it holds (the models themselves are shared, not copied)
    pair = replace(real_pair, **{role: None for role in ("draft", "target")
                                 if getattr(real_pair, f"{role}_loader") is not None})
    assert pair.draft is None and pair.draft_loader is not None     # built only if something asks
    mem = calibrate_prompts(pair, ["Write a Python function that adds two numbers."], max_new_tokens=12)
    info = mem.meta["calibration"][-1]
    assert info["answer_tokens"] == 12 and info["positions"] >= 11 and info["divergences"] == mem.total
    mem = calibrate(pair, ["The quick brown fox jumps over the lazy dog. " * 20], mem, chunk_tokens=32,
                    max_positions=40)
    assert mem.meta["calibration"][-1]["positions"] == 40
    assert pair.draft is None                                           # the transformers draft never built
    prompt = pair.encode_prompt("def add(a, b):", True)
    run = Decoder(pair).run(prompt, CSDConfig(method="ar", max_new_tokens=8), CorrectionMemory(pair.pair_id))
    list(run)
    seen = draft_predictions(pair, prompt, run.token_ids)
    vocab = set(pair.draft_lm.vocab_ids.tolist())
    assert len(seen) == len(run.token_ids) and set(seen) <= vocab               # what the draft can propose
