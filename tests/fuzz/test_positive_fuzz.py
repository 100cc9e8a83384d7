"""A positive fuzzer: well-formed batches through every entry of ``GET /v1/estimators``.

Why: schemathesis (test_schemathesis.py) mostly meets the validator, since a random body
rarely holds a consistent batch; the estimators' arithmetic needs bodies a trainer would send:
groups of 1 to 5 rollouts, 1 to 12 tokens, masks, rewards from {0, 1} (ties, zero-spread
groups) or a float range, and each entry's inputs (values, steps with keys and embeddings,
turns, segments bound to components, token_ids sharing prefixes, greedy rollouts, labels,
clusters, answers, quality, data sources). Every entry runs with its default parameters, in
its own kind's slot of the pipeline (transform -> estimator or aggregate -> reweight ->
filters), through :func:`rewardd.advantages.compute_advantages` (the route's very functions),
and a few batches through ``POST /v1/advantages`` itself.

Invariants: the answer is a body or a ``RequestInvalid`` whose every error names a field (the
route's 422; never another exception, the route's 500); every advantage finite; rle decodes
to dense bit for bit; masked tokens exactly 0; excluded rollouts 0 on every token; the
group-relative estimators (grpo, dr_grpo, rloo, gpg under the rewardd profile) sum to ~0 over
each group, opo's sum weighted by each rollout's mask-1 tokens too.

Budget: a fixed seed (``derandomize``), 25 examples per entry and output: ~40 s on this
machine for the ~37 entries.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import hypothesis.strategies as st
import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from rewardd.advantages import compute_advantages, decode_rle
from rewardd.advantages.errors import RequestInvalid
from rewardd.service.api.catalogue import list_estimators
from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import RefusingExecutor

ENTRIES = {e.name: e for e in list_estimators()}
COMPONENTS = ("a", "b")
EXAMPLES = 25
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# scalar advantages that must sum to 0 over each group (rewardd profile, nothing excluded)
ZERO_SUM = {"grpo", "dr_grpo", "rloo", "gpg"}
# what the catalogue's `inputs` and defaults leave out: modulate lists no input (which one
# depends on its `source`; the default "token" reads rollout.signal), and budget's `total`
# has no default (the batch size to plan is the trainer's)
EXTRA_INPUTS = {"modulate": {"signal"}}
REQUIRED_PARAMS: dict[str, dict[str, Any]] = {"budget": {"total": 8}}
# entries whose advantages vary over a rollout's tokens: `output: scalar` may be a 422 for them
PER_TOKEN = {"gae", "reinforce_pp", "segment", "turn", "gigpo", "bipace", "tempo",
             "outcome_conditioned", "modulate"}


def spans(draw: st.DrawFn, num_tokens: int) -> list[tuple[int, int]]:
    """Non-overlapping [start, end) spans inside the rollout, in order, at least one."""
    cuts = sorted(draw(st.sets(st.integers(1, num_tokens - 1), max_size=3))) if num_tokens > 1 else []
    bounds = [0, *cuts, num_tokens]
    return [(s, e) for s, e in zip(bounds, bounds[1:])]


REWARD = st.one_of(st.sampled_from([0.0, 1.0]),
                   st.floats(-10, 10, allow_nan=False, allow_infinity=False))


@st.composite
def rollout(draw: st.DrawFn, inputs: set[str], index: str, components: bool) -> dict[str, Any]:
    n = draw(st.integers(1, 12))
    r: dict[str, Any] = {"rollout_id": index, "num_tokens": n}
    if draw(st.booleans()):
        mask = draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n))
        r["mask"] = mask
    if components:
        r["rewards"] = {k: draw(REWARD) for k in COMPONENTS}
    else:
        r["reward"] = draw(REWARD)
    if "signal" in inputs:
        r["signal"] = draw(st.lists(st.floats(-3, 3), min_size=n, max_size=n))
    if "values" in inputs:
        r["values"] = draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n))
    if "token_ids" in inputs:  # a vocabulary of 3: prefixes shared between siblings
        r["token_ids"] = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    if "steps" in inputs:
        dim = 3
        r["steps"] = [{"start": s, "end": e, "key": draw(st.sampled_from(["s0", "s1"])),
                       "reward": draw(REWARD),
                       "embedding": draw(st.lists(st.floats(-1, 1), min_size=dim, max_size=dim))}
                      for s, e in spans(draw, n)]
    if "turns" in inputs:
        r["turns"] = [{"start": s, "end": e, "reward": draw(REWARD)} for s, e in spans(draw, n)]
    if "segments" in inputs:
        r["segments"] = [{"label": draw(st.sampled_from(COMPONENTS)), "start": s, "end": e}
                         for s, e in spans(draw, n)]
    if "label" in inputs:
        r["label"] = draw(st.sampled_from(["x", "y"]))
    if "cluster" in inputs:
        r["cluster"] = draw(st.sampled_from(["c0", "c1", "c2"]))
    if "quality" in inputs:
        r["quality"] = draw(st.floats(0, 1))
    if "answer" in inputs:
        r["answer"] = draw(st.sampled_from(["1", "2"]))
    return r


@st.composite
def batch(draw: st.DrawFn, inputs: set[str], components: bool) -> dict[str, Any]:
    groups = []
    for g in range(draw(st.integers(1, 4))):
        rollouts = [draw(rollout(inputs, f"g{g}/{i}", components))
                    for i in range(draw(st.integers(1, 5)))]
        if "greedy" in inputs:
            rollouts[0]["greedy"] = True
        group: dict[str, Any] = {"group_id": f"g{g}", "rollouts": rollouts}
        if "data_source" in inputs:
            group["data_source"] = draw(st.sampled_from(["d0", "d1"]))
        groups.append(group)
    return {"run_id": "fuzz", "groups": groups}


def body_for(name: str, output: str, drawn: dict[str, Any]) -> dict[str, Any]:
    """The entry ``name`` in its kind's slot, default parameters, around grpo/sum."""
    kind = ENTRIES[name].kind
    stage = {"name": name, "params": REQUIRED_PARAMS.get(name, {})}
    spec: dict[str, Any] = {"output": output}
    if kind == "transform":
        spec["transforms"] = [stage]
    elif kind == "estimator":
        spec["estimator"] = name
    elif kind == "aggregate":
        spec["aggregate"] = name
    elif kind == "reweight":
        spec["reweight"] = [stage]
    else:
        spec["filters"] = [stage]
    if needs_components(name):
        spec["weights"] = {"a": 1.0, "b": 0.5}
    return {**drawn, "advantage": spec}


