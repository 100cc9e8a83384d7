"""Packaging and layering: one import package, ``rewardd``; imports flow one way.

service -> workers -> verifiers and advantages, never back; the two pure libraries import
nothing of each other; the light client imports nothing of the server. These tests read the
source (an AST walk), so a violation fails here before it can surprise a user.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("service", "workers", "verifiers", "advantages")
CLIENT = REPO / "clients" / "python" / "rewardd_client"

# what each layer may import of rewardd (itself always)
ALLOWED = {
    "service": {"service", "workers", "verifiers", "advantages"},
    "workers": {"workers", "verifiers", "advantages"},
    "verifiers": {"verifiers"},
    "advantages": {"advantages"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module name imported by ``path`` (absolute imports; type-checking ones too)."""
    tree = ast.parse(path.read_text(), str(path))
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return names


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_imports_only_what_lies_below_it(layer: str) -> None:
    wrong = []
    for path in _sources(REPO / layer):
        for line, name in _imports(path):
            top = name.split(".")
            if top[0] in LAYERS:
                wrong.append(f"{path.relative_to(REPO)}:{line}: bare import {name!r} "
                             f"(say rewardd.{top[0]})")
            elif top[0] == "rewardd" and len(top) > 1 and top[1] not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {layer} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_advantage_library_needs_torch_and_pydantic_only() -> None:
    allowed_third_party = {"torch", "pydantic", "pydantic_core", "numpy"}  # pydantic's own core
    stdlib = set(sys.stdlib_module_names)
    wrong = [f"{path.relative_to(REPO)}:{line}: {name}"
             for path in _sources(REPO / "advantages") for line, name in _imports(path)
             if name.split(".")[0] not in stdlib | allowed_third_party | {"rewardd"}]
    assert not wrong, "\n".join(wrong)


def test_client_imports_nothing_of_the_server() -> None:
    wrong = [f"{path.relative_to(REPO)}:{line}: {name}"
             for path in _sources(CLIENT) for line, name in _imports(path)
             if name.split(".")[0] in {"rewardd", *LAYERS}]
    assert not wrong, "\n".join(wrong)


def test_every_package_folder_is_installed_under_rewardd() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {f"rewardd.{'.'.join(p.parent.relative_to(REPO).parts)}"
               for layer in LAYERS for p in (REPO / layer).rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert set(config["packages"]) == folders
    assert config["package-dir"] == {f"rewardd.{layer}": layer for layer in LAYERS}


def test_installed_import_names_are_rewardd_alone() -> None:
    """Outside the repository (no checkout on sys.path), the generic names do not resolve."""
    code = ("import importlib.util as u; "
            "print([n for n in ('service', 'workers', 'advantages') if u.find_spec(n)]); "
            "import rewardd.service.app, rewardd.advantages, rewardd.verifiers, rewardd.workers")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_importing_the_advantage_library_loads_no_service() -> None:
    code = ("import sys, rewardd.advantages; "
            "print(sorted({m.split('.')[0] if not m.startswith('rewardd.') else "
            "'.'.join(m.split('.')[:2]) for m in sys.modules} & {'fastapi', 'celery', "
            "'sympy', 'rewardd.service', 'rewardd.workers', 'rewardd.verifiers'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_reward_bound_is_one_number_in_both_libraries() -> None:
    from rewardd.advantages.models import REWARD_BOUND as advantage_bound
    from rewardd.verifiers.base import REWARD_BOUND as verifier_bound

    assert advantage_bound == verifier_bound
