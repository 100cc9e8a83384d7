"""The request error type: one or more field errors, rendered as a 422.

Its own module, importing nothing of rewardd, so the advantage library can report an
input problem it only finds while computing (a binding that names no component) with the
same path-and-reason shape as the validation pass.
"""

from __future__ import annotations

from typing import Any

Loc = tuple[str | int, ...]


class RequestInvalid(Exception):
    """One or more request errors; rendered as a 422."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def error(loc: Loc, msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg, "type": kind}


def invalid(loc: Loc, msg: str) -> RequestInvalid:
    """A single-error RequestInvalid, for raising where the problem is found."""
    return RequestInvalid([error(loc, msg)])
