"""A small typed program DSL for structured mode: MultiDiscrete actions rendered to real Python source.

A DSL program is an input choice plus ``L`` slots of ``(op, arg)``. Each op is a typed statement over one
variable ``x`` (int, list of ints or str). Control ops (``for`` loops and ``if`` guards) wrap the next
type-preserving op, and they stack, so depth, branching and length of the rendered program can really grow.
Ops whose input type does not match the current type are skipped when rendering, so every point of the
action space renders to a program: the verifier still decides whether it is valid (it may overflow the
output caps, for example).
"""

from __future__ import annotations

import functools
import itertools
import operator
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

ValueType = Literal["int", "list", "str"]
Slots = tuple[tuple[int, int], ...]
"""A program's ``(op, arg)`` slots."""
VALUE_TYPES: tuple[ValueType, ...] = ("int", "list", "str")
N_ARGS = 8
N_INPUTS = 16
MAX_CONTROL_DEPTH = 3
WORDS = (
    "apple", "banana", "kiwi", "level", "abracadabra", "sun", "moon", "river",
    "stars", "rotor", "python", "a", "", "mississippi", "teacher", "queue",
)  # fmt: skip


@dataclass(frozen=True)
class Op:
    """One DSL statement.

    Attributes:
        name: short identifier (used in metrics and docs).
        in_type: type of ``x`` the op needs; ``None`` for control ops (any type).
        out_type: type of ``x`` after the op; ``None`` for control ops.
        template: source line with ``{k}`` for the argument value (for control ops: the header, with
            ``{cond}`` standing for a type-dependent guard).
        arg: how an argument index ``a`` in ``0..N_ARGS-1`` maps to a value: ``pos`` is ``a+1``,
            ``small`` is ``a-2``, ``char`` is a letter, ``rep`` is ``a % 3 + 1``, ``none`` ignores it.
    """

    name: str
    in_type: ValueType | None
    out_type: ValueType | None
    template: str
    arg: Literal["pos", "small", "char", "rep", "none"] = "none"


OPS: tuple[Op, ...] = (
    # int -> int
    Op("add", "int", "int", "x = x + {k}", "pos"),
    Op("sub", "int", "int", "x = x - {k}", "pos"),
    Op("mul", "int", "int", "x = x * {k}", "small"),
    Op("floordiv", "int", "int", "x = x // {k}", "pos"),
    Op("mod", "int", "int", "x = x % {k}", "pos"),
    Op("min", "int", "int", "x = min(x, {k})", "small"),
    Op("absub", "int", "int", "x = abs(x) - {k}", "small"),
    # int -> list / str
    Op("repeat_list", "int", "list", "x = [x] * {k}", "pos"),
    Op("digits", "int", "list", "x = [int(c) for c in str(abs(x))]"),
    Op("range", "int", "list", "x = list(range(x % {k}))", "pos"),
    Op("to_str", "int", "str", "x = str(x) * {k}", "rep"),
    # list -> list
    Op("map_add", "list", "list", "x = [v + {k} for v in x]", "small"),
    Op("map_mul", "list", "list", "x = [v * {k} for v in x]", "small"),
    Op("map_mod", "list", "list", "x = [v % {k} for v in x]", "pos"),
    Op("filter_gt", "list", "list", "x = [v for v in x if v > {k}]", "small"),
    Op("filter_parity", "list", "list", "x = [v for v in x if v % 2 == {k} % 2]", "pos"),
    Op("reverse", "list", "list", "x = x[::-1]"),
    Op("sort", "list", "list", "x = sorted(x)"),
    Op("append", "list", "list", "x = x + [{k}]", "small"),
    Op("take", "list", "list", "x = x[:{k}]", "pos"),
    Op("drop", "list", "list", "x = x[{k}:]", "pos"),
    Op("pair_sums", "list", "list", "x = [a + b for a, b in zip(x, x[1:])]"),
    Op("unique", "list", "list", "x = sorted(set(x))"),
    # list -> int
    Op("sum", "list", "int", "x = sum(x)"),
    Op("len", "list", "int", "x = len(x)"),
    Op("max", "list", "int", "x = max(x, default={k})", "small"),
    Op("count", "list", "int", "x = x.count({k})", "small"),
    # str -> str
    Op("upper", "str", "str", "x = x.upper()"),
    Op("str_reverse", "str", "str", "x = x[::-1]"),
    Op("remove_char", "str", "str", "x = x.replace({k}, '')", "char"),
    Op("extend_prefix", "str", "str", "x = x + x[:{k}]", "pos"),
    Op("sort_chars", "str", "str", "x = ''.join(sorted(x))"),
    Op("rotate", "str", "str", "x = x[{k}:] + x[:{k}]", "pos"),
    # str -> int / list
    Op("str_len", "str", "int", "x = len(x)"),
    Op("str_count", "str", "int", "x = x.count({k})", "char"),
    Op("find", "str", "int", "x = x.find({k})", "char"),
    Op("ords", "str", "list", "x = [ord(c) % {k} for c in x]", "pos"),
    Op("split_lens", "str", "list", "x = [len(w) for w in x.split({k})]", "char"),
    # control: wrap the next type-preserving op
    Op("loop", None, None, "for _ in range({k}):", "rep"),
    Op("guard", None, None, "if {cond}:", "small"),
)
N_OPS = len(OPS) + 1  # op index 0 is an empty slot
# op index -> the op indices with the same (in, out) signature (perturbation keeps programs well typed)
_SAME_SIGNATURE = {
    i + 1: [j + 1 for j, o in enumerate(OPS) if (o.in_type, o.out_type) == (op.in_type, op.out_type)]
    for i, op in enumerate(OPS)
}
_GUARDS = {"int": "x > {k}", "list": "len(x) > {k}", "str": "len(x) > {k}"}
_CHARS = "aeiounst"


