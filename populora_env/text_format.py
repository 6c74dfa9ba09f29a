"""Text mode: AZR-style prompts (reasoning tags, fenced blocks) and tolerant, never-raising answer parsing.

Answer format (after Absolute Zero Reasoner, arXiv 2505.03335, their prompt templates): optional
``<think>...</think>``, then ``<answer>...</answer>`` holding fenced blocks whose info string names the
field: ```` ```python ````, ```` ```input ````, ```` ```output ````, ```` ```message ````. Parsing is tolerant
about whitespace, case of the tags and text around the blocks, and strict about what counts: the last
closed ``<answer>`` element is the answer (text after it, an unclosed ``<answer>`` included, is ignored,
so a generation that rambles on after answering is judged by that answer, as long as the whole action is
within its length cap, which is checked first), and it must hold the required blocks, or the action is a
format error.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from populora_env.tasks import Task, TaskType
from populora_env.verifier.literals import (
    PYTHON_SPACE,
    LiteralError,
    on_a_fresh_stack,
    parse_args,
    parse_literal,
)

# The deliberate printable charset of every Text space: tab, newline and printable ASCII.
CHARSET = frozenset("\t\n" + "".join(chr(c) for c in range(32, 127)))
MAX_PROGRAM_CHARS = 4000
MAX_LITERAL_CHARS = 1000
MAX_MESSAGE_CHARS = 500
_NON_CHARSET = re.compile(r"[^\t\n\x20-\x7e]")
# ASCII case only, as on the ASCII path (`str.lower`): Unicode case folding also took "<anſwer>" (U+017F,
# long s) for a tag in text with other non-ASCII characters (a reward-hacking review)
_OPEN = re.compile(r"<answer>", re.IGNORECASE | re.ASCII)
_CLOSE = re.compile(r"</answer>", re.IGNORECASE | re.ASCII)
_ANSWER_TAG = re.compile(r"</?answer>", re.IGNORECASE | re.ASCII)
_BLOCK = re.compile(r"```[ \t]*([A-Za-z]+)[ \t]*\r?\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class FormatError:
    """A malformed action.

    Attributes:
        reason: a short machine-readable reason (``too_long``, ``not_utf8``, ``no_answer``,
            ``missing_python``, ...).
    """

    reason: str


@dataclass(frozen=True)
class Proposal:
    """A parsed teacher proposal (not yet verified).

    Attributes:
        program: Python source expected to define ``def f``.
        inputs: argument-list texts (one for deduction/abduction, several for induction).
        message: the induction hint, else empty.
    """

    program: str
    inputs: tuple[str, ...]
    message: str = ""


@dataclass(frozen=True)
class Answer:
    """A parsed student answer: an output literal, an argument list, or a program source."""

    text: str


def sanitize(text: str, max_chars: int) -> str:
    """Maps a string into ``CHARSET`` (others become ``?``) and truncates it to ``max_chars``."""
    if len(text) > max_chars:
        marker = "\n[...truncated]"
        text = text[: max(0, max_chars - len(marker))] + marker
        text = text[:max_chars]
    return _NON_CHARSET.sub("?", text)


def lone_surrogate(text: str) -> int | None:
    """The index of the first character of ``text`` that UTF-8 cannot encode (a lone surrogate, as text decoded
    with ``errors="surrogateescape"`` holds), or ``None`` where ``text`` is valid Unicode."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def _blocks(text: str, max_chars: int) -> dict[str, list[str]] | FormatError:
    if not isinstance(text, str):
        return FormatError("not_a_string")
    if len(text) > max_chars:
        return FormatError("too_long")
    text = text.replace("\r\n", "\n")  # CRLF line ends: the program's lines would keep their "\r"
    # The last closed <answer> element, found in linear time (no backtracking regex on hostile text).
    # (str.lower() may change lengths on non-ASCII text, so the tags are matched case-insensitively.)
    if text.isascii():  # lower() keeps ASCII lengths, so indices carry over
        lowered = text.lower()
        end = lowered.rfind("</answer>")
        start = lowered.rfind("<answer>", 0, max(end, 0))
        start = start + len("<answer>") if start >= 0 else -1
    else:
        end = max((m.start() for m in _CLOSE.finditer(text)), default=-1)
        start = max((m.end() for m in _OPEN.finditer(text, 0, max(end, 0))), default=-1)
    if end < 0 or start < 0:
        return FormatError("no_answer")
    found: dict[str, list[str]] = {}
    for tag, body in _BLOCK.findall(text, start, end):
        if lone_surrogate(body) is not None:  # no tokenizer takes it on
            return FormatError("not_utf8")  # (other players' prompts show the blocks of valid tasks)
        found.setdefault(tag.lower(), []).append(body.strip("\n"))
    return found


