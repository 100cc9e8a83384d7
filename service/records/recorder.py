"""From a scored batch to the record: :class:`Recorder`, one per app.

A batch is recorded when its request names a ``run_id`` (and REWARDD_RECORD_RUNS is on):
:meth:`Recorder.record_batch` hands the request's groups and the response the trainer gets to
the writer (:mod:`.writer`), whose thread turns them into one row per rollout
(:func:`batch_rows`: a :class:`~rewardd.service.records.store.RolloutRow`, the table's layout
with its JSON documents serialized once, about 2.5 ms of CPU per 512 rollouts, and the
batch's step statistics, :mod:`~rewardd.service.stepstats`, about 4.5 ms) and writes them:
the request pays one append (measured: building the records of a 512-rollout answer took
9.5 ms, 5% of the request, when it ran on the request's thread). The response must not change afterwards: every
path renders or stores it as it is. The database is opened on first use, not when the app starts: an app that never sees
a ``run_id`` never touches it, and a database that is down at start costs nothing until then
(the writer retries; queries answer 503).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rewardd.service.records.models import FAILED, OK, ComponentInput, GroupInputs, Retention
from rewardd.service.records.store import RecordStore, RolloutRow, dumps
from rewardd.service.records.writer import DropCounter, RecordWriter, WriterHealth
from rewardd.service import metrics, sentinel
from rewardd.service.settings import Settings
from rewardd.service.stepstats import batch_stats
from rewardd.verifiers.receipts import digest

log = logging.getLogger(__name__)

MAX_WATCHED_RUNS = 1_000
"""Runs per tenant whose active alerts a process remembers (the tenant's least recently
written go first: one tenant's many runs never push out another's)."""

MAX_KEPT_RUNS = 256
"""A rollout's per-token advantages are kept in its summary (``advantages``: run-length
encoded, the inspector's strip) up to this many runs; a longer encoding (token-level
estimators over long completions) keeps only its length (``advantage_runs``): the record
stays about its verdicts, not a copy of every advantage."""

ROLLOUT_OVERHEAD_BYTES = 2048
"""What a queued rollout holds besides its completion (its request and response objects),
for the queue's byte bound; an estimate, on the high side."""


