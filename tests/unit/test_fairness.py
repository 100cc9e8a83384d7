"""The fair queue of verifier calls (``workers/fairness.py``): start-time fair queuing per
request. Pure data structure: every expected order below is worked out by hand from the tags
(``S = max(V, F_flow)``, ``F_flow = S + cost``, smallest ``S`` first, ties by arrival)."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading

import pytest

from rewardd.workers.fairness import (DEFAULT_FLOW, FairQueue, Flow, QueueClosed, Ticket,
                                      current_flow, flow)

A, B, C = Flow("a", "t1"), Flow("b", "t2"), Flow("c", "t2")


def names(tickets: list[Ticket[str]]) -> list[str]:
    return [t.item for t in tickets]


def drain(queue: FairQueue[str], running: list[Ticket[str]]) -> list[str]:
    """Release the oldest running call until nothing is left: the dispatch order."""
    order = names(running)
    while running:
        admitted = queue.release(running.pop(0))
        running.extend(admitted)
        order.extend(names(admitted))
    return order


def test_a_late_small_flow_starts_before_the_backlogs_remainder() -> None:
    queue: FairQueue[str] = FairQueue(capacity=2)
    running: list[Ticket[str]] = []
    for i in range(40):
        running.extend(queue.submit(A, 1, f"a{i}")[1])
    assert names(running) == ["a0", "a1"]  # V = 1 (a1's start tag)
    for i in range(2):
        running.extend(queue.submit(B, 1, f"b{i}")[1])
    order = drain(queue, running)
    # b0: S = max(V=1, 0) = 1 < a2's S = 2; b1: S = 2 ties with a2 (a2 arrived first)
    assert order[:6] == ["a0", "a1", "b0", "a2", "b1", "a3"]
    assert len(order) == 42 and queue.stats() == {"waiting_calls": 0, "waiting_flows": 0,
                                                  "running_calls": 0, "in_use": 0, "capacity": 2}


def test_cost_is_samples_a_big_call_buys_its_flow_a_long_turn() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c-first")[1])  # runs; V = 0, F_c = 1
    for i in range(3):
        queue.submit(A, 64, f"a{i}")  # S = 0, 64, 128
    for i in range(4):
        queue.submit(B, 16, f"b{i}")  # S = 0, 16, 32, 48
    # a0 (S 0, arrived before b0), b0 (0), b1 (16), b2 (32), b3 (48), a1 (64), a2 (128)
    assert drain(queue, running) == ["c-first", "a0", "b0", "b1", "b2", "b3", "a1", "a2"]


def test_ties_go_to_the_earlier_arrival() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])
    queue.submit(B, 1, "b0")
    queue.submit(A, 1, "a0")
    queue.submit(B, 1, "b1")
    queue.submit(A, 1, "a1")
    assert drain(queue, running) == ["c", "b0", "a0", "b1", "a1"]


def test_unbounded_capacity_runs_everything_at_once() -> None:
    queue: FairQueue[str] = FairQueue(capacity=0)
    started = [name for i in range(5) for name in names(queue.submit(A, 3, f"a{i}")[1])]
    assert started == ["a0", "a1", "a2", "a3", "a4"]
    assert queue.stats()["running_calls"] == 5 and queue.waiting == 0


def test_running_calls_still_charge_their_flow_and_a_finished_flow_is_forgotten() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    a0 = queue.submit(A, 10, "a0")[0]  # runs: S 0, F_a 10
    queue.submit(A, 1, "a1")  # S 10
    queue.submit(B, 1, "b0")  # S max(V 0, 0) = 0: ahead of a1, which arrived first
    b0 = queue.release(a0)[0]
    assert b0.item == "b0"
    [a1] = queue.release(b0)
    queue.release(a1)
    assert queue._finish == {} and queue._active == {}  # no state of finished requests


def test_cancel_drops_a_waiting_call_and_the_next_of_its_flow_takes_its_place() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])
    a0 = queue.submit(A, 1, "a0")[0]
    queue.submit(A, 1, "a1")
    b0 = queue.submit(B, 1, "b0")[0]
    assert queue.cancel(a0) and not queue.cancel(a0)  # twice: the second finds nothing
    assert queue.stats()["waiting_calls"] == 2
    assert queue.cancel(b0)
    assert drain(queue, running) == ["c", "a1"]
    assert queue.stats() == {"waiting_calls": 0, "waiting_flows": 0, "running_calls": 0,
                             "in_use": 0, "capacity": 1}


def test_cancel_of_a_running_call_is_refused_and_release_frees_it_once() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    a0 = queue.submit(A, 1, "a0")[0]
    a1 = queue.submit(A, 1, "a1")[0]
    assert not queue.cancel(a0)  # running: the backend's to stop and release
    assert names(queue.release(a0)) == ["a1"]
    assert queue.release(a0) == [] and queue.running == 1  # a second release frees nothing
    assert queue.release(a1) == [] and queue.running == 0


def test_close_hands_back_the_waiting_calls_and_refuses_new_ones() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    a0 = queue.submit(A, 1, "a0")[0]
    queue.submit(A, 1, "a1")
    queue.submit(B, 1, "b0")
    assert sorted(names(queue.close())) == ["a1", "b0"]
    assert queue.release(a0) == []  # nothing is admitted after close
    with pytest.raises(QueueClosed):
        queue.submit(A, 1, "a2")
    assert queue.stats()["waiting_calls"] == 0 and queue.running == 0


def test_set_capacity_admits_the_waiting_calls_in_fair_order() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    queue.submit(A, 1, "a0")
    for i in range(1, 4):
        queue.submit(A, 1, f"a{i}")
    queue.submit(B, 1, "b0")
    assert names(queue.set_capacity(3)) == ["b0", "a1"]  # b0: S 0 < a1's S 1
    with pytest.raises(ValueError):
        queue.set_capacity(-1)


def test_by_cost_the_capacity_counts_samples_in_order_and_a_big_call_runs_alone() -> None:
    queue: FairQueue[str] = FairQueue(capacity=100, by_cost=True)
    D, E = Flow("d"), Flow("e")
    a0 = queue.submit(A, 60, "a0")[1][0]  # S 0: in use 60
    assert names(queue.submit(A, 60, "a1")[1]) == []  # S 60: 120 > 100
    b0 = queue.submit(B, 30, "b0")[1][0]  # S 0, fits: 90
    assert names(queue.submit(C, 20, "c0")[1]) == []  # S 0, the head: 110 > 100
    assert names(queue.submit(D, 5, "d0")[1]) == []  # would fit (95), never skips c0
    assert queue.stats()["in_use"] == 90
    c0, d0 = queue.release(b0)  # 60 + 20 + 5 = 85; a1 (S 60) would make 145
    assert (c0.item, d0.item) == ("c0", "d0")
    [a1] = queue.release(a0)  # 25 + 60 = 85
    assert a1.item == "a1"
    assert names(queue.submit(E, 500, "e0")[1]) == []  # S 60, more than the capacity
    assert queue.release(c0) == [] and queue.release(d0) == []
    assert names(queue.release(a1)) == ["e0"]  # alone, once nothing else runs
    assert queue.stats()["in_use"] == 500


def test_release_from_many_threads_keeps_the_count_whole() -> None:
    """Workers finish in several threads at once: every call runs exactly once, never more
    than ``capacity`` at a time, and the queue ends empty."""
    queue: FairQueue[int] = FairQueue(capacity=4)
    started: list[int] = []
    peak = [0]
    lock = threading.Lock()
    runnable: list[Ticket[int]] = []
    cond = threading.Condition(lock)

    def start(tickets: list[Ticket[int]]) -> None:
        with cond:
            started.extend(t.item for t in tickets)
            runnable.extend(tickets)
            peak[0] = max(peak[0], queue.running)
            cond.notify_all()

    def worker() -> None:
        while True:
            with cond:
                while not runnable and len(started) < 2000:
                    cond.wait(0.01)
                if not runnable:
                    return
                ticket = runnable.pop(random.randrange(len(runnable)))
            start(queue.release(ticket))

    flows = [Flow(f"f{i}") for i in range(8)]
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for i in range(2000):
        start(queue.submit(flows[i % 8], 1 + i % 5, i)[1])
    for thread in threads:
        thread.join(60)
    assert sorted(started) == list(range(2000))
    assert peak[0] <= 4
    assert queue.stats() == {"waiting_calls": 0, "waiting_flows": 0, "running_calls": 0,
                             "in_use": 0, "capacity": 4}


def test_the_flow_is_a_context_variable_inherited_by_tasks() -> None:
    assert current_flow() is DEFAULT_FLOW

    async def main() -> tuple[Flow, Flow]:
        with flow("t1", "req-1") as mine:
            seen = await asyncio.create_task(_current())
        return mine, seen

    async def _current() -> Flow:
        return current_flow()

    mine, seen = contextvars.copy_context().run(asyncio.run, main())
    assert seen == mine == Flow("req-1", "t1")
    assert current_flow() is DEFAULT_FLOW
    with flow("t2") as one, flow("t2") as other:
        assert one.id != other.id and current_flow() is other


def test_urgent_calls_go_first_within_their_flow_never_before_another_flows_turn() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])  # V 0
    for i in range(3):
        queue.submit(A, 1, f"a{i}")  # A waits from S 0
    for i in range(2):
        queue.submit(B, 1, f"b{i}")  # B waits from S 0
    queue.submit(Flow("a", "t1", urgent=True, group="g"), 1, "a-urgent")  # A's head, S 0
    # S 0: b0 (arrived before a-urgent), a-urgent; S 1: a0 (arrived before b1), b1; then A
    assert drain(queue, running) == ["c", "b0", "a-urgent", "a0", "b1", "a1", "a2"]


def test_an_urgent_call_is_charged_to_its_flow_like_any_other() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])
    urgent = Flow("a", "t1", urgent=True, group="g")
    for i in range(3):
        queue.submit(urgent, 1, f"u{i}")  # S 0, 1, 2
        queue.submit(B, 1, f"b{i}")  # S 0, 1, 2: urgency buys A no share of B's
    assert drain(queue, running) == ["c", "u0", "b0", "u1", "b1", "u2", "b2"]


def test_an_urgent_call_of_a_group_takes_the_groups_waiting_calls_with_it() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])
    tickets = {name: queue.submit(Flow("a", "t1", group=group), 1, name)[0]
               for name, group in (("x1", "g1"), ("y1", "g2"), ("x2", "g1"), ("y2", "g2"),
                                   ("z1", "g3"), ("y3", "g2"), ("n1", None))}
    queue.submit(Flow("a", "t1", urgent=True, group="g2"), 1, "y-last")
    assert queue.cancel(tickets["y3"])  # a promoted call can still be dropped
    assert queue.stats()["waiting_calls"] == 7
    # g2's calls in arrival order, then its urgent one, then the others as they came
    assert drain(queue, running) == ["c", "y1", "y2", "y-last", "x1", "x2", "z1", "n1"]
    assert queue._finish == {} and queue._active == {} and queue.stats()["waiting_flows"] == 0


def test_promotion_stays_within_the_flow() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])
    queue.submit(Flow("b", "t2", group="g"), 1, "b-g")  # another flow's group of that name
    queue.submit(Flow("a", "t1", group="h"), 1, "a-h")
    queue.submit(Flow("a", "t1", group="g"), 1, "a-g")
    queue.submit(Flow("a", "t1", urgent=True, group="g"), 1, "a-last")
    # B's call keeps its turn (S 0, first to arrive); A: a-g, a-last before a-h
    assert drain(queue, running) == ["c", "b-g", "a-g", "a-last", "a-h"]


def test_floor_calls_run_whatever_their_units_then_the_capacity_binds() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1.0, floor=2)
    big0 = queue.submit(A, 16, "big0", units=5.0)[1][0]  # alone over the capacity: runs
    big1 = queue.submit(A, 16, "big1", units=5.0)[1][0]  # the floor's second call: runs
    assert names(queue.submit(A, 16, "big2", units=5.0)[1]) == []  # S 32
    small0 = queue.submit(B, 1, "small0", units=0.25)[0]  # S 16: the head, waits
    small1 = queue.submit(B, 1, "small1", units=0.25)[0]  # S 17
    assert queue.stats()["in_use"] == 10.0 and small0.state == "waiting"
    # one call under the floor again: the head goes, whatever the units in use (5.25)
    assert names(queue.release(big0)) == ["small0"]
    # under the floor: small1 goes; then big2 would make 5.5 > 1 with two running
    assert names(queue.release(big1)) == ["small1"]
    [c] = queue.submit(C, 1, "c", units=0.1)[1]  # S 17 < big2's 32, and fits: 0.6
    assert c.item == "c" and queue.release(c) == []  # big2 still does not fit (5.5)
    [big2] = queue.release(small0)  # under the floor
    assert big2.item == "big2" and queue.stats()["in_use"] == 5.25
    assert queue.release(small1) == [] and queue.release(big2) == []
    assert queue.stats() == {"waiting_calls": 0, "waiting_flows": 0, "running_calls": 0,
                             "in_use": 0, "capacity": 1.0}


def test_urgent_and_group_ride_with_the_flow_and_keep_its_id() -> None:
    with flow("t1", "sess-1", urgent=True, group="q7") as mine:
        assert current_flow() == mine == Flow("sess-1", "t1", urgent=True, group="q7")
    with flow("t1", "sess-1") as plain:
        assert plain == Flow("sess-1", "t1") and not plain.urgent and plain.group is None


def test_an_urgent_call_without_a_group_waits_as_any_other() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1)
    running = list(queue.submit(C, 1, "c")[1])
    queue.submit(Flow("a", "t1", group="g"), 1, "a-g")
    queue.submit(Flow("a", "t1", urgent=True), 1, "a-urgent")  # its group's calls unknown
    assert drain(queue, running) == ["c", "a-g", "a-urgent"]
