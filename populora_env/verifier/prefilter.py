"""Static pre-filter: a cheap first rejection of programs before they reach a sandbox.

This is *not* the security boundary (the sandboxed child is); it rejects early what a game never needs:
imports outside a small allowlist of pure, deterministic standard modules, the built-ins that reach the
interpreter's machinery (``eval``, ``exec``, ``__import__``, ``open``, ``getattr`` ...), dunder attribute
access (``().__class__.__subclasses__()``), and obviously nondeterministic calls (``id``).
Identifiers are NFKC-normalised by Python's parser, so unicode look-alikes (``ｅｘｅｃ``) are caught as well.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import Any, Literal, NamedTuple

from .literals import on_a_fresh_stack, parse_quietly, too_deep
from .rules import (
    ALLOWED_SPECIAL_METHODS,
    FORBIDDEN_ATTRIBUTES,
    FORBIDDEN_MODULES,
    MODULE_READS,
    READABLE_DUNDERS,
    RUN_TIME_READS,
    own_private,
    plain_super,
)
from .rules import SHADOWING_STORES as _SHADOWING_STORES

__all__ = [
    "ALLOWED_MODULES",
    "ALLOWED_SPECIAL_METHODS",
    "BANNED_NAMES",
    "FORBIDDEN_ATTRIBUTES",
    "FORBIDDEN_MODULES",
    "MAX_COMPILED_NODES",
    "Prefiltered",
    "compile_guard",
    "prefilter",
    "prefilter_expression",
]

#: Pure, deterministic standard modules a program may import (pre-imported by the workers). Not
#: ``dataclasses``: it compiles source text built from field names, and it was the sink of most language-layer
#: escapes red-team reviews found on 2026-12-02 (``replace`` as a getattr by name, ``make_dataclass``,
#: ``dataclasses.exec`` shadowed, field names injected into its generated code by eight routes, the last one
#: program code run inside its class processing changing ``Field.name`` after any check); no CRUXEval program
#: uses it. ``abc`` since 2026-12-02 (``from abc import ABC, abstractmethod`` in LLM-written classes, a breakage
#: review): ``numbers`` handed out its ``ABCMeta`` and ``abstractmethod`` already, classes made with ``ABCMeta``
#: are checked as they are made, and ``update_abstractmethods``, which sets ``__abstractmethods__`` on any class
#: it is given, is a forbidden name.
ALLOWED_MODULES = frozenset(
    {
        "math", "cmath", "itertools", "functools", "collections", "string", "re", "heapq", "bisect",
        "operator", "copy", "fractions", "decimal", "statistics", "typing", "enum",
        "numbers", "textwrap", "unicodedata", "array", "json", "difflib", "calendar", "abc",
    }
)  # fmt: skip

#: Built-in names a program may not reference at all.
BANNED_NAMES = frozenset(
    {
        "__import__", "eval", "exec", "compile", "open", "globals", "locals", "vars", "getattr",
        "setattr", "delattr", "breakpoint", "help", "exit", "quit", "memoryview", "id",
        "__builtins__", "__loader__", "__spec__",
    }
)  # fmt: skip


#: Most syntax-tree nodes a program may compile to, counting each ``finally`` body once per copy CPython
#: 3.11 emits (normal exit, exception, and each ``return``/``break``/``continue`` leaving through it):
#: nested in one another's ``finally``, 19 such blocks compile for seconds to gigabytes, in the worker,
#: before any limit of the child applies (200 000 nodes: at most about a tenth of a second here).
MAX_COMPILED_NODES = 200_000


# What every finding of ``_forbidden`` needs in an ASCII source: the keyword ``import``, an identifier that
# starts with ``_`` (dunder names, private attributes and imports, ``global __x``; a digit or letter before
# ``_`` is part of the same token), a banned name as a whole word, ``case`` (class patterns), ``type``
# (its three-argument form), ``class`` (unpacked bases), a format field walking to an attribute, or a
# backslash (an escape in a string constant can spell ``{``, ``_`` or a format field:
# ``"\x7b0.\x5f_class..."``). A source without any of them is
# passed without walking its tree (the walk is about half the pre-filter's time on CRUXEval, and 92% of
# its programs match nothing: 96% before backslashes counted); a match, in code, a string or a comment, only
# means the tree is walked.
# Outside ASCII the parser's NFKC normalisation makes text search unsound, so such sources are walked.
_MAY_BE_FORBIDDEN = re.compile(
    r"(?<![A-Za-z0-9_])_|\{[^{}]*\.|\\|\b(?:import|case|type|class|"
    + "|".join(sorted(name for name in BANNED_NAMES | FORBIDDEN_ATTRIBUTES if not name.startswith("_")))
    + r")\b",
    re.ASCII,
)


def _needs_walk(source: str) -> bool:
    """Whether ``source``'s tree may hold something ``_forbidden`` reports (see ``_MAY_BE_FORBIDDEN``)."""
    return not source.isascii() or _MAY_BE_FORBIDDEN.search(source) is not None


@dataclass(frozen=True)
class Prefiltered:
    """Verdict of the static pre-filter.

    Attributes:
        status: ``"ok"`` (may run), ``"syntax"`` (does not parse or defines no ``f``) or ``"forbidden"``.
        detail: Why, with the line number, when not ``"ok"``.
    """

    status: Literal["ok", "syntax", "forbidden"]
    detail: str = ""


