"""The run record of per-sample protocol requests: the run a request names, and its samples
recorded through the app's recorder, as ``/v1/rewards`` records a batch.

The trainers' bodies carry no run, and a trainer sets no header of its own; what a user does
write is the URL the trainer posts to. So a request names its run in the query,
``?run_id=exp-7&step=812`` (OpenRLHF ``--reward.remote_url``, slime ``--rm-url``), and
``run_id`` of ``REWARDD_COMPAT_CONFIG`` names it for every request that does not, for a
trainer whose URL is only a host and port (NeMo-Gym posts to ``host:port/verify``). Without
either nothing is recorded. The step is the query's (a trainer's URL does not change per
step, so it is there only when a client or a proxy sets it).

Each request records its own samples once they are answered, under its own run and step:
samples scored in one call with other requests' (:mod:`.batching`) or in one group with them
(:mod:`.groups`) are recorded once each, by the request that brought them. A request that
answers an error (a check without fallback, a bad label) records nothing: the trainer sends
it again. The ids are the compat layer's: in group mode the sample's group and rollout in the
standing session (``<prompt and label digest>.<generation>``, a fresh id); scored alone, the
digest of its prompt and label (the samples of one prompt share it) and a fresh id.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Sequence

from rewardd.service.compat.config import CompatConfig
from rewardd.service.compat.groups import group_key
from rewardd.service.compat.samples import SampleIn
from rewardd.service.compat.scoring import SampleOut
from rewardd.advantages.models import Group, Rollout
from rewardd.service.pipeline import BatchRecorder


@dataclass(frozen=True, slots=True)
class NamedRun:
    """The run (and step) a per-sample request's samples are recorded under."""

    run_id: str
    step: int | None = None

    @classmethod
    def of(cls, run_id: str | None, step: int | None, config: CompatConfig
           ) -> NamedRun | None:
        """The request's run (its query's), else the configuration's; None: not recorded
        (a step alone names no run, as on /v1/score)."""
        chosen = run_id or config.run_id
        return cls(chosen, step) if chosen else None


def record_samples(record: BatchRecorder, run: NamedRun, samples: Sequence[SampleIn],
                   outs: Sequence[SampleOut], config: CompatConfig) -> int:
    """Hand one request's answered samples to the record (queued, never raises), with the
    configuration's reward components (what replay runs again); returns how many were
    accepted. O(samples): run off the event loop for a heavy request."""
    groups = [recorded_group(sample, out) for sample, out in zip(samples, outs)]
    body = {"groups": [{"rollouts": [out.scored]} for out in outs]}
    return record(run.run_id, run.step, groups, body, rewards=config.rewards)


def recorded_group(sample: SampleIn, out: SampleOut) -> Group:
    """The sample as the one-rollout group the record reads (ids as the module docstring
    says; the completion is kept as REWARDD_RECORD_COMPLETIONS says). Built without
    validation: every field comes from a sample the scoring already took."""
    group_id, rollout_id = out.placed or (group_key(sample), uuid.uuid4().hex)
    rollout = Rollout.model_construct(rollout_id=rollout_id, completion=sample.completion)
    return Group.model_construct(group_id=group_id, prompt=sample.prompt,
                                 reference=sample.reference, rollouts=[rollout])
