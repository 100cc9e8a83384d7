"""Token-level estimators built on discounted returns: REINFORCE++ and GAE.

Both work on the *kept* tokens: mask-1 tokens of included rollouts, compacted into one flat
sequence in which each rollout is a segment. Mask-0 tokens (tool output, observations) sit
between kept tokens of the same rollout without taking part: they carry no reward, no value
and no discount, so a return or an advantage is carried across a mask-0 span as if the span
were not there (gamma and lambda apply once per step from one kept token to the next). This
is verl's rule for GAE on multi-turn responses (``compute_gae_advantage_return`` skips values
and TD errors on observation tokens) and, in verl 0.9.1, for reinforce_plus_plus too: the
``carry`` rule of ``Pins.holes``. Under ``reset`` (verl's reinforce_plus_plus before 0.9.1)
a mask-0 token ends the recursion: each run of mask-1 tokens is scanned as if it ended the
rollout, so the tokens before a hole see no reward, value or advantage after it. Under the
openrlhf profile (``step``) a mask-0 token before
the rollout's last mask-1 token is kept in the layout as a step with reward 0 and value 0,
as OpenRLHF masks rewards and values and runs its recursion over every position; whitening
still counts the mask-1 tokens only. The request's ``holes`` param overrides the profile's
rule. The per-token rewards are

    r_t = token_rewards_t - kl_coef * kl_t     (each 0 where not sent)

plus the rollout's outcome reward r_i added at its last kept token (where verl and OpenRLHF
put the sequence score). A rollout without kept tokens has nothing to credit.

The backward recursions y_k = x_k + d_k y_{k+1} are computed by :func:`reverse_scan`, a
blocked scan over the whole batch at once: O(tokens) work in vectorised torch, a Python loop
only over the 64 offsets of a block, and only sums and products of the decays (all in
[0, 1]), so unlike rescaling by gamma^-t it cannot overflow.

Batch whitening (over the kept tokens of the whole batch) follows the profile: an entry in
``pins.whitened`` is whitened with that profile's variance estimator and epsilon; the
``whiten`` parameter overrides the profile. These entries are defined per token, so they
always whiten over tokens (``pins.whiten_level`` is for rollout-level aggregates).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from pydantic import Field, field_validator
from torch import Tensor

from rewardd.advantages.batch import AdvantageBatch, Advantages
from rewardd.advantages.groups import whiten, whiten_rollouts_over_tokens
from rewardd.advantages.models import FiniteFloat
from rewardd.advantages.profiles import HoleRule, Pins, Whitening
from rewardd.advantages.registry import EstimatorParams, register


SCAN_BLOCK = 64


def _blocks(v: Tensor, blocks: int) -> Tensor:
    """[SCAN_BLOCK, blocks]: ``v`` zero-padded and cut into blocks, one block per column
    (so the scan's loop over offsets reads contiguous rows)."""
    pad = blocks * SCAN_BLOCK - v.numel()
    if pad:
        v = torch.cat([v, v.new_zeros(pad)])
    return v.view(blocks, SCAN_BLOCK).T.contiguous()


def reverse_scan(x: Tensor, decay: Tensor) -> Tensor:
    """y_k = x_k + decay_k * y_{k+1} over a flat tensor, with y past the end 0.

    A decay of 0 ends a segment (nothing flows into it from the right), so many independent
    sequences scan at once. The sequence is cut into blocks of SCAN_BLOCK: a loop over the
    offsets of a block, vectorised across all blocks, scans every block with no carry-in and
    records the product of decays from each element to its block's end. The full values at
    the block starts obey the same recursion on a sequence SCAN_BLOCK times shorter (scanned
    by the same function); each element then adds its decay product times the next block's
    start. O(M) work; only sums and products of decays in [0, 1], so nothing overflows
    (rescaling by gamma^-t would: 0.99^-100000 is 1e436).
    """
    m = x.numel()
    blocks = max(1, -(-m // SCAN_BLOCK))
    values, to_end = _blocks(x, blocks), _blocks(decay, blocks)
    carry = values.new_zeros(blocks)
    product = values.new_ones(blocks)
    for j in range(SCAN_BLOCK - 1, -1, -1):
        carry = torch.addcmul(values[j], to_end[j], carry)
        values[j] = carry
        product = to_end[j] * product
        to_end[j] = product
    if blocks > 1:
        starts = reverse_scan(values[0].clone(), to_end[0].clone())
        values.addcmul_(to_end, torch.cat([starts[1:], starts.new_zeros(1)]))
    return values.T.reshape(-1)[:m]


@dataclass(frozen=True)
class KeptTokens:
    """The mask-1 tokens of included rollouts, compacted: the layout both scans run on.

    When every token is kept (no mask, no excluded rollout: the common case) the layout is
    the flat token tensor itself: ``index`` is None and gathers and scatters are free.
    """

    index: Tensor | None  # int64 [M]: position of each kept token; None: every token
    rollout: Tensor  # int64 [M]: the rollout each kept token belongs to
    last: Tensor  # bool [M]: the rollout's last kept token (where a segment ends)
    mask: Tensor  # bool [N]: kept, over the flat token tensor
    counted: Tensor  # bool [N]: mask-1 tokens of included rollouts (what whitening counts)
    hole: Tensor | None = None
    """bool [M]: kept positions that are mask-0 tokens (the ``step`` rule for holes: they
    take part as steps with reward 0 and value 0); None under ``carry``."""
    cut: Tensor | None = None
    """bool [M]: kept tokens followed by a mask-0 token inside their rollout, where the
    ``reset`` rule ends the recursion; None when no token is cut (every other rule)."""

    @property
    def ends(self) -> Tensor:
        """bool [M]: where a recursion segment ends: the rollout's last kept token, and
        under ``reset`` every kept token before a hole."""
        return self.last if self.cut is None else self.last | self.cut

    @property
    def size(self) -> int:
        return int(self.rollout.numel())

    def gather(self, values: Tensor) -> Tensor:
        """[M]: a per-token tensor [N] read at the kept tokens."""
        return values if self.index is None else values[self.index]

    def decay(self, factor: float) -> Tensor:
        """float64 [M]: ``factor`` between consecutive kept tokens of a segment, 0 at its
        end."""
        return (~self.ends).to(torch.float64).mul_(factor)

    def next_of(self, values: Tensor) -> Tensor:
        """float64 [M]: the value at the segment's next kept token, 0 after its last."""
        shifted = torch.zeros_like(values)
        shifted[:-1] = values[1:]
        return shifted.masked_fill_(self.ends, 0.0)

    def scatter(self, values: Tensor, total: int) -> Tensor:
        """float64 [N]: ``values`` at the kept positions (-0.0 made +0.0), +0.0 elsewhere.
        With every token kept that is ``values`` itself, normalised in place."""
        if self.index is None:
            return values.add_(0.0)
        out = torch.zeros(total, dtype=torch.float64)
        out[self.index] = values + 0.0
        return out


def kept_tokens(batch: AdvantageBatch, holes: HoleRule = "carry") -> KeptTokens:
    """The layout of the scans. ``holes``: the rule for mask-0 tokens inside a response
    (``Pins.holes_for``): ``carry`` leaves them out, ``reset`` leaves them out and cuts the
    recursion before each (``cut``), ``step`` keeps every position up to the rollout's last
    mask-1 token, the mask-0 ones flagged in ``hole``."""
    if batch.mask is None and bool(batch.valid.all()):
        last = torch.zeros(batch.total_tokens, dtype=torch.bool)
        present = batch.num_tokens > 0
        last[(batch.offsets + batch.num_tokens - 1)[present]] = True
        return KeptTokens(index=None, rollout=batch.token_rollout, last=last,
                          mask=batch.token_mask, counted=batch.token_mask)
    counted = batch.token_mask & batch.valid[batch.token_rollout]
    mask = counted
    if holes == "step" and batch.mask is not None:
        position = batch.token_position
        end = torch.full((batch.size,), -1, dtype=torch.int64).scatter_reduce(
            0, batch.token_rollout[counted], position[counted], "amax")
        mask = batch.valid[batch.token_rollout] & (position <= end[batch.token_rollout])
    index = mask.nonzero().squeeze(1)
    rollout = batch.token_rollout[index]
    last = torch.ones_like(rollout, dtype=torch.bool)
    last[:-1] = rollout[1:] != rollout[:-1]
    hole = ~batch.token_mask[index] if mask is not counted else None
    cut = None
    if holes == "reset":  # a gap between kept tokens of one rollout is a hole
        cut = torch.zeros_like(last)
        cut[:-1] = (index[1:] != index[:-1] + 1) & ~last[:-1]
        cut = cut if bool(cut.any()) else None
    return KeptTokens(index=index, rollout=rollout, last=last, mask=mask, counted=counted,
                      hole=hole, cut=cut)


def _gather_steps(kept: KeptTokens, values: Tensor) -> Tensor:
    """float64 [M]: a per-token input at the kept positions, 0 at holes (``step`` rule)."""
    out = kept.gather(values)
    if kept.hole is None:
        return out
    return out.masked_fill(kept.hole, 0.0)


def kept_rewards(batch: AdvantageBatch, kept: KeptTokens, kl_coef: float) -> Tensor:
    """float64 [M]: token_rewards - kl_coef * kl on kept tokens, plus the outcome reward at
    each rollout's last kept token."""
    if batch.token_rewards is not None:
        out = _gather_steps(kept, batch.token_rewards).clone()
    else:
        out = torch.zeros(kept.size, dtype=torch.float64)
    if kl_coef != 0.0 and batch.kl is not None:
        out.sub_(_gather_steps(kept, batch.kl), alpha=kl_coef)
    ends = kept.last.nonzero().squeeze(1)
    out[ends] += batch.rewards[kept.rollout[ends]]
    return out


def steps_to_end(batch: AdvantageBatch, kept: KeptTokens) -> Tensor:
    """int64 [M]: kept tokens after each kept token in its rollout."""
    if kept.index is None:
        return batch.num_tokens[kept.rollout] - 1 - batch.token_position
    counts = torch.bincount(kept.rollout, minlength=batch.size)
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(kept.size) - start[kept.rollout]
    return counts[kept.rollout] - 1 - rank


def outcome_only(batch: AdvantageBatch, kl_coef: float) -> bool:
    """The outcome reward is the only reward: no token_rewards and no KL term."""
    return batch.token_rewards is None and (kl_coef == 0.0 or batch.kl is None)


def kept_returns(batch: AdvantageBatch, kept: KeptTokens, gamma: float,
                 kl_coef: float) -> Tensor:
    """float64 [M]: G_t = r_t + gamma G_{t+1} over the kept tokens (0 past a segment's end).

    When the outcome reward is the only reward (no token_rewards, no KL term: the common
    case) and no hole cuts a rollout, G has a closed form, r_i gamma^(kept tokens after t),
    one pass instead of a scan.
    """
    if outcome_only(batch, kl_coef) and kept.cut is None:
        if kept.index is None and batch.uniform_length is not None:
            returns = batch.rewards.repeat_interleave(batch.uniform_length)
        else:
            returns = batch.rewards[kept.rollout]
        if gamma != 1.0:
            returns.mul_(torch.pow(gamma, steps_to_end(batch, kept).to(torch.float64)))
        return returns
    return reverse_scan(kept_rewards(batch, kept, kl_coef), kept.decay(gamma))


def whitened(name: str, override: bool | None, pins: Pins) -> bool:
    """Whether entry ``name`` is batch-whitened: the ``whiten`` param, else the profile."""
    return override if override is not None else name in pins.whitened


def whitening(entry: str, pins: Pins, no_std_norm: bool) -> Whitening:
    """The profile's whitening of ``entry``; ``no_std_norm`` centres without scaling."""
    how = pins.whitening_for(entry)
    return replace(how, scale=False) if no_std_norm else how


def whiten_kept(values: Tensor, kept: KeptTokens, how: Whitening) -> Tensor:
    """Batch whitening over the mask-1 tokens of included rollouts with ``how``; others
    +0.0 (under the ``step`` rule the holes' values do not enter the statistics)."""
    return whiten(values, kept.counted, how)


def clipped(batch: AdvantageBatch, clip_range: tuple[float, float] | None,
            pins: Pins) -> AdvantageBatch:
    """The batch with its outcome rewards clipped to ``clip_range`` (unset: the profile's,
    OpenRLHF's --reward.clip_range (-10, 10)); unchanged when neither is set."""
    bounds = clip_range if clip_range is not None else pins.clip_range
    if bounds is None:
        return batch
    return batch.with_rewards(batch.rewards.clamp(bounds[0], bounds[1]))


def check_clip_range(value: tuple[float, float] | None) -> tuple[float, float] | None:
    if value is not None and not value[0] < value[1]:
        raise ValueError(f"clip_range must be [lo, hi] with lo < hi; got {list(value)}")
    return value


class ReturnsParams(EstimatorParams):
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount per step between consecutive kept (mask-1) tokens; mask-0 tokens do not
    count as steps (but see ``holes``). 1.0 is verl's default."""
    holes: HoleRule | None = None
    """Mask-0 tokens inside a response (tool output): ``carry``, the return (or advantage)
    is carried across them with no step (verl 0.9.1's reinforce_plus_plus, verl's gae);
    ``reset``, each ends the recursion, the tokens before it see nothing after it (verl's
    reinforce_plus_plus before 0.9.1); ``step``, each is a step with reward 0 and value 0
    (OpenRLHF). Unset: the profile's (verl: reset for reinforce_pp, carry for gae; openrlhf:
    step; rewardd, trl: carry)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the per-token KL penalty sent as ``kl``: r_t -= kl_coef * kl_t."""
    whiten: bool | None = None
    """Whiten over the batch's kept tokens; unset follows the profile (whitened under
    rewardd, verl and openrlhf, not under trl)."""
    no_std_norm: bool = False
    """Whitening centres on the batch mean without dividing by the std (OpenRLHF's
    --algo.advantage.no_std_norm)."""
    clip_range: tuple[FiniteFloat, FiniteFloat] | None = None
    """[lo, hi]: the outcome reward is clipped to it before the per-token rewards are
    formed (OpenRLHF's --reward.clip_range in compute_reward). Unset: the profile's
    (openrlhf (-10, 10); none elsewhere)."""

    _lo_below_hi = field_validator("clip_range")(check_clip_range)


@register("reinforce_pp", formula="G_t = r_t + gamma G_{t+1} over mask-1 tokens; "
          "A = batch-whitened G",
          source="REINFORCE++ (Hu 2025, arXiv 2501.03262); verl "
          "compute_reinforce_plus_plus_outcome_advantage; OpenRLHF 'reinforce'",
          params=ReturnsParams)
def reinforce_pp(batch: AdvantageBatch, params: ReturnsParams, pins: Pins) -> Advantages:
    """Discounted return of per-token rewards (token_rewards - kl_coef * kl, the outcome
    reward added at the rollout's last mask-1 token), computed right to left and carried
    across mask-0 spans: a mask-0 token adds no reward and no discount step. Advantages are
    the returns whitened over the batch's mask-1 tokens when the profile (or ``whiten``)
    says so; ``returns`` are the unwhitened G.

    Mask-0 tokens inside a response follow the ``holes`` param, else the profile's rule:
    carried across (rewardd, trl; verl 0.9.1), reset (verl: the return restarts at 0 before
    each hole, verl's loop before 0.9.1) or, under openrlhf, counted as steps with reward 0
    that are discounted like any other (OpenRLHF's get_cumulative_returns). With mask-0
    tokens only at the end of a response the rules agree; with gamma 1 carry and step agree.
    ``clip_range`` clips the outcome reward first; ``no_std_norm`` centres without scaling."""
    batch = clipped(batch, params.clip_range, pins)
    how = whitening("reinforce_pp", pins, params.no_std_norm)
    kept = kept_tokens(batch, pins.holes_for("reinforce_pp", params.holes))
    returns = kept_returns(batch, kept, params.gamma, params.kl_coef)
    dense = kept.scatter(returns, batch.total_tokens)  # may be ``returns`` itself: no reuse
    if params.gamma == 1.0 and outcome_only(batch, params.kl_coef) and kept.cut is None:
        # G is the outcome reward on every kept token: one value per rollout, whitened over
        # the tokens from token counts, never broadcast
        counts = torch.where(batch.valid, batch.mask_counts, torch.zeros_like(batch.mask_counts))
        g = torch.where(counts > 0, batch.rewards, torch.zeros_like(batch.rewards)) + 0.0
        if whitened("reinforce_pp", params.whiten, pins):
            g = whiten_rollouts_over_tokens(g, counts, how)
        return Advantages(rollout=g, returns=dense)
    token = whiten_kept(dense, kept, how) \
        if whitened("reinforce_pp", params.whiten, pins) \
        else dense
    return Advantages(token=token, returns=dense)


class GaeParams(ReturnsParams):
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE lambda: 1.0 (verl's default) gives A_t = G_t - V_t, 0 the one-step TD error."""
    whiten: bool | None = None
    """Whiten the advantages over the batch's kept tokens; unset follows the profile
    (whitened under verl and openrlhf, not under rewardd and trl)."""


@register("gae", formula="delta_t = r_t + gamma V_{t+1} - V_t; A_t = delta_t + gamma lambda "
          "A_{t+1}; returns = A + V", inputs=("rewards", "values"),
          source="GAE (Schulman et al. 2016); verl compute_gae_advantage_return; "
          "OpenRLHF get_advantages_and_returns", params=GaeParams)
def gae(batch: AdvantageBatch, params: GaeParams, pins: Pins) -> Advantages:
    """Generalised advantage estimation from the critic's per-token values. Over mask-1
    tokens only: V_{t+1} is the value at the rollout's next mask-1 token (0 after its
    last), and A carries across mask-0 spans with one gamma*lambda per step, as verl does
    for observation tokens (OpenRLHF and TRL handle only trailing padding). Rewards as in
    reinforce_pp. ``returns`` = A + V before whitening (the critic's target). Under the
    openrlhf profile a mask-0 token inside a response is a step with reward 0 and value 0
    (OpenRLHF's get_advantages_and_returns masks both with the action mask). ``holes``
    overrides the profile: ``reset`` ends the recursion before each hole (V after it is 0
    and A restarts), as reinforce_pp's reset."""
    if batch.values is None:
        raise ValueError("gae needs per-token values on every rollout")
    batch = clipped(batch, params.clip_range, pins)
    kept = kept_tokens(batch, pins.holes_for("gae", params.holes))
    values = _gather_steps(kept, batch.values)
    if params.lam == 1.0:  # the TD errors telescope: A_t = G_t - V_t, and the returns are G
        returns = kept_returns(batch, kept, params.gamma, params.kl_coef)
        adv = returns - values
    else:
        delta = kept_rewards(batch, kept, params.kl_coef).add_(kept.next_of(values),
                                                               alpha=params.gamma).sub_(values)
        adv = reverse_scan(delta, kept.decay(params.gamma * params.lam))
        returns = adv + values
    dense = kept.scatter(adv, batch.total_tokens)
    token = whiten_kept(dense, kept, whitening("gae", pins, params.no_std_norm)) \
        if whitened("gae", params.whiten, pins) else dense
    return Advantages(token=token, returns=kept.scatter(returns, batch.total_tokens))
