"""The OpenAI-compatible judge client against a real local HTTP server: retries only where a
retry can help, the reply cache, configuration and the concurrency bound."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from tests.support.judge_server import JudgeServer
from rewardd.verifiers.judge import openai_compat
from rewardd.verifiers.judge.backend import ChatReply, ChatRequest, JudgeUnavailable
from rewardd.verifiers.judge.config import BackendOverride, JudgeConfigError, resolve_backend
from rewardd.verifiers.judge.openai_compat import OpenAIChatBackend, OpenAIConfig, ReplyCache
from rewardd.workers.deadline import CheckTimeout, SoftDeadline

FLEET_REDIS_URL = "redis://127.0.0.1:6379/12"


@pytest.fixture
def server(judge: JudgeServer) -> JudgeServer:
    return judge


@pytest.fixture(autouse=True)
def _clean(judge: JudgeServer) -> None:
    """Every test starts from a reset server, cache and backend set."""


def backend(server: JudgeServer, **options: Any) -> OpenAIChatBackend:
    config = OpenAIConfig(name="t", base_url=server.base_url, model="rule-judge",
                          **{"max_retries": 3, "timeout_s": 5.0, **options})
    return OpenAIChatBackend(config, cache=ReplyCache())


def question(n: int = 0) -> ChatRequest:
    return ChatRequest((("user", f"question {n}"),), max_tokens=64)


def chat_from_threads(server: JudgeServer, clients: list[Any], each: int,
                      latency_s: float) -> list[Any]:
    """Each client sends ``each`` distinct questions from a thread of its own (as worker
    processes would), the server answering slowly; every reply, in no particular order."""
    results: list[Any] = []
    server.latency_s = latency_s
    try:
        threads = [threading.Thread(target=lambda c=c, k=k: results.extend(
            c.chat([question(100 * k + i) for i in range(each)]))) for k, c in enumerate(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        server.latency_s = 0.0
    return results


def test_answers_come_back_in_order_with_usage(server: JudgeServer) -> None:
    replies = backend(server).chat([question(i) for i in range(5)])
    assert all(isinstance(r, ChatReply) for r in replies)
    assert [r.prompt_tokens for r in replies] == [2] * 5  # "question N"
    assert all(r.finish_reason == "stop" and r.attempts == 1 for r in replies)
    assert len(server.requests) == 5
    assert server.requests[0]["model"] == "rule-judge"
    assert server.requests[0]["max_tokens"] == 64


def test_429_and_5xx_are_retried_with_backoff_then_succeed(server: JudgeServer) -> None:
    server.faults.extend([("status", 429, 0), ("status", 503), ("status", 502)])
    [reply] = backend(server).chat([question()])
    assert isinstance(reply, ChatReply) and reply.attempts == 4
    assert len(server.requests) == 4


def test_retries_are_bounded_and_end_as_unavailable(server: JudgeServer) -> None:
    server.faults.extend([("status", 500)] * 10)
    [reply] = backend(server, max_retries=2).chat([question()])
    assert isinstance(reply, JudgeUnavailable)
    assert reply.status == 500 and reply.attempts == 3
    assert "HTTP 500" in reply.message and "after 3 attempts" in reply.message
    assert len(server.requests) == 3


def test_a_client_error_is_not_retried(server: JudgeServer) -> None:
    server.faults.append(("status", 400))
    [reply] = backend(server).chat([question()])
    assert isinstance(reply, JudgeUnavailable) and reply.status == 400 and reply.attempts == 1
    assert len(server.requests) == 1


def test_retry_after_is_honoured(server: JudgeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_compat, "BACKOFF_BASE_S", 120.0)  # would wait minutes
    server.faults.append(("status", 429, "0.05"))
    started = time.monotonic()
    [reply] = backend(server).chat([question()])
    assert isinstance(reply, ChatReply) and reply.attempts == 2
    assert time.monotonic() - started < 30.0  # generous for a loaded machine, far below 120


def test_timeouts_are_retried(server: JudgeServer) -> None:
    """The first answer comes after 3 s, past the 1.5 s limit: retried, and the retry
    answered at once. The limit also bounds waiting for a pooled connection, so it is
    generous: at 0.3 s a loaded machine timed the retry out too (a third attempt)."""
    server.faults.append(("sleep", 3.0))
    [reply] = backend(server, timeout_s=1.5).chat([question()])
    assert isinstance(reply, ChatReply) and reply.attempts == 2
    for _ in range(200):  # let the abandoned answer finish before the next test
        if server.in_flight == 0:
            break
        time.sleep(0.05)


def test_a_malformed_completion_is_a_typed_failure(server: JudgeServer) -> None:
    server.faults.append(("malformed",))
    [reply] = backend(server).chat([question()])
    assert isinstance(reply, JudgeUnavailable) and "malformed" in reply.message


def test_a_body_that_does_not_decode_fails_its_own_request_only(server: JudgeServer) -> None:
    server.faults.append(("bad_encoding",))
    judge = backend(server, max_concurrency=1)  # one at a time: the first request gets it
    broken, fine = judge.chat([question(1), question(2)])
    assert isinstance(broken, JudgeUnavailable) and "DecodingError" in broken.message
    assert broken.attempts == 1  # not transient: not retried
    assert isinstance(fine, ChatReply)


def test_a_failure_shared_by_equal_requests_is_one_call_in_the_usage(
        server: JudgeServer) -> None:
    server.faults.extend([("status", 503)] * 3)
    judge = backend(server, max_retries=2)
    results = judge.chat([question(1), question(1)])
    assert all(isinstance(r, JudgeUnavailable) for r in results)
    assert len(server.requests) == 3 and [r.duplicate for r in results] == [False, True]
    usage = judge.usage()
    for result in results:
        usage.add(result)
    assert (usage.calls, usage.failed, usage.retries, usage.cached) == (2, 1, 2, 1)


def test_the_cache_tells_endpoints_apart(server: JudgeServer) -> None:
    other = JudgeServer().start()
    try:
        cache = ReplyCache()
        first = OpenAIChatBackend(OpenAIConfig(name="default", base_url=server.base_url,
                                               model="rule-judge"), cache=cache)
        second = OpenAIChatBackend(OpenAIConfig(name="default", base_url=other.base_url,
                                                model="rule-judge"), cache=cache)
        first.chat([question(5)])
        [reply] = second.chat([question(5)])
        assert not reply.cached and len(other.requests) == 1
    finally:
        other.stop()


@pytest.mark.parametrize("settings, reason", [
    ({"max_concurrency": 0}, "max_concurrency: Input should be greater than or equal to 1"),
    ({"fleet_max_concurrency": 0, "state_url": FLEET_REDIS_URL},
     "fleet_max_concurrency: Input should be greater than or equal to 1"),
    ({"max_retries": -1}, "max_retries"),
    ({"timeout_s": "soon"}, "timeout_s"),
    ({"fleet_max_concurrency": 2, "state_url": "localhost:6379"}, "must start with redis://"),
    ({"retries": 3}, "retries"),
])
def test_backend_settings_are_checked_when_built(tmp_path: Any, settings: dict[str, Any],
                                                 reason: str) -> None:
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"j": {"base_url": "http://x/v1", "model": "m", **settings}}))
    with pytest.raises(JudgeConfigError, match=f"judge backend 'j': .*{reason}"):
        resolve_backend(BackendOverride(name="j"), {"REWARDD_JUDGE_BACKENDS_FILE": str(path)})


def test_request_overrides_cannot_raise_the_operators_bound(server: JudgeServer,
                                                            tmp_path: Any) -> None:
    """max_concurrency 2 in the file: a request asking for 50 gets 2, and two requests
    overriding the model (two backends) still share those 2 slots in the process."""
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"j": {"base_url": server.base_url, "model": "rule-judge",
                                      "max_concurrency": 2}}))
    env = {"REWARDD_JUDGE_BACKENDS_FILE": str(path)}
    greedy = resolve_backend(BackendOverride(name="j", max_concurrency=50), env)
    assert greedy.config.max_concurrency == 2  # type: ignore[attr-defined]
    other = resolve_backend(BackendOverride(name="j", model="rule-judge-2"), env)
    chat_from_threads(server, [greedy, other], 4, latency_s=0.1)
    assert len(server.requests) == 8 and server.max_in_flight == 2


def test_built_backends_are_bounded(server: JudgeServer, tmp_path: Any) -> None:
    from rewardd.verifiers.judge import config

    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"j": {"base_url": server.base_url, "model": "m"}}))
    env = {"REWARDD_JUDGE_BACKENDS_FILE": str(path)}
    for k in range(config.MAX_BUILT_BACKENDS + 10):
        resolve_backend(BackendOverride(name="j", model=f"m{k}"), env)
    assert len(config._backends) == config.MAX_BUILT_BACKENDS


def test_a_backends_file_entry_must_be_an_object(tmp_path: Any) -> None:
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"j": "http://x/v1"}))
    with pytest.raises(JudgeConfigError, match="backend 'j' is str, expected a JSON object"):
        resolve_backend(BackendOverride(name="j"), {"REWARDD_JUDGE_BACKENDS_FILE": str(path)})


def test_unreachable_server_is_unavailable_not_an_exception() -> None:
    config = OpenAIConfig(name="gone", base_url="http://127.0.0.1:9/v1", model="m",
                          max_retries=1, timeout_s=1.0)
    [reply] = OpenAIChatBackend(config, cache=ReplyCache()).chat([question()])
    assert isinstance(reply, JudgeUnavailable) and reply.attempts == 2


def test_equal_requests_are_answered_from_the_cache(server: JudgeServer) -> None:
    client = backend(server)
    first = client.chat([question(1), question(2)])
    again = client.chat([question(1), question(2), question(3)])
    assert [r.cached for r in again] == [True, True, False]
    assert [r.text for r in again[:2]] == [r.text for r in first]
    assert len(server.requests) == 3
    other_sampling = ChatRequest(question(1).messages, max_tokens=64, temperature=0.7)
    [fresh] = client.chat([other_sampling])
    assert not fresh.cached  # the key covers sampling parameters


def test_failures_are_not_cached(server: JudgeServer) -> None:
    client = backend(server, max_retries=0)
    server.faults.append(("status", 503))
    assert isinstance(client.chat([question()])[0], JudgeUnavailable)
    assert isinstance(client.chat([question()])[0], ChatReply)


def test_concurrency_is_bounded_per_backend(server: JudgeServer) -> None:
    """Eight requests that each take 0.2 s through a bound of 2: at least four rounds."""
    server.faults.extend([("sleep", 0.2)] * 8)
    started = time.monotonic()
    replies = backend(server, max_concurrency=2).chat([question(i) for i in range(8)])
    took = time.monotonic() - started
    assert all(isinstance(r, ChatReply) for r in replies)
    assert took >= 0.8 - 0.05, took


def test_an_interrupted_batch_gives_its_slots_back(server: JudgeServer) -> None:
    server.latency_s = 1.5
    judge = backend(server, max_concurrency=1)
    with pytest.raises(CheckTimeout), SoftDeadline(0.2):
        judge.chat([question(1)])
    server.latency_s = 0.0
    # the abandoned request is still being answered, yet the only slot is free again
    [reply] = judge.chat([question(2)])
    assert isinstance(reply, ChatReply)
    assert server.max_in_flight == 2
    for _ in range(600):  # let the abandoned answer (1.5 s) finish: 30 s against a hang
        if server.in_flight == 0:
            break
        time.sleep(0.05)
    assert server.in_flight == 0


def test_a_batch_runs_concurrently_and_from_several_threads(server: JudgeServer) -> None:
    client = backend(server, max_concurrency=8)
    results: list[Any] = []

    def run(offset: int) -> None:
        results.extend(client.chat([question(offset + i) for i in range(4)]))

    threads = [threading.Thread(target=run, args=(10 * t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 12 and all(isinstance(r, ChatReply) for r in results)


def test_structured_output_is_requested_as_a_json_schema(server: JudgeServer) -> None:
    schema = {"type": "object", "properties": {"criteria_met": {"type": "boolean"}},
              "required": ["criteria_met"]}
    backend(server).chat([ChatRequest((("user", "q"),), json_schema=schema, seed=3)])
    sent = server.requests[-1]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert sent["seed"] == 3


def test_the_api_key_is_sent_as_a_bearer_token(server: JudgeServer) -> None:
    seen: list[str] = []
    original = server.answer

    def spy(handler: Any, body: Any, fault: Any) -> None:
        seen.append(handler.headers.get("Authorization"))
        original(handler, body, fault)

    server.answer = spy  # type: ignore[method-assign]
    try:
        backend(server, api_key="sk-test").chat([question()])
    finally:
        server.answer = original  # type: ignore[method-assign]
    assert seen == ["Bearer sk-test"]


# ---- configuration ----------------------------------------------------------------------

def test_default_backend_from_the_environment(server: JudgeServer) -> None:
    env = {"REWARDD_JUDGE_BASE_URL": server.base_url, "REWARDD_JUDGE_MODEL": "rule-judge"}
    chosen = resolve_backend(None, env)
    assert chosen.name == "default" and chosen.model == "rule-judge"
    assert resolve_backend(None, env) is chosen  # built once per process
    other = resolve_backend(BackendOverride(model="bigger"), env)
    assert other is not chosen and other.model == "bigger"


def test_named_backends_from_a_file(server: JudgeServer, tmp_path: Any) -> None:
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"big": {"base_url": server.base_url, "model": "m-big",
                                        "api_key_env": "BIG_KEY", "max_concurrency": 3,
                                        "cost_per_1k_prompt": 0.5}}))
    env = {"REWARDD_JUDGE_BACKENDS_FILE": str(path), "BIG_KEY": "sk-big"}
    chosen = resolve_backend(BackendOverride(name="big"), env)
    assert isinstance(chosen, OpenAIChatBackend)
    assert chosen.config.api_key == "sk-big" and chosen.config.max_concurrency == 3
    assert chosen.cost_per_1k_tokens == (0.5, 0.0)


def test_unknown_backends_and_request_urls_are_refused_with_the_fix() -> None:
    with pytest.raises(JudgeConfigError, match="REWARDD_JUDGE_BASE_URL"):
        resolve_backend(None, {})
    env = {"REWARDD_JUDGE_BASE_URL": "http://127.0.0.1:1/v1"}
    with pytest.raises(JudgeConfigError, match="REWARDD_JUDGE_ALLOW_REQUEST_URLS"):
        resolve_backend(BackendOverride(base_url="http://169.254.169.254/"), env)
    allowed = {**env, "REWARDD_JUDGE_ALLOW_REQUEST_URLS": "1"}
    chosen = resolve_backend(BackendOverride(base_url="http://127.0.0.1:2/v1"), allowed)
    assert chosen.config.base_url == "http://127.0.0.1:2/v1"  # type: ignore[attr-defined]


def test_a_request_cannot_point_a_local_judge_at_any_directory(tmp_path: Any) -> None:
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"local": {"kind": "transformers", "model": str(tmp_path)}}))
    env = {"REWARDD_JUDGE_BACKENDS_FILE": str(path), "REWARDD_MODEL_ROOTS": str(tmp_path)}
    with pytest.raises(JudgeConfigError, match="not under REWARDD_MODEL_ROOTS"):
        resolve_backend(BackendOverride(name="local", model="/etc"), env)
    chosen = resolve_backend(BackendOverride(name="local", model=str(tmp_path / "m")), env)
    assert chosen.model == str(tmp_path / "m")  # built lazily: loads on first chat


def test_a_transformers_backend_with_unknown_settings_says_which_it_takes(tmp_path: Any) -> None:
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"local": {"kind": "transformers", "model": "/m", "gpus": 2}}))
    with pytest.raises(JudgeConfigError, match="takes model"):
        resolve_backend(BackendOverride(name="local"), {"REWARDD_JUDGE_BACKENDS_FILE": str(path)})


def test_extra_body_fields_reach_the_server_without_overriding_ours(server: JudgeServer) -> None:
    extra = {"structured_outputs": {"regex": "yes|no"}, "model": "other", "top_k": 5}
    backend(server).chat([ChatRequest((("user", "q"),), extra_body=extra)])
    sent = server.requests[-1]
    assert sent["structured_outputs"] == {"regex": "yes|no"} and sent["top_k"] == 5
    assert sent["model"] == "rule-judge"


def test_equal_requests_in_one_batch_are_sent_once(server: JudgeServer) -> None:
    replies = backend(server).chat([question(7), question(8), question(7), question(7)])
    assert len(server.requests) == 2
    assert [r.cached for r in replies] == [False, False, True, True]
    assert replies[2].text == replies[0].text


# ---- the fleet-wide bound (real Redis) ------------------------------------------------------

FLEET_REDIS = "redis://127.0.0.1:6379/12"


@pytest.fixture
def fleet_redis() -> Any:
    import redis

    client = redis.Redis.from_url(FLEET_REDIS)
    client.flushdb()
    yield client
    client.flushdb()


def test_the_fleet_bound_holds_across_backends(server: JudgeServer, fleet_redis: Any) -> None:
    """Two backends (as two worker processes would be), each allowed 4 in flight, share a
    fleet bound of 3: the server never sees more than 3 at once, and every request is
    answered; the slots are all returned."""
    clients = [backend(server, max_concurrency=4, fleet_max_concurrency=3,
                       state_url=FLEET_REDIS) for _ in range(2)]
    results = chat_from_threads(server, clients, 6, latency_s=0.15)
    assert len(results) == 12 and all(isinstance(r, ChatReply) for r in results)
    assert server.max_in_flight == 3
    assert fleet_redis.zcard("rewardd:judge-slots:t") == 0


def test_a_dead_holders_slots_lapse(server: JudgeServer, fleet_redis: Any) -> None:
    """Leases a vanished process held block the fleet only until they lapse."""
    import time as clock

    fleet_redis.zadd("rewardd:judge-slots:t", {"dead": clock.time() + 0.3})
    started = clock.monotonic()
    [reply] = backend(server, fleet_max_concurrency=1, state_url=FLEET_REDIS).chat([question()])
    assert isinstance(reply, ChatReply)
    assert clock.monotonic() - started >= 0.2  # waited for the lapse


def test_a_batch_cancelled_while_taking_a_slot_gives_it_back(server: JudgeServer,
                                                             fleet_redis: Any) -> None:
    """The slot is taken in Redis, but the batch's deadline fires before the reply arrives:
    the lease must not stay behind until it lapses."""
    import asyncio

    judge = backend(server, fleet_max_concurrency=2, state_url=FLEET_REDIS)
    fleet = judge._fleet
    assert fleet is not None
    fleet._ensure()
    take = fleet._take

    async def slow_reply(**kwargs: Any) -> Any:
        taken = await take(**kwargs)
        await asyncio.sleep(5)  # the script ran; its answer is late
        return taken

    fleet._take = slow_reply
    with pytest.raises(CheckTimeout), SoftDeadline(0.3):
        judge.chat([question(1)])
    # given back, not lapsed: gone within half the lease (its 5 s timeout + 5 s margin), a
    # wait no busy machine's delay comes near
    for _ in range(250):
        if fleet_redis.zcard("rewardd:judge-slots:t") == 0:
            break
        time.sleep(0.02)
    assert fleet_redis.zcard("rewardd:judge-slots:t") == 0
    assert len(server.requests) == 0


# ---- the reply cache shared through Redis ---------------------------------------------------

def test_replies_are_shared_across_processes_through_redis(server: JudgeServer,
                                                           fleet_redis: Any) -> None:
    """Two backends with caches of their own (two worker processes) and one Redis: the
    second is answered from the first's reply; failures are never shared."""
    first, second = (backend(server, shared_cache_url=FLEET_REDIS, shared_cache_ttl_s=60)
                     for _ in range(2))
    [asked] = first.chat([question(1)])
    [shared] = second.chat([question(1)])
    assert isinstance(shared, ChatReply) and shared.cached and not asked.cached
    assert (shared.text, shared.prompt_tokens) == (asked.text, asked.prompt_tokens)
    assert len(server.requests) == 1
    [key] = fleet_redis.keys("rewardd:judge-reply:*")
    assert 0 < fleet_redis.pttl(key) <= 60_000
    server.faults.extend([("status", 400)])
    [failed] = first.chat([question(2)])
    assert isinstance(failed, JudgeUnavailable)
    [answered] = second.chat([question(2)])
    assert isinstance(answered, ChatReply) and not answered.cached
    assert len(server.requests) == 3


