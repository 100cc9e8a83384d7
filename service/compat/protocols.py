"""The three trainers' request and answer shapes, replayed from their sources.

* **OpenRLHF 0.11.2** (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor.
  _fetch_rewards_via_http``, used when ``--reward.remote_url`` is an HTTP URL): posts
  ``{"query": [...], "prompts": [...], "labels": [...]}`` (one sample per request in 0.11.2;
  ``query`` is the decoded prompt and completion) and reads ``rewards``, ``scores`` (``rewards``
  when absent) and ``extra_logs`` of the JSON answer; each ``extra_logs`` value becomes a
  tensor (``torch.tensor([value])``), so values are numbers per sample, as in its own
  ``openrlhf.cli.serve_rm``. Older OpenRLHF posted ``{"query": [...]}`` alone: accepted.
* **slime** (``slime/rollout/rm_hub/__init__.py``, ``remote_rm``, ``--rm-type remote_rm
  --rm-url URL``): posts ``{"prompt", "response", "label"}`` (``prompt`` is text or chat
  messages) and keeps the whole JSON answer as ``sample.reward``; with ``--reward-key K`` it
  reads ``sample.reward[K]``.
* **NeMo-Gym** (``nemo_gym/base_resources_server.py``: ``BaseVerifyRequest``,
  ``BaseVerifyResponse``, ``BaseMultiRewardVerifyResponse``): ``POST /verify`` with
  ``responses_create_params`` (an OpenAI Responses create request), ``response`` (an OpenAI
  Responses object) and the task's own fields (``expected_answer``, ...); the answer is the
  request echoed with ``reward`` (float), ``reward_components`` (several rewards),
  ``mask_sample``, ``failure_kind`` and ``failure_reason``.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from rewardd.advantages.bounds import MAX_DEPTH, FreeForm, too_deep
from rewardd.advantages.errors import RequestInvalid, error
from rewardd.advantages.models import FiniteFloat
from rewardd.service.compat.config import CompatConfig
from rewardd.service.compat.samples import (SampleIn, completion_of_query, prompt_text,
                                            reference_of, responses_output_text)
from rewardd.service.compat.scoring import SampleOut

Label = FreeForm | StrictStr | StrictInt | StrictFloat | None
"""A dataset label: text (the answer), a number, an object (the reference itself) or null
(strict: ``true`` is not the number 1)."""


# ---- OpenRLHF ------------------------------------------------------------------------------

class OpenRLHFRequest(BaseModel):
    """Body of POST /get_reward (OpenRLHF ``--reward.remote_url``)."""

    model_config = ConfigDict(extra="forbid")

    query: list[str] = Field(description="Each sample's decoded prompt followed by its "
                             "completion.", max_length=65_536)
    prompts: list[str] | None = Field(
        None, description="Each sample's prompt (the completion is the query after it). "
        "Absent (OpenRLHF before 0.9): the whole query is scored.")
    labels: list[Label] | None = Field(
        None, description="Each sample's label (the dataset's --label_key): the answer, or "
        "an object that is the reference.")


class OpenRLHFResponse(BaseModel):
    rewards: list[float] = Field(description="What the trainer trains on: the reward, or the "
                                 "group advantage (openrlhf.value: advantage).")
    scores: list[float] = Field(description="The reward (dynamic filtering and logs).")
    extra_logs: dict[str, list[float]] = Field(
        description="Per sample: each component's value, `rewardd_failed` (1.0 when a check "
        "failed and its fallback was used), `rewardd_prompt_mismatch` (1.0 when the query "
        "did not start with its prompt and was scored whole) and, in group mode, "
        "`rewardd_group_size`.")


def openrlhf_samples(req: OpenRLHFRequest, config: CompatConfig) -> list[SampleIn]:
    """One sample per query; ``prompts`` and ``labels``, when sent, hold one per query."""
    for name in ("prompts", "labels"):
        given = getattr(req, name)
        if given is not None and len(given) != len(req.query):
            raise RequestInvalid([error(("body", name), f"{len(given)} entries, and query has "
                                        f"{len(req.query)}: one per sample")])
    samples = []
    for i, query in enumerate(req.query):
        prompt = req.prompts[i] if req.prompts is not None else None
        completion, mismatch = completion_of_query(query, prompt)
        label = req.labels[i] if req.labels is not None else None
        samples.append(SampleIn(prompt or "", completion,
                                reference_of(label, config, ("body", "labels", i)),
                                ("body", "labels", i), mismatch))
    return samples


def openrlhf_answer(samples: list[SampleIn], outs: list[SampleOut],
                    config: CompatConfig) -> dict[str, Any]:
    logs: dict[str, list[float]] = {spec.name: [] for spec in config.rewards}
    logs["rewardd_failed"], logs["rewardd_prompt_mismatch"] = [], []
    if config.group is not None:
        logs["rewardd_group_size"] = []
    for sample, out in zip(samples, outs):
        for spec in config.rewards:
            value = out.rewards.get(spec.name)
            logs[spec.name].append(value if value is not None else 0.0)
        logs["rewardd_failed"].append(1.0 if out.failed else 0.0)
        logs["rewardd_prompt_mismatch"].append(1.0 if sample.prompt_mismatch else 0.0)
        if config.group is not None:
            logs["rewardd_group_size"].append(float(out.group_size))
    return {"rewards": [out.value(config.openrlhf.value) for out in outs],
            "scores": [out.reward for out in outs], "extra_logs": logs}


# ---- slime ---------------------------------------------------------------------------------

class SlimeRequest(BaseModel):
    """Body slime's ``remote_rm`` posts to ``--rm-url``."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | list[FreeForm] = Field(description="The prompt: text, or chat messages "
                                         "({role, content}).")
    response: str = Field(description="The completion.")
    label: Label = Field(
        None, description="The sample's label: the answer, or an object that is the "
        "reference.")


