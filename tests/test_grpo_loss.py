"""GRPO maths on small hand-made tensors; every expected number is derived by hand in the test."""

from __future__ import annotations

import math

import pytest
import torch

from agents.grpo_loss import (
    ADVANTAGE_EPS,
    AGGREGATIONS,
    AggregationContext,
    advantages_batch,
    advantages_group,
    advantages_task_relative,
    advantages_unscaled,
    clip_fractions,
    clipped_surrogate_loss,
    k3_kl,
    probability_ratio,
    segment_index,
    token_log_probs,
)

EPS = ADVANTAGE_EPS

# Two groups of four: group 0 has rewards 1,0,0,1 (mean 0.5, Bessel std sqrt(1/3)); group 1 is constant.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_segment_index_orders_keys_by_first_appearance() -> None:
    keys = [("student", "deduction"), ("teacher", "abduction"), ("student", "deduction"), 7]
    assert segment_index(keys).tolist() == [0, 1, 0, 2]


def test_group_advantages_by_hand() -> None:
    scale = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    expected = [scale, -scale, -scale, scale, 0.0, 0.0, 0.0, 0.0]
    assert advantages_group(REWARDS, GROUPS).tolist() == pytest.approx(expected, abs=1e-6)


def test_batch_advantages_use_group_mean_and_batch_std() -> None:
    # Batch mean 14/8 = 1.75; squared deviations 2*0.5625 + 2*3.0625 + 4*1.5625 = 13.5; Bessel: 13.5/7.
    batch_std = math.sqrt(13.5 / 7.0)
    scale = 0.5 / (batch_std + EPS)
    expected = [scale, -scale, -scale, scale, 0.0, 0.0, 0.0, 0.0]
    assert advantages_batch(REWARDS, GROUPS).tolist() == pytest.approx(expected, abs=1e-6)


def test_unscaled_advantages_are_centred_only() -> None:
    expected = [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert advantages_unscaled(REWARDS, GROUPS).tolist() == pytest.approx(expected, abs=1e-7)


def test_group_ids_need_not_be_contiguous() -> None:
    rewards = torch.tensor([1.0, 3.0, 0.0, 3.0])
    groups = torch.tensor([0, 1, 0, 1])
    # Group 0 = {1, 0}: mean 0.5, Bessel std sqrt(0.5); group 1 constant.
    scale = 0.5 / (math.sqrt(0.5) + EPS)
    assert advantages_group(rewards, groups).tolist() == pytest.approx([scale, 0.0, -scale, 0.0], abs=1e-6)


def test_singleton_group_has_zero_advantage() -> None:
    rewards = torch.tensor([5.0, 1.0, 2.0])
    groups = torch.tensor([0, 1, 1])
    assert advantages_group(rewards, groups)[0].item() == 0.0


def test_task_relative_advantages_by_hand() -> None:
    # Keys T, S, T, S, S. Teacher rewards {1, 0}: mean 0.5, std sqrt(0.5).
    # Student rewards {0, 1, 2}: mean 1, Bessel std 1. Group ids are irrelevant to TRR++.
    keys = [("teacher", "deduction"), ("student", "deduction")] * 2 + [("student", "deduction")]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0])
    t = 0.5 / (math.sqrt(0.5) + EPS)
    s = 1.0 / (1.0 + EPS)
    expected = [t, -s, -t, 0.0, s]
    got = advantages_task_relative(rewards, segment_index(keys))
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_task_relative_separates_task_types_of_one_role() -> None:
    keys = [
        ("student", "deduction"),
        ("student", "abduction"),
        ("student", "deduction"),
        ("student", "abduction"),
    ]
    rewards = torch.tensor([1.0, 10.0, 0.0, 10.0])
    got = advantages_task_relative(rewards, segment_index(keys))
    # The abduction key is constant, so its advantages are exactly 0; a pooled baseline would not be.
    assert got[1].item() == 0.0 and got[3].item() == 0.0
    assert got[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + EPS), abs=1e-6)


