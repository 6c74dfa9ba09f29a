"""PettingZoo's own conformance tests on TeacherStudent-v0 with the real verifier, over several configs."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, render_test, seed_test
from pettingzoo.utils import BaseWrapper

from populora_env import teacher_student_v0
from populora_env.policies import ExecutingStudent, ReferenceStudent, ScriptedTeacher
from populora_env.registry import ENV_ID, register_envs
from populora_env.text_format import format_answer, format_proposal

CONFIGS = [
    pytest.param({"n_teachers": 1, "n_students": 1}, id="1x1-all-types"),
    pytest.param({"n_teachers": 2, "n_students": 3, "matching": "random"}, id="2x3-random"),
    pytest.param({"task_types": ("deduction",)}, id="deduction"),
    pytest.param({"task_types": ("abduction",), "matching": "pfsp"}, id="abduction-pfsp"),
    pytest.param({"task_types": ("induction",), "teacher_group_size": 2}, id="induction-groups"),
]
MODES = ["text", "structured"]


def _kwargs(verifier, mode, extra):
    return {"verifier": verifier, "mode": mode, "rounds": 2, "n_seed_tasks": 4, **extra}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # api_test's advice on Dict/Text spaces
        yield


class ValidTeachers(BaseWrapper):
    """Random text never forms a valid proposal, so in text mode PettingZoo's tests alone would never reach a
    student: this wrapper replaces every teacher action of even length (a function of the sampled action,
    so seeded runs stay reproducible) with a scripted teacher's valid proposal."""

    def __init__(self, env):
        super().__init__(env)
        self._teacher = ScriptedTeacher(env, 0.3, seed=0)

    def reset(self, seed=None, options=None):
        self._teacher.reseed(0 if seed is None else seed)
        super().reset(seed=seed, options=options)

    def step(self, action):
        agent = self.agent_selection
        if agent.startswith("teacher") and isinstance(action, str) and len(action) % 2 == 0:
            action = self._teacher.act(self.observe(agent), agent)
        super().step(action)


def _make(verifier, mode, extra, render_mode=None):
    env = teacher_student_v0.env(render_mode=render_mode, **_kwargs(verifier, mode, extra))
    return ValidTeachers(env) if mode == "text" else env


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", CONFIGS)
def test_api_and_seed(verifier, mode, extra):
    api_test(_make(verifier, mode, extra), num_cycles=40)
    seed_test(lambda: _make(verifier, mode, extra), num_cycles=40)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", CONFIGS)
def test_parallel_api(verifier, mode, extra):
    parallel_api_test(teacher_student_v0.parallel_env(**_kwargs(verifier, mode, extra)), num_cycles=40)


def test_parallel_env_says_what_its_step_takes(verifier):
    """PettingZoo's turn-based wrapper raised a bare KeyError, TypeError or AttributeError (a robustness review)."""
    env = teacher_student_v0.parallel_env(**_kwargs(verifier, "text", {}))
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step({"teacher_0": "x"})
    env.reset(seed=0)
    with pytest.raises(TypeError, match="actions must be a dict of agent -> action, got a str"):
        env.step("x")
    with pytest.raises(ValueError, match="actions must hold the acting agent 'teacher_0'"):
        env.step({"nobody": "x"})
    observations, rewards, *_ = env.step({"teacher_0": "not a proposal"})  # a format error, played
    assert rewards["teacher_0"] == 0.0 and "teacher_0" in observations


