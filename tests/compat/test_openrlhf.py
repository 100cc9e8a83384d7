"""OpenRLHF's POST /get_reward: the body OpenRLHF 0.11.2 posts ({"query", "prompts",
"labels"}), scored per sample by default (math verifier, label as the answer)."""

from __future__ import annotations

import pytest

from tests.compat.conftest import client, make_app

PROMPT = "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n"


async def test_each_query_is_its_completion_after_the_prompt_scored_by_math(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json={
            "query": [PROMPT + "It is \\boxed{4}.", PROMPT + "It is \\boxed{5}.",
                      "Q: x? \\boxed{\\frac{1}{2}}"],
            "prompts": [PROMPT, PROMPT, "Q: x? "],
            "labels": ["4", "4", {"answer": "0.5"}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"rewards": [1.0, 0.0, 1.0], "scores": [1.0, 0.0, 1.0],
                        "extra_logs": {"correct": [1.0, 0.0, 1.0],
                                       "rewardd_failed": [0.0, 0.0, 0.0],
                                       "rewardd_prompt_mismatch": [0.0, 0.0, 0.0]}}


async def test_a_prompt_holding_the_answer_is_not_scored_only_the_completion_is(executor):
    prompt = "Example: \\boxed{4}. Now: what is 2+3? "
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json={"query": [prompt + "no idea"],
                                                 "prompts": [prompt], "labels": ["4"]})
    assert r.json()["rewards"] == [0.0]


async def test_a_query_not_starting_with_its_prompt_is_scored_whole_and_flagged(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json={
            "query": ["Q: 2+2?\nA: \\boxed{4}"], "prompts": ["Q: 2 + 2? "], "labels": ["4"]})
    assert r.json()["rewards"] == [1.0]
    assert r.json()["extra_logs"]["rewardd_prompt_mismatch"] == [1.0]


async def test_empty_lists_answer_empty_lists(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json={"query": [], "prompts": [], "labels": []})
    assert r.status_code == 200
    assert r.json() == {"rewards": [], "scores": [], "extra_logs": {
        "correct": [], "rewardd_failed": [], "rewardd_prompt_mismatch": []}}


async def test_a_query_alone_as_older_openrlhf_sent_it_is_scored_whole(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json={"query": ["\\boxed{4}"]})
    assert r.status_code == 200
    # no label, no reference: the math check fails and its fallback (0.0) is flagged
    assert r.json()["rewards"] == [0.0]
    assert r.json()["extra_logs"]["rewardd_failed"] == [1.0]


@pytest.mark.parametrize("body, loc, words", [
    ({"query": ["a", "b"], "prompts": ["a"], "labels": ["1", "2"]}, ["body", "prompts"],
     "1 entries, and query has 2"),
    ({"query": ["a"], "prompts": ["a"], "labels": []}, ["body", "labels"],
     "0 entries, and query has 1"),
    ({"query": "a", "prompts": ["a"], "labels": ["1"]}, ["body", "query"], "list"),
    ({"prompts": ["a"], "labels": ["1"]}, ["body", "query"], "required"),
    ({"query": ["a"], "prompts": ["a"], "labels": [["1"]]}, ["body", "labels", 0], ""),
    ({"query": ["a"], "prompt": ["a"]}, ["body", "prompt"], "not permitted"),
])
async def test_wrong_shapes_are_422_naming_the_field(executor, body, loc, words):
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json=body)
    assert r.status_code == 422, r.text
    first = r.json()["detail"][0]
    assert first["loc"][:len(loc)] == loc and words in first["msg"], first


async def test_a_bad_label_scores_the_fallback_and_says_so(executor):
    async with client(make_app(executor)) as http:
        r = await http.post("/get_reward", json={"query": ["\\boxed{4}"], "prompts": [""],
                                                 "labels": ["\\frac{"]})
    assert r.json()["rewards"] == [0.0]
    assert r.json()["extra_logs"]["rewardd_failed"] == [1.0]


async def test_without_a_fallback_a_bad_label_is_422_naming_the_label(executor):
    config = {"rewards": [{"name": "correct", "verifier": "math"}]}
    async with client(make_app(executor, config)) as http:
        r = await http.post("/get_reward", json={"query": ["a \\boxed{4}", "b \\boxed{4}"],
                                                 "prompts": ["a ", "b "],
                                                 "labels": ["4", "\\frac{"]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "labels", 1]
    assert "invalid_reference" in r.json()["detail"][0]["msg"]


async def test_components_reference_template_and_json_labels_come_from_the_config(executor):
    config = {"rewards": [{"name": "exact", "verifier": "exact_match", "weight": 2.0},
                          {"name": "boxed", "verifier": "regex", "weight": 0.5,
                           "params": {"pattern": "boxed"}}],
              "reference": {"answer": "{label}"}, "label_format": "json"}
    async with client(make_app(executor, config)) as http:
        r = await http.post("/get_reward", json={
            "query": ["p:yes", "p:\\boxed{x}", "p:no"], "prompts": ["p:", "p:", "p:"],
            "labels": ['"yes"', '{"answer": "\\\\boxed{x}"}', "7"]})
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == [2.0, 2.5, 0.0]
    assert r.json()["extra_logs"]["exact"] == [1.0, 1.0, 0.0]
    assert r.json()["extra_logs"]["boxed"] == [0.0, 1.0, 0.0]


async def test_a_json_label_that_is_not_json_is_422_naming_it(executor):
    async with client(make_app(executor, {"label_format": "json"})) as http:
        r = await http.post("/get_reward", json={"query": ["x"], "prompts": [""],
                                                 "labels": ["{oops"]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "labels", 0]


async def test_api_keys_apply_as_on_v1(executor):
    app = make_app(executor, api_keys="key-a=alice")
    body = {"query": ["\\boxed{4}"], "prompts": [""], "labels": ["4"]}
    async with client(app) as http:
        assert (await http.post("/get_reward", json=body)).status_code == 401
        assert (await http.post("/verify", json={})).status_code == 401
        assert (await http.post("/slime/reward", json={})).status_code == 401
        ok = await http.post("/get_reward", json=body,
                             headers={"Authorization": "Bearer key-a"})
    assert ok.status_code == 200 and ok.json()["rewards"] == [1.0]
