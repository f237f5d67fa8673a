"""The layers import downwards only (docs/architecture.md): the library ``ub`` imports nothing of
the Prefect tasks (``ub.tasks``, the folder ``tasks/``), the flows (``ub.flows``, the folder
``flows/``) or Prefect itself, and the tasks nothing of the flows. Nothing imports ``tasks`` or
``flows`` as top-level names: they install under ub's own name only. Inside the library: only the
commands import the command line (``ub.cli``), no import cycle, and no import from a layer to one
above it, as the table "Layers inside ``ub/``" of docs/architecture.md orders them (this test
reads it there).

Every import counts, at any depth: inside functions and under ``if TYPE_CHECKING:`` too. A
function-level import still makes the importer depend on the module it names (it runs whenever
that function does), and a type-only import still couples it to the other module's names, so
neither hides an edge from these checks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
LAYER_TABLE = "## Layers inside `ub/`"

# The folders tasks/ and flows/ are the packages ub.tasks and ub.flows through these links in ub/
# (pyproject.toml: the wheel and the editable install hold the package `ub` alone).
LINKED = {"tasks": ROOT / "ub" / "tasks", "flows": ROOT / "ub" / "flows"}

# Each layer (a folder) and what it must not import: the layers above it (and, for the library,
# Prefect). Nothing anywhere imports the top-level names `tasks` or `flows`: none is installed.
FORBIDDEN = {"ub": ("ub.tasks", "ub.flows", "prefect", "prefect_ray"), "tasks": ("ub.flows",)}
TOP_LEVEL = ("tasks", "flows")


def python_files(folder: Path) -> list[Path]:
    """The ``.py`` files under ``folder``; under ``ub/``, those of the library alone (not the
    linked tasks/ and flows/, which are layers of their own)."""
    return sorted(path for path in folder.rglob("*.py")
                  if not any(path.is_relative_to(link) for link in LINKED.values()))


def test_tasks_and_flows_are_linked_into_ub():
    for name, link in LINKED.items():
        assert link.is_symlink() and link.resolve() == ROOT / name, (
            f"{link.relative_to(ROOT)} must be a link to ../{name} (a checkout without symlinks "
            f"cannot import ub.{name})")
        assert (link / "__init__.py").is_file()


def _dynamic_import(node: ast.AST) -> str | None:
    """The literal name of ``importlib.import_module("...")`` or ``__import__("...")``."""
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
            node.func, "id", None)) in ("import_module", "__import__") and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every absolute module ``path`` imports (at any depth: also inside functions), with its
    line; ``importlib.import_module("...")`` with a literal name counts too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (name := _dynamic_import(node)) is not None:
            found.append((node.lineno, name))
    return found


def names(module: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``prefixes`` or inside one."""
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    files = python_files(ROOT / layer)
    assert files, f"no Python files under {layer}/"
    offending = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                 for path in files for line, module in imported_modules(path)
                 if names(module, FORBIDDEN[layer])]
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("folder", ["ub", "tasks", "flows", "tests", "bench", "scripts"])
def test_nothing_imports_tasks_or_flows_as_top_level_names(folder):
    files = python_files(ROOT / folder)
    assert files, f"no Python files under {folder}/"
    offending = [f"{path.relative_to(ROOT)}:{line} imports {module} (installed as ub.{module})"
                 for path in files for line, module in imported_modules(path)
                 if names(module, TOP_LEVEL)]
    offending += [f"{path.relative_to(ROOT)}: runs python -m {name}"
                  for path in files for name in TOP_LEVEL
                  if re.search(rf"""["' ]-m["', ]+{name}\.""", path.read_text())]
    assert not offending, "\n".join(offending)


def test_the_check_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import ub.flows.selfplay\nfrom ub.tasks import plan\nfrom . import sib\n"
                      "def f():\n    from flows.cli import main\n"
                      "    importlib.import_module('ub.tasks.rate')\n")
    found = [m for _, m in imported_modules(source)]
    assert found == ["ub.flows.selfplay", "ub.tasks", "flows.cli", "ub.tasks.rate"]
    assert [m for m in found if names(m, FORBIDDEN["ub"])] == [
        "ub.flows.selfplay", "ub.tasks", "ub.tasks.rate"]
    assert [m for m in found if names(m, TOP_LEVEL)] == ["flows.cli"]
    assert not names("ub.tasksmith", FORBIDDEN["ub"])


