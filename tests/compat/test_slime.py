"""slime's remote reward call (``--rm-type remote_rm --rm-url``): POST {"prompt", "response",
"label"}, the answer a JSON object whose reward slime reads under ``--reward-key``."""

from __future__ import annotations

import pytest

from tests.compat.conftest import client, make_app


async def test_the_answer_holds_the_reward_and_each_component(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/slime/reward", json={
            "prompt": "What is 2+2?", "response": "It is \\boxed{4}.", "label": "4"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"]["correct"]["ok"] is True
    del body["status"]
    assert body == {"reward": 1.0, "score": 1.0, "advantage": None,
                    "rewards": {"correct": 1.0}, "failed": False, "group_size": 1,
                    "timed_out": False}


async def test_chat_prompts_object_labels_and_null_labels_are_read(executor):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    async with client(make_app(executor)) as http:
        r = await http.post("/slime/reward", json={"prompt": chat, "response": "\\boxed{0.5}",
                                                   "label": {"answer": "\\frac{1}{2}"}})
        unlabelled = await http.post("/slime/reward", json={"prompt": chat,
                                                            "response": "\\boxed{4}",
                                                            "label": None})
    assert r.json()["reward"] == 1.0
    assert unlabelled.json()["reward"] == 0.0 and unlabelled.json()["failed"] is True
    assert unlabelled.json()["status"]["correct"]["error"] == "invalid_reference"


async def test_the_path_and_the_reward_key_come_from_the_config(executor):
    config = {"slime": {"path": "/rm/math", "reward_key": "acc"}}
    async with client(make_app(executor, config)) as http:
        r = await http.post("/rm/math", json={"prompt": "p", "response": "\\boxed{3}",
                                              "label": "3"})
        default_path = await http.post("/slime/reward", json={"prompt": "p",
                                                              "response": "x", "label": "3"})
    assert r.status_code == 200, r.text
    assert r.json()["acc"] == 1.0 == r.json()["reward"]
    assert default_path.status_code == 404


@pytest.mark.parametrize("body, loc", [
    ({"prompt": "p", "label": "4"}, ["body", "response"]),
    ({"prompt": "p", "response": 4, "label": "4"}, ["body", "response"]),
    ({"prompt": 3, "response": "x", "label": "4"}, ["body", "prompt"]),
    ({"prompt": "p", "response": "x", "label": [1]}, ["body", "label"]),
    ({"prompt": "p", "response": "x", "label": "4", "extra": 1}, ["body", "extra"]),
])
async def test_wrong_shapes_are_422_naming_the_field(executor, body, loc):
    async with client(make_app(executor)) as http:
        r = await http.post("/slime/reward", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:len(loc)] == loc
