"""``SingleRoleEnv``: one agent of TeacherStudent-v0 as a Gymnasium env, the others played by policies."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from populora_env.game import warn_constant_teacher_reward
from populora_env.play import Policy


class SingleRoleEnv(gymnasium.Env):
    """The game seen by one learning agent; every other agent follows a given policy.

    Each ``step`` plays the learner's action, then the other agents until the learner's next turn or the
    end of the episode. The reward is the learner's accumulated reward over that stretch (a teacher's
    proposal rewards arrive when its round resolves: with ``teacher_group_size > 1`` the whole group's
    rewards arrive together, at the step of its last proposal, so use a discount near 1, or
    ``teacher_group_size=1`` for per-proposal credit; the per-proposal split is in ``info["resolved"]``).
    A teacher seat under a config whose valid proposals all earn the same (see
    ``game.constant_teacher_reward``) is warned about once. Observations and infos are fresh objects every
    call. On ``reset(seed=s)`` the other policies that have ``reseed(seed)`` are reseeded with ``s + i``,
    so a seeded reset is reproducible.

    Args:
        aec_env: a TeacherStudent-v0 AEC env (wrapped or raw).
        agent: the learning agent, e.g. ``"student_0"``.
        policies: a policy for every other agent.
        max_empty_resets: episodes to skip, at most, when the learner gets no turn in an episode (a student
            whose teachers proposed nothing valid); then ``RuntimeError``.
    """

    metadata = {"render_modes": ["ansi", "human"]}  # noqa: RUF012 -- Gymnasium's class attribute convention

    def __init__(
        self, aec_env: Any, agent: str, policies: Mapping[str, Policy], max_empty_resets: int = 100
    ) -> None:
        super().__init__()
        others = set(aec_env.possible_agents) - {agent}
        if agent not in aec_env.possible_agents:
            raise ValueError(f"agent must be one of {aec_env.possible_agents}, got {agent!r}")
        if missing := sorted(others - set(policies)):
            raise ValueError(f"policies must cover every other agent; missing {missing}")
        # (0 was accepted, and every reset then failed: "got no turn in 0 episodes")
        if (
            not isinstance(max_empty_resets, int)
            or isinstance(max_empty_resets, bool)
            or max_empty_resets < 1
        ):
            raise ValueError(f"max_empty_resets must be an int >= 1, got {max_empty_resets!r}")
        self.aec_env = aec_env
        self.agent = agent
        self.policies = dict(policies)
        self.max_empty_resets = max_empty_resets
        self.observation_space = aec_env.observation_space(agent)
        self.action_space = aec_env.action_space(agent)
        self.render_mode = getattr(aec_env.unwrapped, "render_mode", None)
        self._episode_seed: int | None = None
        config = getattr(aec_env.unwrapped, "config", None)
        own_matching = getattr(aec_env.unwrapped, "_own_matchmaker", True)  # a custom one: attempts unknown
        if agent.startswith("teacher") and config is not None and own_matching:
            warn_constant_teacher_reward(config, f"SingleRoleEnv({agent!r})")

    def _advance(self) -> tuple[float, bool]:
        """Plays the other agents until the learner's turn; returns (learner reward, episode over)."""
        env = self.aec_env
        reward = 0.0
        while env.agents and env.agent_selection != self.agent:
            other = env.agent_selection
            obs, _, term, trunc, _ = env.last()
            env.step(None if term or trunc else self.policies[other].act(obs, other))
            reward += float(env.rewards.get(self.agent, 0.0))
        done = self.agent not in env.agents or env.terminations[self.agent] or env.truncations[self.agent]
        return reward, bool(done)

    def _obs_info(self) -> tuple[Any, dict[str, Any]]:
        env = self.aec_env
        obs = env.observe(self.agent)
        info = copy.deepcopy(env.infos.get(self.agent, {}))
        return obs, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Starts an episode and plays the others up to the learner's first turn."""
        super().reset(seed=seed)
        if seed is not None:
            for i, name in enumerate(sorted(self.policies)):
                reseed = getattr(self.policies[name], "reseed", None)
                if callable(reseed):
                    reseed(seed + i)
        for attempt in range(self.max_empty_resets):
            episode_seed = seed if attempt == 0 else None
            self.aec_env.reset(seed=episode_seed, options=options)
            _, done = self._advance()
            if not done:
                return self._obs_info()
        raise RuntimeError(f"{self.agent} got no turn in {self.max_empty_resets} episodes")

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Plays the learner's action and the others' replies."""
        env = self.aec_env
        env.step(action)
        reward = float(env.rewards.get(self.agent, 0.0))
        more, done = self._advance()
        obs, info = self._obs_info()
        truncated = bool(env.truncations.get(self.agent))
        return obs, reward + more, done and not truncated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Legal actions for sb3-contrib's MaskablePPO (flattened per-dimension masks for MultiDiscrete)."""
        if isinstance(self.action_space, spaces.Discrete):
            return self.aec_env.observe(self.agent)["action_mask"].astype(bool)
        if isinstance(self.action_space, spaces.MultiDiscrete):
            return np.ones(int(self.action_space.nvec.sum()), dtype=bool)
        raise TypeError("action masks exist in structured mode only")

    def render(self) -> str | None:
        """The underlying env's rendering."""
        return self.aec_env.render()