class SlimeResponse(BaseModel):
    """slime keeps the whole object as the sample's reward; --reward-key picks the number
    (the value is also under the configured slime.reward_key when that is not `reward`)."""

    model_config = ConfigDict(extra="allow")

    reward: float = Field(description="The reward, or the group advantage (slime.value).")
    score: float = Field(description="The reward (the weighted sum of components).")
    advantage: float | None = Field(None, description="The group advantage (group mode).")
    rewards: dict[str, float | None] = Field(description="Each component's value.")
    status: dict[str, Any] = Field(description="Each component's outcome, as in /v1/score.")
    failed: bool = Field(description="A check failed and its component's fallback was used.")
    group_size: int = Field(description="Samples scored together.")
    timed_out: bool = Field(False, description="The group timed out and was scored from the "
                            "samples that arrived.")


def slime_samples(req: SlimeRequest, config: CompatConfig) -> list[SampleIn]:
    return [SampleIn(prompt_text(req.prompt), req.response,
                     reference_of(req.label, config, ("body", "label")), ("body", "label"))]


def slime_answer(out: SampleOut, config: CompatConfig) -> dict[str, Any]:
    value = out.value(config.slime.value)
    body = {"reward": value, "score": out.reward, "advantage": out.advantage,
            "rewards": out.rewards, "status": out.status, "failed": bool(out.failed),
            "group_size": out.group_size, "timed_out": out.timed_out}
    body[config.slime.reward_key] = value
    return body


# ---- NeMo-Gym ------------------------------------------------------------------------------

class NemoGymRequest(BaseModel):
    """Body of POST /verify (NeMo-Gym's ``BaseVerifyRequest`` and the task's fields)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: FreeForm = Field(
        description="The OpenAI Responses create request the policy answered; its `input` "
        "(text or messages) is the prompt.")
    response: FreeForm = Field(
        description="The OpenAI Responses object; the `output_text` parts of its `message` "
        "items are the completion.")


class NemoGymResponse(NemoGymRequest):
    """The request echoed with NeMo-Gym's ``BaseVerifyResponse`` fields."""

    reward: FiniteFloat = Field(description="The reward, or the group advantage "
                                "(nemo_gym.value).")
    reward_components: dict[str, float] | None = Field(
        None, description="Each component's value, when there are several "
        "(BaseMultiRewardVerifyResponse).")
    mask_sample: bool = Field(False, description="A check failed (its fallback is the "
                              "reward): not a valid measurement of the policy.")
    failure_kind: str | None = Field(None, description="rewardd:<kind> of the failed check.")
    failure_reason: str | None = None


def nemo_gym_samples(req: NemoGymRequest, config: CompatConfig) -> list[SampleIn]:
    """The request's one sample, once its echoed task fields are known to be shallow
    enough to answer (:func:`check_echoed_depth`)."""
    check_echoed_depth(req)
    field_name = config.nemo_gym.label_field
    label = (req.model_extra or {}).get(field_name)
    loc = ("body", field_name)
    params = req.responses_create_params
    return [SampleIn(prompt_text(params.get("input")), responses_output_text(req.response),
                     reference_of(label, config, loc), loc)]


def check_echoed_depth(req: NemoGymRequest) -> None:
    """A 422 naming the field when a task field (echoed in the answer) nests more than
    :data:`~rewardd.advantages.bounds.MAX_DEPTH` levels, REST's limit on free-form fields,
    before anything is scored. The decoder reads up to 1024 levels, but orjson writes at most
    254: a 300-deep field was scored and then answered a plain-text 500 (issue 28)."""
    for name, value in (req.model_extra or {}).items():
        path = too_deep(value)  # REST's free-form limit; the echo adds one level
        if path is not None:
            where = ".".join(map(str, (name, *path)))
            where = where if len(where) <= 120 else where[:117] + "..."
            raise RequestInvalid([error(("body", name), (
                f"nested more than {MAX_DEPTH} levels deep (at {where}); the task's "
                f"fields are echoed in the answer and may nest at most {MAX_DEPTH} levels: "
                "flatten it"), "too_deep")])
        try:  # what else the decoders read and the writers refuse (an integer past 64 bits)
            orjson.dumps(value)
        except TypeError as exc:
            raise RequestInvalid([error(("body", name), f"cannot be echoed in the answer: "
                                        f"{exc}", "unencodable")]) from None


def nemo_gym_answer(req: NemoGymRequest, out: SampleOut, config: CompatConfig
                    ) -> dict[str, Any]:
    body = {**req.model_dump(), "reward": out.value(config.nemo_gym.value),
            "mask_sample": bool(out.failed), "failure_kind": None, "failure_reason": None}
    if len(config.rewards) > 1:
        body["reward_components"] = {name: (value if value is not None else 0.0)
                                     for name, value in out.rewards.items()}
    failure = out.failure
    if failure is not None:
        body["failure_kind"], body["failure_reason"] = f"rewardd:{failure[0]}", failure[1]
    return body
