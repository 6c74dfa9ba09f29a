"""Plain literal data: guarded parsing of untrusted literal text and canonical text of plain values.

This module is imported both by the host (to check answers, arguments and outputs) and by the sandboxed
child (to parse arguments and to render a program's return value). It never executes code: parsing goes
through :func:`ast.literal_eval` on text whose size is capped first, and rendering walks values whose types
are checked to be *exactly* the built-in ones, so no user-defined ``__repr__``/``__eq__`` is ever called.
"""

from __future__ import annotations

# The sandbox's worker imports this module for `canonical_text` and must stay small: every page it holds
# is copied into each forked child's page tables. So `ast` and `re` are imported where parsing needs them
# (host side), `typing` only for the type checker, and `math` not at all.
import _thread  # built in, already loaded by every interpreter (unlike `threading`)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

__all__ = [
    "LiteralError",
    "canonical_text",
    "outputs_equal",
    "parse_args",
    "parse_literal",
    "parse_quietly",
]

#: Default caps; the verifier passes its configured values.
MAX_TEXT_CHARS = 10_000
MAX_DEPTH = 50
MAX_NODES = 10_000


PYTHON_SPACE = " \t\n\r\f"
"""The whitespace Python's tokenizer takes around a literal (``str.strip`` also took NBSP, U+2028, U+3000...
that Python refuses)."""


class LiteralError(ValueError):
    """Text is not a plain Python literal within the caps, or a value is not plain literal data."""


_FRESH_THREADS: set[int] = set()
"""Idents of the threads ``on_a_fresh_stack`` runs checks on."""


def too_deep(error: RecursionError) -> RecursionError:
    """``error`` again (raised) unless this thread is a fresh stack of ``on_a_fresh_stack``.

    A parse or check that runs out of recursion deep in its caller's stack is run again on a fresh one,
    so that a verdict (and any cache keeping it) never depends on where the caller stood; only a
    ``RecursionError`` on the fresh stack is the text's own doing."""
    if _thread.get_ident() not in _FRESH_THREADS:
        raise error
    return error


def on_a_fresh_stack(call: Callable[[], T]) -> T:
    """``call()`` on this thread, or again on a new thread (a fresh stack) if it ran out of recursion.

    Host side only (the sandboxed child may not start threads); ``call`` turns a ``RecursionError`` into
    its verdict through ``too_deep``, which lets it through on the caller's thread only."""
    try:
        return call()
    except RecursionError:
        pass
    outcome: list[Any] = []
    finished = _thread.allocate_lock()
    finished.acquire()

    def fresh() -> None:  # `_thread`, not `threading`: starting a `Thread` takes stack of its own
        _FRESH_THREADS.add(_thread.get_ident())
        try:
            outcome.append((True, call()))
        except BaseException as e:  # handed back to the caller's thread
            outcome.append((False, e))
        finally:
            _FRESH_THREADS.discard(_thread.get_ident())
            finished.release()

    _thread.start_new_thread(fresh, ())
    finished.acquire()
    done, result = outcome[0]
    if not done:
        raise result
    return result


_QUIET = _thread.RLock()


def parse_quietly(source: str, mode: str = "exec") -> Any:  # ast.Module, or ast.Expression for "eval"
    """``ast.parse`` with the parser's warnings silenced, whatever the process's warning filters (host side).

    Python warns of some text it parses (``"\\d"``: an invalid escape sequence; ``0x1for``: an invalid
    hexadecimal literal). Where the process's filters turn warnings into errors (``-W error``,
    ``warnings.simplefilter("error")``, pytest's ``-W error``) the parse raised a ``SyntaxError``: a verdict,
    cached by the pre-filter, that depended on the host's settings while the workers ignore warnings; under
    the default filters each parse printed a line on the host's stderr, which a player's text repeats at will
    (red-team round 33). ``warnings.catch_warnings`` swaps the process's filters for the parse, under a lock
    so that this module's own parses do not interleave their saving and restoring.
    """
    import ast
    import warnings

    with _QUIET, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, mode=mode)


_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (list, tuple, dict, set, frozenset)


