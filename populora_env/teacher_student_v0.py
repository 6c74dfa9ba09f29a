"""TeacherStudent-v0: PopuLoRA's asymmetric teacher/student self-play game as a PettingZoo AEC env.

Agents
    ``teacher_0..teacher_{T-1}`` then ``student_0..student_{S-1}`` (``n_teachers``, ``n_students`` >= 1).

A round (AEC order)
    1. Propose: each teacher, ``teacher_group_size`` times in a row, proposes a task of its type for the
       round (``task_types[(round * T + i) % len(task_types)]``) after seeing ``n_references`` buffer tasks.
       The verifier validates it (runs in isolation, checks determinism, computes the gold output); in
       text mode a task is invalid too if what its students are shown, or its gold answer, holds characters
       the prompt cannot show (outside printable ASCII, tab and newline; an induction task's program and
       hidden pairs are not shown), if its prompt would exceed ``max_prompt_chars`` (at least a teacher
       prompt without references in text mode), or if no answer of a student could hold its gold answer
       (``answer_too_long``: over ``parse_answer``'s cap or ``max_action_chars``, even written as the most
       compact ``==`` literal).
    2. Solve: the matchmaker (all-pairs, random, OpenSkill PFSP, or any ``Matchmaker``) assigns students to
       the valid tasks; each student attempts each assigned task ``student_group_size`` times in a row,
       one AEC step each, with an immediate verified reward.
    3. Resolve: teachers are paid from the solve rates; valid tasks join the buffer (deduplicated, capped).
    The episode ends after ``rounds`` rounds (all agents terminate; no truncation).

Task types (Absolute Zero Reasoner, arXiv 2505.03335)
    deduction: program + input -> predict the output. abduction: program + output -> give an input that
    produces it (any such input counts). induction: message + half of the input/output pairs -> write
    ``f``, scored on the other, hidden pairs (text mode; a structured candidate is right when it gives every
    pair, shown and hidden).

Spaces, ``mode="text"`` (LLMs)
    Observation ``Dict(prompt=Text(max_prompt_chars, min_length=0, charset=tab+newline+printable ASCII),
    phase=Discrete(3) [0 idle, 1 propose, 2 solve], task_type=Discrete(3), attempt=Discrete(G))``.
    Action ``Text(max_action_chars, min_length=0, charset=tab+newline+printable ASCII)`` in AZR's format:
    ``<think>..</think><answer>`` with fenced ```python / ```input (/ ```message for induction) blocks for
    teachers, and an ```output, ```input or ```python block for students. ``step`` accepts any string
    (outside the space's charset too: a model's output is not cut to it): malformed is a format error.

Spaces, ``mode="structured"`` (classic RL)
    Teacher action ``MultiDiscrete`` over the DSL in ``populora_env.dsl`` (input type, input, then
    ``n_slots`` (op, arg) pairs); observation ``Dict(phase, task_type, attempt, references=Box)``.
    Student action ``Discrete(n_candidates)``; observation adds ``program`` (the task's DSL vector; zeros
    for induction, input index zeroed for abduction), ``pairs`` (encoded input/output or shown pairs),
    ``candidates`` (encoded answers: the gold one and distractors from perturbed programs, deduplicated,
    each marked right or wrong by execution) and ``action_mask``. An action outside its space raises
    ``ValueError`` (or pays the format penalty when ``illegal_action="penalize"``).

Rewards
    Student: ``student_correct_reward`` 1 / ``student_wrong_reward`` -0.5 / ``student_format_penalty`` -1
    at its step. Teacher, per proposal, paid when the round resolves: invalid -1, malformed -1, valid:
    ``learnability`` (AZR: ``1 - s`` for ``0 < s < 1``, else ``teacher_extreme_reward`` -0.5), or
    ``adversarial`` ``1 - s``, or a callable of the solve rate ``s``.

Info
    A step's info holds round, phase, task_type, attempt, task_id, verdict, status (students also score; no
    gold answer before the round's attempts are all made: a copy of a task, or a task with the same answer,
    may still wait in the round); when a round resolves each
    teacher's info holds ``resolved``: one dict per proposal with
    verdict, status, solve_rate, n_attempts, reward and gold, and each student that attempted tasks that
    round gets ``resolved`` too, next to its last step's info: one dict per task with task_id, task_type,
    teacher, solve_rate (over all students' attempts), n_attempts, gold, own_attempts and own_correct.

Usage
    ``env(**fields)`` (OrderEnforcingWrapper), ``raw_env(**fields)``, ``parallel_env(**fields)``, or
    ``pettingzoo.make("aec", "populora/TeacherStudent-v0", **fields)``; fields are those of
    ``TeacherStudentConfig``, plus ``render_mode`` (``"ansi"``/``"human"``), ``verifier=`` (any object with
    the verifier's methods; default: one shared ``Verifier`` per process) and ``matchmaker=``. AZR's
    single-agent self-play baseline is one policy mapped to both agents of a 1x1 game.

Version history
    v0: initial release.
"""

