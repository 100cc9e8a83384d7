"""``rewardd runs`` against a real server: list, show and rollouts read the record a scored
batch left, as tables and as JSON; a missing run and an unreachable server end with the
reason and exit status 1."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner

from rewardd.service.cli import main
from tests.support.recorded import recorded_batch
from tests.support.redis_server import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def recorded(server: str) -> str:
    return recorded_batch(server, {
        "run_id": f"cli-{uuid.uuid4().hex[:8]}", "step": 4,
        "rewards": [{"name": "m", "verifier": "math"}],
        "groups": [{"group_id": "g", "source": "gsm8k", "reference": {"answer": "4"},
                    "rollouts": [{"rollout_id": "right", "completion": "\\boxed{4}"},
                                 {"rollout_id": "wrong", "completion": "\\boxed{5}"}]}]})


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["runs", *args])
    return result.exit_code, result.output


def test_list_and_show_print_the_run(server: str, recorded: str) -> None:
    code, out = run("list", "--server", server)
    assert code == 0 and "RUN" in out.splitlines()[0]
    assert any(line.split()[:3] == [recorded, "2", "4"] for line in out.splitlines())
    code, out = run("show", recorded, "--server", server)
    assert code == 0 and f"run {recorded}: 2 rollouts, steps up to 4" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("4 ")]
    assert row[:5] == ["4", "2", "m", "0.5", "0.5"]


def test_rollouts_filter_and_json(server: str, recorded: str) -> None:
    code, out = run("rollouts", recorded, "--server", server, "--q", "boxed{5}")
    assert code == 0
    assert [line.split()[:5] for line in out.splitlines()[1:]] == [
        ["4", "gsm8k", "g", "wrong", "ok"]]
    code, out = run("rollouts", recorded, "--server", server, "--json", "--all",
                    "--limit", "1")
    assert code == 0
    assert [r["rollout_id"] for r in json.loads(out)] == ["right", "wrong"]


def test_errors_say_what_is_wrong(server: str) -> None:
    code, out = run("show", "never-recorded", "--server", server)
    assert code == 1 and "404" in out and "no state and no record" in out
    code, out = run("list", "--server", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "cannot reach" in out and "--server" in out
