"""Streaming sessions against a real ``rewardd serve`` (embedded pool; the suite's shared
``server``): out-of-order partial groups, duplicates, timeouts, client closes, long polls,
resumable events, limits, bad input, and the numbers equal to /v1/score's on the same batch
(issue #18)."""

from __future__ import annotations

import random
import time
from typing import Any, Iterator

import httpx
import pytest

from tests.sessions.support import (Stream, by_id, groups_of, read_events, rollout,
                                    score_groups, spec, without_diagnostics)

pytestmark = pytest.mark.e2e

MAX_OPEN = 8  # REWARDD_SESSION_MAX_OPEN's default
REWARDS = {"q0": [1.0, 0.0, 0.5, 0.25], "q/1": [0.0, 0.0, 1.0, 1.0],
           "q2": [0.75, 0.75, 0.75, 0.75], "q 3": [1.0, 0.0, 0.0, 0.0]}


@pytest.fixture
def url(server: str) -> str:
    return server


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client


def open_session(http: httpx.Client, body: dict[str, Any]) -> str:
    response = http.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    sid = response.json()["session_id"]
    assert response.headers["location"] == f"/v1/sessions/{sid}"
    return sid


def send_shuffled(http: httpx.Client, sid: str, groups: list[dict[str, Any]],
                  seed: int = 7) -> list[str]:
    """Every rollout, one or two at a time, interleaving groups in a shuffled order (a
    group's prompt and reference only on its first sight). The group ids by first sight."""
    rng = random.Random(seed)
    parts = [(g, r) for g in groups for r in g["rollouts"]]
    rng.shuffle(parts)
    seen: list[str] = []
    for start in range(0, len(parts), 2):
        body: dict[str, dict[str, Any]] = {}
        for group, one in parts[start:start + 2]:
            gid = group["group_id"]
            entry = body.setdefault(gid, {"group_id": gid, "rollouts": []})
            if gid not in seen:
                seen.append(gid)
                entry.update(prompt=group["prompt"], reference=group["reference"])
            entry["rollouts"].append(one)
        response = http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": list(body.values())})
        assert response.status_code == 200, response.text
    return seen


