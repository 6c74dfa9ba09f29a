"""Static difficulty measures of proposed programs: AST depth, cyclomatic complexity, lines, AST shape, op set.

All functions parse with ``ast.parse`` only (nothing is executed) and return neutral values on source that
does not parse, so they are safe on adversarial text.
"""

from __future__ import annotations

import ast
import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from populora_env.verifier.literals import parse_quietly

MAX_SOURCE_CHARS = 20_000
# Decision points counted by McCabe's cyclomatic complexity (McCabe 1976, "A Complexity Measure",
# IEEE TSE; the per-node counting follows the common radon/mccabe convention: +1 per branch point,
# +1 per extra operand of a boolean operator, +1 per comprehension ``if``).
_BRANCH_NODES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.With, ast.Assert)


@dataclass(frozen=True)
class ProgramStats:
    """Difficulty measures of one program.

    Attributes:
        depth: maximum depth of the AST (module = 1).
        cyclomatic: McCabe cyclomatic complexity of the whole source.
        lines: non-blank source lines.
        shape: hash of the AST node-type structure with names and constants erased.
        ops: the program's op set (``op_set``), e.g. ``"Add,For,call:len"``.
    """

    depth: int
    cyclomatic: int
    lines: int
    shape: str
    ops: str = ""


def _parse(source: str) -> ast.AST | None:
    if len(source) > MAX_SOURCE_CHARS:
        return None
    try:
        return parse_quietly(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def ast_depth(tree: ast.AST) -> int:
    """Maximum nesting depth of an AST (context markers excluded), iteratively (no recursion limit on deep trees)."""
    best = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        best = max(best, depth)
        # Load/Store context markers are bookkeeping, not structure.
        stack.extend(
            (child, depth + 1)
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.expr_context)
        )
    return best


def cyclomatic_complexity(tree: ast.AST) -> int:
    """McCabe complexity: 1 + decision points (branches, boolean operands, comprehension guards)."""
    total = 1
    for node in ast.walk(tree):
        if isinstance(node, _BRANCH_NODES):
            total += 1
        elif isinstance(node, ast.BoolOp):
            total += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            total += 1 + len(node.ifs)
        elif isinstance(node, ast.match_case):
            total += 1
    return total


def ast_shape(tree: ast.AST) -> str:
    """A 12-hex-digit hash of the node-type skeleton (identifier names and constant values erased).

    Two programs with the same shape differ only in names and constants; the number of distinct shapes
    is the coverage measure of the problem space.
    """
    tokens: list[str] = []
    stack: list[ast.AST | str] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            tokens.append(item)
            continue
        tokens.append(type(item).__name__)
        stack.append(")")
        stack.extend(reversed(list(ast.iter_child_nodes(item))))
    return hashlib.sha1(" ".join(tokens).encode()).hexdigest()[:12]


_OP_NODES = (ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
_STRUCTURE_NODES = (ast.For, ast.While, ast.If, ast.IfExp, ast.ListComp, ast.SetComp, ast.DictComp,
                    ast.GeneratorExp, ast.Subscript, ast.Slice, ast.Lambda, ast.Try, ast.With, ast.Match)  # fmt: skip


def op_set(tree: ast.AST) -> str:
    """The operations a program uses, sorted and comma-joined: operators (``Add``, ``Lt``, ``And``...),
    the names it calls (``call:sorted``, ``call:append`` for a method) and its control and data structure
    (``For``, ``ListComp``, ``Subscript``...). ``ast_shape`` erases names, so ``sorted(x)`` and ``len(x)``
    share a shape; they differ here (DESIGN.md's "op sets" of problem-space coverage)."""
    ops: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, _OP_NODES + _STRUCTURE_NODES):
            ops.add(type(node).__name__)
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            ops.add(f"call:{name}" if name else "call")
    return ",".join(sorted(ops))


