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
  over processes), since TRL otherwise shows a None only when a whole row has none.
- :func:`reward_functions` returns one function per reward component so TRL logs each one
  (``rewards/<name>/mean``); they share one request per batch: the first member called for a
  batch sends it, the others reuse its answer while their arguments are the same batch. They
  return each component's own value: TRL weights them with ``GRPOConfig.reward_weights``
  (the ``weight`` attribute of each function holds the spec's weight, to pass there).
- Chat prompts and completions (lists of messages) are sent as text: the completion is the
  content of its assistant messages, joined by newlines; the prompt is ``role: content``
  lines. Content given as parts keeps its text parts.
- :func:`rewardd_advantages` replaces the advantages TRL computed by rewardd's per-token
  advantages (any estimator of the catalogue); its docstring says how and why.

Nothing here imports TRL at module level, so the client installs and imports without it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence, Union

from rewardd_client import AsyncRewarddClient, RewarddClient
from rewardd_client._groups import runs_of_equal
from rewardd_client._rewards import resolve_rewards
from rewardd_client.client import Wire

RewardSpecs = Union[str, Mapping[str, Any], Sequence[Mapping[str, Any]]]
"""Verifier names (``"math"``: one component of that name; ``"math,length"``), one reward spec dict
(``{"name": ..., "verifier": ..., "weight": ..., "params": ...}``) or a list of them."""

ReferenceFn = Callable[[Mapping[str, Any]], Mapping[str, Any]]

TRAINER_KEYWORDS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})
"""Keywords TRL adds beside the dataset columns; they are not columns."""

