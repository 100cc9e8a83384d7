"""slime adapter: a batched custom reward function scoring one group per rewardd call.

How slime uses it: with ``--custom-rm-path module.function --group-rm``, slime's rollout
(``slime/rollout/sglang_rollout.py``) generates a prompt's ``n_samples_per_prompt`` samples,
then calls ``batched_async_rm(args, group)``, which loads the function by dotted path
(``load_function``: the module is imported, the attribute read) and awaits
``function(args, samples, **kwargs)``; it assigns ``rewards[i]`` to ``samples[i].reward``,
or ``rewards[i][args.reward_key]`` when ``--reward-key`` is set. Some slime releases pass
``evaluation=`` as a keyword.

Users point slime at it with no code::

    --custom-rm-path rewardd_client.slime.group_reward --group-rm --rm-url http://rewardd:8000
    # and REWARDD_REWARDS=math in the rollout workers' environment

or with two lines in a module of theirs (``--custom-rm-path my_rm.reward``)::

    from rewardd_client.slime import reward_function
    reward = reward_function("http://rewardd:8000", "math")

The server URL comes from the argument, else ``REWARDD_URL``, else slime's ``--rm-url``
(``args.rm_url``). What is sent, one ``POST /v1/rewards`` per group (slime computes its own
advantages): the group's ``prompt`` (a chat prompt, a list of messages, as ``role: content``
lines), each sample's ``response`` as the completion with ``response_length`` as
``num_tokens`` and the response's ``tokens`` (the last ``response_length`` of them) as
``token_ids``, and the ``label`` as the reference (``{"answer": label}``; a dict label is the
reference itself). ``evaluation=True`` is passed on (judges grade the full rubric).

Sample status: an ``ABORTED`` sample is not sent and gets reward None (slime discards a group
holding one); ``TRUNCATED``, ``FAILED`` and ``COMPLETED`` samples are scored as they are (the
verifier sees the cut text). With ``--reward-key`` the rewards are dicts ``{"reward": total,
<component>: value, ...}``, so ``--reward-key math`` trains on one component. A sample that
rewardd could not score raises :class:`~rewardd_client._rewards.RewardFailed` unless its
component has a ``fallback``.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Awaitable, Callable, Sequence, Union

from rewardd_client._rewards import (RewardSpecs, reference_of, resolve_rewards, resolve_url,
                                     rollout_reward, rollouts_by_id)
from rewardd_client.client import AsyncRewarddClient

GroupReward = Callable[..., Awaitable[list]]
Reward = Union[float, dict, None]

ABORTED = "aborted"


def _status(sample: Any) -> str:
    status = getattr(sample, "status", None)
    return str(getattr(status, "value", status) or "").lower()


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):  # chat messages
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in prompt)
    return "" if prompt is None else str(prompt)


def _rollout(position: int, sample: Any) -> dict[str, Any]:
    rollout: dict[str, Any] = {"rollout_id": str(position), "completion": sample.response or ""}
    length = getattr(sample, "response_length", None)
    if length is not None:
        rollout["num_tokens"] = int(length)
        tokens = list(getattr(sample, "tokens", None) or [])
        if length and len(tokens) >= length:
            rollout["token_ids"] = tokens[len(tokens) - length:]
    return rollout


def build_request(samples: Sequence[Any], rewards: list[dict[str, Any]],
                  reference_key: str = "answer", evaluation: bool = False
                  ) -> tuple[dict[str, Any] | None, list[int]]:
    """The ``POST /v1/rewards`` body for one slime group (None when every sample was
    aborted) and the positions of the samples it scores."""
    scored = [i for i, sample in enumerate(samples) if _status(sample) != ABORTED]
    if not scored:
        return None, []
    first = samples[scored[0]]
    group_index = getattr(first, "group_index", None)
    group = {
        "group_id": str(0 if group_index is None else group_index),
        "prompt": _prompt_text(first.prompt),
        "reference": reference_of(first.label, reference_key),
        "rollouts": [_rollout(i, samples[i]) for i in scored],
    }
    body: dict[str, Any] = {"groups": [group], "rewards": rewards}
    if evaluation:
        body["evaluation"] = True
    return body, scored


def reward_function(base_url: str | None = None,
                    rewards: str | RewardSpecs | None = None, *,
                    reference_key: str = "answer", **client_options: Any) -> GroupReward:
    """A slime batched reward function (``--custom-rm-path`` with ``--group-rm``) scoring
    with rewardd at ``base_url`` (default ``REWARDD_URL``, then ``args.rm_url``) with the
    components ``rewards`` (specs, or verifier names such as ``"math"``; default
    ``REWARDD_REWARDS``). ``client_options`` go to
    :class:`~rewardd_client.AsyncRewarddClient`."""
    # one client per event loop: an httpx.AsyncClient belongs to the loop it first ran on
    clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRewarddClient]" = \
        weakref.WeakKeyDictionary()

    def client_for(args: Any) -> AsyncRewarddClient:
        loop = asyncio.get_running_loop()
        if loop not in clients:
            url = resolve_url(base_url, getattr(args, "rm_url", None))
            clients[loop] = AsyncRewarddClient(url, **client_options)
        return clients[loop]

    async def group_reward(args: Any, samples: list, **kwargs: Any) -> list[Reward]:
        specs = resolve_rewards(rewards)
        body, scored = build_request(samples, specs, reference_key,
                                     bool(kwargs.get("evaluation", False)))
        out: list[Reward] = [None] * len(samples)
        if body is None:
            return out
        results = rollouts_by_id(await client_for(args).rewards(body))
        group_id = body["groups"][0]["group_id"]
        keyed = bool(getattr(args, "reward_key", None) or getattr(args, "eval_reward_key", None))
        for position in scored:
            rollout = results[(group_id, str(position))]
            total = rollout_reward(rollout)
            out[position] = {"reward": total, **rollout.get("rewards", {})} if keyed else total
        return out

    return group_reward


group_reward = reward_function()
"""slime's batched reward function configured by ``REWARDD_URL`` (or ``--rm-url``) and
``REWARDD_REWARDS``: ``--custom-rm-path rewardd_client.slime.group_reward --group-rm``."""
