"""The ``Policy`` protocol and ``play``: run AEC episodes of any env with a policy per agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from populora_env.metrics import EpisodeMetrics


@runtime_checkable
class Policy(Protocol):
    """Anything that maps an agent's observation to an action.

    Implementations may also offer ``act_batch(observations, agents) -> list`` for batched inference;
    ``play`` steps one agent at a time (AEC) and only needs ``act``.
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
    for episode in range(episodes):
        episode_seed = None if seed is None else seed + episode
        env.reset(seed=episode_seed)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        steps = 0
        for agent in env.agent_iter():
            observation, reward, terminated, truncated, _ = env.last()
            returns[agent] += float(reward)
            if terminated or truncated:
                env.step(None)
                continue
            if steps >= max_steps:
                raise RuntimeError(f"episode {episode} exceeded max_steps={max_steps}")
            env.step(policies[agent].act(observation, agent))
            steps += 1
        metrics_fn = getattr(env.unwrapped, "episode_metrics", None)
        records.append(
            EpisodeRecord(episode, episode_seed, returns, steps, metrics_fn() if metrics_fn else None)
        )
    return records


def mean_returns(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Average return per agent over episode records."""
    agents = records[0].returns.keys() if records else ()
    return {a: sum(r.returns[a] for r in records) / len(records) for a in agents}
