"""Planning tasks from verifier calls: splitting big groups, packing small ones."""

from __future__ import annotations

from typing import Any

import pytest

from rewardd.verifiers.base import Sample
from rewardd.workers.executor import HARD_MARGIN_S, HARD_SLACK_PER_EXTRA_SAMPLE_S, VerifyCall
from rewardd.workers.packing import TASKS_PER_SLOT, Pack, Part, pack_target, plan
from rewardd.workers.tasks import verify_group_task, verify_groups_task


def call(verifier: str, n: int, timeout_s: float = 1.0, tag: str = "",
         **params: Any) -> VerifyCall:
    return VerifyCall(verifier, tuple(Sample(f"{tag}{i}") for i in range(n)),
                      {"answer": tag}, params, timeout_s)


def layout(packs: list[Pack]) -> list[list[tuple[int, int, int]]]:
    """Each task as (call index, offset, samples) per part."""
    return [[(p.call_index, p.offset, len(p.call.samples)) for p in pack.parts]
            for pack in packs]


def test_without_targets_each_call_is_one_task_and_big_ones_are_split() -> None:
    calls = [call("math", 3), call("math", 10), call("math", 0)]
    packs = plan(calls, lambda timeout_s: 4, {})
    assert layout(packs) == [[(0, 0, 3)], [(1, 0, 4)], [(1, 4, 4)], [(1, 8, 2)], [(2, 0, 0)]]


def test_small_groups_of_one_verifier_are_packed_up_to_the_target() -> None:
    calls = [call("math", 4, tag=str(i)) for i in range(5)]
    packs = plan(calls, lambda timeout_s: 64, {"math": 8})
    assert layout(packs) == [[(0, 0, 4), (1, 0, 4)], [(2, 0, 4), (3, 0, 4)], [(4, 0, 4)]]
    # a pack's samples are its parts' samples, in order, each group with its own reference
    verifier, groups, params, timeout_s = packs[0].task_args()
    assert verifier == "math" and params == {} and timeout_s == 1.0
    assert [[s["completion"] for s in samples] for samples, _ in groups] == [
        ["00", "01", "02", "03"], ["10", "11", "12", "13"]]
    assert [reference for _, reference in groups] == [{"answer": "0"}, {"answer": "1"}]
    assert [s.completion for s in packs[0].samples] == ["00", "01", "02", "03",
                                                        "10", "11", "12", "13"]


def test_packs_never_mix_verifiers_params_or_limits() -> None:
    calls = [call("math", 2), call("regex", 2), call("math", 2, timeout_s=2.0),
             call("math", 2, pattern="x"), call("math", 2), call("regex", 2)]
    packs = plan(calls, lambda timeout_s: 64, {"math": 100, "regex": 100})
    for pack in packs:
        first = pack.parts[0].call
        assert all((p.call.verifier, p.call.timeout_s, p.call.params)
                   == (first.verifier, first.timeout_s, first.params) for p in pack.parts)
    assert sorted(layout(packs)) == sorted([[(0, 0, 2), (4, 0, 2)], [(1, 0, 2), (5, 0, 2)],
                                            [(2, 0, 2)], [(3, 0, 2)]])


def test_a_pack_never_exceeds_the_task_bound_and_the_rest_of_a_split_group_is_packed() -> None:
    calls = [call("math", 5), call("math", 3), call("math", 3)]
    packs = plan(calls, lambda timeout_s: 4, {"math": 10})
    assert layout(packs) == [[(0, 0, 4)], [(0, 4, 1), (1, 0, 3)], [(2, 0, 3)]]
    assert all(len(pack.samples) <= 4 for pack in packs)


def test_every_sample_is_planned_exactly_once() -> None:
    calls = [call("math", n, tag=f"{i}-") for i, n in enumerate([1, 7, 0, 16, 3, 2, 9])]
    for bound in (1, 2, 5, 64):
        for target in (0, 2, 6, 64):
            packs = plan(calls, lambda timeout_s, b=bound: b, {"math": target})
            seen = [(p.call_index, p.offset + k) for pack in packs for p in pack.parts
                    for k in range(len(p.call.samples))]
            assert sorted(seen) == [(ci, k) for ci, c in enumerate(calls)
                                    for k in range(len(c.samples))]
            assert all(len(pack.samples) <= bound for pack in packs)


def test_group_level_calls_get_a_task_each_whatever_their_size() -> None:
    """Judge groups are never split (an arena ranks the group as a whole) and never packed
    (a failed pack could only be replayed by asking the judge again for every group)."""
    calls = [call("rubric", 3, tag="a"), call("rubric", 20, tag="b"), call("rubric", 2),
             call("math", 2), call("math", 2)]
    packs = plan(calls, lambda timeout_s: 8, {"rubric": 64, "math": 64})
    assert layout(packs) == [[(0, 0, 3)], [(1, 0, 20)], [(2, 0, 2)], [(3, 0, 2), (4, 0, 2)]]


def test_a_group_level_call_may_have_its_timeout_fitted_to_one_task() -> None:
    calls = [call("arena", 16, timeout_s=60.0), call("math", 16, timeout_s=60.0)]
    packs = plan(calls, lambda timeout_s: 64, {},
                 lambda samples, timeout_s: min(timeout_s, 800.0 / samples))
    assert packs[0].parts[0].call.timeout_s == 50.0 and packs[0].timeout_s == 50.0
    assert packs[1].parts[0].call.timeout_s == 60.0  # only group-level calls are fitted


def test_pack_target_aims_at_a_few_tasks_per_worker_slot() -> None:
    assert TASKS_PER_SLOT == 4
    assert pack_target(512, 2, 64) == 64        # 512 / (4 x 2)
    assert pack_target(512, 8, 64) == 16        # a group of 16 per task: no packing
    assert pack_target(512, 1, 48) == 48        # the task bound caps it
    assert pack_target(512, None, 64) == 0      # fleet unknown: do not pack
    assert pack_target(512, 0, 64) == 0


def test_one_sample_of_a_pack_keeps_its_call_and_position() -> None:
    calls = [call("math", 3, tag="a"), call("math", 2, tag="b")]
    [pack] = plan(calls, lambda timeout_s: 64, {"math": 5})
    single = pack.one(4)
    assert layout([single]) == [[(1, 1, 1)]]
    assert single.samples[0].completion == "b1"
    assert single.parts[0].call.reference == {"answer": "b"}
    with pytest.raises(IndexError):
        pack.one(5)


def test_a_pack_gets_the_hard_limit_of_its_sample_count() -> None:
    calls = [call("math", 3, timeout_s=0.5), call("math", 2, timeout_s=0.5)]
    [pack] = plan(calls, lambda timeout_s: 64, {"math": 5})
    assert pack.hard_limit_s() == pytest.approx(
        5 * 0.5 + HARD_MARGIN_S + 4 * HARD_SLACK_PER_EXTRA_SAMPLE_S)
    assert pack.hard_limit_s() == VerifyCall("math", pack.samples, {}, {}, 0.5).hard_limit_s()


def test_the_packed_task_checks_each_group_against_its_own_reference() -> None:
    groups = [([{"completion": "\\boxed{2}"}, {"completion": "\\boxed{3}"}], {"answer": "2"}),
              ([{"completion": "\\boxed{3}"}], {"answer": "3"})]
    packed = verify_groups_task("math", groups, {}, 5.0)
    alone = [item for samples, reference in groups
             for item in verify_group_task("math", samples, reference, {}, 5.0)]
    assert [item["outcome"] for item in packed] == [item["outcome"] for item in alone]
    assert [item["outcome"]["reward"] for item in packed] == [1.0, 0.0, 1.0]
