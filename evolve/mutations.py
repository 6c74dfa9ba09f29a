"""Mutation operators: pure functions ``(genome, *, rng, strength) -> genome`` over LoRA or plain genomes.

Each operator says the space it works in. *Factor space* edits ``A`` and ``B`` (or plain parameters)
directly; *ΔW space* edits the adapter's product ``ΔW = B A`` through its low-rank SVD
(``evolve.lowrank``), which does not depend on the arbitrary gauge ``B A = (B M)(M⁻¹ A)`` and returns the
balanced gauge ``B = U √S``, ``A = √S Vᵀ``. Every operator returns a new genome with the input's keys (in
order), shapes and dtypes (LoRA ranks included), computes in float32 (float64 stays float64), never
modifies its input, and takes all randomness from ``rng``. Tensors an operator does not act on (integer
buffers; non-LoRA entries of a LoRA genome) are copied unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from evolve.genome import (
    Genome,
    PairBatch,
    check_finite,
    check_strength,
    compute_dtype,
    copy_others,
    detached,
    lora_keys,
    lora_pairs,
    module_groups,
    ordered_like,
    overflowing_child,
    pair_batches,
    require_lora,
    rows,
    run_parallel,
    stack_factors,
    store_factors,
)
from evolve.lowrank import adapter_svd, row_scale, to_factors

Noise = tuple[torch.Tensor, ...]
"""Random draws for a batch of ``G`` modules, each tensor with leading dim ``G``."""
Draw = Callable[[int, int, torch.Tensor], Noise]
"""``(G, rank, like) -> noise``: all of an edit's randomness for one batch (``like`` gives dtype and device)."""
FactorEdit = Callable[[torch.Tensor, torch.Tensor, Noise], tuple[torch.Tensor, torch.Tensor]]
"""``(b (G, out, r), a (G, r, in), noise) -> (b, a)``."""


