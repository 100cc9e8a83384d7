"""A session's stored state as typed records: the session's record, one record per group and
an entry per rollout, each with the JSON layout the stores keep.

Dataclasses (``slots``) with hand-written ``to_json`` / ``from_json``, not pydantic models:
the records are trusted data the service wrote itself, and a Redis store decodes and encodes
a group's record on every update (a rollout's arrival, each settled check, the group's
completion), so validating them again would be pure cost. Encoding and decoding a stored
16-rollout group (``tests/benchmarks/bench_session_store.py --codec``) took ~30 us this way,
~18 us as the plain dicts the store kept before, and ~82 us through equivalent pydantic
models; orjson's own dataclass encoding was slower than ``to_json`` (14 against 9 us). The
~12 us per update is lost in a Redis round trip's own cost: the benchmark's end-to-end CPU
per rollout (~3.6 ms with Redis, ~0.7 ms in memory) stayed within its run-to-run noise. The
memory store keeps the records themselves, so it pays for neither.

The JSON layout is the one the stores kept before these types existed, key for key, so a
session stored by an older pod during a rolling upgrade loads here, and an older pod reads
what this one stores::

    session: {"id", "tenant", "state", "spec" (the SessionSpec as sent), "created",
              "touched" (unix s), "error", "standing" (only when true)}
    group:   {"group_id", "index", "first" (unix s), "prompt", "reference", "data_source",
              "state": "open" | "closing" | "done", "reason": None | "full" | "closed" |
              "timeout", "failed", "whole_owner", "whole_done", "event" (the published group
              object), "rollouts": [{"id", "digest", "owner", "checked",
              "cells": {component: outcome}, "body" (the rollout as sent)}],
              "done_at" (unix s, once done)}

What a rollout's check runs on and what a group publishes stay JSON objects
(:data:`JsonObject`): the rollout's body is decoded into a :class:`Rollout` only when it is
checked, outcomes only when the group's numbers are computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Mapping, TypeAlias, Union

from rewardd.service.models import Rollout

JsonValue: TypeAlias = Union[None, bool, int, float, str, list["JsonValue"],
                             dict[str, "JsonValue"]]
JsonObject: TypeAlias = dict[str, JsonValue]
"""Plain JSON data: what a rollout was sent as, an outcome, a published group. (The
``from_json`` decoders take what orjson decoded, ``Mapping[str, Any]``: data this service
stored itself.)"""


class SessionPhase(StrEnum):
    """A session's ``state``: open (takes rollouts), closing (its groups completing, then
    the batch), or one of the three ends."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def ended(self) -> bool:
        return self in ENDED


ENDED = frozenset({SessionPhase.CLOSED, SessionPhase.CANCELLED, SessionPhase.EXPIRED})


class GroupPhase(StrEnum):
    """A group's ``state``: open (takes rollouts), closing (closed or timed out, its checks
    settling), done (its event published)."""

    OPEN = "open"
    CLOSING = "closing"
    DONE = "done"


class GroupReason(StrEnum):
    """Why a group completed (the ``reason`` of its event)."""

    FULL = "full"
    CLOSED = "closed"
    TIMEOUT = "timeout"


@dataclass(slots=True)
class RolloutEntry:
    """A rollout of a group: its content, which pod checks it, and its checked cells."""

    id: str
    digest: str
    """sha256 of the rollout's canonical JSON: a resend with other content is a conflict."""
    owner: str
    """The pod running its per-sample checks (another pod claims them if it stops beating)."""
    body: JsonObject
    """The rollout as sent (its /v1/score shape)."""
    checked: bool = False
    """Its per-sample components settled."""
    cells: dict[str, JsonObject] = field(default_factory=dict)
    """Component name -> outcome (:meth:`Outcome.to_dict`)."""

    def rollout(self) -> Rollout:
        return Rollout.model_validate(self.body)

    def to_json(self) -> JsonObject:
        return {"id": self.id, "digest": self.digest, "owner": self.owner,
                "checked": self.checked, "cells": self.cells, "body": self.body}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutEntry:
        # positional: a group's rollouts are decoded on every update of a Redis store
        return cls(data["id"], data["digest"], data["owner"], data["body"], data["checked"],
                   data["cells"])