def program_stats(source: str) -> ProgramStats:
    """All difficulty measures of a source text (zeros and an empty shape if it does not parse)."""
    tree = _parse(source)
    lines = sum(1 for line in source[:MAX_SOURCE_CHARS].splitlines() if line.strip())
    if tree is None:
        return ProgramStats(0, 0, lines, "")
    return ProgramStats(ast_depth(tree), cyclomatic_complexity(tree), lines, ast_shape(tree), op_set(tree))


@dataclass(frozen=True)
class EpisodeMetrics:
    """Arms-race measures of one episode.

    Attributes:
        n_proposals: proposals made.
        invalid_rate: fraction of proposals the verifier rejected or that were malformed.
        format_error_rate: fraction of proposals that were malformed.
        mean_depth: mean AST depth of valid proposals (0 if none).
        mean_cyclomatic: mean cyclomatic complexity of valid proposals.
        mean_lines: mean non-blank lines of valid proposals.
        coverage: distinct AST shapes among valid proposals.
        solve_rate: fraction of correct student attempts overall (``None`` without attempts).
        teacher_solve_rate: per teacher, mean solve rate of its matched valid tasks.
        student_solve_rate: per student, fraction of its attempts that were correct.
        op_coverage: distinct op sets (``op_set``) among valid proposals.
        rejections: why proposals were turned away: counts by ``"<verdict>/<status>"``, e.g.
            ``"invalid/runtime"`` (the verifier's status, or the game's reason such as ``too_few_inputs``) or
            ``"format_error/missing_python"`` (the parser's reason); empty when every proposal was valid.
    """

    n_proposals: int
    invalid_rate: float
    format_error_rate: float
    mean_depth: float
    mean_cyclomatic: float
    mean_lines: float
    coverage: int
    solve_rate: float | None
    teacher_solve_rate: dict[str, float | None]
    student_solve_rate: dict[str, float | None]
    op_coverage: int = 0
    rejections: dict[str, int] = field(default_factory=dict)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_episode(
    proposals: Sequence[tuple[str, str, str, float | None]],
    attempts: Sequence[tuple[str, bool]],
    teachers: Sequence[str],
    students: Sequence[str],
    statuses: Sequence[str] = (),
) -> EpisodeMetrics:
    """Computes episode metrics from plain records.

    Args:
        proposals: ``(teacher, verdict, program, solve_rate)`` per proposal (program "" unless valid).
        attempts: ``(student, correct)`` per attempt.
        teachers: all teacher names (so idle teachers appear with ``None``).
        students: all student names.
        statuses: the status of each proposal (``ResolvedProposal.status``), in the same order, for
            ``rejections``; empty to leave that empty.
    """
    if statuses and len(statuses) != len(proposals):
        raise ValueError(f"statuses: {len(statuses)} given for {len(proposals)} proposals")
    rejections = Counter(
        f"{verdict}/{status}" for (_, verdict, _, _), status in zip(proposals, statuses) if verdict != "valid"
    )
    stats = [program_stats(program) for _, verdict, program, _ in proposals if verdict == "valid"]
    n = len(proposals)
    teacher_rates = {
        t: _mean([r for who, v, _, r in proposals if who == t and v == "valid" and r is not None])
        for t in teachers
    }
    student_rates = {s: _mean([float(ok) for who, ok in attempts if who == s]) for s in students}
    return EpisodeMetrics(
        n_proposals=n,
        invalid_rate=sum(v != "valid" for _, v, _, _ in proposals) / n if n else 0.0,
        format_error_rate=sum(v == "format_error" for _, v, _, _ in proposals) / n if n else 0.0,
        mean_depth=_mean([float(s.depth) for s in stats]) or 0.0,
        mean_cyclomatic=_mean([float(s.cyclomatic) for s in stats]) or 0.0,
        mean_lines=_mean([float(s.lines) for s in stats]) or 0.0,
        coverage=len({s.shape for s in stats if s.shape}),
        solve_rate=_mean([float(ok) for _, ok in attempts]),
        teacher_solve_rate=teacher_rates,
        student_solve_rate=student_rates,
        op_coverage=len({s.ops for s in stats if s.shape}),
        rejections=dict(sorted(rejections.items())),
    )
