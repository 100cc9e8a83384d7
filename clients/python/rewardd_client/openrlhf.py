"""OpenRLHF adapter: a ``reward_func(queries, prompts, labels)`` that scores with rewardd.

How OpenRLHF (0.11.2) uses it: when ``--reward.remote_url`` names a ``.py`` file, the
single-turn executor (``openrlhf.utils.agent.SingleTurnAgentExecutor``) imports that file by
path and calls its ``reward_func(queries, prompts, labels)`` in a worker thread, one sample
per call in 0.11.2 (earlier releases passed a batch; this function takes either). ``queries``
are the decoded prompt + response (special tokens kept), ``prompts`` the prompts as the
dataset rendered them, ``labels`` the ``--data.label_key`` column. It reads back a dict:
``rewards`` (trained on), ``scores`` (dynamic filtering; defaults to rewards) and
``extra_logs`` (logged per sample), each a tensor with one entry per query.

The file users point OpenRLHF at is two lines (``python -m rewardd_client.openrlhf --write
reward_rewardd.py --url ... --rewards math`` writes it)::

    from rewardd_client.openrlhf import reward_function
    reward_func = reward_function("http://127.0.0.1:8000", "math")

A constant in that file is the robust way to configure it: the function runs inside
OpenRLHF's Ray actors, which see the driver's environment only through Ray's runtime_env.
``from rewardd_client.openrlhf import reward_func`` (configured by ``REWARDD_URL`` and
``REWARDD_REWARDS``) works where the environment does reach them.

What a call does: samples are grouped by runs of equal prompts and labels (OpenRLHF keeps a
prompt's samples adjacent), the response is the query after its prompt, the label becomes the group's
reference (``{"answer": label}``; a dict label is the reference itself), and the whole call is
one ``POST /v1/rewards``: rewards only, since OpenRLHF computes its own advantages. Each
component's value is logged as ``extra_logs["rewardd_<name>"]``. A rollout that rewardd
could not score raises :class:`~rewardd_client._rewards.RewardFailed` (OpenRLHF logs it and
trains without that sample's reward) unless its component has a ``fallback``.

OpenRLHF's other mode, an HTTP reward server (``--reward.remote_url http://...`` posting
``{"query", "prompts", "labels"}``), needs a server route (``POST /get_reward``); that is the
server's business, not this client's.
"""

from __future__ import annotations

import argparse
import threading
import warnings
from typing import Any, Callable, Mapping, Sequence, Union

from rewardd_client._groups import runs_of_equal
from rewardd_client._requires import require
from rewardd_client._rewards import (RewardSpecs, reference_of, resolve_rewards, resolve_url,
                                     rollout_reward, rollouts_by_id)
from rewardd_client.client import RewarddClient

RewardFunc = Callable[..., dict]
RewardsArg = Union[str, RewardSpecs, None]

LOG_PREFIX = "rewardd_"


def response_of(query: str, prompt: str) -> str:
    """The response inside an OpenRLHF query (the decoded prompt + response). The query
    starts with the prompt when the tokenizer decodes exactly what it encoded; when it does
    not, the whole query is scored (with a warning), as OpenRLHF's own example does."""
    if isinstance(prompt, str) and query.startswith(prompt):
        return query[len(prompt):]
    warnings.warn("rewardd_client.openrlhf: a query does not start with its prompt (the "
                  "tokenizer does not decode the prompt exactly); scoring the whole query",
                  RuntimeWarning, stacklevel=3)
    return query


def build_request(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any],
                  rewards: list[dict[str, Any]], reference_key: str = "answer"
                  ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The ``POST /v1/rewards`` body for one call, and the (group_id, rollout_id) of each
    query in order. Groups are runs of equal (prompt, label) pairs (see ``_groups``): a
    group's reference is their label."""
    if not len(queries) == len(prompts) == len(labels):
        raise ValueError(f"queries, prompts and labels differ in length: {len(queries)}, "
                         f"{len(prompts)}, {len(labels)}")
    groups: list[dict[str, Any]] = []
    keys: list[tuple[str, str]] = []
    for indexes in runs_of_equal(list(zip(prompts, labels))):
        group_id = str(len(groups))
        prompt = prompts[indexes[0]]
        groups.append({
            "group_id": group_id,
            "prompt": prompt if isinstance(prompt, str) else str(prompt),
            "reference": reference_of(labels[indexes[0]], reference_key),
            "rollouts": [{"rollout_id": str(i), "completion": response_of(queries[i], prompt)}
                         for i in indexes],
        })
        keys.extend((group_id, str(i)) for i in indexes)
    return {"groups": groups, "rewards": rewards}, keys


