"""Selection: truncation, tournament, elitism and replacement plans on hand-made fitness vectors."""

from __future__ import annotations

import numpy as np
import pytest

from evolve.selection import (
    CLONE,
    Replacement,
    elites,
    plan_replacements,
    rank_order,
    tournament,
    truncation,
)


def test_rank_order_is_stable_and_best_first() -> None:
    assert rank_order([0.1, 0.5, 0.5, -1.0]) == [1, 2, 0, 3]


def test_rank_order_rejects_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        rank_order([0.0, float("nan")])


def test_tournament_rejects_nan() -> None:
    """A NaN member won or lost by its position (``tournament([nan, 1.0], 2)`` picked it; an audit)."""
    with pytest.raises(ValueError, match="NaN"):
        tournament([float("nan"), 1.0], 2, np.random.default_rng(0))


def test_truncation_counts_are_not_lost_to_floating_point() -> None:
    """``floor(fraction * n)`` as written: 0.29 * 100 is 28.999999999999996 as a float, but 29 members."""
    for fraction, n in ((0.29, 100), (0.35, 180), (0.07, 100), (0.5, 7), (0.25, 4)):
        top, bottom = truncation([float(i) for i in range(n)], fraction)
        expected = (round(fraction * 100) * n) // 100
        assert len(top) == len(bottom) == expected, (fraction, n)


def test_truncation_top_and_bottom() -> None:
    top, bottom = truncation([3.0, 1.0, 4.0, 1.5, 9.0, 2.0], 1 / 3)
    assert top == [4, 2]
    assert bottom == [1, 3]


@pytest.mark.parametrize("fraction", [-0.1, 0.6])
def test_truncation_rejects_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        truncation([1.0, 2.0], fraction)


def test_elites() -> None:
    assert elites([0.2, 0.9, 0.5], 2) == [1, 2]
    assert elites([0.2, 0.9, 0.5], 0) == []


def test_tournament_full_size_returns_best_of_candidates() -> None:
    rng = np.random.default_rng(0)
    fitness = [5.0, 1.0, 3.0, 4.0]
    assert tournament(fitness, 4, rng) == 0
    assert tournament(fitness, 10, rng, candidates=[1, 2, 3]) == 3


def test_tournament_ties_go_to_the_lower_tiebreak() -> None:
    """A mutation audit: a tie-break taken the wrong way round (the higher index or ``tiebreak`` value)
    went unnoticed. Two members tied at the top: the lower index wins, or the lower ``tiebreak`` value."""
    assert tournament([1.0, 1.0, 0.0], 3, np.random.default_rng(0)) == 0
    assert tournament([1.0, 1.0, 0.0], 3, np.random.default_rng(0), tiebreak=[1, 0, 2]) == 1


def test_tournament_pressure_favours_fitter() -> None:
    rng = np.random.default_rng(1)
    fitness = [0.0, 1.0, 2.0, 3.0]
    wins = np.bincount([tournament(fitness, 2, rng) for _ in range(2000)], minlength=4)
    # size-2 tournaments without replacement: P(win of rank r from the bottom) = r / C(4, 2)
    assert wins[0] == 0
    assert wins[3] > wins[2] > wins[1] > 0
    assert abs(wins[3] / 2000 - 0.5) < 0.05


def test_tournament_is_deterministic_for_a_seed() -> None:
    fitness = list(np.linspace(0, 1, 10))
    a = [tournament(fitness, 3, np.random.default_rng(7)) for _ in range(5)]
    b = [tournament(fitness, 3, np.random.default_rng(7)) for _ in range(5)]
    assert a == b


def test_plan_replaces_bottom_from_top_and_protects_elites() -> None:
    fitness = [0.9, 0.1, 0.5, 0.7, 0.2, 0.3, 0.8, 0.4]
    plan = plan_replacements(
        fitness, replace_fraction=0.25, n_elites=1, tournament_size=2, n_parents=2,
        crossovers=["es"], mutations=["gaussian"], rng=np.random.default_rng(0),
    )  # fmt: skip
    assert [p.slot for p in plan] == [1, 4]
    for p in plan:
        assert set(p.parents) <= {0, 6} and len(set(p.parents)) == 2
        assert (p.crossover, p.mutation) == ("es", "gaussian")


def test_plan_never_replaces_an_elite() -> None:
    plan = plan_replacements(
        [1.0, 0.0], replace_fraction=0.5, n_elites=2, tournament_size=2, n_parents=2,
        crossovers=["es"], mutations=["gaussian"], rng=np.random.default_rng(0),
    )  # fmt: skip
    assert plan == []


