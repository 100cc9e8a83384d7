"""TRL adapter: rewardd as the reward functions of TRL's GRPOTrainer, and, optionally, as the
source of the per-token advantages it trains on.

    from rewardd_client.trl import reward_function
    reward = reward_function("http://127.0.0.1:8000", "math")   # dataset column "answer"
    trainer = GRPOTrainer(model=..., reward_funcs=reward, args=..., train_dataset=...)

How TRL calls a reward function (trl 1.16, ``GRPOTrainer._calculate_rewards``): keyword lists
``prompts``, ``completions`` and ``completion_ids``, one entry per rollout of this process's
slice; every other dataset column as a keyword list of the same length; and ``trainer_state``,
``log_extra``, ``log_metric`` (and ``environments``) as single objects. It wants one float or
None per rollout back; None becomes NaN, which TRL leaves out of the group's baseline.

Choices made here:

- Groups are rebuilt as runs of consecutive equal (prompt, reference) pairs
  (:func:`rewardd_client._groups.runs_of_equal`), not blocks of ``num_generations``: a
  process's slice may start inside a group ([4, 2] on one process, [2, 4] on the next).
- One request per batch, ``POST /v1/rewards``: rewardd verifies, TRL computes its own
  advantages. A failed cell (no fallback) gives None, never a silent 0; the batch's count of
  failed cells goes to TRL's ``log_metric`` as ``rewardd/failed_cells`` (TRL averages it
  over processes), since TRL otherwise shows a None only when a whole row has none. With a
  ``run_id``, the server sentinel's signals go there too, as ``rewardd/sentinel/<signal>``
  (1.0 while one holds: docs/sentinel.md).
- :func:`reward_functions` returns one function per reward component so TRL logs each one
  (``rewards/<name>/mean``); they share one request per batch: the first member called for a
  batch sends it, the others reuse its answer while their arguments are the same batch. They
  return each component's own value: TRL weights them with ``GRPOConfig.reward_weights``
  (the ``weight`` attribute of each function holds the spec's weight, to pass there).
- Chat prompts and completions (lists of messages) are sent as text: the completion is the
  content of its assistant messages, joined by newlines; the prompt is ``role: content``
  lines. Content given as parts keeps its text parts.
- The specs are checked against the server's catalogue when the functions are made
  (:mod:`rewardd_client._catalogue`): an unknown verifier fails then, not at the first step
  after generation; an unreachable server fails too, unless ``validate=False``.
- :func:`rewardd_advantages` replaces the advantages TRL computed by rewardd's per-token
  advantages (any estimator of the catalogue), in one ``POST /v1/score`` per step when the
  trainer's reward functions are these (the functions then send nothing themselves); its
  module (:mod:`rewardd_client._trl_advantages`) says how and why.

Nothing here imports TRL at module level, so the client installs and imports without it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

from rewardd_client import AsyncRewarddClient, RewarddClient
from rewardd_client._catalogue import CatalogueUnavailable, NotInCatalogue, check_rewards
from rewardd_client._rewards import sentinel_flags
from rewardd_client._trl_batch import (TRAINER_KEYWORDS, Batch, ReferenceFn, RewardSpecs,
                                       TRLInputError, completion_text, prompt_text, specs_of)
from rewardd_client.client import Wire


def _by_rollout(answer: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {r["rollout_id"]: r for group in answer["groups"] for r in group["rollouts"]}


class _SharedCall:
    """One request per batch for every function made together.

    A member's call reuses the last answer when its body equals the last body and this member
    has not been served that answer yet; otherwise it is a new batch (even one equal to the
    last: a member called twice means TRL moved on). Async members share the pending task, so
    TRL's ``asyncio.gather`` of them sends one request."""

    def __init__(self, base_url: str, wire: Wire, api_key: str | None, timeout: float,
                 client: RewarddClient | AsyncRewarddClient | None) -> None:
        self.base_url, self.wire, self.api_key, self.timeout = base_url, wire, api_key, timeout
        self.client = client
        self._body: dict[str, Any] | None = None
        self._answer: Any = None
        self._served: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getstate__(self) -> dict[str, Any]:  # picklable: clients and tasks stay behind
        return {**self.__dict__, "client": None, "_body": None, "_answer": None,
                "_served": set(), "_loop": None}

    def _cached(self, body: dict[str, Any], member: str) -> bool:
        if self._body is not None and member not in self._served and body == self._body:
            self._served.add(member)
            return True
        self._body, self._served = body, {member}
        return False

    def fetch(self, body: dict[str, Any], member: str) -> tuple[Mapping[str, Any], bool]:
        """The answer for ``body``, and whether this call sent the request."""
        if self._cached(body, member):
            return self._answer, False
        if self.client is None:
            self.client = RewarddClient(self.base_url, wire=self.wire, api_key=self.api_key,
                                        timeout=self.timeout)
        try:
            self._answer = self.client.rewards(body)
        except BaseException:
            self._body = None  # a failed batch is never served from the cache
            raise
        return self._answer, True

    async def afetch(self, body: dict[str, Any], member: str) -> tuple[Mapping[str, Any], bool]:
        if self._cached(body, member):
            return await asyncio.shield(self._answer), False
        loop = asyncio.get_running_loop()
        if self.client is None or self._loop not in (None, loop):
            # an httpx.AsyncClient belongs to the loop it first ran on
            self.client = AsyncRewarddClient(self.base_url, wire=self.wire,
                                             api_key=self.api_key, timeout=self.timeout)
        self._loop = loop
        self._answer = asyncio.ensure_future(self.client.rewards(body))
        return await asyncio.shield(self._answer), True


