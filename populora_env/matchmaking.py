"""Pluggable matchmakers that assign students to the round's valid tasks: all-pairs, random, rating PFSP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Matchmaker(Protocol):
    """Assigns students to tasks and may learn from the outcomes.

    ``assign`` gets each valid task's proposing teacher and returns, per task, the students who attempt it.
    ``update`` gets one ``(teacher, student, solved)`` triple per attempt after the round resolves.
    """

    def assign(
        self, teachers: Sequence[str], students: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[str, ...]]:
        """Returns the students matched to each task (one entry per item of ``teachers``)."""
        ...

    def update(self, results: Sequence[tuple[str, str, bool]]) -> None:
        """Learns from ``(teacher, student, solved)`` attempt outcomes."""
        ...


class AllPairs:
    """Every student attempts every valid task."""

    def assign(
        self, teachers: Sequence[str], students: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[str, ...]]:
        """Returns all students for every task."""
        return [tuple(students) for _ in teachers]

    def update(self, results: Sequence[tuple[str, str, bool]]) -> None:
        """Nothing to learn."""


class RandomMatch:
    """Each task goes to ``per_task`` students drawn uniformly without replacement.

    Args:
        per_task: students per task (capped at the number of students).
    """

    def __init__(self, per_task: int = 1) -> None:
        if per_task < 1:
            raise ValueError(f"per_task must be >= 1, got {per_task}")
        self.per_task = per_task

    def assign(
        self, teachers: Sequence[str], students: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[str, ...]]:
        """Draws students for each task from ``rng``."""
        k = min(self.per_task, len(students))
        out = []
        for _ in teachers:
            picks = sorted(int(i) for i in rng.choice(len(students), size=k, replace=False))
            out.append(tuple(students[i] for i in picks))
        return out

    def update(self, results: Sequence[tuple[str, str, bool]]) -> None:
        """Nothing to learn."""


class RatingPFSP:
    """Prioritised fictitious self-play over OpenSkill ratings, preferring near-balanced matchups.

    Each attempt is a two-team match: the student wins if it solves the task, else the teacher wins.
    A student is drawn for a teacher's task with weight ``p (1 - p)`` where ``p`` is OpenSkill's predicted
    win probability of the teacher: the "variance" weighting of PFSP (Vinyals et al. 2019, AlphaStar,
    Methods, "Prioritized fictitious self-play"), largest for even matchups.

    Args:
        per_task: students per task.
        model: an OpenSkill model instance (default ``PlackettLuce()``).
    """

    def __init__(self, per_task: int = 1, model: object | None = None) -> None:
        from openskill.models import PlackettLuce

        if per_task < 1:
            raise ValueError(f"per_task must be >= 1, got {per_task}")
        self.per_task = per_task
        self.model = model if model is not None else PlackettLuce()
        self.ratings: dict[str, object] = {}

    def reset(self) -> None:
        """Forgets every rating (the env calls it at ``reset()`` unless ``persist_buffer`` is on)."""
        self.ratings.clear()

    def rating(self, agent: str) -> object:
        """The agent's OpenSkill rating (created at the model's default on first use)."""
        if agent not in self.ratings:
            self.ratings[agent] = self.model.rating(name=agent)  # type: ignore[attr-defined]
        return self.ratings[agent]

    def assign(
        self, teachers: Sequence[str], students: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[str, ...]]:
        """Draws students per task with PFSP weights ``p (1 - p)`` (a small floor keeps all reachable)."""
        k = min(self.per_task, len(students))
        out = []
        for teacher in teachers:
            weights = np.empty(len(students))
            for i, student in enumerate(students):
                p = self.model.predict_win([[self.rating(teacher)], [self.rating(student)]])[0]  # type: ignore[attr-defined]
                weights[i] = p * (1.0 - p) + 1e-3
            picks = rng.choice(len(students), size=k, replace=False, p=weights / weights.sum())
            out.append(tuple(students[int(i)] for i in sorted(picks)))
        return out

    def update(self, results: Sequence[tuple[str, str, bool]]) -> None:
        """Rates each attempt as a teacher-vs-student match (ranks: winner first)."""
        for teacher, student, solved in results:
            t, s = self.rating(teacher), self.rating(student)
            ranks = [1, 0] if solved else [0, 1]
            new_t, new_s = self.model.rate([[t], [s]], ranks=ranks)  # type: ignore[attr-defined]
            self.ratings[teacher], self.ratings[student] = new_t[0], new_s[0]


def make_matchmaker(name: str, per_task: int) -> Matchmaker:
    """Builds a matchmaker by config name (``all_pairs``, ``random``, ``pfsp``)."""
    if name == "all_pairs":
        return AllPairs()
    if name == "random":
        return RandomMatch(per_task)
    if name == "pfsp":
        return RatingPFSP(per_task)
    raise ValueError(f"matching must be one of 'all_pairs', 'random', 'pfsp', got {name!r}")
