"""Runs that decode together (csd.runtime.batch): one pass serves several runs, and what each run computes is
what it computes alone where the layers are per-row exact (int8 scaled per token). Tiny in-process
models; the real pair through the app is in tests/test_ui_panels.py."""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace

import pytest
import torch

from conftest import make_pair, perturbed, tiny_model
from csd.config import CSDConfig
from csd.decode import Decoder
from csd.memory import CorrectionMemory
from csd.representation import Representation
from csd.runtime.batch import Batcher
from csd.runtime.lm import LeanLM
from csd.runtime.quant import quantize_int8

PROMPTS = [[3, 7, 1, 4], [5, 2], [9, 9, 8, 1, 2, 6, 3], [11, 4, 4]]


@pytest.fixture
def int8_pair(qwen_tokenizer):
    """A fresh pair for each test: a ``Batcher`` switches its draft to per-row scales and a per-pass view
    switches its target's mode, so a pair shared across tests would carry one test's state into the next."""
    target = tiny_model(2, hidden=64)
    int8 = quantize_int8(copy.deepcopy(target)).eval()
    lean = LeanLM(int8)
    lean.int8_per_row()
    draft = quantize_int8(perturbed(target, 0.3)).eval()
    return replace(make_pair(qwen_tokenizer, int8, draft, pair_id="tiny-int8"), target_lm=lean,
                   draft_lm=LeanLM(draft), rep=Representation("int8", activations="row"))


@pytest.fixture
def batchers():
    """Makes batchers whose model threads are stopped and joined when the test ends."""
    made = []

    def make(pair, **kw) -> Batcher:
        made.append(Batcher(pair, **kw))
        return made[-1]
    yield make
    for b in made:
        b.close()
    assert not any(b.running for b in made)


class HeldPasses:
    """The model's first ``forward_many`` is held until ``release`` is set, as ``tests/ui_fixtures.py``'s
    ``Gate`` holds a run's pass: while it is held the other runs' calls queue, whatever the threads' timing."""

    def __init__(self, lm):
        self.lm, self.held = lm, False
        self.reached, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def forward_many(self, *args):
        if not self.held:
            self.held = True
            self.reached.set()
            assert self.release.wait(60), "the test never released the held pass"
        return self.lm.forward_many(*args)


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _prefilled(lm, prompts):
    caches = [lm.new_cache() for _ in prompts]
    for c, p in zip(caches, prompts):
        lm.forward(c, p, 1)
    return caches


def test_a_batched_pass_gives_each_sequence_its_own_pass_bit_for_bit(int8_pair):
    lm = int8_pair.target_lm
    blocks, keeps = [[1, 2, 3], [4], [6, 7, 8, 9, 10], [12, 13]], [3, 1, 5, 1]
    alone = [lm.forward(c, b, k) for c, b, k in zip(_prefilled(lm, PROMPTS), blocks, keeps)]
    caches = _prefilled(lm, PROMPTS)
    together = lm.forward_many(caches, blocks, keeps)
    assert [t.shape[0] for t in together] == keeps
    for a, t in zip(alone, together):
        assert torch.equal(a, t)
    assert [c.n for c in caches] == [len(p) + len(b) for p, b in zip(PROMPTS, blocks)]
    # the caches hold what a pass alone wrote: the next step continues each sequence as it would alone
    nxt = lm.forward_many(caches, [[5]] * 4, [1] * 4)
    ref = _prefilled(lm, PROMPTS)
    for c, b in zip(ref, blocks):
        lm.forward(c, b, 1)
    assert all(torch.equal(lm.forward(c, [5], 1), n) for c, n in zip(ref, nxt))


def test_a_float_model_batched_is_the_same_function(qwen_tokenizer):
    lm = LeanLM(tiny_model(3, hidden=64))
    alone = [lm.forward(c, [1, 2], 2) for c in _prefilled(lm, PROMPTS)]
    together = lm.forward_many(_prefilled(lm, PROMPTS), [[1, 2]] * 4, [2] * 4)
    for a, t in zip(alone, together):
        torch.testing.assert_close(a, t, rtol=1e-4, atol=1e-4)


def _runs_at_once(pair, decoder, method: str, prompts, **cfg) -> list:
    fields = {"gamma": 4, "max_new_tokens": 24, "lookup": 0, **cfg}
    runs = [decoder.run(p, CSDConfig(method=method, **fields), CorrectionMemory(pair.pair_id)) for p in prompts]
    errors = []

    def go(run):
        try:
            list(run)
        except Exception as e:        # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    return runs