class _Function:
    """Shared by the sync and async reward functions: the request body and reading answers."""

    def __init__(self, batch: Batch, call: _SharedCall, component: str | None, name: str,
                 weight: float) -> None:
        self._batch, self._call, self.component = batch, call, component
        self.__name__ = name
        self.weight = weight

    def _values(self, answer: Mapping[str, Any], size: int, sent: bool,
                kwargs: Mapping[str, Any]) -> list[float | None]:
        rollouts = _by_rollout(answer)
        if self.component is None:
            values = [rollouts[f"r{i}"]["reward"] for i in range(size)]
        else:
            values = [rollouts[f"r{i}"]["rewards"].get(self.component) for i in range(size)]
        log_metric = kwargs.get("log_metric")
        if sent and callable(log_metric):  # once per batch: failed cells are otherwise silent
            log_metric("rewardd/failed_cells", float(answer["summary"]["failed_cells"]))
            for key, flag in sentinel_flags(answer["summary"], "rewardd/sentinel/").items():
                log_metric(key, flag)
        return values

    def __repr__(self) -> str:
        return f"<rewardd reward function {self.__name__!r}>"


class RewardFunction(_Function):
    """A TRL reward function backed by rewardd (see :func:`reward_function`)."""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]] | None = None,
                 **kwargs: Any) -> list[float | None]:
        body = self._batch.body(prompts, completions, completion_ids, kwargs)
        answer, sent = self._call.fetch(body, self.__name__)
        return self._values(answer, len(prompts), sent, kwargs)


class AsyncRewardFunction(_Function):
    """The async form: TRL runs async reward functions concurrently on its own event loop."""

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                       completion_ids: Sequence[Sequence[int]] | None = None,
                       **kwargs: Any) -> list[float | None]:
        body = self._batch.body(prompts, completions, completion_ids, kwargs)
        answer, sent = await self._call.afetch(body, self.__name__)
        return self._values(answer, len(prompts), sent, kwargs)


def _make(kind: type[_Function], base_url: str, rewards: RewardSpecs,
          reference_column: str | None, components: bool, *, reference_fn: ReferenceFn | None,
          run_id: str | None, name: str | None, wire: Wire, api_key: str | None,
          timeout: float, client: Any, validate: bool) -> list[Any]:
    specs = specs_of(rewards)
    if validate:
        _check_specs(specs, base_url, wire, api_key, timeout, client)
    batch = Batch(specs, reference_column, reference_fn, run_id)
    call = _SharedCall(base_url, wire, api_key, timeout, client)
    if not components:
        label = name or (specs[0]["name"] if len(specs) == 1 else "rewardd")
        return [kind(batch, call, None, label, 1.0)]
    return [kind(batch, call, s["name"], s["name"], float(s.get("weight", 1.0))) for s in specs]


def _check_specs(specs: list[dict[str, Any]], base_url: str, wire: Wire, api_key: str | None,
                 timeout: float, client: Any) -> None:
    """The specs' verifiers against ``GET /v1/verifiers`` (:mod:`rewardd_client._catalogue`),
    with the caller's blocking client, else a short-lived one of the same settings."""
    if isinstance(client, RewarddClient):
        check_rewards(client, specs)
        return
    with RewarddClient(base_url, wire=wire, api_key=api_key, timeout=timeout) as checker:
        check_rewards(checker, specs)


