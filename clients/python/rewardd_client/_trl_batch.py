"""Turning TRL's reward-function call into rewardd's groups: what a TRL reward function receives
(keyword lists per completion, dataset columns, trainer objects), its reference and its text.

Shared by the reward functions (:mod:`rewardd_client.trl`, one ``POST /v1/rewards`` per batch)
and the advantages hook (:mod:`rewardd_client._trl_advantages`, one ``POST /v1/score`` per
step where it can), so both read TRL's inputs the same way. A module of its own so the hook
can use it without importing the reward functions' module, which re-exports the hook.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

from rewardd_client._groups import runs_of_equal
from rewardd_client._rewards import resolve_rewards

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


def specs_of(rewards: RewardSpecs) -> list[dict[str, Any]]:
    """The reward specs ``rewards`` stands for, each a dict with a string name and verifier."""
    if isinstance(rewards, str):  # "math", "math,length" or JSON, as REWARDD_REWARDS takes them
        listed: list[Any] = resolve_rewards(rewards)
    else:
        listed = [rewards] if isinstance(rewards, Mapping) else list(rewards)
    if not listed:
        raise TRLInputError("rewards", "at least one reward spec is needed")
    for index, spec in enumerate(listed):
        if not isinstance(spec, Mapping) or not all(isinstance(spec.get(key), str)
                                                    for key in ("name", "verifier")):
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


class Batch:
    """Builds the ``POST /v1/rewards`` body of one TRL call; rollout ``r<i>`` is flat index i.
    The reward functions made together share one (the hook finds them by it)."""

    def __init__(self, specs: list[dict[str, Any]], reference_column: str | None,
                 reference_fn: ReferenceFn | None, run_id: str | None) -> None:
        self.specs = specs
        self.reference_column = reference_column
        self.reference_fn = reference_fn
        self.run_id = run_id

    def references(self, prompts: Sequence[Any], kwargs: Mapping[str, Any]) -> list[dict]:
        """Each completion's group reference, from TRL's keyword arguments (the dataset
        columns beside ``trainer_state`` and the other trainer objects)."""
        columns = {k: v for k, v in kwargs.items() if k not in TRAINER_KEYWORDS}
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
        references = self.references(prompts, kwargs)
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
        step = step_of(kwargs.get("trainer_state"))
        if step is not None:
            body["step"] = step  # rubric dropout draws per step
        return body


def step_of(trainer_state: Any) -> int | None:
    """TRL's ``trainer_state.global_step``, sent as the batch's ``step``."""
    step = getattr(trainer_state, "global_step", None)
    return None if step is None else int(step)

