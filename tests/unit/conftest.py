"""Fixtures shared by unit tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from verifiers.code.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox (one zygote) per test module, closed at the end."""
    box = Sandbox()
    yield box
    box.close()
