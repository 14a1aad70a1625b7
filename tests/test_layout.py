"""The one-way layers: ui -> cli -> (csd, db, bench); the engine never loads the store, the UI or the
plotting stack, the store never loads torch. Checked in fresh interpreters (what an import really
pulls in) and on the sources (what a lazy import inside a function would pull in later). Every
import uses the installed names (``csd.db``, ``csd.ui``, ...): the wheel has no top-level ``db``."""
import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the installed packages and the checkout folder each lives in (pyproject.toml's package-dir maps them)
PACKAGES = {"csd": "csd", "csd.db": "db", "csd.ui": "ui", "csd.cli": "cli", "csd.bench": "bench",
            "csd.evaluation": "evaluation"}
BARE = {"ui", "db", "cli", "bench", "evaluation", "tools"}     # checkout folders, never top-level imports
SKIP = {".git", ".venv", "node_modules"}

# walks the package's own folder
PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module({pkg!r})
for m in pkgutil.walk_packages(pkg.__path__[:1], {pkg!r} + "."):
    if m.name.split(".")[-1] != "__main__" and ".migrations" not in m.name:
        importlib.import_module(m.name)
print(json.dumps(sorted(n for n in {forbidden!r} if n in sys.modules)))
"""


def loaded(pkg: str, forbidden: tuple[str, ...]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(pkg=pkg, forbidden=forbidden)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow            # fresh interpreters importing torch: about 6 s each
def test_importing_the_engine_loads_no_store_ui_or_plotting():
    assert loaded("csd", ("sqlalchemy", "alembic", "gradio", "plotly", "csd.ui", "csd.db", "csd.bench",
                          "csd.cli", *BARE)) == []


@pytest.mark.slow
def test_importing_the_store_loads_no_torch_and_no_ui():
    assert loaded("csd.db", ("torch", "transformers", "gradio", "plotly", "csd.ui", "csd.bench", "csd.cli",
                             *BARE)) == []


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every absolute import in a file, the ones inside functions included
    (``from a.b import c`` gives ``a.b`` and ``a.b.c``: c may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def hits(names: set[str], never: set[str]) -> list[str]:
    """The names that are, or lie inside, one of ``never``."""
    return sorted(n for n in names if any(n == x or n.startswith(x + ".") for x in never))


def offenders(files, never: set[str]) -> dict:
    found = {str(p.relative_to(ROOT)): hits(imported_modules(p), never) for p in files}
    return {k: v for k, v in found.items() if v}


def package_files(package: str) -> list[Path]:
    # csd/__main__.py is the `python -m csd` entry point: it hands over to the command line, and no
    # engine module imports it
    return [p for p in (ROOT / PACKAGES[package]).rglob("*.py") if p.relative_to(ROOT) != Path("csd/__main__.py")]


def installed_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / PACKAGES[pkg]).rglob("*.py")] + [ROOT / "csd_app.py"]


@pytest.mark.parametrize("package, never", [
    ("csd", {"csd.db", "csd.ui", "csd.bench", "csd.cli", "sqlalchemy", "alembic", "gradio", "plotly"}),
    ("csd.db", {"csd.ui", "csd.bench", "csd.cli", "torch", "transformers", "gradio", "plotly"}),
    ("csd.bench", {"csd.ui", "csd.cli", "gradio"}),
])
def test_no_source_file_imports_against_the_layers(package, never):
    assert offenders(package_files(package), never) == {}


def test_nothing_imports_a_checkout_folder_by_its_bare_name():
    """``import ui`` / ``from db...`` work only in a checkout; the wheel installs them inside csd. Only the
    tests (and the one-off scripts beside them) may import ``tools``, which is never installed."""
    files = [p for p in ROOT.rglob("*.py") if not SKIP & set(p.relative_to(ROOT).parts)]
    script = {"tests", "tools", "docs"}          # checkout-only code: runs from the repository root
    assert offenders((p for p in files if p.relative_to(ROOT).parts[0] in script), BARE - {"tools"}) == {}
    assert offenders((p for p in files if p.relative_to(ROOT).parts[0] not in script), BARE) == {}


def test_one_name_per_module():
    """The checkout's folders are reached through pyproject.toml's package-dir, as the wheel's are (the set-up's
    editable install), never by a path edit: csd's path is its own folder, and the root is not inside csd."""
    import csd
    import csd.ui
    assert list(csd.__path__) == [str(ROOT / "csd")] and Path(csd.ui.__file__).parent == ROOT / "ui"
    assert importlib.util.find_spec("csd.csd_app") is None and importlib.util.find_spec("csd.tests") is None


