"""rewardd-client's README: the package's long description, and every name it cites exists.

The metadata is built by the package's own build backend (setuptools'
``prepare_metadata_for_build_wheel``, in a copy of clients/python), as pip builds it; the
names are resolved in the client's sources (an AST read: the verl plugin cannot be imported
without verl), so a renamed function fails here before a user copies a dead example.
"""

from __future__ import annotations

import ast
import builtins
import re
import shutil
import subprocess
import sys
from email.parser import Parser
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "python"
PACKAGE = CLIENT / "rewardd_client"
READMES = [CLIENT / "README.md", REPO / "README.md"]
DOTTED = re.compile(r"\brewardd_client(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"^\s*from (rewardd_client[\w.]*) import ([\w, ()]+)", re.M)
CODE = re.compile(r"```python\n(.*?)```", re.S)


def test_the_built_metadata_carries_the_readme_as_long_description(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__",
                                                                  "build", "dist"))
    out = tmp_path / "metadata"
    out.mkdir()
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    name = subprocess.run([sys.executable, "-c", code, str(out)], cwd=source, check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    metadata = Parser().parsestr((out / name / "METADATA").read_text())
    assert metadata["Name"] == "rewardd-client"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (CLIENT / "README.md").read_text().strip()
    assert {"trl", "verl", "openrlhf", "slime"} <= set(metadata.get_all("Provides-Extra"))
    assert 'aiohttp>=3.8; extra == "verl"' in metadata.get_all("Requires-Dist")


@cache
def top_level_names(module: str) -> dict[str, ast.AST]:
    """Names a module of the client defines or imports at top level (for a package, its
    ``__init__``), with the node that defines each."""
    relative = Path(*module.split(".")[1:])
    path = PACKAGE / relative / "__init__.py" if (PACKAGE / relative).is_dir() else \
        (PACKAGE / relative).with_suffix(".py")
    if module == "rewardd_client":
        path = PACKAGE / "__init__.py"
    names: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((t.id, node) for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return names


def is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return dotted == "rewardd_client" or (PACKAGE / relative).with_suffix(".py").exists() or \
        (PACKAGE / relative / "__init__.py").exists()


def resolves(dotted: str) -> bool:
    """``rewardd_client.module[.name[.attribute]]`` names a module, a top-level name of it,
    or a method of a class defined there."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if is_module(module):
            rest = parts[cut:]
            break
    if not rest:
        return True
    node = top_level_names(module).get(rest[0])
    if node is None or len(rest) == 1:
        return node is not None
    return isinstance(node, ast.ClassDef) and len(rest) == 2 and any(
        getattr(item, "name", None) == rest[1] for item in node.body)


def cited(readme: Path) -> set[str]:
    text = readme.read_text()
    names = set(DOTTED.findall(text))
    for module, imported in FROM_IMPORT.findall(text):
        names.update(f"{module}.{name.strip(' ()')}" for name in imported.split(",")
                     if name.strip(" ()"))
    return names


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_rewardd_client_name_a_readme_cites_exists(readme: Path) -> None:
    names = cited(readme)
    assert len(names) >= 5
    assert sorted(n for n in names if not resolves(n)) == []


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_python_example_of_a_readme_parses(readme: Path) -> None:
    blocks = CODE.findall(readme.read_text())
    assert blocks
    for block in blocks:
        ast.parse(block)


def test_the_resolver_refuses_what_does_not_exist() -> None:
    assert resolves("rewardd_client.trl.reward_functions")
    assert resolves("rewardd_client.RewarddClient")  # imported into the package
    assert resolves("rewardd_client.retry.RetryPolicy.backoff")
    assert resolves("rewardd_client.slime.group_reward")
    assert not resolves("rewardd_client.trl.reward_funcs")
    assert not resolves("rewardd_client.retry.RetryPolicy.backof")
    assert not resolves("rewardd_client.trl.reward_function.x")  # a function has no members


def test_every_class_the_client_readme_names_is_defined_in_the_client() -> None:
    """Errors, policies and clients named in backticks (``NotInCatalogue``) exist."""
    defined = {name for path in PACKAGE.glob("*.py")
               for name in top_level_names(f"rewardd_client.{path.stem}"
                                           if path.stem != "__init__" else "rewardd_client")}
    named = set(re.findall(r"`([A-Z][a-z]+(?:[A-Z][a-z]*)+)`", (CLIENT / "README.md").read_text()))
    assert {"MissingDependency", "NotInCatalogue", "CatalogueUnavailable"} <= named
    assert sorted(named - defined - set(dir(builtins))) == []


def test_every_client_method_the_client_readme_lists_exists() -> None:
    from rewardd_client import AsyncRewarddClient, RewarddClient

    text = (CLIENT / "README.md").read_text()
    listed = re.findall(r"`(\w+)`", text.split("- Methods:")[1].split("\n- ")[0])
    assert "score" in listed and "iter_events" in listed
    for client in (RewarddClient, AsyncRewarddClient):
        missing = [name for name in listed if not name[0].isupper()
                   and not callable(getattr(client, name, None))]
        assert missing == [], client.__name__