def parse_proposal(
    text: str, task_type: TaskType, *, max_chars: int, min_inputs: int = 2, max_inputs: int = 6
) -> Proposal | FormatError:
    """Parses a teacher's raw output; any string is accepted and never raises.

    Args:
        text: the raw action.
        task_type: deduction/abduction want a python and an input block (the first of each counts; every
            input block must still hold an argument list within ``MAX_LITERAL_CHARS``); induction wants a
            python block, ``min_inputs..max_inputs`` distinct input blocks (blocks ``==`` in value are one
            input, ``"5"`` and ``"(5)"``) and a non-empty message block.
        max_chars: longer actions are a format error.
        min_inputs: induction's minimum number of distinct inputs.
        max_inputs: induction's maximum number of distinct inputs (more are a format error).

    An input block of comments alone is no argument list (it read as a call with no arguments).
    """
    found = _blocks(text, max_chars)
    if isinstance(found, FormatError):
        return found
    programs = found.get("python", [])
    inputs = [s.strip(PYTHON_SPACE) for s in found.get("input", [])]
    if not programs:
        return FormatError("missing_python")
    program = programs[0]
    if not program.strip() or len(program) > MAX_PROGRAM_CHARS:
        return FormatError("bad_python_length")
    if not inputs or any(not _holds_code(s) or len(s) > MAX_LITERAL_CHARS for s in inputs):
        return FormatError("missing_or_bad_input")
    if task_type != "induction":
        return Proposal(program, (inputs[0],))
    first_of_each: dict[Hashable, str] = {}  # distinct by value (==), not by text: "5", "(5)", "5.0" are one
    for args in inputs:
        first_of_each.setdefault(_value_key(args), args)
    distinct = tuple(first_of_each.values())
    if not min_inputs <= len(distinct) <= max_inputs:
        return FormatError("wrong_number_of_inputs")
    messages = found.get("message", [])
    if (
        not messages or not messages[0].strip() or len(messages[0]) > MAX_MESSAGE_CHARS
    ):  # (an empty one passed)
        return FormatError("missing_or_bad_message")
    return Proposal(program, distinct, messages[0].strip())


def _holds_code(text: str) -> bool:
    """Whether ``text`` holds more than blank lines and ``#`` comments (a red-team review: ``# none`` was an
    input block, the call with no arguments, past the refusal of an empty one)."""
    # lines as Python ends a comment, at \n or \r only (str.splitlines also broke at \x0c, \x85, U+2028...:
    # "# none\x0c1" is one comment to Python, and passed; a review)
    lines = text.replace("\r", "\n").split("\n")
    return any(line.strip() and not line.lstrip().startswith("#") for line in lines)


_VALUE_KEYS: dict[str, Hashable] = {}
"""``_value_key``'s parsed keys (a literal parse per input; teachers repeat inputs; the env's step is hot)."""


def _value_key(args: str) -> Hashable:
    """What makes two argument lists the same input: equal keys for argument lists that are ``==`` (the
    verifier's comparison: ``"5"``, ``"(5)"`` and ``"5.0"`` are one input, ``"1"`` and ``"True"`` another),
    or the text itself where it is not a plain literal argument list (the verifier judges those). Parsed
    on a fresh stack when the caller's runs out (``on_a_fresh_stack``); only parsed keys are kept."""
    key = _VALUE_KEYS.get(args)
    if key is not None:
        return key
    try:
        key = ("v", on_a_fresh_stack(lambda: _equality_key(parse_args(args, max_chars=MAX_LITERAL_CHARS))))
    except (LiteralError, TypeError, RecursionError, MemoryError):
        return ("t", args)
    if len(_VALUE_KEYS) >= 4096:
        _VALUE_KEYS.clear()
    _VALUE_KEYS[args] = key
    return key


