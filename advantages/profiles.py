"""Trainer conventions ("pins") for group-relative estimators, from docs/estimators.md.

Trainers disagree on the std estimator, the epsilon added to it and what a group of one
rollout gets. A ``profile`` fixes those pins so a trainer that moves its advantage
computation into rewardd gets the numbers it got in-process.

Arithmetic is float64 in every profile. Against each trainer's own code run in float64
every option agrees within 2e-7 (tests/trainers, issue 16); the trainers compute in float32,
so results agree with their runs to float32 precision (verl's GRPO on [1,0,0,0] gives
1.499997 either way), except on a group with no reward spread: rewardd gives it exactly 0,
while the trainers' float32 group mean leaves rounding noise that the std division magnifies
(measured up to 0.48 for verl, 4.8e-3 for TRL, 10 for OpenRLHF's group_norm; their own code
in float64 gives at most 1.8e-9). That is a float32 artefact, documented and not copied.

A trainer's own estimator names (verl's ``rloo_vectorized``, OpenRLHF's ``group_norm``) are
:data:`ALIASES`: a registry entry with pinned params under that trainer's profile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from rewardd.advantages.models import Profile

SingletonRule = Literal["zero", "mean0_std1"]
HoleRule = Literal["carry", "reset", "step"]


@dataclass(frozen=True, slots=True)
class Whitening:
    """One trainer's batch whitening of one entry's advantages."""

    ddof: int = 1
    """1: unbiased variance (verl masked_var, TRL); 0: biased (OpenRLHF)."""
    eps: float = 1e-8
    mode: Literal["var_plus", "std_plus", "var_clamp"] = "var_plus"
    """var_plus: (x - mean) * rsqrt(var + eps) (verl masked_whiten, TRL PPO);
    std_plus: (x - mean) / (std + eps) (TRL GDPO); var_clamp: (x - mean) * rsqrt(max(var, eps))
    (OpenRLHF)."""
    level: Literal["token", "rollout"] = "token"
    """Over mask-1 tokens (verl, OpenRLHF, TRL PPO) or one value per rollout (TRL GDPO).
    Token-level estimators always whiten over tokens."""
    scale: bool = True
    """False: centre on the mean without dividing (OpenRLHF's --algo.advantage.no_std_norm;
    the ``no_std_norm`` param of gae, reinforce_pp and reinforce_pp_baseline)."""


VERL_WHITENING = Whitening()
OPENRLHF_WHITENING = Whitening(ddof=0, eps=1e-8, mode="var_clamp")
TRL_GDPO_WHITENING = Whitening(ddof=1, eps=1e-4, mode="std_plus", level="rollout")


@dataclass(frozen=True, slots=True)
class Pins:
    """Numerical conventions of one trainer."""

    std_ddof: int
    """1: unbiased (sample) std, as torch.std and all three trainers use."""
    eps: float
    """Added to the std before dividing."""
    singleton: SingletonRule
    """What a group with one included rollout gets. ``zero``: advantage 0 (rewardd reports it;
    TRL turns its NaN into 0). ``mean0_std1``: verl's mean 0, std 1, so a = r / (1 + eps) for
    GRPO and a = r for the mean-baseline estimators."""
    equal_group_sizes: bool
    """OpenRLHF reshapes rewards into contiguous blocks of n_samples_per_prompt: every group
    must have the same number of rollouts."""
    grouping: str
    """How the trainer forms groups (documentation only: rewardd always groups by group_id)."""
    gpg_count: Literal["spread", "reward"] = "spread"
    """GPG's valid samples: rollouts of groups with reward spread (the paper), or rollouts
    with a non-zero reward (verl's compute_gpg_outcome_advantage)."""
    whitening: Mapping[str, Whitening] = field(default_factory=dict)
    """Entries this trainer whitens over the whole batch, each with the trainer's formula."""
    holes: Mapping[str, HoleRule] = field(default_factory=dict)
    """Per entry (gae, reinforce_pp), the rule for mask-0 tokens inside a response (tool
    output); an entry not listed carries. ``carry``: they take no part, a return or
    advantage is carried across them with no discount step (verl 0.9.1's
    reinforce_plus_plus, and verl's gae in every version, skip observation tokens).
    ``reset``: each one ends the recursion, so the tokens before it see nothing after it
    (verl's reinforce_plus_plus before 0.9.1, ``running = running * mask[:, t]`` at b178a3c,
    the rule issue 16 measured: verl pins it for reinforce_pp and ``carry`` for gae).
    ``step``: each counts as a step with reward 0 and value 0, discounted like any other
    (OpenRLHF masks rewards and values with the action mask and runs its recursion over
    every position). The ``holes`` param of gae and reinforce_pp overrides the pin."""
    missing: Literal["exclude", "nansum"] = "exclude"
    """A rollout with a failed (null) reward component and no fallback. ``exclude``: it
    leaves its group's baseline with advantage 0. ``nansum``: TRL's None, its reward is the
    weighted sum of the components it has (nansum) and only a rollout with none is excluded;
    per-component aggregates (gdpo) normalise each component over the rollouts that have
    it (TRL's nanmean/nanstd)."""
    clip_range: tuple[float, float] | None = None
    """Default ``clip_range`` of the estimators that take one: OpenRLHF's --reward.clip_range
    (-10, 10), applied where OpenRLHF's compute_reward applies it."""

    @property
    def whitened(self) -> frozenset[str]:
        return frozenset(self.whitening)

    def whitening_for(self, entry: str) -> Whitening:
        """How ``entry`` is whitened when asked to be (the verl formula when not pinned)."""
        return self.whitening.get(entry, Whitening())

    def holes_for(self, entry: str, override: HoleRule | None = None) -> HoleRule:
        """The rule for mask-0 tokens inside a response in ``entry``: the request's
        ``holes`` param, else the profile's pin, else ``carry``."""
        return override if override is not None else self.holes.get(entry, "carry")

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["whitening"] = {name: asdict(w) for name, w in sorted(self.whitening.items())}
        return out


PROFILES: dict[Profile, Pins] = {
    Profile.rewardd: Pins(std_ddof=1, eps=1e-6, singleton="zero", equal_group_sizes=False,
                          grouping="by group_id", whitening={
                              "reinforce_pp": VERL_WHITENING,
                              "reinforce_pp_baseline": VERL_WHITENING,
                              "gdpo": VERL_WHITENING}),
    Profile.verl: Pins(std_ddof=1, eps=1e-6, singleton="mean0_std1", equal_group_sizes=False,
                       grouping="by uid", gpg_count="reward",
                       holes={"reinforce_pp": "reset", "gae": "carry"}, whitening={
                           "gae": VERL_WHITENING, "reinforce_pp": VERL_WHITENING,
                           "reinforce_pp_baseline": VERL_WHITENING, "gdpo": VERL_WHITENING}),
    Profile.trl: Pins(std_ddof=1, eps=1e-4, singleton="zero", equal_group_sizes=False,
                      grouping="contiguous blocks", missing="nansum", whitening={
                          "gae": VERL_WHITENING, "gdpo": TRL_GDPO_WHITENING}),
    Profile.openrlhf: Pins(std_ddof=1, eps=1e-9, singleton="zero", equal_group_sizes=True,
                           grouping="contiguous blocks", clip_range=(-10.0, 10.0),
                           holes={"reinforce_pp": "step", "gae": "step"},
                           whitening={
                               "gae": OPENRLHF_WHITENING, "reinforce_pp": OPENRLHF_WHITENING,
                               "reinforce_pp_baseline": OPENRLHF_WHITENING}),
}


def pins_for(profile: Profile | str) -> Pins:
    return PROFILES[Profile(profile)]


@dataclass(frozen=True, slots=True)
class Alias:
    """A trainer's own name for a registry entry under its profile, with the parameters that
    name pins. No second code path: the alias runs ``entry`` with ``params`` (issue 16)."""

    entry: str
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


ALIASES: dict[Profile, dict[str, Alias]] = {
    Profile.verl: {
        "grpo_vectorized": Alias("grpo", {"var_floor": 1e-6}, note=(
            "verl compute_grpo_vectorized_outcome_advantage with group_mean_std's variance "
            "floor: std = sqrt(clamp(var, min=1e-6)), then / (std + epsilon) (issue 16's "
            "contract, verl at b178a3c); verl 0.9.1 calls group_mean_std(eps=0.0): use grpo")),
        "rloo_vectorized": Alias("rloo", {"singleton": "zero"}, note=(
            "verl compute_rloo_vectorized_outcome_advantage: (c r - sum) / max(c - 1, 1) "
            "* (c > 1), so a lone rollout gets 0")),
        "reinforce_plus_plus": Alias("reinforce_pp", note="verl's registry name"),
        "reinforce_plus_plus_baseline": Alias("reinforce_pp_baseline",
                                              note="verl's registry name"),
    },
    Profile.openrlhf: {
        "group_norm": Alias("grpo", note="OpenRLHF advantage_estimator=group_norm"),
        "reinforce": Alias("reinforce_pp", note="OpenRLHF advantage_estimator=reinforce"),
        "reinforce_baseline": Alias("reinforce_pp_baseline",
                                    note="OpenRLHF advantage_estimator=reinforce_baseline"),
    },
}


def aliases_of(entry: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Per profile, the trainer names that resolve to ``entry`` and the params they pin
    (``GET /v1/estimators`` lists them under ``profiles.<profile>.aliases``)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for profile, names in ALIASES.items():
        for name, alias in names.items():
            if alias.entry == entry:
                out.setdefault(profile.value, {})[name] = {"params": dict(alias.params),
                                                           "note": alias.note}
    return out


def resolve_alias(name: str, profile: Profile | str) -> Alias | None:
    """The alias ``name`` under ``profile``, or None when it names no alias there."""
    return ALIASES.get(Profile(profile), {}).get(name)


def alias_profiles(name: str) -> list[str]:
    """The profiles under which ``name`` is an alias (for an error naming the right one)."""
    return [p.value for p, names in ALIASES.items() if name in names]
