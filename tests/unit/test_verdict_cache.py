"""Receipts and the verdict cache (issue 29): receipts are the same for the same inputs on any
pod and change with any input; results with the cache are bit-identical to results without
it; the cache is per tenant, bypassed on request, shared across pods through Redis, and never
keeps a failure or a judge that samples unrepeatably."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from rewardd.service.verdict_cache import VerdictCache
from rewardd.verifiers import REGISTRY, Outcome, Sample
from rewardd.verifiers.base import FailureKind
from rewardd.verifiers.receipts import CallStamp
from tests.support.executors import InlineExecutor
from tests.support.redis_server import RedisServer

MATH = REGISTRY["math"]


def _receipt(params=None, reference=None, completion="\\boxed{4}"):
    stamp = CallStamp.of(MATH, params or {}, reference or {"answer": "4"})
    return stamp.receipt(Sample(completion), Outcome.success(1.0))


# ---- receipts ------------------------------------------------------------------------------

def test_a_receipt_names_the_verifier_its_revision_and_hashes_of_every_input():
    receipt = _receipt()
    assert receipt["verifier"] == "math" and receipt["revision"] == MATH.revision
    assert {len(receipt[k]) for k in ("params_hash", "reference_hash", "completion_hash")} == {32}
    assert _receipt(params={"mode": "strict"})["params_hash"] != receipt["params_hash"]
    assert _receipt(reference={"answer": "5"})["reference_hash"] != receipt["reference_hash"]
    assert _receipt(completion="\\boxed{5}")["completion_hash"] != receipt["completion_hash"]


def test_params_hash_over_the_effective_params_so_spelled_out_defaults_hash_alike():
    defaults = MATH.Params().model_dump(mode="json")
    assert _receipt(params=defaults) == _receipt(params={})


def test_the_same_inputs_give_the_same_receipt_in_another_process():
    """Two pods: another interpreter, another hash seed, the same receipt."""
    code = ("import json; from rewardd.verifiers import REGISTRY, Sample, Outcome; "
            "from rewardd.verifiers.receipts import CallStamp; "
            "s = CallStamp.of(REGISTRY['math'], {'mode': 'strict'}, {'answer': '4', 'x': [1, 2]}); "
            "print(json.dumps(s.receipt(Sample('\\\\boxed{4}'), Outcome.success(1.0))))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout
    here = CallStamp.of(MATH, {"mode": "strict"}, {"x": [1, 2], "answer": "4"}).receipt(
        Sample("\\boxed{4}"), Outcome.success(1.0))
    assert orjson.loads(there) == here


def test_a_code_receipt_names_the_isolation_and_a_judge_receipt_its_model_and_sampling():
    code = CallStamp.of(REGISTRY["code"], {}, {"tests": {"inputs": ["1"], "outputs": ["1"]}})
    ran = Outcome.success(1.0, isolation="bubblewrap")
    assert code.receipt(Sample("print(1)"), ran)["isolation"] == "bubblewrap"
    judge = CallStamp.of(REGISTRY["rubric"], {"temperature": 0.7, "seed": 3}, {})
    graded = Outcome.success(0.5, judge={"backend": "default", "model": "m", "retries": 0})
    assert judge.receipt(Sample("x"), graded)["judge"] == {
        "backend": "default", "model": "m", "temperature": 0.7, "seed": 3}


def test_what_the_cache_may_keep():
    math = CallStamp.of(MATH, {}, {"answer": "4"})
    assert math.keeps(Outcome.success(1.0))
    assert not math.keeps(Outcome.failure(FailureKind.timeout, "slow"))
    unseeded = CallStamp.of(REGISTRY["rubric"], {"temperature": 0.7}, {})
    assert unseeded.cache_key(Sample("x"), "h") is None  # sampled: never cached
    greedy = CallStamp.of(REGISTRY["rubric"], {}, {})
    assert greedy.cache_key(Sample("x"), "h") is not None
    retried = Outcome.success(1.0, judge={"backend": "b", "model": "m", "retries": 1})
    assert not greedy.keeps(retried)  # the retry sampled at a higher temperature
    seeded = CallStamp.of(REGISTRY["rubric"], {"temperature": 0.7, "seed": 1}, {})
    assert seeded.cache_key(Sample("x"), "h") is not None and seeded.keeps(retried)
    code = CallStamp.of(REGISTRY["code"], {}, {"tests": {"inputs": ["1"], "outputs": ["1"]}})
    assert code.keeps(Outcome.success(0.5, tests=[{"verdict": "passed"},
                                                  {"verdict": "wrong_answer"}]))
    assert not code.keeps(Outcome.success(0.5, tests=[{"verdict": "passed"},
                                                      {"verdict": "timeout"}]))  # the clock
    assert not code.keeps(Outcome.success(0.5, time_budget_spent=True,
                                          tests=[{"verdict": "passed"}, {"verdict": "not_run"}]))
    assert code.keeps(Outcome.success(0.0, tests=[{"verdict": "wrong_answer"},
                                                  {"verdict": "not_run"}]))  # all_or_nothing
    arena = CallStamp.of(REGISTRY["arena"], {}, {})
    assert arena.cache_key(Sample("x"), "h") is None  # a verdict about the whole group


# ---- through the API -----------------------------------------------------------------------

def _batch(completions, references, verifier="math", **extra):
    groups = [{"group_id": f"g{i}", "reference": ref,
               "rollouts": [{"rollout_id": f"g{i}-r{j}", "completion": c, "num_tokens": 4}
                            for j, c in enumerate(group)]}
              for i, (group, ref) in enumerate(zip(completions, references))]
    return {"run_id": "cache-test", "groups": groups,
            "rewards": [{"name": "v", "verifier": verifier}],
            "advantage": {"estimator": "grpo"}, **extra}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = Settings(data_dir=str(tmp_path_factory.mktemp("data")), record_runs=False)
    with TestClient(create_app(settings, executor=InlineExecutor())) as c:
        yield c


def _without_diagnostics(body):
    return {k: v for k, v in body.items() if k != "diagnostics"}


ANSWERS = ["\\boxed{4}", "\\boxed{5}", "The answer is 4.", "4.0", "\\boxed{\\frac{8}{2}}",
           "no answer", "\\boxed{2+2}", "x = 4"]


@hsettings(max_examples=25, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=5),
                       min_size=1, max_size=4),
       refs=st.lists(st.sampled_from(["4", "5", "\\frac{8}{2}"]), min_size=4, max_size=4))
def test_results_with_the_cache_are_bit_identical_to_results_without(client, groups, refs):
    body = _batch(groups, [{"answer": r} for r in refs[:len(groups)]])
    cold = client.post("/v1/score", json={**body, "cache": False})
    first = client.post("/v1/score", json=body)
    warm = client.post("/v1/score", json=body)
    assert cold.status_code == first.status_code == warm.status_code == 200, cold.text
    assert warm.json()["diagnostics"]["cache"] == {"hits": sum(map(len, groups)), "misses": 0}
    assert cold.json()["diagnostics"]["cache"] == {"hits": 0, "misses": 0}
    assert _without_diagnostics(cold.json()) == _without_diagnostics(first.json()) \
        == _without_diagnostics(warm.json())


CODE_REF = {"tests": {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}}
CODE_REF_2 = {"tests": {"inputs": ["1 2\n", "3 4\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}}
PROGRAMS = ["```python\na, b = map(int, input().split())\nprint(a + b)\n```",
            "```python\na, b = map(int, input().split())\nprint(a * b)\n```",
            "```python\nprint(3)\n```", "no code"]


def _untimed(value):
    """``value`` without the wall-clock times a sandbox measured (``wall_s`` of a failed
    test): two runs of the same program differ there and nowhere else."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def test_code_verdicts_from_the_cache_are_bit_identical(client):
    """A hit is the verdict that was kept, bit for bit, timings included; against a run
    without the cache it differs only in the sandbox's measured times."""
    # two references: a program repeated under the same reference within one batch runs
    # twice (its measured times differ) and the cache keeps one of the two
    body = _batch([PROGRAMS, PROGRAMS[::-1]], [CODE_REF, CODE_REF_2], verifier="code")
    cold = client.post("/v1/score", json={**body, "cache": False}).json()
    first = client.post("/v1/score", json=body).json()
    warm = client.post("/v1/score", json=body).json()
    assert first["diagnostics"]["cache"] == {"hits": 0, "misses": 8}
    assert warm["diagnostics"]["cache"] == {"hits": 8, "misses": 0}
    assert _without_diagnostics(first) == _without_diagnostics(warm)
    assert _untimed(_without_diagnostics(cold)) == _untimed(_without_diagnostics(warm))
    status = warm["groups"][0]["rollouts"][0]["status"]["v"]
    assert status["receipt"]["isolation"] == status["detail"]["isolation"]


