"""Issue 21 B: series whose source is unreachable stay present. A real Celery executor whose
broker is a closed port: the census, the queue depths and the broker probe all fail, and the
scrape still carries every routed queue's ``rewardd_workers`` (0) and says which sources
failed; the API's tenant label and build info."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rewardd.service import metrics
from rewardd.service.settings import Settings
from rewardd.workers.distributed import CeleryExecutor
from tests.support.server import free_port


def scrape(executor: CeleryExecutor) -> dict[str, dict[tuple, float]]:
    text, _ = metrics.render(None, executor)
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_unreachable_broker_keeps_queue_series_at_zero_and_says_so() -> None:
    settings = Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    executor = CeleryExecutor(settings)
    try:
        scraped = scrape(executor)
    finally:
        executor.close()
    queues = {"cpu", "sandbox", "gpu"}
    for name in ("rewardd_workers", "rewardd_queue_depth", "rewardd_tasks_unacked",
                 "rewardd_queue_oldest_age_seconds", "rewardd_calls_pending"):
        assert {dict(labels)["queue"] for labels in scraped[name]} == queues, name
        assert set(scraped[name].values()) == {0.0}, name
    up = {dict(labels)["source"]: value
          for labels, value in scraped["rewardd_metrics_source_up"].items()}
    # (a job counter another test's app registered may add "jobs")
    assert {k: up[k] for k in ("broker", "census", "queue_depth")} == \
        {"broker": 0.0, "census": 0.0, "queue_depth": 0.0}


def test_tenant_label_is_the_resolved_tenant_or_none() -> None:
    class Named:
        name = "alpha"

    assert metrics.tenant_label({"state": {"tenant": Named()}}) == "alpha"
    assert metrics.tenant_label({"state": {}}) == metrics.NO_TENANT
    assert metrics.tenant_label({}) == metrics.NO_TENANT


def test_build_info_names_the_api_role() -> None:
    text, _ = metrics.render(None)
    line = [s for f in text_string_to_metric_families(text.decode()) for s in f.samples
            if s.name == "rewardd_build_info"]
    assert [s.labels["role"] for s in line] == ["api"] and line[0].value == 1
