"""The images and the compose file, offline (no Docker engine here): hadolint on every
Dockerfile, what each target installs and runs as, `docker-compose config` on the compose
file, and the two runtime claims the images rest on, checked on this machine with real
processes: the sandbox reaches `full` isolation with exactly the capabilities the chart and
the compose file grant (and not with one fewer), and the worker's liveness probe reads a real
worker's heartbeat."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
import redis
import yaml

from rewardd.verifiers.code.types import Language
from rewardd.workers.routing import QUEUES
from tests.deploy.chart import containers, render, sandbox_deployment
from tests.deploy.conftest import DEPLOY, REPO, find_tool

pytestmark = pytest.mark.deploy

DOCKERFILES = sorted(p for p in DEPLOY.rglob("Dockerfile*") if p.suffix != ".dockerignore")
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
PROBE = DEPLOY / "docker" / "worker_probe.py"
TARGETS = ("api", "worker", "worker-gpu")
RUNTIME_PACKAGES: dict[str, str] = {"python": "", "cpp": "g++", "javascript": "nodejs"}
"""Debian package the worker image installs for each language of the code sandbox (python:
the base image's own interpreter)."""
PROBE_DB = 10


def stages(text: str) -> dict[str, list[str]]:
    """Instructions of each named stage of a Dockerfile (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if match:
            current = out.setdefault(match.group(1), [])
        current.append(line)
    return out


def test_hadolint_passes_on_every_dockerfile() -> None:
    assert DOCKERFILES == [DOCKERFILE]
    for dockerfile in DOCKERFILES:
        done = subprocess.run([find_tool("hadolint"), "--no-color", str(dockerfile)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_hadolint_flags_an_unpinned_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER nobody\n")
    done = subprocess.run([find_tool("hadolint"), "--no-color", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "DL3007" in done.stdout, done.stdout


def test_each_target_runs_as_a_numeric_non_root_user_from_a_pinned_base() -> None:
    text = DOCKERFILE.read_text()
    by_stage = stages(text)
    for target in TARGETS:
        assert "USER 10001:10001" in by_stage[target], target
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), base
    assert all(line.split()[1] in {"${PYTHON_IMAGE}", "runtime", "build-base"}
               for lines in by_stage.values() for line in lines if line.startswith("FROM"))


def test_worker_image_installs_every_sandbox_runtime_and_the_gpu_image_the_models_extra() -> None:
    assert set(RUNTIME_PACKAGES) == set(typing.get_args(Language))
    by_stage = stages(DOCKERFILE.read_text())
    worker = " ".join(by_stage["worker"])
    for package in ["bubblewrap", *filter(None, RUNTIME_PACKAGES.values())]:
        assert re.search(rf'"{re.escape(package)}=\$\{{', worker), package
    assert "rewardd-worker-probe" in worker and "rewardd-worker-probe" in " ".join(by_stage["worker-gpu"])
    assert '"/src[models]"' in " ".join(by_stage["build-gpu"])
    assert "COPY --from=build-gpu" in " ".join(by_stage["worker-gpu"])
    assert "COPY --from=build-cpu" in " ".join(by_stage["api"])


def test_images_pin_the_torch_the_makefile_installs() -> None:
    makefile = (REPO / "Makefile").read_text()
    pinned = re.search(r"torch==([\d.]+)", makefile).group(1)
    assert re.findall(r"ARG TORCH_VERSION=(\S+)", DOCKERFILE.read_text()) == [pinned, pinned]


# ------------------------------------------------------------------------------- compose

def compose_config(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_tool("docker-compose"), "-f", str(path), *args, "config"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_compose_file_is_valid_and_a_misspelt_key_is_not(tmp_path: Path) -> None:
    done = compose_config(COMPOSE, "--profile", "gpu")
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    bad = COMPOSE.parent / f".broken-{os.getpid()}.yml"
    try:
        bad.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_periods:"))
        assert compose_config(bad).returncode != 0
    finally:
        bad.unlink()
    services = config["services"]
    assert {f"worker-{q}" for q in QUEUES} | {"api", "redis", "postgres", "prometheus",
                                               "grafana"} == set(services)
    assert services["api"]["environment"]["REWARDD_DATABASE_URL"].startswith(
        "postgresql://rewardd:")  # the run record is shared and outlives the container


def test_compose_redis_persists_and_never_evicts_and_gpu_is_optional() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    command = raw["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2]))
    assert flags["--appendonly"] == "yes" and flags["--maxmemory-policy"] == "noeviction"
    assert raw["worker-gpu"]["profiles"] == ["gpu"]
    assert all("profiles" not in raw[name] for name in raw if name != "worker-gpu")


def test_compose_sandbox_gets_the_charts_capabilities_and_only_the_backend_network() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    sandbox = raw["services"]["worker-sandbox"]
    chart = next(containers(sandbox_deployment(render())))["securityContext"]
    assert set(sandbox["cap_add"]) == set(chart["capabilities"]["add"])
    assert sandbox["cap_drop"] == ["ALL"] and sandbox["user"] == "0:0"
    assert sandbox["networks"] == ["backend"] and raw["networks"]["backend"]["internal"] is True
    assert raw["services"]["worker-cpu"]["user"] == raw["services"]["worker-gpu"]["user"] == "10001:10001"
    assert raw["services"]["api"]["cap_drop"] == ["ALL"]  # its image's USER is 10001


def test_compose_mounts_the_observability_files_that_exist() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    mounts = raw["prometheus"]["volumes"] + raw["grafana"]["volumes"]
    sources = [m.split(":")[0] for m in mounts if m.startswith(".")]
    assert "../grafana/dashboards" in sources and "../prometheus/rules.yml" in sources
    for source in sources:
        assert (COMPOSE.parent / source).exists(), source


# ------------------------------------------------------------- the sandbox's capabilities

def isolation_under(capabilities: list[str]) -> str:
    """The code sandbox's isolation level, and a python, C++ and JavaScript run, in a process
    whose capability bounding set is ``capabilities`` and with no_new_privs set (as uid 0 in a
    container granted exactly those, with allowPrivilegeEscalation: false)."""
    script = (
        "from rewardd.verifiers import CodeVerifier\n"
        "from rewardd.verifiers.base import Sample, run_verifier\n"
        "from rewardd.verifiers.code.runtimes import isolation\n"
        "level = isolation().level\n"
        "ok = []\n"
        "for lang, code in [('python', 'print(int(input())*2)'), ('cpp', '#include <iostream>\\n"
        "int main(){int x;std::cin>>x;std::cout<<x*2<<std::endl;}'), ('javascript', "
        "\"console.log(parseInt(require('fs').readFileSync(0,'utf8'))*2)\")]:\n"
        "    o = run_verifier(CodeVerifier(), Sample(completion='```\\n'+code+'\\n```'), "
        "{'language': lang, 'tests': {'inputs': ['3\\n'], 'outputs': ['6\\n']}}, {})\n"
        "    ok.append(o.ok and o.reward == 1.0 and o.detail['isolation'] == level)\n"
        "print(level, all(ok))\n")
    bounding = "-all," + ",".join(f"+{c.lower()}" for c in capabilities)
    # --no-new-privs: what allowPrivilegeEscalation: false sets on the container
    done = subprocess.run([find_tool("setpriv"), "--no-new-privs", "--bounding-set", bounding,
                           "--inh-caps", "-all", "--", sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-2] + (" runs" if done.stdout.split()[-1] == "True" else "")


@pytest.fixture(scope="module")
def sandbox_capabilities() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root: `full` isolation is uid 0 with a reduced capability set")
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is not installed: run `make sandbox-deps`")
    ctx = next(containers(sandbox_deployment(render())))["securityContext"]
    return sorted(ctx["capabilities"]["add"])


def test_the_charts_capabilities_give_full_isolation(sandbox_capabilities: list[str]) -> None:
    assert isolation_under(sandbox_capabilities) == "full runs"


def test_one_capability_fewer_falls_short_of_full(sandbox_capabilities: list[str]) -> None:
    for missing in ("NET_ADMIN", "SYS_ADMIN"):
        fewer = [c for c in sandbox_capabilities if c != missing]
        assert not isolation_under(fewer).startswith("full"), missing


# ------------------------------------------------------------------- the worker probe

def run_probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROBE), *args], env=env, capture_output=True,
                          text=True, timeout=30, cwd=REPO)


def test_worker_probe_names_what_rewardd_names() -> None:
    """The probe imports no rewardd (a probe must be cheap): its copies must not drift."""
    import importlib.util

    from rewardd.workers.liveness import WORKERS_KEY
    from rewardd.workers.settings import WorkerSettings

    spec = importlib.util.spec_from_file_location("worker_probe", PROBE)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.WORKERS_KEY == WORKERS_KEY
    assert probe.LOST_AFTER_S == WorkerSettings.model_fields["worker_lost_after_s"].default
    assert "import rewardd" not in PROBE.read_text() and "from rewardd" not in PROBE.read_text()


def test_worker_probe_follows_a_real_workers_heartbeat() -> None:
    from tests.integration.conftest import WorkerFleet
    from tests.support.server import child_env

    url = f"redis://127.0.0.1:6379/{PROBE_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    env = {**child_env(), "REWARDD_BROKER_URL": url, "REWARDD_WORKER_HEARTBEAT_S": "0.5"}
    fleet = WorkerFleet(env)
    try:
        assert run_probe(env).returncode == 1  # no worker yet
        (worker,) = fleet.start(1, queues="cpu", concurrency=1)
        deadline = time.monotonic() + 30
        while (done := run_probe(env)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert done.returncode == 0, done.stderr + worker.output()[-2000:]
        assert run_probe(env, "--host", "another-pod").returncode == 1
        worker.kill()
        time.sleep(2.0)
        stale = run_probe(env, "--max-age", "1.5")
        assert stale.returncode == 1 and "ago" in stale.stderr, stale.stderr
    finally:
        fleet.stop()
        client.flushdb()
    down = run_probe({**env, "REWARDD_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert down.returncode == 0 and "unreachable" in down.stderr, down.stderr


def test_every_rewardd_variable_the_compose_file_sets_is_a_valid_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rewardd.service.environment import load_settings

    done = compose_config(COMPOSE, "--profile", "gpu")
    services = yaml.safe_load(done.stdout)["services"]
    rewardd = [name for name in services if name == "api" or name.startswith("worker-")]
    assert len(rewardd) == 1 + len(QUEUES)
    for name in rewardd:
        for key in [k for k in os.environ if k.startswith("REWARDD_")]:
            monkeypatch.delenv(key)
        for key, value in services[name]["environment"].items():
            monkeypatch.setenv(key, str(value))
        settings = load_settings()
        assert settings.broker_url == "redis://redis:6379/0", name
        if name != "api":
            assert settings.worker_metrics_port == 9808