def reimports(path: Path) -> list[tuple[int, str]]:
    """The imports inside a function of ``path`` of a module the file already imports at its
    top (outside ``if TYPE_CHECKING:``, which runs never), with their lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    at_top = {alias.name for node in tree.body if isinstance(node, ast.Import)
              for alias in node.names}
    at_top |= {node.module for node in tree.body
               if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    found = []
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, a.name) for a in node.names if a.name in at_top]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in at_top:
                    found.append((node.lineno, node.module))
    return sorted(set(found))


@pytest.mark.parametrize("folder", ["ub", "tasks", "flows"])
def test_no_function_imports_again_what_its_file_imports_at_its_top(folder):
    """The rule for an import inside a function (docs/architecture.md): it defers a heavy
    package or breaks a cycle, so a module the file already imports at its top has no reason
    to be imported again there (its names join the top's import)."""
    offending = [f"{path.relative_to(ROOT)}:{line} imports {module} again"
                 for path in python_files(ROOT / folder) for line, module in reimports(path)]
    assert not offending, "\n".join(offending)


def test_the_reimport_check_sees_a_function_importing_again(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\nfrom ub.errors import UbError\nif TYPE_CHECKING:\n"
                      "    from ub.games import specs\n"
                      "def f():\n    import os\n    from ub.errors import fail\n"
                      "    from ub.games import specs\n    import torch\n")
    assert reimports(source) == [(6, "os"), (7, "ub.errors")]


# --- inside ub: the import graph ----------------------------------------------------------------

Graph = dict[str, dict[str, str]]
"""module -> {module it imports: where (``path:line`` of the first such import)}."""


def modules_of(root: Path, package: str = "ub") -> dict[str, Path]:
    """Every module of ``package`` under ``root`` by dotted name (a package's ``__init__`` is the
    package's own name)."""
    found = {}
    for path in python_files(root / package):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path, package: str = "ub") -> Graph:
    """The modules of ``package`` each module of it imports. ``import a.b.c`` names module
    ``a.b.c``; ``from X import Y`` names module ``X.Y`` when there is one, else ``X``; a name of no
    module counts as its nearest enclosing module; relative imports are resolved."""
    modules = modules_of(root, package)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = graph.setdefault(module, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        kinds = (ast.Import, ast.ImportFrom, ast.Call)
        for node in sorted((n for n in ast.walk(tree) if isinstance(n, kinds)),
                           key=lambda n: n.lineno):  # (so each edge keeps its first line)
            names: list[str | None] = []
            if isinstance(node, ast.Import):
                names = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from . import x (level 1: this package), from .. import y
                    parts = here.split(".")[:len(here.split(".")) + 1 - node.level]
                    base = ".".join(parts + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base)
                         for a in node.names]
            elif (dynamic := _dynamic_import(node)) is not None:
                names = [known(dynamic)]
            for name in names:
                if name is not None and name != module:
                    edges.setdefault(name, f"{path.relative_to(root)}:{node.lineno}")
    return graph


def import_cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every
    import cycle lies in one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def shortest_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest import cycle through the modules of ``component`` (breadth first)."""
    members, best = set(component), component + component[:1]
    for start in component:
        paths, queue = {start: [start]}, [start]
        for v in queue:
            for w in sorted(graph[v]):
                if w == start and len(paths[v]) + 1 < len(best):
                    best = paths[v] + [start]
                elif w in members and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return best


def describe_cycle(graph: Graph, component: list[str]) -> str:
    """A cycle's modules, a shortest cycle among them, and the import behind each edge."""
    members = set(component)
    lines = [f"{where} imports {b}" for a in component
             for b, where in sorted(graph[a].items()) if b in members]
    return (f"import cycle among {', '.join(component)} (shortest: "
            f"{' -> '.join(shortest_cycle(graph, component))}):\n  " + "\n  ".join(lines))


