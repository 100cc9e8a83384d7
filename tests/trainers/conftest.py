"""Shared fixtures of the trainer tests (``make test-trainers``).

pytest runs in rewardd's own environment beside a real ``rewardd serve``; each trainer's code
runs in a virtual environment of its own (their pins disagree), named by an environment
variable the Makefile sets. A test whose trainer environment is missing fails with the make
target to run; it never skips.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from tests.support.server import REPO_ROOT, child_env, running_server

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture(scope="session")
def rewardd_url() -> Iterator[str]:
    """One real embedded server for every trainer test."""
    with running_server("--pool-size", "2") as url:
        yield url


def trainer_python(variable: str, target: str) -> str:
    """The interpreter of a trainer's environment, from ``variable`` (set by ``make target``)."""
    path = os.environ.get(variable)
    if not path or not Path(path).exists():
        pytest.fail(f"{variable} is not set to a trainer environment's python: run "
                    f"`make {target}`, which builds the environment and sets it")
    return path


def run_script(python: str, args: Sequence[str], timeout_s: float = 900.0,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a script of tests/trainers/scripts (or any command) under a trainer's python; fail
    with its output when it fails. The trainer's environment has rewardd-client installed
    (editable) as a user would; nothing of the checkout is put on its path, so a script sees
    only what that environment holds."""
    full_env = {**child_env(), **(env or {})}
    full_env.pop("PYTHONPATH", None)
    proc = subprocess.run([python, *args], cwd=REPO_ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited with {proc.returncode}:\n"
                    f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc
