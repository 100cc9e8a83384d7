"""``rewardd score`` (offline JSONL) in the run record: requests naming a run_id are recorded
into the record the server reads, written before the command returns, none dropped by the
queue's bounds; ``--no-record`` records nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from rewardd.service.batch import run_file
from rewardd.service.cli import main
from rewardd.service.records.models import RolloutQuery
from rewardd.service.records.store import RecordStore
from rewardd.service.settings import Settings, get_settings
from tests.records.test_runs_api import score_body


def write_jsonl(path: Path, bodies: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(body) + b"\n" for body in bodies))
    return path


def test_requests_naming_a_run_are_recorded_before_the_command_returns(
        record_url: str, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [
        score_body("offline", step=1, groups=1), score_body("offline", step=2, groups=1),
        score_body(run_id=None, groups=1)])
    # a queue of 4 rollouts, 1 per tenant: a server would drop these 3-rollout batches
    settings = Settings(database_url=record_url, pool_size=1, record_queue=4,
                        record_tenant_queue=1)
    summary = run_file(source, tmp_path / "out.jsonl", None, 64, settings, progress=False,
                       tenant="acme")
    assert summary["record"] == {"written": 6, "dropped": 0, "last_error": None}
    scored = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]

    store = RecordStore.open(record_url)  # another connection: what the server would read
    try:
        [run] = store.runs("acme")
        assert (run.run_id, run.rollouts, run.last_step) == ("offline", 6, 2)
        assert store.runs("default") == []
        page = store.rollouts("acme", "offline", RolloutQuery(step=2))
    finally:
        store.close()
    sent = scored[1]["groups"][0]["rollouts"]
    assert [item.record.rollout_id for item in page.items] == [r["rollout_id"] for r in sent]
    for item, answered in zip(page.items, sent):
        [verdict] = item.record.verdicts
        assert (verdict.reward, dict(verdict.status)) == (answered["rewards"]["math"],
                                                         answered["status"]["math"])
        assert item.record.completion is not None


def test_no_record_records_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [score_body("offline", groups=1)])
    # the environment, not flags: the command exports its flags into this process's
    for name, value in (("DATA_DIR", str(tmp_path / "data")), ("POOL_SIZE", "1")):
        monkeypatch.setenv(f"REWARDD_{name}", value)
    monkeypatch.delenv("REWARDD_DATABASE_URL", raising=False)
    try:
        result = CliRunner().invoke(main, ["score", str(source), "-o",
                                           str(tmp_path / "out.jsonl"), "--no-progress",
                                           "--no-record"])
    finally:
        get_settings.cache_clear()  # the command's settings, read from this environment
    assert result.exit_code == 0, result.output
    assert '"record": null' in result.output
    assert (tmp_path / "out.jsonl").read_bytes().count(b"\n") == 1
    assert not (tmp_path / "data" / "records.sqlite3").exists()