@dataclass(frozen=True)
class DslProgram:
    """A decoded structured-mode program.

    Attributes:
        input_type: index into ``VALUE_TYPES``.
        input_index: index of the input value in ``0..N_INPUTS-1`` (see ``input_value``).
        slots: ``(op, arg)`` pairs; op 0 is an empty slot.
    """

    input_type: int
    input_index: int
    slots: Slots

    def encode(self) -> np.ndarray:
        """Returns the MultiDiscrete action vector for this program (int64)."""
        return np.asarray(self.vector(), dtype=np.int64)

    def vector(self) -> tuple[int, ...]:
        """The action vector as plain ints: input type, input index, then each slot's op and arg."""
        return (self.input_type, self.input_index, *itertools.chain.from_iterable(self.slots))


def action_nvec(n_slots: int) -> np.ndarray:
    """The ``nvec`` of the teacher's MultiDiscrete action for ``n_slots`` op slots."""
    return np.asarray(_nvec(n_slots), dtype=np.int64)


@functools.lru_cache(maxsize=64)
def _nvec(n_slots: int) -> tuple[int, ...]:
    return (len(VALUE_TYPES), N_INPUTS, *[N_OPS, N_ARGS] * n_slots)


def decode(action: np.ndarray, n_slots: int) -> DslProgram:
    """Decodes a MultiDiscrete action vector; raises ValueError if it lies outside the space."""
    nvec = _nvec(n_slots)
    try:
        vec = np.asarray(action)
    except Exception as error:  # ragged nested lists; a tensor numpy cannot read (grad, GPU): any error
        raise ValueError(
            f"structured action must be an integer vector of shape {(len(nvec),)}, got a "
            f"{type(action).__name__} numpy cannot read ({type(error).__name__}: {str(error)[:120]})"
        ) from None
    # signed or unsigned integers by the dtype's kind: np.issubdtype(..., np.integer) also takes timedelta64,
    # whose tolist() gives datetime.timedelta objects (a TypeError past this check, red-team round 33)
    if vec.shape != (len(nvec),) or vec.dtype.kind not in "iu":
        raise ValueError(
            f"structured action must be an integer vector of shape {(len(nvec),)}, got {vec!r:.200}"
        )
    ints = vec.tolist()  # Python ints: the bounds check and the slots need no numpy scalars
    if min(ints) < 0 or not all(map(operator.lt, ints, nvec)):
        raise ValueError(f"structured action {ints} lies outside MultiDiscrete({list(nvec)})")
    return DslProgram(ints[0], ints[1], tuple(zip(ints[2::2], ints[3::2])))  # equal lengths: shape checked


