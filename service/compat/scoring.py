"""Scoring per-sample protocol requests: each sample on its own, or with its group.

Without ``group`` in the compat configuration every sample is a one-rollout group of a
``/v1/rewards`` call (the same validation, executors, metrics and fallback rules), with the
other samples of its tenant waiting at that moment (:mod:`.batching`). With ``group``,
samples join their group in a standing streaming session (:mod:`.groups`): each is checked
on arrival, group-level verifiers (arenas) see the whole group, and the answer, sent when the
group is whole, carries the sample's group advantage (``/v1/score``'s on that group).

A per-sample protocol has no way to say "no reward" (OpenRLHF and slime crash on a null,
NeMo-Gym's ``reward`` is a float). A failed check is therefore either the component's
``fallback`` (reported as failed in the answer) or, without one, an error status:
422 naming the label when the label made a bad reference, 503 otherwise (both trainers
retry on errors).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Sequence

from rewardd.advantages.errors import RequestInvalid, error
from rewardd.service import heavy, pipeline
from rewardd.service.codec import validate_model
from rewardd.service.compat.config import CompatConfig, load_compat_config
from rewardd.service.compat.samples import SampleIn
from rewardd.service.errors import Unavailable
from rewardd.service.limits import Limiter, TenantBusy
from rewardd.service.models import RewardsRequest
from rewardd.service.runtime import Runtime
from rewardd.service.settings import Settings
from rewardd.service.tenancy import Tenant


@dataclass(frozen=True, slots=True)
class SampleOut:
    """One sample's result, as every protocol needs it."""

    reward: float
    """The weighted sum of components (fallbacks applied)."""
    rewards: dict[str, float | None]
    status: dict[str, Any]
    failed: tuple[str, ...] = ()
    """Components whose check failed and whose fallback was used."""
    advantage: float | None = None
    """The sample's group advantage (group mode with ``group.advantage``)."""
    group_size: int = 1
    """Samples scored together (less than ``group.size`` when the group timed out)."""
    timed_out: bool = False
    scored: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The rollout as the pipeline (or the standing session) answered it, evidence and all:
    what the run record keeps of the sample (:mod:`.recording`)."""
    placed: tuple[str, str] | None = None
    """Group mode: (group id, rollout id) the sample had in the standing session, the ids it
    is recorded under (None: scored alone, under ids of its own request's call)."""

    def value(self, which: str) -> float:
        """``reward`` or ``advantage``, as a protocol's option asks."""
        if which == "advantage" and self.advantage is not None:
            return self.advantage
        return self.reward

    @property
    def failure(self) -> tuple[str, str] | None:
        """(kind, reason) of the first failed component, or None."""
        for name in self.failed:
            cell = self.status.get(name) or {}
            return str(cell.get("error")), f"{name}: {_reason(cell)}"
        return None


def _reason(cell: dict[str, Any]) -> str:
    """A failed cell's reason, for a person: its detail's message, else its kind."""
    detail = cell.get("detail") or {}
    return str(detail.get("message") or detail.get("reason") or cell.get("error"))


def compat_config(settings: Settings) -> CompatConfig:
    """The app's compat configuration (validated when its settings loaded)."""
    return load_compat_config(settings.compat_config)


def remap(exc: RequestInvalid, samples: Sequence[SampleIn], one_group: bool) -> RequestInvalid:
    """Errors of the request built from the samples, located at the protocol's fields: a
    bad reference at the label that made it, anything else at the body."""
    errors = []
    for e in exc.errors:
        loc = e["loc"]
        if len(loc) > 3 and loc[1] == "groups" and loc[3] == "reference":
            for sample in (samples if one_group else [samples[loc[2]]]):
                errors.append(error(sample.label_loc, f"the reference this label makes: "
                                    f"{'.'.join(map(str, loc[4:]))} {e['msg']}".replace(
                                        ":  ", ": ")))
        else:
            errors.append(error(("body",), f"{'.'.join(map(str, loc[1:]))}: {e['msg']} "
                                "(REWARDD_COMPAT_CONFIG)"))
    return RequestInvalid(errors)


def outcome(rollout: dict[str, Any], sample: SampleIn, group_size: int, timed_out: bool,
            placed: tuple[str, str] | None = None) -> SampleOut | Exception:
    """A rollout of a pipeline response as a :class:`SampleOut`, or the error its sample
    answers (a failed check without fallback); ``placed``: where group mode put it."""
    status = rollout["status"]
    failed = tuple(name for name, cell in status.items() if not cell["ok"])
    if rollout["reward"] is None:
        kinds = {name: status[name]["error"] for name in failed}
        if any(kind == "invalid_reference" for kind in kinds.values()):
            return RequestInvalid([error(sample.label_loc, "the label makes no valid "
                                         "reference: " + "; ".join(
                                             f"{n} ({kinds[n]}): {_reason(status[n])}"
                                             for n in failed))])
        failures = ", ".join(f"{n}: {k}" for n, k in kinds.items())
        return Unavailable(f"the check failed ({failures}) and its component has no "
                           "fallback; retry, or give the component a fallback in "
                           "REWARDD_COMPAT_CONFIG", retry_after_s=1)
    advantage = rollout.get("advantages")
    return SampleOut(reward=rollout["reward"], rewards=rollout["rewards"], status=status,
                     failed=failed, advantage=advantage if isinstance(advantage, float) else None,
                     group_size=group_size, timed_out=timed_out, scored=rollout, placed=placed)


async def score_each(samples: Sequence[SampleIn], config: CompatConfig, runtime: Runtime,
                     tenant: str) -> list[SampleOut | Exception]:
    """Each sample as its own one-rollout group, all in one /v1/rewards call. A sample whose
    reference the checks refuse gets its 422 and the others are scored without it (the
    samples come from several trainer requests: one bad label must not fail the rest)."""
    if not samples:
        return []
    # building and validating the request is O(samples) of CPU (60,000 samples held the
    # event loop for seconds): off the loop, in the heavy lane for a heavy batch
    req = await heavy.offload(rewards_request, samples, config)
    try:
        body = await pipeline.rewards(req, runtime.executor, runtime.settings,
                                      cache=runtime.verdicts.view(tenant))
    except RequestInvalid as exc:
        if not all(len(e["loc"]) > 2 and e["loc"][1] == "groups" for e in exc.errors):
            return [remap(exc, samples, one_group=False)] * len(samples)  # not one sample's
        bad = {e["loc"][2] for e in exc.errors}
        rest = [i for i in range(len(samples)) if i not in bad]
        outs: list[SampleOut | Exception] = [
            remap(RequestInvalid([e for e in exc.errors if e["loc"][2] == i]), samples,
                   one_group=False) if i in bad else None  # type: ignore[misc]
            for i in range(len(samples))]
        for i, out in zip(rest, await score_each([samples[i] for i in rest], config, runtime,
                                                 tenant)):
            outs[i] = out
        return outs
    return await heavy.offload(outcomes, body, samples)


def rewards_request(samples: Sequence[SampleIn], config: CompatConfig) -> RewardsRequest:
    """The /v1/rewards request of ``samples``, each a one-rollout group (CPU-bound). No
    canaries: the protocols answer per-sample rewards, with no summary to report them in."""
    return validate_model(RewardsRequest, {"rewards": config.rewards, "canaries": False,
                                           "groups": [
        {"group_id": str(i), "prompt": s.prompt, "reference": s.reference,
         "rollouts": [{"rollout_id": str(i), "completion": s.completion}]}
        for i, s in enumerate(samples)]})


def outcomes(body: dict[str, Any], samples: Sequence[SampleIn]) -> list[SampleOut | Exception]:
    """Each sample's outcome from the /v1/rewards answer of :func:`rewards_request`."""
    return [outcome(group["rollouts"][0], sample, 1, False)
            for group, sample in zip(body["groups"], samples)]


def raise_first(outs: Sequence[SampleOut | BaseException]) -> list[SampleOut]:
    """The results, or the first sample's error (a request answers one status)."""
    for out in outs:
        if isinstance(out, BaseException):
            raise out
    return list(outs)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def slot_when_free(limiter: Limiter, tenant: Tenant) -> AsyncIterator[None]:
    """A tenant slot for work the server already accepted (a batch of samples, a whole
    group): waited for when the tenant is at its limit, never refused."""
    async with contextlib.AsyncExitStack() as stack:
        while True:
            try:
                await stack.enter_async_context(limiter.hold(tenant))
                break
            except TenantBusy:
                await asyncio.sleep(SLOT_POLL_S)
        yield


SLOT_POLL_S = 0.05
"""How often work waiting for its tenant's slot asks again."""