def test_a_partly_cached_group_runs_only_the_new_completions(client):
    client.post("/v1/score", json=_batch([["\\boxed{41}", "\\boxed{42}"]], [{"answer": "42"}]))
    mixed = client.post("/v1/score", json=_batch(
        [["\\boxed{42}", "\\boxed{43}", "\\boxed{41}"]], [{"answer": "42"}])).json()
    assert mixed["diagnostics"]["cache"] == {"hits": 2, "misses": 1}
    assert [r["rewards"]["v"] for r in mixed["groups"][0]["rollouts"]] == [1.0, 0.0, 0.0]


def test_failures_are_not_cached(client):
    body = _batch([["\\boxed{1}"]], [{"nothing": "here"}])
    for _ in range(2):
        answer = client.post("/v1/score", json=body).json()
        assert answer["diagnostics"]["cache"] == {"hits": 0, "misses": 1}
        assert answer["groups"][0]["rollouts"][0]["status"]["v"]["error"] == "invalid_reference"


def test_the_cache_is_per_tenant():
    cache = VerdictCache.of(Settings(), None)
    mine, theirs = cache.view("a"), cache.view("b")
    asyncio.run(mine.put_many([("k", Outcome.success(1.0))]))
    assert asyncio.run(theirs.get_many(["k"])) == [None]
    assert asyncio.run(mine.get_many(["k"]))[0].reward == 1.0