class TRLInputError(ValueError):
    """What the adapter was given or called with cannot make a rewardd request.

    ``field`` names the argument or dataset column, ``reason`` says what is wrong with it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _specs(rewards: RewardSpecs) -> list[dict[str, Any]]:
    if isinstance(rewards, str):  # "math", "math,length" or JSON, as REWARDD_REWARDS takes them
        return resolve_rewards(rewards)
    listed = [rewards] if isinstance(rewards, Mapping) else list(rewards)
    if not listed:
        raise TRLInputError("rewards", "at least one reward spec is needed")
    for index, spec in enumerate(listed):
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            raise TRLInputError(f"rewards[{index}]", "a reward spec is a dict with a string "
                                "'name' and a 'verifier' (see GET /v1/verifiers)")
    return [dict(spec) for spec in listed]


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, Mapping) and part.get("type") == "text")
    return "" if content is None else str(content)


def prompt_text(prompt: Any) -> str:
    """A TRL prompt as text: a string as it is, a list of messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '')}: {_content(m.get('content'))}" for m in prompt)


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string as it is; of a list of messages, the content of the
    assistant messages, joined by newlines (tool results and other roles are not the model's)."""
    if isinstance(completion, str):
        return completion
    return "\n".join(_content(m.get("content")) for m in completion
                     if m.get("role") == "assistant")


class _Batch:
    """Builds the ``POST /v1/rewards`` body of one TRL call; rollout ``r<i>`` is flat index i."""

    def __init__(self, specs: list[dict[str, Any]], reference_column: str | None,
                 reference_fn: ReferenceFn | None, run_id: str | None) -> None:
        self.specs = specs
        self.reference_column = reference_column
        self.reference_fn = reference_fn
        self.run_id = run_id

    def _references(self, prompts: Sequence[Any], columns: Mapping[str, Any]) -> list[dict]:
        size = len(prompts)
        for name, values in columns.items():
            if not isinstance(values, (list, tuple)) or len(values) != size:
                raise TRLInputError(name, f"a dataset column must be a list of {size} values "
                                    "(one per completion), as TRL passes them")
        if self.reference_fn is not None:
            references = []
            for i in range(size):
                reference = self.reference_fn({"prompt": prompts[i],
                                               **{k: v[i] for k, v in columns.items()}})
                if not isinstance(reference, Mapping):
                    raise TRLInputError("reference_fn", "must return a dict (the group's "
                                        f"reference), returned {type(reference).__name__}")
                references.append(dict(reference))
            return references
        if self.reference_column is None:
            return [{} for _ in range(size)]
        if self.reference_column not in columns:
            raise TRLInputError(self.reference_column, "no such dataset column; TRL passed "
                                f"{sorted(columns) or 'no columns'} (set reference_column, "
                                "or reference_fn, or reference_column=None)")
        return [{"answer": value} for value in columns[self.reference_column]]

    def body(self, prompts: Sequence[Any], completions: Sequence[Any],
             completion_ids: Sequence[Sequence[int]] | None, kwargs: Mapping[str, Any]
             ) -> dict[str, Any]:
        if len(completions) != len(prompts):
            raise TRLInputError("completions", f"{len(completions)} completions for "
                                f"{len(prompts)} prompts")
        if completion_ids is not None and len(completion_ids) != len(prompts):
            raise TRLInputError("completion_ids", f"{len(completion_ids)} entries for "
                                f"{len(prompts)} prompts")
        columns = {k: v for k, v in kwargs.items() if k not in TRAINER_KEYWORDS}
        references = self._references(prompts, columns)
        groups = []
        for number, run in enumerate(runs_of_equal(list(zip(prompts, references)))):
            rollouts = []
            for i in run:
                rollout: dict[str, Any] = {"rollout_id": f"r{i}",
                                           "completion": completion_text(completions[i])}
                if completion_ids is not None:
                    rollout["num_tokens"] = len(completion_ids[i])
                rollouts.append(rollout)
            groups.append({"group_id": f"g{number}", "prompt": prompt_text(prompts[run[0]]),
                           "reference": references[run[0]], "rollouts": rollouts})
        body: dict[str, Any] = {"groups": groups, "rewards": self.specs}
        if self.run_id is not None:
            body["run_id"] = self.run_id
        state = kwargs.get("trainer_state")
        if getattr(state, "global_step", None) is not None:
            body["step"] = int(state.global_step)  # rubric dropout draws per step
        return body


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

    def __init__(self, batch: _Batch, call: _SharedCall, component: str | None, name: str,
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
          timeout: float, client: Any) -> list[Any]:
    specs = _specs(rewards)
    batch = _Batch(specs, reference_column, reference_fn, run_id)
    call = _SharedCall(base_url, wire, api_key, timeout, client)
    if not components:
        label = name or (specs[0]["name"] if len(specs) == 1 else "rewardd")
        return [kind(batch, call, None, label, 1.0)]
    return [kind(batch, call, s["name"], s["name"], float(s.get("weight", 1.0))) for s in specs]


def reward_function(base_url: str, rewards: RewardSpecs, reference_column: str | None = "answer",
                    *, reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                    name: str | None = None, wire: Wire = "json", api_key: str | None = None,
                    timeout: float = 600.0, client: RewarddClient | None = None
                    ) -> RewardFunction:
    """A TRL reward function returning rewardd's weighted reward of each completion.

    ``rewards``: the reward components (:data:`RewardSpecs`). The dataset column
    ``reference_column`` becomes each group's reference ``{"answer": value}``; ``reference_fn``
    builds any reference instead from the row (a dict of that completion's dataset columns and
    its ``prompt``); ``reference_column=None`` sends none. A completion whose rollout rewardd
    excluded (a failed cell without fallback) gets None. ``run_id`` is sent with each batch,
    TRL's ``trainer_state.global_step`` as ``step``. ``__name__`` (what TRL logs it as) is
    ``name``, else the one component's name, else ``"rewardd"``. ``client`` reuses a client;
    otherwise one is made on first use from ``wire``, ``api_key`` and ``timeout``.
    """
    return _make(RewardFunction, base_url, rewards, reference_column, False,
                 reference_fn=reference_fn, run_id=run_id, name=name, wire=wire,
                 api_key=api_key, timeout=timeout, client=client)[0]


def async_reward_function(base_url: str, rewards: RewardSpecs,
                          reference_column: str | None = "answer", *,
                          reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                          name: str | None = None, wire: Wire = "json",
                          api_key: str | None = None, timeout: float = 600.0,
                          client: AsyncRewarddClient | None = None) -> AsyncRewardFunction:
    """:func:`reward_function`, async: TRL awaits it on its event loop beside other async
    reward functions, so slow verifiers overlap with them."""
    return _make(AsyncRewardFunction, base_url, rewards, reference_column, False,
                 reference_fn=reference_fn, run_id=run_id, name=name, wire=wire,
                 api_key=api_key, timeout=timeout, client=client)[0]


def reward_functions(base_url: str, rewards: RewardSpecs, reference_column: str | None = "answer",
                     *, reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                     wire: Wire = "json", api_key: str | None = None, timeout: float = 600.0,
                     client: RewarddClient | None = None) -> list[RewardFunction]:
    """One TRL reward function per component of ``rewards`` (named after it, returning its
    value, None where its cell failed), all served by one request per batch. Pass
    ``reward_weights=[f.weight for f in functions]`` to ``GRPOConfig`` when the specs weigh
    components other than 1. Other arguments as in :func:`reward_function`."""
    return _make(RewardFunction, base_url, rewards, reference_column, True,
                 reference_fn=reference_fn, run_id=run_id, name=None, wire=wire,
                 api_key=api_key, timeout=timeout, client=client)


def async_reward_functions(base_url: str, rewards: RewardSpecs,
                           reference_column: str | None = "answer", *,
                           reference_fn: ReferenceFn | None = None, run_id: str | None = None,
                           wire: Wire = "json", api_key: str | None = None,
                           timeout: float = 600.0, client: AsyncRewarddClient | None = None
                           ) -> list[AsyncRewardFunction]:
    """:func:`reward_functions`, async: TRL gathers them concurrently; they still send one
    request per batch."""
    return _make(AsyncRewardFunction, base_url, rewards, reference_column, True,
                 reference_fn=reference_fn, run_id=run_id, name=None, wire=wire,
                 api_key=api_key, timeout=timeout, client=client)


from rewardd_client._trl_advantages import rewardd_advantages  # noqa: E402  (re-export)

__all__ = ["AsyncRewardFunction", "RewardFunction", "TRLInputError", "async_reward_function",
           "async_reward_functions", "completion_text", "prompt_text", "reward_function",
           "reward_functions", "rewardd_advantages"]
