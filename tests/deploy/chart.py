"""Rendering deploy/helm/rewardd offline with Helm's own engine, for the deploy tests.

No helm binary can be installed here (its releases come from GitHub only), so the chart is
linted and rendered through helm-python-sdk: Helm v4's Go packages (lint, the template engine,
values.schema.json validation) in a shared library. What `helm lint --strict` and
`helm template` run is the same code.

helm_python is imported on first use, not at import: `make test` collects this directory
(and deselects it by marker) on machines without the deploy tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rewardd"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE, NAMESPACE = "rd", "ml"


def helm() -> Any:
    """The helm_python module (helm-python-sdk); fails the test when it is not installed."""
    try:
        import helm_python
    except ImportError:
        pytest.fail("helm-python-sdk is not installed: run `make deploy-deps`")
    return helm_python


def values_of(path: Path) -> dict[str, Any]:
    return helm().values_from_yaml(path.read_text()) or {}


def lint(values: dict[str, Any], **options: Any) -> dict[str, Any]:
    """`helm lint` of the chart with ``values`` (options: strict, kube_version, namespace)."""
    return helm().lint(CHART, values, **options)


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest the chart renders for ``values`` (as `helm template rd -n ml`)."""
    chart = helm().Chart.load(CHART)
    out = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def render_text(values: dict[str, Any] | None = None) -> str:
    return "\n---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in render(values))


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def containers(deployment: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from deployment["spec"]["template"]["spec"]["containers"]


def sandbox_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return of_kind(docs, "Deployment")[f"{RELEASE}-rewardd-worker-sandbox"]
