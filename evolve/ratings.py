"""OpenSkill ratings of members from match results, and a matchmaker that feeds them to the env's PFSP.

Every attempt in the game is a two-team match, teacher against student: the student wins when it solves
the task, else the teacher wins (the same convention as ``populora_env.matchmaking.RatingPFSP``). Ratings
are kept per member id, not per env seat, so they follow a member whichever seat it takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from openskill.models import PlackettLuce

from populora_env.matchmaking import RatingPFSP


@dataclass(frozen=True)
class Rating:
    """A member's OpenSkill rating.

    Attributes:
        mu: mean skill.
        sigma: uncertainty.
    """

    mu: float
    sigma: float

    @property
    def ordinal(self) -> float:
        """The conservative skill ``mu - 3 sigma`` (OpenSkill's ``ordinal``; TrueSkill's leaderboard value)."""
        return self.mu - 3.0 * self.sigma


@dataclass(frozen=True)
class MatchResult:
    """One attempt: ``student`` tried a task of ``teacher`` and ``solved`` it or not (member ids)."""

    teacher: int
    student: int
    solved: bool


class RatingTable:
    """OpenSkill Plackett-Luce ratings by member id (Weng & Lin 2011, JMLR 12, "A Bayesian Approximation
    Method for Online Ranking"; the ``openskill`` package implements it).

    Args:
        ratings: initial ratings by member id.
    """

    def __init__(self, ratings: Mapping[int, Rating] | None = None) -> None:
        self.model = PlackettLuce()
        self.ratings: dict[int, Rating] = dict(ratings or {})

    @property
    def default(self) -> Rating:
        """A fresh member's rating (the model's prior)."""
        return Rating(float(self.model.mu), float(self.model.sigma))

    def get(self, member: int) -> Rating:
        """The member's rating (the prior if it has none yet)."""
        return self.ratings.get(member, self.default)

    def skill(self, member: int) -> Any:
        """The member's rating as an OpenSkill model object."""
        rating = self.get(member)
        return self.model.rating(mu=rating.mu, sigma=rating.sigma)

    def update(self, results: Sequence[MatchResult]) -> None:
        """Rates each attempt in order (sequential updates, as OpenSkill's online model intends).

        A self-play member's attempts at its own tasks (teacher == student) carry no information about its
        skill relative to anyone and are skipped.
        """
        for result in results:
            if result.teacher == result.student:
                continue
            ranks = [1.0, 0.0] if result.solved else [0.0, 1.0]  # OpenSkill ranks: lower is better
            new_t, new_s = self.model.rate(
                [[self.skill(result.teacher)], [self.skill(result.student)]], ranks=ranks
            )
            self.ratings[result.teacher] = Rating(float(new_t[0].mu), float(new_t[0].sigma))
            self.ratings[result.student] = Rating(float(new_s[0].mu), float(new_s[0].sigma))

    def inherit(self, child: int, parent: int) -> None:
        """A child starts at its parent's ``mu`` with the prior's (wide) ``sigma``: its skill is a guess."""
        self.ratings[child] = Rating(self.get(parent).mu, self.default.sigma)

    def forget(self, member: int) -> None:
        """Drops a retired member's rating."""
        self.ratings.pop(member, None)

    def state(self) -> dict[int, tuple[float, float]]:
        """Plain floats for checkpoints."""
        return {member: (r.mu, r.sigma) for member, r in self.ratings.items()}

    @classmethod
    def from_state(cls, state: Mapping[int, tuple[float, float]]) -> RatingTable:
        """Inverse of ``state``."""
        return cls({int(m): Rating(float(mu), float(sigma)) for m, (mu, sigma) in state.items()})


class MemberMatchmaker:
    """A ``populora_env`` ``Matchmaker`` that seats members and records their match results.

    ``assign`` is the env's ``RatingPFSP`` (near-balanced matchups preferred) fed with the members' current
    ratings for the episode's seating, never matching a self-play member with its own student seat when
    another is there, or all-pairs when ``pfsp`` is off; ``update`` only records results
    (as member ids), which the PBT loop rates once per generation in a fixed order.

    Args:
        table: the ratings to read.
        per_task: students per task under PFSP.
        pfsp: use PFSP (else every student attempts every task).
    """

    def __init__(self, table: RatingTable, per_task: int = 1, pfsp: bool = True) -> None:
        self.table = table
        self.pfsp = RatingPFSP(per_task, model=table.model) if pfsp else None
        self.seats: dict[str, int] = {}
        self.results: list[MatchResult] = []

    def seat(self, seats: Mapping[str, int]) -> None:
        """Seats members (env agent name -> member id) for the next episode and loads their ratings."""
        self.seats = dict(seats)
        if self.pfsp is not None:
            self.pfsp.ratings = {agent: self.table.skill(member) for agent, member in self.seats.items()}

    def assign(
        self, teachers: Sequence[str], students: Sequence[str], rng: np.random.Generator
    ) -> list[tuple[str, ...]]:
        """Students per task: PFSP on the seated members' ratings, or all of them."""
        if self.pfsp is None:
            return [tuple(students) for _ in teachers]
        others = {t: [s for s in students if self.seats.get(s) != self.seats.get(t)] for t in teachers}
        if any(len(o) < len(students) for o in others.values()) and all(others.values()):
            # self-play: a member's own student seat rates as an even match (PFSP's heaviest weight) and its
            # results are not rated; the others' seats, as long as there are any (1x1 has only its own)
            return [self.pfsp.assign([t], others[t], rng)[0] for t in teachers]
        return self.pfsp.assign(teachers, students, rng)

    def update(self, results: Sequence[tuple[str, str, bool]]) -> None:
        """Records ``(teacher seat, student seat, solved)`` attempts as member results."""
        self.results += [MatchResult(self.seats[t], self.seats[s], bool(ok)) for t, s, ok in results]

    def drain(self) -> list[MatchResult]:
        """Returns and clears the recorded results."""
        out, self.results = self.results, []
        return out