def _on_a_fresh_stack(check: Callable[[str], Prefiltered]) -> Callable[[str], Prefiltered]:
    """``check`` run on this thread, or again on a fresh stack if it ran out of recursion (``too_deep``)."""

    @wraps(check)
    def run(text: str) -> Prefiltered:
        return on_a_fresh_stack(lambda: check(text))

    return run


@lru_cache(maxsize=1024)  # keys are whole programs: 1 024 of 20 000 non-ASCII characters is ~80 MB
@_on_a_fresh_stack
def prefilter(program: str) -> Prefiltered:
    """Statically checks a program's source; results are cached by source text.

    Args:
        program: Python source that must define a top-level ``def f``.

    Returns:
        The verdict; never raises on any string.
    """
    try:
        tree = parse_quietly(program)
    except RecursionError as e:
        return Prefiltered("syntax", f"RecursionError: {too_deep(e)}"[:200])
    except (SyntaxError, ValueError, MemoryError, OverflowError) as e:
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        return Prefiltered("syntax", f"{type(e).__name__}{where}: {getattr(e, 'msg', str(e))}"[:200])
    if not any(isinstance(n, ast.FunctionDef) and n.name == "f" for n in tree.body):
        return Prefiltered("syntax", "the program must define a top-level function `f`")
    too_big = _too_big(program, tree)
    if too_big is not None:
        return too_big
    maybe = "samples" in program or not program.isascii()  # look-alike letters become ASCII in the tree
    if maybe and _imports_statistics(tree) and (line := _samples_read(tree)) is not None:
        return Prefiltered("forbidden", f"line {line}: {_SAMPLES}")
    if not _needs_walk(program):
        return Prefiltered("ok")
    allowed = _allowed_in_context(tree)
    for node in ast.walk(tree):
        reason = _forbidden(node, allowed)
        if reason:
            return Prefiltered("forbidden", f"line {getattr(node, 'lineno', '?')}: {reason}")
    # two more walks, only where the name can occur (the parser NFKC-normalises look-alike letters)
    if ("type" in program or not program.isascii()) and (line := _type_as_value(tree)) is not None:
        return Prefiltered(
            "forbidden",
            f"line {line}: `type` other than called as type(x) is not allowed (`T = type` made "
            "T(name, bases, namespace): a class from a dict of any names)",
        )
    if "case" in program and (pattern := _rebound_self_matching(tree)) is not None:
        return Prefiltered(
            "forbidden",
            f"line {pattern.lineno}: a class pattern of {pattern.cls.id!r}, a name the program binds itself "  # type: ignore[attr-defined]
            "(rebound to its own class, its positional pattern reads any attribute of the subject)",
        )
    if "case" in program and (pattern := _positional_pattern_in_a_class_body(tree)) is not None:
        return Prefiltered(
            "forbidden",
            f"line {pattern.lineno}: a positional class pattern in a class body, where {pattern.cls.id!r} is "  # type: ignore[attr-defined]
            "looked up in the namespace a metaclass's __prepare__ gives (not only the built-in)",
        )
    return Prefiltered("ok")


_SAMPLES = "statistics.NormalDist.samples draws from random's generator, seeded by the OS: not allowed"


def _imports_statistics(tree: ast.AST) -> bool:
    """Whether ``tree`` imports ``statistics`` (names are NFKC-normalised by the parser)."""
    return any(
        (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "statistics" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "statistics")
        for node in ast.walk(tree)
    )


