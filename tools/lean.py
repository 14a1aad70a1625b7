"""Issue 36's figures, as a newcomer meets them: the app's first start on an empty cache, a later start,
its memory after one Generate and one Compare, the cache on disk, and a command-line answer's first
token once ``python -m csd prepare`` has run (the app measures the costs of the scaling it runs, per
token; the command line runs per pass and measures its own once).

    python -m tools.lean --out DIR [--cache DIR] [--port 7871]

Each step is a fresh process started the way the README says (``python app.py --db none``,
``python -m csd generate``), timed from its start to the line that says it is up (or to the first
character of the answer on stdout); memory is the process's ``VmRSS`` and its peak ``VmHWM``, read
from /proc. The first start uses ``--cache`` (default: a new directory under DIR, removed at the end),
so it really starts from nothing. Run it with the machine to itself. Writes DIR/results.json and
DIR/results.md.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from csd.bench.io import command_line, now, write_json

PROMPT = "Write a Python function that reverses a string."
ROOT = Path(__file__).resolve().parents[1]


def status(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = round(int(line.split()[1]) / 2**20, 2)
    return out


def du(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30, 2)


class Started:
    """A command started in a fresh process, timed until a line of its stdout contains ``until``."""

    def __init__(self, args: list[str], env: dict, until: str, log: Path):
        self.t0 = time.perf_counter()
        self.log = open(log, "w")
        self.p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, bufsize=1)
        self.peak = 0.0
        threading.Thread(target=self._watch, daemon=True).start()
        if until:
            line = ""
            while until not in line:
                line = self.p.stdout.readline()
                if not line and self.p.poll() is not None:
                    raise SystemExit(f"{' '.join(args)} ended before {until!r}: see {log}")
        self.seconds = round(time.perf_counter() - self.t0, 1)

    def _watch(self) -> None:
        while self.p.poll() is None:
            try:
                self.peak = max(self.peak, status(self.p.pid)["VmHWM"])
            except (OSError, KeyError):
                pass
            time.sleep(0.5)

    def first_char(self) -> float:
        self.p.stdout.read(1)
        return round(time.perf_counter() - self.t0, 1)

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()


def app_run(env: dict, port: int, log: Path, use: bool) -> dict:
    app = Started(["app.py", "--db", "none", "--port", str(port)], env, "running at", log)
    out = {"start_to_running_s": app.seconds, "at_start": status(app.p.pid)}
    try:
        if use:
            from gradio_client import Client
            client = Client(f"http://127.0.0.1:{port}", verbose=False)
            t0 = time.perf_counter()
            client.predict(prompt=PROMPT, max_new_tokens=64, api_name="/generate")
            out["generate_s"] = round(time.perf_counter() - t0, 1)
            t0 = time.perf_counter()
            client.predict(prompt=PROMPT, max_new_tokens=64, api_name="/compare")
            out["compare_s"] = round(time.perf_counter() - t0, 1)
            out["after_generate_and_compare"] = status(app.p.pid)
    finally:
        out["peak_gib"] = max(app.peak, status(app.p.pid)["VmHWM"]) if app.p.poll() is None else app.peak
        app.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.lean", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=None, help="the cache directory to start from (default: a new, empty one)")
    ap.add_argument("--port", type=int, default=7871)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache) if args.cache else out / "cache"
    fresh = args.cache is None
    if fresh:
        shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "CSD_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    from csd.profile import machine_name
    res = {"meta": {"command": command_line("tools.lean"), "machine": machine_name(), "at": now(),
                    "empty_cache_at_first_start": fresh}}
    try:
        res["first_start"] = app_run(env, args.port, out / "first-start.log", use=False)
        res["cache_gib"] = du(cache)
        res["later_start"] = app_run(env, args.port, out / "later-start.log", use=True)
        prep = Started(["-m", "csd", "prepare"], env, "", out / "prepare.log")   # the command line's own profile
        prep.p.wait(600)
        res["prepare_after_app_s"] = round(time.perf_counter() - prep.t0, 1)
        prep.stop()
        gen = Started(["-m", "csd", "generate", "--prompt", PROMPT, "--max-new-tokens", "32", "--no-db"], env, "",
                      out / "generate.log")
        res["generate"] = {"first_token_s": gen.first_char()}
        gen.p.wait(600)
        res["generate"] |= {"total_s": round(time.perf_counter() - gen.t0, 1), "peak_gib": gen.peak}
        gen.stop()
    finally:
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)
    res["meta"]["finished_at"] = now()
    write_json(out / "results.json", res)
    first, later, g = res["first_start"], res["later_start"], res["generate"]
    md = [f"# The lean figures ({res['meta']['machine']}, {res['meta']['at']})", "",
          f"`{res['meta']['command']}`", "",
          "| figure | measured |", "|---|---:|",
          f"| `python app.py`, empty cache, to \"running at\" | {first['start_to_running_s']:.0f} s |",
          f"| its peak resident memory | {first['peak_gib']:.2f} GB |",
          f"| model cache on disk | {res['cache_gib']:.2f} GB |",
          f"| `python app.py`, later start, to \"running at\" | {later['start_to_running_s']:.0f} s |",
          f"| resident after one Generate and one Compare (64 tokens) | "
          f"{later['after_generate_and_compare']['VmRSS']:.2f} GB |",
          f"| peak resident, later start through Generate and Compare | {later['peak_gib']:.2f} GB |",
          f"| `python -m csd prepare` after that (the command line's per-pass profile) | "
          f"{res['prepare_after_app_s']:.0f} s |",
          f"| `python -m csd generate`, warm cache, to its first token | {g['first_token_s']:.0f} s |",
          f"| its peak resident memory | {g['peak_gib']:.2f} GB |", ""]
    (out / "results.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
