"""The service makes every request and every job one flow of the executors' fair queue
(``service/limits.py`` ``hold``, ``service/jobs/runner.py``): a recording executor sees the
flow each ``run`` was called in."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from rewardd.workers.executor import CallResult, ItemResult, VerifyCall
from rewardd.workers.fairness import DEFAULT_FLOW, Flow, current_flow
from rewardd.verifiers.base import Outcome
from tests.support.executors import RefusingExecutor
from tests.support.jobs import final
from tests.unit.test_tenancy import ALICE, client, keyed_app, score_body

BOB = {"Authorization": "Bearer key-bob"}


class FlowRecorder(RefusingExecutor):
    """Rewards every check 1.0 and records the flow of each ``run``."""

    kind = "flow-recorder"

    def __init__(self) -> None:
        super().__init__()
        self.flows: list[Flow] = []

    async def run(self, calls: Sequence[VerifyCall], progress: Any = None,
                  on_call_done: Any = None) -> list[CallResult]:
        self.flows.append(current_flow())
        results = [CallResult([ItemResult(Outcome.success(1.0), 0.0) for _ in call.samples])
                   for call in calls]
        for index, result in enumerate(results):
            if progress is not None:
                progress(len(result.items))
            if on_call_done is not None:
                on_call_done(index, result)
        return results


def uncached() -> dict[str, Any]:
    """A batch that reaches the executor each time (the verdict cache would answer)."""
    return {**score_body(), "cache": False}


def test_each_request_and_each_job_is_a_flow_of_its_tenant() -> None:
    recorder = FlowRecorder()
    app = keyed_app(recorder)

    async def main() -> str:
        async with client(app) as http:
            for headers in (ALICE, ALICE, BOB):
                r = await http.post("/v1/score", json=uncached(), headers=headers)
                assert r.status_code == 200, r.text
            r = await http.post("/v1/verify/exact_match", headers=BOB,
                                json={"completion": "1", "reference": {"answer": "1"}})
            assert r.status_code == 200, r.text
            r = await http.post("/v1/jobs", json=uncached(), headers=ALICE)
            assert r.status_code in (200, 201, 202), r.text
            job_id = r.json()["id"]
            assert (await final(http, job_id, ALICE))["state"] == "succeeded"
            return job_id

    job_id = asyncio.run(main())
    assert [f.tenant for f in recorder.flows] == ["alice", "alice", "bob", "bob", "alice"]
    assert len({f.id for f in recorder.flows}) == 5  # one flow per request, none shared
    assert DEFAULT_FLOW not in recorder.flows
    assert recorder.flows[-1] == Flow(job_id, "alice")
