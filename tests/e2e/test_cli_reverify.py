"""``rewardd reverify`` against a real server: a recorded run replayed with a changed
parameter prints the flips as a table (progress on stderr), keeps the whole result with
``--json FILE``, and ends with the reason and exit status 1 for a bad override."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from rewardd.service.cli import main
from rewardd.service.reverify_cli import parse_set, parse_steps
from tests.support.recorded import recorded_batch

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def recorded(server: str) -> str:
    return recorded_batch(server, {
        "run_id": f"reverify-{uuid.uuid4().hex[:8]}", "step": 7,
        "rewards": [{"name": "m", "verifier": "math"}],
        "groups": [{"group_id": "g", "reference": {"answer": "4"},
                    "rollouts": [{"rollout_id": "boxed", "completion": "\\boxed{4}"},
                                 {"rollout_id": "prose", "completion": "The answer is 4."}]}]})


def test_a_changed_parameter_prints_its_flips_and_keeps_the_result(
        server: str, recorded: str, tmp_path: Path) -> None:
    out_file = tmp_path / "flips.json"
    result = CliRunner().invoke(main, ["reverify", recorded, "--server", server, "--steps",
                                       "7:7", "--set", "m.extract=boxed", "--json",
                                       str(out_file)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("reverify: ") and line.endswith("rollouts") for line in lines)
    assert f"run {recorded}: 2 of 2 rollouts re-scored" in result.output
    [row] = [line.split() for line in lines if line.startswith("7 ")]
    assert row == ["7", "g", "prose", "m", "1", "0"]  # no source: an empty cell
    kept = json.loads(out_file.read_text())
    assert [f["rollout_id"] for f in kept["flips"]] == ["prose"]
    assert kept["flips"][0]["receipts"]["before"]["params_hash"] != \
        kept["flips"][0]["receipts"]["after"]["params_hash"]


def test_a_bad_override_ends_with_the_reason(server: str, recorded: str) -> None:
    result = CliRunner().invoke(main, ["reverify", recorded, "--server", server, "--set",
                                       "nope.extract=boxed", "--quiet"])
    assert result.exit_code == 1 and "no component 'nope'" in result.output


def test_steps_and_overrides_parse_as_documented() -> None:
    assert parse_steps("3:9") == [3, 9] and parse_steps("4") == [4, 4]
    assert parse_set(("m.extract=boxed", "m.max_digits=8", "j.backend={\"name\": \"big\"}")) \
        == {"m.extract": "boxed", "m.max_digits": 8, "j.backend": {"name": "big"}}
