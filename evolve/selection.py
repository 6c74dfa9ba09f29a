"""Selection as pure functions of a fitness vector: truncation, tournament, elitism, replacement plans."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def rank_order(fitness: Sequence[float], tiebreak: Sequence[int] | None = None) -> list[int]:
    """Indices from best to worst; ties go to the lower ``tiebreak`` value (default: the lower index).

    Raises:
        ValueError: a fitness value is NaN.
    """
    values = np.asarray(fitness, dtype=np.float64)
    if np.isnan(values).any():
        raise ValueError(f"fitness must not contain NaN, got {list(fitness)}")
    second = np.arange(len(values)) if tiebreak is None else np.asarray(tiebreak)
    return [int(i) for i in np.lexsort((second, -values))]


def elites(fitness: Sequence[float], count: int, tiebreak: Sequence[int] | None = None) -> list[int]:
    """The ``count`` best indices (elitism: they survive a generation unchanged)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return rank_order(fitness, tiebreak)[:count]


def truncation(
    fitness: Sequence[float], fraction: float, tiebreak: Sequence[int] | None = None, of: int | None = None
) -> tuple[list[int], list[int]]:
    """Truncation selection: the top and bottom ``fraction`` of the population.

    ``k = floor(fraction * n)`` members each (``n`` = ``of`` when given, the size of the whole group these
    are the evaluated members of; ``k`` at most half of them), best first for the top and worst first for
    the bottom; with ``fraction <= 0.5`` the two sets are disjoint. Ties are ordered by ``tiebreak`` (see
    ``rank_order``).

    Raises:
        ValueError: ``fraction`` outside ``[0, 0.5]``.
    """
    if not 0.0 <= fraction <= 0.5:
        raise ValueError(f"fraction must be in [0, 0.5], got {fraction}")
    order = rank_order(fitness, tiebreak)
    k = min(share_of(fraction, len(order) if of is None else of), len(order) // 2)
    return order[:k], order[::-1][:k]


def share_of(fraction: float, n: int) -> int:
    """``floor(fraction * n)``, the product rounded first: 0.29 * 100 is 28.999999999999996 in binary
    floating point, and is 29 members."""
    return math.floor(round(fraction * n, 9))


def tournament(
    fitness: Sequence[float],
    size: int,
    rng: np.random.Generator,
    candidates: Sequence[int] | None = None,
    tiebreak: Sequence[int] | None = None,
) -> int:
    """Tournament selection: the fittest of ``size`` entrants drawn without replacement from ``candidates``.

    Ties go to the lower ``tiebreak`` value (default: the lower index). ``size`` is capped at the number of
    candidates.

    Raises:
        ValueError: ``size < 1``, no candidates, or a NaN fitness (it won or lost by its position).
    """
    pool = list(range(len(fitness))) if candidates is None else list(candidates)
    if np.isnan(np.asarray(fitness, dtype=np.float64)).any():
        raise ValueError(f"fitness must not contain NaN, got {list(fitness)}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if not pool:
        raise ValueError("tournament needs at least one candidate")
    entrants = sorted(int(pool[i]) for i in rng.choice(len(pool), size=min(size, len(pool)), replace=False))
    second = range(len(fitness)) if tiebreak is None else tiebreak
    return min(entrants, key=lambda i: (-float(fitness[i]), int(second[i])))


CLONE = "clone"
"""The crossover name recorded for a one-parent child (a copy of the parent, then the mutation)."""


@dataclass(frozen=True)
class Replacement:
    """One planned child: the slot it takes and the parents it is made from.

    Attributes:
        slot: index (in the role's member list) of the member replaced.
        parents: indices of the parents, tournament winners from the top, best first.
        crossover: name in ``operators.CROSSOVERS``.
        mutation: name in ``operators.MUTATIONS``.
    """

    slot: int
    parents: tuple[int, ...]
    crossover: str
    mutation: str


def plan_replacements(
    fitness: Sequence[float],
    *,
    replace_fraction: float,
    n_elites: int,
    tournament_size: int,
    n_parents: int,
    crossovers: Sequence[str],
    mutations: Sequence[str],
    rng: np.random.Generator,
    of: int | None = None,
) -> list[Replacement]:
    """Replace the bottom ``replace_fraction`` by children of the top (truncation, then tournaments).

    Elites are never replaced. Parents are distinct tournament winners among the best
    ``max(k, n_parents)`` members (``k`` = the replaced count), never among the replaced ones, so a small
    population still gets two-parent children, listed best first. Each child draws its crossover and
    mutation uniformly; with a single possible parent the crossover is ``clone`` (mutation only).

    ``of``: the size of the whole group when ``fitness`` holds only its evaluated members (the replaced
    count is then ``replace_fraction`` of the group, at most half of those evaluated).

    Ties in fitness (frequent: a solve rate over a few attempts takes few values) are broken by a random
    order drawn from ``rng`` once per plan, not by slot: children take the slots they replace, and a
    by-slot rule made the members of the highest slots lose every tie.
    """
    tiebreak = [int(i) for i in rng.permutation(len(fitness))]
    top, bottom = truncation(fitness, replace_fraction, tiebreak, of)
    order = rank_order(fitness, tiebreak)
    top = order[: max(len(top), min(n_parents, len(order) - len(bottom)))]
    position = {index: rank for rank, index in enumerate(order)}
    protected = set(elites(fitness, n_elites, tiebreak))
    plan = []
    for slot in bottom:
        if slot in protected:
            continue
        pool, parents = list(top), list[int]()
        while pool and len(parents) < n_parents:
            winner = tournament(fitness, tournament_size, rng, pool, tiebreak)
            parents.append(winner)
            pool.remove(winner)
        if not parents:
            continue
        parents.sort(key=position.__getitem__)  # best first: the lineage's order, the rating inherited
        crossover = crossovers[int(rng.integers(len(crossovers)))] if len(parents) > 1 else CLONE
        mutation = mutations[int(rng.integers(len(mutations)))]
        plan.append(Replacement(slot, tuple(parents), crossover, mutation))
    return plan
