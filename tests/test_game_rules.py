"""Game rules by move tables: rewards, config validation, answer parsing, DSL rendering, buffer, metrics."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from populora_env import dsl
from populora_env.game import TeacherStudentConfig, teacher_reward
from populora_env.matchmaking import AllPairs, RandomMatch, RatingPFSP, make_matchmaker
from populora_env.metrics import program_stats, summarize_episode
from populora_env.tasks import TASK_TYPES, Task, TaskBuffer, task_id_for
from populora_env.text_format import (
    CHARSET,
    Answer,
    FormatError,
    Proposal,
    format_answer,
    format_proposal,
    parse_answer,
    parse_proposal,
    sanitize,
)

LEARN = TeacherStudentConfig()
ADV = TeacherStudentConfig(reward_scheme="adversarial")
AZR = TeacherStudentConfig(teacher_extreme_reward=0.0)
USER = TeacherStudentConfig(reward_scheme=lambda s: 2.0 * s - 1.0)


@pytest.mark.parametrize(
    ("config", "solve_rate", "reward"),
    [
        (LEARN, 0.0, -0.5),
        (LEARN, 1.0, -0.5),
        (LEARN, 0.25, 0.75),
        (LEARN, 0.5, 0.5),
        (LEARN, None, 0.0),
        (AZR, 0.0, 0.0),
        (AZR, 2 / 3, 1 / 3),
        (ADV, 0.0, 1.0),
        (ADV, 1.0, 0.0),
        (ADV, 0.25, 0.75),
        (USER, 0.75, 0.5),
    ],
)
def test_teacher_reward_table(config, solve_rate, reward):
    assert teacher_reward(solve_rate, config) == pytest.approx(reward)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_teachers": 0}, "n_teachers"),
        ({"n_students": 1.5}, "n_students"),
        ({"rounds": True}, "rounds"),
        ({"task_types": ("deduction", "proof")}, "task_types"),
        ({"task_types": ()}, "task_types"),
        ({"task_types": ("deduction", "deduction")}, "task_types"),
        ({"mode": "pixels"}, "mode"),
        ({"matching": "elo"}, "matching"),
        ({"reward_scheme": "zero_sum"}, "reward_scheme"),
        ({"illegal_action": "ignore"}, "illegal_action"),
        ({"n_candidates": 1}, "n_candidates"),
        ({"induction_min_inputs": 5, "induction_max_inputs": 3}, "induction_min_inputs"),
        ({"max_action_chars": 10}, "max_action_chars"),
        ({"n_references": -1}, "n_references"),
        ({"mode": "structured", "seed_tasks_path": "x.jsonl"}, "seed_tasks_path"),
        ({"seed_tasks_path": 123}, "seed_tasks_path must be None or a path"),
        ({"n_candidates": "4"}, "n_candidates must be an int >= 2"),
        ({"max_prompt_chars": None}, "max_prompt_chars must be an int >= 256"),
        # the bare induction teacher prompt: a shorter cap cut the answer format out of it
        ({"max_prompt_chars": 300}, "max_prompt_chars must be >= 460 in text mode"),
        ({"max_action_chars": 300.5}, "max_action_chars must be an int >= 256"),
        (
            {"max_action_chars": 10**20},
            "max_action_chars must be at most 1000000000",
        ),  # (a text space sampled in int64)
        ({"induction_max_inputs": 2.5}, "induction_max_inputs must be an int >= 2"),
        ({"induction_max_inputs": 1}, "induction_max_inputs must be an int >= 2"),
        # structured inputs are consecutive entries of a 16-input table: a 17th repeats a shown one
        (
            {"mode": "structured", "induction_max_inputs": 17},
            "induction_max_inputs must be <= 16 in structured",
        ),
        # one input would leave no hidden pair to test the student's program on
        ({"induction_min_inputs": 1}, "induction_min_inputs must be an int >= 2"),
        ({"teacher_extreme_reward": "a"}, "teacher_extreme_reward must be a finite real number"),
        ({"student_correct_reward": None}, "student_correct_reward must be a finite real number"),
        ({"student_wrong_reward": float("nan")}, "student_wrong_reward must be a finite real number"),
        ({"teacher_format_penalty": True}, "teacher_format_penalty must be a finite real number"),
        ({"persist_buffer": "yes"}, "persist_buffer must be True or False"),
        ({"task_types": 5}, "task_types must be a non-empty subset"),
        ({"task_types": [["deduction"]]}, "task_types must be a non-empty subset"),
    ],
)
def test_config_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TeacherStudentConfig(**kwargs)


def test_config_accepts_single_type_string():
    assert TeacherStudentConfig(task_types="abduction").task_types == ("abduction",)


def test_config_normalizes_numbers_and_paths(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    config = TeacherStudentConfig(student_correct_reward=2, task_types=["induction"], seed_tasks_path=tasks)
    assert config.student_correct_reward == 2.0 and isinstance(config.student_correct_reward, float)
    assert config.task_types == ("induction",)
    assert config.seed_tasks_path == str(tasks)


PROGRAM = "def f(x):\n    return x + 1"
GOOD = f"<think>easy</think>\n<answer>\n```python\n{PROGRAM}\n```\n```input\n3\n```\n</answer>"


@pytest.mark.parametrize(
    ("text", "task_type", "expected"),
    [
        (GOOD, "deduction", Proposal(PROGRAM, ("3",))),
        (GOOD.replace("<think>easy</think>\n", ""), "abduction", Proposal(PROGRAM, ("3",))),
        (GOOD.upper().replace("```PYTHON", "```python").replace("```INPUT", "```input"), "deduction", None),
        ("<answer>```python\nx\n```</answer>", "deduction", FormatError("missing_or_bad_input")),
        (GOOD.replace("</answer>", ""), "deduction", FormatError("no_answer")),
        ("", "deduction", FormatError("no_answer")),
        ("<answer></answer>", "deduction", FormatError("missing_python")),
        (GOOD + "<answer>\n```input\n3\n```\n</answer>", "deduction", FormatError("missing_python")),
        (GOOD, "induction", FormatError("wrong_number_of_inputs")),
        (
            format_proposal(PROGRAM, ["1", "2", "1"], message="adds one"),
            "induction",
            Proposal(PROGRAM, ("1", "2"), "adds one"),
        ),
        (  # the same value written twice is one input (else the hidden pair repeats a shown one)
            format_proposal(PROGRAM, ["5", "(5)", " 5,", "[1, 2]", "[1,2]", "dict(a=1)"], message="m"),
            "induction",
            Proposal(PROGRAM, ("5", "[1, 2]", "dict(a=1)"), "m"),
        ),
        (
            format_proposal(PROGRAM, ["5", "(5)"], message="m"),
            "induction",
            FormatError("wrong_number_of_inputs"),
        ),
        (format_proposal(PROGRAM, ["1", "2"]), "induction", FormatError("missing_or_bad_message")),
        (
            format_proposal(PROGRAM, [str(i) for i in range(7)], "m"),
            "induction",
            FormatError("wrong_number_of_inputs"),
        ),
        ("x" * 9000, "deduction", FormatError("too_long")),
        (  # a lone surrogate in the message would reach the students' prompts (tokenizers refuse it)
            format_proposal(PROGRAM, ["1", "2"], message="adds \ud800 one"),
            "induction",
            FormatError("not_utf8"),
        ),
        (format_proposal("y" * 5000, ["1"]), "deduction", FormatError("bad_python_length")),
    ],
)
def test_parse_proposal_table(text, task_type, expected):
    result = parse_proposal(text, task_type, max_chars=8192)
    if expected is None:  # upper-cased tags still count; the program text is then upper case
        assert isinstance(result, Proposal) and result.inputs == ("3",)
    else:
        assert result == expected


@pytest.mark.parametrize(
    ("text", "task_type", "expected"),
    [
        (format_answer("deduction", "4"), "deduction", Answer("4")),
        (format_answer("abduction", "[1, 2], 3"), "abduction", Answer("[1, 2], 3")),
        (format_answer("induction", PROGRAM), "induction", Answer(PROGRAM)),
        (format_answer("deduction", "4"), "abduction", FormatError("missing_input")),
        ("<answer>\n```output\n   \n```\n</answer>", "deduction", FormatError("bad_output_length")),
        ("4", "deduction", FormatError("no_answer")),
        ("\udcff<answer>```output\n\u00e9\n```</answer>", "deduction", Answer("\u00e9")),
        ("<answer>```output\n\udcff\n```</answer>", "deduction", FormatError("not_utf8")),
        # Unicode case folding took the long s (U+017F) for an "s" in a tag of non-ASCII text
        ("\u00e9<an\u017fwer>```output\n4\n```</an\u017fwer>", "deduction", FormatError("no_answer")),
        ("\u00e9<ANSWER>```output\n4\n```</Answer>", "deduction", Answer("4")),
        # trimmed of Python's whitespace only, as the verifier trims a literal (NBSP, U+3000 were taken)
        ("<answer>```output\n\u00a0\u30006\u2028\n```</answer>", "deduction", Answer("\u00a0\u30006\u2028")),
        ("<answer>```output\n \t6\x0c \n```</answer>", "deduction", Answer("6")),
    ],
)
def test_parse_answer_table(text, task_type, expected):
    assert parse_answer(text, task_type, max_chars=8192) == expected


def test_parse_never_raises_on_non_strings():
    for junk in (None, 3, b"<answer>", ["x"]):
        assert parse_answer(junk, "deduction", max_chars=100) == FormatError("not_a_string")  # type: ignore[arg-type]


def test_sanitize_maps_into_charset_and_caps():
    out = sanitize("a\u00e9\x00b\r" + "z" * 500, 300)
    assert set(out) <= CHARSET and len(out) == 300 and out.startswith("a??b?")


@pytest.mark.parametrize(
    ("program", "source", "args"),
    [
        (dsl.DslProgram(0, 5, ((1, 2), (0, 0))), "def f(x):\n    x = x + 3\n    return x", "2"),
        (dsl.DslProgram(1, 0, ((17, 0),)), "def f(x):\n    x = x[::-1]\n    return x", "[-2]"),
        # a list op on an int is skipped; a loop wraps the next type-preserving op
        (
            dsl.DslProgram(0, 3, ((17, 0), (39, 1), (3, 4))),
            "def f(x):\n    for _ in range(2):\n        x = x * 2\n    return x",
            "0",
        ),
        # a guard before a type-changing op is dropped
        (dsl.DslProgram(2, 0, ((40, 0), (34, 0))), "def f(x):\n    x = len(x)\n    return x", "'apple'"),
        (dsl.DslProgram(2, 12, ()), "def f(x):\n    return x", "''"),
    ],
)
def test_dsl_render_table(program, source, args):
    assert dsl.render(program) == (source, args)
    assert dsl.decode(program.encode(), len(program.slots)) == program


def test_dsl_decode_rejects_out_of_space():
    nvec = dsl.action_nvec(2)
    with pytest.raises(ValueError, match="outside"):
        dsl.decode(nvec.copy(), 2)
    with pytest.raises(ValueError, match="shape"):
        dsl.decode(np.zeros(3, dtype=np.int64), 2)


def test_dsl_difficulty_grows():
    rng = random.Random(0)
    easy = [program_stats(dsl.render(dsl.random_program(rng, 6, 0.0))[0]) for _ in range(40)]
    hard = [program_stats(dsl.render(dsl.random_program(rng, 6, 1.0))[0]) for _ in range(40)]
    assert np.mean([s.depth for s in hard]) > np.mean([s.depth for s in easy]) + 1
    assert np.mean([s.cyclomatic for s in hard]) > np.mean([s.cyclomatic for s in easy])
    assert len({s.shape for s in hard}) > len({s.shape for s in easy})


@pytest.mark.parametrize(
    ("source", "depth", "cyclomatic", "lines"),
    [
        ("def f(x):\n    return x", 4, 1, 2),
        ("def f(x):\n    if x > 1 and x < 5:\n        return 1\n    return [v for v in x if v]", 6, 5, 4),
        ("not python (", 0, 0, 1),
    ],
)
def test_program_stats_table(source, depth, cyclomatic, lines):
    stats = program_stats(source)
    assert (stats.depth, stats.cyclomatic, stats.lines) == (depth, cyclomatic, lines)


def test_op_sets_tell_apart_what_shapes_do_not():
    """DESIGN.md's coverage counts op sets as well as AST shapes: shapes erase names, so sorted(x) and
    len(x) are one shape; their op sets differ."""
    sort, size = (
        program_stats("def f(x):\n    return sorted(x)"),
        program_stats("def f(x):\n    return len(x)"),
    )
    assert sort.shape == size.shape and (sort.ops, size.ops) == ("call:sorted", "call:len")
    loop = "def f(xs):\n    t = 0\n    for x in xs[1:]:\n        if x > 2 and x != 5:\n            t += x\n    return t"
    assert program_stats(loop).ops == "Add,And,For,Gt,If,NotEq,Slice,Subscript"
    assert program_stats("def f(:").ops == ""
    proposals = [("teacher_0", "valid", "def f(x):\n    return sorted(x)", 0.5),
                 ("teacher_0", "valid", "def f(x):\n    return len(x)", 0.5),
                 ("teacher_1", "invalid", "", None)]  # fmt: skip
    metrics = summarize_episode(proposals, [], ["teacher_0", "teacher_1"], [])
    assert (metrics.coverage, metrics.op_coverage) == (1, 2)


def test_ast_shape_ignores_names_and_constants():
    a = program_stats("def f(x):\n    return x + 1").shape
    assert a == program_stats("def g(y):\n    return y + 7").shape
    assert a != program_stats("def f(x):\n    return x * 1").shape


def _task(i: int, task_type: str = "deduction", source: str = "agent") -> Task:
    program = f"def f(x):\n    return x + {i}"
    return Task(
        task_id_for(task_type, program, ("1",)), task_type, program, ("1",), (str(1 + i),), source=source
    )  # type: ignore[arg-type]


def test_buffer_dedups_caps_and_keeps_seeds():
    buf = TaskBuffer(capacity=3)
    assert buf.add(_task(0, source="seed"))
    assert not buf.add(_task(0, source="seed"))
    for i in range(1, 5):
        assert buf.add(_task(i))
    kept = [t.program[-1] for t in buf.tasks("deduction")]
    assert kept == ["0", "3", "4"] and len(buf) == 3
    picks = buf.sample("deduction", 2, random.Random(0))
    assert len(set(picks)) == 2 and set(picks) <= set(buf.tasks("deduction"))
    assert sorted(t.program for t in buf.sample("deduction", 5, random.Random(0))) == sorted(
        t.program for t in buf.tasks("deduction")
    )
    assert buf.sample("induction", 2, random.Random(0)) == ()


def test_buffer_sample_is_uniform_over_ordered_draws():
    # the few-of-many path draws indices by rejection; every ordered k-tuple must stay equally likely
    buf = TaskBuffer(capacity=20)
    for i in range(6):
        buf.add(_task(i))
    rng = random.Random(0)
    counts: dict[tuple[str, ...], int] = {}
    trials = 36_000
    for _ in range(trials):
        picks = buf.sample("deduction", 2, rng)
        assert len(picks) == 2 and picks[0] is not picks[1]
        key = tuple(t.program[-1] for t in picks)
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 30  # 6 * 5 ordered pairs, all reachable
    expected = trials / 30
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 60, chi2  # 29 degrees of freedom: P(chi2 > 60) < 0.001 for a uniform sampler
    # the large-share path (k > n / 2) and k >= n give every task once
    bucket = set(buf.tasks("deduction"))
    assert len(set(four := buf.sample("deduction", 4, rng))) == 4 and set(four) <= bucket
    assert set(buf.sample("deduction", 9, rng)) == bucket


def test_perturbed_slots_change_one_slot_within_the_signature():
    program = dsl.random_program(random.Random(1), 6, 1.0)
    used = [i for i, (op, _) in enumerate(program.slots) if op != 0]
    rng = random.Random(0)
    changed_args = changed_ops = 0
    seen_args: set[int] = set()
    for slots in dsl.perturbed_slots(program, rng, 4000):
        diff = [i for i in range(len(slots)) if slots[i] != program.slots[i]]
        assert len(diff) <= 1 and set(diff) <= set(used)
        for i in diff:
            (op0, a0), (op1, a1) = program.slots[i], slots[i]
            assert 0 <= a1 < dsl.N_ARGS and 1 <= op1 < dsl.N_OPS
            if op1 == op0:
                changed_args += 1
                seen_args.add((a1 - a0) % dsl.N_ARGS)
            else:
                assert a1 == a0 and dsl.OPS[op1 - 1].in_type == dsl.OPS[op0 - 1].in_type
                assert dsl.OPS[op1 - 1].out_type == dsl.OPS[op0 - 1].out_type
                changed_ops += 1
    assert seen_args == set(range(1, dsl.N_ARGS))  # every other arg value is drawn, never the same one
    assert 1700 < changed_args < 2300 and changed_ops > 1000  # half arg changes, the rest op swaps (or none)
    base = dsl.DslProgram(0, 3, ((0, 0),) * 6)
    assert list(dsl.perturbed_slots(base, rng, 3)) == [base.slots] * 3
    others = {dsl.perturbed_input_index(program, rng) for _ in range(2000)}
    assert others == set(range(dsl.N_INPUTS)) - {program.input_index}


def test_matchmakers():
    rng = np.random.default_rng(0)
    students = ("student_0", "student_1", "student_2")
    assert AllPairs().assign(["teacher_0", "teacher_1"], students, rng) == [students, students]
    picks = RandomMatch(2).assign(["teacher_0"] * 20, students, rng)
    assert all(len(p) == 2 and len(set(p)) == 2 for p in picks)
    assert len({p for p in picks}) > 1
    pfsp = RatingPFSP(per_task=1)
    # student_0 always solves teacher_0's tasks, student_1 never: after rating, the weaker matchup
    # (student_0 vs a teacher it beats) is less balanced than student_2 (unrated, even) ...
    pfsp.update([("teacher_0", "student_0", True)] * 8 + [("teacher_0", "student_1", False)] * 8)
    counts = {s: 0 for s in students}
    for p in pfsp.assign(["teacher_0"] * 300, students, rng):
        counts[p[0]] += 1
    assert counts["student_2"] > counts["student_0"] and counts["student_2"] > counts["student_1"]
    with pytest.raises(ValueError, match="matching"):
        make_matchmaker("elo", 1)


class TableVerifier:
    """A pure stand-in for the verifier: every program returns 1 unless its source says ``raise``."""

    def run_many(self, items):
        from populora_env.verifier import Execution

        return [
            Execution("runtime", None, "raised") if "raise" in p else Execution("ok", "1", "")
            for p, _ in items
        ]

    def check_deduction(self, program, args, answer):
        return answer.strip() == "1"

    check_abduction = check_deduction

    def check_induction(self, answer_program, pairs):
        return 1.0


def test_game_move_table_and_rewards_without_the_env():
    """The rules module alone (no PettingZoo, a table verifier): turn order, phases, group attempts, and the
    payouts of a round with one valid and one invalid proposal."""
    from populora_env.game import Game
    from populora_env.text_format import Answer, Proposal

    config = TeacherStudentConfig(n_teachers=2, n_students=2, rounds=2, task_types=("deduction",),
                                  student_group_size=2, n_references=0)  # fmt: skip
    game = Game(config, TableVerifier(), AllPairs(), seed_tasks=())
    game.reset(np.random.default_rng(0))
    moves, rewards = [], dict.fromkeys(config.agents, 0.0)
    answers = {"student_0": ["1", "1"], "student_1": ["2", "1"]}
    while not game.done:
        turn = game.current
        moves.append((turn.round, turn.agent, turn.phase, turn.attempt))
        if turn.phase == "propose":
            program = (  # a new task each round: one the buffer holds is a duplicate
                f"def f(x):\n    return {1 + turn.round} - {turn.round}"
                if turn.agent == "teacher_0"
                else "def f(x):\n    raise ValueError"
            )
            action = Proposal(program, ("0",), "")
        else:
            action = Answer(answers[turn.agent][turn.attempt])
        for agent, reward in game.step(action).rewards.items():
            rewards[agent] += reward
    per_round = [("teacher_0", "propose", 0), ("teacher_1", "propose", 0), ("student_0", "solve", 0),
                 ("student_0", "solve", 1), ("student_1", "solve", 0), ("student_1", "solve", 1)]  # fmt: skip
    assert moves == [(r, *m) for r in (0, 1) for m in per_round]  # only teacher_0's valid task is solved
    # per round: teacher_0's task solved 3 of 4 times -> learnability 1 - 3/4; teacher_1's is invalid -> -1
    assert rewards == {"teacher_0": 0.5, "teacher_1": -2.0, "student_0": 4.0, "student_1": 1.0}
    assert [(r.teacher, r.verdict, r.solve_rate) for r in game.history] == [
        ("teacher_0", "valid", 0.75), ("teacher_1", "invalid", None)
    ] * 2  # fmt: skip


def test_a_copy_of_a_task_the_buffer_holds_is_a_duplicate():
    """A teacher that re-emitted a reference task (shown to it with its output), verbatim or with a comment,
    a docstring or other spacing added, had a valid task paid like a new one (a reward-hacking review): in
    text mode such a copy is invalid ("duplicate"); another program, or the same one on another input, is
    not."""
    from populora_env.game import Game
    from populora_env.text_format import Answer, Proposal

    seed = _task(0, source="seed")  # def f(x): return x + 0, on 1
    copies = [
        (seed.program, "1"),
        (seed.program + "  # a variant", "1"),
        ('def f(x):\n    """Adds."""\n\n    return (x  +  0)', "1"),
        # (a second review: a renamed parameter, a `pass`, the input re-spelled were new tasks)
        ("def f(y):\n    return y + 0", "1"),
        ("def f(x):\n    pass\n    return x + 0", "1"),
        (seed.program, "+1"),
        (seed.program, "(1)  "),
    ]
    others = [("def f(x):\n    return x + 2", "1"), (seed.program, "5")]
    proposals = [Proposal(p, (a,), "") for p, a in copies + others]
    config = TeacherStudentConfig(n_teachers=1, n_students=1, rounds=1, task_types=("deduction",),
                                  teacher_group_size=len(proposals), student_group_size=1, n_references=1)  # fmt: skip
    game = Game(config, TableVerifier(), AllPairs(), seed_tasks=(seed,))
    game.reset(np.random.default_rng(0))
    while not game.done:
        turn = game.current
        game.step(proposals[turn.attempt] if turn.phase == "propose" else Answer("1"))
    assert [(r.verdict, r.status) for r in game.history] == [("invalid", "duplicate")] * len(copies) + [
        ("valid", "ok")
    ] * 2
    assert game.history[0].reward == config.teacher_invalid_penalty


def test_the_normal_form_of_a_task_keeps_what_tells_tasks_apart():
    """Names are renamed in order of appearance, but built-ins, attributes and keywords are kept, and the
    outputs are part of the form (a program reading its own names is no copy); induction pairs in any
    order are one task."""
    from populora_env.tasks import normal_form

    def form(
        program: str,
        inputs: tuple[str, ...] = ("1",),
        outputs: tuple[str, ...] = ("1",),
        kind: str = "deduction",
    ) -> str:
        return normal_form(kind, program, inputs, outputs)

    helper = "def g(a, b=2):\n    total = a * b\n    return total\ndef f(x):\n    return g(x)"
    renamed = "def h(p, q=2):\n    s = p * q\n    return s\ndef f(y):\n    return h(y)"
    assert form(helper) == form(renamed)
    assert form("def f(x):\n    return len(x)") != form("def f(x):\n    return abs(x)")
    assert form("def f(x):\n    return x.real") != form("def f(x):\n    return x.imag")
    assert form("def f(x):\n    return sorted(x, reverse=x)") != form(
        "def f(x):\n    return sorted(x, key=x)"
    )
    assert form("def f(x):\n    return list(locals())", outputs=("['x']",)) != form(
        "def f(y):\n    return list(locals())", outputs=("['y']",)
    )
    assert form("def f(x):\n    return x", ("'a'",), ("'a'",)) == form(
        "def f(x):\n    return x", ('"a"',), ("'a'",)
    )
    assert form("def f(x):\n    return x", ("1",)) != form("def f(x):\n    return x", ("1.0",), ("1.0",))
    add = "def f(x):\n    return x + 1"
    pairs = (("1", "2", "3", "4"), ("2", "3", "4", "5"))  # (shown: the first two)
    swapped = (("2", "1", "4", "3"), ("3", "2", "5", "4"))  # each half in another order: the same task
    crossed = (("3", "2", "1", "4"), ("4", "3", "2", "5"))  # another pair shown: another task (a review)
    assert normal_form("induction", add, *pairs, 2) == normal_form("induction", add, *swapped, 2)
    assert normal_form("induction", add, *pairs, 2) != normal_form("induction", add, *crossed, 2)
    assert normal_form("deduction", add, *pairs) != normal_form("deduction", add, *swapped)
    # keywords follow the parameters they name, imported names are kept (a review: each of these pairs
    # had one form, and equal outputs on some input made them duplicates)
    keywords = "def g({}):\n    return p - 2 * q\ndef f(x):\n    return g(p=x, q=x // 2)"
    assert form(keywords.format("p, q"), outputs=("1",)) != form(keywords.format("q, p"), outputs=("1",))
    imported = "from math import floor, ceil\ndef f(x):\n    return {}(x / 2)"
    assert form(imported.format("floor"), ("4",), ("2",)) != form(imported.format("ceil"), ("4",), ("2",))


def test_every_int_and_float_config_field_is_validated():
    """A new int or float field must join the validation tables, or it would be accepted unchecked."""
    import dataclasses
    import typing

    from populora_env.game import _INT_MINIMUMS, _REWARD_FIELDS

    hints = typing.get_type_hints(TeacherStudentConfig)
    fields = [f.name for f in dataclasses.fields(TeacherStudentConfig)]
    assert {name for name in fields if hints[name] is int} == set(_INT_MINIMUMS)
    assert {name for name in fields if hints[name] is float} == set(_REWARD_FIELDS)


@pytest.mark.parametrize(
    ("program", "inputs", "status"),
    [
        ("def f(x):\n    return 'é' + x", ["'ü'"], "unshowable_characters"),  # the prompt would show '?'
        ("def f(x):\n    return x + chr(233)", ["'a'"], "unshowable_characters"),  # in the output only
        ("def f(x):\n    return x * 2" + "  # pad" * 80, ["1"], "prompt_too_long"),  # cut short in the prompt
        # the gold answer, written in the answer format, would not parse back
        ("def f(x):\n    return '<' + 'answer>'", ["1"], "answer_markup"),
        ("def f(x):\n    return 'a' + '`' * 3 + 'b'", ["1"], "answer_markup"),
        ("def f(x):\n    return '</ANSWER' + '>'", ["1"], "answer_markup"),
        # an output longer than a deduction answer may be: the right answer was a format error
        ("def f(x):\n    return 'ab' * x", ["600"], "answer_too_long"),
    ],
)
def test_text_tasks_a_student_could_not_read_are_invalid(verifier, program, inputs, status):
    from populora_env import teacher_student_v0
    from populora_env.text_format import format_proposal

    env = teacher_student_v0.env(
        verifier=verifier,
        n_teachers=1,
        n_students=1,
        rounds=1,
        task_types=("deduction",),
        max_prompt_chars=600,
    )
    env.reset(seed=0)
    env.step(format_proposal(program, inputs))
    info = env.unwrapped.infos["teacher_0"]
    resolved = info.get("resolved") or [info]
    assert (resolved[0]["verdict"], resolved[0]["status"]) == ("invalid", status), info


def test_an_induction_program_is_not_shown_so_its_characters_do_not_matter(verifier):
    from populora_env import teacher_student_v0
    from populora_env.text_format import format_proposal

    env = teacher_student_v0.env(
        verifier=verifier, n_teachers=1, n_students=1, rounds=1, task_types=("induction",)
    )
    env.reset(seed=0)
    program = "def f(x):\n    return x + 1  # é, the hidden program's comment"
    env.step(format_proposal(program, ["1", "2", "3"], message="adds one"))
    assert env.unwrapped.infos["teacher_0"]["verdict"] == "valid", env.unwrapped.infos["teacher_0"]


def _text_game(verifier, matchmaker=None, **kwargs):
    from populora_env.game import Game

    fields = {"n_teachers": 1, "n_students": 2, "rounds": 2, "task_types": ("deduction",), "n_references": 0}
    config = TeacherStudentConfig(**{**fields, **kwargs})
    game = Game(config, verifier, matchmaker or AllPairs(), seed_tasks=())
    game.reset(np.random.default_rng(0))
    return game


def _play(game, answer="1"):
    """Plays the game to its end (valid proposals, the same answer from every student); its rewards."""
    from populora_env.text_format import Answer, Proposal

    totals: dict[str, float] = {}
    while not game.done:
        turn = game.current
        action = Proposal("def f(x):\n    return 1", ("0",)) if turn.phase == "propose" else Answer(answer)
        for agent, reward in game.step(action).rewards.items():
            totals[agent] = totals.get(agent, 0.0) + reward
    return totals


class _FailsOnce:
    """Raises from the first call of ``method``, then behaves as ``inner``."""

    def __init__(self, inner, method):
        self.inner, self.method, self.failed = inner, method, False

    def __getattr__(self, name):
        target = getattr(self.inner, name)
        if name != self.method or self.failed:
            return target

        def fail(*args, **kwargs):
            self.failed = True
            raise RuntimeError(f"{name} failed")

        return fail


@pytest.mark.parametrize(
    ("part", "method"),
    [
        ("verifier", "check_deduction"),  # a student's turn
        ("verifier", "run_many"),  # a teacher's turn
        ("matchmaker", "assign"),  # the end of the propose phase
        ("matchmaker", "update"),  # the end of the round
    ],
)
def test_a_turn_that_raises_stays_pending_and_the_game_goes_on_unchanged(part, method):
    """An error while a turn is played (here one raised by the verifier or the matchmaker) leaves the game
    as it was before the step: the same turn pending, nothing of it recorded; played again, the episode
    ends as one that never failed (the env was left unusable: the turn had left the queue)."""
    from populora_env.text_format import Answer, Proposal

    reference = _play(_text_game(TableVerifier()))
    parts = {"verifier": TableVerifier(), "matchmaker": AllPairs()}
    parts[part] = _FailsOnce(parts[part], method)
    game = _text_game(parts["verifier"], parts["matchmaker"])
    raised = 0
    while not game.done:
        turn, queued, log = game.current, list(game.queue), list(game.attempt_log)
        action = Proposal("def f(x):\n    return 1", ("0",)) if turn.phase == "propose" else Answer("1")
        try:
            game.step(action)
        except RuntimeError as e:
            assert str(e) == f"{method} failed"
            raised += 1
            assert (game.current, list(game.queue), game.attempt_log) == (turn, queued, log)
            continue
    assert raised == 1
    game.reset(np.random.default_rng(0))
    assert _play(game) == reference


class _EqualToEveryName:
    def __eq__(self, other):
        return True

    def __hash__(self):
        return hash("student_0")


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([], "returned 0 groups of students for 1 tasks"),
        ([("student_7",)], "returned ('student_7',): each task's students must be distinct names"),
        ([("student_0", "student_0")], "each task's students must be distinct"),
        ([(_EqualToEveryName(),)], "each task's students must be distinct names"),
        (None, "must return one sequence of students per task"),
    ],
)
def test_a_matchmaker_assignment_is_checked_before_anything_is_queued(groups, message):
    from populora_env.text_format import Proposal

    class Broken(AllPairs):
        def assign(self, teachers, students, rng):
            return groups

    game = _text_game(TableVerifier(), Broken())
    turn = game.current
    with pytest.raises(ValueError, match=r"Broken\.assign") as caught:
        game.step(Proposal("def f(x):\n    return 1", ("0",)))
    assert message in str(caught.value) and game.current == turn and not game.attempt_log


def test_an_induction_proposal_needs_a_pair_to_test_on():
    """A pre-parsed proposal (the game takes those) with one input: no hidden pair is left, so it is
    invalid, never a task whose students' turn cannot be scored."""
    from populora_env.text_format import Proposal

    game = _text_game(TableVerifier(), task_types=("induction",), rounds=1)
    game.step(Proposal("def f(x):\n    return 1", ("0",), "m"))
    assert game.done and [(r.verdict, r.status) for r in game.history] == [("invalid", "too_few_inputs")]


