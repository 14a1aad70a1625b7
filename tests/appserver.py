"""Start ``python app.py`` on a free local port for the client and browser tests."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(tmp: Path, *extra_args: str):
    """The app with its own SQLite file in ``tmp``; yields its URL once it answers, stops it after."""
    port = free_port()
    log_path = tmp / "app.log"
    log = open(log_path, "w")
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_DISABLE_TELEMETRY="1")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--db", f"sqlite:///{tmp / 'ui.sqlite3'}",
                             *extra_args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if f"running at {url}" in log_path.read_text():   # app.py prints it once launched
                with urllib.request.urlopen(url + "/config", timeout=30) as r:
                    assert r.status == 200
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"app did not start in {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
