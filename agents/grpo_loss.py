"""GRPO maths as small pure tensor functions: advantages, the clipped per-token loss, KL, aggregations.

One function per variant, no flags inside a formula (the learner in `agents.grpo` picks and composes them).
The formulas follow TRL's `GRPOTrainer` (trl 1.16.0, `trl/trainer/grpo_trainer.py`:
`_generate_and_score_completions` for advantages, `_compute_loss` for the per-token loss and the four
aggregations), re-derived here from their definitions:

- GRPO: Shao et al., "DeepSeekMath", arXiv 2402.03300, §4.1 (group-relative advantage, k3 KL).
- DAPO: Yu et al., arXiv 2503.14476 (asymmetric clip ε_low/ε_high, token-level normalisation).
- Dr. GRPO: Liu et al., "Understanding R1-Zero-Like Training", arXiv 2503.20783 (no std scaling,
  constant normaliser).
- TRR++: Zhao et al., "Absolute Zero", arXiv 2505.03335, "Task-Relative REINFORCE++" (one baseline per (role, task type)).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

ADVANTAGE_EPS = 1e-4
"""Added to the std before dividing, as TRL does (`advantages / (std_rewards + 1e-4)`)."""


# ---------------------------------------------------------------------------------------------------
# Segment statistics (a "segment" is a GRPO group or a TRR++ (role, task type) key)
# ---------------------------------------------------------------------------------------------------


def segment_index(keys: Sequence[Hashable]) -> torch.Tensor:
    """Map arbitrary hashable keys to dense segment ids in order of first appearance.

    Args:
        keys: One key per sample (a group id, or a `(role, task_type)` tuple).

    Returns:
        A long tensor of shape (N,) with values in `0..num_segments-1`.
    """
    first_seen: dict[Hashable, int] = {}
    ids = [first_seen.setdefault(key, len(first_seen)) for key in keys]
    return torch.tensor(ids, dtype=torch.long)


def segment_mean(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Mean of each sample's segment, broadcast back to the samples.

    Args:
        values: (N,) float tensor.
        index: (N,) long tensor of dense segment ids.

    Returns:
        (N,) tensor: for sample i, the mean of `values` over all j with `index[j] == index[i]`.
    """
    num_segments = int(index.max()) + 1
    sums = torch.zeros(num_segments, dtype=values.dtype).index_add_(0, index, values)
    counts = torch.zeros(num_segments, dtype=values.dtype).index_add_(0, index, torch.ones_like(values))
    return (sums / counts)[index]