def test_parallel_env_infos_name_the_acting_agent_from_reset_and_are_not_changed_later(verifier):
    """``infos[agent]["active_agent"]``, which the step's error points to, was missing after ``reset``; a step's
    infos were the AEC env's own dicts, changed by the next step; and after the episode's end ``step``
    returned four values (PettingZoo 1.27's wrapper; an audit)."""
    env = teacher_student_v0.parallel_env(verifier=verifier, n_teachers=2, n_students=1, rounds=2)
    _, infos = env.reset(seed=0)
    assert {infos[agent]["active_agent"] for agent in env.agents} == {"teacher_0"}, infos
    *_, infos = env.step({"teacher_0": "not a proposal"})
    kept = copy.deepcopy(infos)
    *_, later = env.step({infos[env.agents[0]]["active_agent"]: "x"})
    assert infos == kept  # the returned dicts are the caller's
    assert all("active_agent" not in info for info in env.aec_env.infos.values())
    while env.agents:
        *_, later = env.step({later[env.agents[0]]["active_agent"]: "x"})
    assert env.step({}) == ({}, {}, {}, {}, {})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", CONFIGS)
def test_render(verifier, mode, extra):
    render_test(
        lambda render_mode=None: _make(verifier, mode, extra, render_mode),
        custom_tests={"ansi": lambda text: "== round 0" in text},
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", CONFIGS)
def test_random_play_reaches_students(verifier, mode, extra):
    """The games the tests above play really reach the students (in text mode through ``ValidTeachers``), and
    every observation is in its space."""
    env = _make(verifier, mode, {**extra, "rounds": 6})
    env.reset(seed=3)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)  # the actions, and so which teacher actions ValidTeachers replaces
    phases = []
    for agent in env.agent_iter():
        obs, _, term, trunc, info = env.last()
        assert env.observation_space(agent).contains(obs)
        phases.append(info.get("phase"))
        action = env.action_space(agent).sample(obs.get("action_mask") if mode == "structured" else None)
        env.step(None if term or trunc else action)
    assert "solve" in phases


@pytest.mark.parametrize("mode", MODES)
def test_ansi_render_shows_proposals_verdicts_answers_and_rewards(verifier, mode):
    env = teacher_student_v0.env(
        verifier=verifier, mode=mode, n_teachers=2, n_students=2, rounds=1, render_mode="ansi",
        task_types=("deduction", "induction"),
    )  # fmt: skip
    teacher = ScriptedTeacher(env, 0.4, seed=0)
    student = ReferenceStudent(env, 1.0) if mode == "text" else ExecutingStudent(env, 1.0)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        env.step(
            None if term or trunc else (teacher if agent.startswith("teacher") else student).act(obs, agent)
        )
    text = env.render()
    proposal = env.unwrapped._game.history[0]
    assert proposal.verdict == "valid" and proposal.task is not None
    assert f"program: {proposal.task.program.splitlines()[0]}" in text
    assert f"input:   {proposal.task.inputs[0]}" in text  # the deduction proposal
    assert "inputs:  " in text  # the induction proposal's inputs
    assert f"answer:  {'[' if mode == 'structured' else ''}" in text
    assert "solve   deduction #0 correct" in text and "reward=+1.00" in text
    assert f"resolve deduction #0 valid        solve_rate={proposal.solve_rate:.2f}" in text
    if mode == "text":  # an invalid proposal shows its program too; a format error shows its reason
        env.reset(seed=1)
        env.step(format_proposal("def f(x):\n    return 1 / x", ["0"]))
        env.step("no answer tags")
        text = env.render()
        assert "invalid      runtime" in text and "program: def f(x):" in text and "input:   0" in text
        assert "format_error no_answer" in text


def test_registry_make(verifier):
    register_envs()
    register_envs()  # idempotent
    env = pettingzoo.make("aec", ENV_ID, n_teachers=2, n_students=2, verifier=verifier)
    assert isinstance(env.unwrapped, teacher_student_v0.raw_env)
    assert env.unwrapped.possible_agents == ["teacher_0", "teacher_1", "student_0", "student_1"]
    par = pettingzoo.make("parallel", ENV_ID, verifier=verifier)
    obs, _infos = par.reset(seed=0)
    assert list(obs) == par.agents


