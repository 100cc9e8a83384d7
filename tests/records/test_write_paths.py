"""The record's fast write paths (service/records/store.py: COPY on PostgreSQL, one
executemany with ids numbered from the first row's on SQLite) store exactly what the plain
SQLAlchemy statements store (``RecordStore.write_statements``), read back through every query;
the writer thread's rows (recorder.batch_rows) are the records' rows; two processes writing
one SQLite file keep every verdict on its own rollout."""

from __future__ import annotations

import itertools
import math
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from rewardd.service.models import ScoreRequest
from rewardd.service.records.models import (ComponentInput, GroupInputs, Retention,
                                            RolloutQuery, RolloutRecord, Verdict)
from rewardd.service.records.recorder import batch_rows, sampled
from rewardd.service.records.schema import inputs, rollouts, verdicts
from rewardd.service.records.store import RecordStore, rollout_row
from rewardd.service.settings import Settings
from rewardd.verifiers.receipts import digest
from tests.records.records import rollout


def varied(run: str) -> list[RolloutRecord]:
    """Rollouts with every optional field both set and not, failures of several kinds, a
    component without a reward, group inputs kept by some, and an integer beyond 64 bits."""
    kept = GroupInputs.from_document("d" * 32, {"prompt": "p", "reference": {"answer": "4"},
                                                "components": [], "evaluation": False})
    out = []
    for i in range(40):
        base = rollout(run=run, step=(None if i % 11 == 0 else i // 8), index=i,
                       source=None if i % 7 == 0 else ("gsm8k" if i % 2 else "math"),
                       math_ok=i % 5 != 0, at=1000.0 + i * 0.5,
                       completion=None if i % 6 == 0 else f"answer {i} é\t\\n\"q\"",
                       num_tokens=None if i % 9 == 0 else i,
                       zero_advantage=(None, True, False)[i % 3])
        extra = Verdict("judge", None if i % 4 else 0.25,
                        "ok" if i % 4 else "unavailable",
                        {"ok": bool(i % 4), "error": None if i % 4 else "unavailable",
                         "detail": {"big": 2 ** 70, "nested": [1, {"x": None}], "f": 1 / 3}})
        out.append(RolloutRecord(
            base.tenant, base.run_id, base.group_id, base.rollout_id,
            base.verdicts + ((extra,) if i % 3 else ()), base.recorded_at, base.step,
            base.source, None if i % 10 == 0 else {"reward": i / 7, "excluded": i % 2 == 0},
            base.completion, base.num_tokens, base.zero_advantage,
            kept if base.completion is not None and i % 2 else None))
    return out


def read_back(store: RecordStore, run: str) -> dict[str, Any]:
    """Everything the store's queries answer about ``run``, ids left out."""
    def page(**filters: Any) -> list[RolloutRecord]:
        return [item.record for item in store.rollouts(
            "acme", run, RolloutQuery(limit=1000, **filters)).items]

    def unrun(records: list[RolloutRecord]) -> list[tuple]:
        return [(r.rollout_id, r.group_id, r.step, r.source, r.recorded_at, r.summary,
                 r.completion, r.num_tokens, r.zero_advantage, r.verdicts) for r in records]

    summary = store.run("acme", run)
    return {
        "all": unrun(page()),
        "filters": [unrun(page(**f)) for f in (
            {"step": 1}, {"source": "math"}, {"outcome": "failed"}, {"outcome": "ok"},
            {"outcome": "timeout"}, {"component": "math", "outcome": "failed"},
            {"component": "judge"}, {"component": "judge", "outcome": "unavailable"},
            {"text": "answer 1"}, {"step": 2, "source": "gsm8k", "outcome": "failed"})],
        "steps": store.steps("acme", run),
        "run": (summary.first_at, summary.last_at, summary.last_step, summary.rollouts),
        "replay": (store.replay_counts("acme", run),
                   unrun([s.record for s in store.replayable("acme", run)]),
                   [s.record.inputs for s in store.replayable("acme", run)]),
    }


def test_the_fast_write_stores_what_the_plain_statements_store(store: RecordStore) -> None:
    fast, plain = varied("fast"), varied("plain")
    for start in range(0, 40, 16):  # several transactions, the run upserted by each
        store.write(fast[start:start + 16])
        store.write_statements(plain[start:start + 16])
    assert read_back(store, "fast") == read_back(store, "plain")
    judge = read_back(store, "fast")["all"][1][-1][1]
    assert (judge.component, judge.status["detail"]["nested"]) == ("judge", [1, {"x": None}])
    with store.engine.connect() as connection:  # the tables' rows themselves, ids aside
        def rows(run: str) -> list[tuple]:
            got = connection.execute(select(rollouts).where(rollouts.c.run_id == run)
                                     .order_by(rollouts.c.id)).all()
            return [tuple(v for k, v in row._mapping.items() if k not in ("id", "run_id"))
                    for row in got]

        def verdict_rows(run: str) -> list[tuple]:
            return [tuple(row) for row in connection.execute(
                select(rollouts.c.rollout_id, verdicts.c.component, verdicts.c.reward,
                       verdicts.c.outcome)
                .join(rollouts, rollouts.c.id == verdicts.c.rollout)
                .where(rollouts.c.run_id == run)
                .order_by(rollouts.c.id, verdicts.c.component))]

        assert rows("fast") == rows("plain")
        assert verdict_rows("fast") == verdict_rows("plain")
        assert len(verdict_rows("fast")) == 40 * 2 + 26
        assert connection.execute(select(func.count()).select_from(inputs)).scalar() == 1
    assert store.prune("acme", Retention(max_rollouts=20)) == 60  # the newest 20 stay
    fast_left = store.run("acme", "fast")
    assert fast_left is not None and fast_left.rollouts == 8


def test_ids_keep_ascending_across_writes_and_after_retention(store: RecordStore) -> None:
    store.write([rollout(index=i) for i in range(5)])
    store.prune("acme", Retention(max_rollouts=0))  # every row gone, the newest too
    store.write([rollout(index=i) for i in range(5, 9)])
    store.write_statements([rollout(index=9)])
    store.write([rollout(index=i) for i in range(10, 13)])
    items = store.rollouts("acme", "run-1", RolloutQuery()).items
    assert [item.record.rollout_id for item in items] == [f"r{i}" for i in range(5, 13)]
    ids = [item.id for item in items]
    assert ids == sorted(set(ids))


SCORED = {"run_id": "r", "step": 2,
          "rewards": [{"name": "math", "verifier": "math"}, {"name": "len", "verifier": "length"}],
          "groups": [{"group_id": f"g{g}", "prompt": f"p{g}", "source": "s" if g else None,
                      "data_source": "ds", "reference": {"answer": str(g)},
                      "rollouts": [{"rollout_id": f"{g}-{r}", "completion": f"c{g}{r}",
                                    "num_tokens": 3} for r in range(6)]}
                     for g in range(3)]}


def answered(advantages: list[Any]) -> dict[str, Any]:
    """A scoring answer to :data:`SCORED`: math right, wrong (reward 0) or failed."""
    groups = []
    for g in range(3):
        items = []
        for r in range(6):
            failed = r == 2
            math_entry = {"ok": not failed, "error": "timeout" if failed else None,
                          "detail": {"extracted": str(r)}, "receipt": {"verifier": "math"}}
            items.append({"rollout_id": f"{g}-{r}", "reward": 1.0 if r % 3 == 0 else 0.0,
                          "rewards": {"math": None if failed else float(r % 3 == 0),
                                      "len": 0.5},
                          "status": {"math": math_entry, "len": {"ok": True, "error": None}},
                          "advantages": advantages[r % len(advantages)], "num_tokens": 3,
                          "excluded": r == 5})
        groups.append({"group_id": f"g{g}", "rollouts": items})
    return {"run_id": "r", "groups": groups}


def expected(request: ScoreRequest, body: dict[str, Any], policy: str, now: float,
             components: tuple[ComponentInput, ...]) -> list[RolloutRecord]:
    """The records of ``body`` as the recorder's docs describe them, built the plain way."""
    out = []
    for group, answer in zip(request.groups, body["groups"]):
        document = GroupInputs("", group.prompt or "", group.reference or {}, components,
                               False).to_document()
        kept_inputs = GroupInputs.from_document(digest(document), document)
        for sent, item in zip(group.rollouts, answer["rollouts"]):
            verdicts_ = tuple(Verdict(name, item["rewards"].get(name),
                                      "ok" if entry["ok"] else entry["error"], entry)
                              for name, entry in item["status"].items())
            advantages = item["advantages"]
            summary = {"reward": item["reward"], "excluded": item["excluded"]}
            if isinstance(advantages, float):
                summary["advantage_mean"] = advantages
                zero = advantages == 0
            elif isinstance(advantages, dict):
                runs = advantages["rle"]
                summary["advantage_mean"] = (math.fsum(v * n for v, n in runs)
                                             / sum(n for _, n in runs))
                summary["advantages"] = [[float(v), n] for v, n in runs]
                zero = all(v == 0 for v, n in runs if n)
            else:
                summary["advantage_mean"] = math.fsum(advantages) / len(advantages)
                summary["advantages"] = [[v, sum(1 for _ in same)]  # the strip, run-length
                                         for v, same in itertools.groupby(advantages)]
                zero = all(v == 0 for v in advantages)
            record = RolloutRecord("acme", "r", group.group_id, sent.rollout_id, verdicts_, now,
                                   2, group.source or group.data_source, summary, None, 3, zero)
            keep = {"all": True, "none": False,
                    "failed": record.outcome != "ok" or any(v.reward == 0 for v in verdicts_),
                    "sample": sampled(("acme", "r", group.group_id, sent.rollout_id), 0.5)}
            if keep[policy]:
                record = RolloutRecord(*(getattr(record, f) for f in (
                    "tenant", "run_id", "group_id", "rollout_id", "verdicts", "recorded_at",
                    "step", "source", "summary")), sent.completion, 3, zero, kept_inputs)
            out.append(record)
    return out


@pytest.mark.parametrize("policy", ["all", "failed", "sample", "none"])
def test_the_writer_threads_rows_are_the_records_rows(policy: str) -> None:
    request = ScoreRequest.model_validate(SCORED)
    components = tuple(ComponentInput(s.name, s.verifier, s.params, s.timeout_s)
                       for s in request.rewards)
    settings = Settings(record_completions=policy, record_sample_rate=0.5)
    for advantages in ([0.5, 0.0], [{"rle": [[0.0, 2], [1.5, 1]]}, {"rle": [[0.0, 3]]}],
                       [[0.25, 0.0, -1.0], [0.0]]):
        body = answered(advantages)
        built = batch_rows("acme", "r", 2, request.groups, body, settings, 7.5, components)
        records = expected(request, body, policy, 7.5, components)
        assert built[0].batch is not None and all(row.batch is None for row in built[1:])
        built[0].batch = None  # the batch's step statistics (tests/unit/test_stepstats.py)
        assert built == [rollout_row(record) for record in records]
    kept = sum(row.values[11] is not None for row in built)
    assert kept == {"all": 18, "none": 0, "failed": 12}.get(policy, kept)
    assert 0 < kept < 18 or policy != "sample"


def _write_from_a_process(url: str, tenant: str, batches: int) -> None:
    store = RecordStore.open(url)
    for b in range(batches):
        batch = []
        for i in range(25):
            n = b * 25 + i
            record = rollout(run="shared", index=n, tenant=tenant, at=time.time())
            marked = tuple(Verdict(v.component, float(n), v.outcome, v.status)
                           for v in record.verdicts)  # a verdict on another rollout shows
            batch.append(RolloutRecord(record.tenant, record.run_id, record.group_id,
                                       record.rollout_id, marked, record.recorded_at,
                                       record.step, record.source, record.summary,
                                       record.completion, record.num_tokens,
                                       record.zero_advantage))
        store.write(batch)
    store.close()


def test_two_processes_writing_one_sqlite_file_keep_every_verdict_on_its_rollout(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    RecordStore.open(url).close()  # migrated once, before the writers race
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_from_a_process, args=(url, tenant, 40))
               for tenant in ("acme", "beta")]
    for process in writers:
        process.start()
    for process in writers:
        process.join(300)
        assert process.exitcode == 0
    store = RecordStore.open(url)
    with store.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(rollouts)).scalar() == 2000
        pairs = connection.execute(
            select(rollouts.c.tenant, rollouts.c.rollout_id, verdicts.c.component,
                   verdicts.c.reward)
            .join(verdicts, verdicts.c.rollout == rollouts.c.id)).all()
    assert len(pairs) == 4000
    assert all(reward == float(rollout_id[1:]) for _, rollout_id, _, reward in pairs)
    for tenant in ("acme", "beta"):
        page = store.rollouts(tenant, "shared", RolloutQuery(limit=1000))
        assert [item.record.rollout_id for item in page.items] == [f"r{i}" for i in range(1000)]
    store.close()


def test_per_token_advantages_are_kept_run_length_encoded_up_to_a_bound() -> None:
    """The inspector's strip: a rollout's advantages as runs, exact, while they are short;
    beyond MAX_KEPT_RUNS only their count."""
    from rewardd.service.records.recorder import MAX_KEPT_RUNS, _summary, run_lengths

    dense = [0.5, 0.5, 0.0, -1.25, -1.25, -1.25]
    assert run_lengths(dense) == [[0.5, 2], [0.0, 1], [-1.25, 3]]
    kept = _summary({"reward": 1.0, "advantages": dense})
    assert kept["advantages"] == [[0.5, 2], [0.0, 1], [-1.25, 3]]
    assert [v for v, n in kept["advantages"] for _ in range(int(n))] == dense
    long = [float(i % 2) for i in range(MAX_KEPT_RUNS + 1)]
    kept = _summary({"reward": 1.0, "advantages": long})
    assert "advantages" not in kept and kept["advantage_runs"] == MAX_KEPT_RUNS + 1
    assert "advantages" not in _summary({"reward": 1.0, "advantages": 0.5})  # scalar output
