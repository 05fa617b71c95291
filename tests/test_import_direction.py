"""Imports flow one way: the core (``src/knnmon``) imports nothing above it; ``ingest``,
``assignment`` and ``workers`` import only the core; ``coordinator`` imports all of them; and no
modules import each other in a circle (a circle makes the import order decide whether a package
loads: "cannot import name ... from partially initialized module").

Read from the source with :mod:`ast`, not by importing, so every module is checked, whatever it
needs at run time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Folder -> the package it installs as (pyproject.toml's package-dir).
FOLDERS = {"src/knnmon": "knnmon", "ingest": "knnmon.ingest", "assignment": "knnmon.assignment",
           "workers": "knnmon.workers", "coordinator": "knnmon.coordinator"}
LAYERS = ("ingest", "assignment", "workers", "coordinator")
ALLOWED = {"core": {"core"}, "ingest": {"core", "ingest"}, "assignment": {"core", "assignment"},
           "workers": {"core", "workers"}, "coordinator": {"core", *LAYERS}}


def layer(module: str) -> str | None:
    """The layer a ``knnmon`` module belongs to, ``None`` outside knnmon."""
    parts = module.split(".")
    if parts[0] != "knnmon":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def modules() -> dict[str, Path]:
    """Every knnmon module by its dotted name."""
    out = {}
    for folder, package in FOLDERS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("").parts
            rel = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((package, *rel))] = path
    return out


def imports(source: str, name: str, is_package: bool, top_only: bool) -> set[str]:
    """The modules ``name`` imports (dotted, relative imports resolved); ``top_only``: only those
    run when the module loads (not inside functions, classes or ``if TYPE_CHECKING:``)."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if top_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")
                    parts = parts[:len(parts) - node.level + (1 if is_package else 0)]
                    base = ".".join(parts + ([base] if base else []))
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif not top_only or isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []) or []:
                        visit([child] if isinstance(child, ast.stmt) else child.body)

    visit(ast.parse(source).body)
    return out


def upward(mods: dict[str, Path]) -> list[str]:
    """``"module -> imported"`` for every import that goes against the layers (the module
    imported from, not each name taken from it)."""
    bad = set()
    for name, path in mods.items():
        targets = imports(path.read_text("utf-8"), name, path.name == "__init__.py", top_only=False)
        for target in targets:
            lt = layer(target)
            if lt is not None and lt not in ALLOWED[layer(name)] and target.rpartition(".")[0] not in targets:
                bad.add(f"{name} -> {target}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def load_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the knnmon modules it loads when it loads: its module-level imports and, for
    each, the packages above it (``import a.b.c`` runs ``a/__init__`` and ``a.b/__init__``),
    less the packages above the importer (already loading when it runs)."""

    def above(m: str) -> set[str]:
        parts = m.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & mods.keys()

    graph = {}
    for name, path in mods.items():
        targets = imports(path.read_text("utf-8"), name, path.name == "__init__.py", top_only=True)
        graph[name] = set().union(*(above(t) for t in targets)) - above(name)
    return graph


def test_imports_flow_one_way():
    bad = upward(modules())
    assert not bad, "imports against the layers (core <- ingest, assignment, workers <- coordinator):\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(load_graph(modules()))
    assert not found, f"modules that import each other in a circle: {found}"


def test_no_two_coordinator_subpackages_import_each_other():
    """The coordinator's rooms depend one way (runtime is driven by rebalance, not the reverse)."""
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if parts[:2] == ["knnmon", "coordinator"] and len(parts) > 2 else None

    edges = {(room(a), room(b)) for a, bs in load_graph(modules()).items() for b in bs}
    rooms = {(a, b) for a, b in edges if a and b and a != b}
    found = cycles({a: {b for x, b in rooms if x == a} for a in {r for pair in rooms for r in pair}})
    assert not found, f"coordinator subpackages that import each other: {found}"


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The two checks on made-up modules: an upward import, and a circle through a package's
    ``__init__`` (the shape of the runtime <-> rebalance circle this test was written for)."""
    src = {"knnmon.query": "from knnmon.coordinator.cli import main\n",
           "knnmon.workers.w": "def f():\n    from knnmon.assignment import x\n",
           "knnmon.coordinator.a": "from knnmon.coordinator.b.run import R\n",
           "knnmon.coordinator.b": "from knnmon.coordinator.b.run import R\n",
           "knnmon.coordinator.b.run": "from knnmon.coordinator.c import M\n",
           "knnmon.coordinator.c": "from knnmon.coordinator.b.parts import P\n",
           "knnmon.coordinator.b.parts": "import numpy\n"}
    mods = {}
    for name, text in src.items():
        path = tmp_path / (name.replace(".", "_") + ("/__init__.py" if name == "knnmon.coordinator.b" else ".py"))
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        mods[name] = path
    assert upward(mods) == ["knnmon.query -> knnmon.coordinator.cli", "knnmon.workers.w -> knnmon.assignment"]
    assert cycles(load_graph(mods)) == [["knnmon.coordinator.b", "knnmon.coordinator.b.run", "knnmon.coordinator.c"]]


@pytest.mark.parametrize("module", ["knnmon.coordinator.rebalance.rebalancer", "knnmon.coordinator.rebalance.migration",
                                    "knnmon.client", "knnmon.protocol", "knnmon.coordinator.runtime.runtime",
                                    "knnmon.coordinator.recovery.reviver"])
def test_each_module_loads_first(module):
    """A fresh interpreter imports the module on its own (no import order needed)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_package_is_installed():
    """Every package folder is listed in pyproject.toml: an editable install finds a new one
    anyway, so only a wheel (the container image) would miss it."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]
    found = {".".join((package, *init.parent.relative_to(ROOT / folder).parts))
             for folder, package in FOLDERS.items() for init in (ROOT / folder).rglob("__init__.py")}
    assert found <= set(setup["packages"]), sorted(found - set(setup["packages"]))
    assert {p for p in setup["package-dir"]} >= {p for p in found if p.count(".") <= 2}
