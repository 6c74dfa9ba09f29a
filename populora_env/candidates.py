"""Structured mode: the k answer candidates of a task (the gold one plus verified distractors)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

from populora_env import dsl
from populora_env.tasks import Candidate, Task, run_all
from populora_env.verifier.literals import outputs_equal


def _outputs_equal(a: str, b: str) -> bool:
    """Python ``==`` on the parsed literals; equal canonical texts (the verifier's outputs) need no parse."""
    return a == b or bool(outputs_equal(a, b))


def make_candidates(task: Task, verifier: Any, rng: random.Random, k: int) -> tuple[Candidate, ...]:
    """Up to ``k`` shuffled candidates for ``task`` that the student's observation tells apart (distinct
    texts, distinct value rows), each marked correct by execution.

    Distractors come from nearby programs on the same input for deduction (their outputs) and induction
    (their sources), and from other inputs for abduction. The nearby programs are *siblings* of the task's
    program, not its variants: each is one change (``dsl.perturbed_slots``) away from a hidden decoy that
    is itself one change away from the task's program, so every candidate, the right one included, is one
    change from the same centre. Variants of the task's program itself would make the right candidate the
    centre of the set, and picking the candidate most like the others would find it without solving
    anything (it did for 92% of induction tasks against 50% by chance; ``tests/test_env_features.py``
    keeps that shortcut near chance). Correctness is
    decided by running through the verifier and comparing canonical literals, never by text identity:
    a distractor that happens to be right (``1`` vs ``True``, a second input with the same output, an
    equivalent program) is marked correct, and an induction distractor that the shown pairs cannot tell wrong
    (it fails only hidden pairs) is dropped. All runs of one task go to the verifier in one batch.
    Every random draw comes from ``rng`` (the variants, then a seed of the order, which is drawn with the
    task's id).
    """
    base = task.program_dsl
    if base is None:
        raise ValueError("structured candidates need a DSL task")
    pool: Iterable[tuple[str, dsl.Slots | None]]
    if task.task_type == "deduction":  # outputs: all variants go to the verifier in one batch
        args = dsl.input_text(base.input_type, base.input_index)
        variants = dsl.perturbed_slots(_decoy(base, rng), rng, 3 * k)
        runs = run_all(verifier, [(dsl.render_source(base.input_type, slots), args) for slots in variants])
        pool = [(str(r.output), None) for r in runs if r.status == "ok" and r.output is not None]
    else:  # texts only: variants are drawn in the same order, but only until k distinct texts are found
        pool = _text_variants(base, task.task_type, rng, 3 * k)
    texts, programs = [task.gold], [base if task.task_type == "induction" else None]
    seen = {_seen_as(task.task_type, task.gold)}
    for text, slots in pool:
        if len(texts) >= k:
            break
        if (key := _seen_as(task.task_type, text)) not in seen:
            seen.add(key)
            texts.append(text)
            programs.append(
                None if slots is None else dsl.DslProgram(base.input_type, base.input_index, slots)
            )
    flags, unseen = _correct_flags(task, texts, verifier)
    candidates = [
        Candidate(t, ok, p)
        for t, ok, p, hidden in zip(texts, flags, programs, unseen, strict=True)
        if ok or not hidden
    ]
    # the order is drawn from rng *and* the task: from rng alone, an env reset with the same seed every episode
    # drew about the same permutation whatever the task (the draws before it hardly depend on the program),
    # and "round r -> index j" found the right candidate in up to 100% of tasks (a red-team review, round 45)
    random.Random(f"{rng.getrandbits(64)}:{task.task_id}").shuffle(candidates)
    return tuple(candidates)


def _seen_as(task_type: str, text: str) -> str | bytes:
    """What tells a candidate apart in a student's observation: an induction candidate's program row
    (one per source), else the value row of its text, which clips numbers and keeps 8 elements: ``1200``
    and ``1500`` are one row, so a wrong candidate could be indistinguishable from the right one."""
    return text if task_type == "induction" else dsl.value_row(text).tobytes()


def _text_variants(
    base: dsl.DslProgram, task_type: str, local: random.Random, n: int
) -> Iterator[tuple[str, dsl.Slots | None]]:
    """Up to ``n`` distractor texts drawn one by one: another input (abduction) or a nearby program's source
    with its slots (induction)."""
    if task_type == "abduction":
        for _ in range(n):
            yield dsl.input_text(base.input_type, dsl.perturbed_input_index(base, local)), None
    else:
        for slots in dsl.perturbed_slots(_decoy(base, local), local, n):
            yield dsl.render_source(base.input_type, slots), slots


DECOY_TRIES = 32
"""Changes ``_decoy`` draws at most to find one that shows in the rendered source."""


def _decoy(base: dsl.DslProgram, rng: random.Random) -> dsl.DslProgram:
    """The hidden centre of a task's distractors: ``base`` with one change (see ``make_candidates``) that
    shows in its source. Many changes do not (the arg of an op that takes none, an op skipped for its input
    type): such a decoy renders as ``base`` itself, which put the right candidate back at the centre (the
    candidate whose source is closest to the others' was right in 0.62 of induction tasks of random teacher
    actions against 0.41 by chance). A program whose changes all render alike keeps the last one drawn."""
    source = dsl.render_source(base.input_type, base.slots)
    slots = base.slots
    for slots in dsl.perturbed_slots(base, rng, DECOY_TRIES):
        if dsl.render_source(base.input_type, slots) != source:
            break
    return dsl.DslProgram(base.input_type, base.input_index, slots)


def _correct_flags(task: Task, texts: list[str], verifier: Any) -> tuple[list[bool], list[bool]]:
    """Whether each candidate is right, and whether what tells it wrong is hidden from the student: an induction
    candidate that gives the shown pairs' outputs and fails a hidden one (``make_candidates`` drops it). With it,
    no student could do better than a guess among such candidates, and a teacher was paid for tasks that are
    underdetermined, not hard (a guard false on the shown inputs, true on a hidden one: the best possible student
    solved about half of them; a red-team review, round 45)."""
    if task.task_type == "deduction":
        return [_outputs_equal(t, task.outputs[0]) for t in texts], [False] * len(texts)
    if task.task_type == "abduction":
        runs = run_all(verifier, [(task.program, t) for t in texts])
        return [_produced(r, task.outputs[0]) for r in runs], [False] * len(texts)
    pairs = (*task.shown_pairs, *task.hidden_pairs)
    runs = run_all(verifier, [(t, args) for t in texts for args, _ in pairs])
    produced = list(map(_produced, runs, [out for _, out in pairs] * len(texts)))
    n, shown = len(pairs), len(task.shown_pairs)  # produced[i * n : (i + 1) * n]: text i's runs, shown first
    flags = [all(produced[i * n : (i + 1) * n]) for i in range(len(texts))]
    looks_right = [all(produced[i * n : i * n + shown]) for i in range(len(texts))]
    return flags, [seen and not ok for seen, ok in zip(looks_right, flags, strict=True)]


def _produced(run: Any, expected: str) -> bool:
    """Whether a verifier run succeeded with an output ``==`` to ``expected``."""
    return run.status == "ok" and run.output is not None and _outputs_equal(run.output, expected)
