"""Static pre-filter: a cheap first rejection of programs before they reach a sandbox.

This is *not* the security boundary (the sandboxed child is); it rejects early what a game never needs:
imports outside a small allowlist of pure, deterministic standard modules, the built-ins that reach the
interpreter's machinery (``eval``, ``exec``, ``__import__``, ``open``, ``getattr`` ...), dunder attribute
access (``().__class__.__subclasses__()``), and obviously nondeterministic calls (``id``).
Identifiers are NFKC-normalised by Python's parser, so unicode look-alikes (``ｅｘｅｃ``) are caught as well.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

__all__ = [
    "ALLOWED_MODULES",
    "BANNED_NAMES",
    "FORBIDDEN_ATTRIBUTES",
    "FORBIDDEN_MODULES",
    "MAX_COMPILED_NODES",
    "Prefiltered",
    "compile_guard",
    "prefilter",
    "prefilter_expression",
]

#: Pure, deterministic standard modules a program may import (pre-imported by the workers).
ALLOWED_MODULES = frozenset(
    {
        "math", "cmath", "itertools", "functools", "collections", "string", "re", "heapq", "bisect",
        "operator", "copy", "fractions", "decimal", "statistics", "typing", "dataclasses", "enum",
        "numbers", "textwrap", "unicodedata", "array", "json", "difflib", "calendar",
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

#: Attributes a program may not read although their names have no underscore: the frames and code of
#: generators, coroutines and tracebacks (``gen.gi_frame.f_back.f_globals`` reaches the child's own
#: modules), attribute access by name at run time (``attrgetter``; a ``Formatter`` subclass's hooks get
#: the objects a format string walks to), the evaluators of string annotations (``get_type_hints``, which
#: ``singledispatch`` calls, runs them through ``eval`` with the real built-ins), and the modules that the
#: allowed ones import under a public name (``typing.sys.modules`` holds every module).
#: ``FORBIDDEN_ATTRIBUTES`` is checked against the running Python's allowed modules by the tests.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next",
        "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "attrgetter", "methodcaller", "get_field",
        "Formatter", "get_type_hints", "ForwardRef", "singledispatch", "singledispatchmethod",
        "update_wrapper", "wraps", "WRAPPER_ASSIGNMENTS", "WRAPPER_UPDATES",
        "sys", "os", "builtins", "bltns", "inspect", "types", "importlib", "contextlib", "warnings", "codecs",
        "copyreg", "random", "datetime", "keyword", "abc", "gc", "io", "time",
    }
)  # fmt: skip

#: Submodules of allowed packages that a program may not import: ``json.tool`` holds ``sys`` and
#: ``argparse`` (the tests walk every submodule of the allowed packages for such).
FORBIDDEN_MODULES = frozenset({"json.tool"})

#: Most syntax-tree nodes a program may compile to, counting each ``finally`` body once per copy CPython
#: 3.11 emits (normal exit, exception, and each ``return``/``break``/``continue`` leaving through it):
#: nested in one another's ``finally``, 19 such blocks compile for seconds to gigabytes, in the worker,
#: before any limit of the child applies (200 000 nodes: at most about a tenth of a second here).
MAX_COMPILED_NODES = 200_000


# What every finding of ``_forbidden`` needs in an ASCII source: the keyword ``import``, an identifier that
# starts with ``_`` (dunder names, private attributes and imports, ``global __x``; a digit or letter before
# ``_`` is part of the same token), a banned name as a whole word, ``case`` (class patterns), ``type``
# (its three-argument form) or a format field walking to an attribute. A source without any of them is
# passed without walking its tree (the walk is about half the pre-filter's time on CRUXEval, and 96% of
# its programs match nothing); a match, in code, a string or a comment, only means the tree is walked.
# Outside ASCII the parser's NFKC normalisation makes text search unsound, so such sources are walked.
_MAY_BE_FORBIDDEN = re.compile(
    r"(?<![A-Za-z0-9_])_|\{[^{}]*\.|\b(?:import|case|type|"
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


@lru_cache(maxsize=1024)  # keys are whole programs: 1 024 of 20 000 non-ASCII characters is ~80 MB
def prefilter(program: str) -> Prefiltered:
    """Statically checks a program's source; results are cached by source text.

    Args:
        program: Python source that must define a top-level ``def f``.

    Returns:
        The verdict; never raises on any string.
    """
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as e:
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        return Prefiltered("syntax", f"{type(e).__name__}{where}: {getattr(e, 'msg', str(e))}"[:200])
    if not any(isinstance(n, ast.FunctionDef) and n.name == "f" for n in tree.body):
        return Prefiltered("syntax", "the program must define a top-level function `f`")
    too_big = _too_big(program, tree)
    if too_big is not None:
        return too_big
    if not _needs_walk(program):
        return Prefiltered("ok")
    for node in ast.walk(tree):
        reason = _forbidden(node)
        if reason:
            return Prefiltered("forbidden", f"line {getattr(node, 'lineno', '?')}: {reason}")
    return Prefiltered("ok")


@lru_cache(maxsize=4096)
def prefilter_expression(args: str) -> Prefiltered:
    """Statically checks an argument-list *expression* (``"dict(a=1), 'x'.upper()"``) like a program."""
    try:
        tree = ast.parse(f"f(\n{args}\n)", mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as e:
        return Prefiltered("syntax", f"args: {type(e).__name__}: {getattr(e, 'msg', str(e))}"[:200])
    body = tree.body
    if not (isinstance(body, ast.Call) and isinstance(body.func, ast.Name) and body.func.id == "f"):
        return Prefiltered("syntax", "args must be an argument list, like '[1, 2], 3'")
    if not _needs_walk(args):
        return Prefiltered("ok")
    for node in ast.walk(tree):
        reason = _forbidden(node)
        if reason:
            return Prefiltered("forbidden", f"args: {reason}")
    return Prefiltered("ok")


@lru_cache(maxsize=1024)  # as prefilter's
def compile_guard(program: str) -> Prefiltered:
    """The one static check made with the language guards off too: whether ``program`` would compile to
    more than ``MAX_COMPILED_NODES`` (the worker compiles it before any limit of a child applies).
    ``"ok"`` for a program that does not parse (its child reports the syntax error)."""
    if "finally" not in program:  # the keyword is never written otherwise (not even in look-alike letters)
        return Prefiltered("ok")
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return Prefiltered("ok")
    return _too_big(program, tree) or Prefiltered("ok")


def _too_big(program: str, tree: ast.Module) -> Prefiltered | None:
    if "finally" not in program:
        return None
    try:
        size = _compiled_nodes(tree.body)
    except RecursionError:
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
            total += _compiled_nodes(node.body, context, memo) + _compiled_nodes(node.orelse, context, memo)
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

_FORMAT_REACH = re.compile(r"\{[^{}]*\.\s*(?:_|gi_|cr_|ag_|tb_|f_)")
"""A ``str.format`` field walking to a private, dunder or frame attribute: ``"{0.__globals__}"``."""


def _module_refused(name: str) -> bool:
    parts = name.split(".")
    return (
        parts[0] not in ALLOWED_MODULES
        or any(p.startswith("_") for p in parts)
        or any(".".join(parts[: i + 1]) in FORBIDDEN_MODULES for i in range(len(parts)))
    )


def _attribute_refused(name: str) -> str | None:
    if name in FORBIDDEN_ATTRIBUTES or name.startswith("__"):
        return f"access to attribute {name!r} is not allowed"
    if name.startswith("_"):
        return f"access to private attribute {name!r} is not allowed"
    return None


def _forbidden(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if _module_refused(alias.name):
                return f"import of module {alias.name!r} is not allowed"
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level or _module_refused(module):
            return f"import from module {module!r} is not allowed"
        if any(a.name == "*" for a in node.names):  # the names it binds would go unchecked
            return f"`from {module} import *` is not allowed"
        if any(a.name.startswith("_") for a in node.names):
            return "import of private names is not allowed"
        refused = next((a.name for a in node.names if a.name in FORBIDDEN_ATTRIBUTES), None)
        if refused is not None:
            return f"import of {refused!r} is not allowed"
    elif isinstance(node, ast.Name):
        if node.id in BANNED_NAMES:
            return f"use of {node.id!r} is not allowed"
        if len(node.id) > 4 and node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__":
            return f"use of dunder name {node.id!r} is not allowed"
    elif isinstance(node, ast.Attribute):
        return _attribute_refused(node.attr)
    elif isinstance(node, ast.MatchClass):  # `case C(name=p)` reads the attribute `name` of the subject
        if node.patterns and not (isinstance(node.cls, ast.Name) and node.cls.id in _SELF_MATCHING):
            # `case C(p)` reads the attribute C.__match_args__[0] names, which a program can set to anything
            # (a namedtuple's or dataclass's field names, a class made with type())
            return "positional patterns of a class pattern are not allowed (except for built-in types)"
        return next(filter(None, map(_attribute_refused, node.kwd_attrs)), None)
    elif isinstance(node, ast.Call):
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "type"
            and len(node.args) + len(node.keywords) > 1
        ):
            return "type() with more than one argument (a class from a dict of any names) is not allowed"
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _FORMAT_REACH.search(node.value):
        return "a format string that reaches private or frame attributes is not allowed"
    elif isinstance(node, (ast.Global, ast.Nonlocal)) and any(n.startswith("__") for n in node.names):
        return "rebinding dunder names is not allowed"
    return None
