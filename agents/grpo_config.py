"""Configuration and result records of the GRPO learner (`agents.grpo`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agents._checks import is_number, plain_number

__all__ = [
    "LOSS_TYPES",
    "SCALE_REWARDS",
    "GRPOConfig",
    "LossType",
    "ScaleRewards",
    "SkipReason",
    "StepResult",
    "UpdateStats",
]

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none", "task_relative"]
SkipReason = Literal[
    "non_finite_reward", "non_finite_loss", "non_finite_grad_norm", "non_finite_weights", "all_truncated"
]

LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none", "task_relative")


MIN_TEMPERATURE = 1e-6
"""Lowest sampling/scoring temperature a learner takes (GRPO samples; for near-greedy use a small one)."""


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO learner (defaults follow TRL's `GRPOConfig` unless said otherwise)."""

    learning_rate: float = 1e-5
    """AdamW learning rate for the adapter's parameters (TRL: 1e-6, for full fine-tuning; LoRA usually
    wants more)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    loss_type: LossType = "dapo"
    """Aggregation of per-token losses, TRL's names: "grpo", "bnpo", "dr_grpo" or "dapo" (TRL's default)."""
    scale_rewards: ScaleRewards = "group"
    """Advantage normalisation: "group" (std of the prompt's group), "batch" (std of the batch), "none"
    (centre only, Dr. GRPO) or "task_relative" (AZR's TRR++: mean/std per (role, task type) key; needs
    `task_keys`)."""
    epsilon_low: float = 0.2
    """Lower clip: ratios below 1 - epsilon_low stop the gradient of negative-advantage tokens."""
    epsilon_high: float = 0.2
    """Upper clip: ratios above 1 + epsilon_high stop positive-advantage tokens (DAPO recommends 0.28)."""
    beta: float = 0.0
    """k3 KL coefficient towards the base model (the adapter switched off); 0 turns the KL term off."""
    num_inner_epochs: int = 1
    """Optimizer passes over each generated batch (μ); old log-probs are computed once before them."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; the batch is split into this many near-equal chunks, each weighted
    by its share of the batch (the gradient is the one-step gradient, up to rounding; ``bnpo`` normalises
    tokens per micro-batch by its definition)."""
    max_grad_norm: float = 1.0
    """Clip the adapter's gradient to this global L2 norm before each optimizer step."""
    group_size: int = 8
    """Completions per prompt in `step` (TRL's `num_generations`)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed from logits / temperature to match the sampler."""
    max_new_tokens: int = 64
    """Completion length cap for generation, and Dr. GRPO's constant normaliser (TRL's
    `max_completion_length`, whose default is 512: 64 suits this game's short answers on CPU)."""
    seed: int = 0
    """Base seed: generation in `step` uses seed + the number of earlier `step` calls of this learner
    (TRL's default seed is 42)."""
    deterministic: bool = True
    """On CUDA, run updates with PyTorch's deterministic kernels, so that a rerun or a resumed run is
    bit-identical (CUDA's default attention backward accumulates with atomics: measured on an H200, two
    identical 3-generation runs ended 1e-8 to 1e-6 apart in lora_B); False lets CUDA pick faster,
    run-to-run varying kernels. No effect on CPU, whose kernels are deterministic already."""
    mask_truncated_completions: bool = False
    """TRL's option of that name, DAPO's overlong filtering (Yu et al. 2025, arXiv 2503.14476, §3.4): a
    completion whose trained tokens hold no stop token (cut at the generation budget, or at
    ``max_new_tokens`` for training) takes no part in the loss; its reward still counts in its group's
    advantages. A batch with nothing but such completions is skipped (``"all_truncated"``: weights and
    optimizer state untouched, where TRL steps AdamW on a zero gradient, moving the weights by momentum and
    decay). Off by default, as in TRL: the format penalty a cut-off answer gets is then what teaches a policy
    to stop."""

    def __post_init__(self) -> None:
        # numpy's numbers as Python's (a value read from an array), bools refused
        for name in _FLOATS + _INTS:
            value = getattr(self, name)
            object.__setattr__(self, name, plain_number(value))
            if isinstance(value, bool):
                raise ValueError(f"GRPOConfig.{name} must be a number, not a bool, got {value!r}")
        # the optimizer and the loss compute in float32 (1e39 raised inside AdamW's step)
        for name in _FLOATS:
            value = getattr(self, name)
            _check(not is_number(value) or abs(value) <= _FLOAT32_MAX, name, "within float32's range", value)
        _check(self.loss_type in LOSS_TYPES, "loss_type", f"one of {LOSS_TYPES}", self.loss_type)
        _check(
            self.scale_rewards in SCALE_REWARDS,
            "scale_rewards",
            f"one of {SCALE_REWARDS}",
            self.scale_rewards,
        )
        _check(
            is_number(self.learning_rate) and self.learning_rate > 0,
            "learning_rate",
            "> 0",
            self.learning_rate,
        )
        _check(
            is_number(self.weight_decay) and self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay
        )
        # AdamW multiplies the weights by 1 - learning_rate * weight_decay each step: below 0 they flip sign and
        # grow (1e300 gave infinite weights from an update reported as done)
        _check(
            self.learning_rate * self.weight_decay <= 1,
            "weight_decay",
            f"<= 1 / learning_rate = {1 / self.learning_rate:g}",
            self.weight_decay,
        )
        _check(
            is_number(self.epsilon_low) and 0 <= self.epsilon_low < 1,
            "epsilon_low",
            "in [0, 1)",
            self.epsilon_low,
        )
        _check(
            is_number(self.epsilon_high) and self.epsilon_high >= 0, "epsilon_high", ">= 0", self.epsilon_high
        )
        _check(is_number(self.beta) and self.beta >= 0, "beta", ">= 0 (0 = no KL)", self.beta)
        for name in ("num_inner_epochs", "grad_accum_steps", "max_new_tokens"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, "an int >= 1", value)
        _check(
            isinstance(self.group_size, int) and self.group_size >= 2,
            "group_size",
            "an int >= 2",
            self.group_size,
        )
        _check(
            is_number(self.max_grad_norm) and self.max_grad_norm > 0,
            "max_grad_norm",
            "> 0",
            self.max_grad_norm,
        )
        # logits / T overflows float32 for a T near 1e-37 (every log-prob NaN, every update skipped)
        _check(
            is_number(self.temperature) and self.temperature >= MIN_TEMPERATURE,
            "temperature",
            f">= {MIN_TEMPERATURE:g}",
            self.temperature,
        )
        # (generation seeds seed + the step count; 2**64 was refused by the first `step`)
        _check(
            isinstance(self.seed, int) and 0 <= self.seed < 2**63, "seed", "an int in [0, 2**63)", self.seed
        )
        _check(isinstance(self.deterministic, bool), "deterministic", "a bool", self.deterministic)
        _check(
            isinstance(self.mask_truncated_completions, bool),
            "mask_truncated_completions",
            "a bool",
            self.mask_truncated_completions,
        )


_FLOATS = (
    "learning_rate",
    "weight_decay",
    "epsilon_low",
    "epsilon_high",
    "beta",
    "max_grad_norm",
    "temperature",
)
_INTS = ("num_inner_epochs", "grad_accum_steps", "max_new_tokens", "group_size", "seed")
_FLOAT32_MAX = 3.4028234663852886e38


def _check(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"GRPOConfig.{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class UpdateStats:
    """What one `GRPOLearner.update` did."""

    adapter: str
    """The adapter that was (or would have been) trained."""
    skipped: bool
    """True when the update was abandoned; the adapter and its optimizer state are then unchanged."""
    skip_reason: SkipReason | None
    """Why it was skipped, or None."""
    loss: float
    """Mean over optimizer steps of the summed micro-batch losses (nan when skipped)."""
    kl: float | None
    """Mean k3 KL to the base over active tokens (None when beta == 0)."""
    clip_fraction: float
    """Mean share of active tokens whose ratio was clipped (TRL's clip_ratio/region_mean)."""
    grad_norm: float
    """Mean pre-clipping gradient norm over optimizer steps (nan when skipped before any)."""
    mean_reward: float
    """Mean of the rewards given."""
    num_samples: int
    """Completions in the batch."""
    num_tokens: int
    """Active completion tokens in the batch (those of masked truncated completions not counted)."""
    optimizer_steps: int
    """Optimizer steps taken (num_inner_epochs unless skipped)."""
    truncated_rows: tuple[int, ...] | None = None
    """The completions whose trained tokens hold no stop token (cut at the budget), masked or not: their
    indices in the batch as given, so that a caller can count them by its own grouping
    (``agents.members.grpo_info``: by role); ``None`` when skipped for a non-finite reward, before the
    completions were tokenised."""

    @property
    def num_truncated(self) -> int | None:
        """How many completions were cut at the budget (``len(truncated_rows)``; TRL logs their share as
        ``completions/clipped_ratio``), ``None`` where ``truncated_rows`` is."""
        return None if self.truncated_rows is None else len(self.truncated_rows)


@dataclass(frozen=True)
class StepResult:
    """One generate-score-update cycle."""

    completions: tuple[str, ...]
    """Generated completions, group_size per prompt, prompt-major."""
    rewards: tuple[float, ...]
    """reward_fn(prompt, completion) for each completion."""
    stats: UpdateStats
    """The update's record."""
