"""Evolve a population of small torch policies on TeacherStudent-v0's structured mode with ``run_pbt``.

Usage:
    python examples/03_evolve_structured.py [--generations 6] [--population 4] [--seed 0]
        [--teachers scripted|torch] [--self-play] [--run-dir runs/evolve_structured]

Each generation the teachers and students (only the students with ``--teachers scripted``) play the game
(deduction tasks), learn from it with REINFORCE, are rated with OpenSkill, and the worst quarter of each
role (half of a population under 4, as ``populora train`` does: a quarter of 2 or 3 is no member) is replaced
by crossover and mutation of the best (``--self-play`` has one member: nothing to replace). The run folder
holds ``metrics.jsonl``, ``lineage.jsonl``, checkpoints (kill the script and run it again: it resumes
exactly) and TensorBoard logs (``tensorboard --logdir <run-dir>/tb``).
``--self-play`` is AZR's single-agent baseline: one member plays both seats of a 1x1 game. CPU-sized: the
defaults take about half a minute.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from evolve.checkpoint import CheckpointError
from evolve.learners import LearnerConfig
from evolve.pbt import PBTConfig, run_pbt
from populora_env.game import TeacherStudentConfig


@dataclass(frozen=True)
class Args:
    run_dir: str = "runs/evolve_structured"
    """Run folder (an existing run with the same settings is resumed)."""
    generations: int = 6
    """Generations."""
    population: int = 4
    """Evolving members per role."""
    teachers: Literal["scripted", "torch"] = "torch"
    """Evolving torch teachers (an arms race with the students) or scripted ones (fixed tasks)."""
    self_play: bool = False
    """One torch member plays teacher and student of a 1x1 game (overrides the other role settings)."""
    seed: int = 0
    """Seed of the whole run."""


def main(args: Args) -> None:
    if args.self_play:
        env = TeacherStudentConfig(  # (four attempts a task: with one, teachers got no signal; an audit)
            mode="structured", n_teachers=1, n_students=1, rounds=2, n_slots=3, teacher_group_size=4,
            student_group_size=4, task_types=("deduction",),
        )  # fmt: skip
        extra = {"self_play": True, "population": 1, "teachers": "torch"}
    else:
        env = TeacherStudentConfig(
            mode="structured", n_teachers=2, n_students=2, rounds=2, n_slots=3, teacher_group_size=4,
            student_group_size=4, task_types=("deduction",),
        )  # fmt: skip
        extra = {"population": args.population, "teachers": args.teachers,
                 "replace_fraction": 0.5 if args.population < 4 else 0.25}  # fmt: skip
    try:
        config = PBTConfig(
            run_dir=args.run_dir, seed=args.seed, generations=args.generations, episodes_per_generation=2,
            env=env, learner_config=LearnerConfig(lr=0.03, steps=4), **extra,  # type: ignore[arg-type]
        )  # fmt: skip
        run_dir = run_pbt(config)
    # a bad setting, or a shorter --generations on a run folder
    except (ValueError, CheckpointError) as error:
        raise SystemExit(f"03_evolve_structured: {error}") from None
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        fitness = {role: round(f["mean"], 3) for role, f in record["role_fitness"].items()}
        solve = "-" if record["solve_rate"] is None else f"{record['solve_rate']:.2f}"  # (None: no attempt)
        print(f"generation {record['generation']}: solve rate {solve}, "
              f"mean fitness {fitness}, children {len(record['lineage'])}")  # fmt: skip
    print(f"run folder: {run_dir}")


if __name__ == "__main__":
    main(tyro.cli(Args))
