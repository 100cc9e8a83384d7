"""The per-sample trainer protocols' group mode on standing sessions: a group's samples
posted to two API pods (two in-process apps over Redis database 6) are one group, answered on
each pod with /v1/score's numbers; the tenant's rollouts-in-flight limit holds across pods and
forgets a dead pod's; a standing session forgets its completed groups, is made anew after it
expired, and is not one of the tenant's open sessions. The executor echoes float(completion)
in process (the checks are not under test here)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from rewardd.service.app import create_app
from rewardd.service.sessions import redis_store as redis_store_module
from rewardd.service.sessions import sweep as sweep_module
from rewardd.service.settings import Settings
from tests.sessions.support import ECHO
from tests.sessions.test_shared import db  # noqa: F401  (the autouse fixture: flushes DB 6)
from tests.sessions.test_shared import EchoExecutor, pod, rollout, spec
from tests.support.executors import RefusingExecutor

GROUPED = {"rewards": [ECHO], "group": {"size": 4, "timeout_s": 60,
                                        "advantage": {"estimator": "grpo"}},
           "slime": {"value": "advantage"}}


def slime(response: str, prompt: str = "P", label: str = "L") -> dict[str, Any]:
    return {"prompt": prompt, "response": response, "label": label}


async def until_arrived(http: httpx.AsyncClient, rollouts: int) -> None:
    """Until the standing session holds ``rollouts`` (60 s against a hang)."""
    manager = http.app.state.services.sessions  # type: ignore[attr-defined]
    for _ in range(600):
        for sid in await manager.store.active():
            status = (await http.get(f"/v1/sessions/{sid}")).json()
            if status["rollouts"] >= rollouts:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the standing session never held {rollouts} rollouts")


async def test_a_group_split_across_two_pods_is_one_group_answered_on_both() -> None:
    executor = EchoExecutor()
    config = json.dumps(GROUPED)
    async with pod(executor, compat_config=config) as one, \
            pod(executor, compat_config=config) as two:
        values = ["1.0", "0.0", "0.5", "0.25"]
        sends = [asyncio.create_task((one if i % 2 == 0 else two).post(
            "/slime/reward", json=slime(v))) for i, v in enumerate(values[:3])]
        # until all three are in the group (a pause could end before a busy machine read
        # them, and the fourth would then complete the group without the third)
        await until_arrived(one, 3)
        assert not any(t.done() for t in sends)  # three of four: waiting on both pods
        last = await two.post("/slime/reward", json=slime(values[3]))
        answers = [(await t).json() for t in sends] + [last.json()]
        checks = executor.checks
        expected = (await one.post("/v1/score", json={
            "groups": [{"group_id": "g", "prompt": "P", "reference": {"answer": "L"},
                        "rollouts": [{"rollout_id": str(i), "completion": v}
                                     for i, v in enumerate(values)]}],
            "rewards": [ECHO], "advantage": {"estimator": "grpo", "output": "scalar"}})).json()
        # the next sample of the same prompt opens the next group, on either pod
        later = asyncio.create_task(one.post("/slime/reward", json=slime("1.0")))
        await asyncio.sleep(0.3)
        assert not later.done()
        later.cancel()
    assert [a["group_size"] for a in answers] == [4, 4, 4, 4]
    assert [a["score"] for a in answers] == [float(v) for v in values]
    # (arrival order is the group's order, and concurrent sends do not fix it: equal up to
    # the last bit of a sum taken in another order)
    assert [a["reward"] for a in answers] == [
        pytest.approx(r["advantages"], rel=1e-12) for r in expected["groups"][0]["rollouts"]]
    assert checks == 4  # each sample checked once, on arrival


async def test_the_rollouts_in_flight_limit_holds_across_pods_and_forgets_a_dead_pod(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_store_module, "HEARTBEAT_S", 2.0)
    held = EchoExecutor()
    held.hold = True
    async with pod(held, session_max_inflight=3) as one, \
            pod(held, session_max_inflight=3) as two:
        sid = (await one.post("/v1/sessions", json=spec(8))).json()["session_id"]

        def body(*ids: str) -> dict[str, Any]:
            return {"groups": [{"group_id": "g", "prompt": "p",
                                "rollouts": [rollout(i, 1.0) for i in ids]}]}

        assert (await one.post(f"/v1/sessions/{sid}/rollouts",
                               json=body("a", "b"))).json()["accepted"] == 2
        busy = await two.post(f"/v1/sessions/{sid}/rollouts", json=body("c", "d"))
        assert busy.status_code == 429 and "over every API pod" in busy.text
        assert (await two.post(f"/v1/sessions/{sid}/rollouts",
                               json=body("c"))).json()["accepted"] == 1
        # pod one stops beating with its two checks in flight: its count is dropped
        manager = one.app.state.services.sessions  # type: ignore[attr-defined]
        await manager.stop()
        manager.store.beat = _never  # type: ignore[method-assign]
        for _ in range(100):
            await asyncio.sleep(0.1)
            taken = await two.post(f"/v1/sessions/{sid}/rollouts", json=body("e", "f"))
            if taken.status_code == 200:
                break
        held.hold = False  # (the pods' shutdown would wait for held checks)
        assert taken.status_code == 200 and taken.json()["accepted"] == 2, taken.text


async def _never(owner: str) -> None:
    return None


async def test_a_standing_session_forgets_its_groups_is_made_anew_and_is_not_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_module, "STANDING_KEEP_S", 0.0)
    config = {**GROUPED, "group": {**GROUPED["group"], "size": 2}}
    app = create_app(Settings(compat_config=json.dumps(config), plugins="tests.plugins.faulty",
                              session_max_open=1, session_idle_timeout_s=1.0),
                     executor=EchoExecutor())
    manager = app.state.services.sessions
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://rewardd", timeout=60) as http:
            first = await asyncio.gather(*(http.post("/slime/reward", json=slime(v))
                                           for v in ("1.0", "0.0")))
            plus, minus = (r.json()["advantage"] for r in first)
            assert plus > 0 and minus == -plus  # grpo over the group of two
            [standing] = await manager.store.active()
            # not one of the tenant's sessions: its own one session still opens
            opened = await http.post("/v1/sessions", json=spec(2))
            assert opened.status_code == 201, opened.text
            for _ in range(50):  # completed groups are forgotten (kept 0 s here)
                await asyncio.sleep(0.1)
                if not await manager.store.groups(standing):
                    break
            assert await manager.store.groups(standing) == {}
            await asyncio.sleep(1.0)  # idle: both sessions expire at the next sweep
            for _ in range(600):  # 60 s (a busy machine sweeps later): against a hang only
                if (await manager.store.record(standing)).state != "open":
                    break
                await asyncio.sleep(0.1)
            assert (await manager.store.record(standing)).state == "expired"
            again = await asyncio.gather(*(http.post("/slime/reward", json=slime(v))
                                           for v in ("0.0", "1.0")))
            assert [r.json()["group_size"] for r in again] == [2, 2]
            assert (await manager.store.record(standing)).state == "open"


async def test_an_executor_that_breaks_fails_the_cells_typed_and_the_group_completes() -> None:
    async with pod(RefusingExecutor()) as http:
        sid = (await http.post("/v1/sessions", json=spec(2))).json()["session_id"]
        await http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
            {"group_id": "g", "prompt": "p", "rollouts": [rollout("a", 1.0), rollout("b", 0.0)]}]})
        got = (await http.get(f"/v1/sessions/{sid}/groups/g", params={"wait_s": 30})).json()
    assert got["complete"], got
    cells = [r["status"]["r"] for r in got["group"]["rollouts"]]
    assert [c["error"] for c in cells] == ["unavailable", "unavailable"]
    assert all("could not run" in c["detail"]["message"] for c in cells)
    assert [r["reward"] for r in got["group"]["rollouts"]] == [None, None]


async def test_hundreds_of_samples_at_once_on_one_pod_are_all_answered() -> None:
    # more concurrent Redis commands than redis-py's default pool of 100 allows (it raised
    # MaxConnectionsError, a 503, before the pool was a blocking one)
    config = json.dumps({**GROUPED, "group": {**GROUPED["group"], "size": 8}})
    async with pod(EchoExecutor(), compat_config=config) as http:
        answers = await asyncio.gather(*(http.post("/slime/reward", json=slime(
            str(i % 2), prompt=f"P{i // 8}")) for i in range(384)))
    assert [a.status_code for a in answers] == [200] * 384, next(
        a.text for a in answers if a.status_code != 200)
    assert {a.json()["group_size"] for a in answers} == {8}
