"""What each adapter needs is an extra of rewardd-client, and a missing package fails loudly.

- The extras list what each adapter imports (read from the sources), trainers aside.
- A missing package raises :class:`MissingDependency` naming it and the pip command, when the
  adapter is set up; the verl plugin (imported by verl, which hides its import errors) also
  logs that at ERROR. ``make test-verl`` checks the same through verl's own plugin loader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rewardd_client._requires import MissingDependency, missing_dependency
from rewardd_client.openrlhf import reward_function as openrlhf_reward_function
from rewardd_client.trl import rewardd_advantages
from tests.support.trl_standin import StandInTrainer, single_process_accelerate

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
ADAPTERS = {
    "trl": ["trl.py", "_trl_advantages.py", "_trl_batch.py", "_trl_collective.py",
            "_trl_score.py"],
    "verl": ["verl.py", "verl_plugin.py", "verl_settings.py"],
    "openrlhf": ["openrlhf.py"],
    "slime": ["slime.py"],
}
CLIENT_OWN = {"rewardd_client", "httpx", "msgpack", "orjson"}  # the client's dependencies
TRAINERS = {"trl", "verl", "openrlhf", "slime"}  # installed by the user, never by an extra


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    return {name: [req.split(">")[0].split("=")[0].split("<")[0].strip() for req in reqs]
            for name, reqs in project["optional-dependencies"].items()}


def third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - CLIENT_OWN - {"__future__"}


@pytest.mark.parametrize("extra", sorted(ADAPTERS))
def test_each_adapters_extra_lists_what_it_imports(extra: str) -> None:
    imported = set().union(*(third_party_imports(CLIENT / "rewardd_client" / name)
                             for name in ADAPTERS[extra]))
    assert imported - TRAINERS <= set(extras()[extra]), (imported, extras()[extra])
    assert not set(extras()[extra]) & TRAINERS  # an extra never installs the trainer


def test_the_verl_extra_brings_what_verls_reward_loop_imports_undeclared() -> None:
    assert "aiohttp" in extras()["verl"]


def verl_plugin_import(blocked: str) -> subprocess.CompletedProcess[str]:
    """Import the verl plugin in a fresh interpreter where ``blocked`` cannot be imported,
    logging configured as verl configures it (WARNING and above)."""
    code = (f"import logging, sys; sys.modules[{blocked!r}] = None; "
            "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s "
            "%(message)s')\n"
            "try:\n    import rewardd_client.verl_plugin\n"
            "except ImportError as exc:\n"
            "    print(type(exc).__name__, exc.name, getattr(exc, 'command', None))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)


def test_the_verl_plugin_logs_a_missing_package_at_error_and_raises_it() -> None:
    proc = verl_plugin_import("numpy")
    assert proc.stderr.startswith("ERROR rewardd_client 'numpy' is not installed, and "
                                  "rewardd_client.verl_plugin"), proc.stderr
    assert "pip install 'rewardd-client[verl]'" in proc.stderr
    assert proc.stdout.split() == ["MissingDependency", "numpy", "pip", "install",
                                   "'rewardd-client[verl]'"]


def test_a_missing_trainer_is_named_with_its_own_install() -> None:
    error = missing_dependency(ModuleNotFoundError("No module named 'verl'", name="verl"),
                               adapter="the plugin", extra="verl", trainer="verl")
    assert str(error).startswith("'verl' is not installed, and the plugin runs inside it")
    assert error.command == "pip install verl && pip install 'rewardd-client[verl]'"


def test_a_module_missing_inside_the_trainer_names_the_release_needed() -> None:
    cause = ImportError("cannot import name 'register_adv_est'",
                        name="verl.trainer.ppo.core_algos")
    error = missing_dependency(cause, adapter="the plugin", extra="verl", trainer="verl",
                               trainer_version=">=0.9.1")
    assert str(error).startswith("'verl.trainer.ppo.core_algos' is missing from the installed "
                                 "verl: the plugin needs verl>=0.9.1")
    assert error.command == "pip install 'verl>=0.9.1'"


def test_the_trl_hook_names_a_missing_accelerate_when_it_hooks(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(MissingDependency) as caught:
        rewardd_advantages(StandInTrainer([], num_generations=2), "http://unused", "grpo",
                           validate=False)
    assert caught.value.name == "accelerate"
    assert caught.value.command == "pip install 'rewardd-client[trl]'"
    assert "rewardd_client.trl.rewardd_advantages" in str(caught.value)


def test_the_trl_hook_hooks_when_its_needs_are_met(monkeypatch) -> None:
    single_process_accelerate(monkeypatch)
    trainer = StandInTrainer([], num_generations=2)
    assert rewardd_advantages(trainer, "http://unused", "grpo", validate=False) is trainer


def test_the_openrlhf_function_names_a_missing_torch_when_it_is_made(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependency, match=r"'torch' is not installed.*"
                       r"pip install 'rewardd-client\[openrlhf\]'"):
        openrlhf_reward_function("http://unused", "math")