def segment_std(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Sample std (Bessel-corrected, as TRL's `nanstd`) of each sample's segment, broadcast back.

    A segment of one sample has std 0 (its advantage is then 0, as TRL gives a group of one).

    Args:
        values: (N,) float tensor.
        index: (N,) long tensor of dense segment ids.

    Returns:
        (N,) tensor of per-segment standard deviations.
    """
    num_segments = int(index.max()) + 1
    counts = torch.zeros(num_segments, dtype=values.dtype).index_add_(0, index, torch.ones_like(values))
    squared = (values - segment_mean(values, index)) ** 2
    sums = torch.zeros(num_segments, dtype=values.dtype).index_add_(0, index, squared)
    variance = torch.where(counts > 1, sums / (counts - 1).clamp(min=1), torch.zeros_like(sums))
    return variance.sqrt()[index]


def batch_std(values: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected std of the whole batch, broadcast to (N,); 0 for a batch of one (as TRL)."""
    if values.numel() < 2:
        return torch.zeros_like(values)
    return values.std(unbiased=True).expand_as(values)


# ---------------------------------------------------------------------------------------------------
# Advantages: one function per normalisation (TRL's `scale_rewards`, plus AZR's TRR++)
# ---------------------------------------------------------------------------------------------------


def _in_range(rewards: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``rewards`` divided by a power of two (exact) so that the largest is about ``finfo.max ** 0.25`` where it
    was larger, and the factor: squares and sums of huge finite rewards overflowed to infinity, and a group of
    +-1e154 got advantages of 0 (a robustness review). Smaller rewards are returned as they are, so that
    ``ADVANTAGE_EPS`` weighs what it weighed."""
    if not rewards.numel():
        return rewards, 1.0
    largest = float(rewards.detach().abs().max())
    limit = torch.finfo(rewards.dtype).max ** 0.25
    if not limit < largest < math.inf:
        return rewards, 1.0
    factor = 2.0 ** (math.frexp(largest)[1] - math.frexp(limit)[1])
    return rewards / factor, factor


def _deviation(rewards: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``rewards - mean``, with 0 where the two differ only by the rounding of the mean (a few units in
    the last place): a group of equal rewards carries no signal and gets no advantage at any scale
    (divided by the std plus ``ADVANTAGE_EPS``, a rounding error of 1e-5 became an advantage of 0.07)."""
    deviation = rewards - mean
    rounding = 4 * torch.finfo(rewards.dtype).eps * torch.maximum(rewards.abs(), mean.abs())
    return torch.where(deviation.abs() <= rounding, torch.zeros_like(deviation), deviation)


def advantages_group(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """GRPO's group-normalised advantage, TRL `scale_rewards="group"`: (r - mean_g) / (std_g + eps).

    Args:
        rewards: (N,) rewards.
        group: (N,) dense group ids (the completions of one prompt share a group).

    Returns:
        (N,) advantages.
    """
    rewards, _ = _in_range(rewards)  # (the ratio does not change)
    return _deviation(rewards, segment_mean(rewards, group)) / (segment_std(rewards, group) + ADVANTAGE_EPS)


def advantages_batch(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """TRL `scale_rewards="batch"`: the group mean as baseline, scaled by the batch std (PPO-Lite).

    Args:
        rewards: (N,) rewards.
        group: (N,) dense group ids.

    Returns:
        (N,) advantages (r - mean_g) / (std_batch + eps).
    """
    rewards, _ = _in_range(rewards)
    return _deviation(rewards, segment_mean(rewards, group)) / (batch_std(rewards) + ADVANTAGE_EPS)


def advantages_unscaled(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """TRL `scale_rewards="none"` (Dr. GRPO §3.2: no std division): r - mean_g.

    Args:
        rewards: (N,) rewards.
        group: (N,) dense group ids.

    Returns:
        (N,) advantages.
    """
    rewards, factor = _in_range(rewards)
    return _deviation(rewards, segment_mean(rewards, group)) * factor


def advantages_task_relative(rewards: torch.Tensor, task_key: torch.Tensor) -> torch.Tensor:
    """AZR's Task-Relative REINFORCE++ (arXiv 2505.03335, §3): (r - mean_k) / (std_k + eps).

    The baseline and scale are computed over every sample of the batch that shares the sample's
    (role, task type) key, not per prompt group. (AZR's code whitens token-level returns per
    task-role batch; with one outcome reward per sequence the paper's per-sample form is used here, with
    the same Bessel-corrected std and eps as the group variant.)

    Args:
        rewards: (N,) rewards.
        task_key: (N,) dense ids of the (role, task type) keys.

    Returns:
        (N,) advantages.
    """
    rewards, _ = _in_range(rewards)
    return _deviation(rewards, segment_mean(rewards, task_key)) / (
        segment_std(rewards, task_key) + ADVANTAGE_EPS
    )


# ---------------------------------------------------------------------------------------------------
# Per-token quantities
# ---------------------------------------------------------------------------------------------------


def token_log_probs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target token: logits[t, id] - logsumexp(logits[t]), in float32.

    Args:
        logits: (B, T, V) logits already divided by the sampling temperature.
        token_ids: (B, T) target token ids.

    Returns:
        (B, T) log-probabilities.
    """
    logits = logits.float()
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _active(delta: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``delta`` with 0 at the positions ``mask`` leaves out: a log-prob gap at padding (whose ``<pad>``
    target the policy never sampled, so its log-prob may drift without bound) would otherwise reach
    ``exp`` as an infinity, and ``inf * 0`` in the masked sums is NaN, losing the whole update."""
    return delta if mask is None else delta.masked_fill(mask <= 0, 0.0)


def probability_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token importance ratio π_θ / π_old = exp(logp - old_logp) (TRL's `coef_1`), shape (B, T); 1 at
    the positions a given (B, T) ``mask`` leaves out."""
    return torch.exp(_active(log_probs - old_log_probs, mask))


def clipped_surrogate_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """PPO/GRPO clipped per-token loss with DAPO's asymmetric clip (TRL's `per_token_loss`).

    loss = -min(ratio * A, clip(ratio, 1 - ε_low, 1 + ε_high) * A)

    Args:
        ratio: (B, T) per-token probability ratios.
        advantages: (B,) one advantage per sequence, broadcast over its tokens.
        epsilon_low: lower clip ε_low.
        epsilon_high: upper clip ε_high (DAPO's clip-higher).

    Returns:
        (B, T) per-token losses (padding not yet masked).
    """
    advantages = advantages.unsqueeze(1)  # (B, 1)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    return -torch.min(ratio * advantages, clipped * advantages)


def k3_kl(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π_θ || π_ref), per token (DeepSeekMath eq. 4; TRL's `per_token_kl`).

    kl = exp(ref - logp) - (ref - logp) - 1, which is >= 0 and 0 where the two agree.

    Args:
        log_probs: (B, T) log-probs under the policy.
        ref_log_probs: (B, T) log-probs under the reference (here: the base with the adapter off).
        mask: Optional (B, T) completion mask: 0 where it leaves a position out (see ``_active``).

    Returns:
        (B, T) per-token KL estimates.
    """
    delta = _active(ref_log_probs - log_probs, mask)
    return torch.exp(delta) - delta - 1.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------------------------------------------
# Aggregations: one function per TRL `loss_type`, each for ONE micro-batch of an accumulation window
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AggregationContext:
    """What an aggregation needs to know beyond the micro-batch itself.

    The micro-batches of a window may differ in size by one (a batch of 5 in 2 steps: 3 and 2). Each
    aggregation weights a micro-batch by its share of the window's sequences, so that the window's summed
    gradient is the one of the whole batch in one step; with equal micro-batches that is TRL's division by
    the number of accumulation steps.
    """

    num_sequences_in_batch: int
    """Sequences (completions) in the whole accumulation window (all micro-batches)."""
    max_completion_length: int
    """Dr. GRPO's constant normaliser: the configured maximum number of completion tokens."""
    num_items_in_batch: float
    """Active (mask == 1) completion tokens in the whole accumulation window (all micro-batches)."""


def aggregate_grpo(per_token_loss: torch.Tensor, mask: torch.Tensor, ctx: AggregationContext) -> torch.Tensor:
    """TRL `loss_type="grpo"`: mean over each sequence's tokens, mean over the window's sequences.

    For one micro-batch: the sum of its sequences' token means / the window's sequences (TRL: the
    micro-batch's mean / accumulation steps, the same with equal micro-batches).

    Args:
        per_token_loss: (B, T) per-token losses.
        mask: (B, T) completion mask (1 = a real completion token).
        ctx: accumulation facts.

    Returns:
        Scalar loss for this micro-batch.
    """
    per_sequence = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    return per_sequence.sum() / ctx.num_sequences_in_batch


def aggregate_bnpo(per_token_loss: torch.Tensor, mask: torch.Tensor, ctx: AggregationContext) -> torch.Tensor:
    """TRL `loss_type="bnpo"`: sum over the micro-batch's tokens / its active tokens, weighted by the
    micro-batch's share of the window's sequences (TRL: / accumulation steps, its micro-batches being
    equal). The normalisation is per micro-batch by definition (TRL documents that results depend on the
    local batch size); ``dapo`` normalises by the window's tokens instead.

    Args:
        per_token_loss: (B, T) per-token losses.
        mask: (B, T) completion mask.
        ctx: accumulation facts.

    Returns:
        Scalar loss for this micro-batch.
    """
    share = per_token_loss.size(0) / ctx.num_sequences_in_batch
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) * share


def aggregate_dr_grpo(
    per_token_loss: torch.Tensor, mask: torch.Tensor, ctx: AggregationContext
) -> torch.Tensor:
    """TRL `loss_type="dr_grpo"`: sum / (the window's sequences * max_completion_length).

    (TRL: / (micro-batch size * max_completion_length) / accumulation steps, the same with equal
    micro-batches.)

    Args:
        per_token_loss: (B, T) per-token losses.
        mask: (B, T) completion mask.
        ctx: accumulation facts.

    Returns:
        Scalar loss for this micro-batch.
    """
    normaliser = ctx.num_sequences_in_batch * ctx.max_completion_length
    return (per_token_loss * mask).sum() / normaliser


def aggregate_dapo(per_token_loss: torch.Tensor, mask: torch.Tensor, ctx: AggregationContext) -> torch.Tensor:
    """TRL `loss_type="dapo"`: sum / active tokens of the whole accumulation window (no division by steps).

    Summed over the window's micro-batches this is the token-level mean of DAPO eq. 8. (TRL 1.16 rescales
    `num_items_in_batch` by grad_accum / steps_per_generation, which is 1 when one generation batch is one
    optimizer step, as here.)

    Args:
        per_token_loss: (B, T) per-token losses.
        mask: (B, T) completion mask.
        ctx: accumulation facts.

    Returns:
        Scalar loss for this micro-batch.
    """
    return (per_token_loss * mask).sum() / max(ctx.num_items_in_batch, 1.0)


AGGREGATIONS = {
    "grpo": aggregate_grpo,
    "bnpo": aggregate_bnpo,
    "dr_grpo": aggregate_dr_grpo,
    "dapo": aggregate_dapo,
}
"""TRL's loss-type names mapped to their aggregation."""


@dataclass(frozen=True)
class ClipFractions:
    """Share of active tokens whose ratio was clipped in a direction that stops the gradient (TRL's metrics)."""

    low: float
    """ratio < 1 - ε_low with a negative advantage."""
    high: float
    """ratio > 1 + ε_high with a positive advantage."""
    region: float
    """Either of the two."""


def clip_fractions(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> ClipFractions:
    """TRL's `clip_ratio/low_mean`, `high_mean` and `region_mean` over one micro-batch.

    Args:
        ratio: (B, T) probability ratios.
        advantages: (B,) advantages.
        mask: (B, T) completion mask.
        epsilon_low: lower clip.
        epsilon_high: upper clip.

    Returns:
        The three fractions.
    """
    advantages = advantages.unsqueeze(1)
    low = (ratio < 1.0 - epsilon_low) & (advantages < 0)
    high = (ratio > 1.0 + epsilon_high) & (advantages > 0)
    return ClipFractions(
        low=float(masked_mean(low.float(), mask)),
        high=float(masked_mean(high.float(), mask)),
        region=float(masked_mean((low | high).float(), mask)),
    )