def test_episode_metrics_count_the_attempts_of_resolved_rounds_only():
    from populora_env.text_format import Answer, Proposal

    game = _text_game(TableVerifier())
    game.step(Proposal("def f(x):\n    return 1", ("0",)))
    game.step(Answer("1"))  # round 0 is not resolved yet: student_1 has still to play
    metrics = game.metrics()
    assert (metrics.n_proposals, metrics.solve_rate, metrics.student_solve_rate["student_0"]) == (
        0,
        None,
        None,
    )
    game.step(Answer("2"))
    metrics = game.metrics()
    assert (metrics.n_proposals, metrics.solve_rate) == (1, 0.5)
    assert metrics.student_solve_rate == {"student_0": 1.0, "student_1": 0.0}


@pytest.mark.parametrize(
    ("kwargs", "matching", "attempts"),
    [
        ({"n_students": 4}, None, 4),  # all-pairs: every student attempts every task
        ({"n_students": 4, "student_group_size": 3}, None, 12),
        ({"n_students": 4, "matching": "random", "students_per_task": 2}, None, 2),
        ({"n_students": 1, "matching": "random", "students_per_task": 3}, None, 1),  # capped at the students
        ({"n_students": 4}, "pfsp", 1),  # run_pbt's PFSP, whatever the env's own matching
        ({"n_students": 1}, None, 1),
    ],
)
def test_attempts_per_task_and_the_constant_teacher_reward_follow_the_matching(kwargs, matching, attempts):
    from populora_env.game import attempts_per_task, constant_teacher_reward

    config = TeacherStudentConfig(**kwargs)
    assert attempts_per_task(config, matching) == attempts
    problem = constant_teacher_reward(config, matching)
    assert (problem is not None) == (attempts == 1), problem
    assert (
        constant_teacher_reward(TeacherStudentConfig(**kwargs, reward_scheme="adversarial"), matching) is None
    )


