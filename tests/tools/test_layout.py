"""The package's floors: the core (objectives, modules) never imports the application."""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "torchrl_acer"
CORE = ("objectives", "modules")
# What the core may import besides the standard library: the upstream target's own
# dependencies and the core floors themselves.
CORE_THIRD_PARTY = {"torch", "tensordict", "torchrl"}


def imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def core_files():
    return sorted(f for floor in CORE for f in (PACKAGE / floor).rglob("*.py"))


@pytest.mark.parametrize(
    "path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_core_imports_only_torch_tensordict_torchrl_and_core(path):
    for name in imported_modules(path):
        top = name.split(".")[0]
        if top == "torchrl_acer":
            floor = name.split(".")[1] if "." in name else ""
            assert floor in CORE, f"{path.name} imports {name}: the core must not"
        else:
            assert top in CORE_THIRD_PARTY or top in sys.stdlib_module_names, (
                f"{path.name} imports {name}, which is neither the standard library "
                f"nor one of {sorted(CORE_THIRD_PARTY)}"
            )


def test_layout_check_sees_a_forbidden_import(tmp_path):
    # The check above must be able to fail: an application import is caught.
    bad = tmp_path / "bad.py"
    bad.write_text("from torchrl_acer.training.experiment import make_trainer\n")
    assert "torchrl_acer.training.experiment" in list(imported_modules(bad))