class Recorder:
    """The app's record: a lazily opened store, its writer, and the batch-to-records step."""

    def __init__(self, settings: Settings, count_dropped: DropCounter | None = None,
                 count_written: Callable[[int], None] | None = None) -> None:
        self.settings = settings
        self._count_dropped = count_dropped
        self._count_written = count_written
        self._lock = threading.Lock()
        self._store: RecordStore | None = None
        self._writer: RecordWriter | None = None
        self._active: dict[str, OrderedDict[str, list[sentinel.Alert]]] = {}
        """Tenant -> run -> the alerts that held at the run's newest written step."""

    @property
    def enabled(self) -> bool:
        return self.settings.record_runs

    def for_tenant(self, tenant: str) -> TenantRecorder:
        """What a scoring path is handed: records its batches under ``tenant``."""
        return TenantRecorder(self, tenant)

    def store(self) -> RecordStore:
        """The record's store, opened (and migrated) on first use; raises while the database
        cannot be reached (the next call tries again)."""
        with self._lock:
            if self._store is None:
                self._store = RecordStore.open(self.settings.record_database_url)
            return self._store

    def writer(self) -> RecordWriter:
        with self._lock:
            if self._writer is None:
                self._writer = RecordWriter(self.store, self.settings.record_queue,
                                            self._count_dropped, on_written=self._count_written,
                                            prune=self.apply_retention,
                                            capacity_bytes=self.settings.record_queue_bytes,
                                            owner_capacity=self.settings.record_tenant_queue,
                                            after_write=self.watch)
            return self._writer

    @property
    def retention(self) -> Retention:
        days = self.settings.record_retention_days
        return Retention(max_age_s=days * 86400.0 if days is not None else None,
                         max_rollouts=self.settings.record_retention_rollouts)

    def apply_retention(self, store: RecordStore) -> int:
        """REWARDD_RECORD_RETENTION_* for every tenant of the record; rollouts deleted."""
        retention = self.retention
        if retention.max_age_s is None and retention.max_rollouts is None:
            return 0
        return sum(store.prune(tenant, retention) for tenant in store.tenants())

    def record_batch(self, tenant: str, run_id: str | None, step: int | None,
                     groups: Sequence[Any], body: Mapping[str, Any],
                     rewards: Sequence[Any] = (), evaluation: bool = False) -> int:
        """Queue one record per rollout of a scored batch (``groups``: the request's, in the
        order of ``body["groups"]``; ``rewards``: its reward components, kept with the
        completions for replay). Returns how many were accepted (0: not recorded)."""
        if not self.enabled or run_id is None:
            return 0
        count = sum(len(group.rollouts) for group in groups)
        size = count * ROLLOUT_OVERHEAD_BYTES + sum(
            len(rollout.completion or "") for group in groups for rollout in group.rollouts)
        now, settings = time.time(), self.settings
        components = tuple(ComponentInput(spec.name, spec.verifier, spec.params, spec.timeout_s)
                           for spec in rewards)
        weights = {spec.name: spec.weight for spec in rewards}
        return self.writer().submit_batch(count, lambda: batch_rows(
            tenant, run_id, step, groups, body, settings, now, components, evaluation,
            weights), size, owner=tenant)

    def watch(self, store: RecordStore, written: Sequence[Any]) -> None:
        """The sentinel on each run whose step statistics were just written (in the writer
        thread): counts the alerts raised at the run's newest step
        (``rewardd_sentinel_alerts_total``) and remembers the run's active ones, which the
        run's next answers carry (``summary.sentinel``)."""
        touched = {(row.values[0], row.values[1]) for row in written
                   if getattr(row, "batch", None) is not None}
        for tenant, run_id in sorted(touched):
            series = [(step, stats) for step, stats in store.step_stats(
                tenant, run_id, last=sentinel.WINDOW + 1) if step is not None]
            newly, active = sentinel.latest(series)
            for alert in newly:
                metrics.count_sentinel_alert(alert.signal)
            self.remember(tenant, run_id, active)

    def remember(self, tenant: str, run_id: str, active: list[sentinel.Alert]) -> None:
        """Keep ``active`` as the run's alerts, within :data:`MAX_WATCHED_RUNS` per tenant."""
        with self._lock:
            runs = self._active.setdefault(tenant, OrderedDict())
            runs[run_id] = active
            runs.move_to_end(run_id)
            while len(runs) > MAX_WATCHED_RUNS:
                runs.popitem(last=False)

    def active_alerts(self, tenant: str, run_id: str) -> list[sentinel.Alert] | None:
        """The alerts that held at the run's newest written step (None: not looked at in
        this process)."""
        with self._lock:
            return self._active.get(tenant, {}).get(run_id)

    def count_dropped(self, reason: str, rollouts: int) -> None:
        """Count ``rollouts`` the record could not keep (``rewardd_records_dropped_total``)."""
        if self._count_dropped is not None:
            self._count_dropped(reason, rollouts)

    def health(self) -> WriterHealth | None:
        """The writer's state (None before anything was recorded)."""
        writer = self._writer
        return writer.health() if writer is not None else None

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_s``), then release the database."""
        with self._lock:
            writer, store = self._writer, self._store
            self._writer = self._store = None
        if writer is not None:
            writer.close(timeout_s)
        if store is not None:
            store.close()


@dataclass(frozen=True, slots=True)
class TenantRecorder:
    """:meth:`Recorder.record_batch` for one tenant, and never raising: a bug in recording
    must not fail the batch it records (it is logged and its rollouts counted as dropped)."""

    recorder: Recorder
    tenant: str

    def __call__(self, run_id: str | None, step: int | None, groups: Sequence[Any],
                 body: Mapping[str, Any], rewards: Sequence[Any] = (),
                 evaluation: bool = False) -> int:
        try:
            return self.recorder.record_batch(self.tenant, run_id, step, groups, body,
                                              rewards, evaluation)
        except Exception:
            log.exception("could not record a batch of run %r", run_id)
            self.recorder.count_dropped("error", sum(len(group.rollouts) for group in groups))
            return 0

    def active_alerts(self, run_id: str) -> list[sentinel.Alert] | None:
        return self.recorder.active_alerts(self.tenant, run_id)


def batch_rows(tenant: str, run_id: str, step: int | None, groups: Sequence[Any],
               body: Mapping[str, Any], settings: Settings, now: float,
               components: tuple[ComponentInput, ...] = (),
               evaluation: bool = False,
               weights: Mapping[str, float] | None = None) -> list[RolloutRow]:
    """One row per rollout of ``body`` (a scoring response), laid out as the store writes it
    (:class:`~rewardd.service.records.store.RolloutRow`: what a
    :class:`~rewardd.service.records.models.RolloutRecord` of it would be, with its JSON
    documents serialized once, here), with the completion kept as
    REWARDD_RECORD_COMPLETIONS says, and beside a kept completion its group's inputs (what
    replay runs again; none without verifier ``components``). The first row carries the
    batch's step statistics (:func:`~rewardd.service.stepstats.batch_stats`; ``weights``:
    the verifier components' weights, for their shares of the reward)."""
    policy, rate = settings.record_completions, settings.record_sample_rate
    rows: list[RolloutRow] = []
    canaries = (body.get("summary") or {}).get("canaries")
    append = rows.append
    for group, answered in zip(groups, body.get("groups") or ()):
        source = group.source or group.data_source
        group_id = group.group_id
        inputs = _Inputs(group, components, evaluation)
        for rollout, item in zip(group.rollouts, answered["rollouts"]):
            rewards, status = item["rewards"], item["status"]
            verdicts = []
            kept_rewards: dict[str, Any] = {}
            kept_status: dict[str, Any] = {}
            for name, entry in status.items():
                reward = rewards.get(name)
                outcome = OK if entry.get("ok") else str(entry.get("error") or "failed")
                verdicts.append((name, reward, outcome))
                kept_rewards[name] = reward
                kept_status[name] = {"outcome": outcome,
                                     "entry": entry if type(entry) is dict else dict(entry)}
            outcome = OK if all(v[2] == OK for v in verdicts) else FAILED
            completion, kept = rollout.completion, None
            if completion is not None and _keeps_completion(
                    policy, rate, outcome, verdicts, (tenant, run_id, group_id,
                                                      rollout.rollout_id)):
                kept = inputs.row()
            else:
                completion = None
            append(RolloutRow(
                (tenant, run_id, step, source, group_id, rollout.rollout_id, now, outcome,
                 dumps(kept_rewards), dumps(kept_status),
                 dumps(_summary(item, None if rows else canaries)), completion,
                 item.get("num_tokens"), _all_zero(item.get("advantages")),
                 kept[0] if kept is not None else None),
                tuple(verdicts), kept))
    if rows:
        stats = batch_stats(groups, body, weights if weights is not None else
                            {c.name: 1.0 for c in components})
        rows[0].batch = dumps(stats.to_document())
    return rows


