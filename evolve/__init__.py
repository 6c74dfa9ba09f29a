"""Population-based training with weight-space operators around any policy.

    from evolve import operators
    child = operators.CROSSOVERS["interpolate"]([parent_a, parent_b], rng=torch.Generator().manual_seed(0))
"""

from __future__ import annotations

from evolve import operators
from evolve.genome import Genome, LoraPair, lora_pairs
from evolve.operators import CROSSOVERS, MUTATIONS

__all__ = ["CROSSOVERS", "MUTATIONS", "Genome", "LoraPair", "lora_pairs", "operators"]
