"""SingleRoleEnv under Gymnasium's and SB3's env checkers, plus play() and the human policy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from populora_env import teacher_student_v0
from populora_env.play import play
from populora_env.policies import (
    ExecutingStudent,
    HumanPolicy,
    RandomPolicy,
    ReferenceStudent,
    ScriptedTeacher,
)
from populora_env.wrappers import SingleRoleEnv


def _structured(verifier, **kw):
    return teacher_student_v0.env(
        verifier=verifier, mode="structured", n_teachers=1, n_students=1, rounds=2, **kw
    )


def _student_env(verifier, **kw):
    env = _structured(verifier, **kw)
    return SingleRoleEnv(env, "student_0", {"teacher_0": ScriptedTeacher(env, 0.5, seed=0)})


def _teacher_env(verifier, **kw):
    env = _structured(verifier, **kw)
    return SingleRoleEnv(env, "teacher_0", {"student_0": ExecutingStudent(env, 0.5, seed=0)})


def test_single_role_env_refuses_no_resets_at_all(verifier):
    """``max_empty_resets=0`` was accepted, then every reset failed with "got no turn in 0 episodes"."""
    env = _structured(verifier)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match=rf"max_empty_resets must be an int >= 1, got {bad!r}"):
            SingleRoleEnv(
                env, "student_0", {"teacher_0": ScriptedTeacher(env, 0.5, seed=0)}, max_empty_resets=bad
            )


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("make", [_student_env, _teacher_env], ids=["student", "teacher"])
def test_gymnasium_check_env(verifier, make):
    check_env(make(verifier), skip_render_check=True)


@pytest.mark.parametrize("render_mode", ["ansi", "human"])
def test_gymnasium_check_env_with_each_render_mode(verifier, render_mode, capsys):
    """The wrapper takes the env's render mode, and declared ``ansi`` only: with ``human`` Gymnasium's
    checker refused it as unsupported (an audit)."""
    check_env(_student_env(verifier, render_mode=render_mode))
    assert SingleRoleEnv.metadata["render_modes"] == teacher_student_v0.raw_env.metadata["render_modes"]


def test_gymnasium_check_env_text_roles(verifier):
    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=1, rounds=2)
    check_env(
        SingleRoleEnv(env, "teacher_0", {"student_0": ReferenceStudent(env, 0.5)}), skip_render_check=True
    )
    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=1, rounds=2)
    check_env(
        SingleRoleEnv(env, "student_0", {"teacher_0": ScriptedTeacher(env, 0.5)}), skip_render_check=True
    )


@pytest.mark.parametrize("make", [_student_env, _teacher_env], ids=["student", "teacher"])
def test_sb3_check_env(verifier, make):
    sb3_env_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    # SB3's checker samples actions without the mask: masked candidates must pay, not raise
    sb3_env_checker.check_env(make(verifier, illegal_action="penalize"), warn=False)


def test_single_role_rewards_and_masks(verifier):
    env = _student_env(verifier)
    obs, info = env.reset(seed=5)
    assert obs["phase"] == 2 and obs["action_mask"].any()
    assert np.array_equal(env.action_masks(), obs["action_mask"].astype(bool))
    total, done = 0.0, False
    while not done:
        task = env.aec_env.unwrapped.current_turn.task
        right = next(i for i, c in enumerate(task.candidates) if c.correct)
        obs, reward, done, truncated, info = env.step(right)
        assert reward == 1.0 and info["verdict"] == "correct" and not truncated
        total += reward
    assert total >= 1.0 and obs["phase"] == 0  # idle view after the end
    teacher = _teacher_env(verifier)
    teacher.reset(seed=0)
    assert teacher.action_masks().shape == (int(teacher.action_space.nvec.sum()),)
    with pytest.raises(ValueError, match="missing"):
        SingleRoleEnv(env.aec_env, "student_0", {})


def test_play_random_policies_both_modes(verifier):
    for mode in ("text", "structured"):
        env = teacher_student_v0.env(verifier=verifier, mode=mode, rounds=2)
        policies = {a: RandomPolicy(env, seed=i) for i, a in enumerate(env.possible_agents)}
        first = play(env, policies, episodes=2, seed=3)
        for i, a in enumerate(env.possible_agents):
            policies[a].reseed(i)
        second = play(env, policies, episodes=2, seed=3)
        assert first == second and [r.seed for r in first] == [3, 4]
        if mode == "text":  # random text is never well formed
            assert first[0].metrics.format_error_rate == 1.0
            assert first[0].returns["teacher_0"] == -2.0


def test_human_policy_reads_terminal(verifier):
    env = teacher_student_v0.env(
        verifier=verifier, n_teachers=1, n_students=1, rounds=1, task_types=("deduction",)
    )
    lines = iter(
        [
            "<answer>",
            "```python",
            "def f(x):",
            "    return x",
            "```",
            "```input",
            "3",
            "```",
            "</answer>",
            ".",
        ]
    )
    shown = []
    human = HumanPolicy(env, input_fn=lambda _: next(lines), print_fn=shown.append)
    env.reset(seed=0)
    obs, *_ = env.last()
    env.step(human.act(obs, "teacher_0"))
    assert env.unwrapped.infos["teacher_0"]["verdict"] == "valid"
    assert "Propose a deduction task" in shown[0]


def test_human_policy_structured_reprompts(verifier):
    env = teacher_student_v0.env(verifier=verifier, mode="structured", n_teachers=1, n_students=1, rounds=1)
    env.reset(seed=0)
    nvec = env.action_space("teacher_0").nvec
    good = " ".join("0" for _ in nvec)
    # "²" is a digit to str.isdigit, not to int: the policy crashed instead of asking again (an audit)
    lines = iter(["1 2", "x", " ".join("\u00b2" for _ in nvec), good])
    shown = []
    human = HumanPolicy(env, input_fn=lambda _: next(lines), print_fn=shown.append)
    action = human.act(env.observe("teacher_0"), "teacher_0")
    assert action.tolist() == [0] * len(nvec) and sum("please" in m for m in shown) == 3
    env.step(ScriptedTeacher(env, 1.0, seed=0).act(env.observe("teacher_0"), "teacher_0"))
    assert env.agent_selection == "student_0", env.infos["teacher_0"]
    lines = iter(["--1", "-\u00b2", "\u00b2", "x", "0"])
    shown.clear()
    assert human.act(env.observe("student_0"), "student_0") == 0
    assert sum("please" in m for m in shown) == 4