def _summary(item: Mapping[str, Any], canaries: Any = None) -> dict[str, Any]:
    """The rollout's summary (with its audit verdicts, when audited); the batch's first
    rollout also carries the batch's canary report (``summary.canaries`` of the response:
    one per batch, not per rollout)."""
    summary: dict[str, Any] = {"reward": item.get("reward"),
                               "excluded": bool(item.get("excluded"))}
    if canaries:
        summary["canaries"] = canaries
    audit = item.get("audit")
    if audit:  # the audit components' verdicts on this rollout (never part of its reward)
        summary["audit"] = audit
    advantages = item.get("advantages")
    runs: list[list[float]] | None = None
    if isinstance(advantages, (int, float)):  # output scalar
        summary["advantage_mean"] = float(advantages)
    elif isinstance(advantages, dict) and isinstance(advantages.get("rle"), list):
        runs = advantages["rle"]
        tokens = sum(length for _, length in runs)
        if tokens:
            summary["advantage_mean"] = math.fsum(v * n for v, n in runs) / tokens
    elif isinstance(advantages, list) and advantages:  # output dense
        summary["advantage_mean"] = math.fsum(advantages) / len(advantages)
        runs = run_lengths(advantages)
    if runs is not None:  # the inspector's per-token strip, when it is short enough to keep
        if len(runs) <= MAX_KEPT_RUNS:
            summary["advantages"] = [[float(v), int(n)] for v, n in runs]
        else:
            summary["advantage_runs"] = len(runs)
    return summary


def run_lengths(values: Sequence[float]) -> list[list[float]]:
    """``values`` as ``[value, count]`` runs of equal neighbours (exact equality: decoding
    gives the same floats back)."""
    runs: list[list[float]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def _all_zero(advantages: Any) -> bool | None:
    """Whether every advantage of a rollout is 0, in any output format (None: none)."""
    if isinstance(advantages, (int, float)):
        return advantages == 0
    if isinstance(advantages, dict) and isinstance(advantages.get("rle"), list):
        return all(v == 0 for v, n in advantages["rle"] if n)
    if isinstance(advantages, list):
        return all(v == 0 for v in advantages)
    return None


def _keeps_completion(policy: str, rate: float, outcome: str,
                      verdicts: Sequence[tuple[str, float | None, str]],
                      identity: tuple[str, str, str, str]) -> bool:
    if policy == "all":
        return True
    if policy == "failed":
        return outcome != OK or any(reward == 0 for _, reward, _ in verdicts)
    if policy == "sample":
        return sampled(identity, rate)
    return False


def sampled(identity: tuple[str, str, str, str], rate: float) -> bool:
    """Whether the rollout ``(tenant, run_id, group_id, rollout_id)`` keeps its completion at
    ``rate``: the same rollouts on every pod and in every run of the batch, a hash of the
    rollout's identity, not a random draw."""
    digest = hashlib.blake2b("\x1f".join(identity).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * 2.0 ** 64


class _Inputs:
    """A group's :class:`GroupInputs`, built (and hashed) once, and only if one of its
    rollouts keeps its completion: without one there is nothing to replay."""

    def __init__(self, group: Any, components: tuple[ComponentInput, ...],
                 evaluation: bool) -> None:
        self._group, self._components, self._evaluation = group, components, evaluation
        self._built: tuple[str, str] | None = None

    def row(self) -> tuple[str, str] | None:
        """``(digest, document as JSON text)``, as :class:`RolloutRow` carries them."""
        if not self._components:
            return None
        if self._built is None:
            document = GroupInputs("", self._group.prompt or "", self._group.reference or {},
                                   self._components, self._evaluation).to_document()
            self._built = (digest(document), dumps(document))
        return self._built
