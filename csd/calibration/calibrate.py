"""Calibration of the Online Correction Memory (CSD, arXiv 2604.13634; docs/calibration.md): count the
pairs (draft top-1 -> target top-1) wherever they differ, never with a special token on either side.
**prompts** (the default): the draft is teacher-forced over the target's greedy answers to prompts (a
``heldout`` split measures how the memory generalises); **text**: both models read human-written text."""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

import torch

from ..config import CSDConfig
from ..events import Progress
from ..memory import CorrectionMemory
from ..rule import top_share
from ..runtime.pair import ModelPair

log = logging.getLogger(__name__)
CALIBRATION_INSTRUCTION = "Write the following text."


class Stop(Exception):
    """Raised by a progress callback to stop a calibration early (the counts so far are kept)."""


@torch.inference_mode()
def top1_after(lm, ids: Sequence[int], first: int) -> list[int]:
    """The model's greedy token after each of ``ids[first:]``, teacher-forced over ``ids``: read in the passes a
    run reads a prompt in (``csd.decode.prefill_spans``), by the model as it decodes (representation, reduced
    vocabulary), so these are the tokens a run would see it propose."""
    from ..decode import prefill_spans
    cache, out = lm.new_cache(), []
    try:
        for a, b in prefill_spans(len(ids)):
            logits = lm.forward(cache, list(ids[a:b]), b - a)               # (b - a, V)
            if b > first:
                top = logits[max(first, a) - a:].argmax(-1)
                out += (top if lm.vocab_ids is None else lm.vocab_ids[top]).tolist()
    finally:
        lm.release(cache)
    return out


@dataclass(frozen=True)
class TextOptions:
    """``chunk_tokens`` a chunk, ``batch_size`` chunks a step (progress and a stop are checked between steps),
    the first ``skip_first`` of each masked, up to ``max_positions`` counted (None: the whole corpus)."""
    chunk_tokens: int = 256
    batch_size: int = 4
    skip_first: int = 4
    max_positions: int | None = None
    corpus_name: str = ""


def _memory_for(pair: ModelPair, memory: CorrectionMemory | None) -> CorrectionMemory:
    if pair.draft_lm is None:
        raise ValueError("calibration needs both models")
    memory = memory if memory is not None else CorrectionMemory(pair.pair_id)
    if memory.pair_id != pair.pair_id:
        raise ValueError(f"the memory belongs to {memory.pair_id!r}, not to {pair.pair_id!r}")
    return memory


