"""rewardd_client's typed errors and its server-sent event parser (no server needed; the
same against a real server: tests/e2e/test_client_jobs.py)."""

from __future__ import annotations

import pytest

from rewardd_client import (FieldError, InvalidRequest, JobEvent, JobFailed, NotFound,
                            PayloadTooLarge, RewarddError, ServerError, TooBusy, Unauthorized,
                            Unavailable)
from rewardd_client.errors import error_for
from rewardd_client.jobs import SSEParser


@pytest.mark.parametrize("status,cls", [
    (400, InvalidRequest), (415, InvalidRequest), (422, InvalidRequest), (401, Unauthorized),
    (403, Unauthorized), (404, NotFound), (413, PayloadTooLarge), (429, TooBusy),
    (503, Unavailable), (500, ServerError), (502, ServerError), (409, RewarddError)])
def test_each_status_has_its_class(status: int, cls: type[RewarddError]) -> None:
    error = error_for(status, "why")
    assert type(error) is cls
    assert (error.status, error.detail, error.attempts) == (status, "why", 1)


def test_invalid_request_names_every_field_path_and_reason() -> None:
    detail = [{"loc": ["body", "groups", 0, "rollouts", 1, "num_tokens"],
               "msg": "Input should be greater than or equal to 0", "type": "greater_than_equal"},
              {"loc": ["header", "Idempotency-Key"], "msg": "already used", "type": "x"}]
    error = error_for(422, detail)
    assert error.errors == [
        FieldError(("body", "groups", 0, "rollouts", 1, "num_tokens"),
                   "Input should be greater than or equal to 0", "greater_than_equal"),
        FieldError(("header", "Idempotency-Key"), "already used", "x")]
    assert [e.path for e in error.errors] == ["body.groups.0.rollouts.1.num_tokens",
                                             "header.Idempotency-Key"]
    assert str(error) == ("rewardd answered 422: body.groups.0.rollouts.1.num_tokens: Input "
                          "should be greater than or equal to 0; header.Idempotency-Key: "
                          "already used; fix the named fields and resend")
    assert error.detail is detail  # the raw detail is still there


def test_a_string_detail_has_no_field_errors() -> None:
    error = error_for(400, "body is not valid JSON: Expecting value")
    assert error.errors == []
    assert str(error) == ("rewardd answered 400: body is not valid JSON: Expecting value; "
                          "fix the named fields and resend")


def test_advice_says_what_to_do_next() -> None:
    assert str(error_for(401, "missing API key")).endswith(
        "pass a valid api_key (Authorization: Bearer <key>)")
    assert str(error_for(413, "over the limit")).endswith("split the batch into smaller requests")
    assert error_for(429, "busy", retry_after=2.0).retry_after == 2.0


def test_job_failed_carries_the_job() -> None:
    job = {"id": "abc", "state": "failed", "error": "executor lost"}
    error = JobFailed(job)
    assert error.status is None and error.job == job
    assert str(error) == "rewardd job abc ended failed: executor lost"
    assert str(JobFailed({"id": "abc", "state": "cancelled", "error": None})) == \
        "rewardd job abc ended cancelled: job abc cancelled"


def feed(lines: list[str]) -> list[JobEvent]:
    parser = SSEParser()
    return [event for line in lines if (event := parser.feed(line)) is not None]


def test_sse_parser_reads_the_servers_events_and_skips_keep_alives() -> None:
    lines = ["event: progress", 'data: {"done": 1, "total": 4}', "",
             ": keep-alive", "",
             "id: 3", "event: group", 'data: {"group_index": 0}', "",
             "id: 4", "event: succeeded", 'data: {"id": "j", "state": "succeeded"}', ""]
    assert feed(lines) == [JobEvent("progress", {"done": 1, "total": 4}, None),
                           JobEvent("group", {"group_index": 0}, 3),
                           JobEvent("succeeded", {"id": "j", "state": "succeeded"}, 4)]
    assert [e.final for e in feed(lines)] == [False, False, True]


def test_sse_parser_joins_data_lines_and_accepts_fields_without_a_space() -> None:
    assert feed(["id:7", "event:group", "data:[1,", "data: 2]", ""]) == \
        [JobEvent("group", [1, 2], 7)]
