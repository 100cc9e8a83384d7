"""The Helm chart, offline: Helm's lint (strict) and template engine on every CI values
file, the output checked by kubernetes-validate --strict against Kubernetes 1.30 and 1.33
(ScaledObjects against KEDA's CRD schema as cloudcoil-models-keda generates it), and the
security and lifecycle settings the design depends on asserted on the rendered objects."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rewardd.workers.celery_app import longest_task_s, max_samples_per_task
from rewardd.workers.routing import QUEUES
from rewardd.workers.settings import WorkerSettings
from tests.deploy.chart import (CHART, CI_VALUES, RELEASE, containers, lint, of_kind, render,
                                render_text, sandbox_deployment, values_of)
from tests.deploy.conftest import find_tool

pytestmark = pytest.mark.deploy

KUBERNETES_VERSIONS = ("1.30.0", "1.33.0")
SANDBOX_CAPABILITIES = {"SYS_ADMIN", "SETUID", "SETGID", "KILL", "SYS_PTRACE", "NET_ADMIN"}
CRD_KINDS = {"ScaledObject"}
"""Kinds kubernetes-validate has no schema for; each is checked against its CRD's below."""


def ci_id(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ci_id)
def test_helm_lint_strict_passes_with_each_ci_values_file(values_file: Path) -> None:
    for version in KUBERNETES_VERSIONS:
        report = lint(values_of(values_file), strict=True, kube_version=f"v{version}",
                      namespace="ml")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], (version, report)


def test_lint_reports_values_the_schema_refuses() -> None:
    """The linter has teeth. (Helm's lint mode only logs a template's `fail`; the test of
    rendering below covers those.)"""
    report = lint({"workers": {"sandbox": {"isolation": "partial"}}}, strict=True)
    assert any("isolation" in str(m) and m["severity"] == 3 for m in report["messages"]), report


