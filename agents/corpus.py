"""Deterministic generator of small Python programs and game-format documents for pretraining a tiny base.

The tiny base only has to learn the *syntax* of the game: Python functions ``def f(...)`` and the AZR-style
answer blocks (``<think>``, ``<answer>``, fenced ``python`` / ``input`` / ``output`` / ``message`` blocks),
written with the env's own prompt and answer formatters. Programs are
built from random typed expressions over one variable; outputs are computed by running the generated
source. Only source produced by this module is ever executed here, never user or model text.

Every item ``i`` of a corpus with seed ``s`` comes from its own ``random.Random(f"corpus:{s}:{i}")``, so a
corpus is reproducible item by item (reasoning-gym's per-item RNG).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from populora_env.tasks import Task, TaskType, task_id_for
from populora_env.text_format import format_answer, format_proposal, student_prompt, teacher_prompt

ArgType = Literal["int", "str", "list"]
ExampleKind = Literal[
    "propose_deduction",
    "propose_abduction",
    "propose_induction",
    "solve_deduction",
    "solve_abduction",
    "solve_induction",
]
EXAMPLE_KINDS: tuple[ExampleKind, ...] = (
    "propose_deduction",
    "propose_abduction",
    "propose_induction",
    "solve_deduction",
    "solve_abduction",
    "solve_induction",
)
_WORDS = ("apple", "kiwi", "level", "sun", "moon", "river", "rotor", "python", "abc", "queue", "data", "")
_MAX_REPR = 80


@dataclass(frozen=True)
class Program:
    """A generated program with inputs and their outputs.

    Attributes:
        source: Python source defining ``f``, ending with a newline.
        inputs: argument literals, one string per call (``"3"`` or ``"'ab', 2"``).
        outputs: ``repr`` of ``f(*args)`` for each input.
        arg_type: type of the first argument.
    """

    source: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    arg_type: ArgType


@dataclass(frozen=True)
class Example:
    """One prompt/answer pair in the game's text format.

    Attributes:
        kind: which role and task type the example imitates.
        prompt: the prompt the env shows (``populora_env.text_format``).
        answer: the completion: a blank line, then the answer in the env's answer format.
    """

    kind: ExampleKind
    prompt: str
    answer: str

    @property
    def text(self) -> str:
        """Prompt and answer as one pretraining document."""
        return self.prompt + self.answer


# ---------------------------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------------------------
# Integer expression forms over a sub-expression ``a`` and a constant ``k`` (``k1 = k + 1``, never 0).
_INT_FORMS = (
    "{a} + {k}",
    "{a} - {k}",
    "{a} * {k}",
    "{a} % {k1}",
    "{a} // {k}",
    "abs({a} - {k})",
    "max({a}, {k})",
)


def _int_expr(rng: random.Random, var: str, depth: int) -> str:
    """A random integer expression over ``var`` (never divides by a variable, so it cannot raise)."""
    if depth <= 0 or rng.random() < 0.3:
        return var if rng.random() < 0.7 else str(rng.randint(0, 9))
    a = _int_expr(rng, var, depth - 1)
    a = a if a.isidentifier() or a.isdigit() else f"({a})"
    k = rng.randint(1, 9)
    form = rng.randrange(len(_INT_FORMS) + 1)
    if form < len(_INT_FORMS):
        return _INT_FORMS[form].format(a=a, k=k, k1=k + 1)
    return f"min({a}, {_int_expr(rng, var, depth - 1)})"


def _int_body(rng: random.Random) -> list[str]:
    form = rng.randrange(4)
    if form == 0:
        return [f"return {_int_expr(rng, 'x', 2)}"]
    if form == 1:
        k = rng.randint(-3, 9)
        return [
            f"if x > {k}:",
            f"    return {_int_expr(rng, 'x', 2)}",
            f"return {_int_expr(rng, 'x', 1)}",
        ]
    if form == 2:
        return [
            "total = 0",
            f"for i in range(x % {rng.randint(2, 7)}):",
            f"    total += {_int_expr(rng, 'i', 1)}",
            "return total",
        ]
    return [f"y = {_int_expr(rng, 'x', 2)}", f"return {_int_expr(rng, 'y', 2)}"]


def _str_body(rng: random.Random) -> list[str]:
    c = rng.choice("aeiost")
    forms = [
        ["return x[::-1]"],
        [f"return x.upper() + '{c}'"],
        [f"return x.count('{c}') * {rng.randint(1, 5)}"],
        [f"return len(x) + {rng.randint(0, 9)}"],
        [f"return x.replace('{c}', '{rng.choice('xyz')}')"],
        [f"return x[{rng.randint(0, 3)}:] + x[:{rng.randint(0, 3)}]"],
        ["result = ''", "for ch in x:", f"    if ch != '{c}':", "        result += ch", "return result"],
        ["return x == x[::-1]"],
        [f"return sorted(x)[:{rng.randint(1, 4)}]"],
    ]
    return rng.choice(forms)


def _list_body(rng: random.Random) -> list[str]:
    k = rng.randint(1, 5)
    forms = [
        ["return sum(x)"],
        [f"return [v * {k} for v in x]"],
        [f"return [v for v in x if v % 2 == {k % 2}]"],
        ["return sorted(x)"],
        [f"return x[::-1][:{k}]"],
        ["if not x:", "    return 0", "return max(x) - min(x)"],
        ["count = 0", "for v in x:", f"    if v > {k}:", "        count += 1", "return count"],
        [f"return len(x) * {k}"],
        ["result = []", "for v in x:", "    result.append(v + len(result))", "return result"],
    ]
    return rng.choice(forms)


def _int_literal(rng: random.Random) -> str:
    return str(rng.randint(-10, 30))


def _str_literal(rng: random.Random) -> str:
    return repr(rng.choice(_WORDS))


def _list_literal(rng: random.Random) -> str:
    return repr([rng.randint(-5, 12) for _ in range(rng.randint(0, 6))])


_BODIES = {"int": _int_body, "str": _str_body, "list": _list_body}
_LITERALS = {"int": _int_literal, "str": _str_literal, "list": _list_literal}


def _run(source: str, call: str) -> str | None:
    """``repr`` of ``f(call)`` for generated source; ``None`` when it raises or the result is too long."""
    namespace: dict[str, object] = {}
    try:
        exec(source, namespace)  # trusted: source is generated by this module, never model output
        value = eval(f"f({call})", namespace)
    except Exception:
        return None
    text = repr(value)
    return text if len(text) <= _MAX_REPR else None


def generate_program(rng: random.Random, n_inputs: int = 3) -> Program:
    """Generate one program with ``n_inputs`` distinct inputs whose outputs are all computable.

    Args:
        rng: the item's local random generator.
        n_inputs: how many input/output pairs to attach (at least 1).

    Returns:
        The program; retried internally until every chosen input runs.
    """
    if n_inputs < 1:
        raise ValueError(f"n_inputs must be >= 1, got {n_inputs}")
    while True:
        arg_type: ArgType = rng.choice(("int", "str", "list"))
        body = _BODIES[arg_type](rng)
        source = "def f(x):\n" + "".join(f"    {line}\n" for line in body)
        inputs: list[str] = []
        outputs: list[str] = []
        for _ in range(4 * n_inputs):
            literal = _LITERALS[arg_type](rng)
            if literal in inputs:
                continue
            output = _run(source, literal)
            if output is not None:
                inputs.append(literal)
                outputs.append(output)
            if len(inputs) == n_inputs:
                return Program(source, tuple(inputs), tuple(outputs), arg_type)


# ---------------------------------------------------------------------------------------------------------
# Game-format prompts and answers: the env's own text mode (populora_env.text_format), so the tiny base
# sees exactly the prompts and answer blocks it will meet in the game.
# ---------------------------------------------------------------------------------------------------------
_THOUGHTS = (
    "Trace f step by step.",
    "Check the types first, then compute.",
    "A small change to the reference makes a new problem.",
    "",
)


def _task(task_type: TaskType, program: Program, n_shown: int = 1) -> Task:
    source = program.source.rstrip("\n")
    n = len(program.inputs) if task_type == "induction" else 1
    inputs, outputs = program.inputs[:n], program.outputs[:n]
    return Task(
        task_id=task_id_for(task_type, source, inputs),
        task_type=task_type,
        program=source,
        inputs=inputs,
        outputs=outputs,
        message=f"f works on {program.arg_type} values" if task_type == "induction" else "",
        n_shown=n_shown if task_type == "induction" else 1,
    )


def _make_example(kind: ExampleKind, program: Program, reference: Program, rng: random.Random) -> Example:
    task_type: TaskType = kind.split("_", 1)[1]  # type: ignore[assignment]
    thought = rng.choice(_THOUGHTS)
    if kind.startswith("propose"):
        task = _task(task_type, program)
        prompt = teacher_prompt(task_type, [_task(task_type, reference, n_shown=1)])
        answer = format_proposal(task.program, task.inputs, task.message, thought)
    else:
        task = _task(task_type, program, n_shown=max(1, len(program.inputs) - 1))
        prompt = student_prompt(task)
        answer = format_answer(task_type, task.gold, thought)
    return Example(kind, prompt, "\n\n" + answer)


def generate_examples(n: int, seed: int = 0) -> list[Example]:
    """Generate ``n`` examples cycling through every :data:`EXAMPLE_KINDS`.

    Args:
        n: number of examples (>= 0).
        seed: corpus seed; item ``i`` uses ``random.Random(f"corpus:{seed}:{i}")``.

    Returns:
        The examples, identical for the same ``(n, seed)``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    examples = []
    for i in range(n):
        rng = random.Random(f"corpus:{seed}:{i}")
        program = generate_program(rng)
        reference = generate_program(rng)
        examples.append(_make_example(EXAMPLE_KINDS[i % len(EXAMPLE_KINDS)], program, reference, rng))
    return examples