def test_runs_at_once_write_what_they_write_alone(int8_pair, one_thread, batchers):
    held = HeldPasses(int8_pair.target_lm)
    # a window far longer than any pass: a gather waits until every run in flight has a call waiting, so which
    # runs share a pass follows from the runs, not from how fast the threads happen to be
    batcher = batchers(replace(int8_pair, target_lm=held), window_s=30.0)
    assert int8_pair.draft_lm.per_row      # an int8 draft's rows are scaled on their own from here
    view = batcher.view("row")
    alone, rescued = {}, 0
    for method in ("ar", "sd", "csd"):
        for p in PROMPTS:
            run = Decoder(int8_pair).run(p, CSDConfig(method=method, gamma=4, max_new_tokens=24, lookup=0, lam=0),
                                         CorrectionMemory(int8_pair.pair_id))
            list(run)
            alone[method, tuple(p)] = run.token_ids
            rescued += run.metrics.rescued
    assert rescued > 0                  # lambda 0: the gate alone decides, and it rescues some
    for method in ("ar", "sd", "csd"):
        if method == "ar":              # the first run's first pass is held until every other run's call waits
            threading.Thread(target=_release_when_all_wait, args=(batcher, held, len(PROMPTS) - 1)).start()
        runs = _runs_at_once(view, Decoder(view), method, PROMPTS, lam=0)
        for p, run in zip(PROMPTS, runs):
            assert run.token_ids == alone[method, tuple(p)]          # CSD too: every row as it is alone
            assert run.metrics.stopped_by == "max_new_tokens"
            if method == "sd":
                assert run.token_ids == alone["ar", tuple(p)]
    stats = batcher.stats()
    assert stats["target"]["widest"] > 1 and stats["target"]["calls"] > stats["target"]["passes"]
    assert stats["draft"]["widest"] > 1
    assert stats["target"]["widest"] >= len(PROMPTS) - 1      # the held pass, then the others' calls together
    assert batcher.idle()                # every run that ended left


def _release_when_all_wait(batcher: Batcher, held: HeldPasses, others: int) -> None:
    assert held.reached.wait(60)
    _wait_for(lambda: batcher.waiting() >= others)
    held.release.set()


def test_per_pass_scales_are_never_merged_across_runs(int8_pair, one_thread, batchers):
    batcher = batchers(int8_pair, window_s=0.05)
    view = batcher.view("pass")
    runs = _runs_at_once(view, Decoder(view), "sd", PROMPTS[:3])
    assert all(r.metrics.new_tokens == 24 for r in runs)
    assert batcher.stats()["target"]["widest"] == 1
    assert int8_pair.rep.activations == "pass"        # the model thread applied the view's mode


def test_a_run_that_starts_alone_drafts_with_the_solo_draft(int8_pair, one_thread):
    """The app's lone presenter: a run that starts while none is in flight drafts with the batcher's ``solo``
    draft (ort4 in the app; a float one here) and writes what that pair writes unbatched; a run that starts
    while one is in flight drafts with the pair's own. Both verify on the one shared target."""
    from csd.ui.state import Settings, make_services
    from csd.ui.tabs.common import decoder_for
    solo_lm = LeanLM(perturbed(tiny_model(2, hidden=64), 0.5, seed=1))     # the fixture's target, other noise
    solo = replace(int8_pair, draft_lm=solo_lm, rep=replace(int8_pair.rep, draft="float32"))
    services = make_services(int8_pair, settings=Settings(concurrency=4), solo=solo)
    batcher = services.batcher
    assert batcher.idle()
    from csd.ui.app import header
    assert "float32 for a run that starts alone" in header(services)          # the page says which drafts
    first = decoder_for(services, None)
    assert first.pair.rep.draft == "float32" and first.pair.draft_lm.lm is solo_lm
    assert first.pair.target_lm.lm is int8_pair.target_lm and first.pair.rep.activations == "row"
    cfg = CSDConfig(method="csd", gamma=4, max_new_tokens=24, lookup=0, lam=0)
    run = first.run(PROMPTS[0], cfg, CorrectionMemory(int8_pair.pair_id))
    next(iter(run))                               # its first token: the run is in flight
    assert not batcher.idle()
    second = decoder_for(services, None)
    assert second.pair.rep.draft == int8_pair.rep.draft and second.pair.draft_lm.lm is int8_pair.draft_lm
    list(run)
    assert batcher.idle()                         # the run ended and left
    alone = Decoder(solo).run(PROMPTS[0], cfg, CorrectionMemory(int8_pair.pair_id))
    list(alone)
    assert run.token_ids == alone.token_ids and run.metrics.rescued == alone.metrics.rescued
    assert run.metrics.target_forwards == alone.metrics.target_forwards
    batcher.close()