def test_rendering_refuses_a_visibility_timeout_below_the_longest_check() -> None:
    with pytest.raises(Exception, match="visibilityTimeoutS must exceed"):
        render({"settings": {"visibilityTimeoutS": 60, "maxVerifierTimeoutS": 120}})


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ci_id)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_manifests_pass_kubernetes_validate_strict(values_file: Path, version: str,
                                                            tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yaml"
    docs = render(values_of(values_file))
    manifest.write_text(render_text(values_of(values_file)))
    done = subprocess.run([find_tool("kubernetes-validate"), "--strict", "-k", version,
                           str(manifest)], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [line for line in lines if line.startswith(("ERROR", "FATAL"))]
    unvalidated = [line for line in lines if line.startswith("WARN")]
    assert all(any(f"kind {kind} " in line for kind in CRD_KINDS) for line in unvalidated), \
        unvalidated
    passed = sum(line.startswith("INFO") and " passed " in line for line in lines)
    assert passed == sum(doc["kind"] not in CRD_KINDS for doc in docs)


def test_kubernetes_validate_strict_rejects_an_unknown_field(tmp_path: Path) -> None:
    docs = render()
    sandbox_deployment(docs)["spec"]["template"]["spec"]["hostUser"] = False  # a typo
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    done = subprocess.run([find_tool("kubernetes-validate"), "--strict", "-k", "1.30.0",
                           str(manifest)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "hostUser" in done.stdout, done.stdout


def keda_problems(doc: dict[str, Any]) -> list[str]:
    """Fields of a ScaledObject that KEDA's CRD schema rejects or does not know (pydantic
    models generated from the CRD drop unknown fields: a round trip must give back the
    input)."""
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    parsed = ScaledObject.model_validate(doc)
    back = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return [] if back == doc else [f"round trip differs: {back} != {doc}"]


@pytest.mark.parametrize("values_file", [v for v in CI_VALUES if "keda" in v.read_text()],
                         ids=ci_id)
def test_scaled_objects_match_kedas_crd_schema(values_file: Path) -> None:
    scaled = of_kind(render(values_of(values_file)), "ScaledObject")
    assert scaled
    for doc in scaled.values():
        assert keda_problems(doc) == []


def test_keda_schema_check_rejects_an_unknown_field() -> None:
    doc = next(iter(of_kind(render({"autoscaling": {"mode": "keda"}}),
                            "ScaledObject").values()))
    doc["spec"]["minReplicas"] = 1  # KEDA spells it minReplicaCount
    assert keda_problems(doc)


def test_values_schema_rejects_a_misspelt_value() -> None:
    with pytest.raises(Exception, match="concurency"):
        render({"workers": {"cpu": {"concurency": 3}}})


def test_every_object_carries_the_recommended_labels() -> None:
    for values_file in CI_VALUES:
        for doc in render(values_of(values_file)):
            labels = doc["metadata"]["labels"]
            for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                        "app.kubernetes.io/version", "app.kubernetes.io/managed-by"):
                assert key in labels, (values_file.name, doc["kind"], doc["metadata"]["name"])


def test_each_queue_has_a_worker_pool_and_the_defaults_run_cpu_and_sandbox() -> None:
    assert set(QUEUES) == {"cpu", "sandbox", "gpu"}
    names = set(of_kind(render(), "Deployment"))
    assert names == {f"{RELEASE}-rewardd-api", f"{RELEASE}-rewardd-worker-cpu",
                     f"{RELEASE}-rewardd-worker-sandbox"}
    deployments = of_kind(render({"workers": {"gpu": {"enabled": True}}}), "Deployment")
    for queue in QUEUES:
        env = {e["name"]: e.get("value")
               for e in next(containers(deployments[f"{RELEASE}-rewardd-worker-{queue}"]))["env"]}
        assert env["REWARDD_WORKER_QUEUES"] == queue


def test_api_probes_and_services() -> None:
    docs = render({"grpc": {"enabled": True, "port": 50051}})
    api = next(containers(of_kind(docs, "Deployment")[f"{RELEASE}-rewardd-api"]))
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in api["env"]}
    assert env["REWARDD_GRPC_PORT"] == "50051"
    ports = {p["name"]: p["port"] for p in of_kind(docs, "Service")[f"{RELEASE}-rewardd"]["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 50051}
    no_grpc = of_kind(render(), "Service")[f"{RELEASE}-rewardd"]["spec"]["ports"]
    assert [p["name"] for p in no_grpc] == ["http"]


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ci_id)
def test_workers_have_heartbeat_probes_and_outlast_their_longest_task(values_file: Path) -> None:
    values = values_of(values_file)
    settings_values = {**values_of(CHART / "values.yaml")["settings"], **values.get("settings", {})}
    settings = WorkerSettings(visibility_timeout_s=settings_values["visibilityTimeoutS"],
                              max_verifier_timeout_s=settings_values["maxVerifierTimeoutS"],
                              verifier_timeout_s=settings_values["verifierTimeoutS"])
    timeout = settings.max_verifier_timeout_s
    longest = longest_task_s(max_samples_per_task(timeout, settings), timeout)
    workers = {n: d for n, d in of_kind(render(values), "Deployment").items() if "-worker-" in n}
    assert workers
    for name, deployment in workers.items():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] > longest, (name, longest)
        for container in containers(deployment):
            for probe in ("startupProbe", "livenessProbe"):
                assert container[probe]["exec"]["command"] == ["rewardd-worker-probe"]


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ci_id)
def test_every_run_as_user_is_numeric_and_only_the_full_sandbox_runs_as_root(
        values_file: Path) -> None:
    values = values_of(values_file)
    full = values.get("workers", {}).get("sandbox", {}).get("isolation", "full") == "full"
    for doc in render(values):
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = doc["spec"]["template"]["spec"]
        contexts = [spec["securityContext"]] + [c["securityContext"] for c in spec["containers"]]
        for ctx in contexts:
            if "runAsUser" in ctx:
                assert isinstance(ctx["runAsUser"], int)
                root_ok = full and doc["metadata"]["name"].endswith("worker-sandbox")
                assert ctx["runAsUser"] != 0 or root_ok, doc["metadata"]["name"]
        for c in spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_full_sandbox_adds_exactly_the_capabilities_bubblewrap_needs() -> None:
    worker = next(containers(sandbox_deployment(render())))
    assert worker["securityContext"]["runAsUser"] == 0
    assert set(worker["securityContext"]["capabilities"]["add"]) == SANDBOX_CAPABILITIES
    namespaces = render({"workers": {"sandbox": {"isolation": "namespaces"}}})
    ctx = next(containers(sandbox_deployment(namespaces)))["securityContext"]
    assert ctx["runAsUser"] == 10001 and ctx["runAsNonRoot"] is True
    assert "add" not in ctx["capabilities"]


def test_hardened_sandbox_pod_options() -> None:
    values = values_of(CHART / "ci" / "sandbox-hardened-values.yaml")
    spec = sandbox_deployment(render(values))["spec"]["template"]["spec"]
    assert spec["hostUsers"] is False
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["securityContext"]["seccompProfile"] == {
        "type": "Localhost", "localhostProfile": "profiles/rewardd-sandbox.json"}
    assert spec["tolerations"][0]["key"] == "rewardd.dev/untrusted"
    assert spec["nodeSelector"] == {"rewardd.dev/pool": "sandbox"}
    assert spec["containers"][0]["securityContext"]["procMount"] == "Unmasked"
    default = sandbox_deployment(render())["spec"]["template"]["spec"]
    assert "hostUsers" not in default and "runtimeClassName" not in default
    assert default["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("values_file", [v for v in CI_VALUES if "sandbox: {enabled: false}"
                                         not in v.read_text()], ids=ci_id)
