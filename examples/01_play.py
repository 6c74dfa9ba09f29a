"""Play TeacherStudent-v0: a 2x2 game between scripted policies, shown round by round in ansi mode.

Usage:
    python examples/01_play.py [--mode text|structured] [--rounds 2] [--difficulty 0.6] [--seed 0]

Part 1 plays scripted teachers (difficulty knob) against scripted students (skill knob) and prints the
rendered rounds and the episode's arms-race metrics. Part 2 plugs in your own policy: any object with
``act(observation, agent)`` works, here a random student in ten lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import tyro

from populora_env import teacher_student_v0
from populora_env.play import play
from populora_env.policies import ExecutingStudent, ReferenceStudent, ScriptedTeacher


@dataclass(frozen=True)
class Args:
    mode: Literal["text", "structured"] = "text"
    """``text`` (string actions in AZR's format) or ``structured`` (DSL MultiDiscrete / candidates)."""
    rounds: int = 2
    """Rounds in the episode."""
    difficulty: float = 0.6
    """Scripted teachers' difficulty in [0, 1]."""
    seed: int = 0
    """Episode seed."""


def main(args: Args) -> None:
    if args.seed < 0:  # (numpy's seeding raised from deep inside the first reset)
        raise SystemExit(f"01_play: --seed must be >= 0, got {args.seed}")
    try:
        env = teacher_student_v0.env(
            mode=args.mode, n_teachers=2, n_students=2, rounds=args.rounds, render_mode="ansi"
        )
        student_cls = ReferenceStudent if args.mode == "text" else ExecutingStudent
        policies = {
            "teacher_0": ScriptedTeacher(env, difficulty=args.difficulty, seed=args.seed),
            "teacher_1": ScriptedTeacher(env, difficulty=args.difficulty / 2, seed=args.seed + 1),
            "student_0": student_cls(env, skill=0.9, seed=args.seed),
            "student_1": student_cls(env, skill=0.4, seed=args.seed + 1),
        }
    except ValueError as error:  # e.g. --rounds 0, --difficulty 5
        raise SystemExit(f"01_play: {error}".replace("difficulty must", "--difficulty must")) from None

    # ----- part 1: scripted policies, rendered -------------------------------------------------
    env.reset(seed=args.seed)
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else policies[agent].act(obs, agent))
    print(env.render())
    print("metrics:", env.unwrapped.episode_metrics())

    # ----- part 2: your own policy, ten lines --------------------------------------------------
    class MyRandomStudent:
        def __init__(self, seed: int) -> None:
            self.rng = np.random.default_rng(seed)

        def act(self, observation, agent):
            if "action_mask" in observation:  # structured: a legal candidate
                return int(self.rng.choice(np.flatnonzero(observation["action_mask"])))
            guess = str(self.rng.integers(-5, 6))  # text: a random integer in the answer format
            return f"<answer>\n```output\n{guess}\n```\n```input\n{guess}\n```\n</answer>"

    records = play(env, {**policies, "student_1": MyRandomStudent(args.seed)}, episodes=2, seed=args.seed)
    for r in records:
        print(f"episode {r.episode}: returns {r.returns} solve rates {r.metrics.student_solve_rate}")


if __name__ == "__main__":
    main(tyro.cli(Args))
