"""verl adapter: rewardd as verl's reward function, reward manager and advantage estimator.

Three entry points, from the lightest to the most complete (verl 0.9.1, whose reward step is
the "reward loop": ``verl.experimental.reward_loop``):

* :func:`compute_score`, verl's *custom reward function* (``reward.custom_reward_function``:
  ``path`` names a file, ``name`` the function). verl loads it by path
  (``verl.trainer.ppo.reward.get_custom_reward_fn``), merges
  ``custom_reward_function.reward_kwargs`` into every call and, since the function is a
  coroutine, its reward managers ``await`` it: one call per sample with ``data_source``,
  ``solution_str``, ``ground_truth``, ``extra_info``. Each call is one ``POST /v1/rewards``
  holding one group of one rollout, not ``POST /v1/verify/{verifier}``: the rewards route
  takes every component of the spec (weights, fallbacks, timeouts) and reports failures the
  way the batch path does, so the two paths give the same numbers; verify serves one verifier.
  It returns verl's dict form: ``score`` (trained on) and one ``rewardd_<component>`` entry
  per component (verl logs them as reward extra info).
* ``reward.reward_manager.name=rewardd``: :class:`rewardd_client.verl_plugin.RewarddRewardManager`,
  the batch manager. verl's reward loop hands a manager one sample at a time
  (``run_single``), concurrently for a worker's whole chunk; the manager holds the samples
  that arrive in the same event-loop turn (or within ``batch_window_s``) and scores them in
  ONE ``POST /v1/rewards``, grouped by verl's ``uid``. Called with a whole ``DataProto``
  (``manager(data, return_dict=True)``, the pre-reward-loop interface) it is one request too,
  returning the token-level reward tensor (reward at each response's last valid token) and
  ``reward_extra_info``.
* ``algorithm.adv_estimator=rewardd``: :func:`rewardd_client.verl_plugin.compute_rewardd_advantage`,
  registered with verl's ``register_adv_est``; it returns rewardd's per-token advantages
  (any outcome estimator of the catalogue, e.g. ``rloo``, ``passk``, ``opo``, with reweights
  and filters) in verl's (B, T) shape, masked, and ``returns`` equal to them.

Why the estimator asks rewardd itself instead of reading advantages a reward manager stored:
verl 0.9.1's ``compute_advantage`` hands a registered estimator only ``token_level_rewards``,
``response_mask``, ``index`` (the uids) and the algorithm config; the reward manager runs in
other processes (Ray actors) and what it returns reaches the driver only as ``rm_scores`` and
reward extra info, which the estimator never sees (the v1 trainer does not even fetch the
latter for the advantage step). So the estimator sends ``POST /v1/advantages`` with the
rewards verl hands it (summed over tokens, as verl's own outcome estimators do), each
response's length and tool-token mask, grouped by uid. Estimators that need the token ids or
spans (``tempo``, ``segment``, ``turn``) are out of reach of verl's estimator interface.

Registration: ``rewardd-client`` declares the ``verl.plugins`` entry point, which verl 0.9.1
loads on ``import verl`` in every process (driver, trainer actor, reward workers), so the two
names exist wherever verl looks them up; nothing to import by hand. A user who disabled
plugin discovery (``VERL_USE_EXTERNAL_PLUGINS=none``) can instead point
``reward.reward_manager.source=importlib`` and ``module.path=pkg://rewardd_client.verl_plugin``
at the class (``name=RewarddRewardManager``).

Configuration, first found wins: the call's keyword arguments (``reward_kwargs`` for
:func:`compute_score`), the trainer config (``reward.rewardd`` for the manager,
``algorithm.rewardd`` for the estimator: keys ``base_url``, ``rewards``, ``advantage``,
``run_id``, ``reference_key``, ``batch_window_s``, ``api_key``, ``wire``, ``timeout``), the
environment (``REWARDD_URL``; ``REWARDD_REWARDS``, default ``math``; ``REWARDD_ADVANTAGE``,
default ``{"estimator": "grpo", "profile": "verl"}``). An advantage spec takes the TRL
adapter's forms (one parser, :func:`rewardd_client._rewards.parse_advantage`): an estimator
name (``rloo``: that estimator under verl's conventions, ``{"estimator": "rloo", "profile":
"verl"}``, so ``grpo`` is the default) or a spec, JSON text or a config mapping, taken as
written (without ``profile`` the server's default, ``rewardd``). The environment reaches verl's
Ray actors only when they start on the driver's machine or through Ray's ``runtime_env``;
config keys reach them everywhere.

Failures: a rollout whose cell failed with no ``fallback`` has no reward; the adapter raises
:class:`~rewardd_client._rewards.RewardFailed` (verl stops the step) rather than train on an
invented number. With a fallback the rollout is trained on the fallback and its
``rewardd_failed`` extra info is 1.0 (0.0 otherwise); a component's value is then its
fallback. Never NaN in anything verl trains on.
"""

from __future__ import annotations

from typing import Any, Mapping

from rewardd_client._rewards import RewardFailed, reference_of
from rewardd_client.verl_settings import (ADVANTAGE_VARIABLE, DEFAULT_ADVANTAGE, FAILED_KEY,
                                          extra_info_of, settings_from)

__all__ = ["ADVANTAGE_VARIABLE", "DEFAULT_ADVANTAGE", "FAILED_KEY", "RewardFailed",
           "compute_score"]


async def compute_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                        extra_info: Mapping[str, Any] | None = None, *,
                        base_url: str | None = None, rewards: Any = None,
                        reference_key: str | None = None, run_id: str | None = None,
                        **kwargs: Any) -> dict[str, float]:
    """verl's custom reward function: one sample, one ``POST /v1/rewards`` (a group of one).

    ``ground_truth`` becomes the reference (``{"answer": ground_truth}``, or the mapping
    itself for structured references such as code tests); ``base_url``, ``rewards`` (specs or
    verifier names), ``reference_key`` and ``run_id`` come from verl's ``reward_kwargs`` or the
    environment. Other keyword arguments verl passes (``reward_router_address``, ...) are
    ignored. Returns ``{"score": reward, "rewardd_<component>": value, ...,
    "rewardd_failed": 0.0 | 1.0}``."""
    settings = settings_from(base_url=base_url, rewards=rewards, reference_key=reference_key,
                             run_id=run_id)
    body: dict[str, Any] = {
        "groups": [{"group_id": "0", "reference": reference_of(ground_truth,
                                                               settings.reference_key),
                    "rollouts": [{"rollout_id": "0", "completion": solution_str}]}],
        "rewards": settings.rewards}
    if settings.run_id is not None:
        body["run_id"] = settings.run_id
    response = await settings.async_client().rewards(body)
    rollout = response["groups"][0]["rollouts"][0]
    info = extra_info_of(rollout, settings.rewards)
    return {"score": float(rollout["reward"]), **info}
