"""Request rules of scoring that span fields or need the verifier registry, each reported
with its exact path.

The advantage step's own rules (per-token lengths, spans, duplicate ids, catalogue entries)
live below, in :mod:`rewardd.advantages.checks`, and are re-exported here; this module adds
the verifier components' (names, parameters, time limits). Errors are collected lazily (the
checks are generators) and raised as one :class:`RequestInvalid` (a 422 with FastAPI's
``{"detail": [{"loc", "msg", "type"}]}`` shape), stopping after ``MAX_ERRORS`` of them.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Collection, Iterator, Sequence

from rewardd.advantages.checks import (SizeLimits, check_advantage, check_groups, raise_if,
                                       tokens_needed_for, validate_params)
from rewardd.advantages.errors import Loc, error
from rewardd.service.models import Group, RewardSpec, RewardsRequest, ScoreRequest
from rewardd.service.settings import Settings
from rewardd.verifiers import Verifier, get_verifier
from rewardd.verifiers.structured_match import check_budget


def check_reward_specs(specs: Sequence[RewardSpec], settings: Settings,
                       field: str = "rewards") -> Iterator[dict]:
    """The components of ``rewards`` (or ``audit``: ``field``): unique names, a known
    verifier with valid params, no segments, a timeout within the server's."""
    names: dict[str, int] = {}
    for k, spec in enumerate(specs):
        loc: Loc = ("body", field, k)
        if spec.name in names:
            kind = "reward" if field == "rewards" else field
            yield error(loc + ("name",), f"duplicate {kind} name {spec.name!r} "
                        f"(first at {field}[{names[spec.name]}])")
        names.setdefault(spec.name, k)
        try:
            verifier = get_verifier(spec.verifier)
        except KeyError as exc:
            yield error(loc + ("verifier",), exc.args[0])
        else:
            yield from validate_params(verifier.Params, spec.params, loc + ("params",))
        if spec.segments is not None:
            yield error(loc + ("segments",), "segment routing of reward components is not "
                        "available in this release; drop 'segments'")
        yield from check_timeout(spec.timeout_s, settings, loc + ("timeout_s",))


def reference_errors(verifier: Verifier, reference: Any, loc: Loc, settings: Settings,
                     shared: Collection[str] = ()) -> list[dict]:
    """``reference`` against the shape ``verifier`` documents, errors under ``loc``: its
    code fields by size (:func:`code_size_errors`), then, for a verifier with a
    ``reference_errors(reference, shared)`` method (the code verifier: unknown keys), its
    shape, refused with a 422 before anything runs, instead of a failed cell per rollout.
    ``shared``: the top-level keys other verifiers scoring the same reference document (a
    group's one reference serves all of a request's verifiers)."""
    oversized = code_size_errors(verifier, reference, loc, settings)
    errors_of = getattr(verifier, "reference_errors", None)
    if oversized or errors_of is None:
        return oversized
    return [error(loc + tuple(path), f"{message} ({verifier.name} verifier)")
            for path, message in errors_of(reference, shared)]


def _utf8_size(value: Any) -> int:
    """The UTF-8 size of a code field (a string, or a list of lines as ``test_code`` may be);
    0 for anything else (its shape is the verifier's to refuse)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list):
        return sum(_utf8_size(line) + 1 for line in value if isinstance(line, str))
    return 0


def code_size_errors(verifier: Verifier, reference: Any, loc: Loc,
                     settings: Settings) -> list[dict]:
    """Each code field of ``reference`` that ``verifier`` names (``code_fields``) over
    ``max_code_field_bytes``: code a sandbox run must read (parsing Python costs hundreds
    of bytes of memory per byte of code), refused before any of it is carried or read."""
    limit, found = settings.max_code_field_bytes, []
    for path in getattr(verifier, "code_fields", ()):
        value: Any = reference
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        size = _utf8_size(value)
        if size > limit:
            found.append(error(loc + tuple(path), f"{size} bytes of code is over the limit of "
                               f"{limit} (REWARDD_MAX_CODE_FIELD_BYTES); shorten the "
                               f"{'.'.join(path)} of this reference"))
    return found


def check_references(specs: Sequence[RewardSpec], groups: Sequence[Group],
                     settings: Settings) -> Iterator[dict]:
    """Each group's reference, by every verifier of the request (:func:`reference_errors`),
    reported at ``body.groups[i].reference.<path>``."""
    verifiers: dict[str, Verifier] = {}
    for spec in specs:
        try:
            verifiers.setdefault(spec.verifier, get_verifier(spec.verifier))
        except KeyError:
            continue  # reported by check_reward_specs
    shared = {name: frozenset(key for other in verifiers.values() if other is not verifier
                              for key in other.reference_fields)
              for name, verifier in verifiers.items()}
    for gi, group in enumerate(groups):
        for name, verifier in verifiers.items():
            yield from reference_errors(verifier, group.reference,
                                        ("body", "groups", gi, "reference"), settings,
                                        shared[name])


def check_timeout(timeout_s: float | None, settings: Settings, loc: Loc) -> list[dict]:
    if timeout_s is not None and timeout_s > settings.max_verifier_timeout_s:
        return [error(loc, f"{timeout_s:g}s is over the server's limit of "
                      f"{settings.max_verifier_timeout_s:g}s (REWARDD_MAX_VERIFIER_TIMEOUT_S)")]
    return []


def check_component_names(specs: Sequence[RewardSpec], groups: Sequence[Group]) -> list[dict]:
    """Precomputed components on rollouts must not reuse a verifier component's name."""
    verified = {s.name for s in specs}
    for gi, group in enumerate(groups):
        for ri, rollout in enumerate(group.rollouts):
            sent = set(rollout.rewards or ()) | ({"reward"} if rollout.reward is not None else set())
            clash = sorted(sent & verified)
            if clash:
                return [error(("body", "groups", gi, "rollouts", ri, "rewards"),
                              f"precomputed component {clash[0]!r} has the name of a verifier "
                              "component in 'rewards'; rename one of them")]
    return []


def size_limits(settings: Settings) -> SizeLimits:
    """What one request may ask for, from the settings: rollouts
    (``REWARDD_MAX_ROLLOUTS_PER_REQUEST``) and per-token advantages in its answer
    (``REWARDD_MAX_DENSE_TOKENS``); every route that takes a batch checks both before any
    work starts."""
    return SizeLimits(max_tokens=settings.max_dense_tokens,
                      max_rollouts=settings.max_rollouts_per_request,
                      tokens_setting="REWARDD_MAX_DENSE_TOKENS",
                      rollouts_setting="REWARDD_MAX_ROLLOUTS_PER_REQUEST")


def validate_score(req: ScoreRequest | RewardsRequest, settings: Settings) -> None:
    """Every cross-field rule of a /v1/score or /v1/rewards body; raises RequestInvalid."""
    spec = getattr(req, "advantage", None)
    with check_budget(settings.max_schema_check_cpu_s):
        raise_if(chain(check_groups(req.groups, tokens_needed_for(spec), size_limits(settings)),
                       check_reward_specs(req.rewards, settings),
                       check_reward_specs(req.audit, settings, "audit"),
                       check_references([*req.rewards, *req.audit], req.groups, settings),
                       check_component_names(req.rewards, req.groups),
                       check_advantage(spec, req.groups, req.run_id) if spec is not None
                       else ()))
