"""``continuation``: transferable reward (RLTR): can another model finish this reasoning?

A rollout's reasoning is good for more than its own final answer when a different model,
handed its beginning, reaches the right answer from there. For each rollout: take a prefix of
its reasoning, have a judge backend continue it ``k`` times (seeds ``seed``, ``seed + 1``, ...),
check each continuation's final answer against the reference with the ``math`` verifier, and
reward the success rate, successes / k.

The prefix: the reasoning is the completion up to its last ``</think>`` (the whole completion
when there is none); the prefix is its first ``prefix_fraction`` of characters, cut back to the
last whitespace so no word is split, and cut before the first ``\\boxed`` in it, so that a
continuation is never handed the rollout's own final answer to copy. Only the continuation's
text is checked, never prefix + continuation, for the same reason.

Two ways to ask (``mode``):

* ``continue`` (default): the problem as the user turn and the prefix as an unfinished
  assistant turn, with vLLM's and SGLang's ``continue_final_message: true,
  add_generation_prompt: false``, so the model goes on inside its own turn, as RLTR does. Needs
  a server that honours them (hosted OpenAI-style APIs and the local transformers backend do
  not: they would start a new turn).
* ``instruct``: one user message with the problem and the partial solution, asking to continue
  it to a final ``\\boxed{}`` answer; works with any chat backend.

Honest outcomes: a continuation without an answer, or with a wrong one, is a failed sample
(it counts 0 in the rate), because that is what transfer means. A sample the backend could
not produce (unreachable, refused, content filter) makes the rollout's cell a typed failure
(``judge_unavailable``, ``judge_refused``) with the counts in ``detail``, never a rate over
fewer samples than asked. A reference the math verifier cannot use is ``invalid_reference``
before any call is made.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Collection, Literal, Mapping, Sequence

from pydantic import Field, model_validator

from rewardd.verifiers.base import (FailureKind, GroupContext, GroupVerifier, Outcome, Sample,
                                    VerifierParams)
from rewardd.verifiers.judge.asking import JudgeFailure, ask_all
from rewardd.verifiers.judge.backend import ChatRequest, Usage
from rewardd.verifiers.judge.config import BackendOverride, JudgeConfigError, resolve_backend
from rewardd.verifiers.judge.rubric import KINDS_BY_PRIORITY
from rewardd.verifiers.math import MathParams, MathVerifier
from rewardd.verifiers.text import truncate

INSTRUCT = """Problem:
{problem}

Partial solution (written by someone else, cut off mid-way):
{prefix}

Continue the partial solution from exactly where it stops, without starting over, and finish
with the final answer in \\boxed{{}}."""

CONTINUE_FLAGS = {"continue_final_message": True, "add_generation_prompt": False}
_MATH = MathVerifier()


class ContinuationParams(VerifierParams):
    k: int = Field(4, ge=1, le=64)
    """Continuations per rollout; the reward is the fraction that reach the answer."""
    prefix_fraction: float = Field(0.5, gt=0.0, le=1.0)
    """Share of the reasoning (in characters) handed over."""
    mode: Literal["continue", "instruct"] = "continue"
    """``continue``: an unfinished assistant turn (vLLM, SGLang); ``instruct``: a user
    message asking to continue (any backend)."""
    backend: BackendOverride | None = None
    """Which model continues: a configured backend by name, optionally another model on it."""
    max_tokens: int = Field(2048, ge=16, le=65536)
    """Longest continuation; one cut off before its answer counts as a failed sample."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    """Sampling temperature; above 0 when k > 1 (k greedy samples would be one sample)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling of the continuations."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Sample j of a rollout uses seed + j."""
    extra_body: dict[str, Any] | None = None
    """Server-specific request fields, merged over the continue flags."""
    math: MathParams = Field(default_factory=MathParams)
    """How the continuation's answer is checked: the math verifier's params."""

    @model_validator(mode="after")
    def _samples_differ(self) -> ContinuationParams:
        if self.k > 1 and self.temperature == 0:
            raise ValueError("k > 1 needs a temperature above 0: greedy samples are all the "
                             "same sample")
        return self