from __future__ import annotations

import atexit
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers
from pettingzoo.utils.conversions import turn_based_aec_to_parallel_wrapper

from populora_env import dsl
from populora_env.game import _INDEX_TYPES, Game, TeacherStudentConfig, Turn
from populora_env.matchmaking import Matchmaker, make_matchmaker
from populora_env.metrics import EpisodeMetrics
from populora_env.tasks import TASK_TYPES, Task, builtin_seed_specs, load_jsonl_specs, verify_specs
from populora_env.text_format import (
    CHARSET,
    Answer,
    FormatError,
    Proposal,
    parse_answer,
    parse_proposal,
    sanitize,
    student_prompt,
    teacher_prompt,
)

__all__ = ["TeacherStudentConfig", "env", "parallel_env", "raw_env", "shared_verifier"]

PHASES = {"idle": 0, "propose": 1, "solve": 2}
_TASK_TYPE_INDEX = {task_type: i for i, task_type in enumerate(TASK_TYPES)}
# a student's task encoding: program vector, shown pairs, candidate rows, action mask
_TaskArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_SHARED: list[Any] = []


def shared_verifier() -> Any:
    """The process-wide default verifier, created on first use and closed at interpreter exit."""
    if not _SHARED:
        from populora_env.verifier import Verifier, VerifierConfig

        verifier = Verifier(VerifierConfig())
        _SHARED.append(verifier)
        atexit.register(verifier.close)
    return _SHARED[0]


class OrderEnforcingWrapper(wrappers.OrderEnforcingWrapper):
    """PettingZoo's ``OrderEnforcingWrapper`` with a direct path for the two calls of every turn.

    Before ``reset`` (and for ``step`` after the last agent is done) it behaves exactly as PettingZoo's
    wrapper, errors and warnings included; after ``reset``, ``last``, ``step`` and ``agent_selection`` go
    straight to the env instead of resolving each of the attributes they read through two ``__getattr__``
    layers (that forwarding cost as much as the env's own step: bench/env.py).
    """

    @property
    def agent_selection(self) -> str:
        """The wrapped env's ``agent_selection`` (PettingZoo's ``AttributeError`` before ``reset``)."""
        if not self._has_reset:  # an AttributeError here makes Python ask __getattr__: PettingZoo's error
            raise AttributeError("agent_selection")
        return self.env.agent_selection

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """``AECEnv.last`` of the wrapped env (PettingZoo's error before ``reset``)."""
        if not self._has_reset:
            return super().last(observe)
        return self.env.last(observe)

    def step(self, action: Any) -> None:
        """Steps the wrapped env (PettingZoo's error before ``reset``, its warning after the end)."""
        if self._has_reset and self.env.agents:
            self._has_updated = True
            self.env.step(action)
        else:
            super().step(action)

    def __str__(self) -> str:
        return str(self.env)


def env(**kwargs: Any) -> AECEnv:
    """The AEC env wrapped in an ``OrderEnforcingWrapper`` (PettingZoo's); kwargs as ``raw_env``."""
    return OrderEnforcingWrapper(raw_env(**kwargs))


def parallel_env(**kwargs: Any) -> Any:
    """A ``ParallelEnv`` through PettingZoo's turn-based conversion (one agent acts per step: ``step`` takes
    a dict holding the acting agent's action, ``infos[agent]["active_agent"]`` names it)."""
    return _TurnBasedParallel(raw_env(**kwargs))