def test_a_long_reference_never_pushes_the_answer_format_out_of_a_teacher_prompt():
    """References that would take the teacher's prompt over its length are left out (later, shorter ones
    still shown, numbered in order); without a limit every reference is shown."""
    from populora_env.text_format import teacher_prompt

    def task(program: str) -> Task:
        return Task(task_id_for("deduction", program, ("1",)), "deduction", program, ("1",), ("2",))

    short, long = task("def f(x):\n    return x + 1"), task("def f(x):\n    return x + 1  # " + "c" * 3000)
    prompt = teacher_prompt("deduction", [short, long, short], max_chars=1000)
    assert len(prompt) <= 1000 and prompt.endswith("</answer>") and "## Answer format" in prompt
    assert "c" * 100 not in prompt and prompt.count("### Reference") == 2 and "### Reference 2\n" in prompt
    assert teacher_prompt("deduction", [short, long]).count("### Reference") == 2


@pytest.mark.parametrize("mode", ["text", "structured"])
def test_a_retried_turn_draws_what_it_would_have_drawn(verifier, mode):
    """A random matchmaker whose ``assign`` raises once, after its draws: the retried turn makes the same
    draws as an episode that never failed (they were taken, so the retried episode went elsewhere; in
    structured mode the last proposal's candidates too)."""
    from populora_env import teacher_student_v0
    from populora_env.policies import ExecutingStudent, ReferenceStudent, ScriptedTeacher

    class Flaky(RandomMatch):
        def __init__(self, fail_at: int) -> None:
            super().__init__(1)
            self.calls, self.fail_at = 0, fail_at

        def assign(self, teachers, students, rng):
            self.calls += 1
            out = super().assign(teachers, students, rng)  # its draws made, then it fails
            if self.calls == self.fail_at:
                raise RuntimeError("flaky assign")
            return out

    def episode(fail_at: int):
        env = teacher_student_v0.raw_env(mode=mode, n_teachers=2, n_students=3, rounds=3,
                                         matchmaker=Flaky(fail_at), verifier=verifier)  # fmt: skip
        env.reset(seed=3)
        student = ReferenceStudent if mode == "text" else ExecutingStudent
        policies = {a: ScriptedTeacher(env, 0.5, seed=i) for i, a in enumerate(env.possible_agents[:2])}
        policies |= {a: student(env, 0.7, seed=i) for i, a in enumerate(env.possible_agents[2:])}
        failures = 0
        for agent in env.agent_iter():
            observation, _, done, cut, _ = env.last()
            action = None if done or cut else policies[agent].act(observation, agent)
            try:
                env.step(action)
            except RuntimeError:
                failures += 1
                env.step(action)
        game = env._game
        return failures, game.attempt_log, [(r.task_id, r.solve_rate) for r in game.history]

    clean, retried = episode(0), episode(1)
    assert (clean[0], retried[0]) == (0, 1) and retried[1:] == clean[1:]


