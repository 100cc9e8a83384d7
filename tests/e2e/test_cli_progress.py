"""``rewardd score``'s progress bar and summary as a user sees them, on a terminal and off one.

The bar counts rollouts (32 in the bundled groups, scored by 2 components: 64 checks) and is
drawn only where stderr is a terminal, which a pseudo-terminal stands in for here. The summary
keeps warm-up (imports, pool start) apart from scoring: a plugin whose import sleeps makes
the warm-up long on purpose, and none of it may show in ``scoring_s`` or ``rollouts_per_s``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.e2e.test_cli import GROUPS, SPEC, read_jsonl, rewardd, summary_of
from tests.support.server import REPO_ROOT, child_env

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 180
SLOW_IMPORT_S = 3.0
"""``tests/plugins/slow_start.py``'s SECONDS (not imported here: importing it sleeps)."""


def rewardd_on_a_terminal(*args: str | Path) -> tuple[int, str]:
    """Run ``rewardd`` with stderr on a pseudo-terminal (120 columns); its exit status and
    everything it wrote there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "rewardd.service.cli", *map(str, args)],
                            cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.wait(timeout=HANG_GUARD_S), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def test_the_bar_counts_rollouts_on_a_terminal(tmp_path: Path) -> None:
    status, seen = rewardd_on_a_terminal("score", GROUPS, "--spec", SPEC,
                                         "-o", tmp_path / "out.jsonl", "--pool-size", "2")
    assert status == 0, seen
    assert "scoring: 100%" in seen and "32/32" in seen and "rollout/s" in seen, seen
    assert "/64" not in seen and "check" not in seen, seen


def test_the_bar_is_quiet_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    proc = rewardd("score", GROUPS, "--spec", SPEC, "-o", tmp_path / "out.jsonl",
                   "--pool-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "scoring:" not in proc.stderr and "32/32" not in proc.stderr, proc.stderr
    assert json.loads(proc.stderr)["rollouts"] == 32  # the summary is all there is


def test_no_progress_keeps_a_terminal_quiet(tmp_path: Path) -> None:
    status, seen = rewardd_on_a_terminal("score", GROUPS, "--spec", SPEC, "--no-progress",
                                         "-o", tmp_path / "out.jsonl", "--pool-size", "2")
    assert status == 0, seen
    assert "scoring:" not in seen and json.loads(seen)["rollouts"] == 32


def test_the_summary_keeps_warm_up_out_of_the_scoring_rate(tmp_path: Path) -> None:
    """The plugin's import sleeps in the command's process and in the pool's forkserver:
    at least twice SLOW_IMPORT_S of warm-up, none of it in scoring. Order, not speed: both
    imports have ended (the plugin's log) by the time the bar starts, which is when scoring
    starts, and none happens after; the summary counts both sleeps as warm-up."""
    log = tmp_path / "imports.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewardd.service.cli", "score", str(GROUPS), "--spec", str(SPEC),
         "-o", str(tmp_path / "out.jsonl"), "--pool-size", "2", "--progress",
         "--plugins", "tests.plugins.slow_start"],
        cwd=REPO_ROOT, env={**child_env(), "SLOW_START_LOG": str(log)},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen, imported_when_the_bar_started = b"", None
    try:
        while chunk := os.read(proc.stderr.fileno(), 65536):
            seen += chunk
            if imported_when_the_bar_started is None and b"scoring:" in seen:
                imported_when_the_bar_started = log.read_text().split()
        status = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    stderr = seen.decode(errors="replace")
    assert status == 0, stderr
    # the command's own import and its forkserver's, both before the bar; none after
    assert imported_when_the_bar_started is not None, stderr
    assert len(set(imported_when_the_bar_started)) == 2, imported_when_the_bar_started
    assert str(proc.pid) in imported_when_the_bar_started
    assert log.read_text().split() == imported_when_the_bar_started
    summary = summary_of(stderr)
    assert summary["warmup_s"] >= 2 * SLOW_IMPORT_S, summary  # a sleep is never shorter
    assert summary["scoring_s"] > 0, summary
    assert summary["rollouts_per_s"] == round(32 / summary["scoring_s"], 1)
    parts = summary["warmup_s"] + summary["load_s"] + summary["scoring_s"]
    assert parts <= summary["elapsed_s"] + 0.002, summary  # each part rounded to 1 ms
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 8


def test_plugin_verifiers_are_known_when_validating(tmp_path: Path) -> None:
    source = tmp_path / "groups.jsonl"
    source.write_text(json.dumps({"group_id": "g", "rollouts": [
        {"rollout_id": "r0", "completion": "1"}, {"rollout_id": "r1", "completion": "0"}]}) + "\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"rewards": [{"name": "echo", "verifier": "test_echo"}],
                                "advantage": {"output": "scalar"}}))
    out = tmp_path / "out.jsonl"
    proc = rewardd("score", source, "--spec", spec, "-o", out, "--pool-size", "1",
                   "--plugins", "tests.plugins.faulty")
    assert proc.returncode == 0, proc.stderr
    [group] = read_jsonl(out)
    assert [r["reward"] for r in group["rollouts"]] == [1.0, 0.0]


def test_a_plugin_that_cannot_be_imported_is_named(tmp_path: Path) -> None:
    proc = rewardd("score", GROUPS, "--spec", SPEC, "-o", tmp_path / "out.jsonl",
                   "--plugins", "tests.plugins.no_such_plugin")
    assert proc.returncode == 2, proc.stderr
    assert "plugin 'tests.plugins.no_such_plugin'" in proc.stderr
    assert "No module named 'tests.plugins.no_such_plugin'" in proc.stderr
