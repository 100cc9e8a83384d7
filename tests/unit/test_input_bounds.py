"""What one hostile body can make validation do is bounded (issue 15, row 2).

* the 422's error list: at most MAX_ERRORS entries, then one ``too_many_errors`` entry;
* the work behind it: lists and maps stop at their first bad element, a map of many unknown
  keys is one error, and the service's own checks stop reading after the bound;
* nesting: free-form fields (``reference``, ``params``) at most MAX_DEPTH levels, a 422
  naming the field; deeper than the decoders' own limit (1024) is a 400, on both wires.

Through the real app with an executor that fails the test if anything would run.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Iterator

import msgpack
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from rewardd.advantages.bounds import MAX_DEPTH, too_deep
from rewardd.advantages.checks import check_groups
from rewardd.advantages.errors import MAX_ERRORS, RequestInvalid, capped, error
from rewardd.service.app import create_app
from rewardd.service.models import AdvantagesRequest, ScoreRequest
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor

MSGPACK = {"content-type": "application/msgpack"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    executor = RefusingExecutor()
    app = create_app(Settings(pool_size=1, max_body_bytes=64 << 20), executor=executor)
    with TestClient(app) as c:
        yield c
    assert executor.run_calls == 0, "a refused body reached the executor"


def post(client: TestClient, path: str, body: Any, wire: str = "json") -> Any:
    if wire == "json":
        return client.post(path, content=json.dumps(body),  # orjson writes <= 254 levels
                           headers={"content-type": "application/json"})
    return client.post(path, content=msgpack.packb(body), headers=MSGPACK)


def rollouts(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"rollout_id": f"r{k}", "reward": float(k % 2), **extra} for k in range(n)]


def adv_body(group_rollouts: list[dict[str, Any]], **advantage: Any) -> dict[str, Any]:
    return {"groups": [{"group_id": "g", "rollouts": group_rollouts}],
            "advantage": {"output": "scalar", **advantage}}


# ---- the error list and the work behind it ---------------------------------------------------


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_a_million_null_mask_entries_are_one_error(client: TestClient, wire: str) -> None:
    """The issue's probe: 1,000,000 nulls in ``mask`` (a 1 MB msgpack body) answered
    1,000,000 errors (113 MB); the list stops at its first bad element."""
    n = 1_000_000
    body = adv_body([{"rollout_id": "a", "reward": 1.0, "num_tokens": n, "mask": [None] * n},
                     {"rollout_id": "b", "reward": 0.0}])
    resp = post(client, "/v1/advantages", body, wire)
    assert resp.status_code == 422
    assert resp.json() == {"detail": [{
        "loc": ["body", "groups", 0, "rollouts", 0, "mask", 0],
        "msg": "Input should be a valid integer", "type": "int_type"}]}


def test_pydantic_stops_at_the_first_bad_element_of_every_list_and_map() -> None:
    """The work, not only what is shown: pydantic itself finds one error per list or map."""
    n = 100_000
    cases = {
        "mask": adv_body([{"rollout_id": "a", "num_tokens": n, "mask": [None] * n}]),
        "rollouts": adv_body([{}] * n),
        "groups": {"groups": [{}] * n},
        "rewards map": adv_body([{"rollout_id": "a", "rewards": {f"c{k}": "x"
                                                                  for k in range(n)}}]),
        "reference keys": {"groups": [{"group_id": "g", "rollouts": rollouts(1),
                                       "reference": {k: 1 for k in range(n)}}],
                           "rewards": [{"name": "a", "verifier": "math"}]},
    }
    for what, body in cases.items():
        with pytest.raises(ValidationError) as caught:
            ScoreRequest.model_validate(body) if "reference" in what \
                else AdvantagesRequest.model_validate(body)
        assert caught.value.error_count() <= 5, (what, caught.value.errors()[:6])


def test_a_map_of_many_unknown_keys_is_one_error(client: TestClient) -> None:
    """``extra="forbid"`` reported each unknown key: 1,000,000 keys were 1,000,000 errors."""
    rollout = {"rollout_id": "a", "reward": 1.0, **{f"k{k}": None for k in range(100_000)}}
    resp = post(client, "/v1/advantages", adv_body([rollout, *rollouts(1)]), "msgpack")
    assert resp.status_code == 422
    [only] = resp.json()["detail"]
    assert only["loc"] == ["body", "groups", 0, "rollouts", 0]
    assert only["type"] == "too_many_fields"
    fields = len(AdvantagesRequest.model_fields["groups"].annotation.__args__[0]
                 .model_fields["rollouts"].annotation.__args__[0].model_fields)
    assert only["msg"] == (f"100002 keys where Rollout has {fields} fields; unknown ones "
                           "include 'k0', 'k1', 'k2', 'k3', 'k4': send only the documented "
                           "fields")


def test_a_few_unknown_keys_are_still_each_named(client: TestClient) -> None:
    rollout = {"rollout_id": "a", "reward": 1.0, "rewrd": 1, "compleiton": "x"}
    resp = post(client, "/v1/advantages", adv_body([rollout, *rollouts(1)]))
    assert resp.status_code == 422
    assert [e["loc"][-1] for e in resp.json()["detail"]] == ["rewrd", "compleiton"]


def test_pydantic_errors_past_the_bound_are_counted_not_listed(client: TestClient) -> None:
    """A rollout with MAX_ERRORS unknown keys (each reported) and three bad fields."""
    rollout = {"rollout_id": "", "reward": "x", "num_tokens": -1,
               **{f"k{k:03d}": 0 for k in range(MAX_ERRORS)}}
    resp = post(client, "/v1/advantages", adv_body([rollout, *rollouts(1)]))
    assert resp.status_code == 422
    detail = resp.json()["detail"]
    assert len(detail) == MAX_ERRORS + 1
    assert detail[-1] == {"loc": ["body"], "type": "too_many_errors", "msg": (
        f"3 more errors are not listed (at most {MAX_ERRORS} are reported): fix these and "
        "send the request again")}


def test_the_services_own_checks_stop_after_the_bound(client: TestClient) -> None:
    """10,000 rollouts whose mask has the wrong length (valid to pydantic): 100 errors, in
    order, then the entry saying the checks stopped."""
    n = 10_000
    body = adv_body(rollouts(n, num_tokens=2, mask=[1]))
    resp = post(client, "/v1/advantages", body, "msgpack")
    assert resp.status_code == 422
    detail = resp.json()["detail"]
    assert len(detail) == MAX_ERRORS + 1
    assert detail[:2] == [
        {"loc": ["body", "groups", 0, "rollouts", k, "mask"],
         "msg": "has 1 entries but num_tokens is 2", "type": "value_error"} for k in (0, 1)]
    assert detail[MAX_ERRORS - 1]["loc"][4] == MAX_ERRORS - 1
    assert detail[-1] == {"loc": ["body"], "type": "too_many_errors", "msg": (
        "the checks stopped after these; there are more errors (at most "
        f"{MAX_ERRORS} are reported): fix these and send the request again")}


def test_the_checks_are_read_no_further_than_one_past_the_bound() -> None:
    produced = itertools.count()
    endless = (error(("body", next(produced)), "bad") for _ in itertools.count())
    listed = capped(endless)
    assert len(listed) == MAX_ERRORS + 1 and next(produced) == MAX_ERRORS + 1
    req = AdvantagesRequest.model_validate(adv_body(rollouts(1000, num_tokens=2, mask=[1])))
    checks = check_groups(req.groups, None)
    capped(checks)
    assert sum(1 for _ in checks) == 1000 - MAX_ERRORS - 1  # the rest was never looked at


def test_a_short_error_list_is_unchanged_and_any_raise_site_is_bounded() -> None:
    few = [error(("body", k), "bad") for k in range(3)]
    assert capped(few) == few and capped(few, total=3) == few
    assert len(RequestInvalid([error(("body",), "x")] * 10_000).errors) == MAX_ERRORS + 1


# ---- nesting ---------------------------------------------------------------------------------


def nested(levels: int) -> Any:
    """Objects and arrays alternating, ``levels`` deep: nested(1) == {"k": 0}."""
    value: Any = 0
    for level in range(levels):
        value = {"k": value} if level % 2 == 0 else [value]
    return value if levels % 2 == 1 else {"k": value}


def test_depth_is_counted_in_levels_of_objects_and_arrays() -> None:
    assert too_deep({"a": 1}, 1) is None and too_deep({"a": {}}, 1) == ("a",)
    assert too_deep(nested(MAX_DEPTH - 1)) is None  # ({"k": ...} wraps an odd count)
    assert too_deep(nested(MAX_DEPTH + 1)) is not None
    deep = [0]
    for _ in range(100_000):  # iterative: far past the recursion limit
        deep = [deep]
    assert too_deep(deep) == (0,) * MAX_DEPTH


def score_with(reference: Any = None, params: Any = None) -> dict[str, Any]:
    return {"groups": [{"group_id": "g", "reference": reference or {},
                        "rollouts": rollouts(2)}],
            "rewards": [{"name": "acc", "verifier": "math", "params": params or {}}]}


def depth_error(loc: list[Any], where: str) -> dict[str, Any]:
    return {"loc": loc, "type": "too_deep", "msg": (
        f"nested more than {MAX_DEPTH} levels deep (at {where}); objects and arrays may nest "
        f"at most {MAX_DEPTH} levels here: flatten it")}


def chain_of(levels: int) -> dict[str, Any]:
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_a_reference_deeper_than_the_bound_is_a_422_naming_it(client: TestClient,
                                                              wire: str) -> None:
    """The issue's row-1 payload (500 levels) and the first level past the bound."""
    where = ".".join(["a"] * MAX_DEPTH)
    where = where[:117] + "..."
    for levels in (MAX_DEPTH + 1, 500):
        resp = post(client, "/v1/score", score_with(reference=chain_of(levels)), wire)
        assert resp.status_code == 422, resp.text
        assert resp.json()["detail"] == [depth_error(["body", "groups", 0, "reference"],
                                                     where)]