# Per-token loss fixture: B = 2 sequences, T = 3 tokens; the last token of row 0 is padding.
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.2, -3.0]])
OLD_LOGP = torch.tensor([[-1.1, -1.5, -0.5], [-1.0, -0.2, -2.0]])
ADV = torch.tensor([1.0, -2.0])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
EPS_LOW, EPS_HIGH = 0.2, 0.28  # clip range [0.8, 1.28]

# By hand: ratios row 0 = e^0.1, e^-0.5, 1; row 1 = e^-0.5, 1, e^-1.
# Row 0 (A = +1): min(r, clip(r)) = e^0.1 (inside), e^-0.5 (r < clip = 0.8), 1   -> loss = -those.
# Row 1 (A = -2): min(-2r, -2 clip(r)) = -1.6 (clip 0.8 > r), -2, -1.6             -> loss = 1.6, 2, 1.6.
EXPECTED_PER_TOKEN = [
    [-math.exp(0.1), -math.exp(-0.5), -1.0],
    [1.6, 2.0, 1.6],
]
ROW0 = -math.exp(0.1) - math.exp(-0.5)  # masked sum of row 0 (padding dropped)
ROW1 = 1.6 + 2.0 + 1.6


def _per_token_loss() -> torch.Tensor:
    return clipped_surrogate_loss(probability_ratio(LOGP, OLD_LOGP), ADV, EPS_LOW, EPS_HIGH)


def test_clipped_surrogate_by_hand() -> None:
    got = _per_token_loss()
    assert got.tolist()[0] == pytest.approx(EXPECTED_PER_TOKEN[0], abs=1e-6)
    assert got.tolist()[1] == pytest.approx(EXPECTED_PER_TOKEN[1], abs=1e-6)


@pytest.mark.parametrize(
    ("loss_type", "accum", "expected"),
    [
        ("grpo", 1, (ROW0 / 2 + ROW1 / 3) / 2),
        ("grpo", 2, (ROW0 / 2 + ROW1 / 3) / 2 / 2),
        ("bnpo", 1, (ROW0 + ROW1) / 5),
        ("bnpo", 2, (ROW0 + ROW1) / 5 / 2),
        ("dr_grpo", 1, (ROW0 + ROW1) / (2 * 4)),
        ("dr_grpo", 2, (ROW0 + ROW1) / (2 * 4) / 2),
        ("dapo", 1, (ROW0 + ROW1) / 10),
        ("dapo", 2, (ROW0 + ROW1) / 10),  # dapo divides by the window's tokens, never by the steps
    ],
)
def test_aggregations_by_hand(loss_type: str, accum: int, expected: float) -> None:
    # accum = 2: this micro-batch of two is half of a window of four sequences
    ctx = AggregationContext(
        num_sequences_in_batch=2 * accum, max_completion_length=4, num_items_in_batch=10.0
    )
    got = AGGREGATIONS[loss_type](_per_token_loss(), MASK, ctx)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_window_of_micro_batches_matches_definitions() -> None:
    # Split the batch row-wise into two micro-batches of one sequence; sum over the window.
    per_token = _per_token_loss()
    ctx = AggregationContext(num_sequences_in_batch=2, max_completion_length=4, num_items_in_batch=5.0)
    window = {
        name: sum(fn(per_token[i : i + 1], MASK[i : i + 1], ctx).item() for i in range(2))
        for name, fn in AGGREGATIONS.items()
    }
    assert window["dapo"] == pytest.approx((ROW0 + ROW1) / 5, abs=1e-6)  # token mean of the window
    assert window["grpo"] == pytest.approx((ROW0 / 2 + ROW1 / 3) / 2, abs=1e-6)  # sequence mean
    assert window["bnpo"] == pytest.approx((ROW0 / 2 + ROW1 / 3) / 2, abs=1e-6)  # mean of per-micro means
    assert window["dr_grpo"] == pytest.approx((ROW0 + ROW1) / (2 * 4), abs=1e-6)


