"""Benchmark: the run inspector (/ui, docs/inspector.md) on a long run: its first paint (a
run's step charts, from navigation until every chart is drawn) and a filtered rollout query,
on 1,000 steps x 512 rollouts in SQLite (the record `rewardd serve` keeps by default).

    .venv/bin/python tests/benchmarks/bench_inspector.py [--steps 1000] [--repeat 10]

Fills a SQLite record in a temporary folder through ``RecordStore.write`` (rollouts as the
recorder stores them: one math component, ~10% failed, four sources, receipts, 300-character
completions; each step's batch statistics on its first row, as the recorder leaves them),
starts a real ``rewardd serve`` on it with an API key, and drives Debian's Chromium with
Playwright (as ``make test-ui``):

- first paint: a fresh tab (the key already in its sessionStorage) navigates to
  ``/ui/#/runs/long-run`` (the default 20 steps; then ``?steps=100``); reported: Navigation
  Timing's ``domContentLoadedEventEnd`` and the moment every chart reports it is drawn
  (``performance.now()``, both from the navigation's start), p50 and the worst of
  ``--repeat``;
- a filtered rollout query: ``GET /v1/runs/long-run/rollouts?step=&source=&outcome=failed``
  (a page of 50, the browser's default) over HTTP, p50 and p99 of ``--queries``; and the
  same filters in the rollout browser, from the hash change to the table drawn.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rewardd.service.records.models import RolloutRecord, Verdict  # noqa: E402
from rewardd.service.records.store import RecordStore, dumps, rollout_row  # noqa: E402
from rewardd.service.stepstats import StepStats  # noqa: E402
from tests.support.server import server_process  # noqa: E402

PER_STEP = 512
SOURCES = ("gsm8k", "math", "aime", "code")
TEXT = "Let us reason carefully about each quantity before the final answer. " * 4
KEY = "bench-key"
RUN = "long-run"
CHROMIUM = "/usr/bin/chromium"
CHARTS_DRAWN = ("() => { const f = [...document.querySelectorAll('[data-chart]')]; "
                "return f.length > 0 && f.every((x) => x.dataset.state !== 'pending') "
                "&& !document.querySelector('main[aria-busy]'); }")


def receipt(step: int, i: int) -> dict[str, str]:
    return {"verifier": "math", "revision": "1", "params_hash": "4102c181d39d63b9114a7442dccb0e33",
            "reference_hash": f"{step:016x}{i // 8:016x}", "completion_hash": f"{step:016x}{i:016x}"}


def step_rows(step: int, rng: random.Random) -> list:
    records, stats = [], StepStats(groups=PER_STEP // 8, canaries={"math": [2, 0]})
    for i in range(PER_STEP):
        source = SOURCES[i % 4]
        failed = rng.random() < 0.1
        reward = None if failed else float(rng.random() < 0.3 + step / 2000)
        status = ({"ok": False, "error": "timeout", "detail": None, "receipt": receipt(step, i)}
                  if failed else
                  {"ok": True, "error": None, "receipt": receipt(step, i),
                   "detail": {"extracted": str(i), "rule": "boxed", "decided_by": "exact"}})
        records.append(RolloutRecord(
            tenant="acme", run_id=RUN, group_id=f"s{step}-g{i // 8}", rollout_id=f"s{step}-r{i}",
            recorded_at=1e9 + step, step=step, source=source,
            verdicts=(Verdict("math", reward, "timeout" if failed else "ok", status),),
            summary={"reward": reward, "excluded": failed,
                     "advantage_mean": None if failed else rng.uniform(-1, 1)},
            completion=f"{TEXT} answer {rng.randint(0, 10**6)}", num_tokens=rng.randint(40, 400),
            zero_advantage=False))
        stats.rollouts += 1
        if reward is not None:
            stats.rewarded += 1
            stats.reward_sum += reward
            stats.reward_squares += reward * reward
            stats.sources.setdefault(source, [0, 0.0])
            stats.sources[source][0] += 1
            stats.sources[source][1] += reward
    rows = [rollout_row(record) for record in records]
    rows[0].batch = dumps(stats.to_document())
    return rows


def fill(folder: Path, steps: int) -> float:
    store = RecordStore.open(f"sqlite:///{folder / 'records.sqlite3'}")
    rng = random.Random(0)
    started = time.perf_counter()
    for step in range(steps):
        store.write(step_rows(step, rng))
        if step % 100 == 99:
            print(f"{step + 1}/{steps} steps written", file=sys.stderr)
    store.close()
    return time.perf_counter() - started


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def first_paint(browser, url: str, view: str, repeat: int) -> tuple[list[float], list[float]]:
    loaded, drawn = [], []
    for _ in range(repeat):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(f"sessionStorage.setItem('rewardd.apiKey', {KEY!r})")
        page = context.new_page()
        page.goto(f"{url}/ui/{view}")
        page.wait_for_function(CHARTS_DRAWN, timeout=600_000)
        at = page.evaluate("performance.now()")
        timing = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
        loaded.append(timing["domContentLoadedEventEnd"])
        drawn.append(at)
        context.close()
    return loaded, drawn


def browse(browser, url: str, filters: list[dict[str, str]]) -> list[float]:
    """The rollout browser: each filter as a hash change, until its table (or "no rollouts")
    is drawn."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(f"sessionStorage.setItem('rewardd.apiKey', {KEY!r})")
    page = context.new_page()
    page.goto(f"{url}/ui/#/runs/{RUN}/rollouts")
    page.wait_for_selector("main:not([aria-busy]) #rollouts")
    times = []
    for chosen in filters:
        query = "&".join(f"{k}={v}" for k, v in chosen.items())
        started = page.evaluate(f"() => {{ location.hash = '#/runs/{RUN}/rollouts?{query}'; "
                                "return performance.now(); }")
        page.wait_for_function("() => !document.querySelector('main[aria-busy]') && "
                               "document.querySelector('#rollouts, #rollouts-empty')")
        times.append(page.evaluate("performance.now()") - started)
    context.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        fill_s = fill(Path(folder), args.steps)
        env = {"REWARDD_API_KEYS": f"{KEY}=acme", "REWARDD_DATA_DIR": folder}
        with server_process("--pool-size", "1", env=env) as (url, _), \
                sync_playwright() as playwright:
            rng = random.Random(1)
            filters = [{"step": str(rng.randrange(args.steps)), "source": rng.choice(SOURCES),
                        "outcome": "failed"} for _ in range(args.queries)]
            headers = {"Authorization": f"Bearer {KEY}"}
            with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
                view = http.get(f"/v1/runs/{RUN}", params={"steps": 20}).json()
                assert len(view["steps"]) == 20 and view["steps"][0]["reward_mean"] is not None
                api = []
                for chosen in filters:
                    started = time.perf_counter()
                    answer = http.get(f"/v1/runs/{RUN}/rollouts", params={**chosen, "limit": 50})
                    api.append(time.perf_counter() - started)
                    assert answer.status_code == 200 and all(
                        r["outcome"] == "failed" for r in answer.json()["rollouts"])
            browser = playwright.chromium.launch(executable_path=CHROMIUM)
            paints = {steps: first_paint(browser, url, f"#/runs/{RUN}?steps={steps}", args.repeat)
                      for steps in (20, 100)}
            page_times = browse(browser, url, filters[:args.repeat * 2])
            browser.close()
    print(f"{args.steps * PER_STEP:,} rollouts in SQLite (written in {fill_s:.0f} s); "
          f"first paint over {args.repeat} fresh tabs, queries as said:")
    print("| measure | p50 ms | worst/p99 ms |\n|---|---:|---:|")
    for steps, (loaded, drawn) in paints.items():
        print(f"| run view, {steps} steps: DOMContentLoaded | {statistics.median(loaded):.0f} "
              f"| {max(loaded):.0f} |")
        print(f"| run view, {steps} steps: every chart drawn | {statistics.median(drawn):.0f} "
              f"| {max(drawn):.0f} |")
    p50, p99 = percentiles(api)
    print(f"| filtered rollouts (step + source + failed), API | {p50 * 1000:.1f} "
          f"| {p99 * 1000:.1f} |")
    p50, worst = statistics.median(page_times), max(page_times)
    print(f"| the same filters in the rollout browser, hash change to table | {p50:.0f} "
          f"| {worst:.0f} |")
    print(json.dumps({"fill_s": fill_s}), file=sys.stderr)


if __name__ == "__main__":
    main()