def _samples_read(tree: ast.AST) -> int | None:
    """The line of the first read of an attribute named ``samples``, else None. A program that imports
    ``statistics`` may read none (``NormalDist.samples`` cannot be told apart from a class's own)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "samples":
            return node.lineno
        if isinstance(node, ast.MatchClass) and "samples" in node.kwd_attrs:
            return node.lineno
    return None


@lru_cache(maxsize=4096)
@_on_a_fresh_stack
def prefilter_expression(args: str) -> Prefiltered:
    """Statically checks an argument-list *expression* (``"dict(a=1), 'x'.upper()"``) like a program."""
    try:
        tree = parse_quietly(f"f(\n{args}\n)", mode="eval")
    except RecursionError as e:
        return Prefiltered("syntax", f"args: RecursionError: {too_deep(e)}"[:200])
    except (SyntaxError, ValueError, MemoryError, OverflowError) as e:
        return Prefiltered("syntax", f"args: {type(e).__name__}: {getattr(e, 'msg', str(e))}"[:200])
    body = tree.body
    if not (isinstance(body, ast.Call) and isinstance(body.func, ast.Name) and body.func.id == "f"):
        return Prefiltered("syntax", "args must be an argument list, like '[1, 2], 3'")
    if (folding := _too_much_folding(args, tree)) is not None:
        return Prefiltered("forbidden", f"args: {folding}")
    # evaluated in the program's namespace, where `statistics` may be imported
    maybe = "samples" in args or not args.isascii()
    if maybe and _samples_read(tree) is not None:
        return Prefiltered("forbidden", f"args: {_SAMPLES}")
    if not _needs_walk(args):
        return Prefiltered("ok")
    for node in ast.walk(tree):
        reason = _forbidden(node)
        if reason:
            return Prefiltered("forbidden", f"args: {reason}")
    return Prefiltered("ok")


@lru_cache(maxsize=1024)  # as prefilter's
@_on_a_fresh_stack
def compile_guard(program: str) -> Prefiltered:
    """The one static check made with the language guards off too: whether ``program`` would compile to
    more than ``MAX_COMPILED_NODES`` (the worker compiles it before any limit of a child applies).
    ``"ok"`` for a program that does not parse (its child reports the syntax error)."""
    # the keyword is never written otherwise (not even in look-alike letters)
    if "finally" not in program and not _folding_may_be_big(program):
        return Prefiltered("ok")
    try:
        tree = parse_quietly(program)
    except RecursionError as e:
        too_deep(e)
        return Prefiltered("ok")
    except (SyntaxError, ValueError, MemoryError, OverflowError):
        return Prefiltered("ok")
    return _too_big(program, tree) or Prefiltered("ok")


#: Most characters (bytes, tuple items) of all the constants CPython 3.11's optimiser folds a program's
#: constant expressions into while compiling it. It keeps every intermediate until the compile ends, so a
#: chain ``'a'*4096 + 'a'*4096 + ...`` of n terms costs O(n²): 2 000 terms, in 18 000 characters, took
#: 30 s and 8 GB in the worker, before any limit of a child applies (50 million: about 50 MB and a
#: twentieth of a second).
MAX_FOLDED_CHARS = 50_000_000

_FOLD_STR_CAP, _FOLD_TUPLE_CAP = 4096, 256
"""What ``*`` folds at most: CPython 3.11's ``ast_opt.c`` (``MAX_STR_SIZE``, ``MAX_COLLECTION_SIZE``)."""


def _folding_may_be_big(source: str) -> bool:
    """Whether the constants folded while compiling ``source`` could reach ``MAX_FOLDED_CHARS``: each ``+``
    folds at most one intermediate, no larger than all the source's characters (4 bytes each) and what
    its ``*`` can make (``_FOLD_STR_CAP`` each). Almost every program is far below, and is not walked."""
    adds = source.count("+")  # a `*` folds up to _FOLD_STR_CAP characters, 4 bytes each if not ASCII
    return adds * (4 * len(source) + 4 * _FOLD_STR_CAP * source.count("*")) > MAX_FOLDED_CHARS


class _Folded(NamedTuple):
    """What :func:`folded_chars` knows of the constant a node folds to."""

    kind: str
    """``"int"``; ``"real"`` (a float, complex, ``None``, ...: never a sequence's factor); ``"seq"`` (a str or
    bytes); ``"tuple"``; ``"any"`` (an item taken out of a folded constant: any of these, an int of unknown
    value included)."""
    length: int = 0
    """Characters or items of a ``"seq"`` or ``"tuple"``; of an ``"any"``, a bound on its bytes."""
    width: int = 1
    """Bytes a character or item is counted (``MAX_FOLDED_CHARS``)."""
    value: int | None = None
    """An ``"int"``'s value where it is known (``None``: any int)."""
    inner: int = 0
    """A bound on the bytes of any constant nested in it (what a subscript can take out)."""

    @property
    def size(self) -> int:
        return self.length * self.width


_INT_BITS = 128
"""CPython 3.11's ``ast_opt.c`` folds an int ``*``, ``**`` or ``<<`` only up to this many bits
(``MAX_INT_SIZE``)."""