def test_sandbox_pods_take_no_ingress_and_reach_only_redis_and_dns(values_file: Path) -> None:
    docs = render(values_of(values_file))
    policies = [p for p in of_kind(docs, "NetworkPolicy").values()
                if p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
                == "worker-sandbox"]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    # the one way in: Prometheus, to the worker's exporter (never to anything else)
    (scrape,) = spec["ingress"]
    assert scrape["ports"] == [{"port": 9808, "protocol": "TCP"}]
    assert scrape["from"] == values_of(CHART / "values.yaml")["metrics"]["scrapers"]
    ports = sorted((p["port"], p["protocol"]) for rule in spec["egress"] for p in rule["ports"])
    assert ports == [(53, "TCP"), (53, "UDP"), (6379, "TCP")]
    dns_peers = [peer for rule in spec["egress"] if rule["ports"][0]["port"] == 53
                 for peer in rule["to"]]
    assert dns_peers == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]


def test_sandbox_pods_take_no_ingress_at_all_without_an_exporter() -> None:
    policy = of_kind(render({"metrics": {"workerPort": None}}), "NetworkPolicy")
    assert policy[f"{RELEASE}-rewardd-worker-sandbox"]["spec"]["ingress"] == []
    worker = next(containers(sandbox_deployment(render({"metrics": {"workerPort": None}}))))
    assert "ports" not in worker
    assert "REWARDD_WORKER_METRICS_PORT" not in {e["name"] for e in worker["env"]}


