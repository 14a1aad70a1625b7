"""The app's first minute, measured through its API: with only a prompt and max_new_tokens set (every
other control at the page's default), do /generate and /compare show speculation, i.e. at least
1.5 tokens per target pass for SD and CSD, on a word problem, code and prose, while another process
keeps one core busy? (Issue 28's check; a machine that is also running other work is the case the
"Show speculation" default is for.)

    python app.py --db none &          # the app as a newcomer starts it
    python -m csd.ui.app_check --url http://127.0.0.1:7860 --out DIR [--max-new-tokens 64] [--no-busy]

Writes DIR/results.json (the figures, the machine, the command) and prints a table; exits 1 when a
figure is under the goal.
"""
from __future__ import annotations

import argparse
import contextlib
import html
import multiprocessing as mp
import re
import time
from pathlib import Path

from csd.bench.io import command_line, now, write_json

from .tabs.page import EXAMPLES

PROMPTS = {   # the app's own examples: GSM8K item 1, HumanEval/0 and a prose request
    "word problem": 0, "code": 1, "prose": 2,
}
GOAL = 1.5    # tokens per target pass


def _spin(stop) -> None:
    """Keep one core busy until told to stop."""
    x = 0
    while not stop.is_set():
        x = (x * 1103515245 + 12345) % 2147483648


@contextlib.contextmanager
def busy_core(on: bool = True):
    if not on:
        yield
        return
    stop = mp.Event()
    p = mp.Process(target=_spin, args=(stop,), daemon=True)
    p.start()
    try:
        yield
    finally:
        stop.set()
        p.join(5)


def _caption_passes(caption: str) -> tuple[int, int]:
    """(target passes, tokens) from a Compare caption such as "**SD**: 23 target passes (**41 saved**) for 64 tokens"."""
    m = re.search(r"(\d+) target passes.*? for (\d+) tokens", caption)
    if not m:
        raise ValueError(f"no passes in the caption {caption!r}")
    return int(m.group(1)), int(m.group(2))


def check(url: str, max_new_tokens: int, busy: bool) -> list[dict]:
    from gradio_client import Client

    client = Client(url, verbose=False)
    rows = []
    with busy_core(busy):
        for kind, i in PROMPTS.items():
            prompt = EXAMPLES[i]
            for method in ("sd", "csd"):
                t0 = time.perf_counter()
                out = client.predict(prompt=prompt, method=method, max_new_tokens=max_new_tokens,
                                     api_name="/generate")
                m = out[3]
                rows.append(dict(kind=kind, endpoint="/generate", method=method, tokens=m["new_tokens"],
                                 target_passes=m["target_forwards"], drafted=m["drafted"],
                                 tokens_per_pass=m["new_tokens"] / m["target_forwards"],
                                 tokens_per_s=m["new_tokens"] / m["wall_s"], wall_s=time.perf_counter() - t0,
                                 status=html.unescape(re.sub(r"<[^>]+>", "", out[5])).strip()))
            out = client.predict(prompt=EXAMPLES[i], max_new_tokens=max_new_tokens, api_name="/compare")
            captions = dict(zip(("ar", "sd", "csd"), out[3:6]))
            for method in ("sd", "csd"):
                passes, tokens = _caption_passes(captions[method])
                rows.append(dict(kind=kind, endpoint="/compare", method=method, tokens=tokens,
                                 target_passes=passes, tokens_per_pass=tokens / passes,
                                 caption=html.unescape(re.sub(r"<[^>]+>", "", captions[method]))))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csd.ui.app_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--url", default="http://127.0.0.1:7860", help="the running app (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--no-busy", dest="busy", action="store_false", help="leave both cores to the app")
    args = ap.parse_args(argv)
    from csd.profile import machine_name
    meta = dict(command=command_line("csd.ui.app_check"), started_at=now(), machine=machine_name(), busy_core=args.busy,
                max_new_tokens=args.max_new_tokens, goal_tokens_per_pass=GOAL)
    rows = check(args.url, args.max_new_tokens, args.busy)
    meta["finished_at"] = now()
    ok = all(r["tokens_per_pass"] >= GOAL for r in rows)
    write_json(Path(args.out) / "results.json", dict(meta=meta, rows=rows, goal_met=ok))
    print("| prompt | endpoint | method | tokens | target passes | tokens / pass |\n|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kind']} | {r['endpoint']} | {r['method']} | {r['tokens']} | {r['target_passes']} | "
              f"{r['tokens_per_pass']:.2f} |")
    print(f"goal (>= {GOAL} tokens per pass everywhere): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