_INT_OPS: dict[type[ast.operator], Callable[[int, int], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Div: operator.truediv, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
}  # fmt: skip


def _int_op(op: ast.operator, a: int, b: int) -> _Folded:
    """What CPython 3.11 folds ``a <op> b`` of two int constants to, as ``ast_opt.c``'s ``safe_multiply``,
    ``safe_power`` and ``safe_lshift`` limit it; where it folds nothing (an error, a result past
    ``_INT_BITS``), an int of unknown value: a bound that does not rest on mirroring those limits exactly."""
    bits_a, unknown = a.bit_length(), _Folded("int")
    if isinstance(op, ast.Mult) and a and b and bits_a + b.bit_length() > _INT_BITS:
        return unknown
    if isinstance(op, ast.Pow) and a and b > 0 and bits_a * b > _INT_BITS:
        return unknown
    if isinstance(op, ast.LShift) and a and b and (b < 0 or b > _INT_BITS or bits_a > _INT_BITS - b):
        return unknown
    function = _INT_OPS.get(type(op))
    if function is None:  # @
        return unknown
    try:
        result = function(a, b)
    except (ArithmeticError, ValueError):  # 1 // 0, 1 >> -1, 2 / 10**400
        return unknown
    return _Folded("int", value=result) if isinstance(result, int) else _Folded("real")


def _fold_binop(op: ast.operator, left: _Folded, right: _Folded) -> tuple[_Folded | None, int]:
    """The constant ``left <op> right`` folds to (None: none) and the bytes that folding makes."""
    kinds = {left.kind, right.kind}
    if kinds == {"int"}:
        if left.value is None or right.value is None:
            return _Folded("int"), 0  # (an int whose value is not known stays one: any value)
        return _int_op(op, left.value, right.value), 0
    if kinds <= {"int", "real"}:
        return _Folded("real"), 0
    inner = max(left.inner, right.inner)
    if "any" in kinds:  # the worst of what either side can be
        if isinstance(op, ast.Add):
            folded = _Folded("any", left.size + right.size + 8, inner=max(inner, left.size, right.size))
        elif isinstance(op, ast.Mult):
            widest = max(4 * _FOLD_STR_CAP, 8 * _FOLD_TUPLE_CAP, left.size, right.size)
            folded = _Folded("any", widest, inner=max(inner, left.size, right.size))
        else:
            return _Folded("any", 8, inner=inner), 0  # (an int, or nothing: % of a str is not folded)
        return folded, folded.size
    if isinstance(op, ast.Add) and left.kind == right.kind and left.kind in ("seq", "tuple"):
        folded = _Folded(left.kind, left.length + right.length, max(left.width, right.width), inner=inner)
        return folded, folded.size
    if isinstance(op, ast.Mult) and "int" in kinds and kinds & {"seq", "tuple"}:
        sequence, times = (left, right.value) if right.kind == "int" else (right, left.value)
        cap = _FOLD_STR_CAP if sequence.kind == "seq" else _FOLD_TUPLE_CAP
        if sequence.length == 0:
            return sequence, 0
        if times is None:  # any int: a sequence of any length up to the most a fold makes, never an exact one
            # (a length taken as exactly the cap made the next known `*` "not folded" where CPython folds it,
            # and hid a whole `+` chain above it; a review)
            bound = _Folded("any", cap * sequence.width, inner=max(sequence.inner, sequence.width))
            return bound, bound.size
        if not 0 <= times * sequence.length <= cap:
            return None, 0
        folded = sequence._replace(length=times * sequence.length)
        return folded, folded.size
    return None, 0


def _fold_subscript(
    value: _Folded, index: _Folded, node: ast.Subscript, known: dict[int, _Folded]
) -> _Folded | None:
    """The constant ``value[index]`` folds to (3.11 folds a subscript of two constants: a slice is none)."""
    if value.kind in ("int", "real"):
        return None
    if (
        value.kind == "tuple"
        and isinstance(node.value, ast.Tuple)
        and index.kind == "int"
        and index.value is not None
    ):
        items = node.value.elts
        if -len(items) <= index.value < len(items):
            return known[id(items[index.value])]
        return None
    if value.kind == "seq":  # a character, or a byte's int
        return _Folded("any", value.width + 8)
    return _Folded("any", max(value.inner, 8), inner=value.inner)


def _fold_unaryop(op: ast.unaryop, operand: _Folded) -> _Folded | None:
    if isinstance(op, ast.Not):  # (a bool: an int)
        if operand.kind in ("seq", "tuple"):
            return _Folded("int", value=int(operand.length == 0))
        return _Folded("int", value=None if operand.value is None else int(not operand.value))
    if operand.kind == "int":
        if operand.value is None:
            return operand
        return _Folded(
            "int",
            value={ast.UAdd: operand.value, ast.USub: -operand.value, ast.Invert: ~operand.value}[type(op)],
        )
    if operand.kind == "real":
        return operand
    if operand.kind == "any":
        return _Folded("int")  # (only a number folds under +, - or ~)
    return None


def folded_chars(tree: ast.AST) -> int:
    """Bytes of the constants compiling ``tree`` folds (see ``MAX_FOLDED_CHARS``; a non-ASCII character
    counts 4, a tuple item 8), a bound after CPython 3.11's optimiser (``Python/ast_opt.c``): ``+`` of two
    constant strings, bytes or tuples is folded; ``*`` of one by an int constant up to ``_FOLD_STR_CAP``
    characters (``_FOLD_TUPLE_CAP`` items); a tuple of constants is a constant; ints fold under every operator
    (``*``, ``**`` and ``<<`` up to ``_INT_BITS``), so ``(0,)*(255+1)`` is folded as ``(0,)*256``; a subscript
    of two constants folds to an item, of a value followed where the estimate cannot know it (an item of
    a folded tuple) by the worst that item can be. Iterative (no recursion however deep the expression)."""
    known: dict[int, _Folded] = {}  # id(node) -> the constant it folds to; absent: none
    total = 0
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if not children_done:
            stack.append((node, True))
            stack.extend((child, False) for child in ast.iter_child_nodes(node))
            continue
        folded: _Folded | None = None
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str):
                folded = _Folded("seq", len(value), 1 if value.isascii() else 4)
            elif isinstance(value, bytes):
                folded = _Folded("seq", len(value))
            elif isinstance(value, int):
                folded = _Folded("int", value=int(value))
            else:
                folded = _Folded("real")
        elif (
            isinstance(node, ast.Tuple)
            and isinstance(node.ctx, ast.Load)
            and all(id(e) in known for e in node.elts)
        ):
            items = [known[id(e)] for e in node.elts]
            folded = _Folded(
                "tuple", len(items), 8, inner=max((max(i.size, i.inner) for i in items), default=0)
            )
        elif isinstance(node, ast.UnaryOp) and id(node.operand) in known:
            folded = _fold_unaryop(node.op, known[id(node.operand)])
        elif isinstance(node, ast.BinOp) and id(node.left) in known and id(node.right) in known:
            folded, made = _fold_binop(node.op, known[id(node.left)], known[id(node.right)])
            total += made
        elif (
            isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
            and id(node.value) in known and id(node.slice) in known
        ):  # fmt: skip
            folded = _fold_subscript(known[id(node.value)], known[id(node.slice)], node, known)
        if folded is not None:
            known[id(node)] = folded
    return total


