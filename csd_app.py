"""CSD Explorer web app: ``csd-app`` (installed) or ``python app.py`` serves it on http://127.0.0.1:7860.

Parses the options, opens the store, loads the pair, builds the app and launches it; a module above ``ui`` so
that the environment below is set before ``ui`` imports gradio and huggingface_hub."""
from __future__ import annotations

import os

# Before gradio / huggingface_hub are imported: no telemetry, no update checks.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import argparse
import logging
import sys
import time

# generations at once where runs decode together: 8 users at once gave 1.42x one user's tokens per
# second through the app's API (docs/users.md), against 1.01x one at a time
BATCHED_CONCURRENCY = 8


def parse_args(argv=None) -> argparse.Namespace:
    prog = "csd-app" if os.path.basename(sys.argv[0]) == "csd-app" else "python app.py"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    env = os.environ     # a host that runs the app for you (a Hugging Face Space) sets these two
    ap.add_argument("--host", default=env.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                    help="address to listen on (default 127.0.0.1, or $GRADIO_SERVER_NAME)")
    ap.add_argument("--port", type=int, default=int(env.get("GRADIO_SERVER_PORT", 7860)),
                    help="port (default 7860, or $GRADIO_SERVER_PORT)")
    ap.add_argument("--db", metavar="URL|FILE", default=None,
                    help="SQLAlchemy database URL or a SQLite file's path (default: $CSD_DB_URL, else a SQLite file "
                         "in the user data dir); 'none' runs without recording")
    from csd.cli.common import add_model_args
    add_model_args(ap, store=False)     # the command line's model options, the same flags and defaults
    # except one: the app teaches what SD keeps of the target's answer, so its int8 target is the exact one
    # (activations per token: SD writes AR's tokens), at 7-17% more time a pass (docs/exactness.md)
    ap.set_defaults(activations="row")
    ap.add_argument("--queue-size", type=int, default=64,
                    help="requests waiting in the queue at most (default 64: a class of 20, each with a run and a "
                         "light event waiting)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="generations running at once; above 1 they decode together, one draft step and one verify "
                         f"pass serving several users (docs/users.md). Default {BATCHED_CONCURRENCY} where runs can "
                         "decode together (the lean path, eager), else 1")
    ap.add_argument("--max-prompt-tokens", type=int, default=2048, metavar="N",
                    help="longest prompt accepted, in tokens (default 2048): a long prompt holds the model for "
                         "everyone while it is read")
    ap.add_argument("--no-shared-scope", dest="shared_scope", action="store_false",
                    help="hide the 'all runs' scope (every user's answers) in Analyse and Explore, e.g. for a "
                         "public demo; users then see their own runs only (the default on a Hugging Face Space, "
                         "unless CSD_SHARED_SCOPE=1)")
    args = ap.parse_args(argv)
    if os.environ.get("SPACE_ID") and os.environ.get("CSD_SHARED_SCOPE") != "1":   # a Hugging Face Space
        args.shared_scope = False        # a public demo: strangers do not see each other's prompts
    if not 1 <= args.port <= 65535:
        ap.error("--port must be in 1..65535")
    if args.queue_size < 1 or (args.concurrency is not None and args.concurrency < 1):
        ap.error("--queue-size and --concurrency must be at least 1")
    if args.max_prompt_tokens < 1:
        ap.error("--max-prompt-tokens must be at least 1")
    return args


def configure_logging() -> None:
    """One line per record on stderr: ``csd`` (with ``csd.ui``, ``csd.db``) from INFO, other libraries from WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("csd").setLevel(logging.INFO)


def concurrency_for(requested: int | None, pair) -> int:
    """As asked, else ``BATCHED_CONCURRENCY`` where this pair's runs decode together (lean path, eager), else 1."""
    if requested is not None:
        return requested
    from csd.runtime.batch import can_batch
    from csd.runtime.static import STATIC_ENGINES
    return BATCHED_CONCURRENCY if can_batch(pair) and pair.describe()["engine"] not in STATIC_ENGINES else 1


class ConsoleProgress:
    """Model preparation progress on stderr, at most a line a second per stage."""

    def __init__(self):
        self.last = ("", 0.0)

    def __call__(self, msg: str, frac: float) -> None:
        now = time.monotonic()
        if msg != self.last[0] or now - self.last[1] >= 1.0 or frac >= 1.0:
            print(f"[{100 * frac:5.1f}%] {msg}", file=sys.stderr, flush=True)
            self.last = (msg, now)


def main(argv=None) -> int:
    args = parse_args(argv)
    configure_logging()
    from csd.cli.common import (
        app_draft_weights,
        app_solo_draft,
        choose_draft,
        choose_target,
        load_from_args,
        open_store,
    )
    from csd.db.store import StoreOpenError
    from csd.runtime.pair import ModelLoadError
    from csd.runtime.static import STATIC_ENGINES
    from csd.ui import Settings, build_demo, launch_kwargs, make_services

    try:       # the store first: a database that cannot be opened costs seconds, not a model load
        store = open_store(args)
    except StoreOpenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("CSD Explorer: loading models…", file=sys.stderr, flush=True)
    try:
        choose_draft(args, ConsoleProgress())      # one run at a time: int8, ort4, gguf or q4_0, the fastest here
        choose_target(args, ConsoleProgress())     # int8 or the GGUF's own blocks (kept loaded for the pair below)
        asked, args.draft_weights = args.draft_weights, app_draft_weights(args, args.concurrency)
        pair = load_from_args(args, progress=ConsoleProgress())
        args.concurrency = concurrency_for(args.concurrency, pair)
        solo = app_solo_draft(args, asked, pair, ConsoleProgress()) if args.concurrency > 1 else None
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    static = pair.describe()["engine"] in STATIC_ENGINES
    if static and args.concurrency > 1:
        print("error: the static engine (the default on a GPU) holds one KV cache per model and serves one "
              "generation at a time (the others wait in the queue): use --concurrency 1, or --engine eager",
              file=sys.stderr)
        return 2
    if pair.draft_lm is not None:   # gamma "auto" needs this machine's costs: measure them now, not in a request
        from csd.runtime.profile import cached_costs, costs_cached
        if not costs_cached(pair):
            print("CSD Explorer: measuring this machine once (about a minute)…", file=sys.stderr, flush=True)
        costs = cached_costs(pair, progress=ConsoleProgress())
        if solo is not None:        # a run alone drafts with it (csd.runtime.batch): its costs too, the same target's
            cached_costs(solo, progress=ConsoleProgress(), target_of=costs)
    services = make_services(pair, store, Settings(queue_size=args.queue_size, concurrency=args.concurrency,
                                                   max_prompt_tokens=args.max_prompt_tokens,
                                                   shared_scope=args.shared_scope), solo=solo)
    from csd.runtime import threads
    if services.batcher is not None:
        threads.one_core()      # the batcher's thread has the cores; this one's workers end (csd.runtime.threads)
    else:
        threads.hand_back()     # the request thread that decodes holds the only team of workers
    demo = build_demo(services)
    demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True, quiet=True,
                **launch_kwargs())
    print(f"CSD Explorer running at http://{args.host}:{args.port}", flush=True)
    try:
        demo.block_thread()
    finally:
        if services.batcher is not None:
            services.batcher.close()        # the model thread ends with the app, its waiting calls served
        if store is not None:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