def test_installed_packages_never_import_tools():
    assert offenders(installed_files(), {"tools"}) == {}


def runtime_imports(path: Path) -> list[str]:
    """Every import of ``csd.runtime`` (or ``.runtime`` from inside csd) in a file, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "csd.runtime" or a.name.startswith("csd.runtime.")]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.level == 0 and module != "csd":          # csd.runtime..., not csd.rule
                found += [module] if module == "csd.runtime" or module.startswith("csd.runtime.") else []
            elif node.level == 1 and node.module:            # from .runtime.lm import ...
                found += [module] if node.module.split(".")[0] == "runtime" else []
            else:                                            # from . import runtime, from csd import runtime
                found += [f"{module} import runtime" for a in node.names if a.name == "runtime"]
    return found


def test_the_paper_never_imports_the_runtime():
    """csd/'s top level is the paper: what it needs of a model it declares (csd.protocols), the runtime
    implements it and the command line and the app wire the two together (issue 53)."""
    found = {str(p.relative_to(ROOT)): r for p in sorted((ROOT / "csd").glob("*.py")) if (r := runtime_imports(p))}
    assert found == {}


def test_the_runtime_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from .runtime.lm import ids_tensor\nfrom . import runtime\nfrom .rule import decide\n"
                   "def f():\n    import csd.runtime.static\n    from csd.runtime import profile\n"
                   "    from csd import runtime, rule\n", encoding="utf-8")
    assert runtime_imports(bad) == [".runtime.lm", ". import runtime", "csd.runtime.static", "csd.runtime",
                                    "csd import runtime"]


def test_the_source_checks_can_fail(tmp_path):
    """The checks above see a bare import, a lazy one inside a function, and a ``from csd import ui``."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import ui.app\n    from db.store import Store\nfrom csd import ui\n",
                   encoding="utf-8")
    assert hits(imported_modules(bad), BARE) == ["db.store", "db.store.Store", "ui.app"]
    assert hits(imported_modules(bad), {"csd.ui"}) == ["csd.ui"]


@pytest.mark.slow
def test_the_probe_can_fail():
    """The fresh-interpreter probe sees what a package pulls in (here: the UI loads gradio)."""
    assert "gradio" in loaded("csd.ui", ("gradio",))