def test_plan_with_a_single_possible_parent_clones() -> None:
    plan = plan_replacements(
        [1.0, 0.0], replace_fraction=0.5, n_elites=0, tournament_size=2, n_parents=2,
        crossovers=["es"], mutations=["gaussian"], rng=np.random.default_rng(0),
    )  # fmt: skip
    assert len(plan) == 1 and plan[0].slot == 1 and plan[0].parents == (0,) and plan[0].crossover == CLONE


def test_plan_lists_parents_best_first() -> None:
    """The lineage's parents[0] is the one whose rating a child inherits: it was whichever won its
    tournament first (a less fit parent for 334 children in 800)."""
    fitness = [0.1, 0.9, 0.8, 0.7, 0.6, 0.2, 0.3, 0.0]
    for seed in range(100):
        plan = plan_replacements(fitness, replace_fraction=0.5, n_elites=0, tournament_size=2, n_parents=2,
                                 crossovers=["x"], mutations=["m"], rng=np.random.default_rng(seed))  # fmt: skip
        for step in plan:
            assert [fitness[p] for p in step.parents] == sorted(
                (fitness[p] for p in step.parents), reverse=True
            )


def test_plan_breaks_fitness_ties_at_random_not_by_slot() -> None:
    """Ties are common (a solve rate over a few attempts): the slot order sent the highest slots, where
    children land, out first every time. The random order comes from the plan's generator."""
    fitness = [0.5] * 8
    replaced = np.zeros(8, dtype=int)
    for seed in range(400):
        plan = plan_replacements(fitness, replace_fraction=0.25, n_elites=0, tournament_size=2, n_parents=2,
                                 crossovers=["x"], mutations=["m"], rng=np.random.default_rng(seed))  # fmt: skip
        for step in plan:
            replaced[step.slot] += 1
    assert replaced.sum() == 800 and replaced.min() > 60, replaced  # ~100 each, not all on slots 6 and 7
    again = [plan_replacements(fitness, replace_fraction=0.25, n_elites=0, tournament_size=2, n_parents=2,
                               crossovers=["x"], mutations=["m"], rng=np.random.default_rng(3)) for _ in range(2)]  # fmt: skip
    assert again[0] == again[1]


def test_plan_over_the_evaluated_members_replaces_the_groups_share() -> None:
    """With one member of four not evaluated, floor(0.25 * 3) replaced nobody: the count is the whole
    group's share, at most half of the members evaluated."""
    kwargs = dict(replace_fraction=0.25, n_elites=0, tournament_size=2, n_parents=2, crossovers=["x"],
                  mutations=["m"])  # fmt: skip
    plan = plan_replacements([0.1, 0.5, 0.9], rng=np.random.default_rng(0), of=4, **kwargs)  # type: ignore[arg-type]
    # a mutation audit: the top pool (here the one best member) is widened to n_parents, so the child
    # has two parents, best first, and a crossover, not a clone of the best alone
    assert plan == [Replacement(0, (2, 1), "x", "m")]
    assert plan_replacements([0.1, 0.5, 0.9], rng=np.random.default_rng(0), **kwargs) == []  # type: ignore[arg-type]
    assert len(plan_replacements([0.1, 0.5], rng=np.random.default_rng(0), of=8, **kwargs)) == 1  # type: ignore[arg-type]


def test_plan_parents_win_tournaments_of_the_given_size() -> None:
    """A mutation audit: parents drawn by tournaments of one (uniformly from the top) went unnoticed. Ten
    top members, tournaments of three without replacement: the best of them wins about 3 in 10, the
    worst of them never (it loses to any other entrant); uniform draws would give each 1 in 10."""
    fitness = [float(i) for i in range(20)]  # the top half is members 10 to 19
    wins = np.zeros(20, dtype=int)
    for seed in range(100):
        plan = plan_replacements(fitness, replace_fraction=0.5, n_elites=0, tournament_size=3, n_parents=1,
                                 crossovers=["x"], mutations=["m"], rng=np.random.default_rng(seed))  # fmt: skip
        for step in plan:
            assert len(step.parents) == 1 and step.crossover == CLONE
            wins[step.parents[0]] += 1
    assert wins.sum() == 1000 and wins[:10].sum() == 0
    assert wins[10] == 0 and wins[19] > 250, wins
