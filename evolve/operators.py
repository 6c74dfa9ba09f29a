"""Operator registries: ``MUTATIONS[name](genome, rng=..., strength=0.1)`` and
``CROSSOVERS[name]([parents...], rng=..., fitness=None)``, both returning a new genome.

Which operators accept which genomes:

==================  ===========  ============================  ===========
name                kind         space                         plain genome
==================  ===========  ============================  ===========
svd_spectrum        mutation     ΔW                            no
layer_gaussian      mutation     factor / parameter            yes
component_mask      mutation     ΔW                            no
gaussian            mutation     factor / parameter            yes
neftune_a           mutation     factor (A only)               no
dare                crossover    factor / parameter            yes
uniform             crossover    module                        yes
svd_splice          crossover    ΔW                            no
extrapolate         crossover    ΔW (re-projected) / param.    yes
es                  crossover    ΔW (re-projected) / param.    yes
clone_mutate        crossover    that of the mutation          with a dense mutation
interpolate         crossover    ΔW (re-projected) / param.    yes
==================  ===========  ============================  ===========

Operators that need LoRA structure raise ``ValueError`` on a plain genome. The registries are dicts:
add an operator with ``MUTATIONS["mine"] = fn``. An unknown name raises ``KeyError`` listing the names.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from evolve import crossovers, mutations
from evolve.genome import Genome


class Mutation(Protocol):
    """A mutation operator."""

    def __call__(self, genome: Genome, *, rng: torch.Generator, strength: float = ...) -> Genome: ...


class Crossover(Protocol):
    """A crossover operator (``fitness``: one value per parent, higher is better)."""

    def __call__(
        self,
        parents: Sequence[Genome],
        *,
        rng: torch.Generator,
        fitness: Sequence[float] | torch.Tensor | None = ...,
    ) -> Genome: ...


class Registry(dict[str, Any]):
    """A plain dict of operators whose missing keys raise a ``KeyError`` that lists the registered names."""

    def __init__(self, kind: str, entries: dict[str, Any]) -> None:
        super().__init__(entries)
        self.kind = kind

    def __missing__(self, name: str) -> Any:
        raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}")


class LazyRegistry(Registry):
    """A ``Registry`` whose optional entries live in modules imported on first lookup (optional extras).

    Importing the module registers the entry. An unknown name's ``KeyError`` lists the registered names
    and, apart, the optional ones.

    Args:
        kind: what the entries are (for messages).
        entries: the built-in entries.
        lazy: optional name -> (module that registers it, the extra it needs).
    """

    def __init__(self, kind: str, entries: dict[str, Any], lazy: dict[str, tuple[str, str]]) -> None:
        super().__init__(kind, entries)
        self.lazy = lazy

    def __missing__(self, name: str) -> Any:
        if name not in self.lazy:
            names = sorted(key for key in self if key not in self.lazy)
            # (a kind the driver registered was "unknown" in a Ray actor, with no word why: a review)
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(names)}; "
                           f"optional: {', '.join(sorted(self.lazy))} (a name registered in a script is known to "
                           "that process only: on Ray, register it in a module the actors import)")  # fmt: skip
        module, extra = self.lazy[name]
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ImportError(
                f"{self.kind} {name!r} needs the optional extra: pip install 'populora-env[{extra}]' ({error})"
            ) from error
        if not dict.__contains__(self, name):
            raise KeyError(f"{module} did not register {self.kind} {name!r}")
        return dict.__getitem__(self, name)


MUTATIONS: Registry = Registry(
    "mutation",
    {
        "svd_spectrum": mutations.svd_spectrum,
        "layer_gaussian": mutations.layer_gaussian,
        "component_mask": mutations.component_mask,
        "gaussian": mutations.gaussian,
        "neftune_a": mutations.neftune_a,
    },
)
"""Mutation operators by name (see the module table)."""

CROSSOVERS: Registry = Registry(
    "crossover",
    {
        "dare": crossovers.dare,
        "uniform": crossovers.uniform,
        "svd_splice": crossovers.svd_splice,
        "extrapolate": crossovers.extrapolate,
        "es": crossovers.es,
        "clone_mutate": crossovers.clone_mutate,
        "interpolate": crossovers.interpolate,
    },
)
"""Crossover operators by name (see the module table)."""

LORA_ONLY: frozenset[str] = frozenset({"svd_spectrum", "component_mask", "neftune_a", "svd_splice"})
"""Operators that raise ``ValueError`` on a plain genome."""

TWO_PARENTS: frozenset[str] = frozenset({"svd_splice", "extrapolate", "interpolate"})
"""Crossovers that take exactly two parents (``ValueError`` otherwise); the others take any number."""
