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
from typing import Literal

__all__ = [
    "ALLOWED_MODULES",
    "BANNED_NAMES",
    "FORBIDDEN_ATTRIBUTES",
    "MAX_COMPILED_STATEMENTS",
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
#: modules), attribute access by name at run time, and the modules that the allowed ones import under a
#: public name (``typing.sys.modules`` holds every module). ``FORBIDDEN_ATTRIBUTES`` is checked against the
#: running Python's allowed modules by the tests.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next",
        "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "attrgetter", "methodcaller", "get_field",
        "sys", "os", "builtins", "bltns", "inspect", "types", "importlib", "contextlib", "warnings", "codecs",
        "copyreg", "random", "datetime", "keyword", "abc", "gc", "io", "time",
    }
)  # fmt: skip

#: Most statements a program may compile to, counting each ``finally`` body once per copy CPython 3.11
#: emits (normal exit, exception, and each ``return``/``break``/``continue`` leaving through it): nested in
#: one another's ``finally``, 19 such blocks compile for seconds to gigabytes, in the worker, before any
#: limit of the child applies (20 000: a few hundredths of a second and ~250 KB of bytecode here).
MAX_COMPILED_STATEMENTS = 20_000


# What every finding of ``_forbidden`` needs in an ASCII source: the keyword ``import``, an identifier that
# starts with ``_`` (dunder names, private attributes and imports, ``global __x``; a digit or letter before
# ``_`` is part of the same token), or a banned name as a whole word. A source without any of them is
# passed without walking its tree (the walk is about half the pre-filter's time on CRUXEval, and 96% of
# its programs match nothing); a match, in code, a string or a comment, only means the tree is walked.
# Outside ASCII the parser's NFKC normalisation makes text search unsound, so such sources are walked.
_MAY_BE_FORBIDDEN = re.compile(
    r"(?<![A-Za-z0-9_])_|\b(?:import|"
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


@lru_cache(maxsize=4096)
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


@lru_cache(maxsize=4096)
def compile_guard(program: str) -> Prefiltered:
    """The one static check made with the language guards off too: whether ``program`` would compile to
    more than ``MAX_COMPILED_STATEMENTS`` (the worker compiles it before any limit of a child applies).
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
    size = _compiled_statements(tree.body)
    if size <= MAX_COMPILED_STATEMENTS:
        return None
    return Prefiltered(
        "forbidden",
        f"nested `finally` blocks would compile to ~{size} statements (over {MAX_COMPILED_STATEMENTS})",
    )


def _compiled_statements(body: list[ast.stmt]) -> int:
    """Statements ``body`` compiles to, each ``finally`` body counted once per copy (see
    ``MAX_COMPILED_STATEMENTS``); exits through a ``finally`` are over-counted (a ``break`` of an inner loop
    counts too), never under-counted."""
    total = 0
    for node in body:
        total += 1
        if isinstance(node, (ast.Try, ast.TryStar)) and node.finalbody:
            guarded = [*node.body, *node.orelse, *(s for h in node.handlers for s in h.body)]
            exits = sum(_exits(s) for s in guarded)
            total += _compiled_statements(guarded) + (2 + exits) * _compiled_statements(node.finalbody)
            continue
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                total += _compiled_statements(block)
        for part in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
            total += _compiled_statements(part.body)
    return total


def _exits(node: ast.AST) -> int:
    """``return``, ``break`` and ``continue`` statements in ``node``, outside nested functions and classes."""
    if isinstance(node, (ast.Return, ast.Break, ast.Continue)):
        return 1
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return 0
    return sum(
        _exits(child)
        for child in ast.iter_child_nodes(node)
        if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case)
    )


def _forbidden(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] not in ALLOWED_MODULES:
                return f"import of module {alias.name!r} is not allowed"
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level or module.split(".")[0] not in ALLOWED_MODULES:
            return f"import from module {module!r} is not allowed"
        if any(a.name.startswith("_") for a in node.names):
            return "import of private names is not allowed"
        if any(a.name in FORBIDDEN_ATTRIBUTES for a in node.names):
            return f"import of {next(a.name for a in node.names if a.name in FORBIDDEN_ATTRIBUTES)!r} is not allowed"
    elif isinstance(node, ast.Name):
        if node.id in BANNED_NAMES:
            return f"use of {node.id!r} is not allowed"
        if len(node.id) > 4 and node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__":
            return f"use of dunder name {node.id!r} is not allowed"
    elif isinstance(node, ast.Attribute):
        if node.attr in FORBIDDEN_ATTRIBUTES:
            return f"access to attribute {node.attr!r} is not allowed"
        if node.attr.startswith("__"):
            return f"access to attribute {node.attr!r} is not allowed"
        if node.attr.startswith("_"):
            return f"access to private attribute {node.attr!r} is not allowed"
    elif isinstance(node, (ast.Global, ast.Nonlocal)) and any(n.startswith("__") for n in node.names):
        return "rebinding dunder names is not allowed"
    return None