#: How a message about text that is no literal ends (``populora verify`` counts such inputs by it)
NEVER_RUN = "literal text is never run"


def _check_text(text: object, what: str, max_chars: int) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be str, got {type(text).__name__}")
    if len(text) > max_chars:
        raise LiteralError(f"{what} is {len(text)} characters, over the cap of {max_chars}")
    if "\x00" in text:
        raise LiteralError(f"{what} contains a NUL character")
    return text


def _shifted(message: str, line_shift: int) -> str:
    """``message`` with the lines it names ``line_shift`` lines earlier (at least line 1): the parsed source had
    that many lines before the text the message is about (``_parse_args``' ``f(`` line)."""
    if not line_shift:
        return message
    import re

    return re.sub(r"\bline (\d+)", lambda m: f"line {max(1, int(m[1]) - line_shift)}", message)


def _parse_expression(source: str, line_shift: int = 0) -> ast.expr:
    """``source`` parsed as an expression; ``line_shift``: see ``_shifted``."""
    try:
        return parse_quietly(source, mode="eval").body
    except RecursionError as e:
        raise LiteralError(f"not valid Python: RecursionError: {_short(str(too_deep(e)))}") from None
    except (SyntaxError, ValueError, MemoryError, OverflowError) as e:
        # The parser itself refuses > 200 nested brackets ("too many nested parentheses"),
        # and the text length is capped before we get here.
        raise LiteralError(
            f"not valid Python: {type(e).__name__}: {_short(_shifted(str(e), line_shift))}"
        ) from None


def _eval_node(node: ast.expr, max_depth: int, max_nodes: int, line_shift: int = 0) -> Any:
    """``literal_eval`` of ``node``, checked as plain data; ``line_shift``: see ``_shifted``."""
    import ast
    import re

    try:
        value = ast.literal_eval(node)
        canonical_text(value, max_depth=max_depth, max_nodes=max_nodes)  # rejects NaN, inf, deep data
    except RecursionError as e:
        raise LiteralError(f"not a literal ({_short(str(too_deep(e)))})") from None
    except LiteralError:
        raise
    except (ValueError, TypeError, SyntaxError, MemoryError, OverflowError) as e:
        # literal_eval names the offending node with its address; keep the kind, drop the address.
        found = re.sub(r"<ast\.(\w+) object at 0x[0-9a-f]+>", r"a \1 expression", str(e))
        raise LiteralError(f"not a literal ({_short(_shifted(found, line_shift))}); {NEVER_RUN}") from None
    return value


