"""Population-based training with weight-space operators around any policy.

    from evolve import operators, PBTConfig, run_pbt
    child = operators.CROSSOVERS["interpolate"]([parent_a, parent_b], rng=torch.Generator().manual_seed(0))
    run_dir = run_pbt(PBTConfig(...))

``evolve`` sees policies only through protocols (:class:`EvolvablePolicy`, :class:`Learner`); it never
imports ``agents``.
"""

from __future__ import annotations

from evolve import operators
from evolve.genome import Genome, LoraPair, lora_pairs
from evolve.learners import LEARNERS, LearnerConfig
from evolve.members import POLICIES
from evolve.operators import CROSSOVERS, MUTATIONS
from evolve.pbt import KIND_MODES, PBTConfig, RunInUseError, run_pbt
from evolve.protocols import EvolvablePolicy, Learner, LearnStats, Transition

__all__ = [
    "CROSSOVERS",
    "KIND_MODES",
    "LEARNERS",
    "MUTATIONS",
    "POLICIES",
    "EvolvablePolicy",
    "Genome",
    "LearnStats",
    "Learner",
    "LearnerConfig",
    "LoraPair",
    "PBTConfig",
    "RunInUseError",
    "Transition",
    "lora_pairs",
    "operators",
    "run_pbt",
]
