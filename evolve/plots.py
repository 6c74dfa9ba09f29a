"""Learning curves of a PBT run, drawn from its ``metrics.jsonl`` with matplotlib (the ``evolve`` extra).

``plot_run(run_dir)`` writes ``run_dir/curves.png``: four panels over generations — the arms race (student
solve rate, invalid-proposal rate), mean reward per decision by role, fitness per role (mean and best
member), and the difficulty and coverage of valid proposals — with the generations that produced children
marked. It reads only the metrics file, so it works on a finished run, a running one or a resumed one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["plot_run"]


def _load(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: not a run folder of run_pbt / populora train")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not a JSON line ({error})") from None
    if not rows:
        raise ValueError(f"{path} holds no generation yet")
    return rows


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draws the run's learning curves into a PNG.

    Args:
        run_dir: a run folder written by ``run_pbt`` (holding ``metrics.jsonl``).
        out: where to write the figure; default ``run_dir/curves.png``.

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

    arms.plot(gens, [r["solve_rate"] for r in rows], marker="o", label="student solve rate")
    arms.plot(gens, [r["invalid_rate"] for r in rows], marker="s", label="invalid proposals")
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
    fig.suptitle(f"{run_dir.name}: {len(rows)} generations")
    fig.tight_layout()
    target = Path(out) if out is not None else run_dir / "curves.png"
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
