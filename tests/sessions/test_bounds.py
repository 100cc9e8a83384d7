"""What the session store keeps per tenant is bounded, and its bookkeeping is cheap and
atomic (issue #28), in both stores: in the API process and in Redis (database 11, emptied
around each test):

* groups per session, groups and bytes per tenant, checked before anything is stored and
  refused with a typed error naming the setting; the tenant's oldest ended sessions are
  deleted to make room, and at most ``REWARDD_SESSION_TENANT_MAX_RETAINED`` are kept;
* concurrent resends of one rollout id with different content: exactly one is taken, the
  other is a 409 (the conflict is checked again under the group's lock);
* the sweep reads the owners of unsettled work and the completion times from small
  indices, never a group.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import pytest
import redis

from rewardd.advantages.errors import RequestInvalid
from rewardd.service.app import load_plugins
from rewardd.service.services import Services, build_services
from rewardd.service.sessions import SessionConflict
from rewardd.service.sessions.errors import SessionBusy
from rewardd.service.sessions.quota import BYTES, GROUPS, RETAINED
from rewardd.service.settings import Settings
from tests.sessions.support import groups_of, rollout, spec
from tests.sessions.test_shared import EchoExecutor

URL = "redis://127.0.0.1:6379/11"
STORES = ["memory", "redis"]


@pytest.fixture(autouse=True)
def db() -> Any:
    client = redis.Redis.from_url(URL)
    client.flushdb()
    yield client
    client.flushdb()


@contextlib.asynccontextmanager
async def services_of(kind: str, executor: Any = None, **limits: Any
                      ) -> AsyncIterator[Services]:
    settings = Settings(plugins="tests.plugins.faulty", state_url=URL if kind == "redis"
                        else None, **limits)
    load_plugins(settings)  # the echo verifier, as create_app would
    services = build_services(settings, executor=executor or EchoExecutor())
    try:
        yield services
    finally:
        await services.sessions.stop()
        if services.runtime.redis is not None:
            await services.sessions.store.close()
            await services.runtime.redis.aclose()


def group(gid: str, size: int, completion_bytes: int = 0) -> dict[str, Any]:
    """One group of ``size`` rollouts (reward 1.0), each about ``completion_bytes`` long."""
    pad = " " * completion_bytes
    return {"group_id": gid, "prompt": "p", "rollouts": [
        {"rollout_id": f"{gid}#{i}", "completion": f"1.0{pad}", "num_tokens": 3}
        for i in range(size)]}


@pytest.mark.parametrize("kind", STORES)
async def test_a_session_past_its_groups_is_refused_naming_the_setting_and_nothing_is_stored(
        kind: str) -> None:
    async with services_of(kind, session_max_groups=3) as services:
        manager = services.sessions
        sid = await manager.open("default", spec(2))
        assert (await manager.add("default", sid, [group("a", 1), group("b", 1)]))[
            "accepted"] == 2
        with pytest.raises(RequestInvalid) as refused:
            await manager.add("default", sid, [group("c", 1), group("d", 1)])
        assert "REWARDD_SESSION_MAX_GROUPS" in str(refused.value.errors)
        assert (await manager.status("default", sid))["groups"] == 2  # nothing of it stored
        await manager.add("default", sid, [group("a", 1), group("c", 1)])  # one more: fits
        assert services.sessions.store.held()[("default", GROUPS)] == 3


@pytest.mark.parametrize("kind", STORES)
async def test_a_tenant_past_its_bytes_is_refused_429_and_its_oldest_ended_session_gives_room(
        kind: str) -> None:
    async with services_of(kind, session_tenant_max_bytes=100_000) as services:
        manager, store = services.sessions, services.sessions.store
        first = await manager.open("default", spec(2))
        await manager.add("default", first, [group("a", 2, 30_000)])  # ~60 KB
        second = await manager.open("default", spec(2))
        with pytest.raises(SessionBusy) as refused:  # both open: no room to make
            await manager.add("default", second, [group("b", 2, 30_000)])
        assert "REWARDD_SESSION_TENANT_MAX_BYTES" in str(refused.value)
        assert (await manager.status("default", second))["groups"] == 0
        held = store.held()
        assert 60_000 < held[("default", BYTES)] < 61_000
        await manager.close("default", first)
        assert store.held()[("default", RETAINED)] == 1
        # the ended session is deleted to make room for the open one's add
        assert (await manager.add("default", second, [group("b", 2, 30_000)]))[
            "accepted"] == 2
        assert await store.record(first) is None
        held = store.held()
        assert held[("default", RETAINED)] == 0 and 60_000 < held[("default", BYTES)] < 61_000
        # another tenant's room is its own
        other = await manager.open("other", spec(2))
        assert (await manager.add("other", other, [group("c", 2, 30_000)]))["accepted"] == 2


@pytest.mark.parametrize("kind", STORES)
async def test_a_tenant_past_its_groups_is_refused_and_open_close_churn_keeps_few_sessions(
        kind: str) -> None:
    async with services_of(kind, session_tenant_max_groups=4,
                           session_tenant_max_retained=3) as services:
        manager, store = services.sessions, services.sessions.store
        ended = []
        for i in range(8):  # open/close churn
            sid = await manager.open("default", spec(1))
            await manager.add("default", sid, [group(f"g{i}", 1)])
            await manager.close("default", sid)
            ended.append(sid)
        kept = [sid for sid in ended if await store.record(sid) is not None]
        assert kept == ended[-3:]  # the newest three; the oldest deleted at once
        assert store.held()[("default", RETAINED)] == 3
        assert store.held()[("default", GROUPS)] == 3
        sid = await manager.open("default", spec(1))
        await manager.add("default", sid, [group(f"n{i}", 1) for i in range(4)])
        assert [s for s in ended if await store.record(s) is not None] == []  # room made
        with pytest.raises(SessionBusy) as refused:
            await manager.add("default", sid, [group("n9", 1)])
        assert "REWARDD_SESSION_TENANT_MAX_GROUPS" in str(refused.value)


@pytest.mark.parametrize("kind", STORES)
async def test_concurrent_resends_with_other_content_get_exactly_one_409_per_pair(
        kind: str) -> None:
    async with services_of(kind, EchoExecutor(delay_s=0.05)) as services:
        manager = services.sessions
        sid = await manager.open("default", spec(2))

        async def send(gid: str, completion: float) -> str:
            body = [{"group_id": gid, "rollouts": [rollout("r", completion)]}]
            try:
                await manager.add("default", sid, body)
            except SessionConflict:
                return "409"
            return "200"

        outcomes = await asyncio.gather(*(asyncio.gather(send(f"g{i}", 1.0), send(f"g{i}", 0.0))
                                          for i in range(30)))
        assert all(sorted(pair) == ["200", "409"] for pair in outcomes), outcomes
        # the stored content is the one answered 200
        stored = await manager.store.groups(sid)
        for i, pair in enumerate(outcomes):
            winner = 1.0 if pair[0] == "200" else 0.0
            assert stored[f"g{i}"].rollouts[0].body["completion"] == repr(winner)


@pytest.mark.parametrize("kind", STORES)
async def test_the_sweep_reads_small_indices_never_a_group(kind: str) -> None:
    executor = EchoExecutor()
    async with services_of(kind, executor) as services:
        manager, store = services.sessions, services.sessions.store
        sid = await manager.open("default", spec(2, group_timeout_s=600))
        executor.hold = True  # the checks wait: their owner is this pod
        await manager.add("default", sid, groups_of({f"g{i}": [1.0, 0.0] for i in range(20)}))
        await asyncio.sleep(0)
        assert set(await store.pending(sid)) == {f"g{i}" for i in range(20)}
        assert set().union(*(await store.pending(sid)).values()) == {manager.owner}
        executor.hold = False
        for i in range(20):
            assert await manager.wait_group("default", sid, f"g{i}", 30) is not None
        assert await store.pending(sid) == {}
        assert len(await store.done_before(sid, 2e9)) == 20
        assert await store.done_before(sid, 0) == []

        reads = 0
        real = store.groups

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await real(*args, **kwargs)

        store.groups = counted  # type: ignore[method-assign]
        before = manager.sweeper.sweeps
        for _ in range(5):
            await manager.sweep(orphans=True)
        assert manager.sweeper.sweeps == before + 5 and reads == 0