def _normal(shape: tuple[int, ...], rng: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(shape, generator=rng, device=rng.device, dtype=like.dtype).to(like.device)


def _uniform(shape: tuple[int, ...], rng: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.rand(shape, generator=rng, device=rng.device, dtype=like.dtype).to(like.device)


def _edit_lora(genome: Genome, operator: str, draw: Draw, edit: FactorEdit) -> Genome:
    """Apply ``edit`` to every same-shape batch of LoRA pairs; the batches may run on parallel threads
    (``evolve.genome.run_parallel``). ``draw`` runs here first, batch by batch in order, so the random
    stream does not depend on the threads. Whole batches, not the crossovers' smaller units: on the
    Qwen2.5-0.5B shape units of 16 pairs cost one thread ~20% here in page faults (glibc's heap
    trimming), and its four batches already keep two cores busy."""
    pairs = require_lora(genome, operator)
    child = copy_others(genome, lora_keys(pairs))
    device = genome[pairs[0].a_key].device
    units: list[tuple[PairBatch, Noise]] = []
    for batch in pair_batches(genome, pairs):
        noise = draw(len(batch.pairs), batch.a_shape[0], torch.empty(0, dtype=batch.dtype, device=device))
        units.append((batch, noise))

    def work(unit: tuple[PairBatch, Noise]) -> None:
        batch, noise = unit
        b, a = stack_factors([genome], batch)
        store_factors(child, batch, *edit(b, a, noise), like=genome)

    run_parallel(work, units, [rows(batch) for batch, _ in units], device)
    return ordered_like(child, genome)


def _with_noise(tensor: torch.Tensor, strength: float, rng: torch.Generator) -> torch.Tensor:
    """``tensor + strength * std(tensor) * N(0, 1)``; a tensor with zero spread is returned as a copy."""
    work = tensor.to(compute_dtype(tensor.dtype))
    std = float(work.std(correction=0)) if work.numel() > 1 else 0.0
    if std == 0.0 or strength == 0.0:
        return tensor.clone()
    noisy = _normal(tuple(work.shape), rng, work).mul_(strength * std).add_(work)
    return noisy.to(tensor.dtype)


def _rotation(noise: torch.Tensor, angle: float) -> torch.Tensor:
    """Random rotations ``exp(angle K)``, ``K`` skew-symmetric with entries of std ``1/√r``, from standard
    normal ``noise (G, r, r)``: ``(G, r, r)``.

    The exponential of a skew-symmetric matrix is exactly orthogonal, so rotated singular bases stay
    orthonormal (a first-order ``I + angle K`` would not); with this scaling ``‖(R - I) U‖_F / ‖U‖_F ≈ angle``.
    """
    skew = (noise - noise.mT) / math.sqrt(2 * noise.shape[-1])
    return torch.linalg.matrix_exp(angle * skew)


@detached
def svd_spectrum(genome: Genome, *, rng: torch.Generator, strength: float = 0.1) -> Genome:
    """SVD-spectrum perturbation with a small rotation of the singular bases (ΔW space, LoRA only).

    Per module, ``ΔW = U S Vᵀ`` becomes ``(U R_U) S' (V R_V)ᵀ`` with ``S' = S exp(strength z)``,
    ``z ~ N(0, 1)`` (log-normal, so singular values stay non-negative and scale-free), and ``R_U``, ``R_V``
    independent random rotations of angle about ``strength`` within the adapter's row/column spaces.

    Args:
        genome: A LoRA genome.
        rng: Source of all randomness.
        strength: Log-scale of the spectrum noise and rotation angle.

    Raises:
        ValueError: A plain genome, a negative strength, or one so large that a scaled singular value
            overflows.
    """
    strength = check_strength(strength)

    def draw(count: int, rank: int, like: torch.Tensor) -> Noise:  # spectrum, then the two rotations
        return tuple(_normal(shape, rng, like) for shape in [(count, rank), *[(count, rank, rank)] * 2])

    def edit(b: torch.Tensor, a: torch.Tensor, noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
        spectrum, rotate_u, rotate_v = noise
        svd, u, s, v = adapter_svd(b, a)
        k = svd.s.shape[-1]  # components that exist (< rank when the rank exceeds min(in, out))
        s = s * torch.exp(strength * spectrum)
        if not bool(torch.isfinite(s).all()):
            raise ValueError(
                f"svd_spectrum: strength {strength:g} scales a singular value past the float range "
                "(exp(strength * z) with z ~ N(0, 1) overflows); strengths are log-scales, a few units at most"
            )
        if k == u.shape[-1]:
            u = u @ _rotation(rotate_u, strength)
            v = v @ _rotation(rotate_v, strength)
        else:  # rotate within the components that exist: the padded ones are not orthonormal to them
            u = torch.cat([u[..., :k] @ _rotation(rotate_u[..., :k, :k], strength), u[..., k:]], dim=-1)
            v = torch.cat([v[..., :k] @ _rotation(rotate_v[..., :k, :k], strength), v[..., k:]], dim=-1)
        return to_factors(svd, u, s, v, row_scale(a))

    return _edit_lora(genome, "svd_spectrum", draw, edit)


@detached
def component_mask(genome: Genome, *, rng: torch.Generator, strength: float = 0.1) -> Genome:
    """Singular-component masking (ΔW space, LoRA only): drop each rank-1 component of ``ΔW`` with
    probability ``strength``.

    A dropped component's column of ``B`` is zeroed while its row of ``A`` is kept, so ``ΔW`` loses the
    component but gradient descent can grow it back (both zero would be a dead direction).

    Args:
        genome: A LoRA genome.
        rng: Source of all randomness.
        strength: Drop probability per component, in ``[0, 1]``.

    Raises:
        ValueError: A plain genome, or a strength outside ``[0, 1]``.
    """
    strength = check_strength(strength)
    if strength > 1:
        raise ValueError(f"strength: a drop probability must be <= 1, got {strength}")

    def draw(count: int, rank: int, like: torch.Tensor) -> Noise:
        return ((_uniform((count, rank), rng, like) >= strength).to(like.dtype),)

    def edit(b: torch.Tensor, a: torch.Tensor, noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
        svd, u, s, v = adapter_svd(b, a)
        return to_factors(svd, u, s, v, row_scale(a), b_keep=noise[0])

    return _edit_lora(genome, "component_mask", draw, edit)


@detached
def gaussian(genome: Genome, *, rng: torch.Generator, strength: float = 0.1) -> Genome:
    """Full Gaussian noise scaled to each tensor's spread (factor / parameter space; LoRA or plain).

    Every floating tensor the operator acts on (all LoRA factors, or all floating parameters of a plain
    genome) gets ``strength * std(tensor) * N(0, 1)`` noise. A zero-spread tensor (a fresh adapter's
    ``B = 0``, a zero bias) has no scale to borrow and is left unchanged. On LoRA factors the change of
    ``ΔW`` is ``δB A + B δA + δB δA``, not isotropic in ΔW space.

    Raises:
        ValueError: A negative strength.
    """
    strength = check_strength(strength)
    pairs = lora_pairs(genome)
    targets = lora_keys(pairs) if pairs else {k for k, t in genome.items() if t.is_floating_point()}
    return {k: _with_noise(t, strength, rng) if k in targets else t.clone() for k, t in genome.items()}


@detached
def layer_gaussian(
    genome: Genome, *, rng: torch.Generator, strength: float = 0.1, fraction: float = 0.25
) -> Genome:
    """Layer-selective Gaussian noise (factor / parameter space; LoRA or plain).

    Picks ``max(1, round(fraction * modules))`` modules uniformly without replacement (a LoRA module's
    ``A`` and ``B`` together; a plain module's ``weight`` and ``bias`` together) and adds
    ``strength * std(tensor) * N(0, 1)`` noise to their tensors only, as ``gaussian`` does.

    Raises:
        ValueError: A negative strength, or a fraction outside ``(0, 1]``.
    """
    strength = check_strength(strength)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: must be in (0, 1], got {fraction}")
    groups = module_groups(genome, lora_pairs(genome))
    count = min(len(groups), max(1, round(fraction * len(groups))))
    chosen = sorted(torch.randperm(len(groups), generator=rng, device=rng.device)[:count].tolist())
    child = {key: tensor.clone() for key, tensor in genome.items()}
    for index in chosen:
        for key in groups[index]:
            child[key] = _with_noise(genome[key], strength, rng)
    return child


@detached(checks_its_child=True)
def neftune_a(genome: Genome, *, rng: torch.Generator, strength: float = 0.1) -> Genome:
    """NEFTune-style uniform noise on ``A`` only (factor space, LoRA only).

    NEFTune (Jain et al. 2023, arXiv 2310.05914, Alg. 1) adds ``U(-1, 1) * α / √(numel)`` noise to input
    embeddings. Here the "input" side of an adapter is ``A``: it gets ``U(-1, 1) * α / √(r * in)`` with
    ``α = √3 * strength * ‖A‖_F``, i.e. noise of RMS ``strength`` times ``A``'s RMS. ``B`` is untouched, so
    ``ΔW`` moves by ``B δA`` (nothing for a fresh adapter with ``B = 0``).

    Raises:
        ValueError: A plain genome, a negative strength, or one so large that ``A`` overflows.
    """
    strength = check_strength(strength)
    pairs = require_lora(genome, "neftune_a")
    noisy = {pair.a_key for pair in pairs}
    child = {key: tensor if key in noisy else tensor.clone() for key, tensor in genome.items()}  # A: below
    for pair in pairs:
        a = genome[pair.a_key].to(compute_dtype(genome[pair.a_key].dtype))
        # RMS from per-row norms, then the sum of their r squares: torch splits a reduction with several
        # outputs over its outputs, each reduced by one thread in one order, so this is the same at every
        # thread count, which a.square().mean() is not (its one output's sum is split over the threads: the
        # last bit moved between 1 and 2 threads); var_mean is too, but 7x slower here
        rows = torch.linalg.vector_norm(a, dim=-1)
        bound = math.sqrt(3) * strength * math.sqrt(float(rows.square().sum()) / a.numel())
        if not bound <= torch.finfo(a.dtype).max:  # uniform_ would refuse the range naming nothing
            raise ValueError(
                f"neftune_a: strength {strength:g} gives noise past the range of {a.dtype} at key {pair.a_key!r}"
            )
        noise = torch.empty(a.shape, dtype=a.dtype, device=rng.device)
        noise.uniform_(-bound, bound, generator=rng)  # drawn in the range: no passes to scale and shift
        child[pair.a_key] = noise.to(a.device).add_(a).to(genome[pair.a_key].dtype)
    # B and the other entries are copies of the checked genome; only the noisy A can overflow
    check_finite({key: child[key] for key in noisy}, overflowing_child("neftune_a"))
    return child
