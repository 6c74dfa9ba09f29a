"""OpenSkill ratings by member id, the member matchmaker's PFSP feed, and lineage helpers."""

from __future__ import annotations

import numpy as np

from evolve.lineage import LineageRecord, ancestors, operator_use
from evolve.ratings import MatchResult, MemberMatchmaker, Rating, RatingTable


def test_winner_gains_and_loser_drops() -> None:
    table = RatingTable()
    prior = table.default
    table.update([MatchResult(teacher=0, student=1, solved=True)])
    assert table.get(1).mu > prior.mu > table.get(0).mu
    assert table.get(0).sigma < prior.sigma and table.get(1).sigma < prior.sigma


def test_repeated_results_separate_ratings_and_order_matters_deterministically() -> None:
    results = [MatchResult(0, 1, i % 3 != 0) for i in range(30)]
    a, b = RatingTable(), RatingTable()
    a.update(results)
    b.update(results)
    assert a.state() == b.state()
    assert a.get(1).ordinal > a.get(0).ordinal


def test_ordinal_is_the_conservative_skill() -> None:
    """A mutation audit: ``mu + 3 sigma`` for the ordinal went unnoticed (only its order on ratings of like
    sigma was checked). It is ``mu - 3 sigma``: of two members of one ``mu`` the uncertain one ranks lower."""
    assert Rating(25.0, 8.0).ordinal == 1.0
    assert Rating(25.0, 8.0).ordinal < Rating(25.0, 1.0).ordinal == 22.0


def test_self_matches_are_not_rated() -> None:
    table = RatingTable()
    table.update([MatchResult(4, 4, True)])
    assert table.state() == {}


def test_state_roundtrip_and_inherit() -> None:
    table = RatingTable()
    table.update([MatchResult(0, 1, False), MatchResult(0, 2, True)])
    again = RatingTable.from_state(table.state())
    assert again.state() == table.state()
    table.inherit(7, parent=2)
    assert table.get(7).mu == table.get(2).mu and table.get(7).sigma == table.default.sigma
    table.forget(7)
    assert 7 not in table.state()


def test_matchmaker_records_member_ids_and_prefers_balanced_matchups() -> None:
    table = RatingTable()
    # member 10 (teacher) is evenly matched with 20 and far above 21
    for _ in range(40):
        table.update([MatchResult(10, 21, False)])
    maker = MemberMatchmaker(table, per_task=1, pfsp=True)
    maker.seat({"teacher_0": 10, "student_0": 20, "student_1": 21})
    rng = np.random.default_rng(0)
    picks = [maker.assign(["teacher_0"], ["student_0", "student_1"], rng)[0] for _ in range(300)]
    assert picks.count(("student_0",)) > 3 * picks.count(("student_1",))
    maker.update([("teacher_0", "student_1", True)])
    assert maker.drain() == [MatchResult(10, 21, True)]
    assert maker.drain() == []


def test_pfsp_does_not_match_a_self_play_member_with_itself() -> None:
    """A member's own student seat rates as an even match, PFSP's heaviest weight: half the tasks went to
    their proposer (more as ratings spread), and self-attempts are not rated. Its own seat is left out
    while there is another; a 1x1 game keeps its only seat."""
    table = RatingTable()
    for _ in range(20):
        table.update([MatchResult(1, 2, False)])  # member 1 well above member 2
    maker = MemberMatchmaker(table, per_task=1, pfsp=True)
    maker.seat({"teacher_0": 1, "teacher_1": 2, "student_0": 1, "student_1": 2})
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert maker.assign(["teacher_0", "teacher_1"], ["student_0", "student_1"], rng) == [
            ("student_1",),
            ("student_0",),
        ]
    maker.seat({"teacher_0": 1, "student_0": 1})
    assert maker.assign(["teacher_0"], ["student_0"], rng) == [("student_0",)]


def test_pfsp_gives_every_task_its_students_when_one_teacher_has_only_its_own_seat() -> None:
    """A mutation audit: the self-play guard's "as long as every teacher has another student" was not
    checked with one that has none. The only student seat is teacher_0's own member, teacher_1's is
    another: leaving teacher_0 no student would be no match at all, so PFSP runs on every student seat and
    each task gets its student."""
    maker = MemberMatchmaker(RatingTable(), per_task=1, pfsp=True)
    maker.seat({"teacher_0": 1, "teacher_1": 2, "student_0": 1})
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert maker.assign(["teacher_0", "teacher_1"], ["student_0"], rng) == [("student_0",)] * 2


def test_matchmaker_all_pairs_without_pfsp() -> None:
    maker = MemberMatchmaker(RatingTable(), pfsp=False)
    out = maker.assign(["teacher_0", "teacher_1"], ["student_0", "student_1"], np.random.default_rng(0))
    assert out == [("student_0", "student_1")] * 2


def test_lineage_ancestors_and_operator_use() -> None:
    records = [
        LineageRecord(0, "student", -1, "initial"),
        LineageRecord(1, "student", -1, "initial"),
        LineageRecord(2, "student", 0, "offspring", (0, 1), "es", "gaussian", 1),
        LineageRecord(3, "student", 1, "offspring", (2,), "clone", "gaussian", 0),
    ]
    assert ancestors(3, records) == {0, 1, 2}
    assert operator_use(records) == {"crossover:clone": 1, "crossover:es": 1, "mutation:gaussian": 2}
    assert LineageRecord.from_json(records[2].to_json()) == records[2]
