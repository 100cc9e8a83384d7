"""One completion through one verifier, for debugging (REST ``POST /v1/verify/{verifier}``
and gRPC ``Verify``): the same validation, limits and executors as a batch."""

from __future__ import annotations

import asyncio
from typing import Any

from rewardd.advantages.checks import raise_if, validate_params
from rewardd.service.errors import NotFound
from rewardd.service.models import VerifyRequest
from rewardd.service.pipeline import call_timeout, run_calls
from rewardd.service.settings import Settings
from rewardd.service.validation import check_timeout, reference_errors
from rewardd.verifiers import Sample, Verifier, get_verifier
from rewardd.verifiers.structured_match import check_budget
from rewardd.workers.executor import Executor, VerifyCall


def known_verifier(name: str) -> Verifier:
    """The registered verifier ``name``; :class:`NotFound` naming the known ones."""
    try:
        return get_verifier(name)
    except KeyError as exc:
        raise NotFound(exc.args[0]) from None


async def verify_one(verifier: str, req: VerifyRequest, settings: Settings,
                     executor: Executor) -> dict[str, Any]:
    """One validated item through ``verifier`` (a registered name): its outcome as the
    response body."""
    impl = known_verifier(verifier)
    # off the event loop: validating params may compile a request's regex (megabytes), and
    # checking a reference may check a JSON Schema against its metaschema
    raise_if(await asyncio.to_thread(_request_errors, impl, req, settings)
             + check_timeout(req.timeout_s, settings, ("body", "timeout_s")))
    call = VerifyCall(verifier, (Sample(req.completion, req.prompt, req.num_tokens),),
                      req.reference, req.params, call_timeout(req.timeout_s, settings))
    [result] = await run_calls([call], executor)
    [item] = result.items
    return item.outcome.to_dict()


def _request_errors(impl: Verifier, req: VerifyRequest, settings: Settings) -> list[dict]:
    """The request's params and reference against what ``impl`` documents: the same 422s a
    batch gets at ``body.rewards[i].params`` and ``body.groups[i].reference``, with the same
    bound on the API CPU its JSON Schema checks take."""
    with check_budget(settings.max_schema_check_cpu_s):
        return (validate_params(impl.Params, req.params, ("body", "params"))
                + reference_errors(impl, req.reference, ("body", "reference"), settings))
