"""The run inspector's browser tests: a real ``rewardd serve`` with API keys and a SQLite
record in a temporary folder, a run recorded through real ``/v1/score`` batches, and Debian's
Chromium driven by Playwright (``make test-ui`` installs both)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from tests.support.server import ServerFailed, server_process

CHROMIUM = "/usr/bin/chromium"
KEY, OTHER_KEY = "inspector-key", "other-key"
RUN = "inspector-run"
STEPS = range(20)
LENIENT_FROM = 15
"""From this step on, one rollout of each group is rewarded only by a lenient reading (a
last number after junk): the sentinel's `lenient_fallback` fires (it watches from the 15th
step)."""
FAILING_STEPS = (6, 12)
"""Steps with a third group whose reference cannot be parsed: a failed verdict."""
GUARD_S = 120.0
"""A guard against a hang, not a bound."""

# (completion, name): right, right only by `extract: auto` (flips with
# `math.extract=boxed`), wrong, and a completion that is markup (shown as text, never run).
SCRIPT = "<script>window.__injected = true</script><img src=x onerror=\"window.__injected=true\">"
ROLLOUTS = [("so \\boxed{{{a}}}", "right"), ("The answer is {a}.", "prose"),
            ("so \\boxed{{{w}}}", "wrong"), (SCRIPT + " \\boxed{{{a}}}", "markup")]
LENIENT = ("tried 3 then 12 maybe {a}", "lenient")


def score_body(step: int) -> dict[str, Any]:
    """Two groups a step, one per source, with advantages and a strict audit (the math
    verifier reading boxed answers only) of every rollout."""
    groups = []
    for g, source in enumerate(("gsm8k", "math")):
        answer = step + g + 2
        kept = ROLLOUTS if step % 2 == 0 or g else ROLLOUTS[:3]
        if step >= LENIENT_FROM:
            kept = [*kept[:2], LENIENT, *kept[3:]]
        groups.append({
            "group_id": f"s{step}-g{g}", "source": source, "reference": {"answer": str(answer)},
            "rollouts": [{"rollout_id": f"s{step}-g{g}-{name}",
                          "completion": text.format(a=answer, w=answer + 7),
                          "num_tokens": 4 + step + i}
                         for i, (text, name) in enumerate(kept)]})
    if step in FAILING_STEPS:
        groups.append({"group_id": f"s{step}-bad", "source": "math",
                       "reference": {"answer": "\\frac{"},
                       "rollouts": [{"rollout_id": f"s{step}-bad-{i}", "num_tokens": 3,
                                     "completion": f"so \\boxed{{{i}}}"} for i in range(2)]})
    return {"run_id": RUN, "step": step, "rewards": [{"name": "math", "verifier": "math"}],
            "audit": [{"name": "strict", "verifier": "math", "rate": 1.0,
                       "params": {"extract": "boxed"}}],
            "advantage": {"estimator": "grpo"}, "groups": groups}


@dataclass
class Inspector:
    url: str
    headers: dict[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {KEY}"})

    def get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, headers=self.headers, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()


def record_run(url: str) -> int:
    headers = {"Authorization": f"Bearer {KEY}"}
    rollouts = 0
    for step in STEPS:
        body = score_body(step)
        answer = httpx.post(f"{url}/v1/score", json=body, headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        rollouts += sum(len(g["rollouts"]) for g in body["groups"])
    other = {**score_body(0), "run_id": "another-tenants-run"}
    assert httpx.post(f"{url}/v1/score", json=other, timeout=120,
                      headers={"Authorization": f"Bearer {OTHER_KEY}"}).status_code == 200
    deadline = time.monotonic() + GUARD_S
    while True:  # recorded off the request path: wait until the record has it all
        view = httpx.get(f"{url}/v1/runs/{RUN}", headers=headers, timeout=60)
        if view.status_code == 200 and view.json()["record"]["rollouts"] == rollouts:
            return rollouts
        assert time.monotonic() < deadline, "the run was never recorded whole"
        time.sleep(0.1)


@pytest.fixture(scope="session")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    """A real server with two tenants' keys and the recorded run."""
    data = tmp_path_factory.mktemp("inspector-data")
    env = {"REWARDD_API_KEYS": f"{KEY}=acme,{OTHER_KEY}=other", "REWARDD_DATA_DIR": str(data),
           "REWARDD_RECORD_COMPLETIONS": "all"}
    try:
        with server_process("--pool-size", "1", env=env) as (url, _):
            record_run(url)
            yield Inspector(url)
    except ServerFailed as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert os.access(CHROMIUM, os.X_OK), f"no {CHROMIUM}: run make test-ui (it installs it)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


GUARD_MS = int(GUARD_S * 1000)
"""Playwright's waits (actions, navigation, `expect`), the same guard (its defaults are 5 to
30 s)."""

FAILED_LOAD = re.compile(r"^Failed to load resource: the server responded with a status of "
                         r"(\d+)")


@dataclass
class Problems:
    """What the page said went wrong: console errors and uncaught exceptions. Chromium also
    logs every HTTP error answer as a console error ("Failed to load resource"); the page
    handles two on purpose, and a test says which it expects (``expect``): the 401 before a
    key is given, and a 404 from the alerts route of a server that has none yet. Any other
    is a problem."""

    errors: list[str] = field(default_factory=list)
    expected: set[tuple[int, str]] = field(default_factory=set)

    def expect(self, status: int, path: str) -> None:
        self.expected.add((status, path))

    def console(self, message: Any) -> None:
        if message.type != "error":
            return
        url = message.location.get("url") or ""
        failed = FAILED_LOAD.match(message.text)
        if failed and (int(failed.group(1)), urlsplit(url).path) in self.expected:
            return
        self.errors.append(f"console: {message.text} ({url})")

    def expect_none(self) -> None:
        assert self.errors == [], self.errors


@pytest.fixture
def problems() -> Problems:
    return Problems()


@pytest.fixture
def page(browser: Any, inspector: Inspector, problems: Problems) -> Iterator[Any]:
    """A fresh tab on the inspector (its own sessionStorage: no key yet), with every console
    error and page error collected; the test ends by asserting there were none."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000},
                                  base_url=inspector.url)
    tab = context.new_page()
    # waits are guards against a hang, never a bound on speed: a loaded CI machine may take
    # seconds to draw what takes milliseconds here
    tab.set_default_timeout(GUARD_MS)
    expect.set_options(timeout=GUARD_MS)
    tab.on("console", problems.console)
    tab.on("pageerror", lambda e: problems.errors.append(f"pageerror: {e}"))
    yield tab
    context.close()
    problems.expect_none()


def screenshot(tab: Any, name: str, tmp_path: Path) -> Path:
    """A PNG of the page: into REWARDD_UI_SCREENSHOTS when set (make ui-screenshots:
    docs/ui/), else the test's own folder."""
    folder = Path(os.environ.get("REWARDD_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    return path
