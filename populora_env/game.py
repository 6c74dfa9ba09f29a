"""Pure rules of the teacher/student game (no PettingZoo, Gymnasium or torch): config, turns, rewards.

A round: every teacher proposes (``teacher_group_size`` times), the verifier validates each proposal, the
matchmaker assigns students to the valid tasks, every matched student attempts each of its tasks
(``student_group_size`` times, one verified step each), then the round resolves: teachers are paid from
the solve rates and valid tasks join the buffer. The AEC env in ``teacher_student_v0`` adapts this class.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from populora_env import dsl
from populora_env.candidates import make_candidates
from populora_env.matchmaking import Matchmaker
from populora_env.metrics import EpisodeMetrics, summarize_episode
from populora_env.tasks import TASK_TYPES, Task, TaskBuffer, TaskType, normal_form, run_all, task_id_for
from populora_env.text_format import Answer, FormatError, Proposal, teacher_prompt, unshowable

__all__ = ["Game", "ResolvedProposal", "StepOutcome", "TeacherStudentConfig", "Turn", "teacher_reward"]

_INDEX_TYPES = (int, np.integer)  # a structured student's candidate index
Phase = Literal["propose", "solve"]
TeacherVerdict = Literal["valid", "invalid", "format_error"]

logger = logging.getLogger(__name__)


class Turn(NamedTuple):
    """One pending AEC step (an immutable record; a named tuple because the game makes one per step and a
    frozen dataclass costs several times as much to build).

    Attributes:
        agent: who acts.
        phase: ``propose`` (teacher) or ``solve`` (student).
        task_type: the type being proposed or solved.
        attempt: index within the agent's GRPO group for this observation.
        round: round index.
        references: buffer tasks shown to a proposing teacher.
        task: the task a student solves.
        proposal: for a solve turn, the index of the task's proposal in its round (attempts are counted
            per proposal: two teachers proposing the same program are matched and paid separately).
    """

    agent: str
    phase: Phase
    task_type: TaskType
    attempt: int
    round: int
    references: tuple[Task, ...] = ()
    task: Task | None = None
    proposal: int = -1


@dataclass(frozen=True)
class ResolvedProposal:
    """The fate of one teacher proposal, reported to the teacher when its round resolves.

    Attributes:
        teacher: proposing agent.
        round: round index.
        attempt: index within the teacher's group.
        task_type: proposed type.
        task_id: the task's id ("" for a format error).
        verdict: ``valid``, ``invalid`` or ``format_error``.
        status: the verifier status or the format error reason.
        solve_rate: fraction of correct student attempts (``None`` if invalid or unmatched).
        n_attempts: student attempts on this task.
        reward: the teacher's reward for this proposal.
        gold: the task's reference answer ("" unless valid).
        task: the verified task, if valid.
    """

    teacher: str
    round: int
    attempt: int
    task_type: TaskType
    task_id: str
    verdict: TeacherVerdict
    status: str
    solve_rate: float | None
    n_attempts: int
    reward: float
    gold: str
    task: Task | None = field(default=None, repr=False)


class StepOutcome(NamedTuple):
    """What one game step changed (an immutable record, made once per step: a named tuple, like ``Turn``).

    Attributes:
        rewards: reward per agent produced by this step.
        infos: fresh info dicts for the agents whose info changed.
        done: the episode is over.
    """

    rewards: dict[str, float]
    infos: dict[str, dict[str, Any]]
    done: bool


RewardScheme = Literal["learnability", "adversarial"] | Callable[[float], float]
_MODES = ("text", "structured")
_MATCHING = ("all_pairs", "random", "pfsp")
_SCHEMES = ("learnability", "adversarial")
# every int field of the config and the least value it accepts
_INT_MINIMUMS = {
    "n_teachers": 1, "n_students": 1, "rounds": 1, "n_references": 0, "teacher_group_size": 1,
    "student_group_size": 1, "students_per_task": 1, "n_seed_tasks": 0, "buffer_capacity": 1,
    "induction_min_inputs": 2, "induction_max_inputs": 2, "max_action_chars": 256, "max_prompt_chars": 256,
    "n_slots": 1, "n_candidates": 2,
}  # fmt: skip
# text caps: the action and observation spaces' lengths (10**20 made a text space's sample fail in numpy's int64:
# a robustness review)
_INT_MAXIMUMS = {"max_action_chars": 10**9, "max_prompt_chars": 10**9}
_REWARD_FIELDS = ("teacher_extreme_reward", "teacher_invalid_penalty", "teacher_format_penalty",
                  "student_correct_reward", "student_wrong_reward", "student_format_penalty")  # fmt: skip


@dataclass(frozen=True)
class TeacherStudentConfig:
    """Configuration of ``TeacherStudent-v0`` (validated on construction)."""

    n_teachers: int = 2
    """Number of teacher agents (>= 1)."""
    n_students: int = 2
    """Number of student agents (>= 1)."""
    task_types: tuple[TaskType, ...] = TASK_TYPES
    """Task types in play; teacher ``i`` proposes type ``task_types[(round * n_teachers + i) % len]``."""
    rounds: int = 2
    """Rounds per episode."""
    mode: Literal["text", "structured"] = "text"
    """``text`` (string actions, AZR format) or ``structured`` (MultiDiscrete DSL / candidate choice)."""
    n_references: int = 3
    """Reference tasks from the buffer shown to a proposing teacher."""
    teacher_group_size: int = 1
    """Proposals per teacher per round on the same observation (a GRPO group)."""
    student_group_size: int = 1
    """Attempts per student per assigned task on the same observation (a GRPO group)."""
    matching: Literal["all_pairs", "random", "pfsp"] = "all_pairs"
    """Matchmaker when none is passed to the env: all-pairs, uniform random, or OpenSkill-rated PFSP."""
    students_per_task: int = 1
    """Students per task for ``random`` and ``pfsp`` matching."""
    reward_scheme: RewardScheme = "learnability"
    """Teacher reward of a valid task from its solve rate: ``learnability``, ``adversarial`` or a callable
    (a pure function of the rate: it is also called on every rate a round can produce when the config is
    built, to refuse one that raises or returns a non-finite value up front)."""
    teacher_extreme_reward: float = -0.5
    """``learnability`` reward of a valid task solved by nobody or by everybody (AZR uses 0)."""
    teacher_invalid_penalty: float = -1.0
    """Reward of a well-formed proposal the verifier rejects."""
    teacher_format_penalty: float = -1.0
    """Reward of a malformed proposal."""
    student_correct_reward: float = 1.0
    """Reward of a correct attempt."""
    student_wrong_reward: float = -0.5
    """Reward of a well-formed wrong attempt."""
    student_format_penalty: float = -1.0
    """Reward of a malformed attempt (text) or an illegal candidate when ``illegal_action="penalize"``."""
    seed_tasks_path: str | os.PathLike[str] | None = None
    """A JSONL file of ``{"code", "input", "output"}`` records seeding deduction/abduction (text mode)."""
    n_seed_tasks: int = 16
    """Built-in generated seed tasks per type (also used for types the JSONL file does not cover)."""
    buffer_capacity: int = 256
    """Maximum tasks per type in the buffer."""
    persist_buffer: bool = False
    """Keep the buffer (and the ratings of the env's own ``"pfsp"`` matchmaker) across ``reset()``: an arms
    race over many episodes; off makes episodes independent (the same seed plays the same episode)."""
    induction_min_inputs: int = 2
    """Fewest distinct inputs of a text induction proposal (at least 2: half are shown, the rest test the
    student's program)."""
    induction_max_inputs: int = 6
    """Most inputs of a text induction proposal; structured induction tasks use exactly this many (at most
    ``dsl.N_INPUTS``, the inputs of one type)."""
    max_action_chars: int = 8192
    """Text actions longer than this are format errors; also the Text action space's max length."""
    max_prompt_chars: int = 8192
    """The Text observation space's max length: teacher prompts leave out references to fit, a task whose
    student prompt is longer is invalid (``prompt_too_long``); in text mode at least a teacher prompt
    without references."""
    n_slots: int = 6
    """Structured mode: op slots of a DSL program."""
    n_candidates: int = 4
    """Structured mode: answer candidates a student chooses among."""
    illegal_action: Literal["raise", "penalize"] = "raise"
    """Structured actions outside the space or masked: raise ``ValueError`` or pay the format penalty."""

    def __post_init__(self) -> None:
        # numpy's ints and floats count (a value read from an array); numpy's bool is neither Integral nor Real
        for name, least in _INT_MINIMUMS.items():
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
            if name in _INT_MAXIMUMS and int(value) > _INT_MAXIMUMS[name]:
                raise ValueError(f"{name} must be at most {_INT_MAXIMUMS[name]}, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in _REWARD_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite real number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not isinstance(self.persist_buffer, bool):
            raise ValueError(f"persist_buffer must be True or False, got {self.persist_buffer!r}")
        if self.seed_tasks_path is not None:
            if not isinstance(self.seed_tasks_path, (str, os.PathLike)):
                raise ValueError(
                    f"seed_tasks_path must be None or a path (str or os.PathLike), got {self.seed_tasks_path!r}"
                )
            object.__setattr__(self, "seed_tasks_path", os.fspath(self.seed_tasks_path))
        raw = self.task_types
        types = (raw,) if isinstance(raw, str) else tuple(raw) if isinstance(raw, (tuple, list)) else ()
        if not types or any(t not in TASK_TYPES for t in types) or len(set(types)) != len(types):
            raise ValueError(
                f"task_types must be a non-empty subset of {TASK_TYPES}, got {self.task_types!r}"
            )
        object.__setattr__(self, "task_types", types)
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.matching not in _MATCHING:
            raise ValueError(f"matching must be one of {_MATCHING}, got {self.matching!r}")
        if not callable(self.reward_scheme) and self.reward_scheme not in _SCHEMES:
            raise ValueError(
                f"reward_scheme must be one of {_SCHEMES} or a callable, got {self.reward_scheme!r}"
            )
        if self.illegal_action not in ("raise", "penalize"):
            raise ValueError(f"illegal_action must be 'raise' or 'penalize', got {self.illegal_action!r}")
        if self.induction_min_inputs > self.induction_max_inputs:
            raise ValueError(
                "induction_min_inputs must be <= induction_max_inputs, "
                f"got {self.induction_min_inputs} > {self.induction_max_inputs}"
            )
        if self.mode == "text":  # a prompt over the cap is cut, and the answer format goes first
            needed = max(len(teacher_prompt(t, ())) for t in self.task_types)
            if self.max_prompt_chars < needed:
                raise ValueError(
                    f"max_prompt_chars must be >= {needed} in text mode (a teacher prompt without references "
                    f"for these task types, answer format included), got {self.max_prompt_chars}"
                )
        if self.mode == "structured" and self.induction_max_inputs > dsl.N_INPUTS:
            raise ValueError(  # the inputs are consecutive table entries: more would repeat shown ones
                f"induction_max_inputs must be <= {dsl.N_INPUTS} in structured mode (its table of inputs per "
                f"type), got {self.induction_max_inputs}"
            )
        if self.mode == "structured" and self.seed_tasks_path is not None:
            raise ValueError(
                "seed_tasks_path is only allowed with mode='text' (structured mode needs DSL tasks)"
            )
        if self.seed_tasks_path is not None and not os.path.isfile(self.seed_tasks_path):
            raise ValueError(f"seed_tasks_path: no such file {self.seed_tasks_path!r}")
        if callable(self.reward_scheme):
            # every solve rate a round can produce (up to 48 attempts per task: ~700 rates), tried now: a
            # scheme that raises or pays NaN would otherwise fail (or poison the returns) in the middle of
            # resolving a round; rates of larger groups are checked when they occur
            most = min(self.n_students * self.student_group_size, 48)
            for rate in sorted(
                {correct / attempts for attempts in range(1, most + 1) for correct in range(attempts + 1)}
            ):
                _scheme_value(self.reward_scheme, rate)

    @property
    def agents(self) -> tuple[str, ...]:
        """All agent names: teachers first, then students."""
        return tuple(f"teacher_{i}" for i in range(self.n_teachers)) + tuple(
            f"student_{i}" for i in range(self.n_students)
        )


def teacher_reward(solve_rate: float | None, config: TeacherStudentConfig) -> float:
    """A valid proposal's reward from its solve rate under the configured scheme.

    ``learnability`` is AZR's proposer reward (arXiv 2505.03335, eq. 4): ``1 - s`` if ``0 < s < 1``;
    for ``s`` in {0, 1} this env pays ``teacher_extreme_reward`` (default -0.5; AZR's value is 0).
    ``adversarial`` pays ``1 - s``. A callable scheme gets ``s`` and returns the reward. An unmatched task
    (no attempts) earns 0.
    """
    if solve_rate is None:
        return 0.0
    scheme = config.reward_scheme
    if callable(scheme):
        return _scheme_value(scheme, solve_rate)
    if scheme == "adversarial":
        return 1.0 - solve_rate
    if 0.0 < solve_rate < 1.0:
        return 1.0 - solve_rate
    return config.teacher_extreme_reward


def attempts_per_task(config: TeacherStudentConfig, matching: str | None = None) -> int:
    """Attempts a valid task gets in a round: its students (every student under ``all_pairs``, else
    ``students_per_task`` of them, at most all) times ``student_group_size``.

    Args:
        matching: The matching scheme in use, when it is not ``config.matching`` (``run_pbt`` matches by
            PFSP or all-pairs, as its own ``pfsp`` says).
    """
    scheme = config.matching if matching is None else matching
    students = (
        config.n_students if scheme == "all_pairs" else min(config.students_per_task, config.n_students)
    )
    return students * config.student_group_size


def constant_teacher_reward(config: TeacherStudentConfig, matching: str | None = None) -> str | None:
    """Why a valid proposal's reward cannot vary under ``config`` (None when it can).

    With the ``learnability`` scheme and one attempt per task (``attempts_per_task``), the solve rate is 0
    or 1, both paid ``teacher_extreme_reward``: every valid proposal earns the same and a learning teacher
    gets no signal (AZR estimates the rate from several solver rollouts). ``PBTConfig`` with evolving
    teachers and a teacher's ``SingleRoleEnv`` log it (``warn_constant_teacher_reward``).

    Args:
        matching: As for ``attempts_per_task``.
    """
    if config.reward_scheme != "learnability" or attempts_per_task(config, matching) > 1:
        return None
    return (
        "one attempt per task (students matched to a task times student_group_size is 1) under the "
        f"learnability reward: the solve rate is 0 or 1, both paid teacher_extreme_reward "
        f"({config.teacher_extreme_reward:g}), so every valid proposal earns the same and teachers get no "
        "signal; raise student_group_size (e.g. 4)"
    )


def warn_constant_teacher_reward(
    config: TeacherStudentConfig, where: str, matching: str | None = None
) -> None:
    """Logs ``constant_teacher_reward(config, matching)``, if any, once a process for each ``where`` (who
    asks)."""
    problem = constant_teacher_reward(config, matching)
    message = f"{where}: {problem}"
    if problem and message not in _WARNED:
        _WARNED.add(message)
        logger.warning("%s", message)


_WARNED: set[str] = set()  # warnings given in this process


def _scheme_value(scheme: Callable[[float], float], solve_rate: float) -> float:
    """A callable ``reward_scheme``'s reward for ``solve_rate``, as a finite float, or a ValueError saying so."""
    try:
        value = scheme(solve_rate)
        reward = float(value)
    except Exception as error:
        raise ValueError(
            f"reward_scheme({solve_rate!r}) failed: {type(error).__name__}: {error}"[:300]
        ) from None
    if isinstance(value, bool) or not math.isfinite(reward):
        raise ValueError(f"reward_scheme({solve_rate!r}) must return a finite number, got {value!r:.80}")
    return reward


class Game:
    """The game state machine.

    Args:
        config: validated game config.
        verifier: anything with the verifier's ``run``/``run_many``/``check_*`` methods.
        matchmaker: assigns students to tasks.
        seed_tasks: verified tasks that fill a fresh buffer.
    """

    def __init__(
        self,
        config: TeacherStudentConfig,
        verifier: Any,
        matchmaker: Matchmaker,
        seed_tasks: Sequence[Task],
    ) -> None:
        self.config = config
        self.verifier = verifier
        self.matchmaker = matchmaker
        self.seed_tasks = tuple(seed_tasks)
        self.teachers = tuple(f"teacher_{i}" for i in range(config.n_teachers))
        self.students = tuple(f"student_{i}" for i in range(config.n_students))
        self._student_names = frozenset(self.students)
        self.buffer = TaskBuffer(config.buffer_capacity)
        self.queue: deque[Turn] = deque()
        self.round = 0
        self.done = True
        self.history: list[ResolvedProposal] = []
        self.attempt_log: list[tuple[str, str, bool]] = []  # (student, task_id, correct)
        self._resolved_attempts = 0  # attempt_log's entries from resolved rounds
        self._proposals: list[tuple[Turn, Task | None, TeacherVerdict, str]] = []
        self._attempts: dict[int, list[tuple[str, bool]]] = {}  # by proposal index in the round
        self._solve_infos: dict[str, dict[str, Any]] = {}  # each student's latest step info this round
        self._rng = np.random.default_rng(0)
        self._local = random.Random(0)
        self._phase: Phase = "propose"
        self._fresh_buffer = True
        self._forms: dict[str, str] = {}  # task_id -> normal_form, of tasks the buffer held

    # ----- episode control ---------------------------------------------------------------------
    def reset(self, rng: np.random.Generator) -> None:
        """Starts a new episode drawing every random choice from ``rng``.

        The game's own small draws (reference tasks, candidate distractors and their order) come from a
        ``random.Random`` seeded here from ``rng``: a few scalar draws from it cost a fraction of numpy's
        per-call overhead, and the episode stays a pure function of ``rng``'s state. The matchmaker gets
        ``rng`` itself (its protocol takes a numpy generator).
        """
        self._rng = rng
        self._local = random.Random(int(rng.integers(2**63)))
        if self._fresh_buffer or not self.config.persist_buffer:
            self.buffer = self._seeded_buffer()
            self._fresh_buffer = False
        self.queue.clear()
        self.round = 0
        self.done = False
        self.history = []
        self.attempt_log = []
        self._resolved_attempts = 0
        self._start_round()

    def buffer_state(self) -> dict[str, Any]:
        """The task buffer as plain JSON data (``TaskBuffer.state``); the seed tasks' buffer before the first
        reset."""
        if self._fresh_buffer:
            self.buffer = self._seeded_buffer()
            self._fresh_buffer = False
        return self.buffer.state()

    def load_buffer_state(self, state: Mapping[str, Any] | None) -> None:
        """Replaces the task buffer with ``state`` (``buffer_state()``), which the next reset keeps when
        ``persist_buffer`` is on; ``None``: the next reset starts from the seed tasks again.

        Raises:
            ValueError, KeyError, TypeError: ``state`` is no buffer's, or one of another capacity.
        """
        if state is None:
            self._fresh_buffer = True
            return
        buffer = TaskBuffer.from_state(state)
        if buffer.capacity != self.config.buffer_capacity:
            raise ValueError(
                f"a buffer state of capacity {buffer.capacity} for a game of buffer_capacity "
                f"{self.config.buffer_capacity}"
            )
        self.buffer, self._fresh_buffer = buffer, False

    def _seeded_buffer(self) -> TaskBuffer:
        buffer = TaskBuffer(self.config.buffer_capacity)
        for task in self.seed_tasks:
            buffer.add(task)
        return buffer

    def metrics(self) -> EpisodeMetrics:
        """Arms-race metrics of the episode so far (resolved rounds only)."""
        proposals = [
            (r.teacher, r.verdict, r.task.program if r.task else "", r.solve_rate) for r in self.history
        ]
        attempts = [(student, ok) for student, _, ok in self.attempt_log[: self._resolved_attempts]]
        statuses = [r.status for r in self.history]
        return summarize_episode(proposals, attempts, self.teachers, self.students, statuses)

    @property
    def current(self) -> Turn | None:
        """The turn to be played next (``None`` once the episode is over)."""
        return self.queue[0] if self.queue else None

    def next_turn_for(self, agent: str) -> Turn | None:
        """The next pending turn of ``agent`` in this round, if any."""
        for turn in self.queue:
            if turn.agent == agent:
                return turn
        return None

    def _start_round(self) -> None:
        cfg = self.config
        self._proposals = []
        self._attempts = {}
        self._solve_infos = {}
        self._phase = "propose"
        for i, teacher in enumerate(self.teachers):
            task_type = cfg.task_types[(self.round * len(self.teachers) + i) % len(cfg.task_types)]
            refs = self.buffer.sample(task_type, cfg.n_references, self._local)
            for g in range(cfg.teacher_group_size):
                self.queue.append(Turn(teacher, "propose", task_type, g, self.round, references=refs))

    # ----- stepping ----------------------------------------------------------------------------
    def step(self, action: Proposal | Answer | FormatError | dsl.DslProgram | int) -> StepOutcome:
        """Plays the current turn with an already parsed/decoded action.

        Teachers take a ``Proposal`` (text), a ``DslProgram`` (structured) or a ``FormatError``;
        students take an ``Answer`` (text), a candidate index (structured) or a ``FormatError``.
        """
        if not self.queue:
            raise RuntimeError("the episode is over; call reset()")
        # The turn leaves the queue only once it has been played: an error while playing it (a verifier or
        # matchmaker that raises) leaves the game as it was, the same turn pending.
        turn = self.queue[0]
        solve_info = self._solve_infos.get(turn.agent)
        # The draws of a phase's last turn are taken back too: the matchmaker's (a 1 µs snapshot of ``_rng``)
        # and a structured proposal's candidates (9 µs for ``_local``, once a round). Not those of other
        # structured proposals whose own verification raises (rare; a snapshot each would cost 9 µs on the
        # env's hot path): retried, they may draw other distractors.
        draws = None
        if len(self.queue) == 1:
            structured_proposal = turn.phase == "propose" and self.config.mode == "structured"
            draws = (self._rng.bit_generator.state, self._local.getstate() if structured_proposal else None)
        try:
            outcome = self._propose(turn, action) if turn.phase == "propose" else self._solve(turn, action)
        except BaseException:
            if draws is not None:
                self._restore_draws(draws)
            raise
        self.queue.popleft()
        if not self.queue:
            try:
                outcome = self._after_phase(outcome)
            except BaseException:
                self._take_back(turn, solve_info)
                if draws is not None:
                    self._restore_draws(draws)
                raise
        return outcome

    def _restore_draws(self, states: tuple[Mapping[str, Any], Any]) -> None:
        self._rng.bit_generator.state = states[0]
        if states[1] is not None:
            self._local.setstate(states[1])

    def _take_back(self, turn: Turn, solve_info: dict[str, Any] | None) -> None:
        """Undoes the record of the last turn of a phase whose end raised (``_after_phase`` changes nothing
        before its last call that can raise), and puts the turn back."""
        if turn.phase == "propose":
            self._proposals.pop()
            self._phase = "propose"
        else:
            attempts = self._attempts[turn.proposal]
            attempts.pop()
            if not attempts:
                del self._attempts[turn.proposal]
            self.attempt_log.pop()
            if solve_info is None:
                self._solve_infos.pop(turn.agent, None)
            else:
                self._solve_infos[turn.agent] = solve_info
        self.queue.appendleft(turn)

    def _propose(self, turn: Turn, action: Any) -> StepOutcome:
        task, verdict, status = self._validate(turn, action)
        self._proposals.append((turn, task, verdict, status))
        info = self._base_info(turn)
        info.update(task_id=task.task_id if task else "", verdict=verdict, status=status)
        return StepOutcome({}, {turn.agent: info}, False)

    def last_proposal_task(self) -> Task | None:
        """The task of this round's latest proposal if it was valid (for rendering)."""
        return self._proposals[-1][1] if self._proposals else None

    def _validate(self, turn: Turn, action: Any) -> tuple[Task | None, TeacherVerdict, str]:
        cfg = self.config
        program_dsl = None
        if isinstance(action, FormatError):
            return None, "format_error", action.reason
        if isinstance(action, dsl.DslProgram):
            program_dsl = action
            source, args = dsl.render(action)
            n_inputs = cfg.induction_max_inputs if turn.task_type == "induction" else 1
            inputs = dsl.induction_inputs(action, n_inputs) if turn.task_type == "induction" else (args,)
            action = Proposal(source, inputs, "")
        if not isinstance(action, Proposal):
            return None, "format_error", "wrong_action_kind"
        runs = run_all(self.verifier, [(action.program, args) for args in action.inputs])
        bad = next((r for r in runs if r.status != "ok" or r.output is None), None)
        if bad is not None:
            return None, "invalid", str(bad.status)
        if turn.task_type == "induction" and len(runs) < 2:  # no pair left to test the student's program
            return None, "invalid", "too_few_inputs"
        task = Task(
            task_id=task_id_for(turn.task_type, action.program, action.inputs),
            task_type=turn.task_type,
            program=action.program,
            inputs=action.inputs,
            outputs=tuple(str(r.output) for r in runs),
            message=action.message,
            n_shown=max(1, len(runs) // 2) if turn.task_type == "induction" else 1,
            source=turn.agent,
            program_dsl=program_dsl,
        )
        if cfg.mode == "text" and self._in_the_buffer(task):
            return None, "invalid", "duplicate"  # a copy of a reference it was shown is no new task
        if (
            cfg.mode == "text"
            and (reason := unshowable(task, cfg.max_prompt_chars, cfg.max_action_chars)) is not None
        ):
            return None, "invalid", reason  # a task its students could not read is not a task
        if cfg.mode == "structured":
            candidates = make_candidates(task, self.verifier, self._local, cfg.n_candidates)
            # the one field that needs the task itself, set before anyone else sees the task (cheaper
            # than a second construction or dataclasses.replace)
            object.__setattr__(task, "candidates", candidates)
        return task, "valid", "ok"

    def _in_the_buffer(self, task: Task) -> bool:
        """Whether the buffer holds ``task`` in another spelling (``normal_form``): comments, docstrings,
        spacing, names and the spelling of its inputs aside. Copying a reference task, shown with its
        output, was valid and paid like a new task (reward-hacking reviews)."""
        held = self.buffer.tasks(task.task_type)
        if len(self._forms) > 4 * self.config.buffer_capacity * len(TASK_TYPES):  # forget evicted tasks'
            self._forms = {t.task_id: self._forms[t.task_id] for kind in TASK_TYPES
                           for t in self.buffer.tasks(kind) if t.task_id in self._forms}  # fmt: skip
        form = normal_form(task.task_type, task.program, task.inputs, task.outputs, task.n_shown)
        for other in held:
            if other.task_id not in self._forms:
                self._forms[other.task_id] = normal_form(
                    other.task_type, other.program, other.inputs, other.outputs, other.n_shown
                )
            if self._forms[other.task_id] == form:
                return True
        return False

    def _solve(self, turn: Turn, action: Any) -> StepOutcome:
        cfg = self.config
        task = turn.task
        assert task is not None
        score = 0.0
        if isinstance(action, FormatError):
            verdict, status, reward = "format_error", action.reason, cfg.student_format_penalty
        else:
            score = self._score(task, action)
            correct = score == 1.0
            verdict = "correct" if correct else "wrong"
            status, reward = "ok", cfg.student_correct_reward if correct else cfg.student_wrong_reward
        solved = verdict == "correct"
        agent, task_id = turn.agent, task.task_id
        self._attempts.setdefault(turn.proposal, []).append((agent, solved))
        self.attempt_log.append((agent, task_id, solved))
        info = self._base_info(turn)  # filled in place: one dict per step (the env's most frequent step)
        info["task_id"] = task_id
        info["verdict"] = verdict
        info["status"] = status
        info["score"] = score
        self._solve_infos[agent] = info
        return StepOutcome({agent: reward}, {agent: info}, False)

    def _score(self, task: Task, action: Any) -> float:
        """1.0/0.0 for deduction and abduction, the fraction of hidden pairs matched for induction."""
        if isinstance(action, _INDEX_TYPES) and not isinstance(action, bool):
            return 1.0 if task.candidates[int(action)].correct else 0.0
        if not isinstance(action, Answer):
            return 0.0
        if task.task_type == "deduction":
            return float(bool(self.verifier.check_deduction(task.program, task.inputs[0], action.text)))
        if task.task_type == "abduction":
            return float(bool(self.verifier.check_abduction(task.program, task.outputs[0], action.text)))
        return float(self.verifier.check_induction(action.text, list(task.hidden_pairs)))

    def _after_phase(self, outcome: StepOutcome) -> StepOutcome:
        """Called when the queue empties: start the solve phase, or resolve the round."""
        if self._phase == "propose":
            valid = [
                (i, turn, task) for i, (turn, task, _, _) in enumerate(self._proposals) if task is not None
            ]
            self._schedule_solves(valid)
            self._phase = "solve"
            if self.queue:
                return outcome
        return self._resolve(outcome)

    def _schedule_solves(self, valid: list[tuple[int, Turn, Task]]) -> None:
        """Queues the students' attempts at the round's valid proposals, given as (proposal index, turn,
        task)."""
        if not valid:
            return
        matches = self.matchmaker.assign([turn.agent for _, turn, _ in valid], self.students, self._rng)
        per_student: dict[str, list[tuple[int, Task]]] = {s: [] for s in self.students}
        for (index, _, task), students in zip(valid, self._checked_matches(matches, len(valid)), strict=True):
            for student in students:
                per_student[student].append((index, task))
        for student in self.students:
            for index, task in per_student[student]:
                for g in range(self.config.student_group_size):
                    self.queue.append(
                        Turn(student, "solve", task.task_type, g, self.round, task=task, proposal=index)
                    )

    def _checked_matches(self, matches: Any, n_tasks: int) -> list[tuple[str, ...]]:
        """The matchmaker's ``assign`` result, checked before anything is queued: one group of distinct
        students of this game per task.

        Raises:
            ValueError: naming the matchmaker and what is wrong.
        """
        where = f"{type(self.matchmaker).__name__}.assign"
        try:
            groups = [tuple(students) for students in matches]
        except TypeError as e:
            raise ValueError(f"{where} must return one sequence of students per task: {e}") from None
        if len(groups) != n_tasks:
            raise ValueError(f"{where} returned {len(groups)} groups of students for {n_tasks} tasks")
        for students in groups:
            try:  # strs first: an object merely equal to a name, or one whose hash raises, is refused
                valid = (
                    all(isinstance(s, str) for s in students)
                    and self._student_names.issuperset(students)
                    and len(set(students)) == len(students)
                )
            except Exception:
                valid = False
            if not valid:
                raise ValueError(
                    f"{where} returned {students!r}: each task's students must be distinct names among "
                    f"{self.students}"
                )
        return groups

    def _resolve(self, outcome: StepOutcome) -> StepOutcome:
        rewards = dict(outcome.rewards)
        infos = dict(outcome.infos)
        resolved: dict[str, list[tuple[int, ResolvedProposal]]] = {t: [] for t in self.teachers}
        results: list[tuple[str, str, bool]] = []
        # Everything that can raise (a reward scheme, the matchmaker's update) before the game changes.
        round_records = [
            self._resolve_one(turn, task, verdict, status, self._attempts.get(index, []))
            for index, (turn, task, verdict, status) in enumerate(self._proposals)
        ]
        for index, (turn, task, _, _) in enumerate(self._proposals):
            if task is not None:
                results += [(turn.agent, s, ok) for s, ok in self._attempts.get(index, [])]
        self.matchmaker.update(results)
        for index, ((turn, task, _, _), record) in enumerate(
            zip(self._proposals, round_records, strict=True)
        ):
            resolved[turn.agent].append((index, record))
            rewards[turn.agent] = rewards.get(turn.agent, 0.0) + record.reward
            if task is not None:
                self.buffer.add(task)
        solved: dict[str, list[dict[str, Any]]] = {}
        for teacher, indexed in resolved.items():
            records = [record for _, record in indexed]
            self.history += records
            listed = [_record_info(r) for r in records]
            # A teacher whose own step closed the round keeps its step info next to the resolution.
            base = infos.get(teacher, {"round": self.round, "phase": "resolve"})
            infos[teacher] = {**base, "resolved": listed}
            for index, record in indexed:  # an invalid proposal has no attempts
                attempts = self._attempts.get(index, [])
                for student in dict.fromkeys(s for s, _ in attempts):
                    own = [ok for s, ok in attempts if s == student]
                    solved.setdefault(student, []).append(
                        {"task_id": record.task_id, "task_type": record.task_type, "teacher": teacher,
                         "solve_rate": record.solve_rate, "n_attempts": record.n_attempts, "gold": record.gold,
                         "own_attempts": len(own), "own_correct": sum(own)}
                    )  # fmt: skip
        for student, entries in solved.items():  # the tasks it attempted, next to its last step's info
            infos[student] = {**self._solve_infos[student], "resolved": entries}
        self._resolved_attempts = len(self.attempt_log)
        self.round += 1
        self.done = self.round >= self.config.rounds
        if not self.done:
            self._start_round()
        return StepOutcome(rewards, infos, self.done)

    def _resolve_one(
        self,
        turn: Turn,
        task: Task | None,
        verdict: TeacherVerdict,
        status: str,
        attempts: list[tuple[str, bool]],
    ) -> ResolvedProposal:
        cfg = self.config
        if task is None:
            penalty = cfg.teacher_format_penalty if verdict == "format_error" else cfg.teacher_invalid_penalty
            return ResolvedProposal(
                turn.agent,
                turn.round,
                turn.attempt,
                turn.task_type,
                "",
                verdict,
                status,
                None,
                0,
                penalty,
                "",
            )
        rate = sum(ok for _, ok in attempts) / len(attempts) if attempts else None
        return ResolvedProposal(
            turn.agent,
            turn.round,
            turn.attempt,
            turn.task_type,
            task.task_id,
            "valid",
            status,
            rate,
            len(attempts),
            teacher_reward(rate, cfg),
            task.gold,
            task,
        )

    @staticmethod
    def _base_info(turn: Turn) -> dict[str, Any]:
        return {
            "round": turn.round,
            "phase": turn.phase,
            "task_type": turn.task_type,
            "attempt": turn.attempt,
        }


def _record_info(record: ResolvedProposal) -> dict[str, Any]:
    return {
        "task_id": record.task_id,
        "task_type": record.task_type,
        "attempt": record.attempt,
        "verdict": record.verdict,
        "status": record.status,
        "solve_rate": record.solve_rate,
        "n_attempts": record.n_attempts,
        "reward": record.reward,
        "gold": record.gold,
    }