def calibrate(pair: ModelPair, texts: Iterable[str], memory: CorrectionMemory | None = None, *,
              progress: Progress | None = None, **options) -> CorrectionMemory:
    """Count the divergences of both models reading ``texts`` into ``memory`` (``TextOptions`` fields as
    keywords); a progress callback that raises ``Stop`` ends it, the counts so far kept."""
    o = TextOptions(**options)
    chunk_tokens, skip_first, max_positions = o.chunk_tokens, o.skip_first, o.max_positions
    memory = _memory_for(pair, memory)
    if chunk_tokens <= skip_first + 1:
        raise ValueError(f"chunk_tokens must exceed skip_first + 1 ({skip_first + 1})")
    prefix = pair.encode_prompt(CALIBRATION_INSTRUCTION, chat=True)    # the template's tokens before an answer
    max_chunks = None if max_positions is None else max(1, -(-max_positions // (chunk_tokens - skip_first)))
    tokenized = (pair.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts)
    chunks = list(islice((ids[s:s + chunk_tokens] for ids in tokenized      # tokenized first: progress knows the total
                          for s in range(0, len(ids) - chunk_tokens + 1, chunk_tokens)), max_chunks))
    positions = divergences = 0
    first = len(prefix) + skip_first - 1          # the position whose prediction is text token skip_first

    def count(batch: list[list[int]], done: int) -> None:
        nonlocal positions, divergences
        ds, ts = [], []          # teacher-forced predictions of both models over prefix + text
        for c in batch:
            ds += top1_after(pair.draft_lm, (prefix + c)[:-1], first)
            ts += top1_after(pair.target_lm, (prefix + c)[:-1], first)
        n = len(ds) if max_positions is None else min(len(ds), max_positions - positions)    # exactly those asked for
        for a, b in zip(ds[:n], ts[:n]):
            if a != b and a not in pair.special_ids and b not in pair.special_ids:
                memory.observe(a, b)
                divergences += 1
        positions += n
        if progress:
            progress(f"calibrating: {positions} positions, {divergences} divergences", min(1.0, done / len(chunks)))

    stopped = False
    try:
        for b in range(0, len(chunks), o.batch_size):
            count(chunks[b:b + o.batch_size], b + o.batch_size)
    except Stop:
        stopped = True
    if positions == 0:
        raise Stop if stopped else ValueError(f"the corpus is too short: every text has fewer than {chunk_tokens} "
                                              "tokens")
    memory.meta["calibration"] = memory.meta.get("calibration", []) + [
        {"mode": "text", "corpus": o.corpus_name, "positions": positions, "divergences": divergences,
         "agreement": 1 - divergences / positions, "chunk_tokens": chunk_tokens, "skip_first": skip_first,
         "representation": pair.rep.as_dict()} | ({"stopped": True} if stopped else {})]
    if stopped:
        raise Stop
    return memory


# -- prompt mode -----------------------------------------------------------------------------------
def answer_prompts(pair: ModelPair, prompt_ids: Sequence[list[int]], max_new_tokens: int,
                   progress: Progress | None = None, label: str = "answering") -> list[list[int]]:
    """The target's greedy answers (new token ids, up to its end token) by the engine's AR runs, no second copy of
    the models. An answer stops at the model's context; a prompt that fills it gets none (``count_answers`` skips)."""
    from ..decode import Decoder
    decoder, answers, unused = Decoder(pair), [], CorrectionMemory(pair.pair_id)     # AR reads no memory
    for n, ids in enumerate(prompt_ids):
        room = min(max_new_tokens, pair.context_limit - len(ids)) if pair.context_limit else max_new_tokens
        answer = []
        if room >= 1:
            run = decoder.run(ids, CSDConfig(method="ar", max_new_tokens=room), unused)
            for _ in run:
                pass
            answer = list(run.token_ids)
        answers.append(answer)
        if progress:
            progress(f"{label}: {n + 1}/{len(prompt_ids)} prompts, {sum(map(len, answers))} answer tokens",
                     (n + 1) / len(prompt_ids))
    return answers


def draft_predictions(pair: ModelPair, prompt_ids: list[int], answer: list[int]) -> list[int]:
    """The draft's greedy top-1 at every answer position, teacher-forced over prompt + answer."""
    return top1_after(pair.draft_lm, prompt_ids + answer[:-1], len(prompt_ids) - 1)


def count_answers(pair: ModelPair, prompt_ids: Sequence[list[int]], answers: Sequence[list[int]],
                  memory: CorrectionMemory | None = None, progress: Progress | None = None) -> dict:
    """Count (draft top-1 -> the answer's token) where they differ, into ``memory`` if given.
    -> {"positions", "divergences", "patterns": Counter}."""
    patterns: Counter = Counter()
    positions = 0
    special = pair.special_ids
    for n, (ids, ans) in enumerate(zip(prompt_ids, answers)):
        if not ans:
            continue
        d = draft_predictions(pair, ids, ans)
        for a, b in zip(d, ans):
            if b in special:          # the end of the answer: not a position the memory may learn
                continue
            positions += 1
            if a != b and a not in special:
                patterns[(a, b)] += 1
        if progress:
            progress(f"counting: {positions} positions, {sum(patterns.values())} divergences", (n + 1) / len(answers))
    if memory is not None:
        for (a, b), c in patterns.items():
            memory.observe(a, b, c)
    return {"positions": positions, "divergences": sum(patterns.values()), "patterns": patterns}


@dataclass(frozen=True)
class PromptOptions:
    """``batch_size`` prompts a step (shortest first); ``heldout`` prompts measure how the patterns at ``lam`` cover
    divergences never counted; ``token_freq`` counts the answers' tokens; ``source`` names the prompts in the record."""
    max_new_tokens: int = 320
    batch_size: int = 8
    chat: bool = True
    heldout: Sequence[dict | str] = ()
    lam: float = 6
    source: str = ""
    token_freq: Counter | None = None


def calibrate_prompts(pair: ModelPair, prompts: Sequence[dict | str], memory: CorrectionMemory | None = None, *,
                      progress: Progress | None = None, **options) -> CorrectionMemory:
    """Calibrate on the target's own answers to ``prompts`` (``PromptOptions`` keywords), recorded in
    ``memory.meta["calibration"]``; a progress callback raising ``Stop`` ends it, the counts so far kept."""
    o = PromptOptions(**options)
    memory = _memory_for(pair, memory)
    rows = [{"prompt": p} if isinstance(p, str) else p for p in prompts]
    if not rows:
        raise ValueError("no prompts to calibrate on")
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [pair.encode_prompt(r["prompt"], o.chat) for r in rows]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))       # similar lengths share a batch
    patterns: Counter = Counter()
    info = {"mode": "prompts", "source": o.source, "prompts": 0, "kinds": {}, "answer_tokens": 0,
            "answers_ended": 0, "max_new_tokens": o.max_new_tokens, "positions": 0, "divergences": 0,
            "representation": pair.rep.as_dict()}

    def record(stopped: bool) -> None:
        info.update(agreement=1 - info["divergences"] / max(1, info["positions"]), patterns=len(patterns),
                    top20_share=top_share(patterns.values()), memory_patterns=len(memory),
                    memory_at_lambda=memory.n_candidates(o.lam), memory_top20_share=memory.top_share(0.2), **{
                        "lambda": o.lam, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
        if stopped:
            info["stopped"] = True
        memory.meta["calibration"] = list(memory.meta.get("calibration", [])) + [info]

    try:
        for b in range(0, len(order), o.batch_size):
            _count_batch(pair, memory, [(rows[i], ids[i]) for i in order[b:b + o.batch_size]], o, info, patterns)
            if progress:
                progress(f"calibrating: {info['prompts']}/{len(rows)} prompts, {info['answer_tokens']} answer tokens, "
                         f"{info['divergences']} divergences", info["prompts"] / len(rows))
        if o.heldout:
            info["heldout"] = heldout_coverage(pair, memory, o, progress)
    except Stop:
        record(stopped=True)
        raise
    record(stopped=False)
    return memory


def _count_batch(pair: ModelPair, memory: CorrectionMemory, batch: list[tuple[dict, list[int]]], o: PromptOptions,
                 info: dict, patterns: Counter) -> None:
    """Answer one batch of (row, prompt ids), count its divergences into ``memory``, ``patterns`` and ``info``."""
    answers = answer_prompts(pair, [i for _r, i in batch], o.max_new_tokens)
    stats = count_answers(pair, [i for _r, i in batch], answers, memory)
    patterns.update(stats["patterns"])
    eos = set(pair.eos_ids)
    for (row, _ids), a in zip(batch, answers):
        info["prompts"] += 1
        kind = row.get("kind", "?")
        info["kinds"][kind] = info["kinds"].get(kind, 0) + 1
        info["answer_tokens"] += len(a)
        info["answers_ended"] += bool(a and a[-1] in eos)
        if not a:                               # the prompt filled the model's context: nothing to count
            info["prompts_without_room"] = info.get("prompts_without_room", 0) + 1
        if o.token_freq is not None:
            o.token_freq.update(str(t) for t in a)
    info["positions"] += stats["positions"]
    info["divergences"] += stats["divergences"]


def heldout_coverage(pair: ModelPair, memory: CorrectionMemory, o: PromptOptions,
                     progress: Progress | None = None) -> dict:
    """How the patterns at ``o.lam`` cover the divergences of the answers to the held-out prompts."""
    rows = [{"prompt": p} if isinstance(p, str) else p for p in o.heldout]
    ids = [pair.encode_prompt(r["prompt"], o.chat) for r in rows]
    answers = answer_prompts(pair, ids, o.max_new_tokens, progress, label="held-out answers")
    h = count_answers(pair, ids, answers, None, progress)
    covered = sum(c for k, c in h["patterns"].items() if memory.count(*k) >= o.lam)
    return {"prompts": len(rows), "answer_tokens": sum(map(len, answers)), "positions": h["positions"],
            "divergences": h["divergences"], "patterns": len(h["patterns"]),
            "top20_share": top_share(h["patterns"].values()), "covered_at_lambda": covered / max(1, h["divergences"])}