@dataclass(slots=True)
class GroupRecord:
    """Everything about one group of a session: the whole truth, changed only under the
    group's lock (:meth:`SessionStore.update_group`)."""

    group_id: str
    index: int
    """Order of the group's first sight in the session."""
    first: float
    """When its first rollout arrived (unix s): its timeout counts from here."""
    prompt: str
    reference: JsonObject
    data_source: str | None
    source: str | None = None
    """The group's dataset (its first sight's), for the response and the run record."""
    rollouts: list[RolloutEntry] = field(default_factory=list)
    state: GroupPhase = GroupPhase.OPEN
    reason: GroupReason | None = None
    failed: bool = False
    """Timed out with ``on_group_timeout="fail"``: no rewards, out of the batch."""
    whole_owner: str | None = None
    """The pod running its group-level checks, once the group is assembled."""
    whole_done: bool = False
    event: JsonObject | None = None
    """The published group object, once done."""
    done_at: float | None = None

    @property
    def done(self) -> bool:
        return self.state == GroupPhase.DONE

    def pending_owners(self) -> set[str]:
        """The pods with unsettled work on this group (unchecked rollouts, the group-level
        checks): what the sweeper needs to find a dead pod's work, kept by the stores in a
        small index so that it never reads whole groups (issue #28)."""
        if self.done:
            return set()
        owners = {r.owner for r in self.rollouts if not r.checked}
        if self.whole_owner and not self.whole_done:
            owners.add(self.whole_owner)
        return owners

    def entry(self, rollout_id: str) -> RolloutEntry | None:
        return next((r for r in self.rollouts if r.id == rollout_id), None)

    def to_json(self) -> JsonObject:
        data: JsonObject = {
            "group_id": self.group_id, "index": self.index, "first": self.first,
            "prompt": self.prompt, "reference": self.reference, "data_source": self.data_source,
            "state": self.state.value, "reason": self.reason.value if self.reason else None,
            "failed": self.failed, "whole_owner": self.whole_owner,
            "whole_done": self.whole_done, "event": self.event,
            "rollouts": [r.to_json() for r in self.rollouts]}
        if self.done_at is not None:  # absent until done, as it always was
            data["done_at"] = self.done_at
        if self.source is not None:  # absent unless sent: older records read back the same
            data["source"] = self.source
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupRecord:
        reason = data["reason"]
        return cls(
            group_id=data["group_id"], index=data["index"], first=data["first"],
            prompt=data["prompt"], reference=data["reference"],
            data_source=data.get("data_source"), source=data.get("source"),
            rollouts=[RolloutEntry.from_json(r) for r in data["rollouts"]],
            state=GroupPhase(data["state"]),
            reason=GroupReason(reason) if reason is not None else None,
            failed=bool(data.get("failed")), whole_owner=data.get("whole_owner"),
            whole_done=bool(data.get("whole_done")), event=data.get("event"),
            done_at=data.get("done_at"))


@dataclass(slots=True)
class SessionRecord:
    """A session's own state; its groups are records of their own."""

    id: str
    tenant: str
    state: SessionPhase
    spec: JsonObject
    """The :class:`SessionSpec` as sent (``exclude_unset``); the manager keeps it parsed."""
    created: float
    touched: float
    """Its idle clock (unix s), moved at most once a second by requests."""
    error: str | None = None
    """Why it ended, when it did not close (idle, cancelled)."""
    standing: bool = False
    """The server's own session (the per-sample trainer protocols): never closed, not
    counted as the tenant's."""

    def copy(self) -> SessionRecord:
        """A copy to change under the lock (the memory store keeps its own)."""
        return replace(self)

    def to_json(self) -> JsonObject:
        data: JsonObject = {"id": self.id, "tenant": self.tenant, "state": self.state.value}
        if self.standing:  # absent from a client's session, as it always was
            data["standing"] = True
        data.update(spec=self.spec, created=self.created, touched=self.touched,
                    error=self.error)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionRecord:
        return cls(id=data["id"], tenant=data["tenant"],
                   state=SessionPhase(data["state"]), spec=data["spec"],
                   created=data["created"], touched=data["touched"],
                   error=data.get("error"), standing=bool(data.get("standing")))
