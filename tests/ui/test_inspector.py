"""The run inspector (/ui) in a real browser against a real server and a recorded run: the
key prompt, every view drawn from the API's own numbers, filters, an escaped completion with
its receipt, a replay's flips, keyboard use, accessible names, no console errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.ui.conftest import KEY, RUN, STEPS, Inspector, Problems, screenshot

pytestmark = pytest.mark.ui


def with_key(page: Any) -> Any:
    """The tab starts with the key in its sessionStorage, as after the prompt."""
    page.add_init_script(f"sessionStorage.setItem('rewardd.apiKey', {KEY!r})")
    return page


def test_the_page_asks_for_a_key_and_lists_the_tenants_runs(
        page: Any, inspector: Inspector, problems: Problems, tmp_path: Path) -> None:
    problems.expect(401, "/v1/runs")  # the answers that make the page ask for a key
    page.goto("/ui")
    dialog = page.get_by_role("dialog", name="An API key is needed")
    dialog.wait_for()
    key = page.get_by_label("API key", exact=True)
    assert key.get_attribute("type") == "password"
    screenshot(page, "key", tmp_path)
    key.fill("wrong-key")
    key.press("Enter")
    page.get_by_text("The server refused that key").wait_for()
    key.fill(KEY)
    page.get_by_role("button", name="Use this key").click()
    page.get_by_role("heading", name="Runs", level=1).wait_for()
    assert page.evaluate("sessionStorage.getItem('rewardd.apiKey')") == KEY
    rows = page.locator("#runs tbody tr")
    listed = inspector.get("/v1/runs")["runs"]
    assert [r["run_id"] for r in listed] == [RUN]  # the other tenant's run is not there
    assert rows.count() == 1
    assert rows.first.locator("td").all_inner_texts()[:3] == [RUN, str(max(STEPS)),
                                                              str(listed[0]["rollouts"])]
    screenshot(page, "runs", tmp_path)
    page.get_by_role("link", name=RUN).click()
    page.get_by_role("heading", name=f"Run {RUN}").wait_for()
    problems.expect_none()


def drawn(page: Any, chart: str) -> Any:
    figure = page.locator(f"[data-chart='{chart}']")
    figure.and_(page.locator("[data-state='drawn'], [data-state='no-data']")).wait_for()
    return figure


def plotted(figure: Any) -> dict[str, list[float | None]]:
    """The chart's data table (its text alternative): series label -> value per step."""
    labels = figure.locator("table.chart-data thead th").all_inner_texts()[1:]
    rows = figure.locator("table.chart-data tbody tr")
    values: dict[str, list[float | None]] = {label: [] for label in labels}
    for i in range(rows.count()):
        cells = rows.nth(i).locator("td")
        for j, label in enumerate(labels):
            raw = cells.nth(j).get_attribute("data-value")
            values[label].append(None if raw == "null" else float(raw))
    return values


# chart -> the series it plots from a step summary (label -> value)
CHARTS = {
    "reward-components": lambda s: {n: c["mean"] for n, c in s["components"].items()},
    "reward-total": lambda s: {"reward": s["reward_mean"]},
    "reward-sources": lambda s: dict(s["source_rewards"]),
    "failures": lambda s: {"rollouts with a failure": s["failed_rollouts"],
                           "invalid_reference": sum(c["failures"].get("invalid_reference", 0)
                                                    for c in s["components"].values())},
    "zero-advantage": lambda s: {"zero-advantage fraction": s["zero_advantage_fraction"]},
    "length": lambda s: {"mean length": s["mean_length"]},
    "canaries": lambda s: {k: sum(c[k] for c in s["canaries"].values())
                           for k in ("passed", "failed")},
    "audit": lambda s: {n: a["agreement"] for n, a in s["audit"].items()},
    "audit-gap": lambda s: {n: a["mean_gap"] for n, a in s["audit"].items()},
    "signals": lambda s: dict(s["signals"]),
}


