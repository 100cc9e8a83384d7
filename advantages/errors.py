"""The request error type: one or more field errors, rendered as a 422.

Its own module, importing nothing of rewardd, so the advantage library can report an
input problem it only finds while computing (a binding that names no component) with the
same path-and-reason shape as the validation pass.

The list is bounded: at most :data:`MAX_ERRORS` entries, then one ``too_many_errors`` entry
in the same ``{"loc", "msg", "type"}`` shape saying how many more there were (or that there
were more, where the checks stopped looking). Before the bound, a 1 MB msgpack body of
1,000,000 nulls in ``mask`` answered 1,000,000 errors: 113 MB of JSON, 17.7 s and 2 GB in
the API process. A trainer fixes the first errors and sends again; nobody reads the
100,001st. The checks that produce errors are generators consumed through :func:`capped`, so
the work stops at the bound too (the model's own lists stop at their first bad element:
see :mod:`rewardd.advantages.bounds`).
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Iterable

Loc = tuple[str | int, ...]

MAX_ERRORS = 100
"""Errors listed in one 422; one more entry says how many were left out."""
TOO_MANY = "too_many_errors"


class RequestInvalid(Exception):
    """One or more request errors; rendered as a 422. ``errors`` is bounded (:func:`capped`)."""

    def __init__(self, errors: Iterable[dict[str, Any]], total: int | None = None) -> None:
        self.errors = capped(errors, total)
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                   for e in self.errors))


def error(loc: Loc, msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg, "type": kind}


def capped(errors: Iterable[dict[str, Any]], total: int | None = None) -> list[dict[str, Any]]:
    """The first :data:`MAX_ERRORS` of ``errors``, plus one ``too_many_errors`` entry when
    there are more: it gives their number when ``total`` (all errors) is known, else says
    the checks stopped looking. Reads at most one error past the bound from ``errors``."""
    listed = list(islice(errors, MAX_ERRORS + 1))
    if len(listed) <= MAX_ERRORS and (total is None or total <= len(listed)):
        return listed
    if listed[-1]["type"] == TOO_MANY and len(listed) == MAX_ERRORS + 1:
        return listed  # capped already
    listed = listed[:MAX_ERRORS]
    if total is not None:
        what = f"{total - MAX_ERRORS} more errors are not listed"
    else:
        what = "the checks stopped after these; there are more errors"
    listed.append(error(("body",), f"{what} (at most {MAX_ERRORS} are reported): fix these "
                        "and send the request again", TOO_MANY))
    return listed


def invalid(loc: Loc, msg: str) -> RequestInvalid:
    """A single-error RequestInvalid, for raising where the problem is found."""
    return RequestInvalid([error(loc, msg)])
