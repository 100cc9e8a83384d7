"""Checking a reward or advantage spec against the server's catalogue when an adapter is built.

Why at build time: a TRL reward spec naming an unknown verifier used to be accepted when the
reward functions were made and refused (422) only at the first training step, after the model
had loaded and generated a whole batch. The names a spec uses are all in two cheap reads,
``GET /v1/verifiers`` and ``GET /v1/estimators``, so the adapter reads them once, when it is
built, and names the unknown entry with the ones the server knows. Only names are checked
(verifier kinds, estimator and stage names, the profile): parameters are the server's to
validate, in the request, with their exact field paths.

When the server cannot be read at build time, the adapter fails (:class:`CatalogueUnavailable`)
and says what to do, rather than skip the check silently: a run whose server is down at start
would fail at its first step anyway, and a silent skip would bring the late failure back for
exactly the users who need the early one. Building before the server is up is a deliberate
choice, made with ``validate=False``. The client's retries apply to the read (about 15 s with
the default policy), so a server started beside the trainer has time to come up.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping, Sequence

from rewardd_client.client import RewarddClient
from rewardd_client.errors import RewarddError

__all__ = ["CatalogueUnavailable", "NotInCatalogue", "check_advantage", "check_rewards"]

_STAGES = (("transforms", "transform"), ("reweight", "reweight"), ("filters", "filter"))


class NotInCatalogue(ValueError):
    """A spec names what the server does not offer. ``field`` is the spec's path
    (``rewards[1].verifier``), ``name`` the unknown name, ``known`` what the server offers."""

    def __init__(self, field: str, name: object, known: Iterable[str], what: str,
                 base_url: str) -> None:
        self.field, self.name, self.known = field, name, sorted(known)
        close = difflib.get_close_matches(str(name), self.known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"{field}: rewardd at {base_url} has no {what} {name!r}{hint}; "
                         f"it has: {', '.join(self.known)} (GET /v1/{_route(what)})")


class CatalogueUnavailable(RuntimeError):
    """The catalogue could not be read when the adapter was built (the server is down,
    unreachable or refused the key); the client's typed error is ``__cause__``."""


def _route(what: str) -> str:
    return "verifiers" if what == "verifier" else "estimators"


def _read(client: RewarddClient, route: str, purpose: str) -> list[Mapping[str, Any]]:
    try:
        return list(client.verifiers() if route == "verifiers" else client.estimators())
    except RewarddError as exc:
        raise CatalogueUnavailable(
            f"could not read GET /v1/{route} from rewardd at {client.base_url} to check "
            f"{purpose} ({exc}). Start the server before building the adapter, or pass "
            f"validate=False to build it unchecked (an unknown name then fails at the first "
            f"training step)") from exc


def check_rewards(client: RewarddClient, specs: Sequence[Mapping[str, Any]]) -> None:
    """Every spec's ``verifier`` is a verifier kind the server offers; otherwise
    :class:`NotInCatalogue` for the first one that is not."""
    known = {entry["name"] for entry in _read(client, "verifiers", "the reward spec")}
    for index, spec in enumerate(specs):
        if spec.get("verifier") not in known:
            raise NotInCatalogue(f"rewards[{index}].verifier", spec.get("verifier"), known,
                                 "verifier", client.base_url)


def check_advantage(client: RewarddClient, spec: Mapping[str, Any], profile: str) -> None:
    """The names an advantage spec uses exist on the server: its ``profile`` (default
    ``profile``), its ``estimator`` (an estimator entry, or a trainer's own name that the
    profile aliases), its ``aggregate`` and the entries of its ``transforms``, ``reweight``
    and ``filters``, each of its own kind."""
    entries = _read(client, "estimators", "the advantage spec")
    by_kind: dict[str, set[str]] = {}
    profiles: set[str] = set()
    for entry in entries:
        by_kind.setdefault(entry["kind"], set()).add(entry["name"])
        profiles.update(entry.get("profiles", {}))
    chosen = spec.get("profile", profile)
    if chosen not in profiles:
        raise NotInCatalogue("advantage.profile", chosen, profiles, "profile", client.base_url)
    aliases = {alias for entry in entries
               for alias in entry.get("profiles", {}).get(chosen, {}).get("aliases", {})}
    named = [("advantage.estimator", spec.get("estimator", "grpo"),
              by_kind.get("estimator", set()) | aliases, "estimator")]
    if "aggregate" in spec:
        named.append(("advantage.aggregate", spec["aggregate"], by_kind.get("aggregate", set()),
                      "aggregate"))
    for key, kind in _STAGES:
        for index, stage in enumerate(spec.get(key) or ()):
            if isinstance(stage, Mapping):  # other shapes are the server's to refuse
                named.append((f"advantage.{key}[{index}].name", stage.get("name"),
                              by_kind.get(kind, set()), kind))
    for field, name, known, what in named:
        if name not in known:
            raise NotInCatalogue(field, name, known, what, client.base_url)
