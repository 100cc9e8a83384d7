"""Group and rollout ids as datasets write them come back verbatim: over /v1/score (JSON and
msgpack), through a job and its event stream, and through ``rewardd score``.

The ids hold every character that separates something somewhere (``/`` of paths and
routes, ``:`` of Redis keys, ``#``, ``%``, ``\\``, quotes, spaces) and other scripts, so a
server that escaped, split, normalised or keyed anything by them would show it here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import redis

from tests.e2e.test_cli import read_jsonl, rewardd
from tests.support.server import running_server
from tests.unit.test_jobs import parse_sse

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 120.0

GROUP_IDS = ["HumanEval/0", "gsm8k/train/17", "a:b", "a/b"]
"""``a:b`` and ``a/b`` would be one key if ``:`` and ``/`` were mapped to one separator."""
ROLLOUT_IDS = [
    ["HumanEval/0#0", "HumanEval/0:1", " spaced id ", "數學/題 1"],
    ["gsm8k/train/17/0", "gsm8k%2Ftrain%2F17/1", "a\\b", '"quoted" \'id\''],
    ["a:b/0", "a:b:1", "rewardd:job:x", "Ωμέγα → ∞"],
    ["a/b/0", "a/b:1", "../../etc/passwd", "😀"],
]
COMPLETIONS = ["1", "0", "1", "x"]
"""test_echo rewards float(completion); "x" fails, so each group's last rollout is excluded
and its id also travels in ``diagnostics.excluded``."""


def groups() -> list[dict[str, Any]]:
    return [{"group_id": gid, "rollouts": [
        {"rollout_id": rid, "completion": text, "num_tokens": 2}
        for rid, text in zip(rids, COMPLETIONS)]} for gid, rids in zip(GROUP_IDS, ROLLOUT_IDS)]


REWARDS = [{"name": "echo", "verifier": "test_echo"}]
ADVANTAGE = {"estimator": "grpo", "output": "rle",
             "filters": [{"name": "dynamic_sampling", "params": {"filter_singletons": True}}]}


def body() -> dict[str, Any]:
    return {"groups": groups(), "rewards": REWARDS, "advantage": ADVANTAGE}


def assert_ids_verbatim(result_groups: list[dict[str, Any]]) -> None:
    assert [g["group_id"] for g in result_groups] == GROUP_IDS
    for group, rids in zip(result_groups, ROLLOUT_IDS):
        assert [r["rollout_id"] for r in group["rollouts"]] == rids
        assert [r["reward"] for r in group["rollouts"]] == [1.0, 0.0, 1.0, None]
        if "diagnostics" in group:
            assert group["diagnostics"]["excluded"] == [rids[3]]


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_score_echoes_dataset_ids(server: str, wire: str) -> None:
    if wire == "json":
        resp = httpx.post(f"{server}/v1/score", json=body(), timeout=HANG_GUARD_S)
        result = resp.json()
    else:
        resp = httpx.post(f"{server}/v1/score", content=msgpack.packb(body()),
                          headers={"Content-Type": "application/vnd.msgpack",
                                   "Accept": "application/vnd.msgpack"}, timeout=HANG_GUARD_S)
        assert resp.headers["content-type"] == "application/vnd.msgpack"
        result = msgpack.unpackb(resp.content, raw=False)
    assert resp.status_code == 200, resp.text
    assert_ids_verbatim(result["groups"])
    # the filter's advice names groups by id too; none is marked (each has spread)
    assert result["advice"]["dynamic_sampling"]["filtered"] == []


def run_job(server: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Submit ``body()`` as a job; its events (the stream ends with the job) and final view."""
    with httpx.Client(base_url=server, timeout=HANG_GUARD_S) as http:
        submitted = http.post("/v1/jobs", json=body())
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        stream = http.get(f"/v1/jobs/{job_id}/events")  # ends after the terminal event
        job = http.get(f"/v1/jobs/{job_id}").json()
    return parse_sse(stream.text), job


def test_a_job_and_its_events_echo_dataset_ids(server: str) -> None:
    events, job = run_job(server)
    assert events[-1]["event"] == "succeeded", events[-1]
    published = sorted((e["data"] for e in events if e["event"] == "group"),
                       key=lambda g: g["group_index"])
    assert_ids_verbatim(published)
    # event ids are sequence numbers, never made of the ids (progress events have none)
    assert [e["id"] for e in events if e["event"] != "progress"] == [1, 2, 3, 4, 5]
    assert job["state"] == "succeeded"
    assert_ids_verbatim(job["result"]["groups"])


def test_rewardd_score_echoes_dataset_ids(tmp_path: Path) -> None:
    source = tmp_path / "groups.jsonl"
    source.write_text("".join(json.dumps(g, ensure_ascii=False) + "\n" for g in groups()),
                      encoding="utf-8")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"rewards": REWARDS, "advantage": ADVANTAGE}))
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", source, "--spec", spec, "-o", out, "--no-progress",
                   "--pool-size", "1", "--plugins", "tests.plugins.faulty")
    assert proc.returncode == 0, proc.stderr
    assert_ids_verbatim(read_jsonl(out))


STATE_DB = 7
"""A Redis database of its own (integration tests use 11, judge fleet tests 12)."""


def test_a_job_kept_in_redis_makes_no_key_of_an_id() -> None:
    """Jobs (and run state, tenant slots) in Redis: keys are made of job ids (hex), never of
    group or rollout ids, and the ids come back verbatim."""
    url = f"redis://127.0.0.1:6379/{STATE_DB}"
    client = redis.Redis.from_url(url, socket_connect_timeout=3)
    client.flushdb()
    try:
        with running_server("--pool-size", "1", "--plugins", "tests.plugins.faulty",
                            "--state-url", url) as server:
            events, job = run_job(server)
        keys = [key.decode() for key in client.scan_iter()]
    finally:
        client.flushdb()
    assert job["state"] == "succeeded", job
    assert_ids_verbatim(job["result"]["groups"])
    assert any(key == f"rewardd:job:{job['id']}" for key in keys), keys
    ids = GROUP_IDS + [rid for rids in ROLLOUT_IDS for rid in rids]
    assert not [key for key in keys if any(i in key for i in ids)], keys
