"""Members' own learners: REINFORCE with a mean baseline for torch policies, ``none`` for pure evolution
(``ppo`` for SB3 members lives in ``evolve.sb3_members``).

Add one with ``LEARNERS["mine"] = factory``; a factory takes ``(policy, LearnerConfig)`` and returns a
``Learner``. Unknown names raise ``KeyError`` listing the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evolve.members import is_finite_number, is_int_at_least
from evolve.operators import LazyRegistry, Registry
from evolve.protocols import Learner, LearnStats, Transition


@dataclass(frozen=True)
class LearnerConfig:
    """Hyper-parameters of the ``reinforce`` learner (``ppo``, SB3's, takes ``lr`` only). Other learners
    take theirs from ``PBTConfig.member_options`` and refuse a changed ``LearnerConfig`` (``grpo``: its
    ``member_options["grpo"]``); a run's ``config.json`` lists this one whatever the learner."""

    lr: float = 0.01
    """Adam learning rate."""
    steps: int = 2
    """Full-batch gradient steps per generation on that generation's experience."""

    def __post_init__(self) -> None:
        lr, steps = self.lr, self.steps
        if not (is_finite_number(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        if not is_int_at_least(steps, 1):
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        if not isinstance(lr, int | float):  # numpy's numbers as Python's (the config is JSON)
            object.__setattr__(self, "lr", float(lr))
        object.__setattr__(self, "steps", int(steps))


class NoLearner:
    """Pure evolution: the weights change only through operators."""

    def update(self, policy: Any, experience: Sequence[Transition]) -> LearnStats:
        """Does nothing."""
        return LearnStats(float("nan"), 0)

    def state_dict(self) -> dict[str, Any]:
        """No state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """No state."""

    def reset(self) -> None:
        """No state."""


def reinforce_loss(log_probs: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a baseline (Williams 1992; Sutton & Barto 2018, eq. 13.11): ``-mean(A * log pi)``.

    The advantage ``A`` is the reward minus the batch mean, divided by the batch standard deviation (a
    common variance reduction; with constant rewards ``A = 0`` and the gradient vanishes).

    Args:
        log_probs: ``(N,)`` log-probabilities of the taken actions.
        rewards: ``(N,)`` rewards credited to them.
    """
    advantages = rewards - rewards.mean()
    if rewards.numel() > 1:
        advantages = advantages / (rewards.std() + 1e-8)
    return -(advantages.detach() * log_probs).mean()


class ReinforceLearner:
    """REINFORCE for a policy with ``log_prob(role, observations, actions)`` (e.g. ``TorchPolicy``).

    Teacher and student decisions are separate batches (their rewards are on different scales); their
    losses are summed.

    Args:
        policy: the member's policy (an ``nn.Module``).
        config: learning rate and steps.
    """

    def __init__(self, policy: torch.nn.Module, config: LearnerConfig) -> None:
        # (a policy of another kind failed with an AttributeError at the first update, or every update failed
        # and the run "finished": a review; ppo and grpo check their policy's type too, and all three raise a
        # ValueError, a choice of learner that does not fit the member kind: this one was a TypeError, an audit)
        if not all(callable(getattr(policy, name, None)) for name in ("parameters", "log_prob")):
            raise ValueError(
                "the 'reinforce' learner needs a policy with parameters() and log_prob(role, observations, "
                f"actions) (a torch.nn.Module such as TorchPolicy), got a {type(policy).__name__}; register a "
                "learner of your own for this kind (evolve.learners.LEARNERS) or set PBTConfig.learner/learners"
            )
        self.policy = policy
        self.config = config
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)

    def update(self, policy: Any, experience: Sequence[Transition]) -> LearnStats:
        """``config.steps`` Adam steps on the REINFORCE loss of ``experience``; ``info`` holds the gradient's
        global L2 norm before the last step (``grad_norm``)."""
        if policy is not self.policy:
            raise ValueError("a ReinforceLearner updates only the policy it was built for")
        module: Any = self.policy
        by_role: dict[str, list[Transition]] = {}
        for t in experience:
            if not t.illegal:  # (an action the env refused has no log-probability to score)
                by_role.setdefault(t.role, []).append(t)
        if not by_role:
            return LearnStats(float("nan"), 0)
        loss_value = grad_norm = float("nan")
        for step in range(self.config.steps):
            loss = torch.zeros(())
            for role, batch in sorted(by_role.items()):
                log_probs = module.log_prob(role, [t.observation for t in batch], [t.action for t in batch])
                rewards = torch.as_tensor([t.reward for t in batch], dtype=torch.float32)
                loss = loss + reinforce_loss(log_probs, rewards)
            self.optimizer.zero_grad()
            loss.backward()
            if step == self.config.steps - 1:  # (the one reported)
                grads = [p.grad.detach().flatten() for p in module.parameters() if p.grad is not None]
                grad_norm = float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0
            self.optimizer.step()
            loss_value = float(loss.detach())
        return LearnStats(loss_value, sum(map(len, by_role.values())), {"grad_norm": grad_norm})

    def state_dict(self) -> dict[str, Any]:
        """Adam's moments and step counts."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores Adam's state."""
        self.optimizer.load_state_dict(state)

    def reset(self) -> None:
        """A fresh Adam (the weights were replaced by an operator's child)."""
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.config.lr)


LearnerFactory = Callable[[Any, LearnerConfig], Learner]

LEARNERS: Registry = LazyRegistry(
    "learner",
    {"reinforce": ReinforceLearner, "none": lambda policy, config: NoLearner()},
    lazy={"ppo": ("evolve.sb3_members", "sb3"), "grpo": ("agents.members", "llm")},
)
"""Learner factories by name (``ppo``, SB3's PPO for ``sb3`` members, and ``grpo`` for ``lora`` members are
imported on first use)."""