def test_an_input_key_does_not_depend_on_the_callers_stack():
    """A literal that ran out of recursion deep in the caller's stack fell back to its text as the key
    ("5" and "(5)" two inputs there): it is parsed and rendered on a fresh stack instead."""
    import sys

    from populora_env.text_format import _VALUE_KEYS, _value_key

    _VALUE_KEYS.clear()
    nested = "[" * 40 + "1" + "]" * 40

    def deep(n: int, args: str) -> str:
        return deep(n - 1, args) if n else _value_key(args)

    first = deep(sys.getrecursionlimit() - 60, nested)
    _VALUE_KEYS.clear()
    assert first == deep(sys.getrecursionlimit() - 60, f"({nested})") == _value_key(nested)
    assert first[0] == "v"  # parsed, not the text


def test_a_gold_answer_over_the_action_cap_is_invalid(verifier):
    """With a small ``max_action_chars`` the right answer did not fit in any action: every student got the
    format penalty and the solve rate was 0 by construction. What fits is judged on the shortest answer
    that counts (the least markup ``parse_answer`` takes; for deduction the most compact ``==`` literal):
    a task whose answer just fits stays valid, and that answer is correct."""
    from populora_env import teacher_student_v0
    from populora_env.text_format import _compact, format_proposal
    from populora_env.verifier import parse_literal

    def proposed(program: str, args: str):
        env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=1, rounds=1,
                                     task_types=("deduction",), max_action_chars=300)  # fmt: skip
        env.reset(seed=0)
        env.step(format_proposal(program, [args]))
        return env, env.unwrapped.infos["teacher_0"]

    _, info = proposed("def f(x):\n    return 'a' * x", "270")  # 272 characters + 30 of markup
    assert (info["verdict"], info["status"]) == ("invalid", "answer_too_long"), info
    env, info = proposed("def f(x):\n    return 'a' * x", "260")
    assert info["verdict"] == "valid", info
    answer = "<answer>```output\n'" + "a" * 260 + "'```</answer>"
    assert len(answer) == 292
    env.step(answer)
    assert env.unwrapped.infos["student_0"]["verdict"] == "correct"
    # 1 200 characters as the verifier writes them, 401 as a student may: answerable, so valid
    _, info = proposed("def f(x):\n    return [True] * x", "200")
    assert info["verdict"] == "invalid" and info["status"] == "answer_too_long"  # 401 + 30 > 300
    value = [True, 2.0, -0.0, 1e300, (1,), (), {1: (2.5, None)}, {3}, set(), "a, b", b"x", 1j, 2 + 0j]
    assert parse_literal(_compact(value)) == value and len(_compact(value)) < len(repr(value))