def _too_much_folding(source: str, tree: ast.AST) -> str | None:
    """Why compiling ``source`` would fold too much (``MAX_FOLDED_CHARS``), or None."""
    if not _folding_may_be_big(source) or (folded := folded_chars(tree)) <= MAX_FOLDED_CHARS:
        return None
    return (
        f"constant expressions would fold to ~{folded} characters while compiling (over {MAX_FOLDED_CHARS})"
    )


def _too_big(program: str, tree: ast.Module) -> Prefiltered | None:
    if (folding := _too_much_folding(program, tree)) is not None:
        return Prefiltered("forbidden", folding)
    if "finally" not in program:
        return None
    try:
        size = _compiled_nodes(tree.body)
    except RecursionError as e:
        too_deep(e)
        return Prefiltered("forbidden", "blocks nest too deeply to estimate what the program compiles to")
    if size <= MAX_COMPILED_NODES:
        return None
    shown = f"~{size}" if size < 10**12 else "over 10**12"
    return Prefiltered(
        "forbidden",
        f"nested `finally` blocks would compile to {shown} syntax-tree nodes (over {MAX_COMPILED_NODES})",
    )


_Context = tuple[tuple[str, Any], ...]
"""The blocks a statement is compiled in, outermost first: ``("loop", None)``, ``("with", None)`` or
``("finally", finalbody)`` of an enclosing ``try``."""


def _compiled_nodes(body: list[ast.stmt], context: _Context = (), memo: dict[int, int] | None = None) -> int:
    """Syntax-tree nodes ``body`` compiles, every copy CPython 3.11 makes of a ``finally`` body counted (see
    ``MAX_COMPILED_NODES``): one after the ``try``, one on the exception path, and one at each
    ``return``, ``break`` or ``continue`` leaving through it, where that copy's own exits copy the outer
    ``finally`` bodies again (so the count can grow exponentially; ``memo`` keeps computing it linear).
    A ``finally`` body always sits in the same blocks, so its size is memoised by identity."""
    memo = {} if memo is None else memo
    total = 0
    for node in body:
        total += _own_nodes(node)
        if isinstance(node, ast.Return):
            total += _unwound(context, memo, to_loop=False)
        elif isinstance(node, (ast.Break, ast.Continue)):
            total += _unwound(context, memo, to_loop=True)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            total += _compiled_nodes(node.body, (), memo)  # a code object of its own
        elif isinstance(node, (ast.Try, ast.TryStar)):
            inner = (*context, ("finally", node.finalbody)) if node.finalbody else context
            total += _compiled_nodes(node.body, inner, memo) + _compiled_nodes(node.orelse, inner, memo)
            total += sum(_compiled_nodes(h.body, inner, memo) for h in node.handlers)
            if node.finalbody:
                total += 2 * _finally_size(node.finalbody, context, memo)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            total += _compiled_nodes(node.body, (*context, ("loop", None)), memo)
            total += _compiled_nodes(node.orelse, context, memo)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            total += _compiled_nodes(node.body, (*context, ("with", None)), memo)
        elif isinstance(node, ast.If):
            while True:  # an `elif` chain in a loop, not one recursion per branch (1 000 of them are legal)
                total += _compiled_nodes(node.body, context, memo)
                if not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):
                    total += _compiled_nodes(node.orelse, context, memo)
                    break
                node = node.orelse[0]
                total += _own_nodes(node)
        elif isinstance(node, ast.Match):
            total += sum(_compiled_nodes(case.body, context, memo) for case in node.cases)
    return total


def _own_nodes(node: ast.stmt) -> int:
    """Syntax-tree nodes of a statement, its nested statements aside (they are counted in their blocks)."""
    return 1 + sum(
        sum(1 for _ in ast.walk(child))
        for child in ast.iter_child_nodes(node)
        if not isinstance(child, ast.stmt | ast.excepthandler | ast.match_case)
    )


def _finally_size(finalbody: list[ast.stmt], context: _Context, memo: dict[int, int]) -> int:
    """One copy of a ``finally`` body, compiled in the blocks around its ``try``."""
    key = id(finalbody)
    if key not in memo:
        memo[key] = _compiled_nodes(finalbody, context, memo)
    return memo[key]


def _unwound(context: _Context, memo: dict[int, int], *, to_loop: bool) -> int:
    """What an exit inlines: a copy of each enclosing ``finally`` body (up to the innermost loop for
    ``break``/``continue``), each compiled in the blocks outside its own ``try``; 1 per ``with``."""
    total = 0
    for depth in range(len(context) - 1, -1, -1):
        kind, finalbody = context[depth]
        if kind == "loop" and to_loop:
            break
        if kind == "with":
            total += 1
        elif kind == "finally":
            total += _finally_size(finalbody, context[:depth], memo)
    return total


