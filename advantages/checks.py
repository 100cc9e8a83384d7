"""Request rules of the advantage step that span fields or need the registry, each reported
with its exact path.

pydantic checks types and single-field constraints; the rules here (per-token array lengths,
span ranges and overlaps, duplicate ids, names and parameters of catalogue entries and the
inputs they need) would lose their field path inside a pydantic model validator, so they run
as a second pass that collects errors and raises one :class:`RequestInvalid` (the
``{"loc", "msg", "type"}`` shape FastAPI uses). The service adds its verifier rules
(:mod:`rewardd.service.validation`); the in-process entry point runs exactly these.

The checks are generators, consumed through :func:`rewardd.advantages.errors.capped`: the
pass stops after :data:`~rewardd.advantages.errors.MAX_ERRORS` errors (plus one to know
there are more), so a batch of 10^6 bad rollouts costs the same to refuse as one of 101.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterable, Iterator, Sequence

from pydantic import BaseModel, ValidationError

from rewardd.advantages.errors import Loc, RequestInvalid, capped, error
from rewardd.advantages.models import AdvantageSpec, AdvantagesRequest, Group, Rollout
from rewardd.advantages.profiles import pins_for
from rewardd.advantages.registry import Kind, PinnedParam, get_entry, resolve_estimator

MAX_TOKENS_PER_REQUEST = 1 << 27
"""Dense and rle advantages materialise one float64 per token: 134M tokens is 1 GiB. The
in-process default; the server passes its own, much lower, bound (:class:`SizeLimits`)."""


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """What one request may make the advantage step hold, checked before any of it is
    computed: ``max_tokens`` per-token advantages (dense or rle output; a 1.4 MB body
    asking for 2^26 tokens became a 1.3 GB JSON answer) and ``max_rollouts`` rollouts (None:
    no bound). ``*_setting``: the setting a refusal names (the server's ``REWARDD_*``)."""

    max_tokens: int = MAX_TOKENS_PER_REQUEST
    max_rollouts: int | None = None
    tokens_setting: str | None = None
    rollouts_setting: str | None = None


DEFAULT_LIMITS = SizeLimits()
PER_TOKEN_FIELDS = ("mask", "token_rewards", "values", "kl", "signal")
SPAN_FIELDS = ("segments", "turns", "steps")


def pydantic_errors(exc: ValidationError, prefix: Loc) -> list[dict[str, Any]]:
    """Errors of a nested model validation, re-rooted at ``prefix``: the first
    :data:`~rewardd.advantages.errors.MAX_ERRORS`, then one entry counting the rest."""
    found = exc.errors(include_url=False, include_context=False, include_input=False)
    return capped((error(prefix + tuple(e["loc"]), e["msg"], e["type"]) for e in found),
                  exc.error_count())


def validate_params(model: type[BaseModel], params: dict[str, Any], loc: Loc) -> list[dict]:
    try:
        model.model_validate(params)
    except ValidationError as exc:
        return pydantic_errors(exc, loc)
    return []


def resolved_num_tokens(rollout: Rollout) -> int | None:
    """num_tokens as sent, else the length of token_ids."""
    if rollout.num_tokens is not None:
        return rollout.num_tokens
    return len(rollout.token_ids) if rollout.token_ids is not None else None


def _check_spans(spans: Sequence[Any], n: int, loc: Loc, what: str) -> Iterable[dict]:
    ordered = sorted(range(len(spans)), key=lambda k: spans[k].start)
    for k, span in enumerate(spans):
        if span.end <= span.start:
            yield error(loc + (k,), f"{what} [{span.start}, {span.end}) is empty or reversed: "
                        "end must be greater than start")
        elif span.end > n:
            yield error(loc + (k, "end"), f"{what} end {span.end} is past num_tokens {n}")
    for a, b in zip(ordered, ordered[1:]):
        if spans[b].start < spans[a].end:
            yield error(loc + (b,), f"{what} [{spans[b].start}, {spans[b].end}) overlaps "
                        f"{what}s[{a}] [{spans[a].start}, {spans[a].end})")


def check_rollout(rollout: Rollout, loc: Loc, needs_tokens: str | None) -> Iterator[dict]:
    """Per-token arrays have num_tokens entries; spans lie inside the response."""
    if (rollout.token_ids is not None and rollout.num_tokens is not None
            and len(rollout.token_ids) != rollout.num_tokens):
        yield error(loc + ("token_ids",), f"has {len(rollout.token_ids)} entries but "
                    f"num_tokens is {rollout.num_tokens}")
    if rollout.reward is not None and rollout.rewards is not None:
        yield error(loc + ("reward",), "send either reward or rewards, not both")
    n = resolved_num_tokens(rollout)
    if n is None:
        given = [f for f in (*PER_TOKEN_FIELDS, *SPAN_FIELDS) if getattr(rollout, f)]
        if given:
            yield error(loc + ("num_tokens",), f"required when {given[0]} is given")
        elif needs_tokens:
            yield error(loc + ("num_tokens",), f"required for advantage output "
                        f"{needs_tokens!r} (or send token_ids)", "missing")
        return
    for name in PER_TOKEN_FIELDS:
        values = getattr(rollout, name)
        if values is not None and len(values) != n:
            yield error(loc + (name,), f"has {len(values)} entries but num_tokens is {n}")
    if rollout.mask is not None and not set(rollout.mask) <= {0, 1}:
        bad = next(k for k, v in enumerate(rollout.mask) if v not in (0, 1))
        yield error(loc + ("mask", bad), f"mask entries must be 0 or 1, got "
                    f"{rollout.mask[bad]}")
    if rollout.segments:
        yield from _check_spans(rollout.segments, n, loc + ("segments",), "segment")
    if rollout.turns:
        yield from _check_spans(rollout.turns, n, loc + ("turns",), "turn")
    if rollout.steps:
        yield from _check_spans(rollout.steps, n, loc + ("steps",), "step")


def _over(total: int, limit: int | None, what: str, setting: str | None,
          advice: str) -> Iterator[dict]:
    """One 422 at ``body.groups`` when ``total`` ``what`` exceed ``limit`` (None: no bound),
    naming the bound's setting when there is one."""
    if limit is not None and total > limit:
        named = f" ({setting})" if setting else ""
        yield error(("body", "groups"), f"{total} {what} in one request is over the limit of "
                    f"{limit}{named}{advice}")


def check_rollout_count(groups: Sequence[Group], limits: SizeLimits) -> Iterator[dict]:
    """At most ``limits.max_rollouts`` rollouts in the request (a 422 at ``body.groups``)."""
    if limits.max_rollouts is not None:
        yield from _over(sum(len(group.rollouts) for group in groups), limits.max_rollouts,
                         "rollouts", limits.rollouts_setting,
                         "; split the batch into several requests or jobs")


def check_token_count(groups: Sequence[Group], needs_tokens: str | None,
                      limits: SizeLimits) -> Iterator[dict]:
    """At most ``limits.max_tokens`` per-token advantages in the answer when the output is
    dense or rle (a 422 at ``body.groups`` naming the bound); counted from ``num_tokens``
    before anything is computed."""
    if needs_tokens:
        yield from _over(sum(resolved_num_tokens(r) or 0 for g in groups for r in g.rollouts),
                         limits.max_tokens, "tokens", limits.tokens_setting,
                         f" for output {needs_tokens!r}; split the batch or use output "
                         "'scalar'")


def check_groups(groups: Sequence[Group], needs_tokens: str | None,
                 limits: SizeLimits = DEFAULT_LIMITS) -> Iterator[dict]:
    """The request's sizes (:func:`check_rollout_count`, :func:`check_token_count`), then
    ids, per-token lengths and spans; a request over a size bound is refused for that
    alone, without walking its rollouts further."""
    oversized = [*check_rollout_count(groups, limits),
                 *check_token_count(groups, needs_tokens, limits)]
    if oversized:
        yield from oversized
        return
    seen_groups: dict[str, int] = {}
    seen_rollouts: dict[str, tuple[int, int]] = {}
    for gi, group in enumerate(groups):
        gloc: Loc = ("body", "groups", gi)
        if group.group_id in seen_groups:
            yield error(gloc + ("group_id",), f"duplicate group_id {group.group_id!r} "
                        f"(first at groups[{seen_groups[group.group_id]}])")
        seen_groups.setdefault(group.group_id, gi)
        for ri, rollout in enumerate(group.rollouts):
            rloc = gloc + ("rollouts", ri)
            first = seen_rollouts.setdefault(rollout.rollout_id, (gi, ri))
            if first != (gi, ri):
                yield error(rloc + ("rollout_id",), f"duplicate rollout_id "
                            f"{rollout.rollout_id!r} (first at groups[{first[0]}]."
                            f"rollouts[{first[1]}])")
            yield from check_rollout(rollout, rloc, needs_tokens)


def check_advantage(spec: AdvantageSpec, groups: Sequence[Group],
                    run_id: str | None) -> Iterator[dict]:
    """Every stage names an entry of the right kind, with valid params and its inputs."""
    loc: Loc = ("body", "advantage")
    try:
        estimator, estimator_params = resolve_estimator(spec.estimator, spec.profile.value,
                                                        spec.params)
    except KeyError as exc:
        yield error(loc + ("estimator",), exc.args[0])
        estimator, estimator_params = None, spec.params
    except PinnedParam as exc:
        yield error(loc + ("params", exc.name), str(exc))
        return
    stages: list[tuple[Kind, str, dict[str, Any], Loc, Loc]] = [
        ("estimator", estimator.name if estimator else "", estimator_params,
         loc + ("estimator",), loc + ("params",)),
        ("aggregate", spec.aggregate, spec.aggregate_params, loc + ("aggregate",),
         loc + ("aggregate_params",))]
    for kind, field in (("transform", "transforms"), ("reweight", "reweight"),
                        ("filter", "filters")):
        stages += [(kind, s.name, s.params, loc + (field, k, "name"), loc + (field, k, "params"))
                   for k, s in enumerate(getattr(spec, field))]
    seen: set[str] = set()
    for k, stage in enumerate(spec.filters):
        if stage.name in seen:
            yield error(loc + ("filters", k, "name"), f"filter {stage.name!r} is requested "
                        "twice; its advice is keyed by name")
        seen.add(stage.name)
    for kind, name, params, name_loc, params_loc in stages:
        if kind == "estimator" and estimator is None:
            continue
        try:
            entry = get_entry(name, kind)
        except KeyError as exc:
            yield error(name_loc, exc.args[0])
            continue
        yield from validate_params(entry.Params, params, params_loc)
        if entry.stateful and run_id is None:
            yield error(("body", "run_id"), f"{kind} {name!r} keeps per-run state: "
                        "send a run_id")
        yield from check_inputs(entry.name, kind, entry.inputs, groups)
    if estimator is not None and "components" in estimator.inputs and spec.aggregate != "sum":
        yield error(loc + ("aggregate",), f"estimator {spec.estimator!r} routes each "
                    "reward component itself; use aggregate 'sum'")
    if pins_for(spec.profile).equal_group_sizes:
        sizes = {len(g.rollouts) for g in groups}
        if len(sizes) > 1:
            yield error(loc + ("profile",), f"profile {spec.profile.value!r} needs groups of "
                        f"equal size (contiguous blocks); got sizes {sorted(sizes)}")


ROLLOUT_INPUTS = {"values", "token_rewards", "token_ids", "segments", "turns", "steps", "kl",
                  "signal", "label", "cluster", "quality", "answer"}


def check_inputs(name: str, kind: str, inputs: Sequence[str], groups: Sequence[Group]
                 ) -> list[dict]:
    """A missing input an entry needs is a 422 naming the entry and the field (first only)."""
    for gi, group in enumerate(groups):
        gloc: Loc = ("body", "groups", gi)
        if "data_source" in inputs and group.data_source is None:
            return [error(gloc + ("data_source",), f"{kind} {name!r} needs data_source on "
                          "every group", "missing")]
        if "greedy" in inputs and sum(r.greedy for r in group.rollouts) != 1:
            return [error(gloc + ("rollouts",), f"{kind} {name!r} needs exactly one rollout "
                          "with greedy: true in every group", "missing")]
        for ri, rollout in enumerate(group.rollouts):
            for field in inputs:
                if field in ROLLOUT_INPUTS and getattr(rollout, field) is None:
                    return [error(gloc + ("rollouts", ri, field), f"{kind} {name!r} needs "
                                  f"{field} on every rollout", "missing")]
            if "embeddings" in inputs and any(s.embedding is None for s in rollout.steps or ()):
                return [error(gloc + ("rollouts", ri, "steps"), f"{kind} {name!r} needs an "
                              "embedding on every step", "missing")]
    return []


def raise_if(errors: Iterable[dict]) -> None:
    """Raise the errors (at most MAX_ERRORS of them, reading no further) if there are any."""
    listed = capped(errors)
    if listed:
        raise RequestInvalid(listed)


def tokens_needed_for(spec: AdvantageSpec | None) -> str | None:
    """The output format that needs num_tokens on every rollout, if any."""
    return spec.output if spec is not None and spec.output in ("dense", "rle") else None


def validate_advantages(req: AdvantagesRequest, limits: SizeLimits = DEFAULT_LIMITS) -> None:
    """Every cross-field rule of a /v1/advantages body; raises RequestInvalid."""
    raise_if(chain(check_groups(req.groups, tokens_needed_for(req.advantage), limits),
                   check_advantage(req.advantage, req.groups, req.run_id),
                   _no_rewards(req.groups)))


def _no_rewards(groups: Sequence[Group]) -> Iterator[dict]:
    if not any(r.reward is not None or r.rewards for g in groups for r in g.rollouts):
        yield error(("body", "groups"), "no rewards: send 'reward' or 'rewards' on each "
                    "rollout, or use /v1/score with verifiers")