def test_a_long_deduction_output_that_compacts_under_the_cap_is_valid(verifier):
    from populora_env import teacher_student_v0
    from populora_env.text_format import format_answer, format_proposal

    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=1, rounds=1,
                                 task_types=("deduction",))  # fmt: skip
    env.reset(seed=0)
    env.step(format_proposal("def f(x):\n    return [True] * x", ["200"]))  # gold of 1 200 characters
    assert env.unwrapped.infos["teacher_0"]["verdict"] == "valid"
    env.step(format_answer("deduction", "[" + ",".join(["1"] * 200) + "]"))
    assert env.unwrapped.infos["student_0"]["verdict"] == "correct"


def test_crlf_line_ends_read_as_lf(verifier):
    """The program of a CRLF proposal kept its carriage returns and was invalid (unshowable_characters)."""
    from populora_env import teacher_student_v0
    from populora_env.text_format import format_answer, format_proposal

    env = teacher_student_v0.env(verifier=verifier, n_teachers=1, n_students=1, rounds=1,
                                 task_types=("deduction",))  # fmt: skip
    env.reset(seed=0)
    env.step(format_proposal("def f(x):\n    return x + 1", ["5"]).replace("\n", "\r\n"))
    assert env.unwrapped.infos["teacher_0"]["verdict"] == "valid"
    env.step(format_answer("deduction", "6").replace("\n", "\r\n"))
    assert env.unwrapped.infos["student_0"]["verdict"] == "correct"


