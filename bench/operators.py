"""Benchmark: child-creation time of ``evolve.operators`` vs PEFT's ``add_weighted_adapter`` and ``populora``.

Run (CPU, about 1-3 minutes; one JSON line on stdout, progress on stderr)::

    .venv/bin/python bench/operators.py
    .venv/bin/python bench/operators.py --repeats 3 --threads 1
    .venv/bin/python bench/operators.py --threads 2   # the README's second column: both cores here

Needs ``peft`` and, for the second peer, the PyPI package ``populora`` (``.venv/bin/pip install populora``);
a missing peer is recorded as such in the JSON, never silently dropped.

Two LoRA shapes, rank 16 on q, k, v, o, gate, up, down of every layer:

* ``qwen2.5-0.5b``: 24 layers, hidden 896, intermediate 4864, key/value dim 128 (Qwen2.5-0.5B).
* ``llama-106m``: a Llama-architecture config of 106.46 M parameters: 12 layers, hidden 768, 12 heads
  (key/value dim 768), intermediate 2048, vocabulary 28 000, tied embeddings
  (21.50 M embedding + 84.95 M in the blocks). Embeddings are not LoRA targets and are not built.

Per operator: median wall time to produce one child from two parents (crossovers) or one parent
(mutations). PEFT's ``add_weighted_adapter`` (svd, linear, ties) merges the same two parents into a new
adapter; its svd merge is given ``svd_full_matrices=False`` (faster than PEFT's default) and, to keep
the run short, is timed on one layer and scaled to all layers (``--svd-layers`` changes that). ``populora``'s
operators mutate a slot of its ``Population`` in place (no copy of the result), ours return a new genome.
The ΔW-space comparison is PEFT svd (dense ΔW, dense SVD) against our ``interpolate`` at weight 0.5
(the same two-adapter ΔW merge to rank 16, done low-rank). The parents are independent, so our ΔW-space
crossovers decompose them from their Gram matrices; ``ours_interpolate_near_clone_ms`` also times
``interpolate`` of a parent and a near-clone of it (1e-3 noise), which takes the Householder path.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from typing import Any

import torch
import tyro
from torch import nn

from evolve import operators
from evolve.genome import lora_pairs

RANK = 16
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# our operator -> populora's closest operator (None: no counterpart)
POPULORA_NAMES = {
    "svd_spectrum": "svd_structured",
    "layer_gaussian": "layer_selective_gaussian",
    "component_mask": "component_masking",
    "gaussian": "full_gaussian",
    "neftune_a": "neftune_style",
    "dare": "dare",
    "uniform": "layer_wise",
    "svd_splice": "svd_subspace",
    "extrapolate": "extrapolative",
    "es": "xes",
    "clone_mutate": "clone + full_gaussian",
    "interpolate": None,
}


# where the paired operators do not do the same thing, said plainly
POPULORA_NOTES = {
    "mutations": "populora mutates a population slot in place; ours return a new genome (includes the copy)",
    "uniform": "populora layer_wise: one parent per LoRA target, A and B together (same as ours)",
    "extrapolate": "populora lerps A and B separately (factor space); ours works on dW and re-projects to rank r",
    "es": "populora xes: z-scored fitness over the good parents plus tournament-picked bad ones, factor space; "
    "ours: centred-rank weights over the given parents, on dW re-projected to rank r",
    "clone_mutate": "ours copies the better parent and applies a gaussian mutation; populora's clone only "
    "copies, so it is timed as clone followed by its full_gaussian mutation of the child (the same work)",
    "interpolate": "no counterpart (populora 'average' is a factor-space mean, not a dW interpolation)",
}


@dataclass(frozen=True)
class Shape:
    """A transformer's LoRA-relevant dimensions."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int


SHAPES = (Shape("qwen2.5-0.5b", 24, 896, 4864, 128), Shape("llama-106m", 12, 768, 2048, 768))


