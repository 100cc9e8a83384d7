"""The one interface every judge backend implements: chat requests in, replies or typed errors out.

A backend answers a *batch* of chat requests at once, because a judge verifier always has many
(every rollout of a group, every criterion, every pair of a tournament) and the backend knows
best how to run them: concurrently over HTTP (:mod:`rewardd.verifiers.judge.openai`), or as one padded
batch through a local model (:mod:`rewardd.verifiers.judge.local`). Calls are synchronous: verifiers
run in worker processes that have no event loop of their own.

A failed request is a :class:`JudgeUnavailable` in its slot, never an exception for the whole
batch and never an empty string: the verifier turns it into a ``judge_unavailable`` cell.
"""

from __future__ import annotations

import abc
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat completion: the rendered messages and the sampling parameters."""

    messages: tuple[tuple[str, str], ...]
    """(role, content) pairs, for example (("system", ...), ("user", ...))."""
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    json_schema: Mapping[str, Any] | None = None
    """Ask for structured output matching this JSON schema (OpenAI ``response_format``;
    vLLM and SGLang honour it with guided decoding). None: free text."""
    extra_body: Mapping[str, Any] | None = None
    """Server-specific fields merged into the body as given, like the OpenAI SDK's
    ``extra_body``: e.g. vLLM's ``{"structured_outputs": {"regex": ...}}``."""

    def payload(self, model: str) -> dict[str, Any]:
        """The OpenAI ``/chat/completions`` body."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": role, "content": content} for role, content in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "verdict", "schema": dict(self.json_schema), "strict": True}}
        if self.extra_body:
            body.update({k: v for k, v in self.extra_body.items() if k not in body})
        return body

    def cache_key(self, backend: str, model: str) -> str:
        """Digest of (backend, model, rendered prompt, sampling parameters): equal requests
        to the same model get the same answer from the cache."""
        canonical = json.dumps([backend, self.payload(model)], sort_keys=True,
                               ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ChatReply:
    """What the judge answered, with the usage that answer cost."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    refusal: str | None = None
    """The API's own refusal field (OpenAI ``message.refusal``), when it set one."""
    cached: bool = False
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class JudgeUnavailable:
    """A request the backend could not answer (after its retries): why, and how it ended."""

    message: str
    status: int | None = None
    attempts: int = 1
    duplicate: bool = False
    """The failure of an equal request of the same batch, which was sent once: the same
    outcome for this one, but no call (nor retries) of its own in the usage."""


ChatResult = ChatReply | JudgeUnavailable

REQUEST_MODEL = "request"
"""The ``model`` label of the judge metrics for every model a request chose (``backend.model``
in a verifier's params): one series for all of them. A request's string as a Prometheus label
would let any tenant create series without bound (each distinct value is a new time series in
every scrape, kept by Prometheus for its retention); the model itself is still reported in
each outcome's ``detail["judge"]["model"]``."""


@dataclass(slots=True)
class Usage:
    """Judge usage of one verifier call, reported in the outcome's ``detail["judge"]`` and
    counted into the API's metrics (``rewardd_judge_*``) when the result comes back: worker
    processes export no metrics of their own."""

    backend: str
    model: str
    calls: int = 0
    cached: int = 0
    failed: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    metric_model: str | None = None
    """The ``model`` label of the judge metrics: the operator's configured model, or
    :data:`REQUEST_MODEL` when the request chose it; None: ``model``."""

    def add(self, result: ChatResult, cost: tuple[float, float] = (0.0, 0.0)) -> None:
        self.calls += 1
        if isinstance(result, JudgeUnavailable) and result.duplicate:
            self.cached += 1  # answered (with a failure) without asking
            return
        self.retries += max(result.attempts - 1, 0)
        if isinstance(result, JudgeUnavailable):
            self.failed += 1
            return
        if result.cached:
            self.cached += 1
            return
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.cost_usd += (result.prompt_tokens * cost[0]
                          + result.completion_tokens * cost[1]) / 1000.0

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "model": self.model, "calls": self.calls,
                "cached": self.cached, "failed": self.failed, "retries": self.retries,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cost_usd": round(self.cost_usd, 8),
                "metric_model": self.metric_model or self.model, **self.extra}


class ChatBackend(abc.ABC):
    """A judge model that answers chat requests."""

    name: str
    model: str
    cost_per_1k_tokens: tuple[float, float] = (0.0, 0.0)
    """(prompt, completion) price per 1000 tokens, for ``cost_usd`` in the usage."""
    metric_model: str | None = None
    """The model's label in the judge metrics; None: ``model`` (a backend the operator
    built). :func:`~rewardd.verifiers.judge.config.resolve_backend` sets
    :data:`REQUEST_MODEL` on a backend whose model a request chose."""

    @abc.abstractmethod
    def chat(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """One result per request, in order; never raises for a request's sake."""

    def usage(self) -> Usage:
        return Usage(self.name, self.model, metric_model=self.metric_model)