def reward_function(base_url: str | None = None, rewards: RewardsArg = None, *,
                    reference_key: str = "answer", score_component: str | None = None,
                    **client_options: Any) -> RewardFunc:
    """An OpenRLHF ``reward_func`` scoring with rewardd at ``base_url`` (default
    ``REWARDD_URL``) with the components ``rewards`` (reward specs, or verifier names as
    ``"math"`` / ``"math,format"``; default ``REWARDD_REWARDS``). ``scores`` (OpenRLHF's
    dynamic-filtering value) is the trained reward, or the component ``score_component``.
    ``client_options`` go to :class:`~rewardd_client.RewarddClient` (``api_key``, ``wire``,
    ``timeout``). Needs torch (``pip install 'rewardd-client[openrlhf]'``; OpenRLHF has it),
    checked now; the server and components are not resolved until the first call."""
    require(("torch",), adapter="rewardd_client.openrlhf", extra="openrlhf")
    state: dict[str, Any] = {}
    lock = threading.Lock()

    def client_and_specs() -> tuple[RewarddClient, list[dict[str, Any]]]:
        with lock:  # OpenRLHF calls from several threads at once
            if not state:
                state["specs"] = resolve_rewards(rewards)
                state["client"] = RewarddClient(resolve_url(base_url), **client_options)
        return state["client"], state["specs"]

    def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any],
                    **kwargs: Any) -> dict:
        import torch  # OpenRLHF always has it; the client does not depend on it

        client, specs = client_and_specs()
        body, keys = build_request(queries, prompts, labels, specs, reference_key)
        results = rollouts_by_id(client.rewards(body))
        rollouts = [results[key] for key in keys]
        total = torch.tensor([rollout_reward(r) for r in rollouts], dtype=torch.float32)
        logs = {f"{LOG_PREFIX}{spec['name']}": torch.tensor(
                    [_component(r, spec["name"]) for r in rollouts], dtype=torch.float32)
                for spec in specs}
        scores = total if score_component is None else logs[f"{LOG_PREFIX}{score_component}"]
        return {"rewards": total, "scores": scores, "extra_logs": logs}

    return reward_func


def _component(rollout: Mapping[str, Any], name: str) -> float:
    value = (rollout.get("rewards") or {}).get(name)
    return float("nan") if value is None else float(value)  # logged only, never trained on


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any],
                **kwargs: Any) -> dict:
    """OpenRLHF's ``reward_func``, configured by ``REWARDD_URL`` and ``REWARDD_REWARDS``."""
    global _from_environment
    if _from_environment is None:
        _from_environment = reward_function()
    return _from_environment(queries, prompts, labels, **kwargs)


_from_environment: RewardFunc | None = None

FILE_TEMPLATE = '''\
"""OpenRLHF reward function scoring with rewardd: --reward.remote_url {path}"""
from rewardd_client.openrlhf import reward_function

reward_func = reward_function({url!r}, {rewards!r})
'''


def write_file(path: str, url: str, rewards: str) -> str:
    """Write the file OpenRLHF loads (``--reward.remote_url path``); return its text."""
    text = FILE_TEMPLATE.format(path=path, url=url, rewards=rewards)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rewardd_client.openrlhf",
        description="Write the reward-function file OpenRLHF loads with --reward.remote_url.")
    parser.add_argument("--write", required=True, metavar="PATH", help="file to write (.py)")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="rewardd base URL")
    parser.add_argument("--rewards", default="math",
                        help="verifier names (math,format) or JSON reward specs")
    args = parser.parse_args(argv)
    if not args.write.endswith(".py"):
        parser.error("--write: OpenRLHF loads a reward function only from a path ending in .py")
    write_file(args.write, args.url, args.rewards)
    print(f"wrote {args.write}; train with --reward.remote_url {args.write}")


if __name__ == "__main__":
    main()
