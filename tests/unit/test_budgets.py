"""Per-tenant budgets: a hold past its bound is refused naming the bound and its setting,
nothing is taken by a refusal, holds are given back however a block ends, and the current
use is exported per tenant and bound."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rewardd.service.app import create_app
from rewardd.service.budgets import Bound, TenantBudgets
from rewardd.service.errors import Busy
from rewardd.service.settings import Settings
from tests.support.executors import GatedExecutor

STREAMS = Bound("open event streams", 2, "REWARDD_TENANT_MAX_STREAMS")


def test_a_hold_past_the_bound_is_refused_naming_it_and_takes_nothing() -> None:
    budgets = TenantBudgets(retry_after_s=3)
    budgets.take("alice", STREAMS)
    with pytest.raises(Busy) as refused:
        budgets.take("alice", STREAMS, 2)
    assert refused.value.status == 429 and refused.value.retry_after_s == 3
    assert "REWARDD_TENANT_MAX_STREAMS" in str(refused.value)
    assert "open event streams" in str(refused.value) and refused.value.tenant == "alice"
    assert budgets.held("alice", STREAMS) == 1  # the refusal took nothing
    budgets.take("bob", STREAMS, 2)  # another tenant's budget is its own
    assert budgets.usage() == {("alice", "open event streams"): 1,
                               ("bob", "open event streams"): 2}


def test_a_hold_is_given_back_when_its_block_raises() -> None:
    budgets = TenantBudgets(retry_after_s=1)
    with pytest.raises(RuntimeError):
        with budgets.hold("alice", STREAMS, 2):
            assert budgets.held("alice", STREAMS) == 2
            raise RuntimeError("the stream broke")
    assert budgets.held("alice", STREAMS) == 0 and budgets.usage() == {}


def test_the_metrics_export_what_each_tenant_holds() -> None:
    app = create_app(Settings(), executor=GatedExecutor())
    app.state.services.runtime.budgets.take("default", STREAMS)
    with TestClient(app) as http:
        text = http.get("/metrics").text
    assert 'rewardd_tenant_held{bound="open event streams",tenant="default"} 1.0' in text
