"""Golden playthroughs: scripted actions with every reward, verdict and metric asserted exactly."""

from __future__ import annotations

import pytest

from populora_env import teacher_student_v0
from populora_env.play import Policy, play
from populora_env.policies import ExecutingStudent, ReferenceStudent, ScriptedTeacher
from populora_env.text_format import format_answer, format_proposal

DOUBLE = "def f(x):\n    return x * 2"
PROPOSALS = {
    ("teacher_0", 0): format_proposal("def f(x):\n    return x + 1", ["3"]),  # deduction
    ("teacher_1", 0): format_proposal("def f(x):\n    return x % 3", ["5"]),  # abduction
    ("teacher_0", 1): format_proposal(DOUBLE, ["1", "2", "3", "4"], message="doubles"),  # induction
    ("teacher_1", 1): format_proposal("def f(x):\n    return x // 0", ["1"]),  # deduction, invalid
}
ANSWERS = {
    ("student_0", 0, "deduction"): format_answer("deduction", "4"),
    ("student_0", 0, "abduction"): format_answer("abduction", "8"),  # not the gold 5: any input counts
    ("student_1", 0, "deduction"): format_answer("deduction", "5"),
    ("student_1", 0, "abduction"): format_answer("abduction", "3"),
    ("student_0", 1, "induction"): format_answer("induction", "def f(x):\n    return x + x"),
    ("student_1", 1, "induction"): "I think it doubles",  # malformed
}


class Script:
    """Plays the tables above, keyed by the env's pending turn."""

    def __init__(self, env):
        self.env = env

    def act(self, observation, agent):
        turn = self.env.unwrapped.current_turn
        if turn.phase == "propose":
            return PROPOSALS[(agent, turn.round)]
        return ANSWERS[(agent, turn.round, turn.task_type)]


def test_golden_text_playthrough(verifier):
    env = teacher_student_v0.env(verifier=verifier, n_teachers=2, n_students=2, rounds=2, n_seed_tasks=2)
    script = Script(env)
    assert isinstance(script, Policy)
    env.reset(seed=7)
    steps = []
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        env.step(script.act(None, agent))
        info = env.infos[agent]
        steps.append(
            (agent, info["phase"], info["task_type"], info["verdict"], info["status"], env.rewards[agent])
        )
    assert steps == [
        ("teacher_0", "propose", "deduction", "valid", "ok", 0.0),
        ("teacher_1", "propose", "abduction", "valid", "ok", 0.0),
        ("student_0", "solve", "deduction", "correct", "ok", 1.0),
        ("student_0", "solve", "abduction", "correct", "ok", 1.0),
        ("student_1", "solve", "deduction", "wrong", "ok", -0.5),
        ("student_1", "solve", "abduction", "wrong", "ok", -0.5),
        ("teacher_0", "propose", "induction", "valid", "ok", 0.0),
        ("teacher_1", "propose", "deduction", "invalid", "runtime", 0.0),
        ("student_0", "solve", "induction", "correct", "ok", 1.0),
        ("student_1", "solve", "induction", "format_error", "no_answer", -1.0),
    ]


def test_golden_returns_infos_and_metrics(verifier):
    env = teacher_student_v0.env(verifier=verifier, n_teachers=2, n_students=2, rounds=2, n_seed_tasks=2)
    script = Script(env)
    (record,) = play(env, dict.fromkeys(env.possible_agents, script), episodes=1, seed=7)
    # round 0: each task solved by 1 of 2 students -> learnability 1 - 0.5; round 1: induction 1 of 2,
    # teacher_1's program raises -> invalid -1.
    assert record.returns == {"teacher_0": 1.0, "teacher_1": -0.5, "student_0": 3.0, "student_1": -2.0}
    assert record.steps == 10
    m = record.metrics
    assert m.n_proposals == 4 and m.invalid_rate == 0.25 and m.format_error_rate == 0.0
    assert m.teacher_solve_rate == {"teacher_0": 0.5, "teacher_1": 0.5}
    assert m.student_solve_rate == {"student_0": 1.0, "student_1": 0.0}
    assert m.solve_rate == 0.5 and m.coverage == 3 and m.mean_lines == 2.0
    assert m.rejections == {"invalid/runtime": 1}  # why the one invalid proposal was turned away


def test_golden_infos_carry_gold_and_solve_rates(verifier):
    raw = teacher_student_v0.raw_env(verifier=verifier, n_teachers=2, n_students=2, rounds=2, n_seed_tasks=2)
    script = Script(raw)
    raw.reset(seed=7)
    for _ in range(6):  # round 0
        raw.step(script.act(None, raw.agent_selection))
    assert (
        "gold" not in raw.infos["student_1"]
    )  # a student's step info holds no gold answer: its resolved entries
    resolved = raw.infos["teacher_1"]["resolved"]
    assert [(r["verdict"], r["solve_rate"], r["reward"], r["gold"], r["n_attempts"]) for r in resolved] == [
        ("valid", 0.5, 0.5, "5", 2)
    ]
    assert raw.infos["teacher_0"]["resolved"][0]["gold"] == "4"
    assert (raw.infos["student_0"]["verdict"], raw.infos["student_0"]["task_type"]) == (
        "correct",
        "abduction",
    )
    keys = ("teacher", "task_type", "solve_rate", "n_attempts", "gold", "own_attempts", "own_correct")
    for student, correct in (("student_0", 1), ("student_1", 0)):  # student_0 solved both, student_1 neither
        assert [tuple(r[k] for k in keys) for r in raw.infos[student]["resolved"]] == [
            ("teacher_0", "deduction", 0.5, 2, "4", 1, correct),
            ("teacher_1", "abduction", 0.5, 2, "5", 1, correct),
        ]
    assert raw.agent_selection == "teacher_0" and raw.observe("teacher_0")["prompt"].startswith(
        "## Propose a induction task"
    )
    for _ in range(4):
        raw.step(script.act(None, raw.agent_selection))
    (bad,) = raw.infos["teacher_1"]["resolved"]
    assert (bad["verdict"], bad["status"], bad["reward"], bad["solve_rate"]) == (
        "invalid",
        "runtime",
        -1.0,
        None,
    )
    assert all(raw.terminations.values())


