"""Task records, the per-type task buffer, the built-in seed set and a CRUXEval/AZR JSONL loader."""

from __future__ import annotations

import hashlib
import logging
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from populora_env import dsl
from populora_env.verifier.jsonl import load_records

logger = logging.getLogger(__name__)

TaskType = Literal["deduction", "abduction", "induction"]
TASK_TYPES: tuple[TaskType, ...] = ("deduction", "abduction", "induction")
MAX_JSONL_FIELD_CHARS = 4000


class Candidate(NamedTuple):
    """One answer a structured-mode student may pick (an immutable record; a named tuple, cheap to build:
    every valid structured proposal makes several).

    Attributes:
        text: the answer text (an output literal, an argument list, or a program source).
        correct: whether the verifier accepted it for the task.
        program: the DSL program behind a program candidate (induction), else ``None``.
    """

    text: str
    correct: bool
    program: dsl.DslProgram | None = None


@dataclass(frozen=True)
class Task:
    """A verified task: a program with input/output pairs computed by the verifier.

    Attributes:
        task_id: stable short hash of type, program and inputs (also the dedup key).
        task_type: deduction, abduction or induction.
        program: Python source defining ``def f``.
        inputs: argument-list texts; one for deduction/abduction, several for induction.
        outputs: the verifier's canonical output literal for each input.
        message: the teacher's hint (induction only).
        n_shown: induction only: pairs ``[:n_shown]`` are shown to students, the rest are hidden tests.
        source: ``"seed"``, ``"jsonl"`` or the proposing agent's name.
        program_dsl: the DSL program in structured mode, else ``None``.
        candidates: structured-mode answer choices (shuffled), else empty.
    """

    task_id: str
    task_type: TaskType
    program: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    message: str = ""
    n_shown: int = 1
    source: str = "seed"
    program_dsl: dsl.DslProgram | None = field(default=None, compare=False)
    candidates: tuple[Candidate, ...] = field(default=(), compare=False)

    @property
    def shown_pairs(self) -> tuple[tuple[str, str], ...]:
        """Input/output pairs visible to students."""
        return tuple(zip(self.inputs[: self.n_shown], self.outputs[: self.n_shown], strict=True))

    @property
    def hidden_pairs(self) -> tuple[tuple[str, str], ...]:
        """Input/output pairs an induction answer is scored on."""
        return tuple(zip(self.inputs[self.n_shown :], self.outputs[self.n_shown :], strict=True))

    @property
    def gold(self) -> str:
        """The reference answer: the output (deduction), the input (abduction), the program (induction)."""
        if self.task_type == "deduction":
            return self.outputs[0]
        if self.task_type == "abduction":
            return self.inputs[0]
        return self.program


def task_id_for(task_type: str, program: str, inputs: Sequence[str]) -> str:
    """Stable identifier of a task (sha1 of its defining text, 12 hex digits)."""
    digest = hashlib.sha1("\x00".join([task_type, program, *inputs]).encode("utf-8", "replace"))
    return digest.hexdigest()[:12]


def normal_form(
    task_type: str, program: str, inputs: Sequence[str], outputs: Sequence[str] = (), n_shown: int = 1
) -> str:
    """What a task is, whatever its spelling: the task type; the program's syntax tree without comments,
    docstrings, ``pass`` statements beside others, and with its own names (parameters, variables, helper
    functions and classes, and keyword arguments with them; not ``f``, built-ins, imported names or
    attributes) renamed in order of appearance; each input by value (``+11`` is ``11``; ``"1, 2"`` two
    arguments, ``"(1, 2)"`` one tuple); the outputs; an induction task's shown pairs (``[:n_shown]``) in any
    order, and its hidden ones. A copy of a task with a comment added, a parameter renamed or an
    input re-spelled was a new task, paid as one (two reward-hacking reviews). The outputs are part of it,
    so that a program that reads its own names (``locals()``) is no copy of its renamed twin. The raw
    text where a tree cannot be made or dumped."""
    pairs = [_input_form(text) for text in inputs]
    if outputs:
        pairs = [f"{form}\x01{output}" for form, output in zip(pairs, outputs, strict=True)]
    if task_type == "induction":  # (shown and hidden apart: they are what students see and are tested on)
        pairs = [*sorted(pairs[:n_shown]), "\x02", *sorted(pairs[n_shown:])]
    return "\x00".join([task_type, _program_form(program), *pairs])


