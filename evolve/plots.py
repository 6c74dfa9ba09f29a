"""Learning curves of a PBT run, drawn from its ``metrics.jsonl`` with matplotlib (the ``evolve`` extra).

``plot_run(run_dir)`` writes ``run_dir/curves.png``: four panels over generations — the arms race (student
solve rate, invalid-proposal rate), mean reward per decision by role, fitness per role (mean and best
member), and the difficulty and coverage of valid proposals — with the generations that produced children
marked. It reads only the metrics file, so it works on a finished run, a running one or a resumed one.

``compare_runs(run_dirs, out)`` overlays several runs (e.g. ``--preset self-play``, ``1t1s`` and ``4t8s``
with one seed) on the curves where self-play variants differ — solve rate, invalid rate, teacher reward,
difficulty and coverage — and ``summary_rows`` gives the same comparison as numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from evolve.protocols import ROLES
from evolve.runlog import truncated_share

__all__ = ["COMPARED_COLUMNS", "compare_runs", "plot_run", "summary_rows"]


def _load(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: not a run folder of run_pbt / populora train")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:  # (it named no file)
        raise ValueError(f"{path}: not UTF-8 ({error})") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()  # a record still being written (or cut short by a kill): the resume rewrites it
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as error:  # (json recurses per bracket: 100 000 of them)
            raise ValueError(f"{path}:{number}: not a JSON line ({type(error).__name__}: {error})") from None
        problem = _record_problem(record)
        if problem:
            raise ValueError(f"{path}:{number}: not a generation record of run_pbt ({problem})")
        rows.append(record)
    if not rows:
        raise ValueError(f"{path} holds no generation yet")
    return rows


# the fields of a metrics record the plots read, and what each must be
_NUMBER, _MAPPING = (int, float), dict
_FIELDS: dict[str, Any] = {
    "generation": int, "solve_rate": (*_NUMBER, type(None)), "invalid_rate": _NUMBER, "coverage": _NUMBER,
    "mean_reward": _MAPPING, "role_fitness": _MAPPING, "difficulty": _MAPPING, "lineage": list,
}  # fmt: skip


def _solve_rate(record: dict[str, Any]) -> float:
    """A record's solve rate, ``nan`` (no point drawn) where no student attempted a task."""
    return float("nan") if record["solve_rate"] is None else float(record["solve_rate"])


def _cut(record: dict[str, Any], role: str) -> float:
    """The share of a role's trained answers cut off at the token budget, ``nan`` where no learner counted
    them by role (``runlog.truncated_share``)."""
    share = truncated_share(record.get("learner_info", {}), role)
    return float("nan") if share is None else share