def test_spaces_are_stable_and_text_is_printable(verifier):
    env = teacher_student_v0.raw_env(verifier=verifier)
    space = env.observation_space("teacher_0")["prompt"]
    assert env.observation_space("teacher_0") is env.observation_space("teacher_0")
    assert env.action_space("student_0") is env.action_space("student_0")
    assert space.min_length == 0 and "\n" in space.character_set and "{" in space.character_set
    env.reset(seed=0)
    obs = env.observe("teacher_0")
    assert obs["prompt"].startswith("## Propose a deduction task")
    assert env.observation_space("teacher_0").contains(obs)


def test_wrong_agent_and_after_end_errors(verifier, caplog):
    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=1, rounds=1)
    with pytest.raises(AssertionError, match="reset"):
        env.step("x")  # before reset: PettingZoo's order enforcing
    with pytest.raises(AttributeError, match="before reset"):
        env.last()
    env.reset(seed=0)
    for _agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else "junk")
    assert env.agents == []
    env.step(None)  # after the end: PettingZoo's logged warning, nothing stepped
    assert "step() called after all agents are terminated" in caplog.text
    raw = teacher_student_v0.raw_env(verifier=verifier, n_teachers=1, n_students=1, rounds=1)
    raw.reset(seed=0)
    raw.step("junk")  # teacher's malformed proposal ends the 1-round game
    with pytest.raises(ValueError, match="only valid action is None"):
        raw.step("more junk")
    # the raw env says what is wrong where it raised a bare KeyError or AssertionError (red-team round 33);
    # under python -O the assert let the student's action be played, and charged, as the teacher's
    with pytest.raises(RuntimeError, match="call reset"):
        teacher_student_v0.raw_env(verifier=verifier, n_teachers=1, n_students=1).step("x")
    for _agent in raw.agent_iter():
        raw.step(None)
    assert raw.agents == []
    with pytest.raises(RuntimeError, match=r"step\(\) after the episode ended .* call reset"):
        raw.step(None)
    with pytest.raises(RuntimeError, match=r"last\(\) after the episode ended .* call reset"):
        raw.last()
    raw.reset(seed=0)
    raw.agent_selection = "student_0"
    with pytest.raises(RuntimeError, match="agent_selection is 'student_0', but it is teacher_0's turn"):
        raw.step("an answer")
    raw.agent_selection = "nobody"
    with pytest.raises(RuntimeError, match="agent_selection is 'nobody', not an agent of this episode"):
        raw.step("an answer")
    raw.agent_selection = "teacher_0"
    raw.step("junk")  # the game was left as it was
    assert raw.infos["teacher_0"]["verdict"] == "format_error"


