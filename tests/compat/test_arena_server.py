"""Group mode with a group-level verifier, end to end: a real ``rewardd serve`` whose
REWARDD_COMPAT_CONFIG asks for an arena over groups of 4, a real OpenAI-compatible judge
(tests/support/judge_server.py), and OpenRLHF-shaped requests sent one sample at a time,
concurrently and interleaved across two prompts. Each answer waits for its group; the arena
ranks the whole group, and the advantages are /v1/score's on the same group."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.judge_server import JudgeServer
from tests.support.server import running_server

pytestmark = pytest.mark.e2e

ARENA = [{"name": "arena", "verifier": "arena", "params": {"scheme": "round_robin"}}]
GRPO = {"estimator": "grpo"}
CONFIG = {"rewards": ARENA, "group": {"size": 4, "timeout_s": 120, "advantage": GRPO},
          "openrlhf": {"value": "advantage"}}
QUALITIES = {"Explain tides.": [3, 9, 1, 6], "Explain rainbows.": [2, 8, 5, 4]}


async def post_all(url: str) -> dict[tuple[str, int], dict]:
    sends = [(prompt, q) for i in range(4) for prompt, qs in QUALITIES.items()
             for q in qs[i:i + 1]]  # interleaved: tides 0, rainbows 0, tides 1, ...
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        answers = await asyncio.gather(*(http.post("/get_reward", json={
            "query": [f"{prompt} My answer. quality={q}"], "prompts": [f"{prompt} "],
            "labels": [None]}) for prompt, q in sends))
    for answer in answers:
        assert answer.status_code == 200, answer.text
    return {send: answer.json() for send, answer in zip(sends, answers)}


def test_an_arena_group_is_ranked_whole_and_each_sample_gets_its_advantage():
    judge = JudgeServer().start()
    try:
        env = {"REWARDD_COMPAT_CONFIG": json.dumps(CONFIG),
               "REWARDD_JUDGE_BASE_URL": judge.base_url, "REWARDD_JUDGE_MODEL": "rule-judge"}
        with running_server("--pool-size", "1", env=env) as url:
            answers = asyncio.run(post_all(url))
            direct = httpx.post(f"{url}/v1/score", timeout=120, json={
                "rewards": ARENA, "advantage": {**GRPO, "output": "scalar"},
                "groups": [{"group_id": prompt, "prompt": f"{prompt} ", "rollouts": [
                    {"rollout_id": str(q), "completion": f"My answer. quality={q}"}
                    for q in qs]} for prompt, qs in QUALITIES.items()]}).json()
    finally:
        judge.stop()
    for group in direct["groups"]:
        for rollout in group["rollouts"]:
            answer = answers[(group["group_id"], int(rollout["rollout_id"]))]
            assert answer["scores"] == [rollout["reward"]]
            # the group holds its samples in arrival order, which concurrent sends do not
            # fix: the same numbers, up to the last bit of a sum taken in another order
            assert answer["rewards"] == [pytest.approx(rollout["advantages"], rel=1e-12)]
            assert answer["extra_logs"]["rewardd_group_size"] == [4.0]
    # the arena's ranks inside each group of four (round robin: wins / 3)
    assert [answers[("Explain tides.", q)]["scores"][0] for q in (3, 9, 1, 6)] == [
        1 / 3, 1.0, 0.0, 2 / 3]