def test_the_setting_turns_the_cache_off():
    cache = VerdictCache.of(Settings(verdict_cache=False), None)
    view = cache.view("a")
    asyncio.run(view.put_many([("k", Outcome.success(1.0))]))
    assert asyncio.run(view.get_many(["k"])) == [None] and not view.enabled


def test_the_local_layer_forgets_the_least_recently_used():
    cache = VerdictCache.of(Settings(verdict_cache_entries=2), None)
    view = cache.view("t")
    asyncio.run(view.put_many([("a", Outcome.success(1.0)), ("b", Outcome.success(0.0))]))
    asyncio.run(view.get_many(["a"]))  # a is now the most recent
    asyncio.run(view.put_many([("c", Outcome.success(0.5))]))
    assert [o is not None for o in asyncio.run(view.get_many(["a", "b", "c"]))] == [
        True, False, True]


def test_a_tenant_flooding_the_cache_evicts_its_own_verdicts_not_anothers():
    cache = VerdictCache.of(Settings(verdict_cache_entries=100), None)
    quiet, flood = cache.view("quiet"), cache.view("flood")
    asyncio.run(quiet.put_many([(f"q{i}", Outcome.success(1.0)) for i in range(30)]))
    for burst in range(10):  # 1,000 verdicts through a cache of 100
        asyncio.run(flood.put_many([(f"f{burst}-{i}", Outcome.success(0.0))
                                    for i in range(100)]))
    assert all(o is not None for o in asyncio.run(quiet.get_many([f"q{i}" for i in range(30)])))
    assert cache.local.held("quiet") == 30 and cache.local.held("flood") == 70
    assert len(cache.local) == 100
    # the flood's newest verdicts are the ones it kept
    assert asyncio.run(flood.get_many(["f9-99", "f0-0"]))[1] is None
    # a quiet tenant growing past an even share is trimmed once it is the largest
    asyncio.run(quiet.put_many([(f"q{i}", Outcome.success(1.0)) for i in range(30, 90)]))
    assert cache.local.held("quiet") + cache.local.held("flood") == 100
    assert cache.local.held("quiet") == cache.local.held("flood") == 50


@pytest.fixture(scope="module")
def private_redis():
    server = RedisServer().start()
    yield server
    server.close()


def test_the_shared_layer_answers_another_pod(private_redis):
    import redis.asyncio

    async def run() -> tuple[list, list]:
        one = redis.asyncio.Redis.from_url(private_redis.url(1))
        two = redis.asyncio.Redis.from_url(private_redis.url(1))
        try:
            pod_a = VerdictCache.of(Settings(), one).view("t")
            pod_b = VerdictCache.of(Settings(), two).view("t")
            detail = {"extracted": "4", "decided_by": "exact", "x": [0.1, 2, None]}
            await pod_a.put_many([("k", Outcome.success(0.1 + 0.2, **detail))])
            return await pod_b.get_many(["k", "other"]), await pod_a.get_many(["k"])
        finally:
            await one.aclose()
            await two.aclose()

    (shared, missing), [local] = asyncio.run(run())
    assert missing is None
    assert shared.to_dict() == local.to_dict()  # 0.30000000000000004, exactly
    assert shared.reward == 0.1 + 0.2


def test_a_redis_that_is_down_is_a_miss_never_a_failure():
    import redis.asyncio

    async def run() -> list:
        client = redis.asyncio.Redis.from_url("redis://127.0.0.1:9/0", socket_connect_timeout=1)
        try:
            view = VerdictCache.of(Settings(), client).view("t")
            await view.put_many([("k", Outcome.success(1.0))])
            view.cache.local = type(view.cache.local)(10)  # another pod: nothing local
            return await view.get_many(["k"])
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [None]
