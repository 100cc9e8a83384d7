"""Fixtures shared by unit tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.judge_server import JudgeServer, judge_client_env
from rewardd.verifiers.code.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox (one zygote) per test module, closed at the end."""
    box = Sandbox()
    yield box
    box.close()


@pytest.fixture
def judge(judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[JudgeServer]:
    """The module's judge server, reset, with REWARDD_JUDGE_* pointing at it."""
    with judge_client_env(judge_server, monkeypatch):
        yield judge_server