def test_padding_never_contributes() -> None:
    poisoned = LOGP.clone()
    poisoned[0, 2] = -50.0  # a padding position with an absurd value
    per_token = clipped_surrogate_loss(probability_ratio(poisoned, OLD_LOGP), ADV, EPS_LOW, EPS_HIGH)
    ctx = AggregationContext(num_sequences_in_batch=2, max_completion_length=4, num_items_in_batch=5.0)
    for fn in AGGREGATIONS.values():
        assert fn(per_token, MASK, ctx).item() == pytest.approx(fn(_per_token_loss(), MASK, ctx).item())


def test_on_policy_gradient_is_minus_advantage_over_length() -> None:
    # At ratio 1 no clip binds, d(-r A)/d logp = -A; grpo divides by each row's length and by B.
    logp = LOGP.clone().requires_grad_(True)
    per_token = clipped_surrogate_loss(probability_ratio(logp, logp.detach()), ADV, EPS_LOW, EPS_HIGH)
    ctx = AggregationContext(num_sequences_in_batch=2, max_completion_length=4, num_items_in_batch=5.0)
    AGGREGATIONS["grpo"](per_token, MASK, ctx).backward()
    expected = [[-1.0 / 2 / 2, -1.0 / 2 / 2, 0.0], [2.0 / 3 / 2, 2.0 / 3 / 2, 2.0 / 3 / 2]]
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx(expected[0], abs=1e-7)
    assert logp.grad.tolist()[1] == pytest.approx(expected[1], abs=1e-7)


def test_clipped_tokens_have_zero_gradient() -> None:
    # Ratio e^0.5 ~ 1.65 > 1.28 with A > 0, and e^-0.5 ~ 0.61 < 0.8 with A < 0: both clipped, no gradient.
    logp = torch.tensor([[0.5], [-0.5]], requires_grad=True)
    old = torch.zeros(2, 1)
    loss = clipped_surrogate_loss(probability_ratio(logp, old), torch.tensor([1.0, -1.0]), EPS_LOW, EPS_HIGH)
    loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == [[0.0], [0.0]]
    assert loss.flatten().tolist() == pytest.approx([-1.28, 0.8], abs=1e-6)


def test_clip_fractions_by_hand() -> None:
    # Row 1 (A < 0) has ratios e^-0.5 and e^-1 below 0.8: 2 of the 5 active tokens. Row 0's e^-0.5 has A > 0,
    # so it is not clipped in the gradient-stopping sense.
    fractions = clip_fractions(probability_ratio(LOGP, OLD_LOGP), ADV, MASK, EPS_LOW, EPS_HIGH)
    assert fractions.low == pytest.approx(2 / 5)
    assert fractions.high == 0.0
    assert fractions.region == pytest.approx(2 / 5)
    # the high side: row 0 (A > 0) with ratios e^0.5 and e^0.2 (above and below 1.28), row 1 (A < 0) with
    # e^0.5 (high, but a negative advantage is not clipped there); 1 of the 5 active tokens clipped high
    logp = OLD_LOGP + torch.tensor([[0.5, 0.2, 0.0], [0.5, 0.0, 0.0]])
    fractions = clip_fractions(probability_ratio(logp, OLD_LOGP), ADV, MASK, EPS_LOW, EPS_HIGH)
    assert fractions.high == pytest.approx(1 / 5) and fractions.low == 0.0
    assert fractions.region == pytest.approx(1 / 5)
    # a mutation audit: above, each sign of advantage has one high ratio, so a high side that tested the
    # advantage's sign the wrong way round gave the same 1/5. Row 0 (A > 0) has two ratios above 1.28 here,
    # row 1 (A < 0) one: 2 of the 5 active tokens are clipped high (the wrong sign would count 1)
    logp = OLD_LOGP + torch.tensor([[0.5, 0.4, 0.0], [0.5, 0.0, 0.0]])
    fractions = clip_fractions(probability_ratio(logp, OLD_LOGP), ADV, MASK, EPS_LOW, EPS_HIGH)
    assert (fractions.low, fractions.high) == (0.0, pytest.approx(2 / 5))
    assert fractions.region == pytest.approx(2 / 5)


