"""Plug points of the PBT loop: ``EvolvablePolicy``, ``Learner`` and the experience records they exchange."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

Role = Literal["teacher", "student"]
ROLES: tuple[Role, ...] = ("teacher", "student")
"""The two roles, teachers first (the order of tables and figures)."""


@runtime_checkable
class EvolvablePolicy(Protocol):
    """A ``Policy`` (``act(observation, agent)``, optionally ``act_batch``) whose weights are a genome.

    ``get_genome`` returns a ``dict[str, Tensor]`` (a copy or a view; the loop copies before editing) and
    ``set_genome`` loads one with the same keys and shapes. Scripted policies that only have ``act`` take
    part in matches but are never learned, mutated or crossed. A policy may also define
    ``sample_record(observation, action)``: its result travels with the action's ``Transition`` as
    ``sample`` (plain data: it crosses process boundaries on the Ray backend).
    """

    def act(self, observation: Any, agent: str) -> Any:
        """Returns the action of ``agent`` for ``observation``."""
        ...

    def get_genome(self) -> dict[str, torch.Tensor]:
        """The policy's evolvable parameters."""
        ...

    def set_genome(self, genome: dict[str, torch.Tensor]) -> None:
        """Loads evolvable parameters (same keys and shapes as ``get_genome``)."""
        ...


@dataclass(frozen=True)
class Transition:
    """One decision of a member in a played episode.

    Attributes:
        agent: the env seat that acted (``teacher_0``, ``student_1``...).
        role: the seat's role.
        observation: the observation the policy acted on.
        action: the action it took.
        reward: reward credited to this action: a student's verified reward for the attempt; a teacher's
            reward for this very proposal when its round resolved (from the env's ``resolved`` info).
        episode: index of the episode within the generation.
        sample: what the acting policy recorded about how it produced the action, taken when it acted
            (``sample_record(observation, action)``, an optional policy method; ``None`` without one):
            an LLM member's sampled token ids, so that its learner trains on them wherever it runs (a Ray
            learner actor never saw the episode actor's sampling).
        illegal: the env refused the action (``illegal_action``: out of the action space, a masked candidate,
            a wrong type) and paid it the format penalty; a learner that scores actions should skip it (an
            index out of range crashed a user's learner, a review). PBT's games never raise on one.
    """

    agent: str
    role: Role
    observation: Any
    action: Any
    reward: float
    episode: int
    sample: Any = None
    illegal: bool = False


@dataclass(frozen=True)
class LearnStats:
    """What one learner update did.

    Attributes:
        loss: the optimised loss (``nan`` when nothing was optimised).
        samples: transitions used.
        info: other figures of the update by name, real numbers (GRPO's ``clip_fraction``, ``grad_norm``,
            ``truncated`` completions...): the PBT loop logs them per member (``metrics.jsonl``'s
            ``learner_info``, TensorBoard's ``learner/<name>/<member>``; the loss is ``loss/<member>``). A
            0-d tensor or array is taken as its number. Counts named ``truncated`` and ``completions``, or
            ``truncated_<role>`` and ``completions_<role>``, make the generation's cut-off shares
            (``runlog.truncated_shares``: ``populora train``'s ``t-cut`` and ``s-cut``, TensorBoard's
            ``cut_off/<role>``).
    """

    loss: float
    samples: int
    info: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Learner(Protocol):
    """A member's own learner (REINFORCE here; GRPO for LoRA members, PPO for SB3 members).

    A learner holds its optimiser state; ``state_dict``/``load_state_dict`` make it part of checkpoints,
    and ``reset`` is called when the member's genome is replaced by an operator's child.
    """

    def update(self, policy: Any, experience: Sequence[Transition]) -> LearnStats:
        """Improves ``policy`` in place from its own experience of one generation."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The learner's state (optimiser moments, step counts)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state_dict()``."""
        ...

    def reset(self) -> None:
        """Forgets optimiser state (the member's weights were replaced)."""
        ...


def is_evolvable(policy: Any) -> bool:
    """Whether ``policy`` has a genome (scripted policies do not)."""
    return callable(getattr(policy, "get_genome", None)) and callable(getattr(policy, "set_genome", None))
