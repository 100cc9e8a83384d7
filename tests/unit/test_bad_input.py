"""Bad input is rejected over HTTP with the right status, the exact field path and a reason.

Every request goes through the real app (``create_app``) with a fake executor that fails the
test if any verifier would run: validation must reject bad input before execution.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

import msgpack
import orjson
import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor, RefusingExecutor
from rewardd.workers.executor import Executor

MAX_BODY = 64 * 1024


@pytest.fixture
def executor() -> RefusingExecutor:
    return RefusingExecutor()


def make_client(executor: Executor, max_body_bytes: int = MAX_BODY) -> TestClient:
    return TestClient(create_app(Settings(pool_size=1, max_body_bytes=max_body_bytes),
                                 executor=executor))


@pytest.fixture
def client(executor: RefusingExecutor) -> Iterator[TestClient]:
    with make_client(executor) as c:
        yield c
    assert executor.run_calls == 0, "bad input reached the executor"


# ----------------------------------------------------------------------------- bodies


def rollout(rid: str, n: int = 4, **extra: Any) -> dict[str, Any]:
    return {"rollout_id": rid, "completion": "x", "num_tokens": n, **extra}


def score_body(**overrides: Any) -> dict[str, Any]:
    body = {"groups": [{"group_id": "g0", "prompt": "p", "reference": {"answer": "1"},
                        "rollouts": [rollout("r0"), rollout("r1")]}],
            "rewards": [{"name": "acc", "verifier": "math"}]}
    body.update(overrides)
    return body


def adv_body(**advantage: Any) -> dict[str, Any]:
    return {"groups": [{"group_id": "g0", "rollouts": [
                {"rollout_id": "r0", "reward": 1.0, "num_tokens": 4},
                {"rollout_id": "r1", "reward": 0.0, "num_tokens": 4}]}],
            "advantage": advantage}


def errors_of(resp: Any, status: int = 422) -> list[dict[str, Any]]:
    assert resp.status_code == status, resp.text
    detail = resp.json()["detail"]
    assert isinstance(detail, list), detail
    return detail


def only_error(resp: Any, status: int = 422) -> dict[str, Any]:
    errors = errors_of(resp, status)
    assert len(errors) == 1, errors
    return errors[0]


def error_at(resp: Any, loc: list[Any], status: int = 422) -> dict[str, Any]:
    errors = errors_of(resp, status)
    matching = [e for e in errors if e["loc"] == loc]
    assert matching, f"no error at {loc}: {errors}"
    return matching[0]


R1 = ["body", "groups", 0, "rollouts", 1]


# ----------------------------------------------------------------------------- per-token arrays


@pytest.mark.parametrize("field,value", [
    ("mask", [1, 1, 1]),
    ("values", [0.1, 0.2, 0.3, 0.4, 0.5]),
    ("token_rewards", [0.0]),
    ("token_ids", [1, 2, 3, 4, 5, 6]),
])
@pytest.mark.parametrize("route", ("/v1/score", "/v1/advantages"))
def test_per_token_array_of_wrong_length_is_422_at_its_field(client, field, value, route):
    body = score_body() if route == "/v1/score" else adv_body()
    body["groups"][0]["rollouts"][1][field] = value
    err = only_error(client.post(route, json=body))
    assert err["loc"] == R1 + [field]
    assert f"has {len(value)} entries but num_tokens is 4" in err["msg"]


def test_per_token_array_without_num_tokens_or_token_ids_is_422_at_num_tokens(client):
    body = score_body()
    del body["groups"][0]["rollouts"][1]["num_tokens"]
    body["groups"][0]["rollouts"][1]["mask"] = [1, 0]
    err = error_at(client.post("/v1/score", json=body), R1 + ["num_tokens"])
    assert "required when mask is given" in err["msg"]


def test_mask_length_is_checked_against_token_ids_when_num_tokens_is_absent(client):
    body = adv_body()
    r1 = body["groups"][0]["rollouts"][1]
    del r1["num_tokens"]
    r1["token_ids"] = [7, 8, 9]
    r1["mask"] = [1, 0]
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == R1 + ["mask"]
    assert "num_tokens is 3" in err["msg"]


def test_mask_value_other_than_0_or_1_is_422_at_its_index(client):
    body = adv_body()
    body["groups"][0]["rollouts"][1]["mask"] = [1, 0, 2, 1]
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == R1 + ["mask", 2]
    assert "0 or 1" in err["msg"] and "got 2" in err["msg"]


def test_negative_num_tokens_is_422(client):
    body = adv_body()
    body["groups"][0]["rollouts"][1]["num_tokens"] = -1
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == R1 + ["num_tokens"]
    assert "greater than or equal to 0" in err["msg"]


# ----------------------------------------------------------------------------- segments


def with_segments(segments: list[dict[str, Any]]) -> dict[str, Any]:
    body = score_body()
    body["groups"][0]["rollouts"][1]["segments"] = segments
    return body


def test_segment_ending_past_num_tokens_is_422_at_its_end(client):
    body = with_segments([{"label": "think", "start": 0, "end": 2},
                          {"label": "answer", "start": 2, "end": 5}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == R1 + ["segments", 1, "end"]
    assert "past num_tokens 4" in err["msg"]


@pytest.mark.parametrize("start,end", [(3, 1), (2, 2)])
def test_reversed_or_empty_segment_is_422_at_the_segment(client, start, end):
    body = with_segments([{"label": "think", "start": 0, "end": 1},
                          {"label": "answer", "start": start, "end": end}])
    err = error_at(client.post("/v1/score", json=body), R1 + ["segments", 1])
    assert "empty or reversed" in err["msg"]


def test_overlapping_segments_are_422_at_the_later_segment(client):
    body = with_segments([{"label": "answer", "start": 2, "end": 4},
                          {"label": "think", "start": 0, "end": 3}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == R1 + ["segments", 0]
    assert "overlaps" in err["msg"] and "segments[1]" in err["msg"]


def test_negative_segment_start_is_422(client):
    body = with_segments([{"label": "think", "start": -1, "end": 2}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == R1 + ["segments", 0, "start"]


def test_turn_past_num_tokens_is_422_at_its_end(client):
    body = score_body()
    body["groups"][0]["rollouts"][1]["turns"] = [{"start": 0, "end": 9}]
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == R1 + ["turns", 0, "end"]


# ----------------------------------------------------------------------------- groups and ids


@pytest.mark.parametrize("route", ("/v1/score", "/v1/advantages"))
def test_empty_group_is_422_at_its_rollouts(client, route):
    body = score_body() if route == "/v1/score" else adv_body()
    body["groups"][0]["rollouts"] = []
    err = only_error(client.post(route, json=body))
    assert err["loc"] == ["body", "groups", 0, "rollouts"]
    assert "at least 1 item" in err["msg"]


@pytest.mark.parametrize("route", ("/v1/score", "/v1/advantages", "/v1/rewards"))
def test_empty_groups_list_is_422_at_groups(client, route):
    body = score_body() if route != "/v1/advantages" else adv_body()
    body["groups"] = []
    err = only_error(client.post(route, json=body))
    assert err["loc"] == ["body", "groups"]
    assert "at least 1 item" in err["msg"]


def test_empty_rewards_list_is_422_at_rewards(client):
    err = only_error(client.post("/v1/score", json=score_body(rewards=[])))
    assert err["loc"] == ["body", "rewards"]


def test_duplicate_rollout_id_within_a_group_is_422(client):
    body = score_body()
    body["groups"][0]["rollouts"][1]["rollout_id"] = "r0"
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == R1 + ["rollout_id"]
    assert "duplicate rollout_id 'r0'" in err["msg"] and "groups[0].rollouts[0]" in err["msg"]


def test_duplicate_rollout_id_across_groups_is_422(client):
    body = score_body()
    body["groups"].append({"group_id": "g1", "rollouts": [rollout("r9"), rollout("r1")]})
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "groups", 1, "rollouts", 1, "rollout_id"]
    assert "duplicate rollout_id 'r1'" in err["msg"] and "groups[0].rollouts[1]" in err["msg"]


def test_duplicate_group_id_is_422(client):
    body = score_body()
    body["groups"].append({"group_id": "g0", "rollouts": [rollout("r2")]})
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "groups", 1, "group_id"]
    assert "duplicate group_id 'g0'" in err["msg"]


def test_duplicate_reward_name_is_422(client):
    body = score_body(rewards=[{"name": "acc", "verifier": "math"},
                               {"name": "acc", "verifier": "exact_match"}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 1, "name"]
    assert "duplicate reward name 'acc'" in err["msg"]


def test_unknown_field_is_422_naming_it(client):
    body = adv_body()
    body["groups"][0]["rollouts"][0]["rewrad"] = 1.0
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "rewrad"]
    assert "Extra inputs" in err["msg"]


# ----------------------------------------------------------------------------- non-finite rewards


NON_FINITE = [b"NaN", b"Infinity", b"-Infinity"]


@pytest.mark.parametrize("literal", NON_FINITE)
def test_non_finite_reward_in_json_text_is_422_at_the_reward(client, literal):
    body = (b'{"groups":[{"group_id":"g0","rollouts":[{"rollout_id":"r0","reward":' + literal
            + b',"num_tokens":2},{"rollout_id":"r1","reward":0,"num_tokens":2}]}]}')
    resp = client.post("/v1/advantages", content=body,
                       headers={"content-type": "application/json"})
    err = only_error(resp)
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "reward"]
    assert "finite" in err["msg"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_reward_in_msgpack_is_422_at_the_reward(client, value):
    body = adv_body()
    body["groups"][0]["rollouts"][0]["reward"] = value
    resp = client.post("/v1/advantages", content=msgpack.packb(body),
                       headers={"content-type": "application/msgpack"})
    err = only_error(resp)
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "reward"]
    assert "finite" in err["msg"]


def test_nan_in_a_precomputed_component_is_422_at_that_component(client):
    body = (b'{"groups":[{"group_id":"g0","rollouts":[{"rollout_id":"r0",'
            b'"rewards":{"acc":NaN},"num_tokens":2}]}]}')
    err = only_error(client.post("/v1/advantages", content=body,
                                 headers={"content-type": "application/json"}))
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "rewards", "acc"]
    assert "finite" in err["msg"]


def test_nan_in_token_rewards_is_422_at_its_index(client):
    body = (b'{"groups":[{"group_id":"g0","rollouts":[{"rollout_id":"r0","reward":1,'
            b'"num_tokens":3,"token_rewards":[0,Infinity,0]}]}]}')
    err = only_error(client.post("/v1/advantages", content=body,
                                 headers={"content-type": "application/json"}))
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "token_rewards", 1]


def test_nan_weight_on_a_reward_spec_is_422(client):
    text = orjson.dumps(score_body()).replace(b'"verifier":"math"',
                                              b'"verifier":"math","weight":NaN')
    err = only_error(client.post("/v1/score", content=text,
                                 headers={"content-type": "application/json"}))
    assert err["loc"] == ["body", "rewards", 0, "weight"]


# ----------------------------------------------------------------------------- names


def test_unknown_verifier_is_422_listing_the_valid_names(client):
    body = score_body(rewards=[{"name": "acc", "verifier": "nope"}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "verifier"]
    assert "unknown verifier 'nope'" in err["msg"]
    assert "math" in err["msg"] and "regex" in err["msg"] and "exact_match" in err["msg"]


def test_unknown_verifier_on_rewards_route_is_422(client):
    body = score_body(rewards=[{"name": "acc", "verifier": "nope"}])
    err = only_error(client.post("/v1/rewards", json=body))
    assert err["loc"] == ["body", "rewards", 0, "verifier"]


@pytest.mark.parametrize("route", ("/v1/score", "/v1/advantages"))
def test_unknown_estimator_is_422_listing_the_valid_names(client, route):
    body = score_body() if route == "/v1/score" else adv_body()
    body["advantage"] = {"estimator": "ppo_magic"}
    err = only_error(client.post(route, json=body))
    assert err["loc"] == ["body", "advantage", "estimator"]
    assert "unknown estimator 'ppo_magic'" in err["msg"]
    assert "grpo" in err["msg"] and "rloo" in err["msg"]


def test_unknown_profile_is_422_at_profile(client):
    err = only_error(client.post("/v1/advantages", json=adv_body(profile="deepspeed")))
    assert err["loc"] == ["body", "advantage", "profile"]
    assert "verl" in err["msg"]


def test_unknown_output_format_is_422_at_output(client):
    err = only_error(client.post("/v1/advantages", json=adv_body(output="csv")))
    assert err["loc"] == ["body", "advantage", "output"]
    assert "'rle'" in err["msg"]


def test_unknown_verifier_in_path_is_404_listing_the_valid_names(client):
    resp = client.post("/v1/verify/nope", json={"completion": "42"})
    assert resp.status_code == 404
    detail = resp.json()["detail"]
    assert "unknown verifier 'nope'" in detail and "math" in detail and "regex" in detail


def test_openrlhf_profile_with_unequal_groups_is_422_at_profile(client):
    body = adv_body(profile="openrlhf")
    body["groups"].append({"group_id": "g1", "rollouts": [
        {"rollout_id": "r2", "reward": 1.0, "num_tokens": 1}]})
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == ["body", "advantage", "profile"]
    assert "equal size" in err["msg"]


# ----------------------------------------------------------------------------- parameters


def test_regex_pattern_of_wrong_type_is_422_at_params_pattern(client):
    body = score_body(rewards=[{"name": "fmt", "verifier": "regex", "params": {"pattern": 5}}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "params", "pattern"]
    assert "valid string" in err["msg"]


def test_invalid_regex_pattern_is_422_at_params_pattern(client):
    body = score_body(rewards=[{"name": "fmt", "verifier": "regex", "params": {"pattern": "("}}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "params", "pattern"]
    assert "invalid regular expression" in err["msg"]


def test_missing_required_verifier_param_is_422(client):
    body = score_body(rewards=[{"name": "fmt", "verifier": "regex", "params": {}}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "params", "pattern"]
    assert err["type"] == "missing"


def test_unknown_verifier_param_is_422_naming_it(client):
    body = score_body(rewards=[{"name": "fmt", "verifier": "regex",
                                "params": {"pattern": "x", "patern": "y"}}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "params", "patern"]
    assert "Extra inputs" in err["msg"]


def test_length_max_length_not_an_integer_is_422(client):
    body = score_body(rewards=[{"name": "len", "verifier": "length",
                                "params": {"max_length": "abc"}}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "params", "max_length"]
    assert "valid integer" in err["msg"]


def test_length_buffer_not_below_max_length_is_422_at_params(client):
    body = score_body(rewards=[{"name": "len", "verifier": "length",
                                "params": {"max_length": 10, "buffer": 10}}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "params"]
    assert "buffer must be smaller than max_length" in err["msg"]


@pytest.mark.parametrize("route", ("/v1/score", "/v1/advantages"))
def test_unknown_estimator_param_is_422_at_advantage_params(client, route):
    body = score_body() if route == "/v1/score" else adv_body()
    body["advantage"] = {"estimator": "grpo", "params": {"epsilon": 1e-3}}
    err = only_error(client.post(route, json=body))
    assert err["loc"] == ["body", "advantage", "params", "epsilon"]
    assert "Extra inputs" in err["msg"]


def test_verify_route_rejects_bad_params_before_running(client):
    resp = client.post("/v1/verify/regex", json={"completion": "x", "params": {"pattern": "("}})
    err = only_error(resp)
    assert err["loc"] == ["body", "params", "pattern"]
    assert "invalid regular expression" in err["msg"]


def test_segments_on_a_reward_spec_is_422_saying_routing_is_not_available(client):
    body = score_body(rewards=[{"name": "acc", "verifier": "math", "segments": ["answer"]}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "segments"]
    assert "not available" in err["msg"] and "routing" in err["msg"]


def test_timeout_over_the_server_maximum_is_422(client):
    body = score_body(rewards=[{"name": "acc", "verifier": "math", "timeout_s": 500}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "timeout_s"]
    assert "500s is over the server's limit of 120s" in err["msg"]


@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_timeout_is_422(client, value):
    body = score_body(rewards=[{"name": "acc", "verifier": "math", "timeout_s": value}])
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "rewards", 0, "timeout_s"]
    assert "greater than 0" in err["msg"]


def test_precomputed_component_named_like_a_verifier_component_is_422(client):
    body = score_body()
    body["groups"][0]["rollouts"][1]["rewards"] = {"acc": 1.0}
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == R1 + ["rewards"]
    assert "'acc'" in err["msg"]


def test_reward_and_rewards_on_one_rollout_is_422(client):
    body = adv_body()
    body["groups"][0]["rollouts"][1]["rewards"] = {"acc": 1.0}
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == R1 + ["reward"]
    assert "not both" in err["msg"]


def test_advantages_without_any_reward_is_422_at_groups(client):
    body = adv_body()
    for r in body["groups"][0]["rollouts"]:
        del r["reward"]
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == ["body", "groups"]
    assert "no rewards" in err["msg"]


# ----------------------------------------------------------------------------- num_tokens


@pytest.mark.parametrize("output", ("rle", "dense"))
def test_num_tokens_missing_for_token_level_output_is_422_at_num_tokens(client, output):
    body = adv_body(output=output)
    del body["groups"][0]["rollouts"][1]["num_tokens"]
    err = only_error(client.post("/v1/advantages", json=body))
    assert err["loc"] == R1 + ["num_tokens"]
    assert f"required for advantage output '{output}'" in err["msg"]


def test_num_tokens_missing_is_422_on_score_with_default_rle_output(client):
    body = score_body()
    del body["groups"][0]["rollouts"][0]["num_tokens"]
    err = only_error(client.post("/v1/score", json=body))
    assert err["loc"] == ["body", "groups", 0, "rollouts", 0, "num_tokens"]


@pytest.mark.parametrize("output", ("scalar", "none"))
def test_scalar_and_none_outputs_do_not_require_num_tokens(client, output):
    body = adv_body(output=output)
    for r in body["groups"][0]["rollouts"]:
        del r["num_tokens"]
    resp = client.post("/v1/advantages", json=body)
    assert resp.status_code == 200, resp.text
    rollouts = resp.json()["groups"][0]["rollouts"]
    if output == "scalar":
        assert rollouts[0]["advantages"] == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-6), abs=1e-12)
    else:
        assert rollouts[0]["advantages"] is None


# ----------------------------------------------------------------------------- body transport


def test_body_over_the_size_limit_with_content_length_is_413(executor):
    with make_client(executor, max_body_bytes=1000) as c:
        body = adv_body()
        body["groups"][0]["rollouts"][0]["token_ids"] = list(range(400))
        body["groups"][0]["rollouts"][0]["num_tokens"] = 400
        resp = c.post("/v1/advantages", json=body)
    assert resp.status_code == 413
    assert "over the limit of 1000 bytes" in resp.json()["detail"]
    assert executor.run_calls == 0


def test_chunked_body_over_the_size_limit_without_content_length_is_413(executor):
    def chunks() -> Iterator[bytes]:
        yield b'{"groups":['
        for k in range(50):
            yield b'{"group_id":"g%d","rollouts":[{"rollout_id":"r%d","reward":1}]},' % (k, k)
        yield b'{"group_id":"last","rollouts":[{"rollout_id":"last","reward":1}]}]}'

    with make_client(executor, max_body_bytes=1000) as c:
        resp = c.post("/v1/advantages", content=chunks(),
                      headers={"content-type": "application/json"})
    assert resp.request.headers.get("content-length") is None
    assert resp.status_code == 413
    assert "over the limit of 1000 bytes" in resp.json()["detail"]


def test_chunked_body_under_the_size_limit_is_accepted(executor):
    def chunks() -> Iterator[bytes]:
        text = orjson.dumps(adv_body(output="scalar"))
        for k in range(0, len(text), 16):
            yield text[k:k + 16]

    with make_client(executor, max_body_bytes=1000) as c:
        resp = c.post("/v1/advantages", content=chunks(),
                      headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text


def test_body_at_exactly_the_limit_is_accepted(executor):
    text = orjson.dumps(adv_body(output="scalar"))
    with make_client(executor, max_body_bytes=len(text)) as c:
        assert c.post("/v1/advantages", content=text,
                      headers={"content-type": "application/json"}).status_code == 200
        assert c.post("/v1/advantages", content=text + b" ",
                      headers={"content-type": "application/json"}).status_code == 413


@pytest.mark.parametrize("content", [b"{", b'{"groups": [}', b"", b"\xff\xfe"])
def test_invalid_json_is_400(client, content):
    resp = client.post("/v1/advantages", content=content,
                       headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert "not valid JSON" in resp.json()["detail"]


def test_deeply_nested_json_is_400_not_500(executor):
    with TestClient(create_app(Settings(pool_size=1, max_body_bytes=MAX_BODY),
                               executor=executor), raise_server_exceptions=False) as c:
        resp = c.post("/v1/advantages", content=b'{"groups":' + b"[" * 5000,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert "not valid JSON" in resp.json()["detail"]


def test_invalid_msgpack_is_400(client):
    resp = client.post("/v1/advantages", content=b"\xc1\xc1\xc1",
                       headers={"content-type": "application/msgpack"})
    assert resp.status_code == 400
    assert "not valid msgpack" in resp.json()["detail"]


@pytest.mark.parametrize("media", ["text/plain", "application/xml",
                                   "application/x-www-form-urlencoded"])
def test_unsupported_content_type_is_415(client, media):
    resp = client.post("/v1/advantages", content=orjson.dumps(adv_body()),
                       headers={"content-type": media})
    assert resp.status_code == 415
    assert "unsupported Content-Type" in resp.json()["detail"]


def test_json_body_that_is_not_an_object_is_422_at_body(client):
    resp = client.post("/v1/advantages", json=[1, 2, 3])
    err = only_error(resp)
    assert err["loc"] == ["body"]


def test_json_with_charset_parameter_is_accepted(client):
    resp = client.post("/v1/advantages", content=orjson.dumps(adv_body()),
                       headers={"content-type": "application/json; charset=utf-8"})
    assert resp.status_code == 200, resp.text


# ----------------------------------------------------------------------------- msgpack wire


@pytest.mark.parametrize("output", ("rle", "dense", "scalar"))
def test_msgpack_request_and_response_round_trip_equals_the_json_response(client, output):
    body = {"run_id": "run-1", "groups": [
        {"group_id": "g0", "rollouts": [
            {"rollout_id": "a", "reward": 1.0, "num_tokens": 5, "mask": [1, 0, 1, 1, 0]},
            {"rollout_id": "b", "reward": 0.0, "num_tokens": 3},
            {"rollout_id": "c", "rewards": {"x": None}, "num_tokens": 2},
            {"rollout_id": "d", "reward": 0.25, "num_tokens": 0}]},
        {"group_id": "g1", "rollouts": [{"rollout_id": "e", "reward": 0.3, "num_tokens": 2}]}],
        "advantage": {"estimator": "grpo", "output": output}}
    as_json = client.post("/v1/advantages", json=body)
    as_msgpack = client.post("/v1/advantages", content=msgpack.packb(body),
                             headers={"content-type": "application/msgpack",
                                      "accept": "application/msgpack"})
    assert as_json.status_code == 200 and as_msgpack.status_code == 200, as_msgpack.content
    assert as_msgpack.headers["content-type"].startswith("application/msgpack")
    assert as_json.headers["content-type"].startswith("application/json")
    decoded = msgpack.unpackb(as_msgpack.content, raw=False, strict_map_key=False)
    assert decoded == orjson.loads(as_json.content)
    assert decoded["run_id"] == "run-1"


def test_msgpack_error_response_is_json_with_field_path(client):
    body = copy.deepcopy(adv_body())
    body["groups"][0]["rollouts"][0]["reward"] = float("nan")
    resp = client.post("/v1/advantages", content=msgpack.packb(body),
                       headers={"content-type": "application/x-msgpack",
                                "accept": "application/msgpack"})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "groups", 0, "rollouts", 0, "reward"]


# ----------------------------------------------------------------------------- size guards


def test_num_tokens_beyond_the_per_rollout_cap_is_422(client):
    body = adv_body(output="rle")
    body["groups"][0]["rollouts"][0]["num_tokens"] = 2 ** 40
    err = error_at(client.post("/v1/advantages", json=body),
                   ["body", "groups", 0, "rollouts", 0, "num_tokens"])
    assert "less than or equal to 16777216" in err["msg"]


def test_total_tokens_beyond_the_request_cap_is_422_for_dense_and_rle(client):
    rollouts = [{"rollout_id": f"r{i}", "reward": float(i % 2), "num_tokens": 1 << 24}
                for i in range(9)]
    body = {"groups": [{"group_id": "g0", "rollouts": rollouts}],
            "advantage": {"output": "dense"}}
    err = error_at(client.post("/v1/advantages", json=body), ["body", "groups"])
    assert "over the limit of 4194304 (REWARDD_MAX_DENSE_TOKENS)" in err["msg"]
    assert "split the batch" in err["msg"]
    body["advantage"]["output"] = "scalar"
    assert client.post("/v1/advantages", json=body).status_code == 200


def test_weight_beyond_its_bound_is_422(client):
    body = score_body()
    body["rewards"][0]["weight"] = 1e9
    error_at(client.post("/v1/score", json=body), ["body", "rewards", 0, "weight"])


def test_verify_timeout_over_the_server_limit_is_422(client):
    resp = client.post("/v1/verify/math", json={"completion": "x", "timeout_s": 1e6})
    err = error_at(resp, ["body", "timeout_s"])
    assert "over the server's limit" in err["msg"]


@pytest.mark.parametrize("route", ["/v1/score", "/v1/rewards", "/v1/jobs"])
def test_more_rollouts_than_the_operator_allows_is_422_at_groups(route: str) -> None:
    executor = GatedExecutor()
    executor.gate.set()  # answers every check at once: the request within the limit is served
    app = create_app(Settings(pool_size=1, max_rollouts_per_request=3), executor=executor)
    body = score_body(groups=[{"group_id": "g0", "reference": {"answer": "1"},
                               "rollouts": [rollout(f"r{i}") for i in range(4)]}])
    with TestClient(app) as client:
        refused = client.post(route, json=body)
        assert refused.status_code == 422
        (only,) = refused.json()["detail"]
        assert only["loc"] == ["body", "groups"]
        assert only["msg"].startswith("4 rollouts in one request is over the limit of 3")
        body["groups"][0]["rollouts"] = body["groups"][0]["rollouts"][:3]
        assert client.post(route, json=body).status_code in (200, 202)
    assert executor.entered <= 1  # the refused request never reached the verifiers


@pytest.mark.parametrize("route", ["/v1/score", "/v1/rewards", "/v1/jobs", "/v1/verify/code"])
@pytest.mark.parametrize("field", [("test_code",), ("checker", "code")])
def test_a_code_field_over_its_size_limit_is_422_naming_it(route: str,
                                                           field: tuple[str, ...]) -> None:
    """Issue 28 row 6: code fields of a reference are capped (REWARDD_MAX_CODE_FIELD_BYTES)
    before any of it reaches a worker or a sandbox."""
    executor = GatedExecutor()
    executor.gate.set()
    app = create_app(Settings(pool_size=1, max_code_field_bytes=4096), executor=executor)
    code = "assert f(1) == 1\n" * 300  # 5,100 bytes
    reference: dict[str, Any] = {"tests": {"inputs": ["1\n"], "outputs": ["1\n"]}}
    if field == ("test_code",):
        reference = {"test_code": code}
    else:
        reference["checker"] = {"language": "python", "code": code}
    if route.startswith("/v1/verify"):
        body: dict[str, Any] = {"completion": "x", "reference": reference}
        loc = ["body", "reference", *field]
    else:
        body = score_body(groups=[{"group_id": "g0", "reference": reference,
                                   "rollouts": [rollout("a"), rollout("b")]}])
        body["rewards"] = [{"name": "tests", "verifier": "code"}]
        loc = ["body", "groups", 0, "reference", *field]
    with TestClient(app) as client:
        refused = client.post(route, json=body)
        err = error_at(refused, loc)
        assert "over the limit of 4096 (REWARDD_MAX_CODE_FIELD_BYTES)" in err["msg"]
    assert executor.entered == 0  # nothing reached the verifiers
