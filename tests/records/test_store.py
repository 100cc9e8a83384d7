"""The record's store (service/records/store.py) on SQLite and on a real PostgreSQL: the
migrations build exactly the declared schema, what is written reads back the same, filters
and pages, tenants never see each other's runs, retention."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from rewardd.service.records import migrate
from rewardd.service.records.models import Retention, RolloutQuery
from rewardd.service.records.schema import metadata
from rewardd.service.records.store import RecordStore, UnsupportedDatabase, database_url
from tests.records.records import rollout


def test_the_migrations_build_exactly_the_declared_schema_and_run_once(
        store: RecordStore, record_url: str) -> None:
    with store.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), metadata) == []
    assert migrate.current(store.engine) == migrate.head()
    again = RecordStore.open(record_url)  # a second start: nothing to do
    assert migrate.current(again.engine) == migrate.head()
    again.close()


def test_pods_starting_together_migrate_once(record_url: str) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            RecordStore.open(record_url).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_what_is_written_reads_back_the_same_and_the_run_counts_it(store: RecordStore) -> None:
    written = [rollout(step=s, index=i, at=1000.0 + 10 * s + i, math_ok=i != 1)
               for s in (3, 1) for i in range(3)]
    store.write(written)
    page = store.rollouts("acme", "run-1", RolloutQuery())
    assert [item.record for item in page.items] == written
    assert page.next_cursor is None
    [run] = store.runs("acme")
    assert (run.run_id, run.rollouts, run.last_step) == ("run-1", 6, 3)
    assert (run.first_at, run.last_at) == (1010.0, 1032.0)
    store.write([rollout(step=2, index=9, at=900.0)])  # late, earlier step: counters hold
    run = store.run("acme", "run-1")
    assert run is not None and (run.rollouts, run.last_step, run.first_at) == (7, 3, 900.0)
    assert store.run("acme", "nope") is None


def test_rollouts_filter_and_page(store: RecordStore) -> None:
    store.write([rollout(step=i % 3, index=i, math_ok=i % 4 != 0,
                         source="gsm8k" if i % 2 else "math",
                         completion=f"answer {i}% _done_" if i != 5 else None)
                 for i in range(24)])

    def ids(**filters: object) -> list[str]:
        return [item.record.rollout_id
                for item in store.rollouts("acme", "run-1", RolloutQuery(**filters)).items]

    assert ids(step=1) == [f"r{i}" for i in range(24) if i % 3 == 1]
    assert ids(source="math") == [f"r{i}" for i in range(0, 24, 2)]
    assert ids(outcome="failed") == [f"r{i}" for i in range(0, 24, 4)]
    assert ids(outcome="ok") == [f"r{i}" for i in range(24) if i % 4]
    assert ids(outcome="timeout") == ids(component="math", outcome="failed") == ids(
        outcome="failed")
    assert ids(component="format", outcome="failed") == []
    assert ids(component="format") == [f"r{i}" for i in range(24)]
    assert ids(component="judge") == []
    assert ids(text="answer 1") == ["r1"] + [f"r{i}" for i in range(10, 20)]
    assert ids(text="answer 1%") == ["r1"]  # % and _ are matched as themselves
    assert ids(text="answer 1_") == []  # unescaped, "_" would match r10..r19
    assert ids(text="answer 5") == []  # recorded without its completion
    assert ids(step=0, source="math", outcome="failed") == ["r0", "r12"]
    seen, cursor = [], None
    while True:
        page = store.rollouts("acme", "run-1", RolloutQuery(limit=5, after=cursor))
        seen += [item.record.rollout_id for item in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [f"r{i}" for i in range(24)]


def test_a_tenant_sees_only_its_own_runs(store: RecordStore) -> None:
    store.write([rollout(tenant="acme", run="shared-name"), rollout(tenant="beta", run="b")])
    store.write([rollout(tenant="beta", run="shared-name", index=1)])
    assert [r.run_id for r in store.runs("acme")] == ["shared-name"]
    assert sorted(r.run_id for r in store.runs("beta")) == ["b", "shared-name"]
    [acme] = store.rollouts("acme", "shared-name", RolloutQuery()).items
    [beta] = store.rollouts("beta", "shared-name", RolloutQuery()).items
    assert (acme.record.tenant, beta.record.rollout_id) == ("acme", "r1")
    assert store.rollouts("acme", "b", RolloutQuery()).items == ()
    assert sorted(store.tenants()) == ["acme", "beta"]


def test_retention_by_age_and_by_count_per_tenant(store: RecordStore) -> None:
    store.write([rollout(run="old", index=i, at=100.0 + i) for i in range(4)]
                + [rollout(run="new", index=i, at=5000.0 + i) for i in range(6)]
                + [rollout(tenant="beta", run="old", index=i, at=100.0) for i in range(3)])
    assert store.prune("acme", Retention(max_age_s=1000.0), now=5500.0) == 4
    assert [r.run_id for r in store.runs("acme")] == ["new"]
    assert store.prune("acme", Retention(max_rollouts=4)) == 2
    run = store.run("acme", "new")
    assert run is not None and run.rollouts == 4
    assert [i.record.rollout_id for i in store.rollouts("acme", "new", RolloutQuery()).items] \
        == ["r2", "r3", "r4", "r5"]
    assert store.prune("acme", Retention()) == 0
    beta = store.run("beta", "old")
    assert beta is not None and beta.rollouts == 3  # another tenant's record is its own
    with store.engine.connect() as connection:  # verdicts went with their rollouts
        from sqlalchemy import func, select

        from rewardd.service.records.schema import verdicts
        assert connection.execute(select(func.count()).select_from(verdicts)).scalar() == 14


def test_a_database_url_is_checked_before_anything_starts() -> None:
    assert database_url("postgresql://u@h:5432/d").drivername == "postgresql+psycopg"
    assert database_url("postgres://u@h/d").drivername == "postgresql+psycopg"
    with pytest.raises(UnsupportedDatabase, match="use postgresql://user@host:port/database"):
        database_url("mysql://root@localhost/x")


def test_step_summaries_count_rollouts_failures_and_reward_spread(store: RecordStore) -> None:
    store.write([rollout(step=1, index=i, math_ok=i != 0, source="gsm8k" if i < 3 else "math",
                         num_tokens=[10, 20, None, 30][i], zero_advantage=[True, False, None,
                                                                             False][i])
                 for i in range(4)] + [rollout(step=2, index=i) for i in range(2)]
                + [rollout(step=None, index=7, num_tokens=None, zero_advantage=None)])
    steps = store.steps("acme", "run-1")
    assert [s.step for s in steps] == [2, 1, None]
    one = steps[1]
    assert (one.rollouts, one.failed_rollouts, one.sources) == (4, 1, {"gsm8k": 3, "math": 1})
    assert one.components["math"].rollouts == 4
    assert one.components["math"].mean == 1.0 and one.components["math"].std == 0.0
    assert one.components["math"].failures == {"timeout": 1}
    assert one.components["format"].mean == 0.5 and one.components["format"].failures == {}
    assert one.mean_length == 20.0 and one.zero_advantage_fraction == pytest.approx(1 / 3)
    assert (steps[2].mean_length, steps[2].zero_advantage_fraction) == (None, None)
    assert [s.step for s in store.steps("acme", "run-1", last=1)] == [2]
    assert store.steps("acme", "nope") == []


def test_group_inputs_are_kept_once_read_back_for_replay_and_pruned_with_their_rollouts(
        store: RecordStore) -> None:
    from dataclasses import replace

    from sqlalchemy import func, select

    from rewardd.service.records.models import ComponentInput, GroupInputs
    from rewardd.service.records.schema import inputs

    shared = GroupInputs("d" * 32, "What is 2+2?", {"answer": "4"},
                         (ComponentInput("math", "math", {"mode": "strict"}, 5.0),), True)
    other = replace(shared, digest="e" * 32, reference={"answer": "5"})
    store.write([replace(rollout(index=i, at=100.0 + i), inputs=shared) for i in range(3)]
                + [replace(rollout(index=3, at=5000.0), inputs=other),
                   rollout(index=4, at=5000.0, completion=None)])
    store.write([replace(rollout(index=5, at=5001.0), inputs=shared)])  # a second batch

    def stored_inputs() -> int:
        with store.engine.connect() as connection:
            return connection.execute(select(func.count()).select_from(inputs)).scalar()

    assert stored_inputs() == 2  # one row per distinct content, however many rollouts
    assert store.replay_counts("acme", "run-1") == (6, 5)  # r4 has neither
    replayable = store.replayable("acme", "run-1", limit=10)
    assert [s.record.rollout_id for s in replayable] == ["r0", "r1", "r2", "r3", "r5"]
    assert replayable[0].record.inputs == shared and replayable[3].record.inputs == other
    assert [s.record.rollout_id for s in store.replayable("acme", "run-1", after=replayable[1].id,
                                                          limit=2)] == ["r2", "r3"]
    assert store.replay_counts("acme", "run-1", (1, 3)) == (0, 0)
    assert store.replayable("beta", "run-1") == []  # another tenant's record is its own
    store.prune("acme", Retention(max_age_s=1000.0), now=5500.0)  # r0-r2 go; r5 keeps shared
    assert stored_inputs() == 2
    store.prune("acme", Retention(max_rollouts=1))  # only r5 stays: `other` goes
    assert stored_inputs() == 1
