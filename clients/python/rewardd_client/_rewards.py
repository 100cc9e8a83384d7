"""What the adapters share: where the server, the reward components and the advantage spec
come from, and how one rollout's result becomes the one number a trainer trains on.

Configuration: an argument wins, then the environment (``REWARDD_URL``, ``REWARDD_REWARDS``),
then the trainer's own setting where it has one (slime's ``--rm-url``). Environment variables
are there because both trainers load the reward function by path, in processes the user does
not start (Ray actors), where passing arguments is awkward; a module constant in the file the
trainer loads works everywhere and is what the documented examples use.

``REWARDD_REWARDS`` is either JSON (a list of reward specs, or one spec object, as
``POST /v1/rewards`` takes them) or a comma-separated list of verifier names, each becoming
the component ``{"name": v, "verifier": v}``: ``REWARDD_REWARDS=math`` is the common case.
An advantage spec (``REWARDD_ADVANTAGE``, verl's ``advantage`` key, the TRL adapter's
argument) is read by one parser, :func:`parse_advantage`, so every adapter takes the same
forms: an estimator name (``grpo``) or a spec (a mapping, or JSON text of one).

Failed cells: rewardd reports a rollout whose cell failed without a ``fallback`` as excluded
(reward null). Some trainers have a place for that (TRL takes None); OpenRLHF and slime
need a number for every sample, and inventing one (0.0) would train on an infrastructure
failure as if the answer were wrong. So the adapters raise :class:`RewardFailed`, naming the
rollout, the component and the failure; a user who wants a number sets the component's
``fallback``, which the server then applies and reports (``fallback_used``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping, Sequence, Union

RewardSpecs = Sequence[Mapping[str, Any]]
AdvantageArg = Union[str, Mapping[str, Any]]
"""An advantage spec as a user writes it: a mapping, JSON text of one, or an estimator name."""

URL_VARIABLE = "REWARDD_URL"
REWARDS_VARIABLE = "REWARDD_REWARDS"
ADVANTAGE_VARIABLE = "REWARDD_ADVANTAGE"

SENTINEL_SIGNALS = ("audit_divergence", "length_gaming", "component_dominance",
                    "repeated_answer", "hedging", "lenient_fallback")
"""The server sentinel's signals (docs/sentinel.md), each logged by the adapters."""