def test_structured_illegal_actions(verifier):
    env = teacher_student_v0.raw_env(verifier=verifier, mode="structured", n_teachers=1, n_students=1)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside MultiDiscrete"):
        env.step(np.full(env.action_space("teacher_0").shape, 99))
    with pytest.raises(ValueError, match="integer vector"):
        env.step("text")
    shape = env.action_space("teacher_0").shape
    for wrong in (np.zeros((1, *shape), dtype=np.int64), np.zeros((*shape, 1), dtype=np.int64)):
        with pytest.raises(ValueError, match="integer vector of shape"):  # outside the space: not reshaped
            env.step(wrong)
    with pytest.raises(ValueError, match="got a list numpy cannot read"):  # ragged
        env.step([[0, 1], [2]])
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="got a Tensor numpy cannot read"):  # RuntimeError (grad) escaped
        env.step(torch.zeros(shape, requires_grad=True))
    with pytest.raises(KeyError, match="unknown agent 'nobody'"):
        env.observe("nobody")
    env.step(np.zeros(shape, dtype=np.int64))  # a valid (if trivial) proposal: the student's turn
    assert env.agent_selection == "student_0"
    count = len(env.observe("student_0")["action_mask"])
    with pytest.raises(
        ValueError, match=r"candidate 70 is not available: .* MaskablePPO, or set illegal_action"
    ):
        env.step(70)
    with pytest.raises(ValueError, match=f"candidate {2**70} is not available"):
        env.step(2**70)
    with pytest.raises(ValueError, match="None is the action of an agent that is done"):
        env.step(None)
    with pytest.raises(ValueError, match="got a Tensor numpy cannot read"):
        env.step(torch.zeros((), requires_grad=True))
    assert count >= 1
    pen = teacher_student_v0.raw_env(
        verifier=verifier, mode="structured", n_teachers=1, n_students=1, illegal_action="penalize", rounds=1
    )
    pen.reset(seed=0)
    pen.step(np.full(pen.action_space("teacher_0").shape, 99))
    assert pen.infos["teacher_0"]["verdict"] == "format_error"
    assert pen.infos["teacher_0"]["status"] == "illegal_action"
    assert pen.rewards["teacher_0"] == -1.0
    pen.reset(seed=0)
    pen.step(torch.zeros(shape, requires_grad=True))  # penalised, as promised, not a RuntimeError
    assert pen.infos["teacher_0"]["status"] == "illegal_action"
    # numpy counts timedelta64 as an integer type; its tolist() gives datetime.timedelta (a TypeError, and
    # generic units were taken as programs: red-team round 33)
    for unit in ("m8[s]", "m8", "m8[ns]"):
        pen.reset(seed=0)
        pen.step(np.ones(shape, dtype=unit))
        assert pen.infos["teacher_0"]["status"] == "illegal_action", unit
    pen.reset(seed=0)
    pen.step(np.zeros(shape, dtype=np.int64))
    assert pen.agent_selection == "student_0"
    pen.step(np.timedelta64(1, "D"))
    assert (pen.infos["student_0"]["verdict"], pen.infos["student_0"]["status"]) == (
        "format_error",
        "illegal_action",
    )
    env.reset(seed=0)
    with pytest.raises(ValueError, match="integer vector"):
        env.step(np.ones(shape, dtype="m8[s]"))


def test_bad_config_kwargs_name_the_field(verifier):
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['n_teacher'\]; allowed: n_teachers"):
        teacher_student_v0.env(verifier=verifier, n_teacher=2)
    with pytest.raises(ValueError, match="n_students must be an int >= 1"):
        teacher_student_v0.env(verifier=verifier, n_students=0)
    with pytest.raises(ValueError, match="render_mode"):
        teacher_student_v0.env(verifier=verifier, render_mode="rgb_array")
    with pytest.raises(ValueError, match="verifier must be None or an object with the methods run_many"):
        teacher_student_v0.env(verifier="python3")
    with pytest.raises(ValueError, match=r"matchmaker must be .* int lacks assign, update"):
        teacher_student_v0.env(verifier=verifier, matchmaker=5)
    with pytest.raises(ValueError, match="seed_tasks_path: no such file"):
        teacher_student_v0.env(verifier=verifier, seed_tasks_path="/nonexistent/tasks.jsonl")
    # a callable reward scheme is tried on every solve rate a round can produce, at construction
    with pytest.raises(ValueError, match=r"reward_scheme\(0\.0\) failed: ZeroDivisionError"):
        teacher_student_v0.env(verifier=verifier, reward_scheme=lambda s: 1 / s)
    with pytest.raises(ValueError, match=r"reward_scheme\(0\.5\) must return a finite number, got nan"):
        teacher_student_v0.env(verifier=verifier, reward_scheme=lambda s: float("nan") if s == 0.5 else s)
    # numpy's ints and floats are numbers (a value read from an array)
    env = teacher_student_v0.env(
        verifier=verifier, n_teachers=np.int64(2), student_correct_reward=np.float32(1)
    )
    assert env.unwrapped.config.n_teachers == 2 and type(env.unwrapped.config.n_teachers) is int


@pytest.mark.parametrize("mode", MODES)
def test_parallel_seed(verifier, mode):
    parallel_seed_test(lambda: teacher_student_v0.parallel_env(**_kwargs(verifier, mode, {})), num_cycles=40)


