"""Hostile payloads shared by the tests of the service's resilience."""

from __future__ import annotations

from typing import Any

DEEP = 500
"""Nesting that pickle cannot carry (it spends two of the interpreter's 1,000 recursion levels
per level) while JSON and msgpack read it: the depth that killed the embedded pool."""

UNSENDABLE_MESSAGE = (
    "the group's reference could not be sent to a worker of verifier 'exact_match' "
    "(RecursionError: maximum recursion depth exceeded while pickling an object): it nests "
    "too deeply; flatten it (a few hundred levels at most) or send the nested part as a "
    "JSON string")
"""The failure message of an exact_match call whose reference nests :data:`DEEP` levels."""


def nested(depth: int = DEEP) -> Any:
    """``{"a": {"a": ... "leaf"}}``, ``depth`` objects deep."""
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value