def input_value(input_type: int, index: int) -> int | list[int] | str:
    """The concrete input value for an input choice (a fixed, documented table)."""
    kind = VALUE_TYPES[input_type]
    if kind == "int":
        return index - 3
    if kind == "list":
        return [(index * 7 + 3 * j * j) % 11 - 2 for j in range(index % 6 + 1)]
    return WORDS[index]


@functools.lru_cache(maxsize=1024)
def input_text(input_type: int, index: int) -> str:
    """The argument-list text of an input choice, ``repr(input_value(...))`` (a small fixed table, cached)."""
    return repr(input_value(input_type, index))


def _arg_value(op: Op, a: int) -> str:
    if op.arg == "pos":
        return str(a + 1)
    if op.arg == "small":
        return str(a - 2)
    if op.arg == "rep":
        return str(a % 3 + 1)
    if op.arg == "char":
        return repr(_CHARS[a])
    return ""


def render(program: DslProgram) -> tuple[str, str]:
    """Renders a program to Python source and its argument-list text.

    Returns:
        ``(source, args)``: ``source`` defines ``def f(x)``; ``args`` is the literal text of the input.
    """
    source = render_source(program.input_type, program.slots)
    return source, input_text(program.input_type, program.input_index)


@functools.lru_cache(maxsize=8192)
def render_source(input_type: int, slots: Slots) -> str:
    """The Python source of the program with these slots on an input of this type (pure, so cached; the
    input value itself does not appear in the source)."""
    kind: ValueType = VALUE_TYPES[input_type]
    lines: list[str] = []
    pending: list[tuple[Op, int]] = []
    for op_index, a in slots:
        if op_index == 0:
            continue
        op = OPS[op_index - 1]
        if op.in_type is None:
            if len(pending) < MAX_CONTROL_DEPTH:
                pending.append((op, a))
            continue
        if op.in_type != kind:
            pending.clear()
            continue
        # A guard or loop around a type-changing op would leave the type of x branch-dependent.
        controls = pending if op.out_type == kind else []
        depth = 1
        for control, ca in controls:
            cond = _GUARDS[kind].format(k=_arg_value(control, ca))
            lines.append("    " * depth + control.template.format(k=_arg_value(control, ca), cond=cond))
            depth += 1
        lines.append("    " * depth + op.template.format(k=_arg_value(op, a)))
        assert op.out_type is not None
        kind = op.out_type
        pending.clear()
    body = "\n".join([*lines, "    return x"])
    return f"def f(x):\n{body}"


def random_program(rng: random.Random, n_slots: int, difficulty: float) -> DslProgram:
    """Samples a well-typed program whose size and nesting grow with ``difficulty`` in [0, 1].

    Args:
        rng: the caller's generator (no global randomness).
        n_slots: number of op slots of the action space.
        difficulty: 0 gives one plain op; 1 fills every slot and uses control ops often.
    """
    kind_index = rng.randrange(len(VALUE_TYPES))
    kind = VALUE_TYPES[kind_index]
    n_used = max(1, min(n_slots, 1 + round(difficulty * (n_slots - 1))))
    slots: list[tuple[int, int]] = []
    while len(slots) < n_used:
        room = n_used - len(slots)
        if room >= 2 and rng.random() < 0.6 * difficulty:
            control = rng.choice([i for i, op in enumerate(OPS) if op.in_type is None])
            slots.append((control + 1, rng.randrange(N_ARGS)))
            # the next op must preserve the type for the control op to apply
            choices = [i for i, op in enumerate(OPS) if op.in_type == kind and op.out_type == kind]
        else:
            choices = [i for i, op in enumerate(OPS) if op.in_type == kind]
        pick = rng.choice(choices)
        slots.append((pick + 1, rng.randrange(N_ARGS)))
        kind = OPS[pick].out_type or kind
    slots += [(0, 0)] * (n_slots - len(slots))
    return DslProgram(kind_index, rng.randrange(N_INPUTS), tuple(slots[:n_slots]))


