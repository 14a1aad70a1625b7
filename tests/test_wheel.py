"""The package as it installs: a wheel built from the sources that pyproject.toml names puts only
``csd`` and ``csd_app`` into site-packages and, installed into a fresh virtual environment, runs
``csd`` from a directory outside the repository.

Nothing is downloaded: the wheel is built without build isolation and installed with ``--no-index``.
The build needs the setuptools that pyproject.toml requires: a new venv of Python 3.11 carries an
older one, so inside a venv that lacks it the base interpreter builds the wheel. The environment the
wheel goes into sees the packages of the interpreter running the tests (torch, transformers and the
embedded weights' part packages): ``--system-site-packages`` shows it the base interpreter's, and when
the tests run in a virtual environment, a ``.pth`` file adds that environment's site-packages too. The
wheel goes in with ``--no-deps`` and the test checks its own requirements (Requires-Dist) against what
the environment sees, fetching nothing: pip's resolver would also judge the other packages' needs (a
venv's own older setuptools fails torch's), which is the environment's business, not the wheel's. The real pair must
be prepared in the user cache (``python -m csd prepare``), as for the other real-model tests."""
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
# run in the new venv outside the repository: where the packages come from, which bare names it
# offers, and which of the wheel's requirements it does not meet
PROBE = """
import importlib, importlib.metadata as meta, importlib.util, json, sys
from packaging.requirements import Requirement
unmet = []
for r in map(Requirement, meta.requires("csd-explorer") or []):
    if r.marker is None or r.marker.evaluate({"extra": ""}):
        try:
            have = meta.version(r.name)
        except meta.PackageNotFoundError:
            have = None
        if have is None or not r.specifier.contains(have, prereleases=True):
            unmet.append(f"{r} (found {have})")
print(json.dumps({"files": [importlib.import_module(m).__file__ for m in sys.argv[1].split(",")],
                  "bare": [n for n in sys.argv[2].split(",") if importlib.util.find_spec(n)], "unmet": unmet}))
"""


def run(cmd: list, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    command = " ".join(map(str, cmd))
    assert out.returncode == 0, f"{command} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
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
    # pip checks build-system.requires against the interpreter's packages: the first that has them builds
    for py in dict.fromkeys((sys.executable, getattr(sys, "_base_executable", sys.executable))):
        cmd = [py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--check-build-dependencies",
               "--no-index", "-q", src, "-w", tmp / "dist"]
        out = subprocess.run([str(c) for c in cmd], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        if out.returncode == 0:
            wheel, = (tmp / "dist").glob("csd_explorer-*.whl")
            return wheel
    raise AssertionError(f"the wheel did not build (the last try: {py}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def make_venv(venv: Path, env: dict) -> Path:
    """A venv without its own pip that sees this interpreter's packages (and its pip); returns its python."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], venv.parent, env)
    py = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # the tests run in a venv: --system-site-packages shows the new one the base interpreter's
        # packages only, so list this venv's site-packages in a .pth file of the new one (as plain paths:
        # the .pth files there do not run, so an editable install of this checkout cannot shadow the wheel)
        inner = run([py, "-c", "import site; print(site.getsitepackages()[0])"], venv.parent, env).stdout.strip()
        Path(inner, "outer_site.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    return py


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built once for both tests: they check the same build (its contents, then its install)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"), clean_env())


def test_the_wheel_holds_only_csd_and_csd_app(wheel):
    """Every top-level name the wheel puts into site-packages is ``csd`` or ``csd_app.py``; the store,
    the app, the command line, the benchmark and the evaluation travel inside ``csd``."""
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
    top = {n.split("/")[0] for n in names} - {n.split("/")[0] for n in names if ".dist-info/" in n}
    assert top == {"csd", "csd_app.py"}, f"the wheel adds other top-level names: {sorted(top)}"
    for part in PARTS:
        assert f"{part.replace('.', '/')}/__init__.py" in names, f"{part} is missing from the wheel"
    # the store upgrades its schema from the migrations at open: they ship as package data
    assert {"csd/db/migrations/env.py", "csd/db/migrations/script.py.mako"} <= set(names)
    assert any(n.startswith("csd/db/migrations/versions/") and n.endswith(".py") for n in names)


@pytest.mark.slow            # builds and installs a wheel, then loads the real pair in a subprocess
def test_the_wheel_installs_and_runs_outside_the_repository(wheel, tmp_path):
    env = clean_env()
    py = make_venv(tmp_path / "venv", env)
    bindir = py.parent
    run([py, "-m", "pip", "install", "--no-index", "--no-deps", "-q", wheel], tmp_path, env)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    found = json.loads(run([py, "-c", PROBE, ",".join(("csd", "csd_app", *PARTS)), ",".join(BARE)], outside,
                           env).stdout.strip().splitlines()[-1])
    assert found["unmet"] == [], f"the environment lacks what the wheel requires: {found['unmet']}"
    venv = tmp_path / "venv"
    assert [f for f in found["files"] if not Path(f).is_relative_to(venv)] == [], "imported from outside the wheel"
    assert found["bare"] == [], f"the install (or its path) offers bare top-level names: {found['bare']}"
    for name in ("csd", "csd-app"):
        out = run([bindir / name, "--help"], outside, env, timeout=120)
        assert out.stdout.strip().startswith("usage:")
    out = run([bindir / "csd", "generate", "--prompt", "hi", "--max-new-tokens", "8", "--no-db"], outside, env)
    assert out.stdout.strip(), f"no text came out:\n{out.stderr[-2000:]}"
