"""Per-generation metric records and their sinks: JSONL files (exactly the checkpointed history) and
TensorBoard scalars; and the once-a-process warnings of a run (``warn_once``)."""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, SupportsFloat

from evolve.checkpoint import atomic_write_bytes
from evolve.protocols import ROLES
from populora_env.metrics import EpisodeMetrics

LearnerInfo = dict[str, dict[str, float | None]]
"""The learners' own figures of a generation (``LearnStats.info``): member id -> name -> value (NaN as None)."""


@dataclass(frozen=True)
class LearnerFailure:
    """A member whose learner raised: it was skipped for the generation (its weights were restored).

    Attributes:
        member: member id.
        generation: generation index.
        error: the exception's type name.
        message: the exception's message.
    """

    member: int
    generation: int
    error: str
    message: str


def warn_once(log: logging.Logger, key: Hashable, message: str, *args: Any) -> None:
    """``log.warning(message, *args)`` the first time this process meets ``key`` (configs are rebuilt on
    resume and in Ray actors, members made by the dozen: one word of each problem is enough)."""
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message, *args)


_WARNED: set[Hashable] = set()  # the keys warn_once has met in this process


@dataclass(frozen=True)
class GenerationMetrics:
    """What one generation measured (before its replacements).

    Attributes:
        generation: index (0-based).
        fitness: fitness by member id (as a string key, JSON-ready); ``None`` for a member the generation
            did not evaluate (no attempt or proposal of its role).
        role_fitness: ``{role: {"mean", "max"}}`` over that role's evaluated members (fixed ones included);
            a role none of whose members was evaluated is absent.
        ratings: ``{member: {"mu", "sigma"}}`` after this generation's matches.
        mean_reward: mean reward per decision, by role.
        solve_rate: fraction of correct student attempts, averaged over the generation's episodes that had
            any (each weighs the same, whatever its number of attempts); ``None`` when no student attempted
            a task (it read 0.0, a solve rate no student had: an audit).
        invalid_rate: fraction of invalid or malformed proposals, averaged over episodes.
        difficulty: mean AST depth, cyclomatic complexity and lines of valid proposals, averaged over the
            episodes that had any (0.0 when none had).
        coverage: mean distinct AST shapes per episode.
        op_coverage: mean distinct op sets (``populora_env.metrics.op_set``) per episode (0.0 in records
            written before it existed).
        losses: learner loss by member (``nan`` written as ``null``).
        learner_failures: learners that raised.
        operator_use: operators used by this generation's children.
        lineage: the children born at the end of this generation (``LineageRecord.to_json``).
        rejections: why this generation's proposals were turned away, summed over its episodes: counts by
            ``"<verdict>/<status>"`` (``EpisodeMetrics.rejections``; empty in records written before it).
        illegal_actions: actions the env refused (paid the format penalty), by member id, members with any
            only (empty in records written before it; they were in the log alone, a review).
        learner_info: the learners' other figures (``LearnStats.info``) by member, then by name, ``nan`` as
            ``null``; members whose learner reported none are absent (empty in records written before it).
    """

    generation: int
    fitness: dict[str, float | None]
    role_fitness: dict[str, dict[str, float]]
    ratings: dict[str, dict[str, float]]
    mean_reward: dict[str, float]
    solve_rate: float | None
    invalid_rate: float
    difficulty: dict[str, float]
    coverage: float
    losses: dict[str, float | None]
    learner_failures: list[dict[str, Any]]
    operator_use: dict[str, int]
    lineage: list[dict[str, Any]]
    op_coverage: float = 0.0
    rejections: dict[str, int] = field(default_factory=dict)
    illegal_actions: dict[str, int] = field(default_factory=dict)
    learner_info: LearnerInfo = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize_episodes(metrics: Sequence[EpisodeMetrics]) -> dict[str, Any]:
    """Means of the env's episode metrics over a generation."""
    solve = [m.solve_rate for m in metrics if m.solve_rate is not None]
    # an episode without a valid proposal has no difficulty to average (its metrics say 0.0)
    valid = [m for m in metrics if m.n_proposals and m.invalid_rate < 1.0]
    rejections: Counter[str] = Counter()
    for m in metrics:
        rejections.update(m.rejections)
    return {
        "solve_rate": _mean(solve) if solve else None,
        "invalid_rate": _mean([m.invalid_rate for m in metrics]),
        "difficulty": {
            "depth": _mean([m.mean_depth for m in valid]),
            "cyclomatic": _mean([m.mean_cyclomatic for m in valid]),
            "lines": _mean([m.mean_lines for m in valid]),
        },
        "coverage": _mean([float(m.coverage) for m in metrics]),
        "op_coverage": _mean([float(m.op_coverage) for m in metrics]),
        "rejections": dict(sorted(rejections.items())),
    }