def test_induction_inputs_equal_by_value_are_one_input():
    """``1``, ``True`` and ``1.0`` are one value under ``==`` (the verifier's comparison): as separate inputs
    a shown pair came back as the hidden test, and a lookup of the shown pair passed it."""
    from populora_env.text_format import FormatError, format_proposal, parse_proposal

    def inputs(*args: str):
        parsed = parse_proposal(format_proposal("def f(x):\n    return x", list(args), "m"), "induction",
                                max_chars=8192, min_inputs=1)  # fmt: skip
        return parsed if isinstance(parsed, FormatError) else parsed.inputs

    assert inputs("1", "True", "1.0", "(1+0j)", "2") == ("1", "2")
    assert inputs("-0.0", "0", "[1, 2.0]", "[True, 2]", "(1,)", "[1]") == ("-0.0", "[1, 2.0]", "(1,)", "[1]")
    assert inputs("{1: 'a', 2: 'b'}", "{2: 'b', True: 'a'}", "{1, 2}", "{2.0, 1}") == (
        "{1: 'a', 2: 'b'}", "{1, 2}")  # fmt: skip
    assert inputs("'a'", "b'a'", "None") == ("'a'", "b'a'", "None")
    assert inputs("1", "True") == ("1",)


def test_a_format_error_and_an_invalid_proposal_pay_their_own_penalties():
    """A mutation audit: the two teacher penalties were swapped unnoticed (both default to -1). With distinct
    values, a proposal that does not parse pays ``teacher_format_penalty`` and one whose program raises pays
    ``teacher_invalid_penalty``."""
    from populora_env.text_format import FormatError, Proposal

    game = _text_game(TableVerifier(), rounds=1, teacher_group_size=2, teacher_format_penalty=-2.0,
                      teacher_invalid_penalty=-1.0)  # fmt: skip
    game.step(FormatError("no_answer"))
    game.step(Proposal("def f(x):\n    raise ValueError", ("0",)))
    assert game.done
    assert [(r.verdict, r.reward) for r in game.history] == [("format_error", -2.0), ("invalid", -1.0)]