def test_an_unreachable_reply_cache_is_a_miss(server: JudgeServer) -> None:
    judge = backend(server, shared_cache_url="redis://127.0.0.1:9/0")
    assert all(isinstance(r, ChatReply) for r in judge.chat([question(1), question(2)]))
    assert len(server.requests) == 2


def test_the_shared_cache_is_configured_from_the_environment(server: JudgeServer,
                                                             tmp_path: Any) -> None:
    env = {"REWARDD_JUDGE_BASE_URL": server.base_url, "REWARDD_JUDGE_MODEL": "rule-judge",
           "REWARDD_JUDGE_CACHE_URL": FLEET_REDIS, "REWARDD_JUDGE_CACHE_TTL_S": "30"}
    chosen = resolve_backend(None, env)
    assert chosen.config.shared_cache_url == FLEET_REDIS  # type: ignore[attr-defined]
    assert chosen.config.shared_cache_ttl_s == 30.0  # type: ignore[attr-defined]
    with pytest.raises(JudgeConfigError, match="must start with redis://"):
        resolve_backend(None, {**env, "REWARDD_JUDGE_CACHE_URL": "127.0.0.1:6379"})


def test_without_redis_the_fleet_bound_falls_back_to_the_process_bound(
        server: JudgeServer) -> None:
    [reply] = backend(server, fleet_max_concurrency=1,
                      state_url="redis://127.0.0.1:9/0").chat([question()])
    assert isinstance(reply, ChatReply)


def test_a_fleet_bound_needs_a_redis_url(tmp_path: Any) -> None:
    path = tmp_path / "judges.json"
    path.write_text(json.dumps({"big": {"base_url": "http://x/v1", "model": "m",
                                        "fleet_max_concurrency": 8}}))
    with pytest.raises(JudgeConfigError, match="REWARDD_STATE_URL"):
        resolve_backend(BackendOverride(name="big"), {"REWARDD_JUDGE_BACKENDS_FILE": str(path)})
    chosen = resolve_backend(BackendOverride(name="big"),
                             {"REWARDD_JUDGE_BACKENDS_FILE": str(path),
                              "REWARDD_BROKER_URL": FLEET_REDIS})
    assert chosen.config.state_url == FLEET_REDIS  # type: ignore[attr-defined]
