"""The per-sample protocols' group mode (REWARDD_COMPAT_CONFIG ``group``) across two real
``rewardd serve`` pods sharing a private Redis, with a real ``rewardd worker`` doing the
checks (issue #18, item 3):

* a group whose samples reach both pods is one group: every waiting request, on either pod,
  is answered once the fourth sample's check settles, with group_size 4 and the group
  advantages ``/v1/score`` computes on the same samples in arrival order;
* pod A SIGKILLed with its two samples' checks still in flight and the group incomplete:
  A's connections are lost (the trainer would retry them as new samples), but its samples
  stay in the group; pod B notices A's heartbeat stopped, checks them again, and B's own two
  requests are answered with group_size 4 and the advantages of all four samples.

What the pods did is read from the shared Redis (the standing session's group documents:
arrival order, which pod's process owns each sample, whether its check settled), so the
test knows the order and the pods rather than assuming them. The ``test_delay`` verifier
(tests/plugins/stream.py) rewards float(completion) after a set sleep, so checks are in
flight long enough to kill a pod under them.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import httpx
import pytest
import redis

from rewardd.service.sessions.redis_store import PREFIX
from tests.support.redis_server import RedisServer
from tests.support.server import server_process

pytestmark = pytest.mark.faults

PLUGINS = "tests.plugins.stream"
PROMPT, LABEL = "What is the answer?", "42"
VALUES = ["1.0", "0.0", "0.5", "0.25"]
"""Each sample's completion, so each its own reward (and a distinct advantage)."""
PATIENCE_S = 90.0
"""Generous limit for anything the test waits on (a shared 2-core machine)."""


def compat_config(check_s: float) -> dict[str, Any]:
    return {"rewards": [{"name": "r", "verifier": "test_delay",
                         "params": {"seconds": check_s}}],
            "group": {"size": 4, "timeout_s": 150, "advantage": {"estimator": "grpo"}},
            "slime": {"value": "advantage"}, "openrlhf": {"value": "advantage"}}