def test_every_free_form_field_is_bounded(client: TestClient) -> None:
    deep = chain_of(MAX_DEPTH + 1)
    where = ".".join(["a"] * MAX_DEPTH)[:117] + "..."
    probes = [
        ("/v1/score", score_with(params=deep), ["body", "rewards", 0, "params"]),
        ("/v1/verify/math", {"completion": "1", "reference": deep}, ["body", "reference"]),
        ("/v1/verify/math", {"completion": "1", "params": deep}, ["body", "params"]),
        ("/v1/advantages", adv_body(rollouts(2), params=deep), ["body", "advantage", "params"]),
        ("/v1/advantages", adv_body(rollouts(2), aggregate_params=deep),
         ["body", "advantage", "aggregate_params"]),
        ("/v1/advantages", adv_body(rollouts(2), transforms=[{"name": "rank", "params": deep}]),
         ["body", "advantage", "transforms", 0, "params"]),
        ("/v1/jobs", score_with(reference=deep), ["body", "groups", 0, "reference"]),
    ]
    for path, body, loc in probes:
        resp = post(client, path, body)
        assert resp.status_code == 422, (path, resp.text)
        assert resp.json()["detail"] == [depth_error(loc, where)], path


def test_the_bound_itself_is_accepted() -> None:
    req = ScoreRequest.model_validate(score_with(reference=chain_of(MAX_DEPTH)))
    assert too_deep(req.groups[0].reference, MAX_DEPTH - 1) is not None


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_past_the_decoders_own_limit_is_a_400(client: TestClient, wire: str) -> None:
    """orjson and msgpack both stop at 1024 levels (the stdlib JSON fallback at the
    recursion limit): a 400, never a crash, whatever the depth."""
    for levels in (1025, 100_000):
        if wire == "json":
            raw = b'{"groups": ' + b"[" * levels + b"]" * levels + b"}"
            resp = client.post("/v1/score", content=raw,
                               headers={"content-type": "application/json"})
        else:
            raw = b"\x81\xa6groups" + b"\x91" * (levels - 1) + b"\x90"
            resp = client.post("/v1/score", content=raw, headers=MSGPACK)
        assert resp.status_code == 400, resp.text
        assert resp.json()["detail"].startswith(f"body is not valid {wire.replace('json', 'JSON')}")
