"""A session's stored JSON keeps the layout it had before the records were typed, key for
key: what an older pod stored loads here (a rolling upgrade), and what this one stores an
older pod reads. Redis database 6 (the shared tests' fixture empties it)."""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from rewardd.service.services import build_services
from rewardd.service.sessions.records import (GroupPhase, GroupReason, GroupRecord,
                                              SessionPhase, SessionRecord)
from rewardd.service.sessions.redis_store import ACTIVE_SET, TENANT_PREFIX, key
from rewardd.service.settings import Settings
from tests.sessions.support import ECHO
from tests.sessions.test_shared import URL, EchoExecutor
from tests.sessions.test_shared import db  # noqa: F401  (the autouse fixture: flushes DB 6)

SID = "0123456789abcdef0123456789abcdef"
SPEC = {"rewards": [ECHO], "group_size": 2, "advantage": {"estimator": "grpo",
                                                         "output": "dense"}}


def old_session(**more: Any) -> dict[str, Any]:
    """A session's record as the manager wrote it before the records were typed."""
    now = time.time()  # (not idle: the sweep would expire it)
    return {"id": SID, "tenant": "default", "state": "open", **more, "spec": SPEC,
            "created": now - 2.5, "touched": now, "error": None}


def old_rollout(rid: str, completion: str, owner: str, checked: bool) -> dict[str, Any]:
    return {"id": rid, "digest": "d" * 64, "owner": owner, "checked": checked,
            "cells": ({"r": {"ok": True, "reward": float(completion), "error": None,
                             "detail": {}}} if checked else {}),
            "body": {"rollout_id": rid, "completion": completion, "num_tokens": 3}}


def old_group(gid: str, rollouts: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"group_id": gid, "index": 0, "first": 1700000000.75, "prompt": "p",
            "reference": {"answer": "1"}, "data_source": None, "state": "open", "reason": None,
            "failed": False, "whole_owner": None, "whole_done": False, "event": None,
            "rollouts": rollouts, **more}


def test_the_records_write_back_the_json_they_were_read_from_byte_for_byte() -> None:
    done = old_group("g", [old_rollout("a", "1.0", "pod:1:x", True)], state="done",
                     reason="full", event={"group_id": "g", "rollouts": []},
                     done_at=1700000002.0)
    for data in (old_group("g", [old_rollout("a", "1.0", "pod:1:x", False)]), done):
        group = GroupRecord.from_json(orjson.loads(orjson.dumps(data)))
        assert orjson.dumps(group.to_json()) == orjson.dumps(data)
    assert GroupRecord.from_json(done).state is GroupPhase.DONE
    assert GroupRecord.from_json(done).reason is GroupReason.FULL
    for data in (old_session(), old_session(standing=True)):
        record = SessionRecord.from_json(data)
        assert orjson.dumps(record.to_json()) == orjson.dumps(data)
    assert SessionRecord.from_json(old_session(standing=True)).standing
    assert SessionRecord.from_json(old_session()).state is SessionPhase.OPEN


async def test_a_session_an_older_pod_stored_in_redis_is_resumed_and_closed_here(
        db: redis.Redis) -> None:  # noqa: F811
    # an older pod took two rollouts, checked one, and died with the other unchecked
    db.set(key(SID), orjson.dumps(old_session()))
    db.sadd(ACTIVE_SET, SID)
    db.sadd(TENANT_PREFIX + "default", SID)
    db.hset(key(SID, "groups"), "g", orjson.dumps(old_group("g", [
        old_rollout("a", "1.0", "old:1:dead", True),
        old_rollout("b", "0.0", "old:1:dead", False)])))
    services = build_services(Settings(state_url=URL), executor=EchoExecutor())
    manager = services.sessions
    try:
        assert (await manager.status("default", SID))["rollouts"] == 2
        await manager.sweep(orphans=True)  # the dead pod's check is claimed and run again
        group = await manager.wait_group("default", SID, "g", 30)
        assert group is not None and [r["reward"] for r in group["rollouts"]] == [1.0, 0.0]
        closed = await manager.close("default", SID)
        assert closed["state"] == "closed" and closed["summary"]["rollouts"] == 2
        stored = orjson.loads(db.hget(key(SID, "groups"), "g"))
        assert list(stored) == [*old_group("g", []), "done_at"]
        assert list(stored["rollouts"][1]) == list(old_rollout("b", "0", "", False))
        assert stored["rollouts"][1]["owner"] == manager.owner
        assert list(orjson.loads(db.get(key(SID)))) == list(old_session())
    finally:
        await manager.stop()
        await services.runtime.redis.aclose()  # type: ignore[union-attr]
