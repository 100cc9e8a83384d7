"""NeMo-Gym's POST /verify: BaseVerifyRequest (responses_create_params, response: an OpenAI
Responses object, and the task's fields) answered echoed with BaseVerifyResponse's fields."""

from __future__ import annotations

import copy

import pytest

from tests.compat.conftest import client, make_app


def responses_object(*texts: str) -> dict:
    """An OpenAI Responses object as NeMo-Gym's tests build it (NeMoGymResponse.model_dump)."""
    return {"id": "resp_1", "created_at": 1234.5, "model": "policy", "object": "response",
            "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
            "output": [{"id": "rs_1", "type": "reasoning", "summary": []},
                       *({"id": f"msg_{i}", "type": "message", "role": "assistant",
                          "status": "completed",
                          "content": [{"type": "output_text", "text": t, "annotations": []}]}
                         for i, t in enumerate(texts)),
                       {"id": "msg_r", "type": "message", "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "refusal", "refusal": "\\boxed{9}"}]}]}


def verify_body(*texts: str, **task) -> dict:
    return {"responses_create_params": {"input": [{"role": "user",
                                                   "content": "Simplify x + 7 - 6"}]},
            "response": responses_object(*texts), "question": "Simplify x + 7 - 6",
            "expected_answer": "x + 1", **task}


async def test_the_request_is_echoed_with_the_reward(executor):
    body = verify_body("$1", " + x = \\boxed{x + 1}$")
    async with client(make_app(executor)) as http:
        r = await http.post("/verify", json=body)
    assert r.status_code == 200, r.text
    expected = {**copy.deepcopy(body), "reward": 1.0, "mask_sample": False,
                "failure_kind": None, "failure_reason": None}
    assert r.json() == expected


async def test_only_output_text_of_messages_is_the_answer(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/verify", json=verify_body("no box here"))  # refusal has one
    assert r.json()["reward"] == 0.0 and r.json()["mask_sample"] is False


async def test_several_rewards_add_reward_components(executor):
    config = {"rewards": [{"name": "correct", "verifier": "math"},
                          {"name": "short", "verifier": "length", "weight": 0.5,
                           "params": {"unit": "chars", "max_length": 1000}}]}
    async with client(make_app(executor, config)) as http:
        r = await http.post("/verify", json=verify_body("\\boxed{x+1}"))
    assert r.status_code == 200, r.text
    assert r.json()["reward_components"]["correct"] == 1.0
    assert set(r.json()["reward_components"]) == {"correct", "short"}
    assert r.json()["reward"] == 1.0 + 0.5 * r.json()["reward_components"]["short"]


async def test_a_failed_check_masks_the_sample_and_names_the_failure(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/verify", json=verify_body("\\boxed{1}", expected_answer="\\frac{"))
    assert r.json()["reward"] == 0.0
    assert r.json()["mask_sample"] is True
    assert r.json()["failure_kind"] == "rewardd:invalid_reference"
    assert r.json()["failure_reason"].startswith("correct: ")


async def test_the_label_field_comes_from_the_config(executor):
    config = {"nemo_gym": {"label_field": "verifier_metadata"}}
    body = verify_body("\\boxed{5}", verifier_metadata={"answer": "5"})
    async with client(make_app(executor, config)) as http:
        r = await http.post("/verify", json=body)
    assert r.json()["reward"] == 1.0
    assert r.json()["verifier_metadata"] == {"answer": "5"}


@pytest.mark.parametrize("drop, loc", [("response", ["body", "response"]),
                                       ("responses_create_params",
                                        ["body", "responses_create_params"])])
async def test_a_missing_field_is_422_naming_it(executor, drop, loc):
    body = verify_body("x")
    del body[drop]
    async with client(make_app(executor)) as http:
        r = await http.post("/verify", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc


async def test_a_label_of_the_wrong_type_is_422_naming_its_field(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/verify", json=verify_body("x", expected_answer=[1, 2]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "expected_answer"]