def test_a_teachers_step_reward_is_the_sum_of_its_proposals_rewards():
    """A mutation audit: a teacher's round reward was its last proposal's alone (the sum was not checked
    with more than one proposal per teacher). One valid proposal (solved by one student of two) and one
    invalid one: the step rewards add up to both records' rewards."""
    from populora_env.text_format import Answer, Proposal

    game = _text_game(TableVerifier(), rounds=1, teacher_group_size=2)
    proposals = [
        Proposal("def f(x):\n    return 1", ("0",)),
        Proposal("def f(x):\n    raise ValueError", ("0",)),
    ]
    answers = {"student_0": "1", "student_1": "2"}
    total = 0.0
    while not game.done:
        turn = game.current
        action = proposals[turn.attempt] if turn.phase == "propose" else Answer(answers[turn.agent])
        total += game.step(action).rewards.get("teacher_0", 0.0)
    rewards = [r.reward for r in game.history]
    assert [r.verdict for r in game.history] == ["valid", "invalid"] and rewards == [0.5, -1.0]
    assert total == sum(rewards) == -0.5


class _HalfInductionVerifier(TableVerifier):
    """Scores every induction answer 0.5 (half of the hidden pairs matched) and keeps the pairs it was given."""

    def __init__(self):
        self.pairs = []

    def check_induction(self, answer_program, pairs):
        self.pairs.append(list(pairs))
        return 0.5


def test_an_induction_answer_is_correct_only_when_it_matches_every_hidden_pair():
    """A mutation audit: a half-right induction answer (score 0.5) passing as correct went unnoticed. It is
    wrong, pays ``student_wrong_reward`` and keeps its score; of six inputs, three pairs are shown and the
    other three are the hidden tests."""
    from populora_env.text_format import Answer, Proposal

    verifier = _HalfInductionVerifier()
    game = _text_game(verifier, rounds=1, n_students=1, task_types=("induction",), student_wrong_reward=-0.25)
    inputs = tuple(str(i) for i in range(6))
    game.step(Proposal("def f(x):\n    return 1", inputs, "m"))
    outcome = game.step(Answer("def f(x):\n    return 1"))
    task = game.history[0].task
    assert (task.n_shown, task.shown_pairs, task.hidden_pairs) == (
        3, tuple((i, "1") for i in inputs[:3]), tuple((i, "1") for i in inputs[3:]))  # fmt: skip
    assert verifier.pairs == [list(task.hidden_pairs)]
    info = outcome.infos["student_0"]
    assert (info["verdict"], info["score"], outcome.rewards["student_0"]) == ("wrong", 0.5, -0.25)
    assert game.history[0].solve_rate == 0.0


