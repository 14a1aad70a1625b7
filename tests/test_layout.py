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
    """Links between the README, CONTRIBUTING, docs/ and the runs' READMEs in docs/bench/ point at files that exist
    and, for a Markdown page, at a heading it has: pages moved or split keep their readers."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs" / "bench").glob("*/README.md"))]
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


TOPS = ("ui", "db", "cli", "bench", "evaluation")   # install as csd.ui, csd.db, ... (pyproject's package-dir)


def _parts(path: Path) -> list[str]:
    """csd/runtime/lm.py -> runtime.lm, ui/tabs/page.py -> ui.tabs.page; a package is its own name."""
    rel = path.relative_to(ROOT / "csd") if path.is_relative_to(ROOT / "csd") else path.relative_to(ROOT)
    return [p for p in rel.with_suffix("").parts if p != "__init__"]


def _name(path: Path) -> str:
    return ".".join(_parts(path)) or "csd"


def _imports_of(path: Path) -> set[str]:
    """The project's module names (as ``_name`` spells them) that a file imports, lazy ones included;
    ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (c may be a module)."""
    here, deps = _parts(path) if path.name == "__init__.py" else _parts(path)[:-1], set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:           # from .x / ..x import y
            base = here[:len(here) - node.level + 1]
            mods = [node.module] if node.module else [a.name for a in node.names]
            deps |= {".".join([*base, *m.split(".")]) for m in mods}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("csd."):
            module = node.module.removeprefix("csd.")
            deps |= {module, *(f"{module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            deps |= {a.name.removeprefix("csd.") for a in node.names if a.name.startswith("csd.")}
    return deps


def module_graph() -> dict[str, set[str]]:
    """Each of the project's modules and the project's modules it imports (``python -m csd``'s entry point,
    which hands over to the command line and which no module imports, left out)."""
    files = [p for top in ("csd", *TOPS) for p in (ROOT / top).rglob("*.py")
             if "migrations" not in p.parts and p.relative_to(ROOT) != Path("csd/__main__.py")]
    names = {_name(p) for p in files}
    return {_name(p): _imports_of(p) & names - {_name(p)} for p in files}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """The nodes that can reach themselves."""
    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return seen
    return sorted(m for m in graph if m in reach(m))


def package_of(module: str) -> str:
    """The folder a module lies in: runtime.lm -> runtime, ui.tabs.page -> ui.tabs, rule -> csd (the paper).
    A package's ``__init__`` is its folder's: ``runtime`` -> runtime."""
    return module if module in PACKAGE_NAMES else module.rpartition(".")[0] or "csd"


PACKAGE_NAMES = {_name(p.parent / "__init__.py") for top in ("csd", *TOPS)
                 for p in (ROOT / top).rglob("__init__.py") if "migrations" not in p.parts}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto folders: an edge from one folder to another where any module of the
    first imports any module of the second."""
    folded: dict[str, set[str]] = {}
    for module, deps in graph.items():
        here = package_of(module)
        folded.setdefault(here, set()).update(package_of(d) for d in deps)
    return {k: v - {k} for k, v in folded.items()}


def test_no_import_cycle_among_the_projects_modules():
    """The project's modules import one another one way (lazy imports inside functions included): a cycle would
    let a module be half-initialised when another reads it (csd.runtime.convert and csd.runtime.refs once formed
    one; evaluation's datasets and graders another, through a type-checking import)."""
    graph = module_graph()
    assert len(graph) > 80 and "evaluation.graders" in graph["evaluation.datasets"]
    assert not cycles(graph), f"modules on an import cycle: {cycles(graph)}"


# Folders whose modules import each other both ways by design: a package and the package inside it that it
# is made of (the app and its tabs, the benchmark and its synthetic runs). Every other circle between
# folders is a tangle: csd.runtime once read calibration's corpus while calibration drives the runtime.
NESTED = {frozenset({"ui", "ui.tabs"}), frozenset({"bench", "bench.synthetic"})}


def test_no_import_circle_among_the_projects_folders():
    """Folded onto folders, the imports still point one way (a circle through two folders is invisible to
    the module test when no single module closes it), apart from a package and its own sub-package."""
    folded = package_graph(module_graph())
    for pair in NESTED:
        a, b = sorted(pair, key=len)
        folded[b].discard(a)          # the sub-package may use its parent's modules
    assert len(folded) >= 10 and "runtime" in folded["calibration"]
    assert not cycles(folded), f"folders on an import circle: {cycles(folded)}"


def test_the_folder_check_can_fail():
    graph = {"runtime.smoothing": {"calibration.corpus"}, "calibration.calibrate": {"runtime.pair"},
             "calibration.corpus": set(), "runtime.pair": set()}
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == ["calibration", "runtime"]


def test_the_runtime_imports_nothing_from_calibration():
    """Calibration drives the runtime (it decodes with a pair); the runtime never reads calibration back.
    What both read, the prompts and corpora, is csd.corpus."""
    found = {str(p.relative_to(ROOT)): deps for p in sorted((ROOT / "csd" / "runtime").rglob("*.py"))
             if (deps := sorted(d for d in _imports_of(p) if d == "calibration" or d.startswith("calibration.")))}
    assert found == {}


def drawn_layers() -> dict[str, set[str]]:
    """The arrows of docs/design.md's layer picture: ``name ──▶ a, b, c`` per line of its text block."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n(floor 4.*?)```", text, flags=re.S).group(1)
    drawn = {}
    for line in block.splitlines():
        if m := re.match(r"^(?:floor \d)?\s*([\w.]+)\s+──▶\s+(.*)$", line):
            targets = m.group(2).strip()
            drawn[m.group(1)] = set() if targets.startswith("(") else {t.strip() for t in targets.split(",")}
    return drawn


def test_the_design_docs_layer_picture_matches_the_imports():
    """A reader trusts the picture: every folder is drawn with exactly the folders it imports."""
    assert drawn_layers() == package_graph(module_graph())
