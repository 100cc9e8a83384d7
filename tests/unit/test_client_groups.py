"""rewardd_client._groups: groups rebuilt from a trainer's flat lists as runs of equal keys."""

from __future__ import annotations

from rewardd_client._groups import runs_of_equal


def test_runs_of_equal_splits_at_every_change_of_key() -> None:
    assert runs_of_equal(["a", "a", "b", "b", "b", "c"]) == [range(0, 2), range(2, 5),
                                                            range(5, 6)]


def test_runs_of_equal_of_nothing_is_no_run() -> None:
    assert runs_of_equal([]) == []


def test_runs_of_equal_of_one_key_is_one_run() -> None:
    assert runs_of_equal(["p"]) == [range(0, 1)]


def test_group_split_across_two_processes_gives_4_2_then_2_4() -> None:
    # G = 4, per-device batch 6: TRL hands process 0 prompts p0 x4, p1 x2 and process 1 the
    # other two of p1 and p2 x4.
    rank0 = ["p0"] * 4 + ["p1"] * 2
    rank1 = ["p1"] * 2 + ["p2"] * 4
    assert [len(r) for r in runs_of_equal(rank0)] == [4, 2]
    assert [len(r) for r in runs_of_equal(rank1)] == [2, 4]


def test_equal_keys_that_are_not_adjacent_stay_separate_runs() -> None:
    assert runs_of_equal(["a", "b", "a"]) == [range(0, 1), range(1, 2), range(2, 3)]


def test_unhashable_chat_prompts_compare_by_value() -> None:
    chat = [{"role": "user", "content": "2+2?"}]
    other = [{"role": "user", "content": "3+3?"}]
    keys = [chat, [dict(m) for m in chat], other]
    assert runs_of_equal(keys) == [range(0, 2), range(2, 3)]


def test_runs_cover_every_index_once_in_order() -> None:
    keys = [1, 1, 2, 3, 3, 3, 1, 1]
    runs = runs_of_equal(keys)
    assert [i for run in runs for i in run] == list(range(len(keys)))
    assert all(len({keys[i] for i in run}) == 1 for run in runs)
