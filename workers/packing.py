"""Packing verifier calls into Celery tasks: big groups split, small groups packed together.

A task costs the same few milliseconds of CPU however little it carries (publishing,
Celery's tracing in the worker, storing and reading its result): about 7 ms on a small VM,
as much as checking a dozen math answers. One task per group therefore spends a large share
of a batch of cheap groups on the broker. So the executor packs several groups (of the same
verifier, parameters and limit) into one task when the batch has far more groups than the
workers have slots, and splits a group that would not fit in one task.

How many samples a pack holds comes from the batch and the fleet: enough that the batch
becomes about :data:`TASKS_PER_SLOT` tasks per worker slot of its queue, never more than
the task size bound (:func:`~rewardd.workers.celery_app.max_samples_per_task`). With few groups or
many workers no packing happens (a group per task, as much parallelism as there are
slots); with many groups on few slots the per-task cost is paid a few times per slot
instead of once per group. Packing never changes results: each group is checked exactly as
alone, with its own reference, and a pack that fails as a whole is replayed one sample per
task like a group.

Written here rather than taken from Celery: ``celery.chunks`` splits one task's argument
list into equal chunks of a fixed size, but knows neither groups with their own references
nor the time bound each task must respect.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from rewardd.verifiers.base import Sample
from rewardd.workers.executor import VerifyCall, hard_limit_for, keeps_group_whole

TASKS_PER_SLOT = 4
"""Target tasks per worker slot of a queue when packing: the last task to finish holds at
most about a quarter of a slot's share of the batch (the tail), while the fixed cost per task
is paid four times per slot instead of once per group."""


@dataclass(frozen=True, slots=True)
class Part:
    """Samples ``offset .. offset + len(call.samples)`` of call ``call_index``."""

    call_index: int
    offset: int
    call: VerifyCall


@dataclass(frozen=True, slots=True)
class Pack:
    """The parts one task carries: the same verifier, parameters and limit, each part with
    its own reference. Quacks like a :class:`VerifyCall` where the executor needs one
    (``verifier``, ``samples``, ``timeout_s``, :meth:`hard_limit_s`, :meth:`one`)."""

    parts: tuple[Part, ...]
    samples: tuple[Sample, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples",
                           tuple(s for part in self.parts for s in part.call.samples))

    @property
    def verifier(self) -> str:
        return self.parts[0].call.verifier

    @property
    def timeout_s(self) -> float:
        return self.parts[0].call.timeout_s

    def task_args(self) -> tuple[Any, ...]:
        """Arguments of :func:`rewardd.workers.tasks.verify_groups_task`."""
        first = self.parts[0].call
        groups = [[[_sample_dict(s) for s in part.call.samples], dict(part.call.reference),
                   *([dict(part.call.context)] if part.call.context is not None else [])]
                  for part in self.parts]
        return (first.verifier, groups, dict(first.params), first.timeout_s)

    def hard_limit_s(self) -> float:
        return hard_limit_for(len(self.samples), self.timeout_s)

    def one(self, index: int) -> Pack:
        """The pack of sample ``index`` alone (to replay a pack that failed as a whole)."""
        for part in self.parts:
            if index < len(part.call.samples):
                return Pack((Part(part.call_index, part.offset + index,
                                  part.call.one(index)),))
            index -= len(part.call.samples)
        raise IndexError("sample index out of range")


def _sample_dict(sample: Sample) -> dict[str, Any]:
    return {"completion": sample.completion, "prompt": sample.prompt,
            "num_tokens": sample.num_tokens}


def split(call_index: int, call: VerifyCall, size: int) -> list[Part]:
    """``call`` as parts of at most ``size`` samples (a group-level verifier's call is never
    split: :func:`plan` gives it a task of its own)."""
    if len(call.samples) <= size:
        return [Part(call_index, 0, call)]
    return [Part(call_index, i, replace(call, samples=call.samples[i:i + size]))
            for i in range(0, len(call.samples), size)]


def pack_target(samples: int, slots: int | None, bound: int) -> int:
    """Samples per pack for a batch of ``samples`` samples on a queue with ``slots`` worker
    slots: about :data:`TASKS_PER_SLOT` tasks per slot, at most ``bound``. 0 (do not pack)
    when the fleet is unknown."""
    if not slots or slots <= 0:
        return 0
    return min(bound, math.ceil(samples / (TASKS_PER_SLOT * slots)))


def plan(calls: Sequence[VerifyCall], max_samples: Callable[[float], int],
         targets: Mapping[str, int],
         fit_group_timeout: Callable[[int, float], float] | None = None) -> list[Pack]:
    """The tasks that run ``calls``: each call split into parts of at most
    ``max_samples(timeout_s)`` samples, then parts of the same verifier, parameters and limit
    packed in call order while a pack holds fewer than ``targets[verifier]`` samples (a part
    never pushes a pack past ``max_samples``). A verifier absent from ``targets`` (or with a
    target of 0 or 1) is not packed: one part per task.

    A group-level verifier's call is one task of its own, never split and never packed: its
    groups are few and slow, and a pack that failed as a whole (a dead worker, a hard limit)
    could not be replayed group by group without asking the judge again for the groups that
    had finished. Since it cannot be split, ``fit_group_timeout(samples, timeout_s)`` may
    lower its per-sample timeout so that the task still ends in time (the broker's
    visibility timeout)."""
    packs: list[Pack] = []
    open_parts: dict[tuple[str, float, str], list[Part]] = {}
    open_size: dict[tuple[str, float, str], int] = {}
    params_keys: dict[int, str] = {}  # the calls of one reward component share params

    def close(key: tuple[str, float, str]) -> None:
        parts = open_parts.pop(key, None)
        open_size.pop(key, None)
        if parts:
            packs.append(Pack(tuple(parts)))

    for index, call in enumerate(calls):
        if keeps_group_whole(call.verifier):
            if fit_group_timeout is not None:
                call = replace(call, timeout_s=fit_group_timeout(len(call.samples),
                                                                 call.timeout_s))
            packs.append(Pack((Part(index, 0, call),)))
            continue
        bound = max_samples(call.timeout_s)
        target = min(targets.get(call.verifier, 0), bound)
        for part in split(index, call, bound):
            n = len(part.call.samples)
            if target <= 1 or n >= target:
                packs.append(Pack((part,)))
                continue
            params_key = params_keys.get(id(call.params))
            if params_key is None:
                params_key = params_keys[id(call.params)] = json.dumps(
                    call.params, sort_keys=True, default=repr)
            key = (call.verifier, call.timeout_s, params_key)
            parts = open_parts.get(key)
            if parts and open_size[key] + n > bound:
                close(key)
                parts = None
            if parts is None:
                open_parts[key], open_size[key] = [part], n
            else:
                parts.append(part)
                open_size[key] += n
            if open_size[key] >= target:
                close(key)
    for key in list(open_parts):
        close(key)
    return packs