_SELF_MATCHING = frozenset(
    {"bool", "bytearray", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str", "tuple"}
)
"""Built-in classes whose one positional pattern matches the subject itself (no attribute is read)."""


def _rebound_self_matching(tree: ast.AST) -> ast.MatchClass | None:
    """The first ``case str(v)``-style pattern whose built-in class name the program binds somewhere: the
    exception for ``_SELF_MATCHING`` holds for the built-in only (``str`` rebound to a class whose
    ``__match_args__`` names ``gi_frame``, with a metaclass matching anything, walked out of the sandbox's
    language layer)."""
    patterns = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.MatchClass) and node.patterns and isinstance(node.cls, ast.Name)
    ]
    if not patterns:
        return None
    bound = _bound_names(tree)
    return next((p for p in patterns if p.cls.id in bound), None)  # type: ignore[attr-defined]


def _positional_pattern_in_a_class_body(tree: ast.AST) -> ast.MatchClass | None:
    """The first ``case str(v)``-style pattern written in a class body itself (not in a function inside it):
    a class body looks names up in the namespace its metaclass's ``__prepare__`` returned, so ``str`` there
    is whatever that mapping holds, a class whose ``__match_args__`` names ``__globals__`` with a metaclass
    matching anything (red-team round 34, behind a metaclass the program had made unchecked)."""
    bodies = [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    while bodies:
        for statement in bodies.pop():
            todo: list[ast.AST] = [statement]
            while todo:
                node = todo.pop()
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                    continue  # a scope of its own (a nested class's body is in `bodies` already)
                if isinstance(node, ast.MatchClass) and node.patterns and isinstance(node.cls, ast.Name):
                    return node
                todo.extend(ast.iter_child_nodes(node))
    return None


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name ``tree`` binds, deletes or declares global/nonlocal, in any scope."""
    names = {name for node in ast.walk(tree) if (name := _binding(node)) is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
    return names


def _binding(node: ast.AST) -> str | None:
    """The name ``node`` binds (or deletes), if it is a binding: a plain name stored or deleted, a parameter,
    a ``def`` or a class, an import's alias (``import a.b`` binds ``a``), an ``except ... as``, a pattern's
    capture."""
    if isinstance(node, ast.Name):
        return node.id if isinstance(node.ctx, ast.Store | ast.Del) else None
    if isinstance(node, ast.arg):
        return node.arg
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.alias):
        return (node.asname or node.name).split(".")[0]
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
        return node.name
    if isinstance(node, ast.MatchMapping):
        return node.rest
    return None


_FORMAT_REACH = re.compile(
    r"\{[^{}]*\.\s*(?:_(?!_(?:class|name|qualname)__\b)|gi_|cr_|ag_|tb_|"
    r"f_(?:back|globals|locals|builtins|code|lasti|lineno|trace)\b)"
)
"""A ``str.format`` field walking to a private, dunder or frame attribute: ``"{0.__globals__}"``; not to the
``READABLE_DUNDERS`` (``"{0.__class__.__name__}({0.v})"`` in a ``__repr__``, a breakage review's finding)."""


_CLASS_CHECKS = frozenset({"isinstance", "issubclass"})


def _type_checked_against(tree: ast.AST) -> set[int]:
    """The ``type`` names ``isinstance(x, type)`` and ``issubclass(c, (type, int))`` hand the built-ins, which
    answer with a bool (a breakage review: LLM-written programs test for classes so), where the program binds
    neither name itself (a function of its own there would be handed ``type``)."""
    bound = {_binding(node) for node in ast.walk(tree)}
    found: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _CLASS_CHECKS - bound
            and len(node.args) == 2
            and not node.keywords
        ):
            second = node.args[1]
            for item in second.elts if isinstance(second, ast.Tuple) else [second]:
                if isinstance(item, ast.Name) and item.id == "type":
                    found.add(id(item))
    return found


def _type_as_value(tree: ast.AST) -> int | None:
    """The line of the first read of the built-in ``type`` that is not the function of a call, else None.

    Not refused: a read of a local variable of that name (``def f(type)``, ``for name, type in fields``, a
    function that assigns it: such a read never reaches the built-in), and an annotation (``cls: type``,
    kept only where no program can read it, ``__annotations__``)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    called |= _type_checked_against(tree)
    found: list[int] = []

    def visit(node: ast.AST, local: bool) -> None:
        """``local``: ``type`` names a variable of a function scope here (or of one this scope sees)."""
        item: ast.AST
        if found:
            return
        if isinstance(node, ast.Name):
            if node.id == "type" and isinstance(node.ctx, ast.Load) and id(node) not in called and not local:
                found.append(node.lineno)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = node.args
            outer = [*arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]
            if not isinstance(node, ast.Lambda):
                outer += node.decorator_list
            for item in outer:  # evaluated where the function is defined
                visit(item, local)
            inner = _binds_type(node, local)
            for item in node.body if isinstance(node.body, list) else [node.body]:
                visit(item, inner)
            return  # (annotations: not visited)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            first, *rest = node.generators
            visit(first.iter, local)  # the first iterable is evaluated in the enclosing scope
            inner = local or any(_targets_type(g.target) for g in node.generators)
            for part in [first.target, *first.ifs, *rest, *_comprehension_results(node)]:
                visit(part, inner)
            return
        if isinstance(node, ast.ClassDef):
            for item in [*node.decorator_list, *node.bases, *node.keywords]:
                visit(item, local)
            for item in node.body:  # a class body reads names as globals and built-ins: never local
                visit(item, False)
            return
        if isinstance(node, ast.AnnAssign):
            for item in [node.target] if node.value is None else [node.target, node.value]:
                visit(item, local)
            return  # (the annotation: not visited)
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree, False)
    return found[0] if found else None


def _comprehension_results(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.DictComp):
        return [node.key, node.value]
    return [node.elt]  # type: ignore[attr-defined]


def _targets_type(target: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "type" for n in ast.walk(target))


def _binds_type(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, outer_local: bool) -> bool:
    """Whether ``type`` names a local variable of ``function`` (a parameter, or a name it binds in its own
    body) or one of an enclosing function it sees; not where the function declares it ``global``."""
    arguments = function.args
    parameters = [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        arguments.vararg,
        arguments.kwarg,
    ]
    binds = any(p is not None and p.arg == "type" for p in parameters)
    body = function.body if isinstance(function.body, list) else [function.body]
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Global) and "type" in node.names:
            return False
        binds = binds or _binding(node) == "type"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue  # their own scopes (a walrus in a comprehension binds here: walked below)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            todo.extend(n for n in ast.walk(node) if isinstance(n, ast.NamedExpr))
            continue
        todo.extend(ast.iter_child_nodes(node))
    return binds or outer_local


def _plain_type_call(node: ast.Call) -> bool:
    """``type(x)``: one positional argument, no keywords, nothing unpacked."""
    return len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred)


def _future_annotations(node: ast.ImportFrom) -> bool:
    """Whether ``node`` is exactly ``from __future__ import annotations``."""
    return (
        node.module == "__future__"
        and not node.level
        and [(a.name, a.asname) for a in node.names] == [("annotations", None)]
    )


def _module_refused(name: str) -> bool:
    parts = name.split(".")
    return (
        parts[0] not in ALLOWED_MODULES
        or any(p.startswith("_") for p in parts)
        or any(".".join(parts[: i + 1]) in FORBIDDEN_MODULES for i in range(len(parts)))
    )


#: Private names of the namedtuple API (``collections.namedtuple``, ``typing.NamedTuple``), which programs
#: read like public ones: in the allowed modules only namedtuple classes define them, and what they give is
#: a new tuple, a dict, or field names and defaults.
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_make", "_fields", "_field_defaults"})


def _allowed_in_context(tree: ast.AST) -> set[int]:
    """The nodes (ids) of ``tree`` that ``_forbidden`` would refuse alone but that are allowed where they are:

    * ``super().__init__``, a special method of the allowlist read on ``super()`` with no arguments or two
      names (``super(B, self)``), where the program never binds the name ``super``: the child checks at run
      time that the proxy is bound to an instance of the program's own (``_child._checked_super``; with a
      class it hands out its bases' methods unbound);
    * ``__slots__ = ('x', 'y')`` in a class body: a tuple or list of public names.
    """
    allowed: set[int] = set()
    bound: set[str] | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            value = node.value
            if node.attr in ALLOWED_SPECIAL_METHODS and plain_super(value):
                bound = _bound_names(tree) if bound is None else bound
                if "super" not in bound:
                    allowed.add(id(node))
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if _public_slots(statement):
                    allowed.add(id(statement.targets[0]))  # type: ignore[attr-defined]
    return allowed


def _public_slots(statement: ast.stmt) -> bool:
    """``__slots__ = ('x', 'y')`` (a tuple or list of public identifiers, or one as a string)."""
    if not (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and statement.targets[0].id == "__slots__"
    ):
        return False
    value = statement.value
    items = value.elts if isinstance(value, ast.Tuple | ast.List) else [value]
    return all(
        isinstance(item, ast.Constant)
        and isinstance(item.value, str)
        and item.value.isidentifier()
        and not item.value.startswith("_")
        for item in items
    )


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _reads_checked(pattern: ast.MatchClass | ast.MatchMapping | ast.MatchValue) -> bool:
    """Whether a pattern's own expressions (a value, mapping keys, a class) read an attribute whose reads the
    child checks at run time (``RUN_TIME_READS``, ``own_private`` names)."""
    if isinstance(pattern, ast.MatchValue):
        parts: list[ast.expr] = [pattern.value]
    elif isinstance(pattern, ast.MatchMapping):
        parts = list(pattern.keys)
    else:
        parts = [pattern.cls]
    return any(
        isinstance(node, ast.Attribute) and (node.attr in RUN_TIME_READS or own_private(node.attr))
        for part in parts
        for node in ast.walk(part)
    )


def _attribute_refused(name: str) -> str | None:
    if name in FORBIDDEN_ATTRIBUTES or name.startswith("__"):
        return f"access to attribute {name!r} is not allowed"
    if name.startswith("_"):
        return f"access to private attribute {name!r} is not allowed"
    return None


def _forbidden(node: ast.AST, allowed: set[int] = set()) -> str | None:  # noqa: B006 (never modified)
    """Why ``node`` is refused, or None; ``allowed``: nodes allowed where they are (``_allowed_in_context``)."""
    if id(node) in allowed:
        return None
    if isinstance(node, ast.Import):
        for alias in node.names:
            if _module_refused(alias.name):
                return f"import of module {alias.name!r} is not allowed"
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if _future_annotations(node):  # a compiler directive models write; it binds a plain _Feature record
            return None
        if node.level or _module_refused(module):
            return f"import from module {module!r} is not allowed"
        if any(a.name == "*" for a in node.names):  # the names it binds would go unchecked
            return f"`from {module} import *` is not allowed"
        if any(a.name.startswith("_") for a in node.names):
            return "import of private names is not allowed"
        # `from json import tool` imports the forbidden submodule `json.tool` as surely as `import json.tool`
        submodule = next((a.name for a in node.names if _module_refused(f"{module}.{a.name}")), None)
        if submodule is not None:
            return f"import of module {module + '.' + submodule!r} is not allowed"
        # (the modules of MODULE_READS: the guarded import refuses one off the allowlist at run time)
        refused = next(
            (a.name for a in node.names if a.name in FORBIDDEN_ATTRIBUTES and a.name not in MODULE_READS),
            None,
        )
        if refused is not None:
            return f"import of {refused!r} is not allowed"
    elif isinstance(node, ast.Name):
        if node.id in BANNED_NAMES:
            return f"use of {node.id!r} is not allowed"
        # the special methods of the allowlist are names a class body may bind too (`__repr__ = __str__`,
        # `__hash__ = None`): what a `def` of the name may do
        dunder = len(node.id) > 4 and node.id.startswith("__") and node.id.endswith("__")
        if dunder and node.id != "__name__" and node.id not in ALLOWED_SPECIAL_METHODS:
            return f"use of dunder name {node.id!r} is not allowed"
    elif isinstance(node, ast.Attribute):
        if node.attr in _SHADOWING_STORES and isinstance(node.ctx, ast.Store | ast.Del):
            # `dataclasses.exec = grab`: dataclasses then handed grab the globals of the module a class's
            # __module__ names (`builtins`, `sys`): a full escape (a red-team review); typing and
            # namedtuple call eval likewise
            return f"assigning an attribute named {node.attr!r} is not allowed"
        if isinstance(node.ctx, ast.Load) and (node.attr in NAMEDTUPLE_API or node.attr in READABLE_DUNDERS):
            return None
        if (
            node.attr in MODULE_READS
        ):  # `event.time`: the child refuses a module off the allowlist at run time
            return None
        if own_private(node.attr):  # `self._balance`: the child refuses any object but the program's own
            return None
        if isinstance(node.ctx, ast.Load) and node.attr in ALLOWED_SPECIAL_METHODS:
            return None  # `A.__init__(self, x)`, `self.__eq__(o)`: the child checks whose it is, as `self._n`
        return _attribute_refused(node.attr)
    elif isinstance(node, ast.MatchClass | ast.MatchMapping | ast.MatchValue) and _reads_checked(node):
        # `case x.obj:`, `case {A._x: v}`, `case A._B():` read an attribute where the child's check cannot go
        # (a pattern is dotted names, never a call: the rewritten read made valid code a syntax error)
        return "a pattern may not read the attributes the child checks at run time"
    elif isinstance(node, ast.MatchClass):  # `case C(name=p)` reads the attribute `name` of the subject
        if node.patterns and not (isinstance(node.cls, ast.Name) and node.cls.id in _SELF_MATCHING):
            # `case C(p)` reads the attribute C.__match_args__[0] names, which a program can set to anything
            # (a namedtuple's or dataclass's field names, a class made with type())
            return "positional patterns of a class pattern are not allowed (except for built-in types)"
        checked = next((name for name in node.kwd_attrs if name in RUN_TIME_READS), None)
        if checked is not None:  # the run-time check of these reads sees attribute reads only
            return f"a class pattern may not read the attribute {checked!r}"
        return next(filter(None, map(_attribute_refused, node.kwd_attrs)), None)
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "type" and not _plain_type_call(node):
            return "type() with more than one argument (a class from a dict of any names) is not allowed"
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _FORMAT_REACH.search(node.value):
        return "a format string that reaches private or frame attributes is not allowed"
    elif isinstance(node, (ast.Global, ast.Nonlocal)) and any(n.startswith("__") for n in node.names):
        return "rebinding dunder names is not allowed"
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        name = node.name
        if name.startswith("__") and name.endswith("__") and name not in ALLOWED_SPECIAL_METHODS:
            return f"defining the special method {name!r} is not allowed"
    elif (bound := _binding(node)) is not None and _is_dunder(
        bound
    ):  # (names and defs: their own rules above)
        # `import typing as __builtins__` made typing's globals the built-ins of every function defined after
        # it (`sys` among them: a full escape), and `class __populora_own__` replaced a run-time check
        # (red-team round 19): a dunder name is bound by no form at all
        return f"binding the dunder name {bound!r} is not allowed"
    elif isinstance(node, ast.ClassDef) and (
        any(k.arg is None for k in node.keywords) or any(isinstance(b, ast.Starred) for b in node.bases)
    ):
        return "class bases or keywords unpacked with * or ** are not allowed"
    elif isinstance(node, ast.keyword) and node.arg is not None and node.arg.startswith("_"):
        # `class C(type(typing.List[int]), _root=True)` subclassed typing's attribute-forwarding alias
        return f"the private keyword argument {node.arg!r} is not allowed"
    return None
