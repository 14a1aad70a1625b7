"""Draft-length policies replayed offline on recorded greedy answers, so that a policy can be judged on
hundreds of answers in seconds, and the benchmark run only confirms what the replay chose.

Greedy SD without rescue keeps exactly the target's own tokens, so after every block the draft is
conditioned on the target's answer: what the draft proposes at answer position i is its top-1 after
the target's first i tokens, whatever the blocks before were. One teacher-forced draft pass over each
answer (``record``) therefore gives every proposal and its confidence that any policy would see, and
``replay`` runs a policy (``csd.policy``, the engine's own classes) over them, costing each block
with the machine's cost model (``csd.profile.CostModel``): k draft tokens and a (k + 1)-token verify
pass. What the replay does not model: the rescues of CSD (they change the answer), copies from the
context, and the load of the moment (it uses the cost model's figures, not measured times).

    python -m tools.policy_sim record RESULTS_JSON --out traces.json.gz     # answers of a bench run
    python -m tools.policy_sim record --dataset prose:20 --max-new-tokens 128 --out traces.json.gz   # AR's, made here
    python -m tools.policy_sim replay traces.json.gz --policies auto,1,2,3,4,6 [--floor 3]
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass

from csd.block import DRAFT, Block
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


def record(pair, items: list[dict]) -> list[Trace]:
    """Teacher-force the pair's draft over each item's prompt and answer (``token_ids`` of a bench
    result, with its ``prompt_ids``)."""
    import torch

    from csd.decode import prefill_spans
    lm = pair.draft_lm
    out = []
    with torch.inference_mode():
        for it in items:
            prompt, answer = it["prompt_ids"], it["token_ids"]
            cache = lm.new_cache()
            body = prompt[:-1]
            for a, b in prefill_spans(len(body)):
                lm.forward(cache, body[a:b], 1)
            logits = lm.forward(cache, [prompt[-1]] + answer[:-1], len(answer))   # (n, V')
            q = torch.softmax(logits.float(), -1)
            conf, idx = q.max(-1)
            ids = idx if lm.vocab_ids is None else lm.vocab_ids[idx]
            out.append(Trace(it["dataset"], it["item_id"], list(answer), ids.tolist(), conf.tolist()))
    return out


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


def make_policy(name: str, costs, gamma_max: int = 16, floor: int = 0, fade: float | None = None):
    """"auto" (``AutoGamma``; ``fade``: its evidence's fading, None for the engine's) or a fixed gamma."""
    if name == "auto":
        return AutoGamma(costs, gamma_max, floor) if fade is None else AutoGamma(costs, gamma_max, floor, fade)
    return FixedGamma(int(name))


def table(traces: list[Trace], policies: list[str], costs, floor: int = 0, fade: float | None = None) -> dict:
    """Per dataset and policy: tokens per second of the cost model, tokens per pass, drafted per pass."""
    rows: dict = defaultdict(lambda: defaultdict(list))
    for tr in traces:
        for name in policies:
            r = replay(tr, make_policy(name, costs, floor=floor, fade=fade), costs)
            rows[tr.dataset][name].append(r)
        ar_ms = len(tr.target) * costs.verify(1)
        rows[tr.dataset]["ar"].append({"tokens": len(tr.target), "ms": ar_ms, "passes": len(tr.target),
                                       "drafted": 0})
    out = {}
    for ds, by in rows.items():
        out[ds] = {}
        ar = sum(r["tokens"] for r in by["ar"]) / sum(r["ms"] for r in by["ar"])
        for name, rs in by.items():
            tok = sum(r["tokens"] for r in rs)
            rate = tok / sum(r["ms"] for r in rs)
            out[ds][name] = {"tok_s": 1000 * rate, "x_ar": rate / ar,
                             "tokens_per_pass": tok / sum(r["passes"] for r in rs),
                             "drafted_per_pass": sum(r["drafted"] for r in rs) / sum(r["passes"] for r in rs),
                             "items": len(rs),
                             "median_x_ar": statistics.median(
                                 (r["tokens"] / r["ms"]) / (r["tokens"] / (r["tokens"] * costs.verify(1)))
                                 for r in rs)}
    return out


def save(traces: list[Trace], path: str) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump([tr.__dict__ for tr in traces], f)


def load(path: str) -> list[Trace]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [Trace(**d) for d in json.load(f)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.policy_sim", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="teacher-force the draft over a bench run's answers")
    rec.add_argument("results", nargs="?", help="a bench run's results.json (else --dataset: AR answers made here)")
    rec.add_argument("--method", default="ar", help="whose answers in RESULTS (default ar: the target's own)")
    rec.add_argument("--dataset", default="gsm8k:20,humaneval:20,prose:20", help="items to answer with AR")
    rec.add_argument("--max-new-tokens", type=int, default=128)
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="replay policies over recorded traces")
    rep.add_argument("traces")
    rep.add_argument("--policies", default="auto,1,2,3,4,5,6,8")
    rep.add_argument("--floor", type=int, default=0, help="auto drafts at least this many tokens a block")
    rep.add_argument("--costs", help="a cost model's JSON (a cached profile; default: this machine's, measured once)")
    rep.add_argument("--fade", type=float, default=None, help="auto's fading of idle evidence (default the engine's)")
    args = ap.parse_args(argv)

    from csd.models import load_pair
    from csd.profile import cached_costs
    if args.cmd == "record":
        pair = load_pair()
        if args.results:
            res = json.load(open(args.results, encoding="utf-8"))
            items = [dict(it, prompt_ids=pair.encode_prompt(_prompt(it))) for it in res["items"]
                     if it["method"] == args.method]
        else:
            items = answer(pair, args.dataset, args.max_new_tokens)
        save(record(pair, items), args.out)
        return 0
    if args.costs:
        from csd.costs import CostModel
        costs = CostModel.from_dict(json.load(open(args.costs, encoding="utf-8")))
    else:
        costs = cached_costs(load_pair())
    print(f"costs: draft {costs.draft_ms:.1f} ms/token, verify 1: {costs.verify(1):.1f} ms, "
          f"7: {costs.verify(7):.1f} ms")
    res = table(load(args.traces), args.policies.split(","), costs, args.floor, args.fade)
    for ds, by in res.items():
        print(f"\n{ds} ({by['ar']['items']} answers)")
        for name, r in by.items():
            print(f"  {name:>5}: {r['x_ar']:.3f}x AR  {r['tokens_per_pass']:.2f} tokens/pass  "
                  f"{r['drafted_per_pass']:.2f} drafted/pass")
    return 0


def answer(pair, spec: str, max_new_tokens: int) -> list[dict]:
    """The target's greedy answers (AR) to the benchmark's seeded draw of ``spec``."""
    from csd.config import CSDConfig
    from csd.decode import Decoder
    from csd.evaluation.datasets import item_range, load_dataset
    dec, out = Decoder(pair), []
    for part in spec.split(","):
        name, skip, stop = item_range(part, None)
        for it in load_dataset(name, stop, 0)[skip:]:
            ids = pair.encode_prompt(it.prompt)
            run = dec.run(ids, CSDConfig(method="ar", max_new_tokens=max_new_tokens))
            for _ in run:
                pass
            out.append({"dataset": it.dataset, "item_id": it.item_id, "prompt_ids": ids, "token_ids": run.token_ids})
    return out


def _prompt(item: dict) -> str:
    from csd.evaluation.datasets import get_item
    return get_item(item["dataset"], item["item_id"]).prompt


if __name__ == "__main__":
    raise SystemExit(main())
