"""The run inspector's page (service/ui/, docs/inspector.md) as packaged and served: every
file of static/ is package data (so in the wheel), every module the page imports is there,
the vendored uPlot is the version the lock pins, and the app serves the files at /ui without
a key (the API behind them still asks for one) under a same-origin-only CSP, counted in the
HTTP metrics under one route label."""

from __future__ import annotations

import fnmatch
import importlib.resources
import json
import re
import tomllib
from pathlib import Path

import httpx
import pytest

from rewardd.service.app import create_app
from rewardd.service.settings import Settings
from tests.support.executors import InlineExecutor

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "service" / "ui"
STATIC = UI / "static"


def test_every_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["rewardd.service.ui"]
    files = [p.relative_to(UI).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert "static/index.html" in files and "static/vendor/uPlot.esm.js" in files
    missing = [f for f in files if not any(fnmatch.fnmatchcase(f, p) for p in patterns)]
    assert not missing, f"not declared as package data (so not in the wheel): {missing}"
    installed = importlib.resources.files("rewardd.service.ui") / "static"
    assert sorted(p.name for p in installed.iterdir() if p.is_file()) == sorted(
        p.name for p in STATIC.iterdir() if p.is_file())


def test_every_module_the_page_imports_is_there() -> None:
    imports = {(path.name, target) for path in STATIC.glob("*.js")
               for target in re.findall(r'^import .* from "(\./[^"]+)";$',
                                        path.read_text(), re.M)}
    assert ("app.js", "./run.js") in imports
    assert not [(src, t) for src, t in imports if not (STATIC / t).is_file()]
    html = (STATIC / "index.html").read_text()
    for asset in re.findall(r'(?:src|href)="([\w./-]+\.(?:js|css))"', html):
        assert (STATIC / asset).is_file(), asset


def test_the_vendored_chart_library_is_the_pinned_one() -> None:
    lock = json.loads((UI / "package-lock.json").read_text())
    pinned = json.loads((UI / "package.json").read_text())["dependencies"]["uplot"]
    assert lock["packages"]["node_modules/uplot"]["version"] == pinned
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned)  # exact, not a range
    assert "MIT License" in (STATIC / "vendor" / "uPlot.LICENSE").read_text()
    assert pinned in (ROOT / "docs/inspector.md").read_text()


@pytest.fixture
async def http(tmp_path: Path):
    app = create_app(Settings(data_dir=str(tmp_path), api_keys="k=acme"),
                     executor=InlineExecutor())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                 base_url="http://rewardd") as client:
        yield client


async def test_the_page_is_served_without_a_key_the_api_still_asks_for_one(http) -> None:
    moved = await http.get("/ui")
    assert moved.status_code == 308 and moved.headers["location"] == "/ui/"
    page = await http.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="app.js">' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    module = await http.get("/ui/vendor/uPlot.esm.js")
    assert module.status_code == 200
    assert module.headers["content-type"].startswith(("text/javascript",
                                                      "application/javascript"))
    assert (await http.get("/ui/../pyproject.toml")).status_code == 404
    assert (await http.get("/ui/nope.js")).status_code == 404
    assert (await http.get("/v1/runs")).status_code == 401
    assert "/ui" not in json.dumps((await http.get("/openapi.json")).json()["paths"])
    metrics = (await http.get("/metrics", headers={"Authorization": "Bearer k"})).text
    assert re.search(r'rewardd_http_requests_total\{method="GET",route="/ui",status="200"',
                     metrics)  # the page's files under one label, not `unmatched`


def test_the_page_never_writes_html() -> None:
    """The page shows model-written text: it builds elements and text nodes (static/dom.js),
    never markup from a string, so nothing it shows can become a tag or a script."""
    writers = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|"
                         r"new Function\(|createContextualFragment")
    found = [f"{path.name}:{number}" for path in STATIC.glob("*.js")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if writers.search(line)]
    assert not found, found
