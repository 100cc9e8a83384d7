"""The registry of the advantage library: one function per entry, registered by name.

verl's pattern, widened to every stage of the pipeline a request composes:

    transforms -> estimator (or multi-reward aggregate) -> reweight -> filters

Each entry is a pure function of tensors; registering it is all it takes for the API, the
CLI and ``GET /v1/estimators`` to offer it. Signatures by kind:

- ``estimator``:  fn(batch, params, pins) -> Advantages | Tensor[R]
- ``aggregate``:  fn(batch, params, pins, estimator) -> Advantages | Tensor[R]
- ``transform``:  fn(batch, params, pins) -> AdvantageBatch (rewards changed)
- ``reweight``:   fn(batch, advantages, params, pins) -> Advantages
- ``filter``:     fn(batch, advantages, params, pins) -> dict (advice, JSON-ready)

Stateful entries (``stateful=True``) read and write ``batch.run`` and need a ``run_id``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict

from rewardd.advantages.models import Profile
from rewardd.advantages.profiles import ALIASES, alias_profiles, resolve_alias

Kind = Literal["estimator", "aggregate", "transform", "reweight", "filter"]
KINDS: tuple[Kind, ...] = ("transform", "estimator", "aggregate", "reweight", "filter")


class EstimatorParams(BaseModel):
    """Base of every entry's parameter model; unknown parameters are an error."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


@dataclass(frozen=True)
class Entry:
    name: str
    kind: Kind
    fn: Callable[..., Any]
    Params: type[EstimatorParams]
    formula: str
    source: str
    description: str
    inputs: tuple[str, ...] = field(default=("rewards",))
    """Rollout fields the entry reads; validation makes a missing one a 422 naming it."""
    stateful: bool = False


ENTRIES: dict[str, Entry] = {}
ESTIMATORS = ENTRIES  # the library's public name for the catalogue (GET /v1/estimators)


def register(name: str, *, formula: str, source: str, kind: Kind = "estimator",
             params: type[EstimatorParams] = EstimatorParams,
             inputs: tuple[str, ...] = ("rewards",),
             stateful: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: add ``fn`` under ``name``; its docstring becomes the description."""

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in ENTRIES:
            raise ValueError(f"advantage entry {name!r} registered twice")
        ENTRIES[name] = Entry(name=name, kind=kind, fn=fn, Params=params, formula=formula,
                              source=source, description=inspect.getdoc(fn) or "",
                              inputs=inputs, stateful=stateful)
        return fn

    return add


def names_of(kind: Kind) -> list[str]:
    return sorted(n for n, e in ENTRIES.items() if e.kind == kind)


def get_entry(name: str, kind: Kind = "estimator") -> Entry:
    """The entry ``name`` of ``kind``; KeyError lists the valid names of that kind."""
    entry = ENTRIES.get(name)
    if entry is None or entry.kind != kind:
        raise KeyError(f"unknown {kind} {name!r}; valid: {', '.join(names_of(kind))}")
    return entry


def get_estimator(name: str) -> Entry:
    return get_entry(name, "estimator")


class PinnedParam(ValueError):
    """A request sets a parameter its estimator alias pins to another value; ``name`` is
    the parameter."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def resolve_estimator(name: str, profile: str, params: dict[str, Any]
                      ) -> tuple[Entry, dict[str, Any]]:
    """The registry entry an estimator name means under ``profile``, with its params.

    A trainer's own name (``grpo_vectorized`` under verl, ``group_norm`` under openrlhf)
    resolves to its registry entry with the alias's pinned params merged under the request's;
    a request that sets a pinned param to another value raises :class:`PinnedParam`. An alias
    under another profile raises KeyError naming the profile it belongs to."""
    alias = resolve_alias(name, profile)
    if alias is None:
        if name not in ENTRIES and alias_profiles(name):
            raise KeyError(f"estimator {name!r} is a trainer's name for a registry entry "
                           f"under profile {' or '.join(map(repr, alias_profiles(name)))}, "
                           f"not under {profile!r}")
        try:
            return get_estimator(name), params
        except KeyError as exc:
            own = sorted(ALIASES.get(Profile(profile), {}))
            raise KeyError(exc.args[0] + (f"; under profile {profile!r} also: "
                                          f"{', '.join(own)}" if own else "")) from None
    for key, value in alias.params.items():
        if key in params and params[key] != value:
            raise PinnedParam(key, f"estimator {name!r} is {alias.entry!r} with {key} = "
                              f"{value!r}; got {params[key]!r} (use {alias.entry!r} to "
                              "choose it)")
    return get_estimator(alias.entry), {**alias.params, **params}