def same_batch(groups: list[dict[str, Any]], order: list[str],
               seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``groups`` as the session holds them: groups by first sight, rollouts by arrival
    (as ``seen``, group objects the session published, lists them)."""
    arrival = {g["group_id"]: [r["rollout_id"] for r in g["rollouts"]] for g in seen}
    return [{**g, "rollouts": sorted(g["rollouts"], key=lambda r: arrival[gid].index(
        r["rollout_id"]))} for gid in order for g in groups if g["group_id"] == gid]


def score(http: httpx.Client, groups: list[dict[str, Any]], advantage: dict[str, Any]
          ) -> dict[str, Any]:
    response = http.post("/v1/score", json={"groups": groups, "advantage": advantage,
                                            "rewards": spec(1)["rewards"]})
    assert response.status_code == 200, response.text
    return without_diagnostics(response.json())


def test_out_of_order_groups_stream_final_advantages_equal_to_score(http: httpx.Client,
                                                                    url: str) -> None:
    groups = groups_of(REWARDS)
    body = spec(4)
    sid = open_session(http, body)
    stream = Stream(f"{url}/v1/sessions/{sid}/events").start()
    order = send_shuffled(http, sid, groups)
    # a group's result is there before the close, final (grpo is group-level)
    first = http.get(f"/v1/sessions/{sid}/groups/{order[0]}", params={"wait_s": 30}).json()
    assert first["complete"] and first["group"]["final"] is True
    closed = http.post(f"/v1/sessions/{sid}/close")
    assert closed.status_code == 200, closed.text
    events = stream.join()
    kinds = [kind for _, kind, _, _ in events]
    assert kinds == ["group"] * 4 + ["closed"]
    assert [seq for seq, *_ in events] == [1, 2, 3, 4, 5]
    published = stream.groups()
    assert all(g["final"] and g["reason"] == "full" and g["arrived"] == 4
               for g in published.values())
    assert sorted(g["index"] for g in published.values()) == [0, 1, 2, 3]
    assert [gid for gid, _ in sorted(published.items(), key=lambda kv: kv[1]["index"])] == order

    expected = score(http, same_batch(groups, order, list(published.values())),
                     body["advantage"])
    for group in expected["groups"]:  # bit for bit: JSON floats read back exactly
        assert score_groups(published[group["group_id"]]) == group
    result = closed.json()["result"]
    assert result == expected
    assert events[-1][2] == closed.json()
    assert closed.json()["summary"] == expected["summary"]
    # after the close, the long poll answers the final group at once
    again = http.get(f"/v1/sessions/{sid}/groups/{order[1]}").json()
    assert score_groups(again["group"]) == by_id(expected["groups"])[order[1]]
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "closed"


def test_batch_level_estimator_is_computed_at_close(http: httpx.Client, url: str) -> None:
    groups = groups_of(REWARDS)
    advantage = {"estimator": "reinforce_pp_baseline", "output": "dense",
                 "filters": [{"name": "dynamic_sampling"}]}
    sid = open_session(http, {**spec(4), "advantage": advantage})
    order = send_shuffled(http, sid, groups, seed=3)
    for gid in order:
        got = http.get(f"/v1/sessions/{sid}/groups/{gid}", params={"wait_s": 30}).json()
        group = got["group"]
        assert group["final"] is False  # whitened over the batch: only rewards are final
        assert all(r["advantages"] is None for r in group["rollouts"])
        sent = same_batch(groups, [gid], [group])[0]["rollouts"]
        assert [r["reward"] for r in group["rollouts"]] == [float(r["completion"])
                                                            for r in sent]
    result = http.post(f"/v1/sessions/{sid}/close").json()["result"]
    assert result == score(http, same_batch(groups, order, result["groups"]), advantage)
    assert result["advice"]["dynamic_sampling"]  # the filter ran over the whole batch


def test_duplicates_are_not_scored_twice_and_conflicts_are_409(http: httpx.Client) -> None:
    sid = open_session(http, spec(3))
    one = {"group_id": "g", "prompt": "p", "reference": {},
           "rollouts": [rollout("a", 1.0), rollout("b", 0.0)]}
    assert http.post(f"/v1/sessions/{sid}/rollouts",
                     json={"groups": [one]}).json() == {"accepted": 2, "duplicates": 0}
    again = http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [one]})
    assert again.json() == {"accepted": 0, "duplicates": 2}
    changed = {**one, "rollouts": [rollout("a", 0.5)]}
    conflict = http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [changed]})
    assert conflict.status_code == 409 and "'a'" in conflict.json()["detail"]
    other_prompt = {**one, "prompt": "q", "rollouts": [rollout("c", 1.0)]}
    assert http.post(f"/v1/sessions/{sid}/rollouts",
                     json={"groups": [other_prompt]}).status_code == 409
    too_many = {"group_id": "g", "rollouts": [rollout("c", 1.0), rollout("d", 1.0)]}
    over = http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [too_many]})
    assert over.status_code == 422
    assert over.json()["detail"][0]["loc"] == ["body", "groups", 0, "rollouts"]
    last = {"group_id": "g", "rollouts": [rollout("c", 0.5)]}
    assert http.post(f"/v1/sessions/{sid}/rollouts",
                     json={"groups": [last]}).json()["accepted"] == 1
    group = http.get(f"/v1/sessions/{sid}/groups/g", params={"wait_s": 30}).json()["group"]
    assert [r["rollout_id"] for r in group["rollouts"]] == ["a", "b", "c"]
    assert [r["reward"] for r in group["rollouts"]] == [1.0, 0.0, 0.5]
    # a complete group takes no new rollout, but a resent one is still a duplicate
    late = {"group_id": "g", "rollouts": [rollout("a", 1.0)]}
    assert http.post(f"/v1/sessions/{sid}/rollouts",
                     json={"groups": [late]}).json() == {"accepted": 0, "duplicates": 1}
    new = {"group_id": "g", "rollouts": [rollout("z", 1.0)]}
    assert http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [new]}).status_code == 409
    assert http.get(f"/v1/sessions/{sid}").json()["rollouts"] == 3
    http.delete(f"/v1/sessions/{sid}")


def test_group_timeout_completes_or_fails_and_client_close(http: httpx.Client,
                                                           url: str) -> None:
    for mode in ("complete", "fail"):
        sid = open_session(http, spec(4, group_timeout_s=0.5, on_group_timeout=mode))
        part = {"group_id": "slow", "prompt": "p",
                "rollouts": [rollout("a", 1.0), rollout("b", 0.0)]}
        sent = time.monotonic()
        http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [part]})
        got = http.get(f"/v1/sessions/{sid}/groups/slow", params={"wait_s": 30}).json()
        assert time.monotonic() - sent >= 0.45
        group = got["group"]
        assert group["reason"] == "timeout" and group["arrived"] == 2
        if mode == "complete":
            assert group["failed"] is False and group["final"] is True
            high, low = (r["advantages"][0] for r in group["rollouts"])
            assert high > 0 and low == -high
        else:
            assert group["failed"] is True and group["rollouts"] == []
            assert group["diagnostics"]["excluded"] == ["a", "b"]
        late = {"group_id": "slow", "rollouts": [rollout("c", 1.0)]}
        assert http.post(f"/v1/sessions/{sid}/rollouts",
                         json={"groups": [late]}).status_code == 409
        closed = http.post(f"/v1/sessions/{sid}/close").json()
        assert closed["summary"]["groups"] == (1 if mode == "complete" else 0)

    sid = open_session(http, spec(4))
    http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
        {"group_id": "early", "prompt": "p", "rollouts": [rollout("a", 1.0), rollout("b", 0.5),
                                                          rollout("c", 0.0)]}]})
    pending = http.get(f"/v1/sessions/{sid}/groups/early", params={"wait_s": 0.2}).json()
    assert pending == {"group_id": "early", "complete": False, "group": None}
    shut = http.post(f"/v1/sessions/{sid}/groups/early/close")
    assert shut.status_code == 200
    group = http.get(f"/v1/sessions/{sid}/groups/early", params={"wait_s": 30}).json()["group"]
    assert group["reason"] == "closed" and group["arrived"] == 3
    assert http.post(f"/v1/sessions/{sid}/groups/nope/close").status_code == 404
    assert http.get(f"/v1/sessions/{sid}/groups/nope").status_code == 404
    http.post(f"/v1/sessions/{sid}/close")
    # the stream replays from any event id, on a closed session too
    events = read_events(f"{url}/v1/sessions/{sid}/events", {"Last-Event-ID": "1"})
    assert [kind for _, kind, _, _ in events] == ["closed"]
    bad = http.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": "9"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["header",
                                                                         "Last-Event-ID"]


def test_bad_input_names_the_field_and_limits_answer_429(http: httpx.Client) -> None:
    bad = http.post("/v1/sessions", json={**spec(4), "group_size": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "group_size"]
    unknown = http.post("/v1/sessions", json={**spec(4), "rewards": [
        {"name": "r", "verifier": "no_such_verifier"}]})
    assert unknown.status_code == 422
    assert unknown.json()["detail"][0]["loc"] == ["body", "rewards", 0, "verifier"]
    assert http.post("/v1/sessions/0123/rollouts", json={"groups": []}).status_code == 404
    sid = open_session(http, spec(2))
    empty = http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
        {"group_id": "g", "rollouts": [{"rollout_id": "a", "num_tokens": -1}]}]})
    assert empty.status_code == 422
    assert empty.json()["detail"][0]["loc"][:4] == ["body", "groups", 0, "rollouts"]
    opened = [sid]
    while (busy := http.post("/v1/sessions", json=spec(2))).status_code == 201:
        opened.append(busy.json()["session_id"])  # other tests of the suite may hold some
        assert len(opened) <= MAX_OPEN
    assert busy.status_code == 429 and int(busy.headers["retry-after"]) >= 1
    assert "REWARDD_SESSION_MAX_OPEN" in busy.json()["detail"]
    for one in opened:
        assert http.delete(f"/v1/sessions/{one}").json()["state"] == "cancelled"
    assert http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": [
        {"group_id": "g", "rollouts": [rollout("a", 1.0)]}]}).status_code == 409
    http.delete(f"/v1/sessions/{open_session(http, spec(2))}")  # a slot is free again


def test_a_closed_session_with_a_run_id_is_recorded_as_its_answer(http: httpx.Client) -> None:
    run_id = f"session-{random.randrange(1 << 30)}"
    groups = groups_of({"a": [1.0, 0.0], "b": [0.5, 0.5], "c": [1.0, 1.0]})
    groups[0]["data_source"] = "set-a"
    groups[2]["source"] = "set-c"
    sid = open_session(http, {**spec(2), "run_id": run_id, "step": 9})
    http.post(f"/v1/sessions/{sid}/rollouts", json={"groups": groups}).raise_for_status()
    result = http.post(f"/v1/sessions/{sid}/close").json()["result"]
    deadline = time.monotonic() + 120  # written off the request path: a guard, not a bound
    while True:
        view = http.get(f"/v1/runs/{run_id}")
        if view.status_code == 200 and (view.json()["record"] or {}).get("rollouts") == 6:
            break
        assert time.monotonic() < deadline, view.text
        time.sleep(0.1)
    [step] = view.json()["steps"]
    assert (step["step"], step["sources"]) == (9, {"": 2, "set-a": 2, "set-c": 2})
    assert [g.get("source") for g in result["groups"]] == [None, None, "set-c"]
    page = http.get(f"/v1/runs/{run_id}/rollouts").json()["rollouts"]
    answered = {r["rollout_id"]: r for g in result["groups"] for r in g["rollouts"]}
    assert {r["rollout_id"] for r in page} == set(answered)
    for item in page:
        assert item["verdicts"]["r"]["reward"] == answered[item["rollout_id"]]["rewards"]["r"]
        assert item["summary"]["reward"] == answered[item["rollout_id"]]["reward"]