def needs_components(name: str) -> bool:
    inputs = set(ENTRIES[name].inputs)
    return ENTRIES[name].kind == "aggregate" or "components" in inputs or "segments" in inputs


def dense_of(advantages: Any, num_tokens: int) -> list[float]:
    if isinstance(advantages, dict):
        return decode_rle(advantages["rle"])
    if isinstance(advantages, list):
        return [float(v) for v in advantages]
    return [float(advantages)] * num_tokens


def check_invariants(name: str, body: dict[str, Any], out: dict[str, Any]) -> None:
    sent = {(g["group_id"], r["rollout_id"]): r for g in body["groups"] for r in g["rollouts"]}
    for group in out["groups"]:
        for r in group["rollouts"]:
            rollout_in = sent[(group["group_id"], r["rollout_id"])]
            n = rollout_in["num_tokens"]
            dense = dense_of(r["advantages"], n)
            assert all(math.isfinite(v) for v in dense), (name, r)
            if body["advantage"]["output"] != "scalar":
                assert len(dense) == n, (name, r)
                for t, m in enumerate(rollout_in.get("mask") or [1] * n):
                    if m == 0:
                        assert dense[t] == 0.0, (name, "masked token", t, r)
            if r.get("excluded"):
                assert set(dense) <= {0.0}, (name, "excluded", r)


def wire(out: dict[str, Any]) -> bytes:
    """The response body as the route writes it (numpy arrays as JSON lists)."""
    return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


def run(body: dict[str, Any]) -> dict[str, Any] | None:
    """The body as a client reads it, or None for a 422 naming its fields; anything else
    (the route's 500) fails the test."""
    try:
        return orjson.loads(wire(compute_advantages(body, {})))
    except RequestInvalid as exc:
        assert exc.errors, body
        for error in exc.errors:
            assert error.get("loc") and error.get("msg"), error
        return None


def data_for(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return batch(set(ENTRIES[name].inputs) | EXTRA_INPUTS.get(name, set()),
                 needs_components(name))


@pytest.mark.parametrize("name", sorted(ENTRIES))
@FUZZ
@given(data=st.data())
def test_every_entry_on_well_formed_batches(name: str, data: st.DataObject) -> None:
    drawn = data.draw(data_for(name))
    results = {}
    for output in ("rle", "dense", "scalar"):
        body = body_for(name, output, drawn)
        out = run(body)
        if out is not None:
            check_invariants(name, body, out)
        results[output] = out
    rle, dense = results["rle"], results["dense"]
    # a well-formed batch carrying the entry's inputs is accepted; only `scalar` of
    # advantages that vary per token may be refused
    assert rle is not None and dense is not None, name
    assert results["scalar"] is not None or name in PER_TOKEN, name
    if rle is not None and dense is not None:
        for g_rle, g_dense in zip(rle["groups"], dense["groups"]):
            for a, b in zip(g_rle["rollouts"], g_dense["rollouts"]):
                assert decode_rle(a["advantages"]["rle"]) == b["advantages"], name


@pytest.mark.parametrize("name", sorted(ZERO_SUM | {"opo"}))
@FUZZ
@given(data=st.data())
def test_group_relative_estimators_sum_to_zero_per_group(name: str, data: st.DataObject) -> None:
    drawn = data.draw(data_for(name))
    body = body_for(name, "scalar", drawn)
    out = run(body)
    assert out is not None, "a well-formed batch with rewards on every rollout is accepted"
    for group_in, group in zip(drawn["groups"], out["groups"]):
        # opo weighs by the tokens that train: mask-1 tokens, all of them without a mask
        lengths = [sum(r.get("mask") or [1] * r["num_tokens"]) for r in group_in["rollouts"]]
        adv = [r["advantages"] for r in group["rollouts"]]
        weights = lengths if name == "opo" else [1] * len(adv)
        total = sum(w * a for w, a in zip(weights, adv))
        scale = max([1.0, *(abs(w * a) for w, a in zip(weights, adv))])
        assert abs(total) <= 1e-9 * scale * len(adv), (name, adv)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(pool_size=1), executor=RefusingExecutor())) as c:
        yield c


@pytest.mark.parametrize("name", ["grpo", "gae", "segment", "turn", "gdpo", "difficulty",
                                  "dynamic_sampling"])
@settings(FUZZ, max_examples=5)
@given(data=st.data())
def test_the_route_answers_what_the_library_computes(client: TestClient, name: str,
                                                     data: st.DataObject) -> None:
    """Through ``POST /v1/advantages``: 200 with the library's body, or 422 with its errors."""
    body = body_for(name, "rle", data.draw(data_for(name)))
    response = client.post("/v1/advantages", json=body)
    assert response.status_code in (200, 422), response.text
    try:
        expected = wire(compute_advantages(body, {}))
    except RequestInvalid as exc:
        assert response.status_code == 422
        assert response.json() == {"detail": exc.errors}
    else:
        assert response.status_code == 200
        assert response.content == expected