def read_layers(doc: Path = ARCHITECTURE) -> list[tuple[str, list[str]]]:
    """The table under :data:`LAYER_TABLE` in ``doc``: (layer, its modules) rows, lowest first."""
    text = doc.read_text(encoding="utf-8")
    assert LAYER_TABLE in text, f"{doc} has no section {LAYER_TABLE!r}"
    section = text.split(LAYER_TABLE, 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return [(row[0], re.findall(r"`([\w.]+)`", row[1])) for row in rows[2:]]


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index of ``module``'s layer: the row naming it or, failing that, its nearest
    enclosing package (``ub`` names ``ub/__init__.py`` alone)."""
    where = {name: i for i, (_, names) in enumerate(layers) for name in names}
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in where and (name != "ub" or module == "ub"):
            return where[name]
    return None


GRAPH = import_graph(ROOT)
LAYERS = read_layers()


def test_only_the_commands_import_the_command_line():
    """The library runs without its command line: only ``ub.cli`` and the ``python -m``
    entry points (``__main__`` modules, commands themselves) import ``ub.cli``."""
    offending = [f"{where} imports {b}" for a, edges in sorted(GRAPH.items())
                 for b, where in sorted(edges.items())
                 if (b == "ub.cli" or b.startswith("ub.cli.")) and not (
                     a == "ub.cli" or a.startswith("ub.cli.") or a.endswith(".__main__"))]
    assert not offending, "the library imports the command line:\n" + "\n".join(offending)


def test_ub_has_no_import_cycle():
    cycles = import_cycles(GRAPH)
    assert not cycles, "\n".join(describe_cycle(GRAPH, c) for c in cycles)


def test_every_module_of_ub_has_a_layer():
    named = {name for _, names in LAYERS for name in names}
    assert not named - set(GRAPH), f"{ARCHITECTURE.name} names no such module: {named - set(GRAPH)}"
    missing = [m for m in sorted(GRAPH) if layer_of(m, LAYERS) is None]
    assert not missing, (f"no layer for {', '.join(missing)}: add it to the table "
                         f"{LAYER_TABLE!r} of {ARCHITECTURE.relative_to(ROOT)}")


def test_no_import_goes_up_a_layer():
    offending = []
    for a, edges in sorted(GRAPH.items()):
        for b, where in sorted(edges.items()):
            mine, theirs = layer_of(a, LAYERS), layer_of(b, LAYERS)
            if mine is not None and theirs is not None and theirs > mine:
                offending.append(f"{where} imports {b}: layer {LAYERS[mine][0]!r} imports "
                                 f"layer {LAYERS[theirs][0]!r}, above it")
    assert not offending, (f"imports upwards (the layers: {LAYER_TABLE!r} in "
                           f"{ARCHITECTURE.relative_to(ROOT)}):\n" + "\n".join(offending))


def test_the_graph_sees_every_kind_of_import(tmp_path):
    files = {"ub/__init__.py": "", "ub/a.py": "", "ub/p/__init__.py": "from . import q\n",
             "ub/p/q.py": ("from typing import TYPE_CHECKING\nimport ub.a\nfrom ub.p import r\n"
                           "if TYPE_CHECKING:\n    from ..a import name\n"),
             "ub/p/r.py": ("import os\ndef f():\n    from ub.p.q import thing\n"
                           "    importlib.import_module('ub.a')\nfrom .q import other\n")}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert {m: sorted(e) for m, e in graph.items()} == {
        "ub": [], "ub.a": [], "ub.p": ["ub.p.q"], "ub.p.q": ["ub.a", "ub.p.r"],
        "ub.p.r": ["ub.a", "ub.p.q"]}
    assert graph["ub.p.r"] == {"ub.p.q": "ub/p/r.py:3", "ub.a": "ub/p/r.py:4"}
    assert import_cycles(graph) == [["ub.p.q", "ub.p.r"]]
    assert describe_cycle(graph, ["ub.p.q", "ub.p.r"]) == (
        "import cycle among ub.p.q, ub.p.r (shortest: ub.p.q -> ub.p.r -> ub.p.q):\n"
        "  ub/p/q.py:3 imports ub.p.r\n  ub/p/r.py:3 imports ub.p.q")
    ring = {"a": {"b": ""}, "b": {"c": ""}, "c": {"a": "", "b": ""}}
    assert shortest_cycle(ring, ["a", "b", "c"]) == ["b", "c", "b"]


def test_a_module_takes_the_layer_of_its_row_or_package():
    layers = [("low", ["ub", "ub.x.low"]), ("high", ["ub.x", "ub.y"])]
    assert [layer_of(m, layers) for m in ("ub", "ub.x", "ub.x.low", "ub.x.low.z", "ub.x.k",
                                          "ub.z")] == [0, 1, 0, 0, 1, None]