def _equality_key(value: Any) -> Hashable:
    """A hashable key equal for plain literal values that are ``==``: numbers by value (``True == 1 ==
    1.0 == 1+0j``, ``-0.0 == 0``), lists and tuples element-wise (a list never equals a tuple), sets and
    dicts whatever their order."""
    if isinstance(value, bool | int):
        return ("n", int(value))
    if isinstance(value, float):
        return ("n", int(value)) if value.is_integer() else ("n", value)
    if isinstance(value, complex):
        return _equality_key(value.real) if value.imag == 0 else ("c", value)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_equality_key(v) for v in value))
    if isinstance(value, set | frozenset):
        return ("set", frozenset(_equality_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", frozenset((_equality_key(k), _equality_key(v)) for k, v in value.items()))
    return (type(value).__name__, value)  # str, bytes, None


_ANSWER_BLOCKS: dict[str, tuple[str, int]] = {
    "deduction": ("output", MAX_LITERAL_CHARS),
    "abduction": ("input", MAX_LITERAL_CHARS),
    "induction": ("python", MAX_PROGRAM_CHARS),
}
"""Per task type, the block a student's answer holds and the longest body ``parse_answer`` takes."""


def parse_answer(text: str, task_type: TaskType, *, max_chars: int) -> Answer | FormatError:
    """Parses a student's raw output: an ```output (deduction), ```input (abduction) or ```python
    (induction) block inside ``<answer>``; any string is accepted and never raises."""
    found = _blocks(text, max_chars)
    if isinstance(found, FormatError):
        return found
    tag, cap = _ANSWER_BLOCKS[task_type]
    bodies = found.get(tag, [])
    if not bodies:
        return FormatError(f"missing_{tag}")
    # (trimmed as the verifier trims a literal: a body in NBSPs was taken here and refused there; a review)
    body = bodies[0] if tag == "python" else bodies[0].strip(PYTHON_SPACE)
    if not body.strip() or len(body) > cap:
        return FormatError(f"bad_{tag}_length")
    return Answer(body)


def format_proposal(program: str, inputs: Sequence[str], message: str = "", reasoning: str = "") -> str:
    """Writes a proposal in the answer format (used by scripted policies and the tiny base's corpus)."""
    parts = [f"<think>{reasoning}</think>", "<answer>", f"```python\n{program}\n```"]
    parts += [f"```input\n{args}\n```" for args in inputs]
    if message:
        parts.append(f"```message\n{message}\n```")
    parts.append("</answer>")
    return "\n".join(parts)


def format_answer(task_type: TaskType, body: str, reasoning: str = "") -> str:
    """Writes a student answer in the answer format."""
    tag = _ANSWER_BLOCKS[task_type][0]
    return f"<think>{reasoning}</think>\n<answer>\n```{tag}\n{body}\n```\n</answer>"


def _task_block(task: Task, show_hidden: bool = False) -> str:
    if task.task_type == "induction":
        pairs = task.shown_pairs + (task.hidden_pairs if show_hidden else ())
        lines = [f"```message\n{task.message}\n```"] if task.message else []
        lines += [f"```input\n{a}\n```\n```output\n{o}\n```" for a, o in pairs]
        return "\n".join(lines)
    return (
        f"```python\n{task.program}\n```\n```input\n{task.inputs[0]}\n```\n```output\n{task.outputs[0]}\n```"
    )


_PROPOSE_GOAL = {
    "deduction": "Write a Python function `f` and one input. Students will predict the output.",
    "abduction": "Write a Python function `f` and one input. Students will see the output and must find "
    "an input that produces it.",
    "induction": "Write a Python function `f`, several distinct inputs and a short message. Students see "
    "the message and half of the input/output pairs and must write `f`; the other pairs test it.",
}


def _showable_to_teachers(task: Task) -> bool:
    """Whether an induction reference's program and hidden pairs, which ``unshowable`` leaves unchecked (no
    student sees them), can be shown to teachers as they are: no character outside ``CHARSET`` (shown as
    ``?``, the reference no longer matched its outputs) and no answer markup (a hidden output made at run
    time put fences and answer tags into other teachers' prompts; a text-mode audit). Such a reference is
    left out of teacher prompts, the task stays valid for its students."""
    texts = (task.program, *(text for pair in task.hidden_pairs for text in pair))
    return not any(
        _NON_CHARSET.search(text) or "```" in text or ("<" in text and _ANSWER_TAG.search(text))
        for text in texts
    )


def teacher_prompt(task_type: TaskType, references: Sequence[Task], max_chars: int | None = None) -> str:
    """The prompt a teacher sees: the goal, reference tasks from the buffer and the answer format.

    Args:
        max_chars: With a limit, a reference that would take the prompt over it is left out (the next
            ones may still fit), so that a long reference never pushes the answer format out of a prompt
            cut to that length.
    """
    head = [f"## Propose a {task_type} task", _PROPOSE_GOAL[task_type]]
    head.append("The function must be deterministic, take plain literals and return a plain literal.")
    fmt = "```python\ndef f(...):\n    ...\n```\n```input\narguments\n```"
    if task_type == "induction":
        fmt += "\n```input\nother arguments\n```\n```message\nhint\n```"
    tail = f"## Answer format\n<think>reasoning</think>\n<answer>\n{fmt}\n</answer>"
    if (
        task_type == "induction"
    ):  # (program and hidden pairs too: those only a teacher is shown are checked here)
        blocks = [
            f"```python\n{ref.program}\n```\n{_task_block(ref, True)}"
            for ref in references
            if _showable_to_teachers(ref)
        ]
    else:
        blocks = [_task_block(ref) for ref in references]
    prompt = "\n\n".join([*head, *(f"### Reference {i + 1}\n{b}" for i, b in enumerate(blocks)), tail])
    if max_chars is None or len(prompt) <= max_chars:
        return prompt
    size = sum(len(part) + 2 for part in head) + len(tail)  # parts are joined by blank lines
    shown: list[str] = []
    for block in blocks:
        part = f"### Reference {len(shown) + 1}\n{block}"
        if size + len(part) + 2 <= max_chars:
            shown.append(part)
            size += len(part) + 2
    return "\n\n".join([*head, *shown, tail])


def unshowable(task: Task, max_prompt_chars: int, max_action_chars: int | None = None) -> str | None:
    """Why a text-mode student could not see ``task`` as it is, or ``None``: a character outside ``CHARSET``
    in what its prompt shows or in its gold answer (the prompt would show ``?``: ``'é'`` could not be
    answered; an induction task's hidden program and pairs need not be shown), the answer format's own
    markup (a ```` ``` ```` fence, ``<answer>`` or ``</answer>``) in what it shows or in the gold answer
    (the gold, written in the answer format, would not parse back), a prompt over ``max_prompt_chars``
    (it would be cut short), or a gold answer no student could give (``answer_too_long``: a deduction
    output of 1 200 characters was a format error, the solve rate 0 by construction, which the adversarial
    reward paid). Measured on the shortest answer that counts: the gold's most compact ``==`` literal
    (``_compact``; deduction) in the least markup ``parse_answer`` takes, against its cap
    (``MAX_LITERAL_CHARS``, ``MAX_PROGRAM_CHARS`` for induction) and ``max_action_chars``."""
    if task.task_type == "induction":
        texts: tuple[str, ...] = (task.message, *(text for pair in task.shown_pairs for text in pair))
    else:
        texts = (task.program, task.inputs[0], task.outputs[0])
    if any(_NON_CHARSET.search(text) for text in texts):
        return "unshowable_characters"
    if any("```" in text or ("<" in text and _ANSWER_TAG.search(text)) for text in (*texts, task.gold)):
        return "answer_markup"
    if len(student_prompt(task)) > max_prompt_chars:
        return "prompt_too_long"
    shortest = _shortest_gold(task)
    if len(shortest) > _ANSWER_BLOCKS[task.task_type][1] or (
        max_action_chars is not None and len(shortest_answer(task)) > max_action_chars
    ):
        return "answer_too_long"
    return None


def _shortest_gold(task: Task) -> str:
    """The gold answer's shortest text that counts: for deduction its most compact ``==`` literal."""
    shortest = task.gold if task.task_type == "induction" else task.gold.strip()
    if task.task_type == "deduction":
        try:
            shortest = _compact(parse_literal(shortest, max_chars=len(shortest)))
        except (LiteralError, TypeError, RecursionError):
            pass  # (a verifier's output always parses)
    return shortest


def shortest_answer(task: Task) -> str:
    """The task's gold answer in the fewest characters ``parse_answer`` takes as it: the gold's shortest
    text (``_compact`` for deduction) in the least markup, no reasoning. ``unshowable`` accepts a task only
    when this fits ``max_action_chars``."""
    tag = _ANSWER_BLOCKS[task.task_type][0]
    return f"<answer>```{tag}\n{_shortest_gold(task)}```</answer>"


def _compact(value: Any) -> str:
    """The shortest literal text ``==`` to plain data ``value`` that this writes: no spaces, ``1``/``0``
    for ``True``/``False``, an integral float as the shorter of its int and float forms."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return min(repr(value), repr(int(value)), key=len)
    if isinstance(value, complex) and value.imag == 0:
        return _compact(value.real)
    if isinstance(value, list):
        return "[" + ",".join(map(_compact, value)) + "]"
    if isinstance(value, tuple):
        return "(" + ",".join(map(_compact, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, set | frozenset):
        return "{" + ",".join(map(_compact, value)) + "}" if value else "set()"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_compact(k)}:{_compact(v)}" for k, v in value.items()) + "}"
    return repr(value)


def student_prompt(task: Task) -> str:
    """The prompt a student sees for one task, with the answer format it must use."""
    if task.task_type == "deduction":
        body = f"```python\n{task.program}\n```\n```input\n{task.inputs[0]}\n```"
        ask = "Predict the output of `f` on this input."
    elif task.task_type == "abduction":
        body = f"```python\n{task.program}\n```\n```output\n{task.outputs[0]}\n```"
        ask = "Give arguments for `f` that produce this output."
    else:
        body = _task_block(task)
        ask = "Write the function `f` that maps these inputs to these outputs."
    fmt = format_answer(task.task_type, "...", "reasoning")
    return f"## Solve a {task.task_type} task\n{ask}\n\n{body}\n\n## Answer format\n{fmt}"
