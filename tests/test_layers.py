"""The package's layers import one way (docs/architecture.md, "Layers"): data → backbones → engine → experiments →
paper → report → commands, and no layer of the harness imports a method (methods arrive through entry points).

Imports made inside functions count too: a lazy import is still a dependency. The map is read from the source
tree, so a new module is checked by where it is put.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each folder's import name and its rank; a module may import its own rank or a lower one.
LAYERS = {"errors": 0, "data": 1, "backbones": 2, "core": 3, "experiments": 4, "paper": 5, "report": 6,
          "commands": 7}  # fmt: skip
METHODS = ("baselines", "methods")  # may import errors, data, backbones and core only


def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "gfl_bench"):
        parts = ("gflbench", *path.relative_to(ROOT / "gfl_bench").with_suffix("").parts)
    else:
        parts = ("gflbench", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def _layer(module: str) -> str | None:
    """The layer a gflbench module belongs to; None for the package root (its version string only)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


SOURCES = sorted(
    [*(ROOT / "gfl_bench").rglob("*.py"), *(ROOT / "baselines").glob("*.py"), *(ROOT / "methods").glob("*.py")]
)


def test_every_folder_of_the_package_has_a_layer():
    folders = {path.relative_to(ROOT / "gfl_bench").parts[0] for path in (ROOT / "gfl_bench").rglob("*.py")}
    assert {folder.removesuffix(".py") for folder in folders} - {"__init__"} == set(LAYERS)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_module_imports_only_its_own_layer_or_lower_ones(path: Path):
    module = _module_name(path)
    layer = _layer(module)
    allowed = LAYERS["core"] if layer in METHODS else LAYERS[layer] if layer else 0
    upward = []
    for name in _imports(path):
        if name.split(".")[0] in ("gfl_bench", "cli", *METHODS):
            upward.append(f"{name} (not in the gflbench namespace)")
            continue
        if not name.startswith("gflbench.") or name.split(".")[1] not in (*LAYERS, *METHODS):
            continue
        target = name.split(".")[1]
        if target in METHODS and target != layer and layer not in METHODS:
            upward.append(f"{name} (a method, imported by the harness)")
        elif target not in METHODS and LAYERS[target] > allowed:
            upward.append(f"{name} (layer {target} above {layer})")
    assert not upward, f"{module} imports " + ", ".join(sorted(upward))
