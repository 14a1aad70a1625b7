"""The memory that ships (csd/data/default_memory.json.gz), read from the file: counted where the
models generate, no special token in any pattern, and enough frequent patterns for CSD to fire."""
from __future__ import annotations

from transformers import AutoTokenizer

from csd.memory import DEFAULT_MEMORY_FILE, CorrectionMemory
from csd.runtime.embedded import prepare_embedded
from csd.runtime.pair import special_token_ids


def shipped() -> CorrectionMemory:
    return CorrectionMemory.load(DEFAULT_MEMORY_FILE)


def test_calibrated_on_the_models_own_answers_with_their_representations():
    rounds = shipped().meta["calibration"]
    assert rounds, "the file says how it was counted"
    for r in rounds:
        assert r["mode"] == "prompts" and r["prompts"] > 0 and r["answer_tokens"] > 0
        assert r["target_repr"] and r["draft_repr"]           # shown beside the running pair's, never refused


def test_a_few_hundred_patterns_reach_the_papers_lambda():
    mem = shipped()
    assert mem.n_candidates(6) >= 300
    assert mem.meta["calibration"][-1]["memory_at_lambda"] == mem.n_candidates(6)


def test_no_special_token_in_any_pattern():
    tok = AutoTokenizer.from_pretrained(prepare_embedded("draft"))
    special = special_token_ids(tok, [tok.eos_token_id])
    assert len(special) >= 3                                   # <|endoftext|>, <|im_start|>, <|im_end|> at least
    bad = [(x, t) for (x, t), _ in shipped().items() if x in special or t in special]
    assert not bad, f"special tokens counted: {bad[:5]}"