def _finite(value: Any) -> bool:
    """Whether ``value`` is a number matplotlib can draw: finite as a float (``10**400`` overflowed in
    matplotlib, NaN and infinity everywhere broke its axis limits: a robustness review)."""
    if not isinstance(value, _NUMBER) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _record_problem(record: Any) -> str:
    """What keeps ``record`` from being drawn ('' when nothing does)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for key, kind in _FIELDS.items():
        if key not in record:
            return f"no {key!r}"
        if not isinstance(record[key], kind) or isinstance(record[key], bool):
            return f"{key!r} is {record[key]!r:.60}"
    for key in ("generation", "solve_rate", "invalid_rate", "coverage"):
        if not _finite(record[key]) and not (
            key == "solve_rate" and record[key] is None
        ):  # (None: no attempt)
            return f"{key!r} is not a finite number ({record[key]!r:.60})"
    for key in ("depth", "cyclomatic", "lines"):
        if not _finite(record["difficulty"].get(key)):
            return f"'difficulty' has no finite number {key!r}"
    if not all(_finite(v) for v in record["mean_reward"].values()):
        return "'mean_reward' holds a value that is not a finite number"
    for role, fitness in record["role_fitness"].items():
        if not isinstance(fitness, dict):
            return "'role_fitness' holds a value that is not an object"
        if not all(_finite(fitness[k]) for k in ("mean", "max") if k in fitness):
            return f"'role_fitness' of {role!r} holds a value that is not a finite number"
    if "op_coverage" in record and not _finite(record["op_coverage"]):
        return "'op_coverage' is not a finite number"
    info = record.get("learner_info", {})  # (absent from records written before it)
    if not isinstance(info, dict) or not all(isinstance(figures, dict) for figures in info.values()):
        return "'learner_info' is not an object of objects"
    for member, figures in info.items():
        for key, value in figures.items():  # the cut-off shares' counts, in all and by role (null: uncounted)
            counts = key.partition("_")[0] in ("truncated", "completions")
            if counts and value is not None and not _finite(value):
                return f"'learner_info' of member {member!r} has {key!r} {value!r:.60}"
    return ""


def _png(out: str | Path, name: str = "curves.png") -> Path:
    """``out``, with ``.png`` added when it has no extension (matplotlib adds it to the file it writes);
    ``out/name`` when ``out`` is a folder (it wrote ``out.png`` beside the folder)."""
    path = Path(out)
    if path.is_dir():
        return path / name
    return path if path.suffix else path.with_name(path.name + ".png")


def _shown(text: str) -> str:
    """``text`` as a figure can show it: a folder name that is not UTF-8 (surrogate escapes) gets '?'."""
    return text.encode("utf-8", "replace").decode("utf-8")


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draws the run's learning curves into a PNG.

    Args:
        run_dir: a run folder written by ``run_pbt`` (holding ``metrics.jsonl``).
        out: where to write the figure (an existing folder: ``curves.png`` in it); default
            ``run_dir/curves.png``.

    Returns:
        The path of the written PNG.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir``.
        ValueError: a malformed line (its number is named) or no generation yet.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    rows = _load(run_dir)
    gens = [r["generation"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    arms, reward, fitness, difficulty = axes.flat

    arms.plot(gens, [_solve_rate(r) for r in rows], marker="o", label="student solve rate")
    arms.plot(gens, [r["invalid_rate"] for r in rows], marker="s", label="invalid proposals")
    # learners that count answers cut off at the token budget (GRPO's): by role, or in all where no record
    # counted by role (a learner of its own, records written before the roles were; absent from older ones)
    infos = [r.get("learner_info", {}) for r in rows]
    cut = {f"{role}s' trained answers cut off": [truncated_share(i, role) for i in infos] for role in ROLES}
    cut = {label: shares for label, shares in cut.items() if any(c is not None for c in shares)}
    combined = [truncated_share(i) for i in infos]
    if not cut and any(c is not None for c in combined):
        cut = {"trained answers cut off": combined}
    for (label, shares), marker in zip(cut.items(), "^v", strict=False):
        arms.plot(gens, [float("nan") if c is None else c for c in shares], marker=marker, linestyle=":",
                  label=label)  # fmt: skip
    arms.set_ylim(-0.02, 1.02)
    arms.set_title("arms race")

    for role in sorted({role for r in rows for role in r["mean_reward"]}):
        reward.plot(gens, [r["mean_reward"].get(role, float("nan")) for r in rows], marker="o", label=role)
    reward.axhline(0.0, color="grey", linewidth=0.5)
    reward.set_title("mean reward per decision")

    for role in sorted({role for r in rows for role in r["role_fitness"]}):
        line = fitness.plot(gens, [r["role_fitness"].get(role, {}).get("mean", float("nan")) for r in rows],
                            marker="o", label=f"{role} mean")[0]  # fmt: skip
        fitness.plot(gens, [r["role_fitness"].get(role, {}).get("max", float("nan")) for r in rows],
                     linestyle="--", color=line.get_color(), label=f"{role} best")  # fmt: skip
    fitness.set_title("fitness by role")

    difficulty.plot(gens, [r["difficulty"]["depth"] for r in rows], marker="o", label="AST depth")
    difficulty.plot(gens, [r["difficulty"]["cyclomatic"] for r in rows], marker="s", label="cyclomatic")
    difficulty.plot(gens, [r["difficulty"]["lines"] for r in rows], marker="^", label="lines")
    difficulty.plot(gens, [r["coverage"] for r in rows], marker="x", label="coverage (AST shapes)")
    if any("op_coverage" in r for r in rows):  # runs from before it was measured have none
        difficulty.plot(gens, [r.get("op_coverage", float("nan")) for r in rows], marker="+",
                        label="coverage (op sets)")  # fmt: skip
    difficulty.set_title("valid proposals")

    bred = [r["generation"] for r in rows if r["lineage"]]
    for ax in axes.flat:
        for g in bred:
            ax.axvline(g, color="grey", alpha=0.15, linewidth=3)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[1]:
        ax.set_xlabel("generation (shaded: children made at its end)")
    fig.suptitle(_shown(f"{run_dir.name}: {len(rows)} generations"))
    fig.tight_layout()
    target = _png(out) if out is not None else run_dir / "curves.png"
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


# (short name, title, metric of one generation's record) of the comparison panels and table columns
_COMPARED: tuple[tuple[str, str, Any], ...] = (
    ("solve", "student solve rate", lambda r: _solve_rate(r)),
    ("invalid", "invalid proposals", lambda r: r["invalid_rate"]),
    ("teacher", "teacher reward per proposal", lambda r: r["mean_reward"].get("teacher", float("nan"))),
    ("depth", "AST depth of valid proposals", lambda r: r["difficulty"]["depth"]),
    ("cyclo", "cyclomatic complexity", lambda r: r["difficulty"]["cyclomatic"]),
    ("coverage", "coverage (distinct AST shapes)", lambda r: r["coverage"]),
    ("t-cut", "teachers' trained answers cut off", lambda r: _cut(r, "teacher")),
    ("s-cut", "students' trained answers cut off", lambda r: _cut(r, "student")),
)
COMPARED_COLUMNS: tuple[tuple[str, str], ...] = tuple((short, title) for short, title, _ in _COMPARED)
"""``(short name, title)`` of each compared metric; ``summary_rows`` keys its values by title."""


def _label(run_dir: Path, name: str | None = None) -> str:
    """The run's name (default: its folder's) and its setup (seats, self-play) from its ``config.json``
    when readable."""
    name = _shown(name if name is not None else run_dir.name)
    try:
        config = json.loads((run_dir / "config.json").read_text())
        env = config["env"]
        setup = "self-play" if config.get("self_play") else f"{env['n_teachers']}T x {env['n_students']}S"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):  # any damage: the name
        return name
    return f"{name} ({setup}, pop {config.get('population', '?')})"


def _labels(run_dirs: list[Path]) -> list[str]:
    """One label per run; runs whose folders share a name (``a/run``, ``b/run``) are named by their path."""
    names = [d.name for d in run_dirs]
    return [_label(d, str(d) if names.count(d.name) > 1 else None) for d in run_dirs]


def summary_rows(run_dirs: list[str | Path], last: float = 1 / 3) -> list[dict[str, Any]]:
    """One row per run: its label, generations, and each compared metric averaged over the last ``last``
    fraction of its generations (at least one), where a run's trend has settled.

    Raises:
        FileNotFoundError / ValueError: as ``plot_run``, naming the run.
    """
    if isinstance(run_dirs, str | Path) or not isinstance(last, int | float) or not 0 < last <= 1:
        # (a string was taken for a list of folders, one per letter; NaN and infinity failed in round())
        raise ValueError(
            f"summary_rows takes a list of run folders and 0 < last <= 1, got {run_dirs!r}, {last!r}"
        )
    rows = []
    paths = [Path(d) for d in run_dirs]
    for run_dir, label in zip(paths, _labels(paths), strict=True):
        records = _load(run_dir)
        tail = records[-max(1, round(len(records) * last)) :]
        row: dict[str, Any] = {"run": label, "generations": len(records)}
        for _, title, metric in _COMPARED:  # (over the generations that have it: nan where none has)
            values = [v for v in (metric(r) for r in tail) if not math.isnan(v)]
            row[title] = sum(values) / len(values) if values else float("nan")
        rows.append(row)
    return rows


def compare_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Overlays several runs' curves in one PNG (one colour per run, one panel per metric).

    Args:
        run_dirs: run folders written by ``run_pbt`` (each holding ``metrics.jsonl``).
        out: where to write the figure (an existing folder: ``compare.png`` in it).

    Returns:
        The path of the written PNG.

    Raises:
        FileNotFoundError: a folder without ``metrics.jsonl``.
        ValueError: no run given, a malformed line (its file and number are named) or an empty run.
    """
    if not run_dirs:
        raise ValueError("run_dirs: give at least one run folder")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    paths = [Path(d) for d in run_dirs]
    runs = list(zip(_labels(paths), [_load(d) for d in paths], strict=True))
    columns = -(-len(_COMPARED) // 2)
    fig, axes = plt.subplots(2, columns, figsize=(4.5 * columns, 7), sharex=True)
    for (_, title, metric), ax in zip(_COMPARED, axes.flat, strict=True):
        for index, (label, records) in enumerate(runs):  # markers too: equal curves stay visible
            ax.plot([r["generation"] for r in records], [metric(r) for r in records],
                    marker="osD^vx"[index % 6], markersize=7 - index % 4, alpha=0.85, label=label)  # fmt: skip
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for (short, _, _), ax in zip(_COMPARED, axes.flat, strict=True):
        if short in ("solve", "invalid", "t-cut", "s-cut"):  # shares
            ax.set_ylim(-0.02, 1.02)
    axes.flat[0].legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("generation")
    fig.suptitle(f"{len(runs)} runs compared")
    fig.tight_layout()
    target = _png(out, "compare.png")
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
