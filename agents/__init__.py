"""LLM agents: LoRA populations on one frozen base, batched rollouts and the GRPO learner.

from agents import build_tiny_base, LoRAPopulation, GRPOConfig, GRPOLearner
base_dir = build_tiny_base()                                   # offline, cached on disk
pop = LoRAPopulation.from_pretrained(base_dir, names=["teacher_0", "student_0"], rank=8)
texts = pop.generate(prompts, adapters=["teacher_0", "student_0"], max_new_tokens=64, temperature=0.0, seed=0)
policy = pop.policy("student_0")                               # a Policy for the env

Importing ``agents`` also registers LoRA members for ``evolve``'s PBT loop (``agents.members``):
``PBTConfig(teachers="lora", students="lora", learner="grpo", member_options={"lora": {...}, "grpo": {...}})``.
"""

from __future__ import annotations

from agents.base import BaseModelLoadError, TinyBaseConfig, build_tiny_base, load_base
from agents.grpo import GRPOConfig, GRPOLearner, UpdateStats
from agents.members import GRPOMemberLearner, LoRAMember, LoRAMemberOptions
from agents.policy import LoRAPolicy
from agents.population import LoRAPopulation
from agents.rollout import (
    EpisodeRollout,
    GRPOBatch,
    RolloutCollector,
    RolloutConfig,
    StepRecord,
    grpo_batches,
    update_adapters,
)

__all__ = [
    "BaseModelLoadError",
    "EpisodeRollout",
    "GRPOBatch",
    "GRPOConfig",
    "GRPOLearner",
    "GRPOMemberLearner",
    "LoRAMember",
    "LoRAMemberOptions",
    "LoRAPolicy",
    "LoRAPopulation",
    "RolloutCollector",
    "RolloutConfig",
    "StepRecord",
    "TinyBaseConfig",
    "UpdateStats",
    "build_tiny_base",
    "grpo_batches",
    "load_base",
    "update_adapters",
]
