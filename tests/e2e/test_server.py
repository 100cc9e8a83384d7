"""End to end against a real ``rewardd serve`` process, through ``rewardd_client``.

Every number checked here is recomputed in the test from first principles (the returned
rewards, the estimator formulas of docs/architecture.md / docs/estimators.md), not read back from
the library under test.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rewardd_client.client import AsyncRewarddClient, RewarddClient, RewarddError
from rewardd.service.models import ScoreRequest, ScoreResponse, VerifyResponse
from tests.conftest import SERVER_MAX_BODY_BYTES

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "openapi" / "examples"
EPS = 1e-6  # rewardd profile epsilon
REL = 1e-12
SLEEP_S = 60
"""How long the misbehaving checks sleep: a timer never fires early, so an answer sooner
shows they were cut, on a machine of any speed (order, not a wall-clock bound)."""
HANG_S = 120.0  # bounds against a hang, never a measurement


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())


def grpo_expected(rewards: list[float], eps: float = EPS) -> list[float]:
    """(r - mean) / (unbiased std + eps); 0 for a zero-spread group."""
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def fallback_used(cell: dict[str, Any]) -> bool:
    """``fallback_used`` may be omitted when false; absent means false."""
    return bool(cell.get("fallback_used", False))


# ---- the bundled example batch --------------------------------------------------------------

def test_healthz(server: str) -> None:
    with RewarddClient(server) as client:
        body = client.health()
    assert body["status"] == "ok"
    assert httpx.get(f"{server}/healthz").status_code == 200


@pytest.fixture(scope="module")
def example_results(server: str) -> dict[str, dict[str, Any]]:
    batch = example("math_batch.json")
    out = {}
    for wire in ("json", "msgpack"):
        with RewarddClient(server, wire=wire) as client:
            out[wire] = client.score(batch)
    return out


def test_example_batch_shape_and_schema(example_results: dict[str, dict[str, Any]]) -> None:
    batch = example("math_batch.json")
    for wire, result in example_results.items():
        ScoreResponse.model_validate(result)
        assert [g["group_id"] for g in result["groups"]] == [g["group_id"] for g in batch["groups"]]
        assert len(result["groups"]) == 8
        for group, sent in zip(result["groups"], batch["groups"]):
            assert len(group["rollouts"]) == 4, wire
            assert [r["rollout_id"] for r in group["rollouts"]] == \
                [r["rollout_id"] for r in sent["rollouts"]]
            for rollout, sent_rollout in zip(group["rollouts"], sent["rollouts"]):
                assert rollout["rewards"]["correct"] in (0.0, 1.0), rollout
                assert rollout["rewards"]["format"] in (0.0, 1.0), rollout
                assert rollout["status"]["correct"]["ok"] is True
                assert rollout["excluded"] is False
                assert rollout["num_tokens"] == sent_rollout["num_tokens"]
        s = result["summary"]
        assert (s["rollouts"], s["groups"], s["failed_cells"], s["excluded_rollouts"]) == \
            (32, 8, 0, 0)
        assert result["run_id"] == "example-run"
        assert result["estimator"] == "grpo" and result["profile"] == "rewardd"


def test_example_batch_json_equals_msgpack(example_results: dict[str, dict[str, Any]]) -> None:
    assert example_results["json"] == example_results["msgpack"]


@pytest.mark.parametrize("rollout_id,correct", [
    ("q0-0", 1.0),   # \boxed{\frac{3}{4}} vs \frac{3}{4}
    ("q0-3", 0.0),   # 2/6 != 3/4
    ("q1-1", 0.0),   # x = \boxed{5} vs 4
    ("q1-0", 1.0),   # \boxed{4}
    ("q2-1", 0.0),   # 146 != 156
    ("q3-1", 1.0),   # sqrt(50) == 5 sqrt(2)
    ("q3-2", 0.0),   # 25 sqrt(2) != 5 sqrt(2)
    ("q4-2", 0.0),   # 1/2 != 1/4
    ("q5-1", 1.0),   # (x+1)^2 == x^2+2x+1
    ("q5-2", 0.0),   # x^2+1
    ("q6-2", 0.0),   # 9 != 8
])
def test_example_batch_math_spot_checks(example_results: dict[str, dict[str, Any]],
                                        rollout_id: str, correct: float) -> None:
    rollouts = {r["rollout_id"]: r for g in example_results["json"]["groups"]
                for r in g["rollouts"]}
    assert rollouts[rollout_id]["rewards"]["correct"] == correct


def test_example_batch_rewards_and_advantages_by_hand(
        example_results: dict[str, dict[str, Any]]) -> None:
    result = example_results["json"]
    weights = {"correct": 1.0, "format": 0.1}
    for group in result["groups"]:
        for rollout in group["rollouts"]:
            expected = sum(weights[k] * v for k, v in rollout["rewards"].items())
            assert rollout["reward"] == pytest.approx(expected, rel=REL, abs=1e-15)
        rewards = [r["reward"] for r in group["rollouts"]]
        expected_adv = grpo_expected(rewards)
        for rollout, a in zip(group["rollouts"], expected_adv):
            rle = rollout["advantages"]["rle"]
            assert len(rle) == 1, rle
            value, length = rle[0]
            assert length == rollout["num_tokens"]
            assert value == pytest.approx(a, rel=REL, abs=1e-15), (rollout["rollout_id"], rle)
        diag = group["diagnostics"]
        assert diag["baseline_size"] == 4 and diag["excluded"] == []
        assert diag["reward_mean"] == pytest.approx(statistics.fmean(rewards), rel=REL)
        assert diag["reward_std"] == pytest.approx(statistics.stdev(rewards), rel=REL)
        assert diag["zero_spread"] is (len(set(rewards)) == 1)


def test_client_accepts_pydantic_models(server: str,
                                        example_results: dict[str, dict[str, Any]]) -> None:
    request = ScoreRequest.model_validate(example("math_batch.json"))
    with RewarddClient(server, wire="msgpack") as client:
        assert client.score(request)["groups"] == example_results["json"]["groups"]


# ---- /v1/advantages (async client) ----------------------------------------------------------

@pytest.mark.parametrize("wire", ["json", "msgpack"])
async def test_advantages_example_async(server: str, wire: str) -> None:
    async with AsyncRewarddClient(server, wire=wire) as client:
        result = await client.advantages(example("advantages.json"))
    ScoreResponse.model_validate(result)
    assert result["estimator"] == "rloo" and result["profile"] == "verl"
    [group] = result["groups"]
    by_id = {r["rollout_id"]: r for r in group["rollouts"]}
    assert [by_id[i]["reward"] for i in ("g0-0", "g0-1", "g0-2")] == [1.0, 0.0, 0.5]
    # rloo: a_i = r_i - mean of the others: 1 - 0.25, 0 - 0.75, 0.5 - 0.5
    assert by_id["g0-0"]["advantages"] == {"rle": [[0.75, 2], [0.0, 2], [0.75, 2]]}  # masked
    assert by_id["g0-1"]["advantages"] == {"rle": [[-0.75, 4]]}
    assert by_id["g0-2"]["advantages"] == {"rle": [[0.0, 5]]}
    assert group["diagnostics"]["baseline_size"] == 3
    assert result["summary"]["rollouts"] == 3


# ---- failure cells through the real worker pool -----------------------------------------------

FAILING = {
    "timeout": {"verifier": "test_sleep", "params": {"seconds": 30}, "timeout_s": 1},
    "crashed": {"verifier": "test_crash"},
    "error": {"verifier": "test_raise"},
}
ECHO = ["1", "0", "1", "0"]


def failing_request(kind: str, fallback: float | None, completions: list[str] = ECHO,
                    ) -> dict[str, Any]:
    bad = {"name": "bad", "weight": 0.5, **FAILING[kind]}
    if fallback is not None:
        bad["fallback"] = fallback
    return {
        "groups": [{"group_id": "g", "rollouts": [
            {"rollout_id": f"r{i}", "completion": c, "num_tokens": 3}
            for i, c in enumerate(completions)]}],
        "rewards": [{"name": "echo", "verifier": "test_echo", "weight": 1.0}, bad],
        "advantage": {"estimator": "grpo", "output": "rle"},
    }


@pytest.mark.parametrize("kind", list(FAILING))
def test_failed_cell_excludes_rollouts(server: str, kind: str) -> None:
    with RewarddClient(server) as client:
        result = client.score(failing_request(kind, None))
    ScoreResponse.model_validate(result)
    [group] = result["groups"]
    for rollout, echo in zip(group["rollouts"], ECHO):
        assert rollout["status"]["echo"]["ok"] is True
        assert rollout["rewards"]["echo"] == float(echo)
        cell = rollout["status"]["bad"]
        assert cell["ok"] is False and cell["error"] == kind, cell
        assert cell["detail"].get("message"), cell
        assert not fallback_used(cell)
        assert rollout["rewards"]["bad"] is None
        assert rollout["reward"] is None
        assert rollout["excluded"] is True
        assert rollout["advantages"] == {"rle": [[0.0, 3]]}
    if kind == "timeout":
        assert group["rollouts"][0]["status"]["bad"]["detail"]["limit_s"] == 1.0
    diag = group["diagnostics"]
    assert diag["excluded"] == ["r0", "r1", "r2", "r3"]
    assert diag["baseline_size"] == 0
    s = result["summary"]
    assert (s["failed_cells"], s["excluded_rollouts"], s["zero_advantage_fraction"]) == (4, 4, 1.0)


@pytest.mark.parametrize("kind", list(FAILING))
def test_failed_cell_with_fallback(server: str, kind: str) -> None:
    with RewarddClient(server) as client:
        result = client.score(failing_request(kind, 0.5))
    ScoreResponse.model_validate(result)
    [group] = result["groups"]
    expected_rewards = [float(e) * 1.0 + 0.5 * 0.5 for e in ECHO]  # [1.25, 0.25, 1.25, 0.25]
    expected_adv = grpo_expected(expected_rewards)
    for rollout, reward, a in zip(group["rollouts"], expected_rewards, expected_adv):
        cell = rollout["status"]["bad"]
        assert cell["ok"] is False and cell["error"] == kind, cell
        assert fallback_used(cell) is True
        assert rollout["rewards"]["bad"] == 0.5
        assert rollout["excluded"] is False
        assert rollout["reward"] == pytest.approx(reward, rel=REL)
        [[value, length]] = rollout["advantages"]["rle"]
        assert length == 3
        assert value == pytest.approx(a, rel=REL)
    # the hand-computed values: mean 0.75, unbiased std sqrt(1/3)
    assert expected_adv[0] == pytest.approx(0.5 / (3 ** -0.5 + EPS), rel=REL)
    assert group["diagnostics"]["excluded"] == []
    assert group["diagnostics"]["baseline_size"] == 4
    s = result["summary"]
    assert (s["failed_cells"], s["excluded_rollouts"]) == (4, 0)


def test_one_failed_rollout_leaves_the_baseline(server: str) -> None:
    """Only r3 fails (test_echo cannot parse 'x'): the baseline is r0..r2."""
    request = {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": f"r{i}", "completion": c, "num_tokens": 2}
        for i, c in enumerate(["1", "0", "1", "x"])]}],
        "rewards": [{"name": "echo", "verifier": "test_echo"}]}
    with RewarddClient(server) as client:
        result = client.score(request)
    rollouts = result["groups"][0]["rollouts"]
    assert rollouts[3]["status"]["echo"]["error"] == "error"
    assert rollouts[3]["excluded"] is True and rollouts[3]["advantages"] == {"rle": [[0.0, 2]]}
    expected = grpo_expected([1.0, 0.0, 1.0])
    for rollout, a in zip(rollouts[:3], expected):
        assert rollout["advantages"]["rle"][0][0] == pytest.approx(a, rel=REL)
    assert result["groups"][0]["diagnostics"]["excluded"] == ["r3"]
    assert result["groups"][0]["diagnostics"]["baseline_size"] == 3


def test_pool_recovers_after_crash_and_timeout(server: str,
                                               example_results: dict[str, Any]) -> None:
    with RewarddClient(server) as client:
        crashed = client.score(failing_request("crashed", None, ["1", "0"]))
        assert crashed["summary"]["failed_cells"] == 2
        timed_out = client.score(failing_request("timeout", None, ["1", "0"]))
        assert timed_out["summary"]["failed_cells"] == 2
        again = client.score(example("math_batch.json"))
    assert again["groups"] == example_results["json"]["groups"]
    ready = httpx.get(f"{server}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"


def test_mixed_group_fails_only_its_culprits(server: str) -> None:
    """One group, one call per component: each misbehaving rollout fails alone (soft timeout,
    hard kill and replay, crash and replay); its group mates keep their real rewards."""
    request = {"groups": [{"group_id": "m", "rollouts": [
        {"rollout_id": f"m{c}", "completion": c, "num_tokens": 2} for c in "1234"]}],
        "rewards": [
            {"name": "slow", "verifier": "test_sleep", "timeout_s": 1,
             "params": {"seconds": SLEEP_S, "when": ["1"]}},
            {"name": "block", "verifier": "test_block", "timeout_s": 1,
             "params": {"seconds": SLEEP_S, "when": ["2"]}},
            {"name": "crash", "verifier": "test_crash", "params": {"when": ["3"]}}],
        "advantage": {"output": "none"}}
    started = time.perf_counter()
    with RewarddClient(server) as client:
        result = client.score(request)
    # cut, not waited for: answered before the sleeps could have ended (block: the group's
    # 4 x 1 s hard limit, then replays)
    assert time.perf_counter() - started < SLEEP_S
    culprits = {"slow": "m1", "block": "m2", "crash": "m3"}
    for rollout in result["groups"][0]["rollouts"]:
        for name, culprit in culprits.items():
            cell = rollout["status"][name]
            if rollout["rollout_id"] == culprit:
                assert cell["ok"] is False, (name, cell)
                assert cell["error"] == ("crashed" if name == "crash" else "timeout")
            else:
                assert cell["ok"] is True, (name, rollout["rollout_id"], cell)
                assert rollout["rewards"][name] == float(rollout["rollout_id"][1:])
    assert result["summary"]["failed_cells"] == 3


def test_verify_times_out_within_its_limit_plus_a_little(server: str) -> None:
    with RewarddClient(server) as client:
        for verifier in ("test_sleep", "test_block"):
            started = time.perf_counter()
            result = client.verify(verifier, "0", params={"seconds": SLEEP_S}, timeout_s=1)
            took = time.perf_counter() - started
            assert result["error"] == "timeout" and result["detail"]["limit_s"] == 1.0
            assert took < SLEEP_S, (verifier, took)  # before the sleep could have ended


# ---- single verify and catalogues -----------------------------------------------------------

@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_verify_math(server: str, wire: str) -> None:
    with RewarddClient(server, wire=wire) as client:
        result = client.verify("math", "2x = 8, so x = \\boxed{4}", {"answer": "4"})
        wrong = client.verify("math", "x = \\boxed{5}", {"answer": "4"})
    VerifyResponse.model_validate(result)
    assert result["ok"] is True and result["reward"] == 1.0 and result["error"] is None
    assert result["detail"]["extracted"] == "4"
    assert wrong["ok"] is True and wrong["reward"] == 0.0


def test_verify_unknown_verifier_is_404(server: str) -> None:
    with RewarddClient(server) as client, pytest.raises(RewarddError) as info:
        client.verify("no_such_verifier", "x")
    assert info.value.status == 404
    assert "no_such_verifier" in str(info.value.detail)


def test_verifiers_catalogue(server: str) -> None:
    with RewarddClient(server) as client:
        catalogue = {v["name"]: v for v in client.verifiers()}
    assert {"math", "exact_match", "regex", "length"} <= set(catalogue)
    for name in ("math", "exact_match", "regex", "length"):
        assert catalogue[name]["description"]
        for param in catalogue[name]["params"]:
            assert {"name", "type", "default", "required"} <= set(param), param
    math_params = {p["name"]: p for p in catalogue["math"]["params"]}
    assert math_params["extract"]["default"] == "auto"
    assert math_params["mode"]["default"] == "lenient"
    assert math_params["min_rounding_digits"] == {**math_params["min_rounding_digits"],
                                                  "type": "int", "default": 4}
    regex_params = {p["name"]: p for p in catalogue["regex"]["params"]}
    assert regex_params["pattern"]["required"] is True and regex_params["pattern"]["type"] == "str"
    assert "answer" in catalogue["math"]["reference_fields"]


def test_estimators_catalogue(server: str) -> None:
    with RewarddClient(server) as client:
        catalogue = {e["name"]: e for e in client.estimators()}
    assert {"grpo", "dr_grpo", "rloo"} <= set(catalogue)
    for name in ("grpo", "dr_grpo", "rloo"):
        entry = catalogue[name]
        assert entry["formula"] and entry["source"]
        assert {"rewardd", "verl", "trl", "openrlhf"} <= set(entry["profiles"])
    profiles = catalogue["grpo"]["profiles"]
    assert profiles["verl"]["eps"] == 1e-6 and profiles["verl"]["std_ddof"] == 1
    assert profiles["rewardd"]["eps"] == 1e-6
    assert profiles["trl"]["eps"] == 1e-4
    assert profiles["openrlhf"]["eps"] == 1e-9
    assert "std" in catalogue["grpo"]["formula"]
    assert "j != i" in catalogue["rloo"]["formula"]


# ---- metrics -------------------------------------------------------------------------------

def scrape(server: str) -> dict[tuple[str, frozenset], float]:
    response = httpx.get(f"{server}/metrics", timeout=10)
    assert response.status_code == 200
    out = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_what_happened(server: str) -> None:
    score_200 = {"route": "/v1/score", "method": "POST", "status": "200", "tenant": "default"}
    before = scrape(server)
    with RewarddClient(server) as client:  # every check runs: the verdict cache bypassed
        client.score({**example("math_batch.json"), "cache": False})
    middle = scrape(server)

    def delta(a: dict, b: dict, name: str, **labels: str) -> float:
        return metric(b, name, **labels) - metric(a, name, **labels)

    assert delta(before, middle, "rewardd_http_requests_total", **score_200) == 1
    assert delta(before, middle, "rewardd_http_request_duration_seconds_count", **score_200) == 1
    assert delta(before, middle, "rewardd_http_request_duration_seconds_bucket",
                 le="+Inf", **score_200) == 1
    assert delta(before, middle, "rewardd_verifier_outcomes_total",
                 verifier="math", outcome="ok") == 32
    assert delta(before, middle, "rewardd_verifier_outcomes_total",
                 verifier="regex", outcome="ok") == 32
    assert delta(before, middle, "rewardd_rollouts_scored_total") == 32
    assert delta(before, middle, "rewardd_groups_scored_total") == 8
    # zero_advantage_fraction 0.0 for the example: lands in the first bucket
    assert delta(before, middle, "rewardd_batch_zero_advantage_fraction_count") == 1
    assert delta(before, middle, "rewardd_batch_zero_advantage_fraction_bucket", le="0.0") == 1

    with RewarddClient(server) as client:
        # no timeout_s on the spec: the server's --verifier-timeout-s 5 applies
        timed_out = client.score({"groups": [{"group_id": "t", "rollouts": [
            {"rollout_id": "t0", "completion": "", "num_tokens": 1}]}],
            "rewards": [{"name": "slow", "verifier": "test_sleep", "params": {"seconds": 30}}]})
        cell = timed_out["groups"][0]["rollouts"][0]["status"]["slow"]
        assert cell["error"] == "timeout" and cell["detail"]["limit_s"] == 5.0
        with pytest.raises(RewarddError):
            client.score({"groups": []})
    after = scrape(server)
    assert delta(middle, after, "rewardd_verifier_outcomes_total",
                 verifier="test_sleep", outcome="timeout") == 1
    assert delta(middle, after, "rewardd_rollouts_scored_total") == 1
    assert delta(middle, after, "rewardd_http_requests_total", **score_200) == 1
    assert delta(middle, after, "rewardd_http_requests_total",
                 route="/v1/score", method="POST", status="422", tenant="default") == 1
    # the lone timed-out rollout is excluded: zero_advantage_fraction 1.0
    assert delta(middle, after, "rewardd_batch_zero_advantage_fraction_bucket", le="0.9") == 0
    assert delta(middle, after, "rewardd_batch_zero_advantage_fraction_bucket", le="1.0") == 1
    names = {name for name, _ in after}
    for name in ("rewardd_http_requests_total", "rewardd_verifier_outcomes_total",
                 "rewardd_rollouts_scored_total", "rewardd_batch_zero_advantage_fraction_bucket",
                 "rewardd_http_request_duration_seconds_bucket"):
        assert name in names



def test_the_verdict_cache_answers_a_repeated_batch_and_counts_it(server: str) -> None:
    before = scrape(server)
    with RewarddClient(server) as client:  # twice: the second time the cache answers
        client.score(example("math_batch.json"))
        answer = client.score(example("math_batch.json"))
    after = scrape(server)
    assert answer["diagnostics"]["cache"] == {"hits": 64, "misses": 0}  # math and regex

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("rewardd_verdict_cache_total", verifier="math", result="hit") >= 32
    assert delta("rewardd_verifier_outcomes_total", verifier="math", outcome="ok") <= 32

# ---- body size limit -----------------------------------------------------------------------

def oversized_request() -> dict[str, Any]:
    return {"groups": [{"group_id": "big", "rollouts": [
        {"rollout_id": "big-0", "completion": "x" * (SERVER_MAX_BODY_BYTES + 1024 * 1024),
         "num_tokens": 1}]}],
        "rewards": [{"name": "len", "verifier": "length", "params": {"max_length": 10}}]}


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_body_over_limit_is_413(server: str, wire: str) -> None:
    with RewarddClient(server, wire=wire) as client, pytest.raises(RewarddError) as info:
        client.score(oversized_request())
    assert info.value.status == 413
    assert "REWARDD_MAX_BODY_BYTES" in str(info.value.detail)


def test_chunked_body_over_limit_is_413(server: str) -> None:
    """No Content-Length: the limit is enforced while streaming."""
    def chunks():
        yield b'{"groups": ['
        for _ in range(9):
            yield b" " * (1024 * 1024)
        yield b"]}"

    response = httpx.post(f"{server}/v1/score", content=chunks(),
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413, response.text
    # still serving afterwards
    assert httpx.get(f"{server}/healthz").status_code == 200


# ---- limits, other endpoints, readiness under load -------------------------------------------

def test_timeout_over_the_server_cap_is_422(server: str) -> None:
    with RewarddClient(server) as client, pytest.raises(RewarddError) as info:
        client.score({"groups": [{"group_id": "d", "rollouts": [{"rollout_id": "d0"}]}],
                      "rewards": [{"name": "slow", "verifier": "test_sleep",
                                   "timeout_s": 1000}], "advantage": {"output": "none"}})
    assert info.value.status == 422
    assert ["body", "rewards", 0, "timeout_s"] in [e["loc"] for e in info.value.detail]


def test_rewards_endpoint_has_no_advantages(server: str,
                                            example_results: dict[str, Any]) -> None:
    batch = example("math_batch.json")
    del batch["advantage"]
    with RewarddClient(server, wire="msgpack") as client:
        result = client.rewards(batch)
    ScoreResponse.model_validate(result)
    assert result["estimator"] is None and result["summary"]["zero_advantage_fraction"] is None
    for group, scored in zip(result["groups"], example_results["json"]["groups"]):
        for rollout, other in zip(group["rollouts"], scored["rollouts"]):
            assert rollout["advantages"] is None
            assert rollout["rewards"] == other["rewards"] and rollout["reward"] == other["reward"]


def test_dense_advantages_json_equals_msgpack(server: str) -> None:
    request = example("advantages.json")
    request["advantage"]["output"] = "dense"
    results = {}
    for wire in ("json", "msgpack"):
        with RewarddClient(server, wire=wire) as client:
            results[wire] = client.advantages(request)
    assert results["json"] == results["msgpack"]
    dense = {r["rollout_id"]: r["advantages"] for r in results["json"]["groups"][0]["rollouts"]}
    assert dense == {"g0-0": [0.75, 0.75, 0.0, 0.0, 0.75, 0.75], "g0-1": [-0.75] * 4,
                     "g0-2": [0.0] * 5}


def test_readyz_answers_promptly_while_every_worker_is_busy(server: str) -> None:
    """/readyz gives up on its ping after its own wait (``READY_WAIT_S``, 5 s) instead of
    holding the probe until a worker is free. Order, not a wall-clock bound: the first
    "not ready" (a probe that found both workers busy) must come while both still sleep, and
    every answer before it too; a /readyz that waited for a worker would answer "ready" only
    after a sleep ended."""
    sleep_s = 15  # READY_WAIT_S and 10 s to spare for a busy machine

    def occupy() -> None:  # both workers sleep (limit 30 s): one group, one call each
        with RewarddClient(server) as client:
            client.score({"groups": [{"group_id": f"busy{i}", "rollouts": [
                {"rollout_id": f"busy{i}", "completion": ""}]} for i in range(2)],
                "rewards": [{"name": "s", "verifier": "test_sleep",
                             "params": {"seconds": sleep_s}, "timeout_s": 30}],
                "advantage": {"output": "none"}})

    worker = threading.Thread(target=occupy)
    worker.start()
    try:
        while True:  # ready until both sleeps hold the workers; then the probe gives up
            response = httpx.get(f"{server}/readyz", timeout=HANG_S)
            assert worker.is_alive(), "/readyz waited for a busy worker to be free"
            assert response.status_code in (200, 503)
            if response.status_code == 503:
                break
            time.sleep(0.1)
        assert response.json()["executor"]["fair_queue"]["running_calls"] == 2
    finally:
        worker.join(timeout=HANG_S)


def test_single_verify_calls_are_counted_in_verifier_metrics(server: str) -> None:
    before = scrape(server)
    with RewarddClient(server) as client:
        assert client.verify("math", "\\boxed{2}", {"answer": "2"})["reward"] == 1.0
    after = scrape(server)
    assert (metric(after, "rewardd_verifier_outcomes_total", verifier="math", outcome="ok")
            - metric(before, "rewardd_verifier_outcomes_total", verifier="math",
                     outcome="ok")) == 1
    assert (metric(after, "rewardd_verifier_duration_seconds_count", verifier="math")
            - metric(before, "rewardd_verifier_duration_seconds_count", verifier="math")) == 1


def test_score_code_through_the_server_reports_isolation(server: str) -> None:
    """A code group through the real server: the sandbox runs in the pool's workers, each
    rollout's pass fraction comes back, and /readyz says what the sandbox enforces."""
    reference = {"tests": {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}}
    programs = {
        "right": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
        "half": "```python\na, b = map(int, input().split())\nprint(3)\n```",
        "exits": "```python\nimport os\nos._exit(0)\n```",
    }
    request = {"groups": [{"group_id": "c", "reference": reference, "rollouts": [
        {"rollout_id": name, "completion": code, "num_tokens": 4}
        for name, code in programs.items()]}],
        "rewards": [{"name": "tests", "verifier": "code"}], "advantage": {"output": "none"}}
    with RewarddClient(server) as client:
        result = client.score(request)
    by_id = {r["rollout_id"]: r for r in result["groups"][0]["rollouts"]}
    assert {k: v["reward"] for k, v in by_id.items()} == {"right": 1.0, "half": 0.5,
                                                         "exits": 0.0}
    sandbox = httpx.get(f"{server}/readyz", timeout=30).json()["sandbox"]
    assert sandbox["level"] == "full" and sandbox["network"] is True