def test_k3_kl_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.7]])
    ref = torch.tensor([[-1.5, -1.0, -0.7]])
    # delta = ref - logp = -0.5, 1, 0  ->  e^delta - delta - 1.
    expected = [math.exp(-0.5) + 0.5 - 1.0, math.e - 2.0, 0.0]
    assert k3_kl(logp, ref).tolist()[0] == pytest.approx(expected, abs=1e-6)


def test_token_log_probs_by_hand() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0]]])  # probs (1/4, 3/4), (4/5, 1/5)
    got = token_log_probs(logits, torch.tensor([[1, 1]]))
    assert got.tolist()[0] == pytest.approx([math.log(0.75), math.log(0.2)], abs=1e-6)


@pytest.mark.parametrize("loss_type", sorted(AGGREGATIONS))
def test_an_infinite_log_prob_gap_at_padding_never_reaches_the_loss(loss_type):
    """Padding's ``<pad>`` target is never sampled, so its log-prob may drift without bound: a gap past
    ~88.7 made ``exp`` infinite there, ``inf * 0`` in the masked sums NaN, and the whole update was
    skipped. With the mask given, the ratio is 1 and the KL 0 at padding, and loss and gradient are the
    ones of the active tokens alone."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logps = torch.tensor([[-1.0, -2.0, -300.0], [-0.5, -400.0, -1e30]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.9, 0.0], [-0.4, 0.0, 0.0]])
    ref = torch.tensor([[-1.1, -2.5, 0.0], [-0.7, -0.0, float("inf")]])
    ratio, kl = probability_ratio(logps, old, mask), k3_kl(logps, ref, mask)
    assert (ratio[mask == 0] == 1.0).all() and (kl[mask == 0] == 0.0).all()
    ctx = AggregationContext(num_sequences_in_batch=2, max_completion_length=3, num_items_in_batch=3.0)
    advantages = torch.tensor([1.0, -1.0])
    loss = AGGREGATIONS[loss_type](clipped_surrogate_loss(ratio, advantages, 0.2, 0.2) + 0.1 * kl, mask, ctx)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logps.grad).all() and (logps.grad[mask == 0] == 0).all()
    # the active tokens' values are those without a mask
    assert torch.equal(ratio[mask == 1], probability_ratio(logps, old)[mask == 1])
    assert torch.equal(kl[mask == 1], k3_kl(logps, ref)[mask == 1])


def test_advantages_of_huge_finite_rewards_are_those_of_the_same_rewards_scaled_down() -> None:
    """Squares and sums of rewards past ~1e154 overflowed float64, and every advantage came out 0 (a robustness
    review): the statistics are taken on the rewards divided by a power of two, exactly."""
    # (large already, so that ADVANTAGE_EPS weighs nothing in either)
    rewards = torch.tensor([3.0, -1.0, 0.5, 2.0], dtype=torch.float64) * 2.0**200
    group = torch.tensor([0, 0, 1, 1])
    for scale in (2.0**320, 2.0**800):
        for function in (advantages_group, advantages_batch):
            small, huge = function(rewards, group), function(rewards * scale, group)
            assert torch.allclose(small, huge, rtol=1e-12, atol=0) and bool(huge.abs().min() > 0.1), scale
        assert torch.equal(
            advantages_unscaled(rewards * scale, group), advantages_unscaled(rewards, group) * scale
        )
        assert torch.allclose(
            advantages_task_relative(rewards * scale, group),
            advantages_task_relative(rewards, group),
            rtol=1e-12,
        )


@pytest.mark.parametrize(
    "function", [advantages_group, advantages_batch, advantages_unscaled, advantages_task_relative]
)
def test_equal_rewards_get_exactly_zero_advantages(function) -> None:
    """A mutation audit: the zeroing of the mean's rounding noise went untested. Three rewards of 0.9 in
    float32 have a mean 6e-8 below 0.9; without it the group's advantages were -6e-4 (-6e-8 unscaled), a
    signal from a group that carries none. Each variant gives exactly 0."""
    rewards = torch.full((3,), 0.9)
    assert function(rewards, torch.zeros(3, dtype=torch.long)).tolist() == [0.0, 0.0, 0.0]
