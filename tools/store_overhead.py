"""Logging overhead: what recording costs the decode loop (the issue allows 1%).

    python -m tools.store_overhead --decode-ms 25 [--events 20000] [--tokens 400] [--db URL]

1. ``RunRecorder.add`` in the caller thread: the time of N adds, per event in microseconds, and as
   a share of the given per-token decode time (one event per token; a rejection adds a second).
2. End to end: a simulated decode loop that spins ``--decode-ms`` per token holding the GIL (the
   worst case for the background writer, which then competes for it), with and without recording.
   Real decoding spends most of its time in torch kernels that release the GIL, so it fares better.

Measure the per-token decode time on the real models (e.g. wall_s / new_tokens of a run) and pass it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from csd.db.models import Run
from csd.db.store import Store
from csd.events import ACCEPTED, RULE_MATCH, TokenEvent


def make_event(i: int) -> TokenEvent:
    return TokenEvent(position=i, token_id=i % 32000, text=f" tok{i}", status=ACCEPTED, block=i // 7,
                      index_in_block=i % 7, draft_id=i % 32000, draft_text=f" tok{i}", target_id=i % 32000,
                      target_text=f" tok{i}", draft_logit=12.5, target_logit=12.5, gap=0.0, memory_count=3,
                      rule=RULE_MATCH, draft_prob=0.9, target_prob=0.8)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def decode_loop(store: Store | None, n_tokens: int, decode_s: float) -> float:
    run_id = store.start_run(kind="bench", label="bench_overhead") if store else None
    rec = store.recorder(run_id) if store else None
    t0 = time.perf_counter()
    for i in range(n_tokens):
        spin(decode_s)
        if rec:
            rec.add(make_event(i))
    wall = time.perf_counter() - t0
    if rec:
        rec.finish()
    return wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-ms", type=float, required=True, help="per-token decode time of the real models")
    ap.add_argument("--events", type=int, default=20_000, help="adds timed in part 1")
    ap.add_argument("--tokens", type=int, default=400, help="tokens of the simulated loop in part 2 (0: skip)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each arm in part 2")
    ap.add_argument("--db", help="SQLAlchemy URL (default: a temp SQLite file)")
    args = ap.parse_args(argv)
    decode_s = args.decode_ms / 1e3

    with tempfile.TemporaryDirectory() as tmp, Store.open(args.db or f"sqlite:///{tmp}/bench.sqlite3") as store:
        run_ids = []
        # 1. the caller's cost of add (the events are built beforehand: the engine builds them anyway)
        per_event = []
        for _ in range(5):
            events = [make_event(i) for i in range(args.events)]
            run_ids.append(store.start_run(kind="bench", label="bench_overhead"))
            rec = store.recorder(run_ids[-1])
            t0 = time.perf_counter()
            for e in events:
                rec.add(e)
            per_event.append((time.perf_counter() - t0) / args.events)
            rec.finish()
        add_us = statistics.median(per_event) * 1e6
        print(f"{store!r}")
        print(f"recorder.add: {add_us:.2f} us per event (median of 5 x {args.events:,}); "
              f"{add_us / (args.decode_ms * 1e3):.4%} of a {args.decode_ms:g} ms token "
              f"({2 * add_us / (args.decode_ms * 1e3):.4%} with two events per token)")

        # 2. end to end, the writer thread competing for the GIL with a spinning decode loop
        if args.tokens:
            base, logged = [], []
            for _ in range(args.repeat):      # interleaved, best of each: robust to a busy machine
                base.append(decode_loop(None, args.tokens, decode_s))
                logged.append(decode_loop(store, args.tokens, decode_s))
            print(f"simulated decode loop, {args.tokens} tokens x {args.decode_ms:g} ms (GIL held), best of "
                  f"{args.repeat}: {min(base):.3f} s without, {min(logged):.3f} s with recording: "
                  f"{(min(logged) - min(base)) / min(base):+.2%}")
        with store.write_session() as s, s.begin():
            for run in s.query(Run).filter(Run.label == "bench_overhead"):
                s.delete(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
