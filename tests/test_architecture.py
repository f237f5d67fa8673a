"""The layers import downwards only (docs/architecture.md): the library ``ub`` imports nothing of
the Prefect tasks (``tasks``), the flows (``flows``) or Prefect itself, and the tasks nothing of
the flows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each layer and what it must not import: the layers above it (and, for the library, Prefect).
FORBIDDEN = {"ub": ("tasks", "flows", "prefect", "prefect_ray"), "tasks": ("flows",)}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every absolute module ``path`` imports (at any depth: also inside functions), with its
    line; ``importlib.import_module("...")`` with a literal name counts too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) in ("import_module", "__import__") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, f"no Python files under {layer}/"
    offending = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                 for path in files for line, module in imported_modules(path)
                 if module.split(".")[0] in FORBIDDEN[layer]]
    assert not offending, "\n".join(offending)


def test_the_check_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import flows.selfplay\nfrom tasks import plan\nfrom . import sibling\n"
                      "def f():\n    from flows.cli import main\n"
                      "    importlib.import_module('tasks.rate')\n")
    assert [m for _, m in imported_modules(source)] == [
        "flows.selfplay", "tasks", "flows.cli", "tasks.rate"]
