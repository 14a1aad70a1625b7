"""A class at once, through the app's API: how many requests are refused, how long each user waits,
and the tokens per second all users get together, with the app serving one generation at a time
(``--concurrency 1``) and with runs decoding together (``--concurrency N``, ``csd.runtime.batch``).
What it sends, measures and checks: docs/users.md, "Measured".

    python -m tools.users --out docs/bench/users [--clients 1,8,20] [--concurrency 1,8] [--tokens 48]
"""
from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from csd.evaluation.datasets import load_dataset
from csd.runtime.profile import machine_name


def cpu_label() -> str:
    """The CPU as the docs name it beside a figure: model, family, AVX-512 or not, cores."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    family = next((ln.split(":")[1].strip() for ln in info.splitlines() if ln.startswith("cpu family")), "?")
    avx = "AVX-512" if " avx512f" in info else "no AVX-512"
    return f"{machine_name()}, family {family}, {avx}"


def prompts(n: int) -> list[str]:
    items = load_dataset("prose") + load_dataset("gsm8k", limit=n)
    return [it.prompt for it in items][:n]


def start_app(out: Path, concurrency: int) -> tuple[subprocess.Popen, str]:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = out / f"users-c{concurrency}.sqlite3"
    db.unlink(missing_ok=True)
    log = open(out / f"app-c{concurrency}.log", "w")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--db", f"sqlite:///{db}",
                             "--concurrency", str(concurrency)], stdout=log, stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parents[1])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited: see {log.name}")
        if f"running at {url}" in Path(log.name).read_text():
            return proc, url
        time.sleep(1)
    proc.kill()
    raise RuntimeError("the app did not start in 10 minutes")


def one_user(url: str, prompt: str, tokens: int, go: threading.Barrier, out: list, gamma: str = "auto") -> None:
    from gradio_client import Client
    client = Client(url, verbose=False)
    go.wait()
    t0 = time.time()
    try:
        fixed = gamma != "auto"         # the page's default: gamma auto (at least 3 a block, "show speculation")
        *_, metrics, _whatif, _status = client.predict(prompt, True, "csd", int(gamma) if fixed else 6, not fixed,
                                                       6, -2, 0, tokens, 0, False,
                                                       api_name="/generate")
        out.append(dict(start=t0, end=time.time(), tokens=metrics["new_tokens"], refused=""))
    except Exception as e:          # noqa: BLE001 - a refusal is a result here
        out.append(dict(start=t0, end=time.time(), tokens=0, refused=str(e)[:200]))


def light_probe(url: str, go: threading.Barrier, stop: threading.Event, out: list) -> None:
    from gradio_client import Client
    client = Client(url, verbose=False)
    go.wait()                       # every client connected: the requests are sent now
    while True:
        t0 = time.perf_counter()
        client.predict(6, -2, False, api_name="/recolour")
        out.append(time.perf_counter() - t0)
        if stop.wait(0.5):
            return


def wave(url: str, texts: list[str], tokens: int, gamma: str = "auto") -> dict:
    done, light, stop = [], [], threading.Event()
    go = threading.Barrier(len(texts) + 1)
    users = [threading.Thread(target=one_user, args=(url, p, tokens, go, done, gamma)) for p in texts]
    probe = threading.Thread(target=light_probe, args=(url, go, stop, light))
    for t in users:
        t.start()
    probe.start()
    for t in users:
        t.join()
    stop.set()
    probe.join()
    ok = [d for d in done if not d["refused"]]
    span = max(d["end"] for d in done) - min(d["start"] for d in done)
    waits = sorted(d["end"] - d["start"] for d in ok)
    return dict(clients=len(texts), refused=len(done) - len(ok), refusals=[d["refused"] for d in done if d["refused"]],
                tokens=sum(d["tokens"] for d in ok), wall_s=round(span, 2),
                tokens_per_s=round(sum(d["tokens"] for d in ok) / span, 2) if span else 0.0,
                wait_s_median=round(statistics.median(waits), 1) if waits else None,
                wait_s_max=round(waits[-1], 1) if waits else None,
                light_s_first=round(light[0], 3) if light else None,
                light_s_median=round(statistics.median(light[1:]), 3) if light[1:] else None,
                light_s_max=round(max(light[1:]), 3) if light[1:] else None, light_calls=len(light),
                light_s=[round(x, 3) for x in light])


def check_store(db: Path, accepted: int) -> dict:
    con = sqlite3.connect(db)
    try:
        runs = con.execute("select count(*) from runs").fetchone()[0]
        integrity = con.execute("pragma integrity_check").fetchone()[0]
    finally:
        con.close()
    return dict(runs_recorded=runs, requests_accepted=accepted, integrity=integrity)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--clients", default="1,8,20", help="requests sent at once, per wave (comma-separated)")
    ap.add_argument("--concurrency", default="1,8", help="the app's --concurrency, per app (comma-separated)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--gamma", default="auto", help="the requests' gamma: auto (the page's default) or a number")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of waves (the client counts interleaved)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    clients = [int(c) for c in args.clients.split(",")]
    texts = prompts(max(clients))
    result = dict(cpu=cpu_label(), machine=platform.machine(), tokens=args.tokens, gamma=args.gamma, apps={})
    for conc in (int(c) for c in args.concurrency.split(",")):
        proc, url = start_app(args.out, conc)
        try:
            waves = [wave(url, texts[:n], args.tokens, args.gamma) for _ in range(args.repeat) for n in clients]
        finally:
            proc.terminate()
            proc.wait(60)
        accepted = sum(w["clients"] - w["refused"] for w in waves)
        result["apps"][str(conc)] = dict(waves=waves, store=check_store(args.out / f"users-c{conc}.sqlite3", accepted))
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "results.md").write_text(report(result))
    print(report(result))


def report(r: dict) -> str:
    lines = [f"# A class at once ({r['cpu']}, {r['tokens']} new tokens a request, γ {r.get('gamma', 'auto')})", "",
             "Each row: the median over rounds (range in brackets); "
             "the ratio is to the median of one client alone.", "",
             "| --concurrency | clients | refused | summed tok/s | vs 1 client | wait median / max (s) "
             "| light call as they arrive (s) | light call while they wait: median / max (s) |",
             "|---:|---:|---:|---:|---:|---|---|---|"]
    for conc, app in r["apps"].items():
        rates = {}
        for w in app["waves"]:
            rates.setdefault(w["clients"], []).append(w["tokens_per_s"])
        base = statistics.median(rates[1]) if 1 in rates else None
        for n, ws in rates.items():
            wn = [w for w in app["waves"] if w["clients"] == n]
            ratio = f"{statistics.median(ws) / base:.2f}x ({min(ws) / base:.2f}-{max(ws) / base:.2f})" if base else ""
            wait = f"{statistics.median(w['wait_s_median'] for w in wn):.1f} / {max(w['wait_s_max'] for w in wn)}"
            light = f"{statistics.median(w['light_s_median'] for w in wn):.3f} / {max(w['light_s_max'] for w in wn)}"
            lines.append(f"| {conc} | {n} | {sum(w['refused'] for w in wn)} | {statistics.median(ws):.1f} "
                         f"({min(ws):.1f}-{max(ws):.1f}) | {ratio} | {wait} | "
                         f"{max(w['light_s_first'] for w in wn)} | {light} |")
        s = app["store"]
        lines.append(f"|  | store | runs {s['runs_recorded']} of {s['requests_accepted']} accepted | "
                     f"integrity {s['integrity']} | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
