"""Fresh environments: rewardd-client alone, and the server beside PyPI's ``verifiers``.

Two promises of the packaging, checked where they matter, in virtual environments built from
nothing by ``make test-client-env``:

- ``.venv-client/light``: only ``pip install ./clients/python`` (not editable, as a user
  installs it). Every module of ``rewardd_client`` imports, adapters included, without any
  trainer, and importing them pulls in neither torch nor numpy (adapters import their trainer
  and tensors lazily); the one exception is a module that the trainer itself imports
  (``verl_plugin``, a ``verl.plugins`` entry point), which may fail only for want of its stack; the server's dependencies are not installed at all; and the client
  (JSON without orjson, which is optional) scores a batch against a real server.
- ``.venv-client/beside``: the server (editable, after torch==2.13.0) and ``verifiers`` from
  the package index (the RL environments library) in one environment: ``rewardd.verifiers``
  and ``verifiers`` are different packages and both import in one process. Before the
  ``rewardd`` namespace, the server installed a top-level ``verifiers`` and one of the two
  shadowed the other.
"""

from __future__ import annotations

import json

import pytest

from tests.trainers.conftest import run_script, trainer_python

pytestmark = pytest.mark.trainers

SERVER_ONLY = {"rewardd", "fastapi", "starlette", "uvicorn", "celery", "kombu", "redis",
               "torch", "sympy", "pydantic", "prometheus-client", "latex2sympy2-extended",
               "antlr4-python3-runtime", "pebble", "orjson", "numpy"}

TRAINER_ENTRY_POINTS = {"rewardd_client.verl_plugin": {"verl", "torch", "numpy"}}
"""Modules that a trainer imports itself (verl loads its plugins on ``import verl``), not the
user: they need that trainer's stack; the import error must name part of it."""

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import rewardd_client
names = sorted(m.name for m in pkgutil.walk_packages(rewardd_client.__path__, "rewardd_client."))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
try:
    import rewardd
    server = rewardd.__path__._path if hasattr(rewardd.__path__, "_path") else list(rewardd.__path__)
except ImportError:
    server = None
heavy = sorted(m for m in ("torch", "numpy", "trl", "verl", "openrlhf", "slime", "transformers")
               if m in sys.modules)
print(json.dumps({"modules": names, "failed": failed, "server": server, "heavy": heavy}))
"""

SCORE = """
import json, sys
from rewardd_client import RewarddClient
with RewarddClient(sys.argv[1]) as client:
    out = client.score({"groups": [{"group_id": "g", "reference": {"answer": "4"}, "rollouts": [
        {"rollout_id": "a", "completion": "\\\\boxed{4}", "num_tokens": 2},
        {"rollout_id": "b", "completion": "\\\\boxed{5}", "num_tokens": 1}]}],
        "rewards": [{"name": "math", "verifier": "math"}],
        "advantage": {"estimator": "grpo", "output": "dense"}})
print(json.dumps([[r["reward"], r["advantages"]] for r in out["groups"][0]["rollouts"]]))
"""

BOTH_VERIFIERS = """
import json
import verifiers
import verifiers.v1 as vf
import rewardd.verifiers
from rewardd.verifiers.math.verifier import MathVerifier
print(json.dumps({"pypi": verifiers.__file__, "rewardd": rewardd.verifiers.__file__,
                  "pypi_env": vf.Env.__module__, "math": MathVerifier.name}))
"""


def light_python() -> str:
    return trainer_python("REWARDD_CLIENT_PYTHON", "test-client-env")


def test_client_alone_imports_every_adapter_without_trainers_or_tensors():
    report = json.loads(run_script(light_python(), ["-P", "-c", IMPORT_EVERYTHING]).stdout)
    failed = report["failed"]
    for module, trainer_stack in TRAINER_ENTRY_POINTS.items():
        if module in failed:  # loaded by its trainer only; may fail here, for that reason only
            assert failed.pop(module).split("'")[1] in trainer_stack
    assert failed == {}
    assert {"rewardd_client.client", "rewardd_client.openrlhf", "rewardd_client.slime",
            "rewardd_client.trl"} <= set(report["modules"])
    assert report["server"] is None  # rewardd (the server) is not importable here
    assert report["heavy"] == []


def test_client_alone_installs_none_of_the_servers_dependencies():
    listed = json.loads(run_script(light_python(),
                                   ["-m", "pip", "list", "--format=json"]).stdout)
    names = {item["name"].lower().replace("_", "-") for item in listed}
    assert "rewardd-client" in names
    assert names & SERVER_ONLY == set()
    assert names <= {"rewardd-client", "httpx", "httpcore", "h11", "anyio", "idna", "certifi",
                     "sniffio", "msgpack", "pip", "setuptools", "wheel", "typing-extensions",
                     "exceptiongroup"}, names


def test_client_alone_scores_against_a_real_server(rewardd_url):
    rows = json.loads(run_script(light_python(), ["-P", "-c", SCORE, rewardd_url]).stdout)
    # grpo, rewardd profile: (r - mean) / (std + 1e-6) with the unbiased std of [1, 0]
    std = 2 ** -0.5
    expected = [[1.0, [0.5 / (std + 1e-6)] * 2], [0.0, [-0.5 / (std + 1e-6)]]]
    assert [reward for reward, _ in rows] == [1.0, 0.0]
    flat = [a for _, advantages in rows for a in advantages]
    assert flat == pytest.approx([a for _, advantages in expected for a in advantages],
                                 rel=1e-12)  # torch's order of operations, not ours


def test_server_and_pypi_verifiers_import_in_one_process():
    python = trainer_python("REWARDD_BESIDE_PYTHON", "test-client-env")
    # -P: the scripts run from the checkout, whose own verifiers/ folder would come first on
    # the path of `python -c` (a user's process is never started in rewardd's source tree)
    report = json.loads(run_script(python, ["-P", "-c", BOTH_VERIFIERS]).stdout)
    assert "site-packages/verifiers/" in report["pypi"]
    assert report["pypi_env"] == "verifiers.v1.env"
    assert report["rewardd"].endswith("verifiers/__init__.py")
    assert "site-packages" not in report["rewardd"]  # the checkout's, installed editable
    assert report["math"] == "math"
