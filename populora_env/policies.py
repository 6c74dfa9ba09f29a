"""Reference policies: random, a scripted teacher with a difficulty knob, scripted students, a human.

Scripted policies hold the env so that they can read privileged information (``current_turn``): they are
baselines and test fixtures, not learners. Every random choice comes from the policy's own seeded
generator.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from populora_env import dsl
from populora_env.tasks import TASK_TYPES, Task
from populora_env.text_format import format_answer, format_proposal, shortest_answer

WRONG_OUTPUT = "'__wrong__'"
WRONG_PROGRAM = "def f(*args):\n    return '__wrong__'"


def _task_of(env: Any) -> Task:
    turn = env.unwrapped.current_turn
    if turn is None or turn.task is None:
        raise RuntimeError("a student policy was asked to act outside a solve turn")
    return turn.task


class RandomPolicy:
    """Uniform random actions from the agent's action space (masked for structured students).

    Args:
        env: the env whose action spaces are sampled.
        seed: seed of the policy's own generator.
        max_chars: longest random text action (Text spaces allow far longer; shorter keeps it fast).
    """

    def __init__(self, env: Any, seed: int = 0, max_chars: int = 256) -> None:
        self.env = env
        self.rng = np.random.default_rng(seed)
        self.max_chars = max_chars

    def reseed(self, seed: int) -> None:
        """Restarts the policy's generator from ``seed``."""
        self.rng = np.random.default_rng(seed)

    def act(self, observation: Any, agent: str) -> Any:
        """A random action for ``agent``."""
        space = self.env.action_space(agent)
        if isinstance(space, spaces.Text):
            charset = sorted(space.character_set)
            n = int(self.rng.integers(space.min_length, min(space.max_length, self.max_chars) + 1))
            return "".join(charset[int(i)] for i in self.rng.integers(len(charset), size=n))
        if isinstance(space, spaces.MultiDiscrete):
            return self.rng.integers(space.nvec).astype(np.int64)
        if isinstance(space, spaces.Discrete):
            mask = observation.get("action_mask") if isinstance(observation, dict) else None
            legal = np.flatnonzero(mask) if mask is not None and mask.any() else np.arange(space.n)
            return int(space.start + self.rng.choice(legal))
        raise TypeError(f"RandomPolicy does not support {space}")


class ScriptedTeacher:
    """Proposes well-typed DSL programs whose size and nesting grow with ``difficulty`` in [0, 1].

    Works in both modes: in text mode the program is rendered to Python and written in the answer
    format; in structured mode the DSL action vector is returned.

    Args:
        env: the env (for its config).
        difficulty: 0 gives one-op programs; 1 fills every slot and nests loops and guards.
        seed: seed of the policy's own generator.
    """

    def __init__(self, env: Any, difficulty: float = 0.5, seed: int = 0) -> None:
        if not 0.0 <= difficulty <= 1.0:
            raise ValueError(f"difficulty must be in [0, 1], got {difficulty}")
        self.config = env.unwrapped.config
        self.difficulty = difficulty
        self.rng = random.Random(seed)

    def reseed(self, seed: int) -> None:
        """Restarts the policy's generator from ``seed``."""
        self.rng = random.Random(seed)

    def act(self, observation: Any, agent: str) -> Any:
        """A proposal for the task type in ``observation``; in text mode one that fits ``max_action_chars``
        (programs are drawn again, at last at difficulty 0, when one renders too long)."""
        cfg = self.config
        program = dsl.random_program(self.rng, cfg.n_slots, self.difficulty)
        if cfg.mode == "structured":
            return program.encode()
        task_type = TASK_TYPES[int(observation["task_type"])]
        for attempt in range(_PROPOSAL_DRAWS):
            text = self._text(program, task_type)
            if len(text) <= cfg.max_action_chars:
                return text
            difficulty = self.difficulty if attempt + 2 < _PROPOSAL_DRAWS else 0.0
            program = dsl.random_program(self.rng, cfg.n_slots, difficulty)
        return text  # even a one-op program is too long: the env says so (format error)

    def _text(self, program: Any, task_type: str) -> str:
        cfg = self.config
        source, args = dsl.render(program)
        if task_type != "induction":
            return format_proposal(source, [args], reasoning="scripted")
        n = max(cfg.induction_min_inputs, min(4, cfg.induction_max_inputs))
        kind = dsl.VALUE_TYPES[program.input_type]
        return format_proposal(source, dsl.induction_inputs(program, n), message=f"f takes a {kind}.")


_PROPOSAL_DRAWS = 20
"""Programs ``ScriptedTeacher`` draws, at most, for a text proposal within ``max_action_chars``."""


