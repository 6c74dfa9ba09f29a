"""Playing episodes: `evolve.backends.play_episodes` (per-proposal teacher credit, phase batching) and `populora_env.play`."""

from __future__ import annotations

from typing import Any

from evolve.backends import play_episodes
from evolve.ratings import MemberMatchmaker, RatingTable
from populora_env import teacher_student_v0
from populora_env.game import TeacherStudentConfig
from populora_env.text_format import format_answer, format_proposal


class ValidThenMalformed:
    """Attempt 0 of a round proposes the identity on 3 (valid; spelled anew each round: a task the buffer
    holds already is a duplicate); attempt 1 is malformed."""

    def __init__(self) -> None:
        self.made = 0

    def act(self, observation: Any, agent: str) -> str:
        if int(observation["attempt"]) == 0:
            self.made += 1
            return format_proposal("def f(x):\n    return x" + " * 1" * (self.made - 1), ["3"])
        return "no answer block"


class RightThenWrong:
    """Attempt 0 answers 3 (right for the identity on 3), attempt 1 answers 4 (wrong)."""

    def act(self, observation: Any, agent: str) -> str:
        return format_answer("deduction", "3" if int(observation["attempt"]) == 0 else "4")


class Batching:
    """Wraps a policy with an ``act_batch`` that logs each call's agents."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.calls: list[list[str]] = []

    def act(self, observation: Any, agent: str) -> Any:
        raise AssertionError("a batching policy is asked once per phase, never at its step")

    def act_batch(self, observations: list[Any], agents: list[str]) -> list[Any]:
        self.calls.append(list(agents))
        return [self.policy.act(o, a) for o, a in zip(observations, agents, strict=True)]


def play(verifier: Any, policies: dict[int, Any], **fields: Any) -> Any:
    config = TeacherStudentConfig(mode="text", n_teachers=1, n_students=1, rounds=2, task_types=("deduction",),
                                  teacher_group_size=2, student_group_size=2, **fields)  # fmt: skip
    matchmaker = MemberMatchmaker(RatingTable(), pfsp=False)
    env = teacher_student_v0.env(config=config, verifier=verifier, matchmaker=matchmaker)
    return play_episodes(env, matchmaker, policies, [{"teacher_0": 0, "student_0": 1}], [7])


def test_each_proposal_of_a_group_gets_its_own_reward(verifier: Any) -> None:
    outcome = play(verifier, {0: ValidThenMalformed(), 1: RightThenWrong()})
    teacher = outcome.transitions[0]
    # solve rate 1/2 -> AZR learnability 1 - 1/2 = 0.5 for the valid proposal; -1 for the malformed one
    # (the round's summed payout, -0.5, used to go to the last proposal and 0 to the first).
    assert [(int(t.observation["attempt"]), t.reward) for t in teacher] == [(0, 0.5), (1, -1.0)] * 2
    assert all(t.role == "teacher" and t.agent == "teacher_0" for t in teacher)
    assert teacher[0].action.startswith("<think>") and teacher[1].action == "no answer block"
    student = outcome.transitions[1]
    assert [t.reward for t in student] == [1.0, -0.5] * 2
    # the AEC returns still sum what each seat received
    assert sum(t.reward for t in teacher) == outcome.returns[0]["teacher"] == -1.0
    assert sum(t.reward for t in student) == outcome.returns[1]["student"] == 1.0


class Recording:
    """Wraps a policy with a ``sample_record`` that numbers its actions: what the policy knew when it acted."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.count = policy, 0

    def act(self, observation: Any, agent: str) -> Any:
        return self.policy.act(observation, agent)

    def sample_record(self, observation: Any, action: Any) -> Any:
        self.count += 1
        return {"n": self.count, "attempt": int(observation["attempt"]), "action": action}


