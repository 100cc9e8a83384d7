"""``rewardd reverify RUN_ID``: replay a recorded run against a running server
(``POST /v1/runs/{run_id}/reverify``), follow the job's progress, and print the verdicts
that flipped as a table (``--json FILE`` keeps the whole result).

``--set component.param=value`` reads the value as JSON when it parses (``5``, ``true``,
``"boxed"``, ``{"name": "big"}``), else as text (``boxed``): the common case needs no quotes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from rewardd.service.runs_cli import (RunsApi, key_option, segment, server_option, table)

POLL_S = 0.5


def parse_steps(value: str | None) -> list[int] | None:
    """``A:B`` (or one step ``A``) as ``[A, B]``."""
    if value is None:
        return None
    first, _, last = value.partition(":")
    try:
        return [int(first), int(last or first)]
    except ValueError:
        raise click.BadParameter(f"{value!r}: steps are FIRST:LAST, e.g. 100:200") from None


def parse_set(entries: tuple[str, ...]) -> dict[str, Any]:
    """``component.param=value`` entries as the request's ``set``."""
    out: dict[str, Any] = {}
    for entry in entries:
        key, sep, raw = entry.partition("=")
        if not sep or "." not in key:
            raise click.BadParameter(f"{entry!r}: write component.param=value, e.g. "
                                     "math.extract=boxed")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def render_result(result: dict[str, Any]) -> str:
    summary = result["summary"]
    lines = [f"run {result['run_id']}: {summary['rescored']} of {summary['rollouts']} "
             f"rollouts re-scored ({summary['skipped']} without their completion), "
             f"{summary['checks']} checks, {summary['flips']} flipped"]
    rows = [[name, c["rescored"], c["flipped"], c["up"], c["down"]]
            for name, c in sorted(summary["components"].items())]
    if rows:
        lines.append(table(rows, ["COMPONENT", "RESCORED", "FLIPPED", "UP", "DOWN"]))
    flips = [[f["step"], f["source"], f["group_id"], f["rollout_id"], f["component"],
              _verdict(f["before"], f["outcomes"]["before"]),
              _verdict(f["after"], f["outcomes"]["after"])] for f in result["flips"]]
    if flips:
        lines.append(table(flips, ["STEP", "SOURCE", "GROUP", "ROLLOUT", "COMPONENT",
                                   "BEFORE", "AFTER"]))
    if result.get("flips_truncated"):
        lines.append(f"(the first {len(result['flips'])} flips; --json FILE keeps them)")
    return "\n".join(lines)


def _verdict(reward: float | None, outcome: str) -> Any:
    return reward if outcome == "ok" else outcome


def follow(api: RunsApi, job_id: str, quiet: bool) -> dict[str, Any]:
    """Poll the job until it ends, its progress on stderr; its final status."""
    shown = None
    while True:
        job = api.get(f"/v1/jobs/{segment(job_id)}")
        progress = (job["progress"]["done"], job["progress"]["total"])
        if not quiet and progress != shown:
            shown = progress
            click.echo(f"reverify: {progress[0]}/{progress[1]} rollouts", err=True)
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(POLL_S)


@click.command("reverify")
@click.argument("run_id")
@click.option("--steps", default=None, help="FIRST:LAST, only these steps (inclusive).")
@click.option("--set", "overrides", multiple=True, metavar="COMPONENT.PARAM=VALUE",
              help="Re-score with this parameter changed (repeatable).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the whole result (every flip, receipts) here.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@server_option
@key_option
def reverify(run_id: str, steps: str | None, overrides: tuple[str, ...],
             json_file: Path | None, quiet: bool, server: str, api_key: str | None) -> None:
    """Re-score a recorded run with today's verifiers (or changed parameters) and show
    every verdict that flips (docs/records.md)."""
    body: dict[str, Any] = {"set": parse_set(overrides)}
    if steps is not None:
        body["steps"] = parse_steps(steps)
    api = RunsApi(server, api_key)
    job = api.post(f"/v1/runs/{segment(run_id)}/reverify", body)
    final = follow(api, job["id"], quiet)
    if final["state"] != "succeeded":
        raise click.ClickException(f"the reverify job {final['id']} {final['state']}: "
                                   f"{final.get('error') or 'no reason given'}")
    result = final["result"]
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(render_result(result))
    sys.stdout.flush()


__all__ = ["reverify"]