def reasoning_prefix(completion: str, fraction: float) -> str:
    """The part of the rollout handed over (see the module docstring)."""
    head, sep, _ = completion.rpartition("</think>")
    reasoning = head if sep else completion
    cut = int(len(reasoning) * fraction)
    prefix = reasoning[:cut]
    if cut < len(reasoning) and not reasoning[cut].isspace():
        space = max(prefix.rfind(" "), prefix.rfind("\n"))
        prefix = prefix[:space + 1] if space >= 0 else ""
    boxed = re.search(r"\\(?:boxed|fbox)\s*\{", prefix)
    return prefix[:boxed.start()] if boxed else prefix


class ContinuationVerifier(GroupVerifier):
    name = "continuation"
    description = ("Transferable reward (RLTR): a judge backend continues the rollout's "
                   "reasoning prefix k times; reward = the fraction of continuations whose "
                   "final answer the math verifier accepts against reference.answer.")
    reference_fields: ClassVar[dict[str, str]] = dict(MathVerifier.reference_fields)
    Params = ContinuationParams

    judged = True

    def reference_errors(self, reference: Any, shared: Collection[str] = ()
                         ) -> list[tuple[tuple[str | int, ...], str]]:
        """A missing or empty ``answer`` (other keys are other verifiers' business: ``shared``
        is not needed). Whether the answer parses is the math verifier's to say, in the
        worker: parsing LaTeX for every group of a request would cost the API process
        seconds."""
        if not isinstance(reference, Mapping):
            return [((), f"must be an object, not {type(reference).__name__}")]
        answer = reference.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or (
                isinstance(answer, str) and not answer.strip()):
            return [(("answer",), "the math verifier needs a non-empty string or number")]
        return []

    def verify_group(self, samples: Sequence[Sample], reference: Mapping[str, Any],
                     params: ContinuationParams, context: GroupContext) -> list[Outcome]:
        _MATH.verify(Sample(""), reference, params.math)  # InvalidReference before any call
        try:
            backend = resolve_backend(params.backend)
        except JudgeConfigError as exc:
            return [Outcome.failure(FailureKind.judge_unavailable, str(exc)) for _ in samples]
        prefixes = [reasoning_prefix(s.completion, params.prefix_fraction) for s in samples]
        requests = [_request(sample.prompt, prefix, params, params.seed + j)
                    for sample, prefix in zip(samples, prefixes) for j in range(params.k)]
        usages = [backend.usage() for _ in samples]
        answers = ask_all(backend, requests, lambda _, text: text, 0,
                          lambda index: usages[index // params.k])
        return [_score(answers[i * params.k:(i + 1) * params.k], prefixes[i], reference,
                       params, usages[i]) for i in range(len(samples))]


def _request(problem: str, prefix: str, params: ContinuationParams, seed: int) -> ChatRequest:
    if params.mode == "continue":
        messages: tuple[tuple[str, str], ...] = (("user", problem), ("assistant", prefix))
        extra = {**CONTINUE_FLAGS, **(params.extra_body or {})}
    else:
        messages = (("user", INSTRUCT.format(problem=problem, prefix=prefix)),)
        extra = dict(params.extra_body or {})
    return ChatRequest(messages, max_tokens=params.max_tokens, temperature=params.temperature,
                       top_p=params.top_p, seed=seed, extra_body=extra or None)


def _score(answers: Sequence[Any], prefix: str, reference: Mapping[str, Any],
           params: ContinuationParams, usage: Usage) -> Outcome:
    rows: list[dict[str, Any]] = []
    failures: list[JudgeFailure] = []
    for j, answer in enumerate(answers):
        if isinstance(answer, JudgeFailure):
            failures.append(answer)
            rows.append({"seed": params.seed + j, "error": answer.kind.value})
            continue
        checked = _MATH.verify(Sample(answer.text), reference, params.math)
        rows.append({"seed": params.seed + j, "correct": checked.reward == 1.0,
                     "extracted": checked.detail.get("extracted"),
                     "continuation": truncate(answer.text)})
    successes = sum(1 for r in rows if r.get("correct"))
    detail: dict[str, Any] = {"successes": successes, "k": params.k,
                              "prefix_chars": len(prefix), "prefix_tail": truncate(prefix[-200:]),
                              "samples": rows, "judge": usage.to_dict()}
    if failures:
        worst = min(failures, key=lambda f: KINDS_BY_PRIORITY.index(f.kind))
        return Outcome.failure(worst.kind, f"{len(failures)} of {params.k} continuations "
                               f"could not be produced: {worst.message}", **detail)
    return Outcome.success(successes / params.k, **detail)
