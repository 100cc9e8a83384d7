"""The ``arena`` verifier: a pairwise LLM judge ranks the rollouts of a group against each other.

A group-level verifier: it sees all N rollouts at once, runs a tournament over them
(:mod:`rewardd.verifiers.judge.tournament`: round-robin, seeded single elimination, Swiss rounds, or
each rollout against an anchor), sends every round's comparisons to the judge backend as one
batch, and turns the fitted scores into rewards.

Reward of a rollout (``reward``):

* ``rank`` (default): its rank in the group scaled to [0, 1] (1 = best, 0 = worst, ties
  share the mean rank), the same scale whatever the scheme and scoring; what group-relative
  advantages need, and robust to the scale of a Bradley-Terry fit on few games;
* ``score``: the tournament's own score (Bradley-Terry log-strength, win rate or Elo).

Honest failures: a comparison whose verdict cannot be read after the bounded retries is left
out of the tournament (and counted); a rollout left without a single decided comparison gets a
typed failure (``judge_unparseable``, ``judge_refused`` or ``judge_unavailable``), never a
middle score. Each rollout's ``detail`` has the scheme, its score and games, the group's judge
calls, inconsistent swapped pairs and, for a sampled fraction of groups
(``agreement_sample``), the Spearman agreement with a full both-orders round-robin.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Literal, Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from rewardd.verifiers.base import (FailureKind, GroupContext, InvalidReference, Outcome, Sample,
                            GroupVerifier, VerifierParams)
from rewardd.verifiers.judge.asking import JudgeFailure, ask_all
from rewardd.verifiers.judge.backend import ChatBackend, ChatRequest, Usage
from rewardd.verifiers.judge.config import BackendOverride, JudgeConfigError, resolve_backend
from rewardd.verifiers.judge.rubric import KINDS_BY_PRIORITY
from rewardd.verifiers.judge.templates import (PAIRWISE, PAIRWISE_SYSTEM, Unparseable, check_pattern,
                                       check_template, parse_pairwise, parse_with_pattern,
                                       reference_text, render)
from rewardd.verifiers.judge.games import Verdict
from rewardd.verifiers.judge.ratings import SCORINGS, average_ranks, rank_key, spearman
from rewardd.verifiers.judge.tournament import (DEFAULT_OPTIONS, DEFAULT_SCHEME, SCHEMES,
                                        TournamentResult, default_options, run_tournament,
                                        scheme_options)

ANCHOR_SCHEMES = ("anchor",)


class ArenaParams(VerifierParams):
    scheme: str = DEFAULT_SCHEME
    """round_robin, single_elimination, swiss or anchor."""
    options: dict[str, Any] | None = None
    """Scheme options, e.g. ``{"rounds": 5}`` or ``{"calls": 40}`` for swiss,
    ``{"seeding": "anchor"}`` for single elimination. None: the scheme's defaults; for the
    default scheme, the benchmark's choice for the group's size
    (:func:`~rewardd.verifiers.judge.tournament.default_options`)."""
    scoring: Literal["bt", "win_rate", "elo"] = DEFAULT_OPTIONS.get("scoring", "bt")
    swap: bool = bool(DEFAULT_OPTIONS.get("swap", False))
    """Ask every comparison in both orders; inconsistent pairs count as ties."""
    reward: Literal["rank", "score"] = "rank"
    seed: int = 0
    """Mixed with the run, group and step: each group gets its own reproducible draw."""
    agreement_sample: float = Field(0.0, ge=0.0, le=1.0)
    """Fraction of groups also ranked by a full both-orders round-robin, to report agreement
    (costs N(N-1) more judge calls in those groups)."""
    backend: BackendOverride | None = None
    max_tokens: int = Field(1024, ge=16, le=32768)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    retries: int = Field(2, ge=0, le=10)
    extra_body: dict[str, Any] | None = None
    """Server-specific request fields, e.g. vLLM's ``structured_outputs``."""
    template: str | None = Field(None, max_length=20000)
    """Custom user message with ``{prompt}``, ``{reference}``, ``{response_a}``,
    ``{response_b}`` (filled in fenced); it must ask for a ``[[A>B]]``-style label."""
    system: str | None = Field(None, max_length=20000)
    verdict_pattern: str | None = Field(None, max_length=1000)
    """Custom verdict parser for a custom template: a regular expression with a named group
    ``verdict`` capturing one of A>>B, A>B, A=B, B>A, B>>A (or A<B, A<<B...); every match in
    the answer must agree."""

    @field_validator("verdict_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return check_pattern(value, "verdict")

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return check_template(value, ["response_a", "response_b"])

    @model_validator(mode="after")
    def _known(self) -> ArenaParams:
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; known: {', '.join(SCHEMES)}")
        if self.scoring not in SCORINGS:
            raise ValueError(f"unknown scoring {self.scoring!r}")
        unknown = set(self.options or {}) - scheme_options(self.scheme)
        if unknown:
            raise ValueError(f"scheme {self.scheme!r} has no option {', '.join(sorted(unknown))}")
        return self

    def scheme_options_for(self, n: int) -> dict[str, Any]:
        if self.options is not None:
            return dict(self.options)
        if self.scheme == DEFAULT_SCHEME:
            defaults = default_options(n, self.swap)
            return {k: v for k, v in defaults.items() if k in scheme_options(self.scheme)}
        return {}


class ArenaVerifier(GroupVerifier):
    name = "arena"
    description = ("Pairwise LLM judge tournament over a group's rollouts (round-robin, "
                   "seeded single elimination, Swiss, anchor); rewards from Bradley-Terry, "
                   "win rate or Elo, as ranks in [0, 1] by default.")
    reference_fields: ClassVar[dict[str, str]] = {
        "anchor": "text the anchor scheme compares against (else reference.answer)"}
    Params = ArenaParams

    judged = True

    def verify_group(self, samples: Sequence[Sample], reference: Mapping[str, Any],
                     params: ArenaParams, context: GroupContext) -> list[Outcome]:
        anchor = _anchor(reference, params)
        if len(samples) < 2 and anchor is None:
            raise InvalidReference("an arena compares a group's rollouts with each other: it "
                                   "needs at least two rollouts per group (or the anchor "
                                   "scheme and reference.anchor)")
        try:
            backend = resolve_backend(params.backend)
        except JudgeConfigError as exc:
            return [Outcome.failure(FailureKind.judge_unavailable, str(exc)) for _ in samples]
        texts = [s.completion for s in samples] + ([anchor] if anchor is not None else [])
        prompt = samples[0].prompt if samples else ""
        judge = _Judge(backend, prompt, reference, texts, params)
        seed = _group_seed(params.seed, context)
        result = run_tournament(len(samples), judge, scheme=params.scheme,
                                scoring=params.scoring, seed=seed, swap=params.swap,
                                **params.scheme_options_for(len(samples)))
        agreement = None
        if params.agreement_sample > 0 and _sampled(seed, params.agreement_sample):
            full = run_tournament(len(samples), judge, scheme="round_robin", scoring="bt",
                                  seed=seed, swap=True)
            agreement = round(spearman(result.scores, full.scores), 6)
        return _outcomes(samples, result, judge, params, agreement)


class _Judge:
    """The tournament's ``judge_round``: renders each pair, asks the backend for the round as
    one batch, reads the ``[[A>B]]`` label; keeps the usage and the failures."""

    def __init__(self, backend: ChatBackend, prompt: str, reference: Mapping[str, Any],
                 texts: Sequence[str], params: ArenaParams) -> None:
        self.backend = backend
        self.prompt = prompt
        self.reference = reference_text(reference, skip=("rubric", "anchor"))
        self.texts = texts
        self.params = params
        self.usage: Usage = backend.usage()
        self.failures: dict[int, list[JudgeFailure]] = {}

    def __call__(self, pairs: list[tuple[int, int]]) -> list[Verdict | None]:
        requests = [self._request(i, j) for i, j in pairs]
        answers = ask_all(self.backend, requests,
                          self._parse,
                          self.params.retries, self.usage)
        verdicts: list[Verdict | None] = []
        for (i, j), answer in zip(pairs, answers):
            if isinstance(answer, JudgeFailure):
                for k in (i, j):
                    self.failures.setdefault(k, []).append(answer)
                verdicts.append(None)
            else:
                verdicts.append(answer.value)
        return verdicts

    def _parse(self, index: int, text: str) -> Verdict:
        if self.params.verdict_pattern is None:
            return Verdict.parse(parse_pairwise(text))
        label = parse_with_pattern(text, self.params.verdict_pattern, "verdict")
        try:
            return Verdict.parse(label)
        except ValueError as exc:
            raise Unparseable(str(exc)) from None

    def _request(self, i: int, j: int) -> ChatRequest:
        fields = {"prompt": self.prompt, "reference": self.reference,
                  "response_a": self.texts[i], "response_b": self.texts[j]}
        rendered = render(self.params.template or PAIRWISE,
                          PAIRWISE_SYSTEM if self.params.system is None else self.params.system,
                          fields)
        return ChatRequest(rendered.messages(), max_tokens=self.params.max_tokens,
                           temperature=self.params.temperature,
                           extra_body=self.params.extra_body)


def _anchor(reference: Mapping[str, Any], params: ArenaParams) -> str | None:
    needs = (params.scheme in ANCHOR_SCHEMES
             or (params.options or {}).get("seeding") == "anchor")
    anchor = reference.get("anchor", reference.get("answer"))
    if needs and not isinstance(anchor, str):
        raise InvalidReference(f"the {params.scheme} scheme compares against an anchor: give "
                               "reference.anchor (or reference.answer) as text")
    return anchor if needs else None


def _group_seed(seed: int, context: GroupContext) -> int:
    key = json.dumps([seed, context.run_id, context.group_id, context.step]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def _sampled(seed: int, fraction: float) -> bool:
    digest = hashlib.blake2b(f"agreement:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64 < fraction


def _ranks(scores: Sequence[float]) -> list[float]:
    """Each score's rank scaled to [0, 1] (1 = best), ties sharing their mean rank (scores
    equal to :data:`~rewardd.verifiers.judge.ratings.SCORE_DIGITS` decimals are ties)."""
    if len(scores) == 1:
        return [1.0]
    return [rank / (len(scores) - 1) for rank in average_ranks([rank_key(s) for s in scores])]


def _outcomes(samples: Sequence[Sample], result: TournamentResult, judge: _Judge,
              params: ArenaParams, agreement: float | None) -> list[Outcome]:
    n = len(samples)
    games = {i: {"wins": 0, "losses": 0, "ties": 0} for i in range(n)}
    for match in result.matches:
        if match.verdict is None:
            continue
        for player, sign in ((match.a, 1), (match.b, -1)):
            if player < n:
                margin = sign * match.verdict.margin
                games[player]["wins" if margin > 0 else "losses" if margin < 0 else "ties"] += 1
    usage = judge.usage.to_dict()
    usage["shared_by"] = n
    shared = {"scheme": params.scheme, "scoring": params.scoring, "swap": params.swap,
              "judge_calls": result.calls, "failed_calls": result.failed,
              "inconsistent": result.inconsistent, "judge": usage}
    if agreement is not None:
        shared["agreement_with_round_robin"] = agreement
    played = [i for i in range(n) if sum(games[i].values()) > 0]
    ranks = _ranks([result.scores[i] for i in played])
    rank_of = dict(zip(played, ranks))
    outcomes = []
    for i in range(n):
        detail = {**shared, "judge": {**usage, "share_index": i},
                  "score": rank_key(result.scores[i]), **games[i]}
        if i not in rank_of:
            failures = judge.failures.get(i) or []
            if failures:
                worst = min(failures, key=lambda f: KINDS_BY_PRIORITY.index(f.kind))
                kind, message = worst.kind, worst.message
            else:
                kind, message = FailureKind.judge_unavailable, "no comparison was asked"
            outcomes.append(Outcome.failure(kind, "no comparison of this rollout got a "
                                            f"verdict: {message}", **detail))
            continue
        if params.reward == "score":
            reward = float(result.scores[i])
        elif n == 1:  # a group of one has no rank: its result against the anchor instead
            decided = games[i]["wins"] + games[i]["losses"] + games[i]["ties"]
            reward = (games[i]["wins"] + games[i]["ties"] / 2) / decided
        else:
            reward = rank_of[i]
        outcomes.append(Outcome.success(reward, **detail))
    return outcomes
