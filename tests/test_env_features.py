"""Env features: JSONL seeds, GRPO groups, buffer growth, structured candidates, matchmakers, example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from populora_env import teacher_student_v0
from populora_env.matchmaking import RatingPFSP
from populora_env.play import play
from populora_env.policies import ExecutingStudent, ReferenceStudent, ScriptedTeacher
from populora_env.text_format import format_proposal

ROOT = Path(__file__).resolve().parents[1]


def test_jsonl_seeds_are_verified(verifier, tmp_path, caplog):
    """Records in the CRUXEval/AZR format seed the buffer with verified outputs: a wrong claimed output drops
    the record (counted in a warning), a missing one is computed, malformed lines are skipped."""
    records = [
        {"code": "def f(x):\n    return x * 2", "input": "21", "output": "42"},
        {"code": "def f(s):\n    return s[::-1]", "input": "'abc'", "output": "'cba'"},
        {"code": "def f(xs):\n    return sorted(xs)", "input": "[3, 1, 2]", "output": "[1, 2, 3]"},
        {"code": "def f(d):\n    return len(d)", "input": "{'a': 1, 'b': 2}"},
    ]
    bad = {"code": "def f(x):\n    return x + 1", "input": "1", "output": "'not the output'"}
    path = tmp_path / "seeds.jsonl"
    path.write_text("\n".join([*map(json.dumps, records), json.dumps(bad), "not json", '{"code": 1}']) + "\n")
    env = teacher_student_v0.raw_env(
        verifier=verifier, seed_tasks_path=path, task_types=("deduction", "abduction"), n_seed_tasks=0
    )
    with caplog.at_level("WARNING", logger="populora_env.tasks"):
        env.reset(seed=0)
    assert "2 seed(s) dropped" in caplog.text  # the bad record, as deduction and as abduction
    for task_type in ("deduction", "abduction"):
        tasks = env._game.buffer.tasks(task_type)
        assert [t.program for t in tasks] == [r["code"] for r in records]
        assert {t.source for t in tasks} == {"jsonl"}
        assert [t.outputs[0] for t in tasks] == ["42", "'cba'", "[1, 2, 3]", "2"]
    assert "```python\ndef f(" in env.observe("teacher_0")["prompt"]


def test_group_sizes_repeat_the_same_observation(verifier):
    env = teacher_student_v0.raw_env(
        verifier=verifier, n_teachers=1, n_students=2, rounds=1, teacher_group_size=3, student_group_size=2,
        task_types=("deduction",),
    )  # fmt: skip
    teacher = ScriptedTeacher(env, 0.2, seed=0)
    student = ReferenceStudent(env, 1.0)
    env.reset(seed=0)
    seen = []
    while env.agents and not env.terminations[env.agent_selection]:
        agent = env.agent_selection
        obs = env.observe(agent)
        seen.append((agent, int(obs["attempt"]), obs["prompt"]))
        env.step((teacher if agent.startswith("teacher") else student).act(obs, agent))
    assert [a for a, _, _ in seen[:3]] == ["teacher_0"] * 3
    assert [k for _, k, _ in seen[:3]] == [0, 1, 2] and len({p for _, _, p in seen[:3]}) == 1
    students = seen[3:]
    assert len(students) == 2 * 3 * 2  # each student: 3 tasks x 2 attempts, in a row
    assert [a for a, _, _ in students] == ["student_0"] * 6 + ["student_1"] * 6
    assert [k for _, k, _ in students[:2]] == [0, 1] and students[0][2] == students[1][2]
    assert [r["n_attempts"] for r in env.infos["teacher_0"]["resolved"]] == [4, 4, 4]


def test_valid_proposals_join_the_buffer_and_persist(verifier):
    kwargs = {"verifier": verifier, "n_teachers": 1, "n_students": 1, "rounds": 2, "n_seed_tasks": 2}
    for persist, expected_growth in ((False, 2), (True, 4)):
        env = teacher_student_v0.env(persist_buffer=persist, **kwargs)
        policies = {"teacher_0": ScriptedTeacher(env, 0.7, seed=3), "student_0": ReferenceStudent(env, 0.5)}
        play(env, policies, episodes=2, seed=0)
        assert len(env.unwrapped._game.buffer) == 6 + expected_growth


def test_structured_candidates_are_verified(verifier):
    env = teacher_student_v0.raw_env(
        verifier=verifier, mode="structured", n_teachers=3, n_students=1, rounds=1
    )
    teachers = [ScriptedTeacher(env, d, seed=i) for i, d in enumerate((0.3, 0.6, 0.9))]
    env.reset(seed=1)
    for t in teachers:
        env.step(t.act(env.observe(env.agent_selection), env.agent_selection))
    seen = 0
    while env.agent_selection == "student_0" and not env.terminations["student_0"]:
        task = env.current_turn.task
        texts = [c.text for c in task.candidates]
        assert len(texts) == len(set(texts)) and task.gold in texts
        for c in task.candidates:  # every flag agrees with the verifier's own check
            if task.task_type == "deduction":
                assert c.correct == verifier.check_deduction(task.program, task.inputs[0], c.text)
            elif task.task_type == "abduction":
                assert c.correct == verifier.check_abduction(task.program, task.outputs[0], c.text)
            else:
                pairs = [*task.shown_pairs, *task.hidden_pairs]
                assert c.correct == (verifier.check_induction(c.text, pairs) == 1.0)
        obs = env.observe("student_0")
        assert obs["action_mask"].sum() == len(texts)
        if task.task_type == "abduction":  # the answer (the input index) is not leaked
            assert obs["program"][1] == 0
        elif task.task_type == "induction":
            assert not obs["program"].any()
        env.step(ExecutingStudent(env, 1.0).act(obs, "student_0"))
        assert env.infos["student_0"]["verdict"] == "correct"
        seen += 1
    assert seen == 3


def test_executing_student_at_full_skill_solves_every_structured_induction_task(verifier):
    """It checked induction candidates on the hidden pairs only, while the env marks one right when it gives
    every pair: a candidate failing a shown pair was picked (5 of 40 tasks, an audit)."""
    env = teacher_student_v0.env(
        verifier=verifier, mode="structured", n_teachers=1, n_students=1, rounds=1, task_types=("induction",)
    )
    solved = []
    for seed in range(40):
        env.reset(seed=seed)
        env.step(ScriptedTeacher(env, 0.6, seed=seed).act(env.last()[0], "teacher_0"))
        if env.agent_selection != "student_0":
            continue  # (an invalid proposal: no task)
        env.step(ExecutingStudent(env, 1.0, seed=0).act(env.last()[0], "student_0"))
        solved.append(env.infos["student_0"]["verdict"] == "correct")
    assert len(solved) >= 20 and all(solved), solved


def test_reference_student_at_full_skill_fits_its_answer_to_max_action_chars(verifier):
    """A task is valid when its gold answer fits ``max_action_chars`` in its shortest form; the reference
    student wrote it in full with its reasoning (288 characters for ``list(range(60))`` against 256) and was
    paid the format penalty (an audit). It now falls back to the shortest form."""
    env = teacher_student_v0.env(
        verifier=verifier,
        n_teachers=1,
        n_students=1,
        rounds=1,
        task_types=("deduction",),
        max_action_chars=256,
    )
    env.reset(seed=0)
    env.step(format_proposal("def f(x):\n    return list(range(x))", ["60"]))
    assert env.infos["teacher_0"]["verdict"] == "valid", env.infos["teacher_0"]
    answer = ReferenceStudent(env, 1.0, seed=0).act(env.last()[0], "student_0")
    assert len(answer) <= 256
    env.step(answer)
    assert env.infos["student_0"]["verdict"] == "correct", env.infos["student_0"]


def test_pfsp_matchmaker_learns_ratings_in_the_env(verifier):
    mm = RatingPFSP(per_task=1)
    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=2, rounds=6, matchmaker=mm)
    policies = {
        "teacher_0": ScriptedTeacher(env, 0.5, seed=0),
        "student_0": ReferenceStudent(env, 1.0),
        "student_1": ReferenceStudent(env, 0.0),
    }
    play(env, policies, seed=0)
    mu = {name: r.mu for name, r in mm.ratings.items()}
    assert set(mu) == {"teacher_0", "student_0", "student_1"}  # both students were drawn (seeded)
    assert mu["student_0"] > mu["student_1"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["text", "structured"])
def test_example_01_runs(mode):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/01_play.py"), "--mode", mode, "--rounds", "1"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert "== round 0" in out.stdout and "episode 1: returns" in out.stdout


def test_reset_is_reproducible(verifier):
    env = teacher_student_v0.env(verifier=verifier, mode="structured", rounds=2)
    runs = []
    for _ in range(2):
        policies = {a: ScriptedTeacher(env, 0.5, seed=i) for i, a in enumerate(env.possible_agents[:2])}
        policies |= {a: ExecutingStudent(env, 0.5, seed=i) for i, a in enumerate(env.possible_agents[2:])}
        runs.append(play(env, policies, episodes=1, seed=11))
    assert runs[0] == runs[1]
    assert np.isfinite(runs[0][0].metrics.mean_depth)


def test_scripted_teacher_difficulty_shows_in_metrics(verifier):
    depth, cyclomatic = [], []
    for difficulty in (0.0, 1.0):
        env = teacher_student_v0.env(verifier=verifier, n_teachers=2, n_students=1, rounds=6, n_seed_tasks=1)
        policies = {
            "teacher_0": ScriptedTeacher(env, difficulty, seed=0),
            "teacher_1": ScriptedTeacher(env, difficulty, seed=1),
            "student_0": ReferenceStudent(env, 0.5),
        }
        (record,) = play(env, policies, seed=0)
        depth.append(record.metrics.mean_depth)
        cyclomatic.append(record.metrics.mean_cyclomatic)
    assert depth[1] > depth[0] + 1 and cyclomatic[1] > cyclomatic[0]


def test_jsonl_seeds_skip_malformed_lines_with_a_warning(tmp_path, caplog):
    from populora_env.tasks import load_jsonl_specs

    data = tmp_path / "seeds.jsonl"
    data.write_text(
        'not json\n{"code": "def f(x):\\n    return x", "input": "1", "output": "1"}\n{"code": 3}\n'
    )
    with caplog.at_level("WARNING", logger="populora_env.tasks"):
        specs = load_jsonl_specs(data)
    assert [(s.task_type, s.inputs, s.expected) for s in specs] == [
        ("deduction", ("1",), "1"),
        ("abduction", ("1",), "1"),
    ]
    assert f"{data}:1: skipped: not JSON" in caplog.text
    assert f"{data}:3: skipped: field 'code' is missing or not a string" in caplog.text


def test_a_verifier_returning_the_wrong_number_of_runs_gets_a_clear_error(verifier):
    """The env takes any object with the verifier's methods; one whose ``run_many`` drops a run must be
    named, not have its outputs paired with the wrong inputs."""

    class DropsOne:
        def __init__(self, inner):
            self.inner = inner
            self.drop = False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def run_many(self, items):
            runs = self.inner.run_many(items)
            return runs[:-1] if self.drop else runs

    for mode in ("text", "structured"):
        wrapped = DropsOne(verifier)
        env = teacher_student_v0.env(verifier=wrapped, mode=mode, n_teachers=1, n_students=1)
        env.reset(seed=0)  # seeds verified through the honest path
        wrapped.drop = True
        policy = ScriptedTeacher(env, 0.5, seed=0)
        with pytest.raises(RuntimeError, match=r"DropsOne\.run_many returned 0 runs for 1 "):
            env.step(policy.act(env.last()[0], "teacher_0"))
    # the seeds' check (verify_specs), with the last wrapper still dropping
    with pytest.raises(RuntimeError, match=r"DropsOne\.run_many returned"):
        teacher_student_v0.raw_env(verifier=wrapped, n_teachers=1, n_students=1).reset(seed=0)


@pytest.mark.parametrize("mode", ["text", "structured"])
@pytest.mark.parametrize("k", [0, 2, 5])
def test_teachers_see_k_distinct_reference_tasks_of_their_type(verifier, mode, k):
    env = teacher_student_v0.raw_env(
        verifier=verifier, mode=mode, n_teachers=3, n_students=1, n_references=k, n_seed_tasks=8
    )
    env.reset(seed=0)
    for _ in range(3):  # the three teachers of round 0, one task type each
        turn = env.current_turn
        refs = turn.references
        assert len(refs) == k and len({r.task_id for r in refs}) == k
        assert {r.task_type for r in refs} <= {turn.task_type}
        obs = env.observe(turn.agent)
        if mode == "text":
            assert obs["prompt"].count("### Reference ") == k
            for r in refs:
                assert r.program in obs["prompt"]
        else:
            assert obs["references"].shape[0] == k
            for row, r in zip(obs["references"], refs, strict=True):
                assert np.array_equal(row[: len(r.program_dsl.encode())], r.program_dsl.encode())
        env.step("junk" if mode == "text" else env.action_space(turn.agent).sample())


def _induction_io(verifier, program):
    """``(source, inputs, outputs)`` of a DSL program on its six induction inputs, or ``None`` where a run fails."""
    from populora_env import dsl

    source, _ = dsl.render(program)
    inputs = dsl.induction_inputs(program, 6)
    runs = verifier.run_many([(source, args) for args in inputs])
    if any(r.status != "ok" for r in runs):
        return None
    return source, inputs, tuple(str(r.output) for r in runs)


@pytest.mark.parametrize("teacher", ["random_program", "random_action"])
def test_induction_candidates_do_not_give_the_answer_away(verifier, teacher):
    """The right program must not be findable without the pairs: picking the candidate closest to all the
    others does about as well as a random pick, by DSL slots and by rendered source (a function of the
    candidate rows a student's observation shows), for scripted programs and for uniform random teacher actions (an untrained RL
    teacher). When the distractors were variants of the right program, the slot pick found it in 92% of
    tasks against 50% by chance; when their hidden centre could render as the right program itself (a
    change that does nothing), the source pick found it in 62% of random-action tasks against 41%."""
    import difflib
    import random

    from populora_env import dsl
    from populora_env.candidates import make_candidates
    from populora_env.tasks import Task, task_id_for

    def lines_apart(a: str, b: str) -> int:
        x, y = a.splitlines(), b.splitlines()
        same = sum(m.size for m in difflib.SequenceMatcher(a=x, b=y).get_matching_blocks())
        return len(x) + len(y) - 2 * same

    rng = random.Random(1)
    space = np.random.default_rng(1)
    nvec = teacher_student_v0.raw_env(mode="structured", n_slots=6).action_space("teacher_0").nvec
    by_slots = by_source = chance = 0.0
    n = 0
    while n < 150:
        if teacher == "random_program":
            program = dsl.random_program(rng, 6, rng.random())
        else:
            program = dsl.decode(space.integers(0, nvec), 6)
        verified = _induction_io(verifier, program)
        if verified is None:
            continue
        source, inputs, outputs = verified
        task = Task(task_id_for("induction", source, inputs), "induction", source, inputs, outputs, n_shown=3,
                    program_dsl=program)  # fmt: skip
        candidates = make_candidates(task, verifier, random.Random(n), 4)
        if len(candidates) < 3:
            continue
        slots = [c.program.slots for c in candidates]
        distance = [sum(sum(x != y for x, y in zip(a, b, strict=True)) for b in slots) for a in slots]
        by_slots += candidates[min(range(len(slots)), key=distance.__getitem__)].correct
        distance = [sum(lines_apart(a.text, b.text) for b in candidates) for a in candidates]
        by_source += candidates[min(range(len(candidates)), key=distance.__getitem__)].correct
        chance += sum(c.correct for c in candidates) / len(candidates)
        n += 1
    assert by_slots / n < chance / n + 0.15, (by_slots / n, chance / n)
    assert by_source / n < chance / n + 0.12, (by_source / n, chance / n)


def test_deduction_candidates_are_told_apart_by_the_observation(verifier):
    """Candidates were distinct as texts, but a student sees each through ``dsl.value_row`` (numbers
    clipped at 1000, eight elements): ``1200`` (wrong) and ``1500`` (right) were one row, a choice no
    policy could make."""
    import random

    from populora_env import dsl
    from populora_env.candidates import make_candidates
    from populora_env.tasks import Task, task_id_for

    program = dsl.DslProgram(0, 15, ((3, 7), (3, 7), (3, 7), (0, 0), (0, 0), (0, 0)))  # f(12): x * 5, 3 times
    source, args = dsl.render(program)
    (run,) = verifier.run_many([(source, args)])
    assert run.output == "1500"
    task = Task(task_id_for("deduction", source, (args,)), "deduction", source, (args,), (run.output,),
                program_dsl=program)  # fmt: skip
    clipped = 0
    for seed in range(60):
        candidates = make_candidates(task, verifier, random.Random(seed), 4)
        rows = [dsl.value_row(c.text).tobytes() for c in candidates]
        assert len(set(rows)) == len(rows), [(c.text, c.correct) for c in candidates]
        clipped += sum(int(c.text) > dsl.VALUE_CLIP for c in candidates if not c.correct)
    assert clipped == 0  # every wrong candidate above the clip would share the right one's row


def test_candidates_are_told_right_or_wrong_by_what_a_student_sees_and_ordered_by_the_task(verifier):
    """Red-team round 45. An induction distractor that gives the shown pairs' outputs and fails a hidden pair
    cannot be told wrong by any student: a teacher was paid for such underdetermined tasks (the best possible
    student solved about half of a crafted family); such distractors are dropped. And the order was drawn from
    the env's generator alone, so an env reset with one seed every episode put the right candidate at about the
    same index whatever the task (up to 100%): it depends on the task now."""
    import collections
    import random

    from populora_env import dsl
    from populora_env.candidates import make_candidates
    from populora_env.tasks import Task, task_id_for

    space = np.random.default_rng(2)
    nvec = teacher_student_v0.raw_env(mode="structured", n_slots=3).action_space("teacher_0").nvec
    positions: dict[str, collections.Counter] = {
        t: collections.Counter() for t in ("deduction", "abduction", "induction")
    }
    checked = 0
    while sum(sum(c.values()) for c in positions.values()) < 240:
        program = dsl.decode(space.integers(0, nvec), 3)
        verified = _induction_io(verifier, program)
        if verified is None:
            continue
        source, inputs, outputs = verified
        for task_type in positions:
            task_inputs, task_outputs = (
                (inputs, outputs) if task_type == "induction" else (inputs[:1], outputs[:1])
            )
            task = Task(task_id_for(task_type, source, task_inputs), task_type, source, task_inputs, task_outputs,
                        n_shown=3 if task_type == "induction" else 1, program_dsl=program)  # fmt: skip
            candidates = make_candidates(task, verifier, random.Random(7), 4)  # the same seed for every task
            if task_type == "induction":
                wrong = [c for c in candidates if not c.correct]
                shown = verifier.run_many([(c.text, args) for c in wrong for args, _ in task.shown_pairs])
                for i, c in enumerate(wrong):
                    mine = [str(r.output) for r in shown[i * 3 : i * 3 + 3]]
                    assert mine != [out for _, out in task.shown_pairs], (source, c.text)
                    checked += 1
            if len(candidates) == 4 and sum(c.correct for c in candidates) == 1:
                positions[task_type][next(i for i, c in enumerate(candidates) if c.correct)] += 1
    assert checked > 40
    for task_type, counts in positions.items():
        assert max(counts.values()) / sum(counts.values()) < 0.5, (task_type, counts)  # 0.25 by chance


def test_a_scripted_student_of_the_other_mode_is_refused_when_made() -> None:
    """ExecutingStudent in a text game failed at its first act with random's "Cannot choose from an empty
    sequence" (a plug-in review); each scripted student names the mode it plays and the one to use."""
    text, structured = teacher_student_v0.env(), teacher_student_v0.env(mode="structured")
    with pytest.raises(ValueError, match="ExecutingStudent plays structured mode; this env is in text mode: use "
                       "ReferenceStudent"):  # fmt: skip
        ExecutingStudent(text)
    with pytest.raises(ValueError, match="ReferenceStudent plays text mode; this env is in structured mode: use "
                       "ExecutingStudent"):  # fmt: skip
        ReferenceStudent(structured)
    ExecutingStudent(structured), ReferenceStudent(text)  # (and through a wrapper's unwrapped)
