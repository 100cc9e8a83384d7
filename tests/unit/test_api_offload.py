"""The heavy lane (service/heavy.py): a large request's CPU steps run in one thread of their
own, queue behind each other there, never hold up a usual request's steps, validate their
body in chunks with the same result and errors, and keep their objects out of the garbage
collector's scans while they are served.

Ordering, not timing: each test holds a step on an event the test sets, so the proof does
not depend on how fast the machine is; :data:`HANG_S` only bounds a deadlock.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from typing import Any

import orjson
import pytest

from rewardd.advantages.errors import RequestInvalid
from rewardd.service import heavy
from rewardd.service.codec import parse_model
from rewardd.service.models import ScoreRequest

HANG_S = 30.0  # bounds against a deadlock, never a measurement


def body(groups: int, bad: tuple[int, str] | None = None) -> dict[str, Any]:
    """A score body of ``groups`` groups of 2 rollouts; ``bad`` = (group, field) breaks one."""
    out = {"rewards": [{"name": "m", "verifier": "exact_match"}], "groups": [
        {"group_id": f"g{g}", "reference": {"answer": "1"}, "rollouts": [
            {"rollout_id": f"g{g}r{r}", "completion": str(r), "num_tokens": 2}
            for r in range(2)]} for g in range(groups)]}
    if bad is not None:
        group, name = bad
        out["groups"][group]["rollouts"][1][name] = -5  # num_tokens >= 0; an int completion
    return out


def lane_parse(data: dict[str, Any]) -> Any:
    """parse_model as the lane runs it (in the lane's thread, a heavy scope open)."""
    async def go() -> Any:
        with heavy.scope():
            heavy.mark()
            return await heavy.offload(parse_model, orjson.dumps(data), "application/json",
                                       ScoreRequest)
    return asyncio.run(go())


def test_chunked_validation_gives_the_model_one_call_gives() -> None:
    data = body(heavy.VALIDATE_CHUNK_GROUPS * 3 + 5)
    chunked = lane_parse(data)
    assert chunked == ScoreRequest.model_validate(data)
    assert [g.group_id for g in chunked.groups] == [g["group_id"] for g in data["groups"]]


@pytest.mark.parametrize("group", [3, heavy.VALIDATE_CHUNK_GROUPS + 7,
                                   heavy.VALIDATE_CHUNK_GROUPS * 2 + 1])
@pytest.mark.parametrize("field", ["num_tokens", "completion"])
def test_chunked_validation_names_the_same_field(group: int, field: str) -> None:
    data = body(heavy.VALIDATE_CHUNK_GROUPS * 3, bad=(group, field))
    with pytest.raises(RequestInvalid) as chunked:
        lane_parse(data)
    with pytest.raises(RequestInvalid) as whole:
        parse_model(orjson.dumps(data), "application/json", ScoreRequest)
    assert chunked.value.errors == whole.value.errors
    assert chunked.value.errors[0]["loc"] == ["body", "groups", group, "rollouts", 1, field]


def test_heavy_steps_queue_behind_each_other_and_usual_ones_do_not_wait() -> None:
    first_in, release_first = threading.Event(), threading.Event()
    started: list[str] = []

    def hold() -> str:
        started.append("big 1")
        first_in.set()
        release_first.wait(HANG_S)
        return "big 1"

    def quick(name: str) -> str:
        started.append(name)
        return name

    async def big(step: Any, *args: Any) -> str:
        with heavy.scope():
            heavy.mark()
            return await heavy.offload(step, *args)

    async def usual() -> str:
        with heavy.scope():
            return await heavy.offload(quick, "small")

    async def go() -> None:
        one = asyncio.ensure_future(big(hold))
        assert await asyncio.to_thread(first_in.wait, HANG_S)
        two = asyncio.ensure_future(big(quick, "big 2"))
        # a usual request's step runs at once although the lane is held ...
        assert await asyncio.wait_for(usual(), HANG_S) == "small"
        await asyncio.sleep(0.05)
        assert "big 2" not in started  # ... while the second big one waits for the lane
        release_first.set()
        assert await asyncio.wait_for(asyncio.gather(one, two), HANG_S) == ["big 1", "big 2"]

    asyncio.run(go())
    assert started == ["big 1", "small", "big 2"]
    assert heavy.active() == 0


def test_a_heavy_request_keeps_its_objects_out_of_collections_until_it_ends() -> None:
    def build() -> list[dict[str, int]]:
        return [{"i": i} for i in range(10_000)]

    async def go() -> None:
        with heavy.scope():
            heavy.mark()
            kept = await heavy.offload(build)
            assert heavy.active() == 1
            assert gc.get_freeze_count() >= len(kept)  # not rescanned by any collection
        assert heavy.active() == 0
        assert gc.get_freeze_count() == 0  # back to the collector once no heavy one is served

    asyncio.run(go())


def test_a_usual_request_is_not_heavy_and_freezes_nothing() -> None:
    async def go() -> None:
        with heavy.scope():
            heavy.mark(heavy.heavy_rollouts(32) or heavy.heavy_body(10_000))
            assert not heavy.is_heavy()
            name = await heavy.offload(lambda: threading.current_thread().name)
            assert not name.startswith("rewardd-heavy")
        assert gc.get_freeze_count() == 0

    asyncio.run(go())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_lane_runs_below_the_loop_and_the_usual_threads() -> None:
    async def go() -> tuple[int, int]:
        with heavy.scope():
            usual = await heavy.offload(os.getpriority, os.PRIO_PROCESS, 0)
            heavy.mark()
            return usual, await heavy.offload(os.getpriority, os.PRIO_PROCESS, 0)

    usual, lane = asyncio.run(go())
    assert lane == min(19, usual + heavy.LANE_NICE)