@dataclass(frozen=True)
class Args:
    """Benchmark settings."""

    repeats: int = 5
    """Timed runs per operator of ours (after one warm-up)."""
    peer_repeats: int = 3
    """Timed runs per populora operator and PEFT linear/ties merge."""
    svd_repeats: int = 1
    """Timed runs of PEFT's svd merge (slow)."""
    svd_layers: int = 1
    """Layers PEFT's svd merge is timed on (its cost is additive over layers; scaled to the full model)."""
    threads: int = 1
    """torch intra-op threads, for every contender; also the worker threads our ΔW-space operators run
    module groups on (``evolve.genome.run_parallel``). 0 keeps torch's default. One thread by default:
    on a shared machine a second OpenMP thread that has to wait for a busy core makes LAPACK 5-10x
    slower (measured here)."""
    seed: int = 0
    """Seed of the parent genomes and operator generators."""

    def __post_init__(self) -> None:
        for name in ("repeats", "peer_repeats", "svd_repeats", "svd_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise ValueError(f"threads: must be >= 0, got {self.threads}")


def log(message: str) -> None:
    print(f"[bench/operators] {message}", file=sys.stderr, flush=True)


def linear_dims(shape: Shape) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) per projection."""
    h, i, kv = shape.hidden, shape.intermediate, shape.kv_dim
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


class Blocks(nn.Module):
    """``model.layers.{i}.self_attn.*_proj`` / ``model.layers.{i}.mlp.*_proj``: HF module names, no compute."""

    def __init__(self, shape: Shape, dtype: torch.dtype) -> None:
        super().__init__()
        dims = linear_dims(shape)
        layers = nn.ModuleList()
        for _ in range(shape.layers):
            layer = nn.Module()
            layer.self_attn, layer.mlp = nn.Module(), nn.Module()
            for name, (fin, fout) in dims.items():
                parent = layer.mlp if name in ("gate_proj", "up_proj", "down_proj") else layer.self_attn
                setattr(parent, name, nn.Linear(fin, fout, bias=False, device="meta", dtype=dtype))
            layers.append(layer)
        self.model = nn.Module()
        self.model.layers = layers


@dataclass(frozen=True)
class Timing:
    """Median milliseconds of one measured call: wall clock and this process's CPU time.

    With one torch thread the CPU time is the work done, which other jobs on a shared machine inflate far
    less than the wall time; both are reported.
    """

    wall_ms: float
    cpu_ms: float


def timed(fn: Callable[[], object], repeats: int, warmup: bool = True) -> Timing:
    """Median wall and CPU time of ``fn``."""
    if warmup:
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append((time.process_time() - cpu) * 1e3)
        walls.append((time.perf_counter() - wall) * 1e3)
    return Timing(round(statistics.median(walls), 2), round(statistics.median(cpus), 2))


def random_parents(
    keys: list[str], template: dict[str, torch.Tensor], seed: int
) -> list[dict[str, torch.Tensor]]:
    """Two adapters with trained-like scales: ``A`` as PEFT's init (U(±1/√in)), ``B`` small and non-zero."""
    parents = []
    for index in range(2):
        g = torch.Generator().manual_seed(seed + index)
        genome = {}
        for key in keys:
            shape = template[key].shape
            if ".lora_A." in key:
                bound = shape[1] ** -0.5
                genome[key] = torch.rand(shape, generator=g) * (2 * bound) - bound
            else:
                genome[key] = torch.randn(shape, generator=g) * 0.01
        parents.append(genome)
    return parents


def bench_ours(parents, args: Args) -> dict[str, Timing]:
    results = {}
    for name, mutation in operators.MUTATIONS.items():
        rng = torch.Generator().manual_seed(args.seed)
        results[name] = timed(partial(mutation, parents[0], rng=rng, strength=0.1), args.repeats)
    for name, crossover in operators.CROSSOVERS.items():
        rng = torch.Generator().manual_seed(args.seed)
        kwargs = {"weight": 0.5} if name == "interpolate" else {}
        results[name] = timed(
            partial(crossover, parents, rng=rng, fitness=[1.0, 0.0], **kwargs), args.repeats
        )
    return results