def truncated_share(learner_info: LearnerInfo, role: str | None = None) -> float | None:
    """The share of the generation's trained completions that were cut off at the token budget, over the
    members whose learner counts them (``truncated`` and ``completions`` in ``LearnStats.info``, as GRPO's);
    with ``role``, of that role's completions only (``truncated_<role>`` and ``completions_<role>``, which
    records written before they existed lack). ``None`` when no learner counted any."""
    suffix = "" if role is None else f"_{role}"
    counts: list[tuple[float, float]] = []
    for info in learner_info.values():
        cut, total = info.get(f"truncated{suffix}"), info.get(f"completions{suffix}")
        if cut is not None and total:
            counts.append((cut, total))
    return sum(t for t, _ in counts) / sum(n for _, n in counts) if counts else None


def truncated_shares(learner_info: LearnerInfo) -> dict[str, float]:
    """``truncated_share`` by role (``{"teacher": ..., "student": ...}``, the roles some learner counted);
    where no learner counted by role but some counted in all (a learner of its own, records written before
    the roles were), ``{"all": share}``; empty when none counted."""
    shares = {role: truncated_share(learner_info, role) for role in ROLES}
    found: dict[str, float] = {role: share for role, share in shares.items() if share is not None}
    if found:
        return found
    combined = truncated_share(learner_info)
    return {} if combined is None else {"all": combined}


def finite_or_none(value: SupportsFloat) -> float | None:
    """``value`` as a float, ``None`` where it is not finite (JSON has no NaN): NaN, an infinity, an int past
    float's range."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def jsonl_bytes(records: Sequence[dict[str, Any]]) -> bytes:
    """JSON lines, keys sorted, so equal records give equal bytes."""
    return b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in records)


class RunLog:
    """Writes ``metrics.jsonl`` and ``lineage.jsonl`` and (optionally) TensorBoard scalars under ``tb/``.

    Args:
        run_dir: the run's folder.
        tensorboard: also write TensorBoard event files.
        start_generation: the first generation this process logs (TensorBoard purges later steps left by
            a killed process).
    """

    def __init__(self, run_dir: Path, tensorboard: bool, start_generation: int) -> None:
        self.metrics_path = run_dir / "metrics.jsonl"
        self.lineage_path = run_dir / "lineage.jsonl"
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=start_generation)

    def rewrite(self, history: Sequence[dict[str, Any]], lineage: Sequence[dict[str, Any]]) -> None:
        """Replaces both JSONL files by the checkpointed history (drops lines a killed process wrote later)."""
        atomic_write_bytes(self.metrics_path, jsonl_bytes(history))
        atomic_write_bytes(self.lineage_path, jsonl_bytes(lineage))

    def append(self, record: GenerationMetrics) -> None:
        """Appends one generation to the JSONL files and TensorBoard."""
        data = record.to_json()
        for path, rows in ((self.metrics_path, [data]), (self.lineage_path, data["lineage"])):
            with open(path, "ab") as handle:
                handle.write(jsonl_bytes(rows))
                handle.flush()
                os.fsync(handle.fileno())
        if self.writer is not None:
            self.scalars(record)

    def scalars(self, record: GenerationMetrics) -> None:
        """Writes one generation's TensorBoard scalars (nothing without TensorBoard)."""
        if self.writer is None:
            return
        step = record.generation
        scalars: dict[str, float] = {
            "env/invalid_rate": record.invalid_rate,
            "env/coverage": record.coverage,
            "env/op_coverage": record.op_coverage,
            **{f"difficulty/{k}": v for k, v in record.difficulty.items()},
            **{f"reward/{role}": v for role, v in record.mean_reward.items()},
            **{f"fitness/{role}_{k}": v for role, d in record.role_fitness.items() for k, v in d.items()},
            **{f"rating_mu/{m}": r["mu"] for m, r in record.ratings.items()},
            **{f"rating_sigma/{m}": r["sigma"] for m, r in record.ratings.items()},
            **{f"operators/{k}": float(v) for k, v in record.operator_use.items()},
            **{f"rejections/{k}": float(v) for k, v in record.rejections.items()},
            **{f"cut_off/{role}": share for role, share in truncated_shares(record.learner_info).items()},
            "lineage/children": float(len(record.lineage)),
            "learner/failures": float(len(record.learner_failures)),
            **{f"loss/{m}": v for m, v in record.losses.items() if v is not None},
            **{
                f"learner/{name}/{m}": v
                for m, info in record.learner_info.items()
                for name, v in info.items()
                if v is not None
            },
        }
        if record.solve_rate is not None:  # (no point where no student attempted a task)
            scalars["env/solve_rate"] = record.solve_rate
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        """Closes the TensorBoard writer."""
        if self.writer is not None:
            self.writer.close()
