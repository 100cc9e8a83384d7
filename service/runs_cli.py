"""``rewardd runs``: the run record from a terminal, read over HTTP from a running server
(``GET /v1/runs...``, as any client would): ``list``, ``show RUN_ID`` (per-step summaries)
and ``rollouts RUN_ID`` (filtered, every page or one). Tables for people, ``--json`` for
scripts.

Why httpx here and not the ``rewardd-client`` package: the command ships with the server's
distribution, which does not depend on the client's.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from typing import Any, Iterator

import click
import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"


class RunsApi:
    """The three run routes, with the key's tenant; an answer that is not 200 ends the
    command with the server's reason (exit status 1)."""

    def __init__(self, server: str, api_key: str | None, timeout_s: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers,
                                 timeout=timeout_s)

    def get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        return self._answer(lambda: self.http.get(path, params=query), (200,))

    def post(self, path: str, body: Any) -> Any:
        return self._answer(lambda: self.http.post(path, json=body), (200, 202))

    def _answer(self, send: Any, expected: tuple[int, ...]) -> Any:
        try:
            response = send()
        except httpx.HTTPError as exc:
            raise click.ClickException(f"cannot reach {self.http.base_url}: {exc} (is "
                                       "`rewardd serve` running? pass --server)") from exc
        if response.status_code not in expected:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise click.ClickException(f"{response.status_code}: {detail}")
        return response.json()

    def rollouts(self, run_id: str, every_page: bool, **filters: Any) -> Iterator[Any]:
        cursor = None
        while True:
            page = self.get(f"/v1/runs/{segment(run_id)}/rollouts", cursor=cursor, **filters)
            yield from page["rollouts"]
            cursor = page["next_cursor"]
            if cursor is None or not every_page:
                return


def segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [["" if v is None else _fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()
                     for row in cells)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def emit(data: Any, as_json: bool, render: Any) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else render(data))


def render_runs(body: Any) -> str:
    return table([[r["run_id"], r["rollouts"], r["last_step"], r["last_at"]]
                  for r in body["runs"]], ["RUN", "ROLLOUTS", "LAST STEP", "LAST SCORED"])


def render_run(body: Any) -> str:
    record = body["record"]
    lines = [f"run {body['run_id']}: "
             + (f"{record['rollouts']} rollouts, steps up to {record['last_step']}, "
                f"{record['first_at']} .. {record['last_at']}" if record else "no record")]
    if body["state"]:
        lines.append(f"state: {json.dumps(body['state'])}")
    rows = []
    for step in body["steps"]:
        for name, part in step["components"].items():
            failures = ", ".join(f"{k} {v}" for k, v in sorted(part["failures"].items()))
            rows.append([step["step"], step["rollouts"], name, part["mean"], part["std"],
                         failures or "-"])
    if rows:
        lines.append(table(rows, ["STEP", "ROLLOUTS", "COMPONENT", "MEAN", "STD", "FAILURES"]))
    return "\n".join(lines)


def render_rollouts(items: list[Any]) -> str:
    rows = [[r["step"], r["source"], r["group_id"], r["rollout_id"], r["outcome"],
             " ".join(f"{name}={v['reward'] if v['outcome'] == 'ok' else v['outcome']}"
                      for name, v in r["verdicts"].items())] for r in items]
    return table(rows, ["STEP", "SOURCE", "GROUP", "ROLLOUT", "OUTCOME", "VERDICTS"])


server_option = click.option("--server", default=DEFAULT_SERVER, show_default=True,
                             help="The rewardd API to read.")
key_option = click.option("--api-key", envvar="REWARDD_API_KEY", default=None,
                          help="Bearer key of the tenant whose runs to read "
                          "[env: REWARDD_API_KEY].")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")


@click.group()
def runs() -> None:
    """Read the run record of a running server (docs/records.md)."""


@runs.command("list")
@server_option
@key_option
@json_option
@click.option("--limit", type=int, default=100, show_default=True)
def list_runs(server: str, api_key: str | None, as_json: bool, limit: int) -> None:
    """The tenant's recorded runs, the most recently scored first."""
    emit(RunsApi(server, api_key).get("/v1/runs", limit=limit), as_json, render_runs)


@runs.command("show")
@click.argument("run_id")
@server_option
@key_option
@json_option
@click.option("--steps", type=int, default=20, show_default=True,
              help="Per-step summaries of this many last steps.")
def show_run(run_id: str, server: str, api_key: str | None, as_json: bool, steps: int) -> None:
    """A run's record and per-step summaries (per component: mean, spread, failures)."""
    emit(RunsApi(server, api_key).get(f"/v1/runs/{segment(run_id)}", steps=steps), as_json,
         render_run)


@runs.command("rollouts")
@click.argument("run_id")
@server_option
@key_option
@json_option
@click.option("--step", type=int, default=None)
@click.option("--source", default=None)
@click.option("--component", default=None)
@click.option("--outcome", default=None, help="ok, failed or a failure kind.")
@click.option("--q", default=None, help="A substring of the completion.")
@click.option("--limit", type=int, default=100, show_default=True, help="Rollouts per page.")
@click.option("--all", "every_page", is_flag=True, help="Every page, not only the first.")
def list_rollouts(run_id: str, server: str, api_key: str | None, as_json: bool, **filters: Any
                  ) -> None:
    """A run's recorded rollouts with their verdicts, filtered."""
    every_page = filters.pop("every_page")
    items = list(RunsApi(server, api_key).rollouts(run_id, every_page, **filters))
    if as_json:
        json.dump(items, sys.stdout, indent=2)
        click.echo()
    else:
        click.echo(render_rollouts(items))
