"""The ``Policy`` protocol and ``play``: run AEC episodes of any env with a policy per agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from populora_env.metrics import EpisodeMetrics


@runtime_checkable
class Policy(Protocol):
    """Anything that maps an agent's observation to an action.

    Implementations may also offer ``act_batch(observations, agents) -> list`` for batched inference:
    ``play`` then asks it once per game phase for all the policy's turns of the phase (envs that list them,
    such as ``TeacherStudent-v0``'s ``pending_observations``), and ``act`` at each step otherwise.
    """

    def act(self, observation: Any, agent: str) -> Any:
        """Returns the action of ``agent`` for ``observation``."""
        ...


@dataclass(frozen=True)
class EpisodeRecord:
    """The outcome of one played episode.

    Attributes:
        episode: index within the ``play`` call.
        seed: the seed passed to ``reset`` (``None`` if unseeded).
        returns: total reward per agent.
        steps: AEC steps taken by live agents.
        metrics: the env's arms-race metrics (``None`` for envs without ``episode_metrics``).
    """

    episode: int
    seed: int | None
    returns: dict[str, float]
    steps: int
    metrics: EpisodeMetrics | None


def play(
    env: Any,
    policies: Mapping[str, Policy],
    episodes: int = 1,
    seed: int | None = None,
    max_steps: int = 1_000_000,
) -> list[EpisodeRecord]:
    """Plays ``episodes`` episodes of an AEC env; episode ``i`` is reset with ``seed + i``.

    Args:
        env: a PettingZoo AEC env (wrapped or raw).
        policies: a policy for every agent of the env.
        episodes: number of episodes.
        seed: base seed (``None``: unseeded resets).
        max_steps: safety cap on live-agent steps per episode.

    Returns:
        One ``EpisodeRecord`` per episode.
    """
    missing = sorted(set(env.possible_agents) - set(policies))
    if missing:
        raise ValueError(f"policies must cover every agent; missing {missing}")
    records = []
    seats = {agent: agent for agent in env.possible_agents}
    for episode in range(episodes):
        episode_seed = None if seed is None else seed + episode
        env.reset(seed=episode_seed)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        steps = 0
        plan = PhasePlan(policies)
        for agent in env.agent_iter():
            observation, reward, terminated, truncated, _ = env.last()
            returns[agent] += float(reward)
            if terminated or truncated:
                env.step(None)
                continue
            if steps >= max_steps:
                raise RuntimeError(f"episode {episode} exceeded max_steps={max_steps}")
            env.step(plan.action(env, agent, observation, policies, seats))
            steps += 1
        metrics_fn = getattr(env.unwrapped, "episode_metrics", None)
        records.append(
            EpisodeRecord(episode, episode_seed, returns, steps, metrics_fn() if metrics_fn else None)
        )
    return records


class PhasePlan:
    """Actions of batching policies (``act_batch``) for every turn of a game phase, asked in one call each.

    Within a phase of ``TeacherStudent-v0`` no observation depends on another agent's action, so the env
    lists the phase's turns up front (``pending_observations``). A policy with ``act_batch`` (LoRA members:
    one batched generation) answers all its turns of the phase at once; other policies act at their own
    step, so privileged policies reading the env's current turn keep working. A policy object seated more
    than once answers for all its seats in one call. Envs without ``pending_observations`` get ``act`` at
    every step.

    Args:
        policies: the policies, by any key (an agent name, a population member's index).
    """

    def __init__(self, policies: Mapping[Any, Any]) -> None:
        self.enabled = any(callable(getattr(p, "act_batch", None)) for p in policies.values())
        self.turns: list[tuple[str, Any]] = []
        self.actions: dict[int, Any] = {}
        self.cursor = 0

    def action(self, env: Any, agent: str, observation: Any, policies: Mapping[Any, Any],
               seats: Mapping[str, Any]) -> Any:  # fmt: skip
        """The action of ``agent`` now: planned for this phase, or asked of its policy at its step.

        Args:
            seats: each agent's key in ``policies``.

        Raises:
            RuntimeError: the env's turn or observation differs from the phase's plan.
        """
        pending = getattr(env.unwrapped, "pending_observations", None)
        if self.enabled and self.cursor >= len(self.turns) and pending is not None:
            self._plan(pending(), policies, seats)
        index = self.cursor
        self.cursor += 1
        if index >= len(self.turns) or index not in self.actions:
            return policies[seats[agent]].act(observation, agent)
        planned_agent, planned = self.turns[index]
        if planned_agent != agent or not _same_observation(planned, observation):
            raise RuntimeError(f"the env's turn ({agent}) differs from its phase plan ({planned_agent})")
        return self.actions[index]

    def _plan(
        self, turns: list[tuple[str, Any]], policies: Mapping[Any, Any], seats: Mapping[str, Any]
    ) -> None:
        self.turns, self.actions, self.cursor = list(turns), {}, 0
        rows: dict[int, tuple[Any, list[int]]] = {}  # by policy object: one call for all its seats
        for i, (agent, _) in enumerate(self.turns):
            policy = policies[seats[agent]]
            if callable(getattr(policy, "act_batch", None)):
                rows.setdefault(id(policy), (policy, []))[1].append(i)
        for policy, indices in rows.values():
            answers = policy.act_batch(
                [self.turns[i][1] for i in indices], [self.turns[i][0] for i in indices]
            )
            if len(answers) != len(indices):
                raise RuntimeError(
                    f"{type(policy).__name__}.act_batch returned {len(answers)} actions for {len(indices)} turns"
                )
            self.actions.update(zip(indices, answers, strict=True))


def _same_observation(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    return bool(np.array_equal(a, b))


def mean_returns(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Average return per agent over episode records."""
    agents = records[0].returns.keys() if records else ()
    return {a: sum(r.returns[a] for r in records) / len(records) for a in agents}