def parse_literal(
    text: str, *, max_chars: int = MAX_TEXT_CHARS, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> Any:
    """Parses one plain literal (numbers, strings, bytes, bools, None, lists, tuples, dicts, sets).

    Args:
        text: Untrusted text such as ``"[1, 'a', (2.5, None)]"``.
        max_chars: Longer text is refused before any parsing.
        max_depth: Maximum nesting depth of containers.
        max_nodes: Maximum number of values in the structure.

    Returns:
        The parsed value, made only of exact built-in types.

    Raises:
        TypeError: ``text`` is not a ``str``.
        LiteralError: The text is too long, not a literal, or holds NaN/inf or oversized data.
    """
    _check_text(text, "literal", max_chars)
    source = text.strip(PYTHON_SPACE)
    return on_a_fresh_stack(lambda: _eval_node(_parse_expression(source), max_depth, max_nodes))


def parse_args(
    text: str, *, max_chars: int = MAX_TEXT_CHARS, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> tuple[Any, ...]:
    """Parses the text of a call's argument list, ``f(<text>)``, into a tuple of literal values.

    ``"[1, 2], 3"`` is two arguments, ``"(1, 2)"`` is one tuple argument, ``""`` is no argument
    (the CRUXEval/AZR format). Keyword and starred arguments are refused.

    Raises:
        TypeError: ``text`` is not a ``str``.
        LiteralError: The text is not a plain argument list within the caps.
    """
    _check_text(text, "args", max_chars)
    return on_a_fresh_stack(lambda: _parse_args(text, max_depth, max_nodes))


def _parse_args(text: str, max_depth: int, max_nodes: int) -> tuple[Any, ...]:
    import ast

    node = _parse_expression(f"f(\n{text}\n)", line_shift=1)
    # Text such as "1), g(2" closes the call early: the result is then not a single call of `f`.
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "f"):
        raise LiteralError("args must be a plain argument list, like '[1, 2], 3'")
    if node.keywords:
        raise LiteralError("keyword arguments are not supported in args")
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise LiteralError("starred arguments are not supported in args")
    return tuple(_eval_node(a, max_depth, max_nodes, line_shift=1) for a in node.args)


def canonical_text(value: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> str:
    """Renders plain literal data as canonical Python literal text.

    Only exact built-in types are accepted (a subclass of ``int`` or ``str`` is refused), so the
    rendering never calls user code. Sets and frozensets render as set displays with elements sorted
    by their own canonical text, which makes the text independent of the hash seed and keeps Python
    ``==`` semantics (``frozenset({1}) == {1}``). Dicts keep insertion order.

    Raises:
        LiteralError: The value is not plain data, holds NaN or inf, nests deeper than ``max_depth``,
            has more than ``max_nodes`` values, or refers to itself.
    """
    budget = [max_nodes]
    return _render(value, max_depth, budget)


def _render(value: Any, depth: int, budget: list[int], hashed: bool = False) -> str:
    """``hashed``: ``value`` is a set element or a dict key (or inside a tuple that is), where a set display
    could not be parsed back (a set is unhashable), so a frozenset there has no literal form."""
    budget[0] -= 1
    if budget[0] < 0:
        raise LiteralError("value has too many elements")
    if depth < 0:
        raise LiteralError("value nests too deeply (or refers to itself)")
    kind = type(value)
    if kind in _SCALARS:
        return _render_scalar(value)
    if kind is list or kind is tuple:
        items = [_render(v, depth - 1, budget, hashed) for v in value]
        if kind is list:
            return "[" + ", ".join(items) + "]"
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if kind is dict:
        pairs = [
            f"{_render(k, depth - 1, budget, True)}: {_render(v, depth - 1, budget)}"
            for k, v in value.items()
        ]
        return "{" + ", ".join(pairs) + "}"
    if kind is set or kind is frozenset:
        if hashed:  # only a frozenset can be here
            raise LiteralError("value holds a frozenset inside a set or a dict key (no literal form)")
        if not value:
            return "set()"
        return "{" + ", ".join(sorted(_render(v, depth - 1, budget, True) for v in value)) + "}"
    raise LiteralError(f"return value is not plain literal data (type {kind.__name__!s:.60})")


def _render_scalar(value: Any) -> str:
    kind = type(value)
    if kind is float:
        if not _finite(value):
            raise LiteralError("value holds a NaN or infinite float")
    elif kind is complex and not (_finite(value.real) and _finite(value.imag)):
        raise LiteralError("value holds a NaN or infinite complex")
    try:
        return repr(value)  # exact built-in type: the built-in repr
    except ValueError as e:  # int over sys.get_int_max_str_digits()
        raise LiteralError(f"value cannot be rendered: {_short(str(e))}") from None


def _finite(x: float) -> bool:
    """``math.isfinite`` without importing ``math``: ``inf - inf`` and ``nan - nan`` are NaN, never 0."""
    return x - x == 0.0


def outputs_equal(a: str, b: str, *, max_chars: int = MAX_TEXT_CHARS, max_depth: int = MAX_DEPTH) -> bool:
    """Whether two literal texts denote ``==`` values; ``False`` if either is not a plain literal.

    This is the comparison CRUXEval and AZR use (``f(x) == output``), applied to parsed plain values
    only, so ``1 == 1.0 == True`` and dict order does not matter.
    """
    if a == b:
        # Identical text parses to identical values, and plain values are == to themselves (no NaN).
        try:
            parse_literal(a, max_chars=max_chars, max_depth=max_depth)
        except (LiteralError, TypeError):
            return False
        return True
    try:
        return bool(
            parse_literal(a, max_chars=max_chars, max_depth=max_depth)
            == parse_literal(b, max_chars=max_chars, max_depth=max_depth)
        )
    except (LiteralError, TypeError):
        return False


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