def reward_function(base_url: str, rewards: RewardSpecs, reference_column: str | None = "answer",
                    *, reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                    name: str | None = None, wire: Wire = "json", api_key: str | None = None,
                    timeout: float = 600.0, client: RewarddClient | None = None,
                    validate: bool = True) -> RewardFunction:
    """A TRL reward function returning rewardd's weighted reward of each completion.

    ``rewards``: the reward components (:data:`RewardSpecs`). The dataset column
    ``reference_column`` becomes each group's reference ``{"answer": value}``; ``reference_fn``
    builds any reference instead from the row (a dict of that completion's dataset columns and
    its ``prompt``); ``reference_column=None`` sends none. A completion whose rollout rewardd
    excluded (a failed cell without fallback) gets None. ``run_id`` is sent with each batch,
    TRL's ``trainer_state.global_step`` as ``step``. ``__name__`` (what TRL logs it as) is
    ``name``, else the one component's name, else ``"rewardd"``. ``client`` reuses a client;
    otherwise one is made on first use from ``wire``, ``api_key`` and ``timeout``.

    ``validate`` (default True) checks, now, that every spec's verifier is one the server
    offers (``GET /v1/verifiers``): an unknown one raises :class:`NotInCatalogue` naming it and
    the known ones, instead of a 422 at the first step, after generation. An unreachable
    server raises :class:`CatalogueUnavailable`; ``validate=False`` skips the check (to build
    the functions before the server is up).
    """
    return _make(RewardFunction, base_url, rewards, reference_column, False,
                 reference_fn=reference_fn, run_id=run_id, name=name, wire=wire,
                 api_key=api_key, timeout=timeout, client=client, validate=validate)[0]


def async_reward_function(base_url: str, rewards: RewardSpecs,
                          reference_column: str | None = "answer", *,
                          reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                          name: str | None = None, wire: Wire = "json",
                          api_key: str | None = None, timeout: float = 600.0,
                          client: AsyncRewarddClient | None = None,
                          validate: bool = True) -> AsyncRewardFunction:
    """:func:`reward_function`, async: TRL awaits it on its event loop beside other async
    reward functions, so slow verifiers overlap with them."""
    return _make(AsyncRewardFunction, base_url, rewards, reference_column, False,
                 reference_fn=reference_fn, run_id=run_id, name=name, wire=wire,
                 api_key=api_key, timeout=timeout, client=client, validate=validate)[0]


def reward_functions(base_url: str, rewards: RewardSpecs, reference_column: str | None = "answer",
                     *, reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                     wire: Wire = "json", api_key: str | None = None, timeout: float = 600.0,
                     client: RewarddClient | None = None,
                     validate: bool = True) -> list[RewardFunction]:
    """One TRL reward function per component of ``rewards`` (named after it, returning its
    value, None where its cell failed), all served by one request per batch. Pass
    ``reward_weights=[f.weight for f in functions]`` to ``GRPOConfig`` when the specs weigh
    components other than 1. Other arguments as in :func:`reward_function`."""
    return _make(RewardFunction, base_url, rewards, reference_column, True,
                 reference_fn=reference_fn, run_id=run_id, name=None, wire=wire,
                 api_key=api_key, timeout=timeout, client=client, validate=validate)


def async_reward_functions(base_url: str, rewards: RewardSpecs,
                           reference_column: str | None = "answer", *,
                           reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                           wire: Wire = "json", api_key: str | None = None,
                           timeout: float = 600.0, client: AsyncRewarddClient | None = None,
                           validate: bool = True) -> list[AsyncRewardFunction]:
    """:func:`reward_functions`, async: TRL gathers them concurrently; they still send one
    request per batch."""
    return _make(AsyncRewardFunction, base_url, rewards, reference_column, True,
                 reference_fn=reference_fn, run_id=run_id, name=None, wire=wire,
                 api_key=api_key, timeout=timeout, client=client, validate=validate)


from rewardd_client._trl_advantages import rewardd_advantages  # noqa: E402  (re-export)

__all__ = ["AsyncRewardFunction", "CatalogueUnavailable", "NotInCatalogue", "RewardFunction",
           "RewardSpecs", "TRAINER_KEYWORDS", "TRLInputError", "async_reward_function",
           "async_reward_functions", "completion_text", "prompt_text", "reward_function",
           "reward_functions", "rewardd_advantages"]