def sentinel_flags(summary: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """``<prefix><signal>``: 1.0 while the server's sentinel holds the signal on the run at
    its newest recorded step (``summary.sentinel``), else 0.0, for every signal; empty when
    the answer has no sentinel report (no ``run_id``, or the run not yet looked at), so a
    trainer's chart shows a gap rather than a false all-clear."""
    report = summary.get("sentinel")
    if not isinstance(report, Mapping):
        return {}
    held = {alert.get("signal") for alert in report.get("alerts") or ()}
    return {f"{prefix}{signal}": 1.0 if signal in held else 0.0 for signal in SENTINEL_SIGNALS}


_ESTIMATOR_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")  # the server's Name


class AdapterConfigError(ValueError):
    """The adapter has no server URL or no reward components, or one is malformed; the
    message names the setting and what it expects."""


class RewardFailed(RuntimeError):
    """A rollout's reward could not be computed (a cell failed and its component has no
    ``fallback``); ``rollout_id``, ``failures`` ({component: status}) say which and why."""

    def __init__(self, rollout_id: str, failures: Mapping[str, Any]) -> None:
        self.rollout_id = rollout_id
        self.failures = dict(failures)
        reasons = "; ".join(f"{name}: {status.get('error')}{_message(status.get('detail'))}"
                            for name, status in self.failures.items())
        super().__init__(f"rewardd could not score rollout {rollout_id!r} ({reasons}); set a "
                         f"'fallback' on the reward component to train on a fixed value instead")


def _message(detail: Any) -> str:
    text = detail.get("message") if isinstance(detail, Mapping) else detail
    return f" ({text})" if text else ""


def parse_rewards(text: str) -> list[dict[str, Any]]:
    """Reward specs from ``REWARDD_REWARDS`` text: JSON (list or one object) or verifier
    names separated by commas."""
    text = text.strip()
    if text.startswith(("[", "{")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AdapterConfigError(f"{REWARDS_VARIABLE}: not valid JSON ({exc})") from exc
        specs = [value] if isinstance(value, dict) else value
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise AdapterConfigError(f"{REWARDS_VARIABLE}: JSON must be a reward spec object "
                                     f"or a list of them")
        return specs
    names = [name.strip() for name in text.split(",") if name.strip()]
    return [{"name": name, "verifier": name} for name in names]


def parse_advantage(value: AdvantageArg, profile: str,
                    setting: str = "advantage") -> dict[str, Any]:
    """An ``advantage`` spec of ``POST /v1/advantages`` from any form an adapter accepts (the
    TRL adapter's argument, verl's ``advantage`` key, ``REWARDD_ADVANTAGE``): a mapping is
    the spec; text starting with ``{`` is JSON of one; any other text is an estimator name,
    short for ``{"estimator": name, "profile": profile}`` (the adapter's own trainer's
    conventions, so ``grpo`` under verl is verl's GRPO). A mapping or JSON keeps the profile
    it names. ``setting`` names the source in errors (:class:`AdapterConfigError`)."""
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("{"):
            if not _ESTIMATOR_NAME.match(text):
                raise AdapterConfigError(f"{setting}: {value!r} is neither an estimator name "
                                         f"(such as grpo) nor a JSON advantage spec")
            return {"estimator": text, "profile": profile}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AdapterConfigError(f"{setting}: not valid JSON ({exc})") from exc
    if not isinstance(value, Mapping):
        raise AdapterConfigError(f"{setting}: expected an estimator name or an advantage spec "
                                 f"object such as {{'estimator': 'grpo', 'profile': "
                                 f"{profile!r}}}, not {type(value).__name__}")
    return dict(value)


def resolve_url(base_url: str | None, trainer_default: str | None = None) -> str:
    """The server URL: the argument, else ``REWARDD_URL``, else the trainer's own setting."""
    url = base_url or os.environ.get(URL_VARIABLE) or trainer_default
    if not url:
        raise AdapterConfigError(f"no rewardd server: pass base_url or set {URL_VARIABLE} "
                                 f"(for example http://127.0.0.1:8000)")
    return url


def resolve_rewards(rewards: str | RewardSpecs | None) -> list[dict[str, Any]]:
    """The reward components: the argument (specs, or text as ``REWARDD_REWARDS`` takes
    it), else ``REWARDD_REWARDS``."""
    if rewards is None:
        rewards = os.environ.get(REWARDS_VARIABLE, "")
    if isinstance(rewards, str):
        rewards = parse_rewards(rewards) if rewards.strip() else []
    specs = [dict(spec) for spec in rewards]
    if not specs:
        raise AdapterConfigError(f"no reward components: pass rewards or set "
                                 f"{REWARDS_VARIABLE} (for example 'math', or JSON specs)")
    return specs


def reference_of(label: Any, reference_key: str) -> dict[str, Any]:
    """A dataset label as a group reference: a mapping is the reference itself, None is no
    reference, anything else is ``{reference_key: label}``."""
    if label is None:
        return {}
    if isinstance(label, Mapping):
        return dict(label)
    return {reference_key: label}


def rollout_reward(rollout: Mapping[str, Any]) -> float:
    """The trained-on reward of one result rollout; :class:`RewardFailed` when excluded."""
    reward = rollout.get("reward")
    if reward is None:
        failures = {name: status for name, status in (rollout.get("status") or {}).items()
                    if not status.get("ok", True)}
        raise RewardFailed(str(rollout.get("rollout_id")), failures)
    return float(reward)


def rollouts_by_id(response: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Every result rollout of a response, keyed by (group_id, rollout_id)."""
    return {(group["group_id"], rollout["rollout_id"]): rollout
            for group in response["groups"] for rollout in group["rollouts"]}