def test_human_render_prints_each_line_once(verifier, capsys):
    kwargs = {"verifier": verifier, "n_teachers": 2, "n_students": 2, "rounds": 2}
    human = teacher_student_v0.env(render_mode="human", **kwargs)
    ansi = teacher_student_v0.env(render_mode="ansi", **kwargs)
    for env in (human, ansi):
        teacher, student = ScriptedTeacher(env, 0.4, seed=0), ReferenceStudent(env, 1.0)
        env.reset(seed=0)
        for agent in env.agent_iter():
            obs, _, term, trunc, _ = env.last()
            env.step(
                None
                if term or trunc
                else (teacher if agent.startswith("teacher") else student).act(obs, agent)
            )
    printed = capsys.readouterr().out
    assert printed.count("== round 0") == 1 and printed.count("== round 1") == 1
    assert printed.rstrip("\n") == ansi.render()  # the same lines, each printed once, as the game went


@pytest.mark.parametrize("persist", [False, True])
def test_pfsp_episodes_replay_on_the_same_env_unless_the_arms_race_persists(verifier, persist):
    """The env's own PFSP ratings follow ``persist_buffer``: off (the default), ``reset(seed)`` on the same
    instance replays the seed's episode (the ratings learned in one episode used to steer the next
    one's matchups); on, they carry over with the buffer."""
    env = teacher_student_v0.env(
        mode="structured", n_teachers=3, n_students=4, matching="pfsp", rounds=3, verifier=verifier,
        persist_buffer=persist,
    )  # fmt: skip

    def episode(seed: int) -> list[tuple[str, float, object]]:
        env.reset(seed=seed)
        policies = {
            a: ScriptedTeacher(env, 0.5, i) if a.startswith("teacher") else ExecutingStudent(env, 0.5, i)
            for i, a in enumerate(env.possible_agents)
        }
        trace = []
        for agent in env.agent_iter():
            obs, reward, done, truncated, info = env.last()
            trace.append((agent, reward, info.get("task_id")))
            env.step(None if done or truncated else policies[agent].act(obs, agent))
        return trace

    replays = [episode(seed) == episode(seed) for seed in range(5)]
    if persist:
        assert not all(replays) and env.unwrapped._matchmaker.ratings
    else:
        assert all(replays)


def test_scripted_teacher_stays_within_max_action_chars():
    """At the smallest allowed max_action_chars (256) a difficult scripted proposal rendered too long (17
    of 45 format errors at difficulty 1): a reference baseline that pays format penalties distorts runs."""
    env = teacher_student_v0.env(mode="text", n_teachers=3, n_students=1, rounds=3, max_action_chars=256)
    for difficulty in (0.3, 1.0):
        teacher = ScriptedTeacher(env, difficulty, seed=0)
        for episode in range(3):
            env.reset(seed=episode)
            for agent in env.agent_iter():
                observation, _, terminated, truncated, _ = env.last()
                if terminated or truncated:
                    env.step(None)
                elif agent.startswith("teacher"):
                    action = teacher.act(observation, agent)
                    assert len(action) <= 256
                    env.step(action)
                    assert env.infos[agent]["verdict"] != "format_error", env.infos[agent]
                else:
                    env.step("x")


def test_the_render_log_shows_no_gold_answer_before_the_round_resolves(verifier):
    """The log showed a valid abduction task's input (its gold answer) and a student's answer as they were
    made, in front of the students still to play (a HumanPolicy reads its prompt under the human log; a
    text-mode audit): they are logged when the round resolves."""
    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=2, rounds=1, render_mode="ansi",
                                 task_types=("abduction",))  # fmt: skip
    env.reset(seed=0)
    env.step(format_proposal("def f(x):\n    return x * 3", ["123457"]))
    assert env.infos["teacher_0"]["verdict"] == "valid"
    assert "123457" not in env.render() and "valid" in env.render()
    env.step(format_answer("abduction", "98765"))
    assert "98765" not in env.render()
    while env.agents:
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else format_answer("abduction", "1"))
    text = env.render()
    assert "input:   123457" in text and "answer:  98765" in text
    assert text.index("input:   123457") > text.index("student_1 solve")