def test_scrape_config_passes_promtool_and_keeps_the_jobs_the_rules_name(tmp_path: Path) -> None:
    config_map = of_kind(render(), "ConfigMap")[f"{RELEASE}-rewardd-prometheus-scrape"]
    jobs = yaml.safe_load(config_map["data"]["scrape.yml"])
    assert [job["job_name"] for job in jobs] == ["rewardd-api", "rewardd-worker"]
    rules = (CHART.parents[1] / "prometheus" / "rules.yml").read_text()
    assert 'job="rewardd-worker"' in rules
    # Debian's Prometheus is built without Kubernetes discovery (promtool refuses the key):
    # static targets stand in for it, and promtool checks the rest of each job (relabelling)
    for job in jobs:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        job["static_configs"] = [{"targets": ["127.0.0.1:9808"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    done = subprocess.run([find_tool("promtool"), "check", "config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    worker = next(containers(sandbox_deployment(render())))
    assert worker["ports"] == [{"name": "metrics", "containerPort": 9808, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["REWARDD_WORKER_METRICS_PORT"] == "9808" and env["REWARDD_LOG_FORMAT"] == "json"


def test_network_policy_needs_redis_cidrs_with_an_external_redis() -> None:
    with pytest.raises(Exception, match="redisCIDRs"):
        render({"redis": {"external": {"url": "redis://redis.example:6379"}}})


def test_gpu_pool_asks_for_one_gpu_per_pod_and_one_model_per_process() -> None:
    values = values_of(CHART / "ci" / "sandbox-hardened-values.yaml")
    gpu = of_kind(render(values), "Deployment")[f"{RELEASE}-rewardd-worker-gpu"]
    container = next(containers(gpu))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["REWARDD_WORKER_CONCURRENCY"] == "1"
    assert env["REWARDD_MODEL_ROOTS"] == "/models"
    assert container["image"].startswith("rewardd-worker-gpu:")


def test_in_chart_redis_keeps_an_append_only_file_and_never_evicts() -> None:
    redis = of_kind(render(), "StatefulSet")[f"{RELEASE}-rewardd-redis"]
    command = next(containers(redis))["command"]
    flags = dict(zip(command[1::2], command[2::2]))
    assert flags["--appendonly"] == "yes" and flags["--maxmemory-policy"] == "noeviction"
    assert of_kind(render({"redis": {"external": {"url": "redis://r:6379"}},
                           "networkPolicy": {"redisCIDRs": ["10.0.0.0/8"]}}),
                   "StatefulSet") == {}


def test_secrets_reach_the_right_pods() -> None:
    values = values_of(CHART / "ci" / "keda-external-redis-values.yaml")
    docs = render(values)
    secrets = of_kind(docs, "Secret")
    assert secrets[f"{RELEASE}-rewardd-redis-url"]["stringData"]["url"] == values["redis"]["external"]["url"]
    deployments = of_kind(docs, "Deployment")
    api = next(containers(deployments[f"{RELEASE}-rewardd-api"]))
    env = {e["name"]: e for e in api["env"]}
    assert env["REWARDD_API_KEYS_FILE"]["value"] == "/etc/rewardd/api-keys/api-keys.json"
    assert env["REWARDD_BROKER_URL"]["value"] == "$(RD_REDIS_BASE_URL)/2"
    assert env["REWARDD_STATE_URL"]["value"] == "$(RD_REDIS_BASE_URL)/3"
    token_ref = {"secretKeyRef": {"name": f"{RELEASE}-rewardd-metrics-token", "key": "token"}}
    assert env["REWARDD_METRICS_TOKEN"]["valueFrom"] == token_ref
    assert secrets[f"{RELEASE}-rewardd-metrics-token"]["stringData"]["token"] == "scrape-me"
    scrape = yaml.safe_load(of_kind(docs, "ConfigMap")[f"{RELEASE}-rewardd-prometheus-scrape"]
                            ["data"]["scrape.yml"])
    assert scrape[0]["authorization"]["credentials_file"].endswith("/token")
    judge_ref = [{"secretRef": {"name": f"{RELEASE}-rewardd-judge-keys"}}]
    assert next(containers(deployments[f"{RELEASE}-rewardd-worker-cpu"]))["envFrom"] == judge_ref
    assert next(containers(deployments[f"{RELEASE}-rewardd-worker-gpu"]))["envFrom"] == judge_ref
    # untrusted code never shares a process environment with judge keys
    assert "envFrom" not in next(containers(deployments[f"{RELEASE}-rewardd-worker-sandbox"]))


def test_keda_scales_each_pool_on_its_queue_list_and_hpa_is_the_alternative() -> None:
    values = values_of(CHART / "ci" / "keda-external-redis-values.yaml")
    scaled = of_kind(render(values), "ScaledObject")
    assert set(scaled) == {f"{RELEASE}-rewardd-worker-{q}" for q in QUEUES}
    for queue in QUEUES:
        spec = scaled[f"{RELEASE}-rewardd-worker-{queue}"]["spec"]
        assert spec["scaleTargetRef"]["name"] == f"{RELEASE}-rewardd-worker-{queue}"
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == queue
        assert trigger["metadata"]["address"] == "redis.shared.svc.cluster.local:6380"
        assert trigger["metadata"]["databaseIndex"] == "2"
    hpa = of_kind(render(values_of(CHART / "ci" / "hpa-existing-secrets-values.yaml")),
                  "HorizontalPodAutoscaler")
    assert f"{RELEASE}-rewardd-worker-sandbox" in hpa and f"{RELEASE}-rewardd-api" in hpa
    deployments = of_kind(render({"autoscaling": {"mode": "keda"}}), "Deployment")
    assert "replicas" not in deployments[f"{RELEASE}-rewardd-worker-cpu"]["spec"]


def test_pod_disruption_budgets_cover_the_api_and_each_pool() -> None:
    budgets = of_kind(render(), "PodDisruptionBudget")
    assert set(budgets) == {f"{RELEASE}-rewardd-api", f"{RELEASE}-rewardd-worker-cpu",
                            f"{RELEASE}-rewardd-worker-sandbox"}


SECRET_STAND_INS = {"REWARDD_DATABASE_URL": "postgresql://rewardd@db.example:5432/rewardd"}
"""Values of secret-fed variables whose Secret the chart does not make (else Redis's URL)."""


def container_environments(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Literal environment of each rewardd container (secret-fed variables given the value of
    the Secret the chart renders, else a stand-in; Kubernetes' $(VAR) references expanded)."""
    secrets = {(name, key): value for name, secret in of_kind(docs, "Secret").items()
               for key, value in secret.get("stringData", {}).items()}
    out = {}
    for name, deployment in of_kind(docs, "Deployment").items():
        for container in containers(deployment):
            env = {}
            for e in container["env"]:
                if "value" in e:
                    env[e["name"]] = e["value"]
                    continue
                secret_ref = e["valueFrom"]["secretKeyRef"]
                stand_in = SECRET_STAND_INS.get(e["name"], "redis://redis.example:6379")
                env[e["name"]] = secrets.get((secret_ref["name"], secret_ref["key"]), stand_in)
            for key, value in env.items():
                for ref, sub in env.items():
                    value = value.replace(f"$({ref})", sub)
                env[key] = value
            out[name] = env
    return out


@pytest.mark.parametrize("values_file", CI_VALUES, ids=ci_id)
def test_every_rewardd_variable_the_chart_sets_is_a_valid_setting(
        values_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """rewardd refuses to start on an unknown REWARDD_* variable or a bad value: load the
    settings from each container's environment exactly as `rewardd serve`/`worker` do. The
    key file (mounted from a Secret in the pod) is read when settings load, so a file with
    a valid key ring stands in for the Secret at the path the chart names."""
    from rewardd.service.environment import load_settings
    from rewardd.service.records.store import database_url

    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"tenants": {"team": {"keys": ["k" * 32]}}}))
    for name, env in container_environments(render(values_of(values_file))).items():
        for key in [k for k in os.environ if k.startswith("REWARDD_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            if key == "REWARDD_API_KEYS_FILE":
                assert value.startswith("/etc/rewardd/"), (name, value)
                value = str(keys_file)
            monkeypatch.setenv(key, value)
        settings = load_settings()
        assert settings.broker_url and settings.broker_url.startswith("redis://"), name
        if settings.database_url:  # the record's engine takes it (connects on first use)
            assert "-worker-" not in name
            assert database_url(settings.database_url).drivername == "postgresql+psycopg"
        if "-worker-" in name:
            assert settings.worker_queue_names == [name.rsplit("-", 1)[1]]


def test_no_pool_may_scale_to_zero() -> None:
    """With no live consumer the API fails a queue's calls after REWARDD_NO_CONSUMER_GRACE_S
    (10 s), shorter than a pod start: the calls that woke a pool at zero would fail."""
    with pytest.raises(Exception, match="minReplicas"):
        render({"autoscaling": {"mode": "keda"},
                "workers": {"gpu": {"enabled": True, "autoscaling": {"minReplicas": 0,
                                                                      "maxReplicas": 4}}}})
    for values_file in CI_VALUES:
        for doc in of_kind(render(values_of(values_file)), "ScaledObject").values():
            assert doc["spec"]["minReplicaCount"] >= 1