def expected_series(chart: str, steps: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    rows = [CHARTS[chart](s) for s in steps]
    return {label: [None if r.get(label) is None else float(r[label]) for r in rows]
            for label in {k for r in rows for k in r}}


def test_the_run_view_charts_the_apis_step_summaries(
        page: Any, inspector: Inspector, problems: Problems, tmp_path: Path) -> None:
    with_key(page).goto(f"/ui/#/runs/{RUN}")
    steps = list(reversed(inspector.get(f"/v1/runs/{RUN}", steps=20)["steps"]))
    assert [s["step"] for s in steps] == list(STEPS)
    for chart in CHARTS:
        figure = drawn(page, chart)
        assert figure.get_attribute("data-state") == "drawn", chart
        assert figure.get_attribute("data-points") == str(len(steps)), chart
        assert figure.get_by_role("img").get_attribute("aria-label").startswith(
            figure.locator("h3").inner_text())
        shown = plotted(figure)
        assert shown == expected_series(chart, steps), chart
        assert figure.get_attribute("data-series") == str(len(shown))
    # what the run gave: failures at two steps, an audit that agrees less once it is gamed
    assert sum(plotted(page.locator("[data-chart='failures']"))["invalid_reference"]) == 4
    assert plotted(page.locator("[data-chart='canaries']"))["passed"][0] > 0
    screenshot(page, "run", tmp_path)
    table = page.locator("#chart-length-data")
    assert not table.is_visible()
    page.locator("[data-chart='length']").get_by_role("button", name="Show data table").click()
    assert table.is_visible()
    toggle = page.get_by_role("button", name="Hide data table")
    assert toggle.get_attribute("aria-expanded") == "true"

    page.get_by_label("Last steps to chart").fill("3")
    page.get_by_role("button", name="Show", exact=True).click()
    page.wait_for_url(f"**/ui/#/runs/{RUN}?steps=3")
    expect(page.locator("[data-chart='length']")).to_have_attribute("data-points", "3")
    assert plotted(page.locator("[data-chart='length']")) == expected_series("length", steps[-3:])
    problems.expect_none()


def test_the_sentinels_alerts_are_listed_and_marked_at_their_step(
        page: Any, inspector: Inspector, problems: Problems) -> None:
    alerts = inspector.get(f"/v1/runs/{RUN}/alerts")["alerts"]
    # the run's lenient readings from LENIENT_FROM on trip the sentinel (the audit too)
    assert "lenient_fallback" in {a["signal"] for a in alerts}
    with_key(page).goto(f"/ui/#/runs/{RUN}")
    items = page.locator(".alert-list li")
    items.first.wait_for()
    assert items.count() == len(alerts)
    for item, alert in zip(items.all(), alerts):
        text = item.inner_text()
        assert alert["signal"] in text and alert["message"] in text
        assert f"at step {alert['step']}" in text
    for chart in CHARTS:
        figure = drawn(page, chart)
        assert figure.get_attribute("data-markers") == str(len(alerts)), chart
        label = figure.get_by_role("img").get_attribute("aria-label")
        assert f"{len(alerts)} alert(s) marked" in label

    page.goto(f"/ui/#/runs/{RUN}?steps=2")  # steps 18 and 19: the alerts are before them
    expect(page.locator("[data-chart='length']")).to_have_attribute("data-points", "2")
    assert page.locator("[data-chart='length']").get_attribute("data-markers") == "0"
    assert page.locator(".alert-list li").count() == len(alerts)  # listed all the same
    problems.expect_none()


def test_a_server_without_the_alerts_route_shows_none_available(
        page: Any, problems: Problems) -> None:
    path = f"/v1/runs/{RUN}/alerts"
    problems.expect(404, path)
    page.route(f"**{path}", lambda route: route.fulfill(status=404, json={"detail": "Not Found"}))
    with_key(page).goto(f"/ui/#/runs/{RUN}")
    page.get_by_text("No alerts available").wait_for()
    assert drawn(page, "length").get_attribute("data-markers") == "0"
    problems.expect_none()


def fill_filters(page: Any, **filters: str) -> None:
    labels = {"step": "Step", "source": "Source", "component": "Component",
              "outcome": "Outcome", "q": "Completion contains", "limit": "Rows per page"}
    for name, value in filters.items():
        control = page.get_by_label(labels[name], exact=True)
        if name in ("outcome", "limit"):
            control.select_option(value)
        else:
            control.fill(value)
    page.get_by_role("button", name="Apply filters").click()


def expect_rollouts(page: Any, rollouts: list[dict[str, Any]]) -> None:
    """The browser's table lists exactly ``rollouts`` (an API page), in order; retried until
    the view the last action asked for is drawn."""
    if rollouts:
        expect(page.locator("#rollouts tbody tr td:first-child")).to_have_text(
            [r["rollout_id"] for r in rollouts])
    else:
        expect(page.get_by_text("No rollouts match these filters.")).to_be_visible()


@pytest.mark.parametrize("filters", [
    {"source": "math"}, {"step": "2"}, {"q": "The answer is"}, {"outcome": "failed"},
    {"component": "math", "outcome": "invalid_reference"},
    {"component": "math", "outcome": "ok", "source": "gsm8k", "step": "4"}],
    ids=lambda f: "-".join(f))
def test_filters_narrow_the_browser_as_the_api_does(
        page: Any, inspector: Inspector, problems: Problems, filters: dict[str, str]) -> None:
    with_key(page).goto(f"/ui/#/runs/{RUN}/rollouts")
    everything = inspector.get(f"/v1/runs/{RUN}/rollouts", limit=50)["rollouts"]
    expect_rollouts(page, everything)
    fill_filters(page, **filters)
    expected = inspector.get(f"/v1/runs/{RUN}/rollouts", limit=50, **filters)["rollouts"]
    assert [r["rollout_id"] for r in expected] != [r["rollout_id"] for r in everything]
    expect_rollouts(page, expected)
    assert page.locator("#rollouts tbody tr").count() == len(expected)
    problems.expect_none()


def test_pages_follow_the_apis_cursor(page: Any, inspector: Inspector,
                                      problems: Problems) -> None:
    with_key(page).goto(f"/ui/#/runs/{RUN}/rollouts")
    fill_filters(page, limit="10")
    first = inspector.get(f"/v1/runs/{RUN}/rollouts", limit=10)
    expect_rollouts(page, first["rollouts"])
    page.get_by_role("link", name="Next page").click()
    second = inspector.get(f"/v1/runs/{RUN}/rollouts", limit=10, cursor=first["next_cursor"])
    page.wait_for_url(f"**cursor={first['next_cursor']}*")
    expect_rollouts(page, second["rollouts"])
    page.get_by_role("link", name="First page").click()
    expect_rollouts(page, first["rollouts"])
    problems.expect_none()


def test_a_rollout_shows_its_completion_as_text_its_verdict_and_receipt(
        page: Any, inspector: Inspector, problems: Problems, tmp_path: Path) -> None:
    with_key(page).goto(f"/ui/#/runs/{RUN}/rollouts?limit=10")
    [stored] = [r for r in inspector.get(f"/v1/runs/{RUN}/rollouts", step=0)["rollouts"]
                if r["rollout_id"] == "s0-g0-markup"]
    assert "<script>" in stored["completion"]
    page.get_by_role("button", name="s0-g0-markup").click()
    detail = page.locator("#rollout")
    detail.get_by_role("heading", name="Rollout s0-g0-markup").wait_for()
    assert detail.locator("pre.completion").inner_text() == stored["completion"]
    assert detail.locator("script, img").count() == 0  # text, not markup
    assert page.evaluate("window.__injected") is None  # nothing it carries ran
    receipt = stored["verdicts"]["math"]["status"]["receipt"]
    shown = detail.locator("[data-component='math'] .receipt")
    terms = shown.locator("dt").all_inner_texts()
    assert dict(zip(terms, shown.locator("dd").all_inner_texts())) == {
        k: str(v) for k, v in receipt.items()}
    assert receipt["completion_hash"] and receipt["verifier"] == "math"
    audit = stored["summary"]["audit"]["strict"]  # the strict audit's own verdict and receipt
    shown = detail.locator("[data-component='strict'][data-kind='audit'] .receipt")
    assert dict(zip(shown.locator("dt").all_inner_texts(),
                    shown.locator("dd").all_inner_texts()))["params_hash"] == \
        audit["receipt"]["params_hash"] != receipt["params_hash"]
    verdict = detail.locator("[data-component='math'] dl").first.inner_text()
    assert "Reward\n1" in verdict and "Outcome\nok" in verdict
    assert str(round(stored["summary"]["advantage_mean"], 4)) in detail.inner_text()
    strip = detail.get_by_role("img", name=re.compile("Per-token advantages"))
    segments = strip.locator(".run")
    kept = stored["summary"]["advantages"]  # run-length encoded by the record
    assert [[float(segments.nth(i).get_attribute("data-value")),
             int(segments.nth(i).get_attribute("data-tokens"))]
            for i in range(segments.count())] == kept
    assert sum(n for _, n in kept) == stored["num_tokens"]
    screenshot(page, "rollout", tmp_path)
    problems.expect_none()


def test_the_keyboard_reaches_the_filters_and_the_table_and_enter_opens_a_rollout(
        page: Any, problems: Problems) -> None:
    with_key(page).goto(f"/ui/#/runs/{RUN}/rollouts")
    page.locator("#rollouts").wait_for()
    page.locator("h1").focus()
    reached = []
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.append(page.evaluate(
            "document.activeElement.id || document.activeElement.textContent"))
        if reached[-1] == "s0-g0-right":
            break
    filters = ["filter-step", "filter-source", "filter-component", "filter-outcome", "filter-q",
               "filter-limit"]
    assert [r for r in reached if r.startswith("filter-")] == filters  # in the form's order
    assert reached[-1] == "s0-g0-right"
    page.keyboard.press("Enter")
    heading = page.get_by_role("heading", name="Rollout s0-g0-right")
    heading.wait_for()
    assert page.evaluate("document.activeElement.id") == "rollout-title"  # focus moved there
    assert page.locator("tr[aria-current='true'] button").inner_text() == "s0-g0-right"
    problems.expect_none()


def test_a_replay_started_from_the_page_lists_its_flips_with_both_receipts(
        page: Any, inspector: Inspector, problems: Problems, tmp_path: Path) -> None:
    with_key(page).goto(f"/ui/#/runs/{RUN}/replay")
    page.get_by_label("First step").fill("1")
    page.get_by_label("Last step").fill("4")
    page.get_by_label("Parameter overrides").fill("math.extract=boxed")
    page.get_by_role("button", name="Start replay").click()
    flips = page.locator("#flips tbody tr")
    flips.first.wait_for()
    job_id = page.url.rsplit("/", 1)[1]
    result = inspector.get(f"/v1/jobs/{job_id}")["result"]
    # `extract: boxed` finds no answer in "The answer is N.": those verdicts flip 1 -> 0
    assert {f["rollout_id"] for f in result["flips"]} == {
        f"s{step}-g{g}-prose" for step in range(1, 5) for g in (0, 1)}
    assert flips.count() == len(result["flips"])
    first = flips.first.locator("td").all_inner_texts()
    flip = result["flips"][0]
    assert first[:6] == [str(flip["step"]), flip["group_id"], flip["rollout_id"], "math",
                         flip["source"], "1 → 0"]
    assert first[6] == "params_hash"  # what the receipts say changed
    for side, cell in (("before", 7), ("after", 8)):
        assert flip["receipts"][side]["params_hash"][:8] in first[cell]
    summary = page.locator("#replay-summary").inner_text()
    assert f"Flips\n{result['summary']['flips']}" in summary
    assert page.locator("#job-progress").get_attribute("value") == str(
        result["summary"]["rescored"])
    screenshot(page, "replay", tmp_path)
    problems.expect_none()


def test_a_bad_override_is_reported_by_the_form(page: Any, problems: Problems) -> None:
    problems.expect(422, f"/v1/runs/{RUN}/reverify")
    with_key(page).goto(f"/ui/#/runs/{RUN}/replay")
    page.get_by_label("Parameter overrides").fill("nope.extract=boxed")
    page.get_by_role("button", name="Start replay").click()
    assert "no component 'nope'" in page.get_by_role("alert").inner_text()
    problems.expect_none()


CONTROLS = re.compile(r"^\s*- (button|textbox|spinbutton|combobox|searchbox|link)\b(.*)$")


@pytest.mark.parametrize("view", ["#/runs", f"#/runs/{RUN}", f"#/runs/{RUN}/rollouts",
                                  f"#/runs/{RUN}/replay"])
def test_every_control_has_an_accessible_name_and_every_view_a_heading(
        page: Any, problems: Problems, view: str) -> None:
    with_key(page).goto(f"/ui/{view}")
    page.locator("main:not([aria-busy]) h1").wait_for()
    if view.endswith("/rollouts"):
        page.locator("#rollouts button").first.click()  # the detail's controls too
        page.locator("#rollout-title").wait_for()
    tree = page.locator("body").aria_snapshot()
    controls = [m.groups() for m in map(CONTROLS.match, tree.splitlines()) if m]
    assert controls and all(name.strip().startswith('"') for _, name in controls), tree
    count = page.locator("main input, main select, main textarea, main button").count()
    assert len([c for c in controls if c[0] != "link"]) >= count
    for table in page.locator("main table:not(.u-legend)").all():  # legends: inside role=img
        assert table.locator("thead th[scope='col']").count() >= 1
    problems.expect_none()


def test_forgetting_the_key_asks_for_one_again(page: Any, problems: Problems) -> None:
    problems.expect(401, "/v1/runs")
    with_key(page).goto("/ui/#/runs")
    page.locator("#runs").wait_for()
    page.get_by_role("button", name="Forget API key").click()
    page.get_by_role("dialog", name="An API key is needed").wait_for()
    assert page.evaluate("sessionStorage.getItem('rewardd.apiKey')") is None
    page.get_by_label("API key", exact=True).fill(KEY)
    page.get_by_role("button", name="Use this key").click()
    page.locator("#runs").wait_for()
    problems.expect_none()


def test_a_job_opens_by_its_own_link(page: Any, inspector: Inspector,
                                     problems: Problems) -> None:
    submitted = httpx.post(f"{inspector.url}/v1/runs/{RUN}/reverify", headers=inspector.headers,
                           json={"steps": [0, 0], "set": {"math.extract": "boxed"}}, timeout=60)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    with_key(page).goto(f"/ui/#/jobs/{job_id}")
    page.locator("#flips").wait_for()
    result = inspector.get(f"/v1/jobs/{job_id}")["result"]
    assert page.locator("#flips tbody tr").count() == len(result["flips"]) == 2  # step 0's prose
    assert page.get_by_role("link", name=RUN).get_attribute("href") == f"#/runs/{RUN}"
    problems.expect_none()