@pytest.mark.parametrize(
    ("scheme", "extreme", "teacher_return"),
    [("learnability", -0.5, -1.0), ("learnability", 0.0, 0.0), ("adversarial", -0.5, 0.0)],
)
def test_always_solved_tasks_pay_per_scheme(verifier, scheme, extreme, teacher_return):
    """AZR's single-agent baseline shape: a 1x1 game whose student always answers with the gold."""
    env = teacher_student_v0.env(
        verifier=verifier,
        n_teachers=1,
        n_students=1,
        rounds=2,
        task_types=("deduction",),
        reward_scheme=scheme,
        teacher_extreme_reward=extreme,
        n_seed_tasks=2,
    )
    policies = {
        "teacher_0": ScriptedTeacher(env, difficulty=0.3, seed=1),
        "student_0": ReferenceStudent(env, 1.0),
    }
    (record,) = play(env, policies, seed=0)
    assert record.metrics.invalid_rate == 0.0  # scripted DSL programs are always valid here
    assert record.returns == {"teacher_0": teacher_return, "student_0": 2.0}


def test_structured_scripted_round_rewards_match_infos(verifier):
    env = teacher_student_v0.env(verifier=verifier, mode="structured", n_teachers=2, n_students=2, rounds=3)
    policies = {
        "teacher_0": ScriptedTeacher(env, 0.2, seed=0),
        "teacher_1": ScriptedTeacher(env, 0.9, seed=1),
        "student_0": ExecutingStudent(env, skill=1.0, seed=0),
        "student_1": ExecutingStudent(env, skill=0.0, seed=1),
    }
    (record,) = play(env, policies, seed=4)
    history = env.unwrapped._game.history
    for teacher in ("teacher_0", "teacher_1"):
        assert record.returns[teacher] == pytest.approx(
            sum(r.reward for r in history if r.teacher == teacher)
        )
    assert record.metrics.student_solve_rate["student_0"] == 1.0
    assert record.returns["student_0"] == 1.0 * sum(r.n_attempts for r in history) / 2


class WrongCandidate:
    """Picks the first candidate the env marked incorrect (privileged: reads the pending turn's task)."""

    def __init__(self, env):
        self.env = env

    def act(self, observation, agent):
        task = self.env.unwrapped.current_turn.task
        return next(i for i, c in enumerate(task.candidates) if not c.correct)


def test_structured_golden_round_rewards(verifier):
    """Structured mode, exact figures: scripted teachers' six DSL proposals are all valid; one student always
    right, one always wrong, so every solve rate is 1/2: learnability pays each proposal 1 - 1/2."""
    env = teacher_student_v0.env(verifier=verifier, mode="structured", n_teachers=2, n_students=2, rounds=3)
    policies = {
        "teacher_0": ScriptedTeacher(env, 0.2, seed=0),
        "teacher_1": ScriptedTeacher(env, 0.9, seed=1),
        "student_0": ExecutingStudent(env, skill=1.0, seed=0),
        "student_1": WrongCandidate(env),
    }
    # a seed whose six tasks each have a wrong candidate (a constant function's abduction task has none)
    (record,) = play(env, policies, seed=5)
    history = env.unwrapped._game.history
    assert [(r.teacher, r.verdict, r.solve_rate, r.n_attempts, r.reward) for r in history] == [
        (t, "valid", 0.5, 2, 0.5) for _ in range(3) for t in ("teacher_0", "teacher_1")
    ]
    assert record.returns == {"teacher_0": 1.5, "teacher_1": 1.5, "student_0": 6.0, "student_1": -3.0}
    assert record.steps == 3 * (2 + 2 * 2)
    assert record.metrics.student_solve_rate == {"student_0": 1.0, "student_1": 0.0}


def test_a_student_sees_the_gold_answer_only_when_the_round_resolves(verifier):
    """With a GRPO group of attempts, the gold answer in a student's step info would let its later attempts
    copy it, and with two proposals of the same program and input in a round (a teacher's GRPO group sampled
    at low temperature, or two teachers) its attempts at the second copy (a red-team review's finding): no step
    info holds it; the round's resolution lists it, once every attempt is made."""
    from populora_env.text_format import format_answer, format_proposal

    env = teacher_student_v0.env(
        verifier=verifier,
        n_teachers=1,
        n_students=1,
        rounds=2,
        teacher_group_size=2,
        student_group_size=3,
        task_types=("deduction",),
        n_seed_tasks=0,
    )
    env.reset(seed=0)
    for _ in range(2):
        env.step(format_proposal("def f(x):\n    return x * 7 + 3", ["5"]))
    seen = []
    for _ in range(6):
        assert env.agent_selection == "student_0"
        _, _, _, _, info = env.last()
        seen.append((info.get("gold"), [r["gold"] for r in info.get("resolved", [])]))
        env.step(format_answer("deduction", "0"))
    assert seen == [(None, [])] * 6
    assert env.agent_selection == "teacher_0"  # the next round: the resolution is in the student's info
    assert [r["gold"] for r in env.unwrapped.infos["student_0"]["resolved"]] == ["38", "38"]
    assert "gold" not in env.unwrapped.infos["student_0"]
