"""Group mode: per-sample requests wait until ``group.size`` samples of their prompt and label
arrived, are scored as one /v1/score group, and each answers with its own sample's reward and
group advantage; a group not complete in ``group.timeout_s`` is scored from what arrived, or
answered 504."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.compat.conftest import client, make_app

GROUPED = {"group": {"size": 3, "timeout_s": 60,
                     "advantage": {"estimator": "grpo", "profile": "openrlhf"}},
           "openrlhf": {"value": "advantage"}}


def openrlhf(prompt: str, completion: str, label: str) -> dict[str, Any]:
    return {"query": [prompt + completion], "prompts": [prompt], "labels": [label]}


async def score_directly(http: Any, prompt: str, label: str, completions: list[str],
                         spec: dict[str, Any]) -> dict[str, float]:
    """The same group through /v1/score: completion -> advantage."""
    r = await http.post("/v1/score", json={
        "groups": [{"group_id": "g", "prompt": prompt, "reference": {"answer": label},
                    "rollouts": [{"rollout_id": str(i), "completion": c}
                                 for i, c in enumerate(completions)]}],
        "rewards": [{"name": "correct", "verifier": "math", "fallback": 0.0}],
        "advantage": {**spec, "output": "scalar"}})
    assert r.status_code == 200, r.text
    return {c: ro["advantages"] for c, ro in zip(completions, r.json()["groups"][0]["rollouts"])}


async def test_interleaved_groups_each_answer_when_whole_with_v1_score_advantages(executor):
    a = ["\\boxed{4}", "\\boxed{5}", "\\boxed{4} again"]
    b = ["\\boxed{1}", "\\boxed{7}", "\\boxed{2}"]
    async with client(make_app(executor, GROUPED)) as http:
        first = [asyncio.create_task(http.post("/get_reward", json=openrlhf("A:", c, "4")))
                 for c in a[:2]]
        second = [asyncio.create_task(http.post("/get_reward", json=openrlhf("B:", c, "7")))
                  for c in b[:2]]
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in first + second)  # waiting for their groups
        last_b = await http.post("/get_reward", json=openrlhf("B:", b[2], "7"))
        assert not any(t.done() for t in first)
        last_a = await http.post("/get_reward", json=openrlhf("A:", a[2], "4"))
        answers_a = [(await t).json() for t in first] + [last_a.json()]
        answers_b = [(await t).json() for t in second] + [last_b.json()]
        spec = GROUPED["group"]["advantage"]
        expected_a = await score_directly(http, "A:", "4", a, spec)
        expected_b = await score_directly(http, "B:", "7", b, spec)
    assert [x["scores"] for x in answers_a] == [[1.0], [0.0], [1.0]]
    assert [x["scores"] for x in answers_b] == [[0.0], [1.0], [0.0]]
    # concurrent sends may arrive in either order, the group's order: equal up to the last
    # bit of a sum taken in another order
    assert [x["rewards"][0] for x in answers_a] == [pytest.approx(expected_a[c], rel=1e-12)
                                                    for c in a]
    assert [x["rewards"][0] for x in answers_b] == [pytest.approx(expected_b[c], rel=1e-12)
                                                    for c in b]
    assert expected_a[a[0]] > 0 > expected_a[a[1]]
    assert all(x["extra_logs"]["rewardd_group_size"] == [3.0] for x in answers_a + answers_b)


async def test_the_same_prompt_again_opens_a_new_group_and_another_label_is_another(executor):
    sent = [(1, "1"), (1, "1"), (2, "1"), (2, "2"), (1, "1"), (2, "2"), (1, "1"), (2, "2"),
            (1, "1")]
    async with client(make_app(executor, GROUPED)) as http:
        answers = [r.json() for r in await asyncio.gather(*(
            http.post("/slime/reward", json={"prompt": "P", "response": f"\\boxed{{{v}}}",
                                             "label": label}) for v, label in sent))]
    # label "1": six samples, two groups of three; label "2": one group of three
    assert all(a["group_size"] == 3 and not a["timed_out"] for a in answers)
    by_label = {label: [a for a, (_, lab) in zip(answers, sent) if lab == label]
                for label in ("1", "2")}
    assert [a["advantage"] for a in by_label["2"]] == [0.0, 0.0, 0.0]  # all right: no spread
    assert sorted(a["score"] for a in by_label["1"]) == [0.0] + [1.0] * 5
    # the group holding the wrong answer has a spread, the other (all right) has none
    assert [a["advantage"] for a in by_label["1"]].count(0.0) == 3


async def test_a_timed_out_group_is_scored_from_what_arrived(executor):
    config = {**GROUPED, "group": {**GROUPED["group"], "timeout_s": 0.5},
              "slime": {"value": "advantage"}}
    async with client(make_app(executor, config)) as http:
        sends = [http.post("/slime/reward", json={"prompt": "T", "response": c, "label": "3"})
                 for c in ("\\boxed{3}", "\\boxed{2}")]
        answers = [r.json() for r in await asyncio.gather(*sends)]
        expected = await score_directly(http, "T", "3", ["\\boxed{3}", "\\boxed{2}"],
                                        GROUPED["group"]["advantage"])
    assert [(a["group_size"], a["timed_out"]) for a in answers] == [(2, True), (2, True)]
    assert [a["reward"] for a in answers] == [expected["\\boxed{3}"], expected["\\boxed{2}"]]
    assert [a["score"] for a in answers] == [1.0, 0.0]


async def test_a_timed_out_group_is_504_when_the_config_says_fail(executor):
    config = {"group": {"size": 3, "timeout_s": 0.3, "on_timeout": "fail"}}
    async with client(make_app(executor, config)) as http:
        r = await http.post("/verify", json={
            "responses_create_params": {"input": "2+2?"}, "expected_answer": "4",
            "response": {"output": [{"type": "message", "content": [
                {"type": "output_text", "text": "\\boxed{4}"}]}]}})
    assert r.status_code == 504, r.text
    assert "1 of 3 samples within 0.3 s" in r.json()["detail"]