def test_the_app_batches_the_runs_of_a_target_without_activation_scales(qwen_tokenizer, one_thread):
    """The GGUF target, the app's default, has no int8 activation scales (its mode is ""). Its runs at once must
    still go through the batcher's views: until 2026-12-07 ``decoder_for`` handed them the bare pair, so 8 users
    each made their own passes and competed for the cores instead of sharing passes."""
    from csd.runtime.batch import BatchedLM
    from csd.ui.state import Settings, make_services
    from csd.ui.tabs.common import decoder_for
    target = tiny_model(2, hidden=64)
    draft = perturbed(target, 0.3)
    pair = make_pair(qwen_tokenizer, target, draft, draft_lm=LeanLM(draft), pair_id="tiny-float")
    pair = replace(pair, target_lm=LeanLM(target))
    assert pair.rep.activations == ""
    services = make_services(pair, settings=Settings(concurrency=4))
    try:
        decoders = [decoder_for(services, None) for _ in range(3)]
        assert all(isinstance(d.pair.target_lm, BatchedLM) for d in decoders)
        assert decoders[0] is decoders[1]                       # one decoder a mode: their costs are shared
        runs = _runs_at_once(decoders[0].pair, decoders[0], "sd", PROMPTS[:3])
        assert all(r.metrics.new_tokens == 24 for r in runs)
        assert services.batcher.stats()["target"]["widest"] >= 2      # the runs at once shared passes
    finally:
        services.batcher.close()


def test_a_failing_call_fails_its_own_run_only(int8_pair, one_thread, batchers):
    batcher = batchers(int8_pair, window_s=0.05)
    lm = batcher.view("row").target_lm
    good, bad = lm.new_cache(), lm.new_cache()
    out = {}

    def call(name, cache, ids):
        try:
            out[name] = lm.forward(cache, ids, 1)
        except Exception as e:        # noqa: BLE001 - checked below
            out[name] = e

    threads = [threading.Thread(target=call, args=("good", good, [1, 2])),
               threading.Thread(target=call, args=("bad", bad, [10_000]))]      # no such token
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert torch.is_tensor(out["good"]) and isinstance(out["bad"], IndexError)
    assert lm.length(good) == 2 and lm.length(bad) == 0


def test_only_the_lean_path_batches(tiny_pair):
    with pytest.raises(ValueError, match="lean path"):
        Batcher(tiny_pair)


def test_the_model_thread_stops_with_the_app(int8_pair, one_thread):
    """``close`` (what csd_app.main calls at shutdown) serves the calls already waiting, then ends the model
    thread; a call after it is refused rather than left waiting forever."""
    held = HeldPasses(int8_pair.target_lm)
    batcher = Batcher(replace(int8_pair, target_lm=held), window_s=0.05)
    lm = batcher.view("row").target_lm
    out = {}

    def call(name, ids):
        out[name] = lm.forward(lm.new_cache(), ids, 1)
    threads = [threading.Thread(target=call, args=("first", [1, 2]))]
    threads[0].start()
    assert held.reached.wait(60)                      # the model thread is inside the first pass
    threads.append(threading.Thread(target=call, args=("waiting", [3, 4])))
    threads[1].start()
    _wait_for(lambda: batcher.waiting() == 1)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    held.release.set()
    for t in (*threads, closer):
        t.join(60)
    assert torch.is_tensor(out["first"]) and torch.is_tensor(out["waiting"])     # served before it stopped
    assert not batcher.running
    with pytest.raises(RuntimeError, match="closed"):
        lm.forward(lm.new_cache(), [5], 1)
    batcher.close()                                   # twice: nothing more to do