def _program_form(program: str) -> str:
    import ast
    import builtins

    try:
        tree = ast.parse(program)
        renamed: dict[str, str] = {}
        kept = set(vars(builtins)) | {"f"}
        for node in ast.walk(tree):  # imported names: `floor` and `ceil` renamed alike were one program
            if isinstance(node, ast.Import | ast.ImportFrom):
                kept.update((a.asname or a.name).split(".")[0] for a in node.names)
        # a keyword names a parameter of the program's own (renamed with it) or of a built-in (kept)
        parameters = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)} - kept

        def rename(name: str) -> str:
            return name if name in kept else renamed.setdefault(name, f"_{len(renamed)}")

        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body:
                if (
                    isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)
                ):
                    body = body[1:]
                kept_body = [b for b in body if not isinstance(b, ast.Pass)] or [ast.Pass()]
                node.body = kept_body  # type: ignore[attr-defined]
            if isinstance(node, ast.Name):
                node.id = rename(node.id)
            elif isinstance(node, ast.arg):
                node.arg = rename(node.arg)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                node.name = rename(node.name)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                node.names = [rename(name) for name in node.names]
            elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
                node.name = rename(node.name)
            elif isinstance(node, ast.keyword) and node.arg in parameters:  # (g(p=x) names g's parameter p)
                node.arg = rename(node.arg)
        return ast.dump(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return program


def _input_form(text: str) -> str:
    import ast

    from populora_env.verifier.literals import LiteralError, canonical_text, parse_args

    try:
        return canonical_text(parse_args(text))
    except (LiteralError, TypeError, RecursionError, MemoryError):
        pass
    try:
        return ast.dump(ast.parse(f"f(\n{text}\n)", mode="eval"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text


class TaskBuffer:
    """Per-type FIFO buffer of valid tasks, deduplicated by ``task_id`` and capped.

    Args:
        capacity: maximum tasks kept per type; the oldest non-seed task is dropped first.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._tasks: dict[str, list[Task]] = {t: [] for t in TASK_TYPES}
        self._ids: set[str] = set()

    def __len__(self) -> int:
        return sum(len(v) for v in self._tasks.values())

    def tasks(self, task_type: TaskType) -> tuple[Task, ...]:
        """All tasks of one type, oldest first."""
        return tuple(self._tasks[task_type])

    def add(self, task: Task) -> bool:
        """Adds a task unless an identical one is present; returns whether it was added."""
        if task.task_id in self._ids:
            return False
        bucket = self._tasks[task.task_type]
        if len(bucket) >= self.capacity:
            victim = next((i for i, t in enumerate(bucket) if t.source != "seed"), 0)
            self._ids.discard(bucket.pop(victim).task_id)
        bucket.append(task)
        self._ids.add(task.task_id)
        return True

    def state(self) -> dict[str, Any]:
        """The buffer as plain JSON data (:meth:`from_state` rebuilds it): its capacity and each type's
        tasks, oldest first."""
        return {"capacity": self.capacity, "tasks": {kind: [_task_state(t) for t in bucket]
                                                     for kind, bucket in self._tasks.items()}}  # fmt: skip

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> TaskBuffer:
        """The buffer ``state()`` describes.

        Raises:
            ValueError, KeyError, TypeError: ``state`` is not such a description.
        """
        if type(state["capacity"]) is not int or state["capacity"] < 1:
            raise ValueError(f"a buffer state's capacity is {state['capacity']!r}, not an int >= 1")
        buffer = cls(state["capacity"])
        if set(state["tasks"]) != set(TASK_TYPES):
            raise ValueError(
                f"a buffer state holds the task types {sorted(state['tasks'])}, not {TASK_TYPES}"
            )
        for kind in TASK_TYPES:
            tasks = [_task_from_state(t) for t in state["tasks"][kind]]
            if len(tasks) > buffer.capacity or any(t.task_type != kind for t in tasks):
                raise ValueError(
                    f"a buffer state's {kind} tasks are more than its capacity or of another type"
                )
            for task in tasks:
                if not buffer.add(task):
                    raise ValueError(f"a buffer state holds task {task.task_id} twice")
        return buffer

    def sample(self, task_type: TaskType, k: int, rng: random.Random) -> tuple[Task, ...]:
        """Up to ``k`` distinct tasks of a type, drawn uniformly without replacement, in random order."""
        bucket = self._tasks[task_type]
        n = len(bucket)
        k = min(k, n)
        if k <= 0:
            return ()
        if 2 * k > n:  # a large share of a small bucket: the library's sampler
            return tuple(rng.sample(bucket, k))
        # a few of many (the usual case, every round): distinct indices by rejection, each uniform from one
        # rng.random() draw: every ordered k-tuple of distinct tasks is equally likely, as with rng.sample,
        # at a fraction of its cost per call
        picks: list[int] = []
        while len(picks) < k:
            i = int(rng.random() * n)
            if i not in picks:
                picks.append(i)
        return tuple(bucket[i] for i in picks)


def _task_state(task: Task) -> dict[str, Any]:
    def vector(program: dsl.DslProgram | None) -> list[int] | None:
        return None if program is None else list(program.vector())

    return {
        "task_id": task.task_id, "task_type": task.task_type, "program": task.program,
        "inputs": list(task.inputs), "outputs": list(task.outputs), "message": task.message,
        "n_shown": task.n_shown, "source": task.source, "program_dsl": vector(task.program_dsl),
        "candidates": [[c.text, c.correct, vector(c.program)] for c in task.candidates],
    }  # fmt: skip


def _task_from_state(state: Mapping[str, Any]) -> Task:
    def program(vector: list[int] | None) -> dsl.DslProgram | None:
        return (
            None if vector is None else dsl.decode(np.asarray(vector, dtype=np.int64), (len(vector) - 2) // 2)
        )

    def text(value: Any, what: str) -> str:
        if type(value) is not str:
            raise TypeError(f"a buffer state's task {what} is a {type(value).__name__}, not a str")
        return value

    task_type = text(state["task_type"], "type")
    if task_type not in TASK_TYPES:
        raise ValueError(f"a buffer state's task has the type {task_type!r}")
    inputs = tuple(text(v, "input") for v in state["inputs"])
    outputs = tuple(text(v, "output") for v in state["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError("a buffer state's task has no inputs, or not one output per input")
    program_text = text(state["program"], "program")
    if text(state["task_id"], "id") != task_id_for(task_type, program_text, inputs):
        raise ValueError(f"a buffer state's task {state['task_id']!r} is not the task its fields describe")
    if type(state["n_shown"]) is not int or not 1 <= state["n_shown"] <= len(inputs):
        raise ValueError(f"a buffer state's task shows {state['n_shown']!r} of its {len(inputs)} pairs")
    if any(type(correct) is not bool for _, correct, _ in state["candidates"]):
        raise TypeError("a buffer state's candidate is marked correct by something other than true or false")
    candidates = tuple(
        Candidate(text(c_text, "candidate"), correct, program(vector))
        for c_text, correct, vector in state["candidates"]
    )
    return Task(
        state["task_id"], task_type, program_text, inputs, outputs, text(state["message"], "message"),
        int(state["n_shown"]), text(state["source"], "source"), program(state["program_dsl"]), candidates,
    )  # fmt: skip


@dataclass(frozen=True)
class SeedSpec:
    """An unverified seed: a program and its argument lists (outputs come from the verifier).

    Attributes:
        task_type: the buffer this seed goes to.
        program: Python source defining ``def f``.
        inputs: argument-list texts.
        program_dsl: the DSL program it was rendered from, if any.
        message: induction hint.
        source: provenance tag.
        expected: the output a JSONL record claims (checked by the verifier), or ``None``.
    """

    task_type: TaskType
    program: str
    inputs: tuple[str, ...]
    program_dsl: dsl.DslProgram | None = None
    message: str = ""
    source: str = "seed"
    expected: str | None = None


def builtin_seed_specs(n_per_type: int, n_slots: int, seed: int = 0) -> list[SeedSpec]:
    """The built-in seed set: DSL programs of mixed difficulty, generated deterministically.

    Args:
        n_per_type: seeds per task type.
        n_slots: op slots of the DSL programs (structured mode needs the env's value).
        seed: base seed; item ``i`` uses ``random.Random(seed * 100_003 + i)`` (reasoning-gym style).
    """
    specs: list[SeedSpec] = []
    for t_index, task_type in enumerate(TASK_TYPES):
        for i in range(n_per_type):
            rng = random.Random(seed * 100_003 + t_index * 10_007 + i)
            program = dsl.random_program(rng, n_slots, difficulty=(i % 4) / 4)
            if task_type == "induction":
                indices = rng.sample(range(dsl.N_INPUTS), 4)
                variants = [dsl.DslProgram(program.input_type, j, program.slots) for j in indices]
                rendered = [dsl.render(v) for v in variants]
                specs.append(
                    SeedSpec(
                        task_type,
                        rendered[0][0],
                        tuple(a for _, a in rendered),
                        program,
                        message=f"f takes a {dsl.VALUE_TYPES[program.input_type]}.",
                    )
                )
            else:
                source, args = dsl.render(program)
                specs.append(SeedSpec(task_type, source, (args,), program))
    return specs


def load_jsonl_specs(path: str | os.PathLike[str], limit: int | None = None) -> list[SeedSpec]:
    """Reads CRUXEval/AZR-format records ``{"code", "input", "output"}`` as deduction and abduction seeds.

    The given outputs are not trusted: the env re-runs every seed through the verifier and keeps only
    those whose output matches; a record without an ``output`` gets the one the verifier computes.
    Malformed lines are skipped with a logged warning naming the line; over-long fields are skipped with
    one warning counting them.

    Args:
        path: a JSONL file given by the user.
        limit: read at most this many records.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
    """
    records, errors = load_records(path)
    for error in errors:
        logger.warning("%s:%d: skipped: %s", path, error.line, error.reason)
    specs: list[SeedSpec] = []
    too_long = 0
    for record in records:
        if limit is not None and len(specs) >= 2 * limit:
            break
        if len(record.code) > MAX_JSONL_FIELD_CHARS or len(record.input) > MAX_JSONL_FIELD_CHARS:
            too_long += 1
            continue
        for task_type in ("deduction", "abduction"):
            specs.append(
                SeedSpec(task_type, record.code, (record.input,), source="jsonl", expected=record.output)
            )
    if too_long:
        logger.warning(
            "%s: skipped %d record(s) whose code or input is over %d characters", path, too_long,
            MAX_JSONL_FIELD_CHARS,
        )  # fmt: skip
    return specs


def run_all(verifier: Any, items: list[tuple[str, str]]) -> list[Any]:
    """``verifier.run_many(items)``, checked to return one run per item: the env takes any object with the
    verifier's methods, and a miscounting one would otherwise pair outputs with the wrong inputs.

    Raises:
        RuntimeError: the verifier returned another number of runs.
    """
    runs = list(verifier.run_many(items))
    if len(runs) != len(items):
        raise RuntimeError(
            f"{type(verifier).__name__}.run_many returned {len(runs)} runs for {len(items)} (program, args) items"
        )
    return runs


def verify_specs(specs: Iterable[SeedSpec], verifier: object) -> list[Task]:
    """Runs seed specs through the verifier and returns the valid ones as tasks.

    A seed whose verified output differs from the one its JSONL record claims (``expected``) is dropped;
    a warning counts them.
    """
    specs = list(specs)
    calls = [(s.program, a) for s in specs for a in s.inputs]
    results = iter(run_all(verifier, calls))
    tasks: list[Task] = []
    mismatched = 0
    for spec in specs:
        runs = [next(results) for _ in spec.inputs]
        if any(r.status != "ok" or r.output is None for r in runs):
            continue
        outputs = tuple(str(r.output) for r in runs)
        if spec.expected is not None and not verifier.check_deduction(  # type: ignore[attr-defined]
            spec.program, spec.inputs[0], spec.expected
        ):
            mismatched += 1
            continue
        n_shown = max(1, len(outputs) // 2) if spec.task_type == "induction" else 1
        tasks.append(
            Task(
                task_id_for(spec.task_type, spec.program, spec.inputs),
                spec.task_type,
                spec.program,
                spec.inputs,
                outputs,
                message=spec.message,
                n_shown=n_shown,
                source=spec.source,
                program_dsl=spec.program_dsl,
            )
        )
    if mismatched:
        logger.warning("%d seed(s) dropped: the verified output differs from the record's", mismatched)
    return tasks