def perturbed_slots(program: DslProgram, rng: random.Random, n: int) -> Iterator[Slots]:
    """The slots of ``n`` nearby programs on the same input, drawn lazily: each has one arg changed or one
    op swapped for a same-signature op. Plausible distractor answers for structured-mode students.

    Candidate generation renders and deduplicates many such variants and keeps few, so it works on slots
    and builds a ``DslProgram`` only for the variants it keeps. A program without ops yields its own slots.
    Each variant costs three ``rng.random()`` draws, a uniform index being ``int(rng.random() * m)``, whose
    bias from the 53-bit float is below ``m * 2**-53`` (``random.choice``/``randrange`` cost several times
    more per call, and this is every structured proposal's hot loop: bench/env.py).
    """
    base = program.slots
    used = [i for i, (op, _) in enumerate(base) if op != 0]
    draw = rng.random
    for _ in range(n):
        if not used:
            yield base
            continue
        slots = list(base)
        i = used[int(draw() * len(used))]
        op, a = slots[i]
        if draw() < 0.5:
            slots[i] = (op, (a + 1 + int(draw() * (N_ARGS - 1))) % N_ARGS)
        else:
            same = _SAME_SIGNATURE[op]
            slots[i] = (same[int(draw() * len(same))], a)
        yield tuple(slots)


def perturbed_input_index(program: DslProgram, rng: random.Random) -> int:
    """Another input index of the same type for ``program`` (its abduction distractors' inputs)."""
    return (program.input_index + 1 + int(rng.random() * (N_INPUTS - 1))) % N_INPUTS


def induction_inputs(program: DslProgram, n: int) -> tuple[str, ...]:
    """The ``n`` argument lists of a structured induction task: consecutive inputs of the chosen type."""
    return tuple(input_text(program.input_type, (program.input_index + j) % N_INPUTS) for j in range(n))


# ----- observation encodings (structured mode) ------------------------------------------------------
VALUE_ELEMENTS = 8
VALUE_WIDTH = 2 + VALUE_ELEMENTS
VALUE_CLIP = 1000.0
_TYPE_CODES = {int: 1.0, list: 2.0, str: 3.0, bool: 4.0, tuple: 5.0}


@functools.lru_cache(maxsize=4096)
def value_row(text: str) -> np.ndarray:
    """Encodes a literal text as ``[type code, length, first elements...]`` (float32, clipped).

    Ints are their value; list/tuple elements are ints (non-ints encode as 0); strings are code points.
    Text that is not a plain literal encodes as zeros. Parsing uses the verifier's safe literal parser.
    Returns one shared read-only array per text (a pure function of the text, so cached): copy it to write.
    """
    row = np.asarray(_value_features(text), dtype=np.float32)
    row.flags.writeable = False
    return row


def _clip(v: int) -> float:
    return float(max(-VALUE_CLIP, min(VALUE_CLIP, v)))


def _value_features(text: str) -> tuple[float, ...]:
    from populora_env.verifier.literals import parse_literal

    out = [0.0] * VALUE_WIDTH
    try:
        value = parse_literal(text, max_chars=2000)
    except (ValueError, TypeError):
        return tuple(out)
    out[0] = _TYPE_CODES.get(type(value), 0.0)
    if isinstance(value, bool):
        out[1] = float(value)
    elif isinstance(value, int):
        out[1] = _clip(value)
    elif isinstance(value, list | tuple | str):
        out[1] = min(float(len(value)), VALUE_CLIP)
        items = [ord(c) for c in value[:VALUE_ELEMENTS]] if isinstance(value, str) else value[:VALUE_ELEMENTS]
        for i, item in enumerate(items):
            if isinstance(item, int) and not isinstance(item, bool):
                out[2 + i] = _clip(item)
    return tuple(out)


def program_width(n_slots: int) -> int:
    """Length of a program's action vector."""
    return 2 + 2 * n_slots