class _TurnBasedParallel(turn_based_aec_to_parallel_wrapper):
    """PettingZoo's turn-based wrapper, with clear errors where it raised bare ones (a robustness review: a
    ``KeyError`` for a dict without the acting agent, a ``TypeError`` for a string, an ``AttributeError`` for a
    step before ``reset``), and infos that name the acting agent from ``reset`` on. Its ``step`` is written
    here (PettingZoo 1.27's added ``active_agent`` into the AEC env's own info dicts and returned those, so a
    step's infos changed at the next step; and it returned four values, not five, after the episode end)."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        observations, infos = super().reset(seed=seed, options=options)
        infos = {agent: dict(info) for agent, info in infos.items()}
        for agent in self.aec_env.agents:  # (it was missing until the first step; an audit)
            infos[agent]["active_agent"] = self.aec_env.agent_selection
        return observations, infos

    def step(self, actions: Any) -> Any:
        if getattr(self, "agents", None) is None:
            raise RuntimeError("step() before reset(): call reset() first")
        if not isinstance(actions, Mapping):
            raise TypeError(f"actions must be a dict of agent -> action, got a {type(actions).__name__}")
        aec = self.aec_env
        if not aec.agents:
            return {}, {}, {}, {}, {}
        if (acting := aec.agent_selection) not in actions:
            raise ValueError(
                f"actions must hold the acting agent {acting!r} (one agent acts per step; "
                f"infos[agent]['active_agent'] names it), got {sorted(map(repr, actions))[:5]}"
            )
        aec.step(actions[acting])
        rewards, terminations, truncations = dict(aec.rewards), dict(aec.terminations), dict(aec.truncations)
        infos = {agent: dict(info) for agent, info in aec.infos.items()}
        observations = {agent: aec.observe(agent) for agent in aec.agents}
        # the agents done by this step leave now (their None steps change nothing but the acting agent)
        while aec.agents and (aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]):
            aec.step(None)
        for agent in aec.agents:
            infos[agent]["active_agent"] = aec.agent_selection
        self.agents = aec.agents[:]
        return observations, rewards, terminations, truncations, infos


_VERIFIER_METHODS = ("run_many", "check_deduction", "check_abduction", "check_induction")


def _require_methods(name: str, value: Any, methods: tuple[str, ...]) -> None:
    """A ``ValueError`` naming ``name`` unless ``value`` is ``None`` or has every method in ``methods``."""
    missing = [m for m in methods if not callable(getattr(value, m, None))]
    if value is not None and missing:
        raise ValueError(
            f"{name} must be None or an object with the methods {', '.join(methods)}; "
            f"{type(value).__name__} lacks {', '.join(missing)}"
        )


class raw_env(AECEnv):
    """The unwrapped AEC env.

    Args:
        config: a ready ``TeacherStudentConfig`` (other config kwargs are then not allowed).
        render_mode: ``None``, ``"ansi"`` (``render()`` returns text) or ``"human"`` (prints it).
        verifier: any object with the verifier's methods; default: ``shared_verifier()``.
        matchmaker: overrides ``config.matching`` with any ``Matchmaker``.
        **kwargs: fields of ``TeacherStudentConfig``.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi", "human"],
        "name": "TeacherStudent-v0",
        "is_parallelizable": False,
    }

    def __init__(
        self,
        config: TeacherStudentConfig | None = None,
        render_mode: str | None = None,
        verifier: Any = None,
        matchmaker: Matchmaker | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if config is not None and kwargs:
            raise ValueError(f"pass either config or config fields, not both (got {sorted(kwargs)})")
        if unknown := sorted(set(kwargs) - set(config_fields())):
            raise ValueError(f"unknown config field(s) {unknown}; allowed: {', '.join(config_fields())}")
        self.config = config if config is not None else TeacherStudentConfig(**kwargs)
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode
        _require_methods("verifier", verifier, _VERIFIER_METHODS)
        _require_methods("matchmaker", matchmaker, ("assign", "update"))
        self._verifier = verifier
        cfg = self.config
        self._matchmaker = matchmaker or make_matchmaker(cfg.matching, cfg.students_per_task)
        self._own_matchmaker = matchmaker is None  # its learned state follows `persist_buffer`
        self.possible_agents = list(cfg.agents)
        self._game: Game | None = None
        self._rng: np.random.Generator | None = None
        self._log: list[str] = []
        self._held: list[str] = []  # the round's task and answer lines, logged when it resolves
        self._prompt_cache: dict[tuple[Any, ...], str] = {}
        self._candidate_width = max(dsl.program_width(self.config.n_slots), dsl.VALUE_WIDTH)
        # id(task) -> (task, arrays); holding the task keeps its id from being reused while cached
        self._array_cache: dict[int, tuple[Task | None, _TaskArrays]] = {}
        self._reference_cache: dict[int, tuple[Task, np.ndarray]] = {}  # id(task) -> (task, program vector)
        self._build_spaces()

    # ----- spaces -----------------------------------------------------------------------------
    def _build_spaces(self) -> None:
        cfg = self.config
        group = max(cfg.teacher_group_size, cfg.student_group_size)
        common = {
            "phase": spaces.Discrete(3),
            "task_type": spaces.Discrete(3),
            "attempt": spaces.Discrete(group),
        }
        self._obs_spaces: dict[str, spaces.Space] = {}
        self._act_spaces: dict[str, spaces.Space] = {}
        if cfg.mode == "text":
            prompt = spaces.Text(cfg.max_prompt_chars, min_length=0, charset=CHARSET)
            action = spaces.Text(cfg.max_action_chars, min_length=0, charset=CHARSET)
            for agent in self.possible_agents:
                self._obs_spaces[agent] = spaces.Dict({"prompt": prompt, **common})
                self._act_spaces[agent] = action
            return
        width = dsl.program_width(cfg.n_slots)
        cand_width = self._candidate_width
        n_pairs = cfg.induction_max_inputs
        lim = dsl.VALUE_CLIP
        program_nvec = dsl.action_nvec(cfg.n_slots)
        teacher_obs = spaces.Dict(
            {**common, "references": spaces.Box(-lim, lim, (cfg.n_references, width), np.float32)}
        )
        student_obs = spaces.Dict(
            {
                **common,
                "program": spaces.MultiDiscrete(program_nvec),
                "pairs": spaces.Box(-lim, lim, (n_pairs, 2, dsl.VALUE_WIDTH), np.float32),
                "candidates": spaces.Box(-lim, lim, (cfg.n_candidates, cand_width), np.float32),
                "action_mask": spaces.Box(0, 1, (cfg.n_candidates,), np.int8),
            }
        )
        teacher_act = spaces.MultiDiscrete(program_nvec)
        student_act = spaces.Discrete(cfg.n_candidates)
        for agent in self.possible_agents:
            is_teacher = agent.startswith("teacher")
            self._obs_spaces[agent] = teacher_obs if is_teacher else student_obs
            self._act_spaces[agent] = teacher_act if is_teacher else student_act

    def observation_space(self, agent: str) -> spaces.Space:
        """The agent's observation space (the same object on every call)."""
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        """The agent's action space (the same object on every call)."""
        return self._act_spaces[agent]

    # ----- lifecycle --------------------------------------------------------------------------
    @property
    def verifier(self) -> Any:
        """The verifier in use (the shared default is created on first access)."""
        if self._verifier is None:
            self._verifier = shared_verifier()
        return self._verifier

    def _seed_tasks(self) -> list[Task]:
        cfg = self.config
        specs = builtin_seed_specs(cfg.n_seed_tasks, cfg.n_slots)
        if cfg.seed_tasks_path is not None:
            specs = [s for s in specs if s.task_type == "induction"] + load_jsonl_specs(cfg.seed_tasks_path)
        return [t for t in verify_specs(specs, self.verifier) if t.task_type in cfg.task_types]

    @property
    def current_turn(self) -> Turn | None:
        """The pending turn (agent, phase, task type, the task or the references): privileged information
        for scripted reference policies and tools, not part of any agent's observation."""
        return self._game.current if self._game is not None else None

    def pending_observations(self) -> list[tuple[str, dict[str, Any]]]:
        """Every turn left in the current phase, in AEC order, with the observation its agent will see then.

        Within a phase no observation depends on another agent's action, so a batched policy (one LLM
        forward for all of them) can act for the whole phase at once.
        """
        if self._game is None:
            raise RuntimeError("call reset() first")
        if self.config.mode == "text":
            return [(turn.agent, self._text_obs(turn)) for turn in self._game.queue]
        return [(turn.agent, self._structured_obs(turn.agent, turn)) for turn in self._game.queue]

    def episode_metrics(self) -> EpisodeMetrics:
        """Arms-race metrics of the current episode's resolved rounds."""
        if self._game is None:
            raise RuntimeError("call reset() first")
        return self._game.metrics()

    def buffer_state(self) -> dict[str, Any]:
        """The task buffer as plain JSON data (each type's tasks, oldest first): what ``persist_buffer`` carries
        from one episode to the next, for a caller to save with its own checkpoint (``evolve.run_pbt`` does)."""
        return self._the_game().buffer_state()

    def load_buffer_state(self, state: Mapping[str, Any] | None) -> None:
        """Replaces the task buffer with a ``buffer_state()``, kept by the next ``reset`` when
        ``persist_buffer`` is on; ``None``: the next reset starts from the seed tasks.

        Raises:
            ValueError, KeyError, TypeError: ``state`` is no buffer state, or one of another capacity.
        """
        self._the_game().load_buffer_state(state)

    def _the_game(self) -> Game:
        if self._game is None:
            self._game = Game(self.config, self.verifier, self._matchmaker, self._seed_tasks())
        return self._game

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Starts an episode; ``seed`` re-seeds the env's own generator (``options`` is unused)."""
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(seed)
        first = self._game is None
        game = self._the_game()
        if not first and self._own_matchmaker and not self.config.persist_buffer:
            forget = getattr(self._matchmaker, "reset", None)  # PFSP's ratings: episodes are independent
            if forget is not None:
                forget()
        game.reset(self._rng)
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos: dict[str, dict[str, Any]] = {agent: {} for agent in self.agents}
        self._log = [f"== round 0 (buffer: {len(game.buffer)} tasks)"]
        self._held = []
        if self.render_mode == "human":
            print(self._log[0])
        current = game.current
        assert current is not None
        self.agent_selection = current.agent

    def step(self, action: Any) -> None:
        """Plays ``action`` for ``agent_selection`` (``None`` for an agent that is done)."""
        game = self._game
        if game is None:
            raise RuntimeError("call reset() before step()")
        if not self.agents:
            raise RuntimeError("step() after the episode ended (every agent is done): call reset() first")
        agent = self.agent_selection
        if agent not in self.terminations:
            raise RuntimeError(f"agent_selection is {agent!r}, not an agent of this episode {self.agents}")
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        turn = game.current
        if turn is None or turn.agent != agent:  # (not an assert: under python -O another agent was charged)
            expected = turn.agent if turn is not None else "no agent"
            raise RuntimeError(
                f"agent_selection is {agent!r}, but it is {expected}'s turn: agent_selection is the env's to "
                "set (step the agent it names)"
            )
        parsed = self._parse(turn, action)
        outcome = game.step(parsed)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = rewards = dict.fromkeys(self.agents, 0.0)
        for name, reward in outcome.rewards.items():
            rewards[name] += reward
        self.infos.update(outcome.infos)
        new_lines = self._log_step(agent, outcome, turn, parsed) if self.render_mode is not None else []
        if outcome.done:
            self.terminations = dict.fromkeys(self.agents, True)
            self.agent_selection = self.agents[0]
        else:
            nxt = game.current
            assert nxt is not None
            self.agent_selection = nxt.agent
        # PettingZoo's _accumulate_rewards, over the agents paid at this step: adding the others' 0.0 to a
        # cumulative reward (never -0.0: it starts at 0.0) leaves it unchanged
        for name in outcome.rewards:
            self._cumulative_rewards[name] += rewards[name]
        if self.render_mode == "human" and new_lines:
            print("\n".join(new_lines))  # what this step added; render() prints the whole recent log

    def _parse(self, turn: Turn, action: Any) -> Any:
        cfg = self.config
        if cfg.mode == "text":
            if str not in type(action).__mro__:  # (isinstance reads a __class__ an object claims)
                return FormatError("not_a_string")
            # a str subclass is read as its characters: its own __len__ and methods passed the length cap and
            # raised out of step (a text-mode audit)
            action = str.__str__(action)
            if turn.phase == "propose":
                return parse_proposal(
                    action,
                    turn.task_type,
                    max_chars=cfg.max_action_chars,
                    min_inputs=cfg.induction_min_inputs,
                    max_inputs=cfg.induction_max_inputs,
                )
            return parse_answer(action, turn.task_type, max_chars=cfg.max_action_chars)
        try:
            if turn.phase == "propose":
                return dsl.decode(action, cfg.n_slots)
            return self._candidate_index(turn, action)
        except ValueError:
            if cfg.illegal_action == "raise":
                raise
            return FormatError("illegal_action")

    def _candidate_index(self, turn: Turn, action: Any) -> int:
        assert turn.task is not None
        count = len(turn.task.candidates)
        if type(action) is int and 0 <= action < count:
            return action  # the common case, decided without numpy's conversions
        if action is None:
            raise ValueError(f"{turn.agent} has a turn: None is the action of an agent that is done")
        if isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.timedelta64)):
            index = int(action)
        else:
            try:
                arr = np.asarray(action)
            except Exception as error:  # a tensor numpy cannot read (grad, GPU), a ragged list: any error
                raise ValueError(
                    f"a student's structured action must be an integer, got a {type(action).__name__} numpy "
                    f"cannot read ({type(error).__name__}: {str(error)[:120]})"
                ) from None
            if arr.shape != () or arr.dtype.kind not in "iu":  # (np.integer takes timedelta64 too)
                raise ValueError(f"a student's structured action must be an integer, got {action!r:.100}")
            index = int(arr)
        if not 0 <= index < count:
            raise ValueError(
                f"candidate {index} is not available: the action mask allows 0..{count - 1} (give the "
                "observation's action_mask to a masked algorithm, e.g. sb3-contrib's MaskablePPO, or set "
                "illegal_action='penalize' for one that ignores masks)"
            )
        return index

    # ----- observations -----------------------------------------------------------------------
    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """``AECEnv.last``, with a clear error once the episode has ended (PettingZoo's is a ``KeyError``)."""
        if self._game is not None and not self.agents:
            raise RuntimeError("last() after the episode ended (every agent is done): call reset() first")
        return super().last(observe)

    def observe(self, agent: str) -> dict[str, Any]:
        """The agent's view of its next pending turn (an idle view if it has none this round)."""
        game = self._game
        if game is None:
            raise RuntimeError("call reset() before observe()")
        if agent not in self.possible_agents:
            raise KeyError(f"unknown agent {agent!r}; this env's agents are {self.possible_agents}")
        turn = game.next_turn_for(agent) if not self.terminations.get(agent, True) else None
        if self.config.mode == "text":
            return self._text_obs(turn)
        return self._structured_obs(agent, turn)

    def _head(self, turn: Turn | None) -> dict[str, Any]:
        if turn is None:
            return {"phase": 0, "task_type": 0, "attempt": 0}
        return {
            "phase": PHASES[turn.phase],
            "task_type": _TASK_TYPE_INDEX[turn.task_type],
            "attempt": turn.attempt,
        }

    def _text_obs(self, turn: Turn | None) -> dict[str, Any]:
        if turn is None:
            return {"prompt": "", **self._head(None)}
        if turn.task is not None:
            key: tuple[Any, ...] = ("solve", turn.task.task_id, turn.task.message)
        else:
            key = ("propose", turn.task_type, *(r.task_id for r in turn.references))
        prompt = self._prompt_cache.get(key)
        if prompt is None:  # prompts are pure functions of the key: cache them across agents and attempts
            raw = (
                student_prompt(turn.task)
                if turn.task
                else teacher_prompt(turn.task_type, turn.references, self.config.max_prompt_chars)
            )
            prompt = sanitize(raw, self.config.max_prompt_chars)
            if len(self._prompt_cache) >= 512:
                self._prompt_cache.clear()
            self._prompt_cache[key] = prompt
        return {"prompt": prompt, **self._head(turn)}

    def _structured_obs(self, agent: str, turn: Turn | None) -> dict[str, Any]:
        head = self._head(turn)
        if agent.startswith("teacher"):
            cfg = self.config
            refs = np.zeros((cfg.n_references, dsl.program_width(cfg.n_slots)), dtype=np.float32)
            for i, ref in enumerate(turn.references if turn else ()):
                if ref.program_dsl is not None:
                    refs[i] = self._reference_row(ref)
            head["references"] = refs
            return head
        # fresh copies: Gymnasium's checker rejects observations that share mutable objects
        program, pairs, candidates, mask = self._task_arrays(turn.task if turn else None)
        head["program"] = program.copy()
        head["pairs"] = pairs.copy()
        head["candidates"] = candidates.copy()
        head["action_mask"] = mask.copy()
        return head

    def _reference_row(self, task: Task) -> np.ndarray:
        """A reference task's program vector, computed once per task object: buffer tasks are shown again
        and again, and writing a row from an array is far cheaper for numpy than from Python ints."""
        hit = self._reference_cache.get(id(task))
        if hit is not None and hit[0] is task:
            return hit[1]
        if len(self._reference_cache) >= 1024:
            self._reference_cache.clear()
        assert task.program_dsl is not None
        row = task.program_dsl.encode()
        row.flags.writeable = False
        self._reference_cache[id(task)] = (task, row)
        return row

    def _task_arrays(self, task: Task | None) -> _TaskArrays:
        """A student's task encoding (program, pairs, candidates, action mask), computed once per task and
        cached for its attempts; the caller copies them."""
        key = id(task)  # by object: the same program proposed twice (by two teachers) has other candidates
        hit = self._array_cache.get(key)
        if hit is not None and hit[0] is task:
            return hit[1]
        if len(self._array_cache) > 256:
            self._array_cache.clear()
        cfg = self.config
        program = np.zeros(dsl.program_width(cfg.n_slots), dtype=np.int64)
        values = np.zeros((cfg.induction_max_inputs, 2, dsl.VALUE_WIDTH), dtype=np.float32)
        candidates = np.zeros((cfg.n_candidates, self._candidate_width), dtype=np.float32)
        mask = np.zeros(cfg.n_candidates, dtype=np.int8)
        if task is not None:
            task_type = task.task_type
            if task.program_dsl is not None and task_type != "induction":
                program[:] = task.program_dsl.vector()
                if task_type == "abduction":
                    program[1] = 0  # the input index is the abduction answer: hide it
            pairs = task.shown_pairs if task_type == "induction" else ((task.inputs[0], task.outputs[0]),)
            for i, (args, out) in enumerate(pairs[: values.shape[0]]):
                if task_type != "abduction":
                    values[i, 0] = dsl.value_row(args)
                if task_type != "deduction":
                    values[i, 1] = dsl.value_row(out)
            for i, cand in enumerate(task.candidates):
                row = cand.program.vector() if cand.program is not None else dsl.value_row(cand.text)
                candidates[i, : len(row)] = row
            mask[: len(task.candidates)] = 1
        arrays = (program, values, candidates, mask)
        self._array_cache[key] = (task, arrays)
        return arrays

    # ----- rendering --------------------------------------------------------------------------
    def _log_step(self, agent: str, outcome: Any, turn: Turn, parsed: Any) -> list[str]:
        """Appends this step's lines to the render log and returns them."""
        lines: list[str] = []
        info = outcome.infos.get(agent, {})
        game = self._game
        if "verdict" in info:
            reward = f" reward={outcome.rewards.get(agent, 0.0):+.2f}" if info["phase"] == "solve" else ""
            lines.append(
                f"{agent:>11} {info['phase']:<7} {info['task_type']:<9} #{info['attempt']} "
                f"{info['verdict']:<12} {info['status']:<22} task={info['task_id'] or '-'}{reward}"
            )
            task = game.last_proposal_task() if game is not None and info["phase"] == "propose" else None
            details = _describe_action(turn, parsed, task)
            # a valid task (an abduction's gold input, an induction's hidden pairs) and a student's answer are
            # logged when the round resolves: printed at once, they were in front of the students still to
            # play it (a HumanPolicy reads its prompt under the human log; a text-mode audit)
            if details and (info["phase"] == "solve" or info["verdict"] == "valid"):
                self._held += [
                    f"{agent:>11} {info['phase']:<7} #{info['attempt']} task={info['task_id']}",
                    *details,
                ]
            else:
                lines += details
        resolved = {
            a: i["resolved"] for a, i in outcome.infos.items() if "resolved" in i and a.startswith("teacher")
        }
        if resolved or (game is not None and game.done):
            lines += self._held
            self._held = []
        for teacher, records in resolved.items():
            for r in records:
                rate = "-" if r["solve_rate"] is None else f"{r['solve_rate']:.2f}"
                lines.append(
                    f"{teacher:>11} resolve {r['task_type']:<9} #{r['attempt']} {r['verdict']:<12} "
                    f"solve_rate={rate} reward={r['reward']:+.2f}"
                )
        if resolved and game is not None and not game.done:
            lines.append(f"== round {game.round} (buffer: {len(game.buffer)} tasks)")
            self._log = self._log[-200:]
        self._log += lines
        return lines

    def render(self) -> str | None:
        """The game log's last 120 lines (the rounds so far) as text (``ansi``), or printed (``human``). A
        step's verdict is logged as it is made; the round's valid tasks and the students' answers when the
        round resolves (before, they would show gold answers to the students still to play)."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'")
            return None
        text = "\n".join(self._log[-120:])
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        """Releases nothing of its own: the verifier is shared or owned by the caller."""


_SHOWN_LINES = 8
_SHOWN_CHARS = 100


def _shown(text: str, label: str) -> list[str]:
    """``text`` as render lines under ``label``: at most ``_SHOWN_LINES`` lines of ``_SHOWN_CHARS``
    printable characters each, the rest elided with a count."""
    lines = sanitize(text, 4 * _SHOWN_LINES * _SHOWN_CHARS).splitlines() or [""]
    out = [f"{' ' * 13}{label}{_clip(lines[0])}"]
    out += [f"{' ' * 13}{' ' * len(label)}{_clip(line)}" for line in lines[1:_SHOWN_LINES]]
    if len(lines) > _SHOWN_LINES:
        out.append(f"{' ' * 13}{' ' * len(label)}... ({len(lines) - _SHOWN_LINES} more lines)")
    return out


def _clip(line: str) -> str:
    return line if len(line) <= _SHOWN_CHARS else line[: _SHOWN_CHARS - 3] + "..."


def _describe_action(turn: Turn, parsed: Any, task: Task | None) -> list[str]:
    """What a step proposed or answered, for the ansi log: the program and inputs of a proposal (``task``, the
    verified one, if valid), the text of an answer (the chosen candidate's in structured mode); nothing for a
    format error (its status says why)."""
    if isinstance(parsed, (dsl.DslProgram, Proposal)):
        if task is not None:
            program, inputs, message = task.program, task.inputs, task.message
        elif isinstance(parsed, Proposal):
            program, inputs, message = parsed.program, parsed.inputs, parsed.message
        else:  # an invalid DSL program: its source and, outside induction, its input
            program, args = dsl.render(parsed)
            inputs, message = ((args,) if turn.task_type != "induction" else ()), ""
        lines = _shown(program, "program: ")
        if inputs:
            lines += _shown(" | ".join(inputs), "inputs:  " if len(inputs) > 1 else "input:   ")
        return lines + (_shown(message, "message: ") if message else [])
    if isinstance(parsed, Answer):
        return _shown(parsed.text, "answer:  ")
    if isinstance(parsed, _INDEX_TYPES) and not isinstance(parsed, bool) and turn.task is not None:
        candidates = turn.task.candidates
        if 0 <= int(parsed) < len(candidates):
            return _shown(candidates[int(parsed)].text, f"answer:  [{int(parsed)}] ")
    return []


def config_fields() -> tuple[str, ...]:
    """Names of the config fields ``env(**kwargs)`` accepts."""
    return tuple(f.name for f in dataclasses.fields(TeacherStudentConfig))