class _SkilledStudent:
    """Shared state of the scripted students: the env they read, a skill in [0, 1], their own generator."""

    MODE = ""  # the env mode the student plays (the subclasses')
    OTHER = ""  # the scripted student of the other mode

    def __init__(self, env: Any, skill: float = 1.0, seed: int = 0) -> None:
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill}")
        mode = getattr(getattr(getattr(env, "unwrapped", env), "config", None), "mode", self.MODE)
        # (ExecutingStudent in text mode: "Cannot choose from an empty sequence" at its first act; a review)
        if mode != self.MODE:
            raise ValueError(
                f"{type(self).__name__} plays {self.MODE} mode; this env is in {mode} mode: use {self.OTHER}"
            )
        self.env = env
        self.skill = skill
        self.rng = random.Random(seed)

    def reseed(self, seed: int) -> None:
        """Restarts the policy's generator from ``seed``."""
        self.rng = random.Random(seed)


class ReferenceStudent(_SkilledStudent):
    """Text mode: answers with the task's reference (gold) answer with probability ``skill``, else with a
    well-formed wrong answer. The gold answer is written with a short reasoning, or, where that would not fit
    the env's ``max_action_chars``, in its shortest form (``text_format.shortest_answer``), which fits for
    every task the env accepts.

    Args:
        env: the env (reads the pending task).
        skill: probability of answering with the gold answer.
        seed: seed of the policy's own generator.
    """

    MODE, OTHER = "text", "ExecutingStudent"

    def act(self, observation: Any, agent: str) -> str:
        """The gold answer or a wrong one, in the answer format."""
        task = _task_of(self.env)
        if self.rng.random() < self.skill:
            answer = format_answer(task.task_type, task.gold, reasoning="reference")
            if len(answer) > self.env.unwrapped.config.max_action_chars:
                answer = shortest_answer(task)
            return answer
        wrong = WRONG_PROGRAM if task.task_type == "induction" else WRONG_OUTPUT
        return format_answer(task.task_type, wrong, reasoning="guess")


class ExecutingStudent(_SkilledStudent):
    """Structured mode: checks every candidate with the verifier and picks a correct one with probability
    ``skill`` (a uniformly random legal candidate otherwise).

    Args:
        env: the env (reads the pending task and uses its verifier).
        skill: probability of solving by execution.
        seed: seed of the policy's own generator.
    """

    MODE, OTHER = "structured", "ReferenceStudent"

    def act(self, observation: Any, agent: str) -> int:
        """A candidate index."""
        task = _task_of(self.env)
        legal = list(range(len(task.candidates)))
        if self.rng.random() >= self.skill:
            return self.rng.choice(legal)
        verifier = self.env.unwrapped.verifier
        for i, cand in enumerate(task.candidates):
            if task.task_type == "deduction":
                ok = verifier.check_deduction(task.program, task.inputs[0], cand.text)
            elif task.task_type == "abduction":
                ok = verifier.check_abduction(task.program, task.outputs[0], cand.text)
            else:
                # right when it gives every pair, the shown ones too (as the env marks candidates)
                pairs = [*task.shown_pairs, *task.hidden_pairs]
                ok = verifier.check_induction(cand.text, pairs) == 1.0
            if ok:
                return i
        return self.rng.choice(legal)


# ASCII digits only: `str.isdigit` takes "²", which `int` refuses (the policy crashed instead of asking again)
_DECIMAL = re.compile(r"[0-9]+")


class HumanPolicy:
    """Asks a person in the terminal.

    Text mode: prints the prompt and reads lines until a line holding only ``.``. Structured mode: reads
    integers (a candidate index, or the teacher's action vector separated by spaces).

    Args:
        env: the env (for its action spaces).
        input_fn: where lines come from (``input`` by default; tests pass a scripted one).
        print_fn: where text goes (``print`` by default).
    """

    def __init__(
        self, env: Any, input_fn: Callable[[str], str] = input, print_fn: Callable[[str], None] = print
    ) -> None:
        self.env = env
        self.input_fn = input_fn
        self.print_fn = print_fn

    def act(self, observation: Any, agent: str) -> Any:
        """Reads the action from the person."""
        space = self.env.action_space(agent)
        if isinstance(space, spaces.Text):
            self.print_fn(f"--- {agent} ---\n{observation['prompt']}\n(end your answer with a line '.')")
            lines = []
            while (line := self.input_fn("")) != ".":
                lines.append(line)
            return "\n".join(lines)
        if isinstance(space, spaces.Discrete):
            legal = np.flatnonzero(observation["action_mask"]).tolist()
            self.print_fn(f"--- {agent} --- choose a candidate among {legal}")
            while True:
                reply = self.input_fn("> ").strip()
                if _DECIMAL.fullmatch(reply) and int(reply) in legal:
                    return int(reply)
                self.print_fn(f"please type one of {legal}")
        nvec = space.nvec.tolist()
        self.print_fn(f"--- {agent} --- enter {len(nvec)} integers, each below {nvec}")
        while True:
            parts = self.input_fn("> ").split()
            if len(parts) == len(nvec) and all(
                _DECIMAL.fullmatch(p) and int(p) < n for p, n in zip(parts, nvec, strict=True)
            ):
                return np.asarray([int(p) for p in parts], dtype=np.int64)
            self.print_fn(f"please type {len(nvec)} integers, each below {nvec}")
