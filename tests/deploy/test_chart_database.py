"""The chart's run-record database (values `database`): nothing by default (SQLite in each
API pod), your PostgreSQL by URL or existing Secret, or an in-chart PostgreSQL for trials; in
every case the API pods read REWARDD_DATABASE_URL from a Secret, never from plain text.

The CI values files cover the three ways too (kubernetes-validate, lint, the settings check
of every container's environment in test_chart.py); this file asserts what each renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from rewardd.service.records.store import database_url
from tests.deploy.chart import CHART, CI_VALUES, RELEASE, containers, of_kind, render, values_of
from tests.deploy.conftest import DEPLOY

pytestmark = pytest.mark.deploy

API = f"{RELEASE}-rewardd-api"
POSTGRES = f"{RELEASE}-rewardd-postgresql"
EXTERNAL_URL = "postgresql://rewardd:s3cret@pg.shared.svc:5432/rewardd"


def env_of(docs: list[dict[str, Any]], deployment: str) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in next(containers(of_kind(docs, "Deployment")[deployment]))["env"]}


def database_objects(docs: list[dict[str, Any]]) -> list[str]:
    return [f"{doc['kind']}/{doc['metadata']['name']}" for doc in docs
            if "postgresql" in doc["metadata"]["name"] or "database" in doc["metadata"]["name"]]


def url_env_of_each_deployment(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    return {name: env_of(docs, name).get("REWARDD_DATABASE_URL")
            for name in of_kind(docs, "Deployment")}


@pytest.mark.parametrize("values_file", [v for v in CI_VALUES if "database" not in v.read_text()],
                         ids=lambda path: path.stem)
def test_without_a_database_nothing_is_added_and_sqlite_lives_in_the_api_pods_tmp(
        values_file: Path) -> None:
    docs = render(values_of(values_file))
    assert database_objects(docs) == []
    assert set(url_env_of_each_deployment(docs).values()) == {None}
    api = of_kind(docs, "Deployment")[API]["spec"]["template"]["spec"]
    # rewardd's data dir defaults under $HOME, /tmp in the image: a writable, per-pod volume
    assert {"name": "tmp", "mountPath": "/tmp"} in api["containers"][0]["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {}} in api["volumes"]


def test_in_chart_postgresql_for_trials() -> None:
    values = {"database": {"postgresql": {"enabled": True, "persistence": {
        "size": "4Gi", "storageClassName": "fast"}}}}
    docs = render(values)
    assert sorted(database_objects(docs)) == [f"{kind}/{POSTGRES}" for kind in
                                              ("NetworkPolicy", "Secret", "Service", "StatefulSet")]
    stateful_set = of_kind(docs, "StatefulSet")[POSTGRES]
    assert stateful_set["spec"]["replicas"] == 1
    (claim,) = stateful_set["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "4Gi"
    (postgres,) = containers(stateful_set)
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    assert postgres["image"] == compose["services"]["postgres"]["image"]  # one pinned tag
    assert postgres["readinessProbe"]["exec"]["command"][0] == "pg_isready"
    assert {"name": "data", "mountPath": "/var/lib/postgresql/data"} in postgres["volumeMounts"]
    assert postgres["resources"] == values_of(CHART / "values.yaml")["database"]["postgresql"][
        "resources"]

    # password authentication everywhere, the password from the Secret the URL is built with
    env = {e["name"]: e for e in postgres["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": POSTGRES,
                                                                     "key": "password"}
    assert env["POSTGRES_HOST_AUTH_METHOD"]["value"] == "scram-sha-256"
    assert "trust" not in str(postgres["env"])
    secret = of_kind(docs, "Secret")[POSTGRES]["stringData"]
    password = secret["password"]
    assert len(password) >= 32 and password.isalnum()

    # the API pods (the only ones that record) read the URL from that Secret
    urls = url_env_of_each_deployment(docs)
    assert urls.pop(API) == {"name": "REWARDD_DATABASE_URL",
                             "valueFrom": {"secretKeyRef": {"name": POSTGRES, "key": "url"}}}
    assert set(urls.values()) == {None}
    url = urlsplit(secret["url"])
    service = of_kind(docs, "Service")[POSTGRES]
    assert (url.hostname, url.port) == (service["metadata"]["name"],
                                        service["spec"]["ports"][0]["port"])
    assert (url.username, url.password, url.path) == ("rewardd", password, "/rewardd")
    assert database_url(secret["url"]).drivername == "postgresql+psycopg"

    # only the API pods may connect
    (rule,) = of_kind(docs, "NetworkPolicy")[POSTGRES]["spec"]["ingress"]
    assert rule["ports"] == [{"port": 5432, "protocol": "TCP"}]
    assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for peer in rule["from"]] == ["api"]


def test_a_given_password_is_used() -> None:
    docs = render({"database": {"postgresql": {"enabled": True, "password": "Trial-pw_1"}}})
    secret = of_kind(docs, "Secret")[POSTGRES]["stringData"]
    assert secret["password"] == "Trial-pw_1"
    assert urlsplit(secret["url"]).password == "Trial-pw_1"


def test_an_external_url_is_kept_in_a_secret() -> None:
    docs = render({"database": {"url": EXTERNAL_URL}})
    name = f"{RELEASE}-rewardd-database-url"
    assert database_objects(docs) == [f"Secret/{name}"]
    assert of_kind(docs, "Secret")[name]["stringData"] == {"url": EXTERNAL_URL}
    ref = env_of(docs, API)["REWARDD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": name, "key": "url"}
    assert EXTERNAL_URL not in str(of_kind(docs, "Deployment"))


def test_an_existing_secret_is_referenced() -> None:
    docs = render({"database": {"existingSecret": "team-db", "urlKey": "dsn"}})
    assert database_objects(docs) == []
    ref = env_of(docs, API)["REWARDD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "team-db", "key": "dsn"}


@pytest.mark.parametrize("database", [
    {"url": EXTERNAL_URL, "postgresql": {"enabled": True}},
    {"existingSecret": "team-db", "postgresql": {"enabled": True}},
    {"url": EXTERNAL_URL, "existingSecret": "team-db"},
], ids=["url-and-in-chart", "secret-and-in-chart", "url-and-secret"])
def test_two_databases_at_once_fail(database: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="database: set one of database.url, "
                                        "database.existingSecret .* not several"):
        render({"database": database})


@pytest.mark.parametrize("database, field", [
    ({"url": "mysql://db.example/rewardd"}, "/database/url"),
    ({"postgresql": {"enabled": True, "password": "p@ss/word"}}, "/database/postgresql/password"),
])
def test_the_schema_refuses_what_the_url_cannot_carry(database: dict[str, Any],
                                                      field: str) -> None:
    with pytest.raises(Exception, match=field):
        render({"database": database})


def test_ci_values_cover_each_way() -> None:
    ways = [values_of(path).get("database", {}) for path in CI_VALUES]
    assert any(d.get("url") for d in ways)
    assert any(d.get("existingSecret") for d in ways)
    assert any(d.get("postgresql", {}).get("enabled") for d in ways)