def near_clone(genome: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """``genome`` plus Gaussian noise of 1e-3 of each tensor's spread: the stacked factors of a parent and
    this clone are too ill-conditioned for the Gram path (``evolve.lowrank.GRAM_MAX_CONDITION``), so
    ``interpolate`` on the pair times the Householder path, after the refused Gram check."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + 1e-3 * v.std() * torch.randn(v.shape, generator=g) for k, v in genome.items()}


def peft_model(shape: Shape, seed: int):
    """A PEFT model over ``Blocks`` with two random adapters ``p0``, ``p1``; returns it and the parents."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    base = Blocks(shape, torch.bfloat16).to_empty(device="cpu")  # base weights are never read by a merge
    config = LoraConfig(r=RANK, lora_alpha=RANK, target_modules=list(PROJECTIONS))
    model = get_peft_model(base, config, adapter_name="p0")
    model.add_adapter("p1", config)
    template = get_peft_model_state_dict(model, adapter_name="p0")
    parents = random_parents(list(template), template, seed)
    for name, genome in zip(("p0", "p1"), parents, strict=True):
        result = set_peft_model_state_dict(model, genome, adapter_name=name)
        assert not result.unexpected_keys, result.unexpected_keys
    return model, parents


def time_peft_merge(model, combination: str, repeats: int) -> Timing:
    """Median time of ``add_weighted_adapter`` merging ``p0`` and ``p1`` 50/50 into a new adapter."""
    kwargs: dict[str, object] = {}
    if combination == "svd":
        kwargs = {"svd_rank": RANK, "svd_full_matrices": False}
    elif combination == "ties":
        kwargs = {"density": 0.5}

    def merge() -> None:
        model.add_weighted_adapter(["p0", "p1"], [0.5, 0.5], "child", combination_type=combination, **kwargs)
        model.delete_adapter("child")  # inside the timing: a small cost next to the merge itself

    return timed(merge, repeats, warmup=False)


def bench_peft(shape: Shape, args: Args) -> tuple[dict[str, Timing], list[dict[str, torch.Tensor]]]:
    """PEFT merges, plus the parents (keys and shapes from PEFT's own state dict).

    The svd merge is timed on the first ``args.svd_layers`` layers and scaled by ``layers / svd_layers``:
    ``add_weighted_adapter`` handles each module independently (one dense ΔW and one dense SVD each), so
    the cost is additive over layers (the JSON records how many layers were measured).
    """
    model, parents = peft_model(shape, args.seed)
    results: dict[str, Timing] = {}
    for combination in ("linear", "ties"):
        results[combination] = time_peft_merge(model, combination, args.peer_repeats)
        log(f"{shape.name}: peft {combination} {results[combination]}")
    del model
    layers = min(args.svd_layers, shape.layers)
    small, _ = peft_model(
        Shape(shape.name, layers, shape.hidden, shape.intermediate, shape.kv_dim), args.seed
    )
    measured = time_peft_merge(small, "svd", args.svd_repeats)
    scale = shape.layers / layers
    results["svd"] = Timing(round(measured.wall_ms * scale, 2), round(measured.cpu_ms * scale, 2))
    log(f"{shape.name}: peft svd {measured} on {layers} layer(s), scaled {results['svd']}")
    return results, parents


def bench_populora(shape: Shape, parents, args: Args) -> dict[str, Timing | None] | str:
    try:
        from populora import Population
    except Exception as error:  # an absent or broken peer is reported, not hidden
        return f"not measured: {type(error).__name__}: {error}"
    torch.manual_seed(args.seed)  # populora draws from torch's global generator
    blocks = Blocks(shape, torch.float32)
    for module in blocks.modules():
        if isinstance(module, nn.Linear):
            module.register_parameter("weight", None)  # populora reads in/out features only: no base weights
    population = Population(blocks, pop_size=4, low_rank=RANK)
    for pair in lora_pairs(parents[0]):
        key = pair.module.removeprefix("base_model.model.").replace(".", "_")
        for slot, genome in enumerate(parents):
            population.weight_down[key].data[slot] = genome[pair.a_key].T
            population.weight_up[key].data[slot] = genome[pair.b_key]
    fitnesses = torch.tensor([1.0, 0.0, 0.5, 0.2])
    parent_indices, child_indices = torch.tensor([[0, 1]]), torch.tensor([2])
    results: dict[str, Timing | None] = {}
    for ours, theirs in POPULORA_NAMES.items():
        if theirs is None:
            results[ours] = None
            continue
        if ours == "clone_mutate":
            fn = partial(_clone_then_mutate, population, parent_indices, child_indices, fitnesses)
        elif ours in operators.MUTATIONS:
            kwargs = {} if ours in ("component_mask", "neftune_a") else {"epsilon": 0.1}
            fn = partial(population.mutate_, theirs, individual=2, **kwargs)
        else:
            fn = partial(population.crossover_, theirs, parent_indices, child_indices, fitnesses=fitnesses)
        results[ours] = timed(fn, args.peer_repeats)
    return results


def _clone_then_mutate(population, parent_indices, child_indices, fitnesses) -> None:
    """populora's counterpart of our ``clone_mutate``: its clone crossover, then its gaussian mutation."""
    population.crossover_("clone", parent_indices, child_indices, fitnesses=fitnesses)
    population.mutate_("full_gaussian", individual=int(child_indices[0]), epsilon=0.1)


def _figures(timings: Mapping[str, Timing | None] | str, field: str) -> dict[str, float | None] | str:
    if isinstance(timings, str):
        return timings
    return {name: None if t is None else getattr(t, field) for name, t in timings.items()}


def main(args: Args) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "bench": "operators",
        "rank": RANK,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg_1min_before": round(os.getloadavg()[0], 2),
        "versions": {},
        "shapes": {},
        "ours_ms": {},
        "ours_cpu_ms": {},
        "ours_interpolate_near_clone_ms": {},
        "ours_interpolate_near_clone_cpu_ms": {},
        "peft_ms": {},
        "peft_cpu_ms": {},
        "peft_svd_measured_layers": args.svd_layers,
        "peft_svd_full_matrices": False,
        "populora_ms": {},
        "populora_cpu_ms": {},
        "populora_pairs": POPULORA_NAMES,
        "populora_notes": POPULORA_NOTES,
        "ratios": {},
    }
    for package in ("peft", "populora"):
        try:
            report["versions"][package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            report["versions"][package] = None
    started = time.perf_counter()
    for shape in SHAPES:
        peft, parents = bench_peft(shape, args)
        report["shapes"][shape.name] = {
            "layers": shape.layers,
            "hidden": shape.hidden,
            "intermediate": shape.intermediate,
            "kv_dim": shape.kv_dim,
            "lora_modules": len(lora_pairs(parents[0])),
            "lora_params": sum(t.numel() for t in parents[0].values()),
        }
        ours = bench_ours(parents, args)
        log(f"{shape.name}: ours {ours}")
        clone_pair = [parents[0], near_clone(parents[0], args.seed + 7)]
        clone = timed(
            partial(operators.CROSSOVERS["interpolate"], clone_pair, rng=torch.Generator(), weight=0.5),
            args.repeats,
        )
        log(f"{shape.name}: ours, interpolate of a parent and its near-clone {clone}")
        report["ours_interpolate_near_clone_ms"][shape.name] = clone.wall_ms
        report["ours_interpolate_near_clone_cpu_ms"][shape.name] = clone.cpu_ms
        theirs = bench_populora(shape, parents, args)
        log(f"{shape.name}: populora {theirs}")
        for field, suffix in (("wall_ms", "ms"), ("cpu_ms", "cpu_ms")):
            report[f"ours_{suffix}"][shape.name] = _figures(ours, field)
            report[f"peft_{suffix}"][shape.name] = _figures(peft, field)
            report[f"populora_{suffix}"][shape.name] = _figures(theirs, field)
        interpolate = ours["interpolate"]
        comparable = {} if isinstance(theirs, str) else {k: t for k, t in theirs.items() if t is not None}
        report["ratios"][shape.name] = {
            "peft_svd_over_ours_interpolate_wall": round(peft["svd"].wall_ms / interpolate.wall_ms, 1),
            "peft_svd_over_ours_interpolate_cpu": round(peft["svd"].cpu_ms / interpolate.cpu_ms, 1),
            "peft_linear_over_ours_interpolate_wall": round(peft["linear"].wall_ms / interpolate.wall_ms, 2),
            "peft_ties_over_ours_interpolate_wall": round(peft["ties"].wall_ms / interpolate.wall_ms, 2),
            "ours_over_populora_wall": {
                k: round(ours[k].wall_ms / t.wall_ms, 2) for k, t in comparable.items()
            },
            "ours_over_populora_cpu": {k: round(ours[k].cpu_ms / t.cpu_ms, 2) for k, t in comparable.items()},
            "ours_max_wall_ms": max(t.wall_ms for t in ours.values()),
            "ours_max_cpu_ms": max(t.cpu_ms for t in ours.values()),
        }
    qwen = report["ratios"]["qwen2.5-0.5b"]
    report["targets"] = {
        "qwen_le_100ms_every_operator_wall": qwen["ours_max_wall_ms"] <= 100,
        "qwen_le_100ms_every_operator_cpu": qwen["ours_max_cpu_ms"] <= 100,
        "qwen_ge_100x_peft_svd_wall": qwen["peft_svd_over_ours_interpolate_wall"] >= 100,
        "qwen_not_slower_than_populora_wall": {k: r <= 1 for k, r in qwen["ours_over_populora_wall"].items()},
    }
    report["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    report["total_s"] = round(time.perf_counter() - started, 1)
    return report


if __name__ == "__main__":
    print(json.dumps(main(tyro.cli(Args))))
