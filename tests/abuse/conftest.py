"""The abuse suite (``make test-abuse``): each test replays what a hostile tenant did to a
shared server and asserts the bound by the memory and CPU the server's processes spent and by
the other tenant's answers (:mod:`tests.support.abuse`), never by wall clock."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/abuse/" in str(item.fspath):
            item.add_marker(pytest.mark.abuse)