def test_transitions_carry_the_acting_policys_sample_record(verifier: Any) -> None:
    """Each transition holds what its policy's ``sample_record`` returned at the moment it acted (so a
    learner elsewhere, a Ray actor, trains on what was sampled), in the order of the decisions, for a
    teacher's proposals paid at resolution as for a student's attempts credited at its next turn."""
    teacher, student = Recording(ValidThenMalformed()), Recording(RightThenWrong())
    outcome = play(verifier, {0: teacher, 1: student})
    for transitions in outcome.transitions.values():
        assert [t.sample["n"] for t in transitions] == list(range(1, len(transitions) + 1))
        assert all(
            t.sample["action"] == t.action and t.sample["attempt"] == int(t.observation["attempt"])
            for t in transitions
        )
    plain = play(verifier, {0: ValidThenMalformed(), 1: RightThenWrong()})
    assert all(t.sample is None for ts in plain.transitions.values() for t in ts)


class Answers:
    """A student that always answers ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, observation: Any, agent: str) -> str:
        return format_answer("deduction", self.text)


class OwnStudent(MemberMatchmaker):
    """teacher_i's proposals go to student_i only."""

    def assign(self, teachers: Any, students: Any, rng: Any) -> list[tuple[str, ...]]:
        return [(f"student_{teacher.rsplit('_', 1)[1]}",) for teacher in teachers]


def test_the_same_program_proposed_twice_is_matched_and_paid_per_proposal(verifier: Any) -> None:
    """Two teachers propose the same program (the identity on 3); teacher_0's goes to a student who solves
    it, teacher_1's to one who does not. Each proposal is paid from its own attempts (solve rate 1, then 0:
    -0.5 each); the attempts were pooled by task id (both paid for a solve rate of 1/2), and every attempt
    was rated once per proposal of that program, including a teacher_0 vs student_1 match never played."""
    config = TeacherStudentConfig(
        mode="text", n_teachers=2, n_students=2, rounds=1, task_types=("deduction",)
    )
    matchmaker = OwnStudent(RatingTable(), pfsp=False)
    env = teacher_student_v0.env(config=config, verifier=verifier, matchmaker=matchmaker)
    policies = {0: ValidThenMalformed(), 1: ValidThenMalformed(), 2: Answers("3"), 3: Answers("4")}
    seats = {"teacher_0": 0, "teacher_1": 1, "student_0": 2, "student_1": 3}
    outcome = play_episodes(env, matchmaker, policies, [seats], [7])
    assert [t.reward for t in outcome.transitions[0]] == [-0.5]
    assert [t.reward for t in outcome.transitions[1]] == [-0.5]
    assert sorted((r.teacher, r.student, r.solved) for r in outcome.results) == [(0, 2, True), (1, 3, False)]
    assert [t.reward for t in outcome.transitions[2]] == [1.0]  # right
    assert [t.reward for t in outcome.transitions[3]] == [-0.5]  # wrong


def test_batching_policies_answer_a_whole_phase_in_one_call(verifier: Any) -> None:
    plain = play(verifier, {0: ValidThenMalformed(), 1: RightThenWrong()})
    teacher, student = Batching(ValidThenMalformed()), Batching(RightThenWrong())
    batched = play(verifier, {0: teacher, 1: student})
    assert batched.transitions == plain.transitions and batched.returns == plain.returns
    # per round: one call for the two proposals, one for the two attempts at the valid task
    assert (
        teacher.calls == [["teacher_0", "teacher_0"]] * 2
        and student.calls == [["student_0", "student_0"]] * 2
    )


def test_populora_env_play_asks_batching_policies_once_per_phase(verifier: Any) -> None:
    """``populora_env.play`` uses ``act_batch`` as ``play_episodes`` does, with the same episode results."""
    from populora_env import play as play_env

    config = TeacherStudentConfig(mode="text", n_teachers=1, n_students=2, rounds=2, task_types=("deduction",),
                                  teacher_group_size=2, student_group_size=2)  # fmt: skip
    plain = {"teacher_0": ValidThenMalformed(), "student_0": RightThenWrong(), "student_1": RightThenWrong()}
    students = Batching(RightThenWrong())
    batched = {**plain, "teacher_0": ValidThenMalformed(), "student_0": students, "student_1": students}
    records = [
        play_env(teacher_student_v0.env(config=config, verifier=verifier), policies, episodes=2, seed=3)
        for policies in (plain, batched)
    ]
    assert records[0] == records[1]
    # per episode and round: one solve phase, both students' attempts (2 each) in AEC order, in one call
    assert students.calls == [["student_0", "student_0", "student_1", "student_1"]] * 4
