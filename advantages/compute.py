"""The advantage library's in-process entry point: rollout groups with rewards in, the body
of ``POST /v1/advantages`` out.

A trainer that wants the catalogue without a server calls :func:`compute_advantages` with the
very request it would send (a dict or an :class:`AdvantagesRequest`) and gets the server's
response: the same validation (a :class:`RequestInvalid` naming each field where the server
answers 422), the same reward table and failure policy, the same numbers, bit for bit, since
the server's route runs these functions too (tests/unit/test_compute_in_process.py holds
them equal).

    from rewardd.advantages import compute_advantages
    out = compute_advantages({"groups": [...], "advantage": {"estimator": "grpo",
                                                             "profile": "verl"}})
    out["groups"][0]["rollouts"][0]["advantages"]   # {"rle": [[1.499997, 812]]}

Stateful entries (ha_dw, ucb_curriculum) keep per-run state: pass the same ``state`` dict
for every call of a run (with a ``run_id``); it changes only when a call succeeds.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from pydantic import ValidationError

from rewardd.advantages.checks import (DEFAULT_LIMITS, SizeLimits, pydantic_errors,
                                       validate_advantages)
from rewardd.advantages.errors import RequestInvalid
from rewardd.advantages.models import AdvantagesRequest
from rewardd.advantages.response import build_response
from rewardd.advantages.table import FlatBatch, combine, precomputed_columns


class _PendingRun:
    """A run's state as one call sees it: reads from ``state``, writes held back until
    :meth:`commit` (the semantics of the server's run store)."""

    def __init__(self, state: dict[str, dict[str, Any]]) -> None:
        self.state = state
        self.pending: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        value = self.pending.get(key, self.state.get(key))
        return copy.deepcopy(value) if value is not None else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.pending[key] = copy.deepcopy(value)

    def commit(self) -> None:
        self.state.update(self.pending)


def parse_request(request: AdvantagesRequest | Mapping[str, Any]) -> AdvantagesRequest:
    """The request as the contract's model; field errors as :class:`RequestInvalid` with the
    server's ``("body", ...)`` paths."""
    if isinstance(request, AdvantagesRequest):
        return request
    try:
        return AdvantagesRequest.model_validate(request)
    except ValidationError as exc:
        raise RequestInvalid(pydantic_errors(exc, ("body",))) from None


def respond_to(request: AdvantagesRequest, run: Any = None,
               limits: SizeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Validate a parsed request and build its response; ``run`` is a run-state scope
    (``get``/``put``) or None; ``limits``: the sizes it may ask for (the server's settings).
    The server's route and :func:`compute_advantages` both call this."""
    validate_advantages(request, limits)
    flat = FlatBatch.of(request.groups)
    columns = precomputed_columns(flat.rollouts, request.advantage.weights)
    return build_response(request.run_id, flat, combine(columns, len(flat.rollouts)), columns,
                          request.advantage, run)


def compute_advantages(request: AdvantagesRequest | Mapping[str, Any],
                       state: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The body ``POST /v1/advantages`` would answer for ``request``, computed in process.

    ``state``: the run's state for stateful entries, a dict you keep between calls of one run
    (needs ``run_id``); updated only when the call succeeds. Raises :class:`RequestInvalid`
    (``.errors``: ``loc``, ``msg``, ``type`` per problem) where the server answers 422.
    """
    parsed = parse_request(request)
    run = _PendingRun(state) if state is not None and parsed.run_id is not None else None
    out = respond_to(parsed, run)
    if run is not None:
        run.commit()
    return out
