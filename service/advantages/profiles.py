"""Trainer conventions ("pins") for group-relative estimators, from ESTIMATORS.md.

Trainers disagree on the std estimator, the epsilon added to it and what a group of one
rollout gets. A ``profile`` fixes those pins so a trainer that moves its advantage
computation into rewardd gets the numbers it got in-process.

Arithmetic is float64 in every profile; the trainers compute in float32, so results agree
with them to float32 precision (verl's GRPO on [1,0,0,0] gives 1.499997 either way).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from service.models import Profile

SingletonRule = Literal["zero", "mean0_std1"]


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
    whitened: frozenset[str] = frozenset()
    """Entries whose advantages this trainer whitens over the whole batch (masked tokens)."""
    whiten_ddof: int = 1
    """Variance of the batch whitening: 1 unbiased (verl masked_var), 0 biased (OpenRLHF)."""
    whiten_eps: float = 1e-8
    whiten_eps_in_sqrt: bool = True
    """True: (x - mean) * rsqrt(var + eps) (verl masked_whiten); False: (x - mean) / (std + eps)."""
    whiten_level: Literal["token", "rollout"] = "token"
    """Whiten over mask-1 tokens (verl, OpenRLHF) or over one value per rollout (TRL's GDPO)."""

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["whitened"] = sorted(self.whitened)
        return out


PROFILES: dict[Profile, Pins] = {
    Profile.rewardd: Pins(std_ddof=1, eps=1e-6, singleton="zero", equal_group_sizes=False,
                          grouping="by group_id",
                          whitened=frozenset({"reinforce_pp", "reinforce_pp_baseline", "gdpo"})),
    Profile.verl: Pins(std_ddof=1, eps=1e-6, singleton="mean0_std1", equal_group_sizes=False,
                       grouping="by uid",
                       whitened=frozenset({"gae", "reinforce_pp", "reinforce_pp_baseline",
                                           "gdpo"})),
    Profile.trl: Pins(std_ddof=1, eps=1e-4, singleton="zero", equal_group_sizes=False,
                      grouping="contiguous blocks", whitened=frozenset({"gdpo"}),
                      whiten_eps=1e-4, whiten_eps_in_sqrt=False, whiten_level="rollout"),
    Profile.openrlhf: Pins(std_ddof=1, eps=1e-9, singleton="zero", equal_group_sizes=True,
                           grouping="contiguous blocks",
                           whitened=frozenset({"gae", "reinforce_pp", "reinforce_pp_baseline"}),
                           whiten_ddof=0, whiten_eps_in_sqrt=False),
}


def pins_for(profile: Profile | str) -> Pins:
    return PROFILES[Profile(profile)]
