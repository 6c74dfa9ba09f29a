"""Train a 1-teacher x 1-student LoRA population on TeacherStudent-v0 with GRPO, on CPU.

Usage:
    python examples/02_lora_selfplay.py [--iterations 4] [--episodes 2] [--self-play] [--seed 0]
    python examples/02_lora_selfplay.py --base-dir PATH   # any local causal LM instead of the tiny base

Builds (or reuses, cached on disk) the tiny offline Llama base, puts one LoRA adapter per agent on it
(``--self-play`` maps teacher_0 and student_0 to one adapter: AZR's single-agent baseline), then repeats:
collect episodes with one batched mixed-adapter generation per game phase, group the completions by the
env's info into GRPO groups, and update every adapter. It prints each adapter's mean reward per role, and its
GRPO loss and how many of its completions were cut off at the token budget, by role.

Honest scope: the tiny base learns the answer format, not program semantics, so rewards mostly move
between format errors and well-formed wrong answers; research runs use a real base on a GPU.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Annotated

import torch
import tyro

from agents.base import TinyBaseConfig, build_tiny_base
from agents.grpo import GRPOConfig, GRPOLearner
from agents.grpo_config import UpdateStats
from agents.population import LoRAPopulation
from agents.rollout import (
    EpisodeRollout,
    GRPOBatch,
    RolloutCollector,
    RolloutConfig,
    grpo_batches,
    update_adapters,
)
from populora_env import teacher_student_v0


@dataclass(frozen=True)
class Args:
    iterations: int = 4
    """Collect-then-update iterations."""
    episodes: int = 2
    """Episodes collected per iteration."""
    rounds: int = 2
    """Rounds per episode."""
    group_size: int = 4
    """Attempts per observation for teachers and students (the GRPO group size)."""
    max_new_tokens: int = 96
    """Generation budget per action (also the learner's completion cap)."""
    learning_rate: float = 1e-2
    """AdamW learning rate of the adapters."""
    rank: int = 8
    """LoRA rank."""
    invalid_penalty: float = -0.5
    """Teacher reward of a well-formed proposal the verifier rejects (above the format penalty, -1)."""
    self_play: bool = False
    """One adapter plays both agents (AZR's self-calibrating baseline) instead of one adapter each."""
    prefill: bool = True
    """Prefill the env's answer scaffold so the tiny base only writes the answer bodies."""
    base_dir: str | None = None
    """A local causal-LM directory to use instead of building the tiny base."""
    # (fewer build faster and answer worse: at 120, every proposal of the first iterations was invalid, so the
    # student never played)
    base_steps: int = TinyBaseConfig.steps
    """Pretraining steps of the tiny base (the default is populora train's cached base)."""
    cache_dir: Annotated[
        str | None,
        tyro.conf.arg(
            metavar="PATH", help_behavior_hint="(default: $POPULORA_CACHE_DIR or ~/.cache/populora)"
        ),
    ] = None
    """Cache of tiny bases."""
    threads: int = 1
    """Torch threads (a model this small gains little from more)."""
    seed: int = 0
    """Seed of the episodes, the generation and the adapters' init."""


def role_means(rollouts: list[EpisodeRollout]) -> dict[str, float]:
    """Mean reward per (adapter, role) over the adapter-played steps."""
    totals: dict[str, list[float]] = {}
    for rollout in rollouts:
        for step in rollout.steps:
            if step.adapter is not None:
                totals.setdefault(f"{step.adapter}/{step.role}", []).append(step.reward)
    return {key: sum(values) / len(values) for key, values in sorted(totals.items())}


def main(args: Args) -> None:
    # PEFT calls a transformers method deprecated in v5 on every adapter it adds: noise, not a problem here
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    for flag, value in (
        ("--iterations", args.iterations),
        ("--episodes", args.episodes),
        ("--threads", args.threads),
    ):
        if value < 1:  # (the settings below are checked where they are used)
            raise SystemExit(f"02_lora_selfplay: {flag} must be >= 1, got {value}")
    if args.group_size < 2:  # (as populora train: a group of one trained nothing, without a word; an audit)
        raise SystemExit(f"02_lora_selfplay: --group-size must be >= 2 (GRPO's advantages are relative to the "
                         f"group: a group of one has none, and nothing learns), got {args.group_size}")  # fmt: skip
    try:
        torch.set_num_threads(args.threads)
        config = TinyBaseConfig()
        if args.base_steps != config.steps:  # another base than the default one (built and cached apart)
            config = dataclasses.replace(
                config, steps=args.base_steps, warmup_steps=min(config.warmup_steps, args.base_steps)
            )
        base_dir = args.base_dir or build_tiny_base(args.cache_dir, config)
        adapters = (
            {"teacher_0": "self", "student_0": "self"}
            if args.self_play
            else {"teacher_0": "teacher_0", "student_0": "student_0"}
        )
        pop = LoRAPopulation.from_pretrained(
            base_dir, sorted(set(adapters.values())), rank=args.rank, seed=args.seed
        )
        env = teacher_student_v0.env(
            n_teachers=1,
            n_students=1,
            rounds=args.rounds,
            task_types=("deduction", "abduction"),
            teacher_group_size=args.group_size,
            student_group_size=args.group_size,
            teacher_invalid_penalty=args.invalid_penalty,
        )
        collector = RolloutCollector(
            pop,
            adapters,
            RolloutConfig(max_new_tokens=args.max_new_tokens, prefill=args.prefill, seed=args.seed),
        )
        learner = GRPOLearner(
            pop,
            GRPOConfig(learning_rate=args.learning_rate, max_new_tokens=args.max_new_tokens, seed=args.seed),
        )
    # a bad setting, a --base-dir that is no model, a --cache-dir that cannot be made
    except (ValueError, OSError) as error:  # (BaseModelLoadError is an OSError)
        message = str(error).replace("TinyBaseConfig.steps", "--base-steps")
        raise SystemExit(f"02_lora_selfplay: {message}") from None

    # ----- collect, group, update ----------------------------------------------------------------------
    for iteration in range(args.iterations):
        rollouts = collector.collect(env, args.episodes, seed=args.seed + iteration * args.episodes)
        batches = grpo_batches(rollouts)
        stats = update_adapters(learner, batches)
        means = ", ".join(f"{key} {value:+.3f}" for key, value in role_means(rollouts).items())
        last = rollouts[-1].metrics
        print(
            f"iteration {iteration}: mean reward {means} | invalid proposals {last.invalid_rate:.2f} | "
            + " ".join(
                f"{name} loss {s.loss:+.4f} cut {cut_by_role(batches[name], s)}" for name, s in stats.items()
            )
        )


def cut_by_role(batch: GRPOBatch, stats: UpdateStats) -> str:
    """``teacher 1/8 student 0/4``: each role's completions in the update that hit the token budget without a
    stop token (a self-play adapter trains on both roles' answers)."""
    roles = [role for role, _ in batch.task_keys]
    cut = Counter(roles[row] for row in stats.truncated_rows or ())
    return " ".join(f"{role} {cut[role]}/{total}" for role, total in Counter(roles).items())


if __name__ == "__main__":
    main(tyro.cli(Args))