def test_induction_references_with_unshowable_hidden_parts_are_left_out_of_teacher_prompts():
    """Teachers are shown an induction reference's program and hidden pairs, which no student check covers:
    a hidden output made at run time put fences and answer tags into other teachers' prompts, and a
    non-ASCII program was shown with '?' (a text-mode audit)."""
    from populora_env.text_format import teacher_prompt

    def induction(program: str, outputs: tuple[str, ...]) -> Task:
        inputs = ("1", "2", "3", "50")
        return Task(task_id_for("induction", program, inputs), "induction", program, inputs, outputs, "adds one",
                    n_shown=2)  # type: ignore[arg-type]  # fmt: skip

    clean = induction("def f(x):\n    return x + 1", ("2", "3", "4", "51"))
    markup = induction("def f(x):\n    return x + 1 if x < 10 else g(x)", ("2", "3", "4", "'``` </answer>'"))
    accented = induction("def f(x):\n    return x + len('é')", ("2", "3", "4", "51"))
    prompt = teacher_prompt("induction", (markup, clean, accented))
    assert prompt.count("### Reference") == 1 and clean.program in prompt
    assert "'```" not in prompt and "é" not in prompt and "?" not in prompt


def test_a_proposal_needs_an_input_that_is_more_than_comments_and_a_message_that_is_not_empty():
    """A red-team review: an input block of comments alone passed the refusal of an empty one (it read as a
    call with no arguments), and an empty message block counted as induction's message."""
    from populora_env.text_format import Proposal, format_proposal, parse_proposal

    program = "def f(x):\n    return x + 1"
    # (and "# none\x0c1": one comment to Python, two lines to str.splitlines; a review)
    for inputs in (
        ["# nothing here"],
        ["  \n# a\n  # b\n"],
        ["3", "# none"],
        ["# none\x0c1"],
        ["# a\u20281"],
    ):
        assert parse_proposal(format_proposal(program, inputs), "deduction", max_chars=8192) == FormatError(
            "missing_or_bad_input"
        ), inputs
    assert parse_proposal(format_proposal(program, ["3  # three"]), "deduction", max_chars=8192) == Proposal(
        program, ("3  # three",)
    )
    induction = format_proposal(program, ["1", "2"], message="  ")
    assert parse_proposal(induction, "induction", max_chars=8192) == FormatError("missing_or_bad_message")
    assert isinstance(parse_proposal(induction.replace("```message\n  ", "```message\nadds"), "induction",
                                     max_chars=8192), Proposal)  # fmt: skip


def test_a_buffer_state_round_trips_and_a_broken_one_is_refused(verifier):
    """``buffer_state`` / ``load_buffer_state`` (what ``run_pbt`` checkpoints with ``persist_buffer``): the same
    tasks, structured candidates included, in the same order; a state of another capacity, with an edited
    task or a task twice is refused by name."""
    import copy

    from populora_env import teacher_student_v0
    from populora_env.policies import ExecutingStudent, ScriptedTeacher

    env = teacher_student_v0.env(
        verifier=verifier, mode="structured", rounds=2, persist_buffer=True, buffer_capacity=16
    )
    policies = {a: (ScriptedTeacher(env, 0.5, seed=i) if a.startswith("teacher") else ExecutingStudent(env, 0.5, seed=i))
                for i, a in enumerate(env.possible_agents)}  # fmt: skip
    for seed in (0, 1):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            obs, _, term, trunc, _ = env.last()
            env.step(None if term or trunc else policies[agent].act(obs, agent))
    state = env.unwrapped.buffer_state()
    assert json.loads(json.dumps(state)) == state  # plain JSON data
    other = teacher_student_v0.env(
        verifier=verifier, mode="structured", persist_buffer=True, buffer_capacity=16
    )
    other.unwrapped.load_buffer_state(state)
    game, loaded = env.unwrapped._game, other.unwrapped._game
    assert all(loaded.buffer.tasks(k) == game.buffer.tasks(k) for k in TASK_TYPES)
    assert any(t.candidates and t.source != "seed" for k in TASK_TYPES for t in loaded.buffer.tasks(k))
    assert all(a.candidates == b.candidates for k in TASK_TYPES
               for a, b in zip(loaded.buffer.tasks(k), game.buffer.tasks(k), strict=True))  # fmt: skip
    other.reset(seed=5)  # kept by the reset (persist_buffer)
    assert len(other.unwrapped._game.buffer) == len(game.buffer)
    other.unwrapped.load_buffer_state(None)
    other.reset(seed=5)
    fresh = other.unwrapped._game.buffer
    assert all(t.source == "seed" for k in TASK_TYPES for t in fresh.tasks(k))  # the seed tasks again
    small = teacher_student_v0.env(verifier=verifier, mode="structured", buffer_capacity=8)
    with pytest.raises(ValueError, match="a buffer state of capacity 16 for a game of buffer_capacity 8"):
        small.unwrapped.load_buffer_state(state)
    edited = copy.deepcopy(state)
    kind = next(k for k in TASK_TYPES if edited["tasks"][k])
    edited["tasks"][kind][0]["outputs"][0] = "123"
    edited["tasks"][kind][0]["program"] += " "
    with pytest.raises(ValueError, match="is not the task its fields describe"):
        other.unwrapped.load_buffer_state(edited)
    twice = copy.deepcopy(state)
    twice["tasks"][kind][-1] = twice["tasks"][kind][0]
    with pytest.raises(ValueError, match="twice"):
        other.unwrapped.load_buffer_state(twice)
    # fields of another type or range (a review: n_shown -5, correct "no", capacity "16" were taken)
    with_candidates = next(i for i, t in enumerate(state["tasks"][kind]) if t["candidates"])
    for change, message in (
        (lambda s: s["tasks"][kind][0].update(n_shown=-5), "shows -5 of its"),
        (lambda s: s["tasks"][kind][with_candidates]["candidates"][0].__setitem__(1, "no"), "marked correct"),
        (lambda s: s.update(capacity="16"), "capacity is '16', not an int >= 1"),
    ):
        broken = copy.deepcopy(state)
        change(broken)
        with pytest.raises((ValueError, TypeError), match=message):
            other.unwrapped.load_buffer_state(broken)
