"""Issue 28 row 16 through the real CLI: every bad setting stops ``rewardd serve`` with exit
status 2 and one line naming it, never a traceback, a read without end or a server that
never becomes healthy."""

from __future__ import annotations

import os

import pytest

from tests.integration.test_config import run_cli

HEADER = "rewardd serve: the configuration is not valid:"


def refusal(env: dict[str, str]) -> str:
    """The one line ``rewardd serve`` printed on refusing ``env`` (status 2, no traceback)."""
    done = run_cli("serve", "--port", "0", env=env)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == HEADER and len(lines) == 2, lines
    return lines[1].strip()


def test_a_key_given_to_two_tenants_is_refused_without_echoing_it() -> None:
    line = refusal({"REWARDD_API_KEYS": "k-secret-1=team-a,k-secret-1=team-b"})
    assert "REWARDD_API_KEYS" in line
    assert "one API key is given to two tenants ('team-a' and 'team-b')" in line
    assert "k-secret-1" not in line


@pytest.mark.parametrize("variable", ["REWARDD_COMPAT_CONFIG", "REWARDD_API_KEYS_FILE"])
def test_a_setting_file_that_is_a_device_is_refused_not_read(variable: str) -> None:
    line = refusal({variable: "/dev/zero"})
    assert line == (f"{variable}: file '/dev/zero' is not a regular file (a character "
                    "device); point the setting at a configuration file")


def test_a_fifo_setting_file_is_refused_not_waited_on(tmp_path) -> None:
    fifo = tmp_path / "compat.json"
    os.mkfifo(fifo)
    assert "is not a regular file (a FIFO)" in refusal({"REWARDD_COMPAT_CONFIG": str(fifo)})


def test_a_slime_path_on_a_core_route_is_refused() -> None:
    line = refusal({"REWARDD_COMPAT_CONFIG": '{"slime": {"path": "/v1/score"}}'})
    assert "slime.path '/v1/score' is another route of rewardd" in line


def test_a_pool_beyond_the_cpus_is_refused_naming_the_bound() -> None:
    line = refusal({"REWARDD_POOL_SIZE": "100000"})
    assert line.startswith("REWARDD_POOL_SIZE=100000: at most ")
    assert "per CPU this process may use" in line
