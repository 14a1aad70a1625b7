"""The synthetic benchmark's figures: one ``Measured`` per method and prompt, the summary per method
(``csd.bench.results``'s key names where the meaning is the same) and the printed table."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby

from csd.representation import Representation

from ..io import fmt, md_table, ratio
from ..stats import speedup


@dataclass
class Measured:
    """One method on one prompt: the counted run (the last attempt)."""
    method: str
    prompt: int
    wall_s: float
    new_tokens: int
    target_passes: int
    draft_passes: int
    drafted: int
    decided: int                     # draft positions the target decided on (not discarded after a rejection)
    accepted: int
    rescued: int
    host_syncs: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float
    host_s: float = 0.0              # the run's time outside its passes, prefill and transfers: the host alone
                                     # (GPU idle)
    attempts: int = 1                # runs until the script's fixed point (1: the first run followed its script)
    fixed_point: bool = True         # the counted run followed its script (its acceptance is the requested one)
    identical_to_ar: bool | None = None
    peak_bytes: int | None = None    # CUDA: torch.cuda.max_memory_allocated during this run
    token_ids: list = field(default_factory=list)


def summarize(rs: list[Measured], ar: list[Measured]) -> dict:
    """One method over the prompts (``ar``: AR's records on the same prompts)."""
    wall, tokens = sum(r.wall_s for r in rs), sum(r.new_tokens for r in rs)
    passes, drafted, decided = sum(r.target_passes for r in rs), sum(r.drafted for r in rs), sum(r.decided for r in rs)
    kept = sum(r.accepted + r.rescued for r in rs)
    by_prompt = sorted(ar, key=lambda r: r.prompt)        # paired with AR's record of the same prompt
    value, ci = (speedup([(r.new_tokens, r.wall_s, a.new_tokens, a.wall_s)
                          for r, a in zip(sorted(rs, key=lambda r: r.prompt), by_prompt)]) if ar else (None, None))
    peaks = [r.peak_bytes for r in rs if r.peak_bytes is not None]
    return {
        "n": len(rs), "new_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else None,
        "speedup_over_ar": value, "speedup_over_ar_ci95": None if rs and rs[0].method == "ar" else ci,
        "target_passes": passes, "mean_accepted_length": tokens / passes if passes else None,
        "draft_passes": sum(r.draft_passes for r in rs), "drafted": drafted, "decided": decided,
        "accepted": sum(r.accepted for r in rs), "rescued": sum(r.rescued for r in rs),
        "acceptance": kept / decided if decided else None,
        "acceptance_rate": kept / drafted if drafted else None,
        "host_syncs": sum(r.host_syncs for r in rs), "syncs_per_block": sum(r.host_syncs for r in rs) / passes
        if passes else None,
        "draft_s": sum(r.draft_s for r in rs), "verify_s": sum(r.verify_s for r in rs),
        "bookkeeping_share": sum(r.bookkeeping_s for r in rs) / wall if wall > 0 else None,
        "host_ms_per_block": 1000 * sum(r.host_s for r in rs) / passes if passes else None,
        "identical_to_ar": sum(bool(r.identical_to_ar) for r in rs),
        "fixed_point": sum(r.fixed_point for r in rs), "attempts": sum(r.attempts for r in rs),
        "peak_memory_bytes": max(peaks) if peaks else None,
    }


def output_stats(outputs: list[list[int]]) -> dict:
    """Is the target's greedy output degenerate? Distinct-token share and the longest run of one token."""
    longest = max((len(list(run)) for t in outputs for _, run in groupby(t)), default=0)
    shares = [len(set(t)) / len(t) for t in outputs if t]
    return {"distinct_share": sum(shares) / len(shares) if shares else None,
            "longest_run": longest, "sample": outputs[0][:24] if outputs else []}


def render_markdown(res: dict) -> str:
    meta, cfg = res["meta"], res["meta"]["config"]
    (dataset, stats), = res["summary"].items()
    models = meta["models"]
    rep = Representation.of(models)
    lines = [f"## Synthetic benchmark `{dataset}` (random weights) on {meta['machine']['name']}", "",
             f"draft {models['draft']} ({models['draft_impl']}, {rep.draft}) -> target {models['target']} "
             f"({rep.target}); {models.get('engine', 'eager')} engine; torch {meta['machine']['torch']}, "
             f"{meta['machine']['torch_threads']} threads; "
             f"{cfg['prompts']} prompts of {cfg['prompt_tokens']} tokens x {cfg['max_new_tokens']} new tokens; "
             f"gamma {cfg['gamma']}; requested acceptance {cfg['acceptance']:.2f}", "",
             "| method | tokens/s | x AR (tok/s, 95% interval over prompts) | target passes | tokens/pass | acceptance "
             "| kept/drafted | rescued | syncs/block | fixed point | peak memory (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, s in stats.items():
        peak = s["peak_memory_bytes"] / 2**20 if s["peak_memory_bytes"] else res["peak_memory"]["mib"]
        lines.append(f"| {m} | {fmt(s['tokens_per_s'], '.1f', none='-')} | {ratio(s, 'speedup_over_ar', none='-')} "
                     f"| {s['target_passes']} | {fmt(s['mean_accepted_length'], none='-')} "
                     f"| {fmt(s['acceptance'], none='-')} | {fmt(s['acceptance_rate'], none='-')} "
                     f"| {s['rescued'] if m != 'ar' else '-'} | {fmt(s['syncs_per_block'], none='-')} "
                     f"| {s['fixed_point']}/{s['n']} | {peak:.0f} |")
    lines += ["", "Target pass time by tokens per pass (a block of gamma draft tokens is a pass of gamma + 1):", "",
              *md_table(["tokens", *res["verify_ms"]], [["ms", *(f"{v:.2f}" for v in res["verify_ms"].values())]]), "",
              f"Draft: {res['draft_ms']:.2f} ms per token. Ideal speed-up bound (every draft accepted): "
              + ", ".join(f"gamma {g}: {b:.2f}x" for g, b in res["bound"].items()) + ".", ""]
    c = res["sd_equals_ar"]
    verdict = {True: "PASSED", False: "FAILED", None: "not an exact representation"}[c["passed"]]
    lines.append(f"Greedy SD == AR ({c['dtype']}, {c.get('source', 'separate check')}"
                 f"{', ' + c['engine'] + ' engine' if c.get('engine') else ''}): {c['identical']}/{c['prompts']} "
                 f"prompts identical over {c['tokens']} tokens: {verdict}.")
    host = {m: s["host_ms_per_block"] for m, s in stats.items() if s.get("host_ms_per_block") is not None}
    if host:
        lines.append("Host alone per target pass (the rule, the events, the policy: the run's time outside its passes, "
                     "prefill and transfers; on a GPU the device idles then): "
                     + ", ".join(f"{m} {v:.3f} ms" for m, v in host.items()) + ".")
    for m, s in res.get("syncs", {}).items():
        if "error" in s:
            lines.append(f"CUDA syncs ({m}): not counted ({s['error']}).")
        else:
            lines.append(f"CUDA synchronising calls ({m}, torch sync debug mode): {s['cuda_syncs']} over "
                         f"{s['target_passes']} target passes = {s['cuda_syncs_per_block']:.2f} per block "
                         f"(engine's own count: {s['engine_host_syncs']}).")
    misses = {m: s["n"] - s["fixed_point"] for m, s in stats.items() if s["fixed_point"] < s["n"]}
    if misses:
        which = ", ".join(f"{m} on {k} prompt(s)" for m, k in misses.items())
        lines.append(f"WARNING: {which} did not follow its script "
                     f"after {cfg['rehearsals']} reruns: acceptance there is below the requested one (in "
                     f"{rep.target} the target's top-1 changed with the composition of its verify pass).")
    o = res["outputs"]
    lines += [f"Peak memory: {res['peak_memory']['mib']:.0f} MiB ({res['peak_memory']['kind']}). Target outputs: "
              f"{fmt(o['distinct_share'], none='-')} distinct-token share, "
              f"longest run of one token {o['longest_run']}.", ""]
    return "\n".join(lines)