def test_runs_that_share_passes_plan_with_the_profile_not_with_their_waits(int8_pair, batchers, one_thread):
    """A run's pass through the batcher holds other runs' rows and the wait for them, not the run's own cost: a
    run of a batcher's view learns no costs from its blocks, and drafts as the profile says it pays."""
    from csd.costs import CostModel
    profile = CostModel({k: 1.0 + 0.01 * k for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, 0.01)
    decoder = Decoder(batchers(int8_pair).view(), costs=profile, online_costs=True)
    cfg = CSDConfig(method="sd", gamma="auto", max_new_tokens=24)
    run = decoder.run(PROMPTS[2], cfg, CorrectionMemory(int8_pair.pair_id))
    list(run)
    assert run.metrics.draft_forwards > 0
    learned = decoder.learned
    assert learned.verify_scale == 1.0 and learned.draft_ms in (None, profile.draft_ms) and not learned.samples


def test_runs_at_once_plan_as_one_of_the_runs_in_flight(int8_pair, batchers, one_thread):
    """A batcher's view says how many runs share its passes now, and gamma auto plans each block with that share of
    the costs (``csd.costs.CostModel.shared``): on costs where a pass is mostly its fixed part alone and mostly rows
    among four, four runs at once draft fewer tokens than the same four runs one at a time, and write the same."""
    from csd.costs import CostModel
    batcher = batchers(int8_pair, window_s=30.0)
    view = batcher.view()
    caches = [view.target_lm.new_cache() for _ in range(4)]
    assert view.target_lm.runs_sharing(caches[0]) == 1      # none in flight: a run counts itself
    for c in caches[:3]:
        batcher.join(id(c))
    assert view.target_lm.runs_sharing(caches[0]) == 3
    assert view.target_lm.runs_sharing(caches[3]) == 4      # one about to join counts itself too
    for c in caches[:3]:
        view.target_lm.release(c)
    assert view.target_lm.runs_sharing(caches[0]) == 1
    profile = CostModel({k: 40.0 + 20.0 * k for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, 1.0)
    cfg = CSDConfig(method="sd", gamma="auto", max_new_tokens=24, lookup=0)
    alone = []
    for p in PROMPTS:
        run = Decoder(view, costs=profile).run(p, cfg, CorrectionMemory(int8_pair.pair_id))
        list(run)
        alone.append(run)
    runs = _runs_at_once(view, Decoder(view, costs=profile), "sd", PROMPTS, gamma="auto")
    assert [r.token_ids for r in runs] == [r.token_ids for r in alone]
    drafted_alone = sum(r.metrics.drafted for r in alone)
    assert sum(r.metrics.drafted for r in runs) < drafted_alone and drafted_alone > 0


def test_a_run_that_shares_passes_reads_its_prompt_into_the_draft_only_to_draft(int8_pair, batchers, one_thread):
    """Costs where drafting pays alone (a plain step 80 ms, a drafted token 50) but not as one of 4 runs (a plain
    step's share 35 ms, a drafted token 33): a run of the batcher alone reads its prompt into the draft when it
    first drafts (40 tokens to write spread that reading thin: ``AutoGamma.owe``); a run among 4 in flight never
    drafts, so its prompt is never read into the draft; it writes what it writes alone."""
    from csd.costs import CostModel
    profile = CostModel({k: 60.0 + 20.0 * k for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33)}, 30.0)
    batcher = batchers(int8_pair, window_s=0.01)
    view = batcher.view()
    cfg = CSDConfig(method="sd", gamma="auto", max_new_tokens=40, lookup=0)
    prompt = PROMPTS[2]
    alone = Decoder(view, costs=profile).run(prompt, cfg, CorrectionMemory(int8_pair.pair_id))
    list(alone)
    read_alone = batcher.stats()["draft"]["rows"]
    assert read_alone >= len(prompt) - 1 and alone.metrics.drafted > 0
    others = [view.target_lm.new_cache() for _ in range(3)]
    for c in others:            # three runs in flight (their caches stand for them)
        batcher.join(id(c))
    among = Decoder(view, costs=profile).run(prompt, cfg, CorrectionMemory(int8_pair.pair_id))
    list(among)
    assert among.token_ids == alone.token_ids
    assert among.metrics.drafted == 0
    assert batcher.stats()["draft"]["rows"] == read_alone     # no draft pass at all: the prompt was not read


def test_a_call_of_more_rows_than_a_pass_takes_is_served_alone(int8_pair, batchers, one_thread):
    """A draft catching up on a long stretch it did not draft may hand the batcher more rows than a pass's budget:
    it is served in a pass of its own (before, no pass took it and the model thread ended with the runs waiting)."""
    from csd.runtime.batch import MAX_BATCH_TOKENS
    batcher = batchers(int8_pair)
    view = batcher.view()
    cache = view.draft_lm.new_cache()
    ids = [(7 * i) % 28 + 3 for i in range(MAX_BATCH_TOKENS + 40)]
    got = []
    call = threading.Thread(target=lambda: got.append(view.draft_lm.forward(cache, ids, 1)), daemon=True)
    call.start()
    call.join(60)
    assert got, "the call was never served"
    assert got[0].shape[0] == 1 and view.draft_lm.length(cache) == len(ids)
    assert batcher.running and batcher.stats()["draft"]["rows"] == len(ids)
