"""The app's runs share the target's rows of prompts that begin alike (csd.runtime.prompt_rows): the store on real
caches of a tiny lean model, then the embedded target on its GGUF blocks, whose copied rows are the rows a run
would have computed, so its answer does not change."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from conftest import tiny_model
from csd.config import CSDConfig
from csd.decode import Cancelled, Decoder
from csd.runtime.lm import LeanLM
from csd.runtime.prompt_rows import PromptRows


@pytest.fixture(scope="module")
def lean():
    return LeanLM(tiny_model(4, hidden=64))


def read(lm, ids):
    cache = lm.new_cache()
    lm.forward(cache, ids, 1)
    return cache


def test_a_prompt_copies_the_longest_beginning_another_user_read(lean):
    rows = PromptRows()
    first = [3, 7, 1, 4, 9, 2]
    assert rows.fill(lean, lean.new_cache(), first, lambda: None, "ann") == 0     # nothing kept yet
    rows.done(lean, read(lean, first), first, True, "ann")
    cache = lean.new_cache()
    assert rows.fill(lean, cache, [3, 7, 1, 5, 5], lambda: None, "bob") == 3     # 3, 7, 1 in common
    assert cache.n == 3
    whole = read(lean, first)
    assert torch.equal(cache.k[:, :, :3], whole.k[:, :, :3]) and torch.equal(cache.v[:, :, :3], whole.v[:, :, :3])
    rows.done(lean, cache, [3, 7, 1, 5, 5], False, "bob")                        # a reading that did not end
    assert rows.tokens() == 6
    # Ann's own prompt again (AR, then CSD, in her Compare tab): she reads it herself, as her timing assumes
    assert rows.fill(lean, lean.new_cache(), first, lambda: None, "ann") == 0
    rows.done(lean, read(lean, first), first, True, "ann")
    # Bob sends it whole and copies it; it stays Ann's reading, so Ann still reads her own prompt herself
    copied = lean.new_cache()
    assert rows.fill(lean, copied, first, lambda: None, "bob") == 6
    rows.done(lean, copied, first, True, "bob")
    assert rows.fill(lean, lean.new_cache(), first, lambda: None, "ann") == 0
    rows.done(lean, read(lean, first), first, True, "ann")
    assert rows.tokens() == 6


def test_the_oldest_prompts_leave_first_past_the_budget(lean):
    rows = PromptRows(budget_tokens=10)
    for p in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        rows.fill(lean, lean.new_cache(), p, lambda: None, "ann")
        rows.done(lean, read(lean, p), p, True, "ann")
    assert rows.tokens() == 8
    assert rows.fill(lean, lean.new_cache(), [1, 2, 3, 4], lambda: None, "bob") == 0     # the first left
    assert rows.fill(lean, lean.new_cache(), [9, 10, 11, 12], lambda: None, "bob") == 4


def test_a_run_waits_for_the_same_prompt_read_by_another_and_can_be_stopped(lean):
    """Two runs that send one prompt at once: the second waits for the first's reading and copies it; a run
    stopped while it waits leaves at once, and a reading that fails lets the waiting run read for itself."""
    rows, prompt = PromptRows(), [4, 4, 2, 8, 1]
    assert rows.fill(lean, lean.new_cache(), prompt, lambda: None, "ann") == 0   # the first run reads it now
    got = {}

    def second():
        got["n"] = rows.fill(lean, lean.new_cache(), prompt, lambda: None, "bob")
    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()                                                          # waiting for the first
    rows.done(lean, read(lean, prompt), prompt, True, "ann")
    t.join(5)
    assert got["n"] == 5

    other = [6, 6, 6]
    rows.fill(lean, lean.new_cache(), other, lambda: None, "ann")
    stop = threading.Event()

    def check():
        if stop.is_set():
            raise Cancelled
    errors = []

    def stopped_run():
        try:
            rows.fill(lean, lean.new_cache(), other, check, "bob")
        except Cancelled:
            errors.append("cancelled")
    waiter = threading.Thread(target=stopped_run)
    waiter.start()
    time.sleep(0.2)
    stop.set()
    waiter.join(5)
    assert errors == ["cancelled"] and not waiter.is_alive()
    rows.done(lean, lean.new_cache(), other, False, "ann")                       # the first run failed
    assert rows.fill(lean, lean.new_cache(), other, lambda: None, "bob") == 0    # so the next reads it itself


def test_only_a_target_that_computes_each_row_alone_takes_part(lean):
    assert not PromptRows.takes_part(lean)          # a float lean model's rows depend on the pass that holds them


@pytest.mark.slow
def test_the_gguf_target_answers_the_same_with_copied_prompt_rows():
    """The embedded pair on its GGUF blocks: a run that copies the template's lines and the shared words of another
    prompt, or all of a prompt read before, writes what it writes reading them itself, token for token; two runs
    that send one prompt at once through the batcher read it once."""
    from csd.memory import CorrectionMemory
    from csd.runtime import kquant
    from csd.runtime.batch import Batcher
    from csd.runtime.models import load_pair
    if kquant.kernel_missing():
        pytest.skip(kquant.kernel_missing())
    pair = load_pair(dtype="gguf", draft_weights="q4_0")
    assert PromptRows.takes_part(pair.target_lm)
    a = pair.encode_prompt("Write a Python function that returns the largest of three numbers.")
    b = pair.encode_prompt("Write a Python function that returns the smallest of three numbers.")
    cfg = CSDConfig(method="csd", gamma=4, lookup=0, max_new_tokens=24)

    def answer(decoder, ids):
        run = decoder.run(ids, cfg, CorrectionMemory(pair.pair_id))
        list(run)
        return run
    own = {k: answer(Decoder(pair), ids).token_ids for k, ids in (("a", a), ("b", b))}
    shared = Decoder(pair, prompt_rows=PromptRows())
    first, other, again = answer(shared, a), answer(shared, b), answer(shared, a)
    assert first.metrics.prompt_rows_copied == 0
    assert 20 < other.metrics.prompt_rows_copied < len(b) - 1                    # the template and the words
    assert again.metrics.prompt_rows_copied == len(a) - 1                       # all but the last token
    assert (first.token_ids, other.token_ids, again.token_ids) == (own["a"], own["b"], own["a"])

    batcher = Batcher(pair)
    try:
        together = Decoder(batcher.view(), prompt_rows=PromptRows())
        runs = [together.run(a, cfg, CorrectionMemory(pair.pair_id)) for _ in range(2)]
        workers = [threading.Thread(target=list, args=(r,)) for r in runs]
        for w in workers:
            w.start()
        for w in workers:
            w.join(300)
        assert sorted(r.metrics.prompt_rows_copied for r in runs) == [0, len(a) - 1]
        assert [r.token_ids for r in runs] == [own["a"], own["a"]]
    finally:
        batcher.close()
