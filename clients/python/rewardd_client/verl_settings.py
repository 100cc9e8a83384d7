"""Settings and result translation shared by the verl adapter's three entry points
(:mod:`rewardd_client.verl` explains them): where the server is, which components and which
advantage spec to ask for, and how a result rollout becomes verl's reward extra info.

A module of its own, apart from :mod:`rewardd_client.verl`, because verl may load that file
by path (``custom_reward_function.path``) without registering it in ``sys.modules``, and a
dataclass cannot be built in such a module (``dataclasses`` looks its module up there);
imported from here, ``Settings`` and the per-process client caches exist once however the
adapter is loaded.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rewardd_client._rewards import (ADVANTAGE_VARIABLE, AdapterConfigError, RewardFailed,
                                     parse_advantage, resolve_rewards, resolve_url,
                                     rollout_reward)
from rewardd_client.client import AsyncRewarddClient, RewarddClient

__all__ = ["ADVANTAGE_VARIABLE", "DEFAULT_ADVANTAGE", "FAILED_KEY", "RewardFailed", "Settings",
           "extra_info_of", "settings_from"]

DEFAULT_REWARDS = "math"
VERL_PROFILE = "verl"
DEFAULT_ADVANTAGE: Mapping[str, Any] = {"estimator": "grpo", "profile": VERL_PROFILE}
"""What ``REWARDD_ADVANTAGE=grpo`` means too: verl's own GRPO, exactly."""
EXTRA_PREFIX = "rewardd_"
FAILED_KEY = "rewardd_failed"
_CLIENT_KEYS = ("api_key", "wire", "timeout")
_KNOWN_KEYS = frozenset({"base_url", "rewards", "advantage", "run_id", "reference_key",
                         "batch_window_s", *_CLIENT_KEYS})


@dataclass(frozen=True)
class Settings:
    """Where rewardd is and what to ask it, resolved once per manager or estimator."""

    base_url: str
    rewards: list = field(default_factory=list)
    advantage: dict = field(default_factory=dict)
    run_id: str | None = None
    reference_key: str = "answer"
    batch_window_s: float = 0.0
    client_options: tuple = ()

    def client(self) -> RewarddClient:
        """A blocking client, shared per process by every user of equal settings."""
        key = (self.base_url, self.client_options)
        if key not in _SYNC_CLIENTS:
            _SYNC_CLIENTS[key] = RewarddClient(self.base_url, **dict(self.client_options))
        return _SYNC_CLIENTS[key]

    def async_client(self) -> AsyncRewarddClient:
        """An asyncio client of the running loop (an httpx pool belongs to one loop)."""
        clients = _ASYNC_CLIENTS.setdefault(asyncio.get_running_loop(), {})
        key = (self.base_url, self.client_options)
        if key not in clients:
            clients[key] = AsyncRewarddClient(self.base_url, **dict(self.client_options))
        return clients[key]


_SYNC_CLIENTS: dict[tuple, RewarddClient] = {}
_ASYNC_CLIENTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = \
    weakref.WeakKeyDictionary()


def _plain(value: Any) -> Any:
    """A config value as plain Python (OmegaConf containers become dicts and lists)."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _advantage_spec(value: Any) -> dict[str, Any]:
    """``advantage`` from the config or keywords, else ``REWARDD_ADVANTAGE``, else the
    default; any form :func:`~rewardd_client._rewards.parse_advantage` reads (a bare
    estimator name means that estimator under the verl profile)."""
    if value is not None:
        return parse_advantage(value, VERL_PROFILE, "advantage")
    text = os.environ.get(ADVANTAGE_VARIABLE)
    if text:
        return parse_advantage(text, VERL_PROFILE, ADVANTAGE_VARIABLE)
    return dict(DEFAULT_ADVANTAGE)


def settings_from(section: Any = None, **overrides: Any) -> Settings:
    """Settings from keyword ``overrides``, then a config ``section`` (a mapping such as
    verl's ``reward.rewardd``; None for none), then the environment. Unknown keys raise
    :class:`~rewardd_client._rewards.AdapterConfigError` naming them, so a typo is not a
    silent default."""
    merged = {**(_plain(section) if section is not None else {}),
              **{k: v for k, v in overrides.items() if v is not None}}
    unknown = sorted(set(merged) - _KNOWN_KEYS)
    if unknown:
        raise AdapterConfigError(f"rewardd settings: unknown keys {unknown}; known: "
                                 f"{sorted(_KNOWN_KEYS)}")
    rewards = merged.get("rewards")
    if rewards is None and not os.environ.get("REWARDD_REWARDS"):
        rewards = DEFAULT_REWARDS
    window = float(merged.get("batch_window_s", 0.0))
    if window < 0:
        raise AdapterConfigError(f"batch_window_s: must be >= 0, not {window}")
    return Settings(
        base_url=resolve_url(merged.get("base_url")),
        rewards=resolve_rewards(rewards),
        advantage=_advantage_spec(merged.get("advantage")),
        run_id=merged.get("run_id"),
        reference_key=str(merged.get("reference_key", "answer")),
        batch_window_s=window,
        client_options=tuple(sorted((k, merged[k]) for k in _CLIENT_KEYS if k in merged)))


def extra_info_of(rollout: Mapping[str, Any], rewards: Sequence[Mapping[str, Any]]
                  ) -> dict[str, float]:
    """verl's reward extra info of one result rollout: each component's value (its
    fallback where the cell failed) as ``rewardd_<name>``, and ``rewardd_failed`` 1.0 when a
    fallback replaced a failed cell. Raises :class:`RewardFailed` when the rollout has no
    reward (a failed cell without fallback)."""
    rollout_reward(rollout)  # raises RewardFailed for an excluded rollout
    values = rollout.get("rewards") or {}
    info = {f"{EXTRA_PREFIX}{spec['name']}": float(values[spec["name"]]) for spec in rewards}
    failed = any(not status.get("ok", True) for status in (rollout.get("status") or {}).values())
    info[FAILED_KEY] = 1.0 if failed else 0.0
    return info
