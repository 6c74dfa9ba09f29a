"""Rollouts of a whole LoRA population in ``TeacherStudent-v0`` with one batched generation per phase.

Within a phase of the game (all proposals of a round, then all solve attempts) no observation depends on
another agent's action, so every turn of the phase is known when the phase starts. The collector generates
the answers of every adapter-played turn of the phase in one mixed-adapter batch, then steps the AEC env
turn by turn in its own order; the trajectory is the one agent-by-agent stepping produces with the same
texts. Outside policies (scripted teachers, humans) act at their own step, so privileged reference
policies that read ``env.unwrapped.current_turn`` keep working.

GRPO groups come from the env's ``info``: the ``G`` attempts of one agent on one observation (a teacher's
proposals of a round; a student's attempts at one task id in a round) form one group. A teacher's reward
arrives when its round resolves (``info["resolved"]``, one entry per proposal with its attempt index) and
is attached to the proposal it pays for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from agents._checks import is_int, is_number, plain_number
from agents.policy import GeneratingPopulation, generate_with_ids, model_input
from populora_env.credit import ProposalLedger

__all__ = [
    "EpisodeRollout",
    "GRPOBatch",
    "RolloutCollector",
    "RolloutConfig",
    "StepRecord",
    "grpo_batches",
    "phase_observations",
    "update_adapters",
]

Role = Literal["teacher", "student"]


class Learner(Protocol):
    """Anything with ``GRPOLearner.update``'s signature."""

    def update(
        self,
        adapter: str,
        prompts: Sequence[str],
        completions: Sequence[str],
        rewards: Sequence[float],
        group_ids: Sequence[Hashable],
        task_keys: Sequence[Hashable] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> Any: ...


@dataclass(frozen=True)
class RolloutConfig:
    """How the collector generates (one config for every adapter of the population)."""

    max_new_tokens: int = 64
    """Generation budget per action; give the learner the same value (``GRPOConfig.max_new_tokens``)."""
    temperature: float = 1.0
    """0 for greedy decoding, > 0 to sample (``GRPOConfig.temperature`` should match)."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    seed: int = 0
    """Base seed of generation; each phase's batch gets its own seed drawn from (seed, episode seed)."""
    prefill: bool = False
    """Start every answer with the env's answer scaffold (``agents.policy.answer_prefill``); the scaffold is
    part of the action the env parses and of the prompt the learner sees, not of the trained completion."""

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "temperature", "top_p", "seed"):  # (numpy's numbers as Python's)
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        # (True passed as 1, to be refused by generate once an episode had begun: a robustness review)
        if not (is_int(self.max_new_tokens) and self.max_new_tokens >= 1):
            raise ValueError(f"RolloutConfig.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not (is_number(self.temperature) and self.temperature >= 0):
            raise ValueError(f"RolloutConfig.temperature must be finite and >= 0, got {self.temperature!r}")
        if not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"RolloutConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if not (is_int(self.seed) and self.seed >= 0):
            raise ValueError(f"RolloutConfig.seed must be an int >= 0, got {self.seed!r}")


@dataclass(frozen=True)
class StepRecord:
    """One AEC step of a live agent.

    Attributes:
        index: step number within the episode (0-based).
        agent: the acting agent.
        adapter: the adapter that generated the action, or ``None`` for an outside policy.
        role: ``teacher`` or ``student``.
        round: round index.
        phase: ``propose`` or ``solve``.
        task_type: the type proposed or solved.
        attempt: index within the agent's group on this observation.
        task_id: the solved task (students) or the proposed task ("" if malformed or invalid).
        prompt: the model's input (the observation's prompt plus any prefill).
        completion: the generated text (the action without the prefill; the whole action for outside policies).
        action: what was stepped.
        reward: the student's verified reward, or the teacher's reward for this proposal at resolution.
        verdict: the env's verdict (``correct``/``wrong``/``format_error``, ``valid``/``invalid``/...).
        status: the env's status (verifier status or format-error reason).
        info: the step's info from the env (without a teacher's ``resolved`` list).
        completion_ids: the sampled token ids of an adapter's completion (``None`` for outside policies or
            a population that cannot return them).
    """

    index: int
    agent: str
    adapter: str | None
    role: Role
    round: int
    phase: Literal["propose", "solve"]
    task_type: str
    attempt: int
    task_id: str
    prompt: str
    completion: str
    action: str
    reward: float
    verdict: str
    status: str
    info: Mapping[str, Any] = field(repr=False, compare=False)
    completion_ids: tuple[int, ...] | None = field(default=None, repr=False)

    @property
    def group_key(self) -> tuple[str, int, str, str]:
        """Same key, same observation: ``(agent, round, phase, the prompt for a solve / "" for a proposal)``.

        A solve is keyed by its prompt, not its task id: an induction task's id leaves out the teacher's
        message, which the student sees, so two proposals of one program and inputs with different
        messages are two observations (they were one GRPO group, normalised together)."""
        return (self.agent, self.round, self.phase, self.prompt if self.phase == "solve" else "")

    @property
    def task_key(self) -> tuple[Role, str]:
        """``(role, task type)``: the key of AZR's task-relative normalisation (TRR++)."""
        return (self.role, self.task_type)


@dataclass(frozen=True)
class EpisodeRollout:
    """One collected episode.

    Attributes:
        seed: the seed the env was reset with.
        steps: every live agent's step, in AEC order.
        returns: total reward per agent (as ``populora_env.play`` sums it).
        metrics: the env's arms-race metrics, if it has them.
    """

    seed: int | None
    steps: tuple[StepRecord, ...]
    returns: Mapping[str, float]
    metrics: Any = field(default=None, repr=False)


@dataclass(frozen=True)
class GRPOBatch:
    """The adapter-played steps of one adapter, ready for ``GRPOLearner.update(adapter, **batch.fields())``.

    Attributes:
        adapter: the adapter's name.
        prompts: model inputs.
        completions: generated texts.
        rewards: env rewards.
        group_ids: ``(episode position, agent, round, phase, task id)``: completions on one observation.
        task_keys: ``(role, task type)`` per completion.
        completion_ids: the sampled token ids of every completion, or ``None`` when any is unknown (the
            learner then re-tokenises the texts).
    """

    adapter: str
    prompts: tuple[str, ...]
    completions: tuple[str, ...]
    rewards: tuple[float, ...]
    group_ids: tuple[Hashable, ...]
    task_keys: tuple[tuple[Role, str], ...]
    completion_ids: tuple[tuple[int, ...], ...] | None = None

    def fields(self) -> dict[str, Any]:
        """Keyword arguments of ``GRPOLearner.update`` (all but ``adapter``)."""
        return {
            "prompts": list(self.prompts),
            "completions": list(self.completions),
            "rewards": list(self.rewards),
            "group_ids": list(self.group_ids),
            "task_keys": list(self.task_keys),
            "completion_ids": None if self.completion_ids is None else [list(i) for i in self.completion_ids],
        }

    @property
    def mean_reward(self) -> float:
        """Mean reward of the batch."""
        return sum(self.rewards) / len(self.rewards)


def phase_observations(env: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every turn left in the current phase, in AEC order, with the observation its agent will see."""
    return list(env.unwrapped.pending_observations())


class RolloutCollector:
    """Plays episodes of a text-mode ``TeacherStudent-v0`` env for a LoRA population.

    Args:
        population: generates for a batch of (prompt, adapter) rows.
        adapters: agent -> adapter name; several agents may share one adapter (AZR's single-agent
            self-play maps ``teacher_0`` and ``student_0`` to one).
        config: generation settings.
        policies: ``populora_env.Policy`` for agents without an adapter (asked at their own step).
    """

    def __init__(
        self,
        population: GeneratingPopulation,
        adapters: Mapping[str, str],
        config: RolloutConfig | None = None,
        policies: Mapping[str, Any] | None = None,
    ) -> None:
        self.population = population
        self.adapters = dict(adapters)
        self.config = config or RolloutConfig()
        self.policies = dict(policies or {})
        self._unseeded = 0  # episodes reset without a seed: each still gets its own generation seeds
        if both := sorted(set(self.adapters) & set(self.policies)):
            raise ValueError(f"agents {both} have both an adapter and a policy; give each agent one")
        names = getattr(population, "adapter_names", None)
        if names is not None and (unknown := sorted(set(self.adapters.values()) - set(names))):
            raise KeyError(f"unknown adapter(s) {unknown}; the population has {list(names)}")

    def collect(self, env: Any, episodes: int = 1, seed: int | None = None) -> list[EpisodeRollout]:
        """Plays ``episodes`` episodes; episode ``i`` resets the env with ``seed + i`` (as ``play`` does).

        Raises:
            ValueError: ``episodes`` is not an int >= 0 (-3 gave an empty list).
        """
        episodes = plain_number(episodes)
        if not (is_int(episodes) and episodes >= 0):
            raise ValueError(f"episodes must be an int >= 0, got {episodes!r}")
        return [self.episode(env, None if seed is None else seed + i) for i in range(episodes)]

    def episode(self, env: Any, seed: int | None = None) -> EpisodeRollout:
        """Plays one episode from ``env.reset(seed=seed)`` and records every step."""
        raw = env.unwrapped
        if getattr(raw.config, "mode", "text") != "text":
            raise ValueError("the rollout collector drives text-mode envs (create the env with mode='text')")
        if missing := sorted(set(env.possible_agents) - set(self.adapters) - set(self.policies)):
            raise ValueError(f"every agent needs an adapter or a policy; missing {missing}")
        env.reset(seed=seed)
        if seed is None:
            self._unseeded += 1
        stream = [self.config.seed, 1, seed] if seed is not None else [self.config.seed, 0, self._unseeded]
        generation_seeds = np.random.default_rng(stream)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        steps: list[StepRecord] = []
        ledger: ProposalLedger[int] = ProposalLedger()  # a proposal's index in steps, paid at resolution
        while env.agents and not all(env.terminations.values()):
            turns = phase_observations(env)
            if not turns:
                raise RuntimeError("the env has live agents but no pending turn")
            texts = self._generate_phase(turns, int(generation_seeds.integers(2**31 - 1)))
            for i, (agent, planned) in enumerate(turns):
                if env.agent_selection != agent:
                    raise RuntimeError(f"the env selected {env.agent_selection}, the phase plan {agent}")
                observation = env.observe(agent)
                if observation != planned:
                    raise RuntimeError(f"{agent}'s observation changed within its phase")
                prompt, completion, action, ids = texts.get(i) or self._outside(agent, observation)
                env.step(action)
                for name, reward in env.rewards.items():
                    returns[name] += float(reward)
                steps.append(self._record(env, len(steps), agent, prompt, completion, action, ids))
                if steps[-1].role == "teacher":
                    ledger.record(env, agent, len(steps) - 1)
                for index, reward in ledger.settle(env):  # each proposal its own reward
                    steps[index] = replace(steps[index], reward=reward)
        for _agent in env.agent_iter():  # finish the AEC protocol: dead agents step None
            env.step(None)
        if unpaid := ledger.unsettled():
            raise RuntimeError(f"proposals never resolved: {unpaid}")
        metrics_fn = getattr(raw, "episode_metrics", None)
        return EpisodeRollout(seed, tuple(steps), returns, metrics_fn() if metrics_fn else None)

    # ----- helpers ----------------------------------------------------------------------------------
    def _generate_phase(
        self, turns: list[tuple[str, dict[str, Any]]], seed: int
    ) -> dict[int, tuple[str, str, str, tuple[int, ...] | None]]:
        """One mixed-adapter generation for every adapter-played turn:
        index -> (prompt, completion, action, sampled token ids or ``None``)."""
        cfg = self.config
        rows = [i for i, (agent, _) in enumerate(turns) if agent in self.adapters]
        if not rows:
            return {}
        inputs = [model_input(turns[i][1], cfg.prefill) for i in rows]
        texts, ids = generate_with_ids(
            self.population,
            [prompt for prompt, _ in inputs],
            adapters=[self.adapters[turns[i][0]] for i in rows],
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed=seed,
            top_p=cfg.top_p,
        )
        row_ids = [tuple(r) for r in ids] if ids is not None else [None] * len(rows)
        return {
            i: (prompt, text, prefix + text, r)
            for i, (prompt, prefix), text, r in zip(rows, inputs, texts, row_ids, strict=True)
        }

    def _outside(self, agent: str, observation: dict[str, Any]) -> tuple[str, str, str, None]:
        action = self.policies[agent].act(observation, agent)
        text = action if isinstance(action, str) else repr(action)
        return str(observation.get("prompt", "")), text, action, None

    def _record(
        self,
        env: Any,
        index: int,
        agent: str,
        prompt: str,
        completion: str,
        action: str,
        completion_ids: tuple[int, ...] | None,
    ) -> StepRecord:
        info = {k: v for k, v in env.infos[agent].items() if k != "resolved"}
        role: Role = "teacher" if agent.startswith("teacher") else "student"
        reward = float(env.rewards[agent]) if role == "student" else math.nan  # teachers: at resolution
        return StepRecord(
            index=index,
            agent=agent,
            adapter=self.adapters.get(agent),
            role=role,
            round=int(info["round"]),
            phase=info["phase"],
            task_type=str(info["task_type"]),
            attempt=int(info["attempt"]),
            task_id=str(info.get("task_id", "")),
            prompt=prompt,
            completion=completion,
            action=action,
            reward=reward,
            verdict=str(info.get("verdict", "")),
            status=str(info.get("status", "")),
            info=info,
            completion_ids=completion_ids,
        )


def grpo_batches(rollouts: Sequence[EpisodeRollout]) -> dict[str, GRPOBatch]:
    """Groups the adapter-played steps of several episodes into one ``GRPOBatch`` per adapter.

    A group is one agent's attempts at one observation in one episode (``StepRecord.group_key``); agents
    sharing an adapter contribute to its batch with their own groups.
    """
    columns: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for position, rollout in enumerate(rollouts):
        for step in rollout.steps:
            if step.adapter is None:
                continue
            if math.isnan(step.reward):
                raise ValueError(f"step {step.index} of episode {position} has no reward yet")
            column = columns[step.adapter]
            column["prompts"].append(step.prompt)
            column["completions"].append(step.completion)
            column["rewards"].append(step.reward)
            column["group_ids"].append((position, *step.group_key))
            column["task_keys"].append(step.task_key)
            column["completion_ids"].append(step.completion_ids)
    return {
        adapter: GRPOBatch(
            adapter,
            prompts=tuple(c["prompts"]),
            completions=tuple(c["completions"]),
            rewards=tuple(c["rewards"]),
            group_ids=tuple(c["group_ids"]),
            task_keys=tuple(c["task_keys"]),
            completion_ids=None if None in c["completion_ids"] else tuple(c["completion_ids"]),
        )
        for adapter, c in columns.items()
    }


def update_adapters(learner: Learner, batches: Mapping[str, GRPOBatch]) -> dict[str, Any]:
    """One ``learner.update`` per adapter batch; returns each adapter's update statistics."""
    return {adapter: learner.update(adapter, **batch.fields()) for adapter, batch in batches.items()}