@contextlib.contextmanager
def pod(redis_url: str, config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """A ``rewardd serve`` on the shared Redis with the compat group mode: (URL, process)."""
    with server_process(ready_within_s=120, ready_path="/healthz", env={
            "REWARDD_BROKER_URL": redis_url, "REWARDD_PLUGINS": PLUGINS,
            "REWARDD_COMPAT_CONFIG": json.dumps(config)}) as started:
        yield started


def group_docs(client: redis.Redis) -> list[dict[str, Any]]:
    """Every group document of every session in the private Redis (here: the one standing
    session's groups)."""
    docs = []
    for name in client.scan_iter(match=f"{PREFIX}*:groups"):
        docs += [json.loads(raw) for raw in client.hgetall(name).values()]
    return docs


def the_group(client: redis.Redis) -> dict[str, Any] | None:
    docs = group_docs(client)
    assert len(docs) <= 1, f"the samples were split into {len(docs)} groups"
    return docs[0] if docs else None


def wait_for(what: str, ready: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + PATIENCE_S
    while not (found := ready()):
        assert time.monotonic() < deadline, f"not within {PATIENCE_S:g} s: {what}"
        time.sleep(0.05)
    return found


def arrived(client: redis.Redis, count: int) -> Callable[[], dict[str, Any] | None]:
    def ready() -> dict[str, Any] | None:
        doc = the_group(client)
        return doc if doc is not None and len(doc["rollouts"]) >= count else None
    return ready


def pid_of(rollout: dict[str, Any]) -> int:
    """The process that owns a sample's check (a session owner is host:pid:nonce)."""
    return int(rollout["owner"].split(":")[1])


def completions(doc: dict[str, Any]) -> list[str]:
    return [r["body"]["completion"] for r in doc["rollouts"]]


def slime(url: str, value: str) -> httpx.Response:
    return httpx.post(f"{url}/slime/reward", timeout=PATIENCE_S * 2,
                      json={"prompt": PROMPT, "response": value, "label": LABEL})


def openrlhf(url: str, value: str) -> httpx.Response:
    return httpx.post(f"{url}/get_reward", timeout=PATIENCE_S * 2, json={
        "query": [PROMPT + value], "prompts": [PROMPT], "labels": [LABEL]})


def score(url: str, config: dict[str, Any], order: list[str]) -> list[float]:
    """/v1/score's advantages of the group with its samples in ``order``."""
    answer = httpx.post(f"{url}/v1/score", timeout=PATIENCE_S, json={
        "rewards": config["rewards"],
        "advantage": {**config["group"]["advantage"], "output": "scalar"},
        "groups": [{"group_id": "g", "prompt": PROMPT, "reference": {"answer": LABEL},
                    "rollouts": [{"rollout_id": str(i), "completion": v}
                                 for i, v in enumerate(order)]}]})
    assert answer.status_code == 200, answer.text
    [group] = answer.json()["groups"]
    return [r["advantages"] for r in group["rollouts"]]


def send_in_order(pool: ThreadPoolExecutor, client: redis.Redis, post: Callable[..., Any],
                  targets: list[tuple[str, str]], before: int = 0) -> list[Future]:
    """Post each (url, value) once the previous one joined the group: the arrival order
    is the posting order."""
    sent = []
    for i, (url, value) in enumerate(targets):
        sent.append(pool.submit(post, url, value))
        wait_for(f"sample {before + i + 1} in the group", arrived(client, before + i + 1))
    return sent


@contextlib.contextmanager
def two_pods(fleet: Any, redis_server: RedisServer, config: dict[str, Any]) -> Iterator[Any]:
    """One worker (4 checks at once) and pods A and B on the private Redis: (a Redis
    client, (URL, process) of A, of B, a thread pool to post with)."""
    _, workers = fleet(plugins=PLUGINS)
    workers.start(1, concurrency=4)
    client = redis.Redis.from_url(redis_server.url())
    with pod(redis_server.url(), config) as a, pod(redis_server.url(), config) as b, \
            ThreadPoolExecutor(4) as pool:
        yield client, a, b, pool


def test_a_group_split_across_two_pods_is_answered_on_both_as_v1_score(
        fleet: Any, redis_server: RedisServer) -> None:
    config = compat_config(1.0)
    with two_pods(fleet, redis_server, config) as (client, (url_a, proc_a), (url_b, proc_b),
                                                   pool):
        targets = [url_a, url_b, url_a, url_b]
        sent = send_in_order(pool, client, slime, list(zip(targets[:3], VALUES[:3])))
        wait_for("the first three checks settled",
                 lambda: all(r["checked"] for r in the_group(client)["rollouts"]))
        # checked, yet waiting for their group: on both pods
        assert not any(f.done() for f in sent)
        sent += send_in_order(pool, client, slime, [(targets[3], VALUES[3])], before=3)
        answers = [f.result(timeout=PATIENCE_S) for f in sent]
        doc = the_group(client)
        expected = score(url_b, config, completions(doc))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert doc["state"] == "done" and completions(doc) == VALUES
    # the samples were taken, and their checks run, by the pod each was posted to
    pids = {url_a: proc_a.pid, url_b: proc_b.pid}
    assert [pid_of(r) for r in doc["rollouts"]] == [pids[url] for url in targets]
    body = [a.json() for a in answers]
    assert [b["group_size"] for b in body] == [4, 4, 4, 4]
    assert [b["score"] for b in body] == [float(v) for v in VALUES]
    assert [b["reward"] for b in body] == [pytest.approx(e, rel=1e-12) for e in expected]
    assert [b["advantage"] for b in body] == [b["reward"] for b in body]
    assert len(set(expected)) == 4  # four distinct numbers: a swap would show


def test_a_pod_killed_mid_group_is_resumed_by_the_other_and_its_group_completes(
        fleet: Any, redis_server: RedisServer) -> None:
    config = compat_config(5.0)
    with two_pods(fleet, redis_server, config) as (client, (url_a, proc_a), (url_b, proc_b),
                                                   pool):
        lost = send_in_order(pool, client, openrlhf, [(url_a, v) for v in VALUES[:2]])
        doc = the_group(client)
        # both of A's checks in flight (5 s each), the group two samples short
        assert doc is not None and doc["state"] == "open"
        assert [(pid_of(r), r["checked"]) for r in doc["rollouts"]] == [(proc_a.pid, False)] * 2
        proc_a.kill()
        proc_a.wait()
        killed = time.monotonic()
        for future in lost:  # A's own connections: gone with it
            assert isinstance(future.exception(timeout=PATIENCE_S), httpx.TransportError)
        rest = send_in_order(pool, client, openrlhf, [(url_b, v) for v in VALUES[2:]],
                             before=2)
        answers = [f.result(timeout=PATIENCE_S * 2) for f in rest]
        waited = time.monotonic() - killed
        doc = the_group(client)
        expected = score(url_b, config, completions(doc))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert doc["state"] == "done" and completions(doc) == VALUES
    # A's samples were claimed and checked again by B
    assert [pid_of(r) for r in doc["rollouts"]] == [proc_b.pid] * 4
    body = [a.json() for a in answers]
    assert [b["extra_logs"]["rewardd_group_size"] for b in body] == [[4.0], [4.0]]
    assert [b["scores"] for b in body] == [[0.5], [0.25]]
    # B's samples' advantages need A's two rewards: /v1/score's on all four
    assert [b["rewards"] for b in body] == [[pytest.approx(e, rel=1e-12)] for e in expected[2:]]
    assert expected[2] != expected[3]
    # heartbeat expiry (4 s) + a sweep + one 5 s check again, far inside the limit
    assert waited < PATIENCE_S, waited
