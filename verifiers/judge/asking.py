"""Ask a judge many questions and read one verdict from each, honestly.

Every judge verifier has the same loop: send a batch of chat requests, parse each answer, ask
again (a bounded number of times) where the answer was unparseable or a refusal, and give
every question that still has no verdict a typed failure: ``judge_unparseable``,
``judge_refused`` or ``judge_unavailable``. Never a default score: a 0 or a 0.5 invented for
an answer nobody could read would be trained on as if it were a judgement.

A retry changes the seed and samples at a temperature of at least :data:`RETRY_TEMPERATURE`:
a greedy judge asked the same question again would give the same unreadable answer (and the
reply cache would hand it back without asking).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from rewardd.verifiers.base import FailureKind
from rewardd.verifiers.judge.backend import ChatBackend, ChatReply, ChatRequest, Usage
from rewardd.verifiers.judge.templates import Unparseable, looks_like_refusal

T = TypeVar("T")

RETRY_TEMPERATURE = 0.5


def repeatable(params: Mapping[str, Any]) -> bool:
    """True when the same question gets the same verdict, so the verdict cache may answer
    for a judge with these (effective) params: greedy sampling (temperature 0) or a fixed
    seed. An unseeded verdict that needed a retry (sampled at :data:`RETRY_TEMPERATURE`) is
    not kept (:meth:`rewardd.verifiers.receipts.CallStamp.keeps`)."""
    return params.get("seed") is not None or params.get("temperature", 0.0) == 0.0
RAW_LIMIT = 500
"""Characters of a judge's answer kept in a failure's detail."""


@dataclass(frozen=True, slots=True)
class JudgeFailure:
    """Why a question got no verdict."""

    kind: FailureKind
    message: str
    raw: str | None = None
    attempts: int = 1

    def detail(self) -> dict[str, object]:
        out: dict[str, object] = {"attempts": self.attempts}
        if self.raw is not None:
            out["raw"] = self.raw[:RAW_LIMIT]
        return out


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """A parsed verdict and the answer it was read from."""

    value: T
    text: str
    attempts: int


def ask_all(backend: ChatBackend, requests: Sequence[ChatRequest],
            parse: Callable[[int, str], T], retries: int,
            usage: Usage | Callable[[int], Usage]) -> list[Answer[T] | JudgeFailure]:
    """One :class:`Answer` or :class:`JudgeFailure` per request, in order.

    ``parse(index, text)`` reads the verdict of request ``index`` or raises
    :class:`~rewardd.verifiers.judge.templates.Unparseable`. Unparseable answers and refusals are asked
    again up to ``retries`` times (all pending ones in one batch per attempt); a request the
    backend could not answer (it retried transport errors itself) fails at once. ``usage``
    counts every attempt: one Usage for all, or a function giving request ``index``'s."""
    usage_of = usage if callable(usage) else (lambda index: usage)
    results: list[Answer[T] | JudgeFailure | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    current = list(requests)
    for attempt in range(retries + 1):
        replies = backend.chat([current[i] for i in pending])
        again: list[int] = []
        for index, reply in zip(pending, replies):
            usage_of(index).add(reply, backend.cost_per_1k_tokens)
            if not isinstance(reply, ChatReply):
                results[index] = JudgeFailure(FailureKind.judge_unavailable, reply.message,
                                              attempts=attempt + 1)
                continue
            failure = _read(reply, lambda text, i=index: parse(i, text), attempt + 1)
            if isinstance(failure, JudgeFailure):
                results[index] = failure
                if attempt < retries:
                    again.append(index)
            else:
                results[index] = failure
        if not again:
            break
        for index in again:
            base = requests[index]
            current[index] = replace(base, seed=(base.seed or 0) + attempt + 1,
                                     temperature=max(base.temperature, RETRY_TEMPERATURE))
        pending = again
    return results  # type: ignore[return-value]


def _read(reply: ChatReply, parse: Callable[[str], T],
          attempts: int) -> Answer[T] | JudgeFailure:
    if reply.refusal:
        return JudgeFailure(FailureKind.judge_refused, f"the judge refused: {reply.refusal}",
                            reply.refusal, attempts)
    if reply.finish_reason == "content_filter":
        return JudgeFailure(FailureKind.judge_refused, "the judge's answer was stopped by a "
                            "content filter", reply.text, attempts)
    try:
        return Answer(parse(reply.text), reply.text, attempts)
    except Unparseable as exc:
        if looks_like_refusal(reply.text):
            return JudgeFailure(FailureKind.judge_refused, "the judge declined to grade",
                                reply.text, attempts)
        how = " (cut off at max_tokens)" if reply.finish_reason == "length" else ""
        return JudgeFailure(FailureKind.judge_unparseable, f"{exc}{how}", reply.text, attempts)
