"""The ``rubric`` verifier: an LLM judge grades each rollout against weighted criteria.

A rubric is a list of criteria with points, as in HealthBench and Rubrics-as-Rewards:
positive points for what a good answer does, negative points for pitfalls. It comes with the
group's reference (``{"rubric": [{"criterion": "...", "points": 5}, ...]}``) or in the
reward's params (which wins when both have one).

Score of one rollout: the points of the criteria it meets (pitfalls it falls into count
negative), divided by the sum of the positive points, **clipped to [0, 1]**: a rollout that
meets every positive criterion and no pitfall scores 1; one that falls into more pitfalls
than it earns scores 0, not below (HealthBench clips the same way, so scores stay
comparable across rubrics of different sizes and signs).

Grading is one criterion per judge call (``criteria_per_call: 1``, the HealthBench way) or k
criteria per call (cheaper, a JSON list back). Every call of the group goes to the backend as
one batch. A criterion with no verdict after the bounded retries makes the rollout's cell a
typed failure (``judge_unparseable``, ``judge_refused``, ``judge_unavailable``) with every
criterion's verdict in ``detail``; never a partial score.

Rubric dropout (``dropout: p``): for training requests a seeded random fraction p of the
criteria is dropped per group per step, the same subset for every rollout of the group
(:func:`rewardd.verifiers.dropout.rubric_keep_mask`), so the policy cannot learn to satisfy one fixed
list; evaluation requests (``"evaluation": true``) always grade the full rubric.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from rewardd.verifiers.base import (FailureKind, GroupContext, InvalidReference, Outcome, Sample,
                            GroupVerifier, VerifierParams)
from rewardd.verifiers.dropout import rubric_keep_mask
from rewardd.verifiers.judge.asking import repeatable, Answer, JudgeFailure, ask_all
from rewardd.verifiers.judge.backend import ChatRequest, Usage
from rewardd.verifiers.judge.config import BackendOverride, JudgeConfigError, resolve_backend
from rewardd.verifiers.judge.templates import (RUBRIC_MANY, RUBRIC_ONE, RUBRIC_SYSTEM, as_bool,
                                       check_pattern, check_template, parse_criteria,
                                       parse_criterion, parse_with_pattern, reference_text,
                                       render)
from rewardd.verifiers.text import truncate

KINDS_BY_PRIORITY = (FailureKind.judge_unavailable, FailureKind.judge_refused,
                     FailureKind.judge_unparseable)
"""A rollout with several failed criteria reports the most telling kind first: an
unreachable backend explains refusals and garbage better than the other way round."""


CRITERION_SCHEMA = {"type": "object", "additionalProperties": False,
                    "required": ["explanation", "criteria_met"],
                    "properties": {"explanation": {"type": "string"},
                                   "criteria_met": {"type": "boolean"}}}
"""The one-criterion answer, for judges that constrain decoding to a schema."""


class Criterion(VerifierParams):
    criterion: str = Field(min_length=1, max_length=4000)
    """What the response should do (or, with negative points, should not do)."""
    points: float = Field(ge=-1000, le=1000)
    """Positive for a desired behaviour, negative for a pitfall; not 0."""

    @field_validator("points")
    @classmethod
    def _nonzero(cls, value: float) -> float:
        if value == 0:
            raise ValueError("a criterion worth 0 points grades nothing; drop it")
        return value


class RubricParams(VerifierParams):
    rubric: list[Criterion] | None = Field(None, max_length=200)
    """The criteria; else the group's ``reference["rubric"]``."""
    criteria_per_call: int = Field(1, ge=1, le=50)
    """Criteria graded per judge call: 1 is the most reliable, more are cheaper."""
    backend: BackendOverride | None = None
    """Which judge: a configured backend by name, optionally another model on it."""
    max_tokens: int = Field(1024, ge=16, le=32768)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    seed: int | None = None
    retries: int = Field(2, ge=0, le=10)
    """Times an unparseable or refused verdict is asked again before it is a failure."""
    template: str | None = Field(None, max_length=20000)
    """Custom user message; fields ``{prompt}``, ``{response}``, ``{reference}`` and
    ``{criterion}`` (or ``{criteria}`` with criteria_per_call > 1), filled in fenced."""
    system: str | None = Field(None, max_length=20000)
    """Custom system message; ``{nonce}`` is replaced by the markers' nonce."""
    verdict_pattern: str | None = Field(None, max_length=1000)
    """Custom verdict parser for a custom template: a regular expression with a named group
    ``met`` (true/false/yes/no); every match in the answer must agree. One criterion per
    call only."""
    structured: bool = False
    """Ask for the verdict as JSON matching a schema (``response_format``; vLLM and SGLang
    constrain decoding to it). Only with criteria_per_call 1 and the default template."""
    extra_body: dict[str, Any] | None = None
    """Server-specific request fields, e.g. vLLM's ``structured_outputs``."""
    dropout: float = Field(0.0, ge=0.0, le=1.0)
    """Fraction of criteria dropped per group per step (training requests only)."""
    dropout_seed: int = 0

    @field_validator("verdict_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return check_pattern(value, "met")

    @model_validator(mode="after")
    def _structured_one_at_a_time(self) -> RubricParams:
        check_template(self.template, ["response", "criterion" if self.criteria_per_call == 1
                                       else "criteria"])
        if self.verdict_pattern is not None and self.criteria_per_call > 1:
            raise ValueError("verdict_pattern reads one criterion per answer: use "
                             "criteria_per_call 1")
        if self.structured and (self.criteria_per_call > 1 or self.template is not None):
            raise ValueError("structured verdicts need criteria_per_call 1 and the default "
                             "template (the schema is the one-criterion answer)")
        return self


class RubricVerifier(GroupVerifier):
    name = "rubric"
    description = ("LLM judge grading each rollout against a rubric of weighted criteria "
                   "(points met / positive points, clipped to [0, 1]).")
    reference_fields: ClassVar[dict[str, str]] = {
        "rubric": "list of {criterion, points} (or in params)"}
    Params = RubricParams

    judged = True

    def cacheable(self, params: Mapping[str, Any]) -> bool:
        """Each rollout is graded on its own (the group only batches the judge calls), so
        a verdict is cached when the judge samples repeatably (:func:`repeatable`)."""
        return repeatable(params)

    def verify_group(self, samples: Sequence[Sample], reference: Mapping[str, Any],
                     params: RubricParams, context: GroupContext) -> list[Outcome]:
        rubric = _rubric(reference, params)
        positive = frozenset(i for i, c in enumerate(rubric) if c.points > 0)
        keep = (rubric_keep_mask(len(rubric), params.dropout, seed=params.dropout_seed,
                                 run_id=context.run_id, group_id=context.group_id,
                                 step=context.step or 0, keep_one_of=positive)
                if params.dropout > 0 and not context.evaluation else [True] * len(rubric))
        kept = [i for i, k in enumerate(keep) if k]
        if not any(rubric[i].points > 0 for i in kept):
            raise InvalidReference("the rubric has no criterion with positive points, so "
                                   "there is nothing to divide by")
        try:
            backend = resolve_backend(params.backend)
        except JudgeConfigError as exc:
            return [Outcome.failure(FailureKind.judge_unavailable, str(exc)) for _ in samples]
        chunks = [kept[i:i + params.criteria_per_call]
                  for i in range(0, len(kept), params.criteria_per_call)]
        requests, owners = [], []
        for si, sample in enumerate(samples):
            for chunk in chunks:
                requests.append(_request(sample, reference, rubric, chunk, params))
                owners.append((si, chunk))
        usages = [backend.usage() for _ in samples]
        answers = _ask(backend, requests, owners, params, usages)
        outcomes = []
        for si in range(len(samples)):
            verdicts: dict[int, tuple[bool, str] | JudgeFailure] = {}
            for (owner, chunk), answer in zip(owners, answers):
                if owner != si:
                    continue
                for ci in chunk:
                    verdicts[ci] = (answer if isinstance(answer, JudgeFailure)
                                    else answer.value[ci])
            outcomes.append(_score(rubric, kept, verdicts, usages[si],
                                   [i for i, k in enumerate(keep) if not k]))
        return outcomes


def _rubric(reference: Mapping[str, Any], params: RubricParams) -> list[Criterion]:
    if params.rubric:
        return list(params.rubric)
    raw = reference.get("rubric")
    if not raw:
        raise InvalidReference("the rubric verifier needs reference.rubric (a list of "
                               "{criterion, points}) or params.rubric")
    try:
        rubric = [Criterion.model_validate(item) for item in raw]
    except Exception as exc:
        raise InvalidReference(f"reference.rubric is not a list of {{criterion, points}}: "
                               f"{exc}") from None
    if len(rubric) > 200:
        raise InvalidReference("reference.rubric has more than 200 criteria")
    return rubric


def _request(sample: Sample, reference: Mapping[str, Any], rubric: Sequence[Criterion],
             chunk: Sequence[int], params: RubricParams) -> ChatRequest:
    fields = {"prompt": sample.prompt, "response": sample.completion,
              "reference": reference_text(reference)}
    if params.criteria_per_call == 1:
        c = rubric[chunk[0]]
        fields["criterion"] = f"[{c.points:+g} points] {c.criterion}"
        template = params.template or RUBRIC_ONE
    else:
        fields["criteria"] = "\n".join(f"id {i}: [{rubric[i].points:+g} points] "
                                       f"{rubric[i].criterion}" for i in chunk)
        template = params.template or RUBRIC_MANY
    rendered = render(template, RUBRIC_SYSTEM if params.system is None else params.system,
                      fields)
    return ChatRequest(rendered.messages(), max_tokens=params.max_tokens,
                       temperature=params.temperature, seed=params.seed,
                       json_schema=CRITERION_SCHEMA if params.structured else None,
                       extra_body=params.extra_body)


def _ask(backend: Any, requests: list[ChatRequest], owners: list[tuple[int, list[int]]],
         params: RubricParams, usages: list[Usage]) -> list[Answer[Any] | JudgeFailure]:
    def parse(index: int, text: str) -> dict[int, tuple[bool, str]]:
        chunk = owners[index][1]
        if params.verdict_pattern is not None:
            met = parse_with_pattern(text, params.verdict_pattern, "met")
            return {chunk[0]: (as_bool(met), truncate(text))}
        if params.criteria_per_call == 1:
            return {chunk[0]: parse_criterion(text)}
        return parse_criteria(text, chunk)

    return ask_all(backend, requests, parse, params.retries,
                   lambda index: usages[owners[index][0]])


def _score(rubric: Sequence[Criterion], kept: Sequence[int],
           verdicts: Mapping[int, tuple[bool, str] | JudgeFailure], usage: Usage,
           dropped: Sequence[int]) -> Outcome:
    rows = []
    failures: list[JudgeFailure] = []
    for ci in kept:
        verdict = verdicts[ci]
        row: dict[str, Any] = {"id": ci, "criterion": truncate(rubric[ci].criterion),
                               "points": rubric[ci].points}
        if isinstance(verdict, JudgeFailure):
            failures.append(verdict)
            row.update(met=None, error=verdict.kind.value)
        else:
            row.update(met=verdict[0], explanation=truncate(verdict[1]))
        rows.append(row)
    detail: dict[str, Any] = {"criteria": rows, "dropped": list(dropped),
                              "judge": usage.to_dict()}
    if failures:
        worst = min(failures, key=lambda f: KINDS_BY_PRIORITY.index(f.kind))
        return Outcome.failure(worst.kind, f"{len(failures)} of {len(kept)} criteria got no "
                               f"verdict: {worst.message}", **detail, **worst.detail())
    possible = sum(rubric[ci].points for ci in kept if rubric[ci].points > 0)
    met = sum(rubric[ci].points for ci in kept
              if not isinstance(verdicts[ci], JudgeFailure) and verdicts[ci][0])
    score = min(max(met / possible, 0.0), 1.0)
    return Outcome.success(score, points_met=met, points_possible=possible, **detail)
