"""Structured mode: the k answer candidates of a task (the gold one plus verified distractors)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from populora_env import dsl
from populora_env.tasks import Candidate, Task
from populora_env.verifier.literals import outputs_equal


def _outputs_equal(a: str, b: str) -> bool:
    """Python ``==`` on the parsed literals; equal canonical texts (the verifier's outputs) need no parse."""
    return a == b or bool(outputs_equal(a, b))


def with_candidates(task: Task, verifier: Any, rng: np.random.Generator, k: int) -> Task:
    """Returns ``task`` with up to ``k`` shuffled, text-distinct candidates, each marked correct by execution.

    Distractors come from nearby programs (``dsl.perturb_program``) on the same input for deduction
    (their outputs) and induction (their sources), and from other inputs for abduction. Correctness is
    decided by running through the verifier and comparing canonical literals, never by text identity:
    a distractor that happens to be right (``1`` vs ``True``, a second input with the same output, an
    equivalent program) is marked correct. All runs of one task go to the verifier in one batch.
    """
    base = task.program_dsl
    if base is None:
        raise ValueError("structured candidates need a DSL task")
    local = random.Random(int(rng.integers(2**31)))
    pool: Iterable[tuple[str, dsl.DslProgram | None]]
    if task.task_type == "deduction":  # outputs: all variants go to the verifier in one batch
        rendered = [dsl.render(dsl.perturb_program(base, local)) for _ in range(3 * k)]
        runs = verifier.run_many(rendered)
        pool = [(str(r.output), None) for r in runs if r.status == "ok" and r.output is not None]
    else:  # texts only: variants are drawn in the same order, but only until k distinct texts are found
        pool = _text_variants(base, task.task_type, local, 3 * k)
    texts, programs = [task.gold], [base if task.task_type == "induction" else None]
    for text, program in pool:
        if len(texts) >= k:
            break
        if text not in texts:
            texts.append(text)
            programs.append(program)
    flags = _correct_flags(task, texts, verifier)
    candidates = [Candidate(t, ok, p) for t, ok, p in zip(texts, flags, programs, strict=True)]
    order = rng.permutation(len(candidates))
    return replace(task, candidates=tuple(candidates[int(i)] for i in order))


def _text_variants(
    base: dsl.DslProgram, task_type: str, local: random.Random, n: int
) -> Iterator[tuple[str, dsl.DslProgram | None]]:
    """Up to ``n`` distractor texts drawn one by one: another input (abduction) or a nearby program's source
    with the program (induction)."""
    for _ in range(n):
        if task_type == "abduction":
            yield dsl.render(dsl.perturb_input(base, local))[1], None
        else:
            variant = dsl.perturb_program(base, local)
            yield dsl.render(variant)[0], variant


def _correct_flags(task: Task, texts: list[str], verifier: Any) -> list[bool]:
    if task.task_type == "deduction":
        return [_outputs_equal(t, task.outputs[0]) for t in texts]
    if task.task_type == "abduction":
        runs = verifier.run_many([(task.program, t) for t in texts])
        return [
            r.status == "ok" and r.output is not None and _outputs_equal(r.output, task.outputs[0])
            for r in runs
        ]
    hidden = task.hidden_pairs
    runs = iter(verifier.run_many([(t, args) for t in texts for args, _ in hidden]))
    flags = []
    for _ in texts:
        results = [next(runs) for _ in hidden]
        flags.append(
            all(
                r.status == "ok" and r.output is not None and _outputs_equal(r.output, out)
                for r, (_, out) in zip(results, hidden, strict=True)
            )
        )
    return flags
