"""The ``rewardd`` command as a user runs it: real subprocesses, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rewardd_client.client import RewarddClient
from rewardd.service.models import GroupResult, ScoreResponse
from tests.support.server import REPO_ROOT, child_env

pytestmark = pytest.mark.e2e

EXAMPLES = REPO_ROOT / "openapi" / "examples"
GROUPS = EXAMPLES / "math_groups.jsonl"
SPEC = EXAMPLES / "math_spec.json"


def rewardd(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rewardd.service.cli", *map(str, args)], cwd=REPO_ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=timeout)


def summary_of(stderr: str) -> dict[str, Any]:
    """The summary JSON ``rewardd score`` prints last on stderr."""
    start = stderr.rfind('{\n  "requests"')
    assert start >= 0, stderr
    return json.loads(stderr[start:])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_score_group_per_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", GROUPS, "--spec", SPEC, "-o", out, "--no-progress",
                   "--pool-size", "2")
    assert proc.returncode == 0, proc.stderr
    lines = read_jsonl(out)
    sent = read_jsonl(GROUPS)
    assert len(lines) == 8
    assert [r["group_id"] for r in lines] == [g["group_id"] for g in sent]
    for record, group in zip(lines, sent):
        GroupResult.model_validate(record)
        assert [r["rollout_id"] for r in record["rollouts"]] == \
            [r["rollout_id"] for r in group["rollouts"]]
        assert all("correct" in r["rewards"] and "format" in r["rewards"]
                   for r in record["rollouts"])
    summary = summary_of(proc.stderr)
    assert summary["rollouts"] == 32 and summary["groups"] == 8
    assert summary["requests"] == 1 and summary["failed_cells"] == 0
    assert "scoring:" not in proc.stderr  # --no-progress: no bar


def test_score_with_progress_matches_the_server(tmp_path: Path, server: str) -> None:
    """Same pipeline offline and over HTTP: the same groups, number for number."""
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", GROUPS, "--spec", SPEC, "-o", out, "--progress", "--pool-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "scoring:" in proc.stderr
    assert "32/32" in proc.stderr and "rollout/s" in proc.stderr  # rollouts, not checks
    batch = json.loads((EXAMPLES / "math_batch.json").read_text())
    with RewarddClient(server) as client:
        over_http = client.score(batch)
    assert read_jsonl(out) == over_http["groups"]


def test_score_request_per_line(tmp_path: Path) -> None:
    source = tmp_path / "requests.jsonl"
    source.write_text(json.dumps(json.loads((EXAMPLES / "math_batch.json").read_text())) + "\n"
                      + json.dumps(json.loads((EXAMPLES / "advantages.json").read_text()))
                      + "\n")
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", source, "-o", out, "--no-progress", "--pool-size", "2")
    assert proc.returncode == 0, proc.stderr
    lines = read_jsonl(out)
    assert len(lines) == 2
    first, second = (ScoreResponse.model_validate(line) for line in lines)
    assert first.summary.rollouts == 32 and first.estimator == "grpo"
    assert second.summary.rollouts == 3 and second.estimator == "rloo"
    masked = next(r for r in lines[1]["groups"][0]["rollouts"] if r["rollout_id"] == "g0-0")
    assert masked["advantages"] == {"rle": [[0.75, 2], [0.0, 2], [0.75, 2]]}
    summary = summary_of(proc.stderr)
    assert (summary["requests"], summary["rollouts"], summary["groups"]) == (2, 35, 9)


def test_score_bad_line_names_it_and_writes_nothing(tmp_path: Path) -> None:
    groups = read_jsonl(GROUPS)
    groups[2]["rollouts"][1]["rollout_id"] = groups[2]["rollouts"][0]["rollout_id"]
    source = tmp_path / "bad.jsonl"
    source.write_text("".join(json.dumps(g) + "\n" for g in groups))
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", source, "--spec", SPEC, "-o", out, "--no-progress",
                   "--pool-size", "2")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "line 3" in proc.stderr
    assert "rollout_id" in proc.stderr and "duplicate" in proc.stderr
    for other in ("line 1:", "line 2:", "line 4:"):
        assert other not in proc.stderr
    assert not out.exists() or out.read_text() == ""


def test_openapi_command_writes_the_document(tmp_path: Path) -> None:
    from rewardd.service.app import render_openapi

    target = tmp_path / "doc" / "openapi.json"
    proc = rewardd("openapi", "-o", target)
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == render_openapi()


def test_score_spec_error_blames_the_spec_not_an_input_line(tmp_path: Path) -> None:
    spec = json.loads(SPEC.read_text())
    spec["rewards"][0]["verifier"] = "maths"
    bad_spec = tmp_path / "bad_spec.json"
    bad_spec.write_text(json.dumps(spec))
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", GROUPS, "--spec", bad_spec, "-o", out, "--no-progress",
                   "--batch-size", "3")
    assert proc.returncode == 2, proc.stderr
    assert "rewards.0.verifier" in proc.stderr and not out.exists()
    assert proc.stderr.count("unknown verifier 'maths'") == 1, proc.stderr
    assert "line 1:" not in proc.stderr, proc.stderr