def test_no_file_over_500_lines_and_a_short_readme():
    """CONTRIBUTING.md's limits: a Python file (source or test) and a Markdown page hold one idea (500
    lines at most), the README is read in five minutes (150 lines at most). Data (prompt lists,
    committed results) is exempt."""
    files = [p for pattern in ("*.py", "*.md") for p in ROOT.rglob(pattern)
             if not {".git", ".venv", "node_modules"} & set(p.relative_to(ROOT).parts)
             and not p.relative_to(ROOT).parts[:2] == ("docs", "bench")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}, f"split these: {long}"
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_the_readme_has_one_set_up_one_run_and_one_test_command():
    """A newcomer's three commands, each in a block of its own, and no other command block: the rest of
    the command line lives in docs/cli.md."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    assert [b.strip() for _, b in blocks] == ["pip install -r requirements.txt -e .", "python app.py",
                                             "python -m pytest tests -q"]


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_docs_resolves():
    """Links between the README, CONTRIBUTING and docs/ (and into docs/bench/) point at files that exist
    and, for a Markdown page, at a heading it has: pages moved or split keep their readers."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)   # not inside code blocks
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                                           # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                heads = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), flags=re.M)}
                if anchor not in heads:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_no_import_cycle_among_the_projects_modules():
    """The project's modules import one another one way (lazy imports inside functions included): a cycle would
    let a module be half-initialised when another reads it (csd.runtime.convert and csd.runtime.refs once formed
    one; evaluation's datasets and graders another, through a type-checking import). ui/, db/, cli/, bench/ and
    evaluation/ install as csd.ui, csd.db, ... (pyproject's package-dir): ``csd.ui.x`` is ui/x.py."""
    tops = ("ui", "db", "cli", "bench", "evaluation")

    def parts(path: Path) -> list[str]:   # csd/runtime/lm.py -> runtime.lm, ui/tabs/page.py -> ui.tabs.page
        rel = path.relative_to(ROOT / "csd") if path.is_relative_to(ROOT / "csd") else path.relative_to(ROOT)
        return [p for p in rel.with_suffix("").parts if p != "__init__"]      # a package: its own name

    def name(path: Path) -> str:
        return ".".join(parts(path)) or "csd"

    files = [p for top in ("csd", *tops) for p in (ROOT / top).rglob("*.py") if "migrations" not in p.parts]
    graph, names = {}, {name(p) for p in files}
    for path in files:
        here, deps = parts(path) if path.name == "__init__.py" else parts(path)[:-1], set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:           # from .x / ..x import y
                base = here[:len(here) - node.level + 1]
                mods = [node.module] if node.module else [a.name for a in node.names]
                deps |= {".".join([*base, *m.split(".")]) for m in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("csd."):
                deps |= {node.module.removeprefix("csd."), *(f"{node.module.removeprefix('csd.')}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name.removeprefix("csd.") for a in node.names if a.name.startswith("csd.")}
        graph[name(path)] = deps & names - {name(path)}

    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return seen
    assert len(graph) > 80 and "evaluation.graders" in graph["evaluation.datasets"]
    cycles = sorted(m for m in graph if m in reach(m))
    assert not cycles, f"modules on an import cycle: {cycles}"


# Lines by area (docs/design.md, "Lines by area"): a line is a physical line of a .py file, blank lines and
# comments included (what `wc -l` counts); data, docs and tests are not counted. Issue 53 set the budgets;
# where an area was over its budget on 2026-12-05, its ceiling is that day's count (no line may be added)
# and the comment names the target, so that a new feature pays for itself within its area.
def _area_files(area: str) -> list[Path]:
    csd = ROOT / "csd"
    return sorted({
        "csd": csd.glob("*.py"),                                                   # the paper
        "csd subpackages": (p for p in csd.rglob("*.py") if p.parent != csd),      # csd/runtime/ ...
        "ui": (ROOT / "ui").rglob("*.py"),
        "db": (p for p in (ROOT / "db").rglob("*.py") if "migrations" not in p.relative_to(ROOT).parts),
        "cli, tools, app.py, csd_app.py": [*(ROOT / "cli").rglob("*.py"), *(ROOT / "tools").rglob("*.py"),
                                           ROOT / "app.py", ROOT / "csd_app.py"],
        "bench, evaluation": [*(ROOT / "bench").rglob("*.py"), *(ROOT / "evaluation").rglob("*.py")],
    }[area])


AREA_BUDGETS = {   # the ceilings; where over issue 53's budget, docs/design.md says why and what pays it back
    "csd": 2552,                              # issue 53's target: 2,500; issue 68's number reader (docs/design.md)
    "csd subpackages": 4031,                  # issue 53's target: 3,800 (3,928 before the ov4 target, issue 52)
    "ui": 3555,                               # issue 53's target: 3,400 (met); issue 68: refusals, wait, words
    "db": 996,                                # issue 53's target: 1,000 (met: 985, then 1,002 with issue 54)
    "cli, tools, app.py, csd_app.py": 1300,   # issue 53's target: 1,300 (met once tools/batch_ratio.py retired)
    "bench, evaluation": 4557,                # issue 53's target: 4,200 (4,497 before issues 52 and 54, then 4,705)
}


def area_lines(area: str) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in _area_files(area))


def test_every_area_stays_within_its_line_budget():
    over = {a: f"{n} > {budget}" for a, budget in AREA_BUDGETS.items() if (n := area_lines(a)) > budget}
    assert over == {}, f"over budget (pay for new lines within the area, or say why in docs/design.md): {over}"


def test_the_areas_cover_every_source_file_once():
    """Each Python file outside the tests, docs and migrations belongs to exactly one area, so that a line
    cannot leave its budget by moving to a folder no area counts."""
    areas = [p for a in AREA_BUDGETS for p in _area_files(a)]
    sources = {p for p in ROOT.rglob("*.py") if not {*SKIP, "tests", "docs", "migrations"} & set(p.relative_to(ROOT).parts)}
    assert len(areas) == len(set(areas)) and set(areas) == sources
