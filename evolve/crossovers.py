"""Crossover operators: pure functions ``(parents, *, rng, fitness=None) -> genome``.

``fitness`` holds one value per parent, higher is better. Each operator says the space it works in:
*factor space* combines ``A`` and ``B`` (or plain parameters) entry-wise, which for LoRA is **not** a
combination of the adapters' ``ΔW`` (``B A = (B M)(M⁻¹ A)``: factors of unrelated parents live in
unrelated gauges, and products of averaged factors carry cross terms ``B_i A_j``); *module space* picks
whole modules; *ΔW space* combines the products ``ΔW_i = B_i A_i`` exactly and re-projects to the parents'
rank with ``evolve.lowrank`` (best rank-r approximation, returned in the balanced gauge). On a plain genome
the ΔW-space operators combine the parameters themselves.

Every operator checks that parents share keys, shapes and dtypes (``ValueError`` naming the key), returns
a new genome with those keys (in order), shapes and dtypes, computes in float32 (float64 stays float64),
never modifies its inputs, and takes all randomness from ``rng``. Tensors an operator does not mix
(integer buffers; non-LoRA entries of a LoRA genome) are copied from the first parent, whatever the
fitness (``clone_mutate`` copies the parent it clones); trained adapter parts besides the factors (PEFT's
``lora_bias=True``, DoRA's magnitudes) are refused by name (``evolve.genome.lora_pairs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evolve import lowrank
from evolve.genome import (
    CHUNK_PAIRS,
    Genome,
    LoraPair,
    PairBatch,
    check_finite,
    check_fitness,
    check_parents,
    check_strength,
    chunks,
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
    within_range,
)

Fitness = Sequence[float] | torch.Tensor | None


def _mixed_keys(genome: Genome, pairs: Sequence[LoraPair]) -> set[str]:
    """Keys a crossover mixes: the LoRA factors of a LoRA genome, else every floating tensor."""
    return lora_keys(pairs) if pairs else {k for k, t in genome.items() if t.is_floating_point()}


def _best_first(count: int, fitness: list[float] | None) -> list[int]:
    """Parent indices ordered by descending fitness (stable); input order when there is no fitness."""
    if fitness is None:
        return list(range(count))
    return sorted(range(count), key=lambda i: -fitness[i])


def _concatenate(
    terms: list[tuple[float, Genome]], batch: PairBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(b_cat (G, m, R), a_cat (G, R, n), weights (R,))`` with ``Σ c_i B_i A_i = b_cat diag(weights) a_cat``
    for a batch, copied straight from the genomes in their own row-major layout (a transposing copy of
    ``B`` took twice as long); the weights stay out of the copies (``lowrank.reproject_concatenated``
    applies them to its small matrices)."""
    (out_features, rank), in_features = batch.b_shape, batch.a_shape[1]
    count, device = len(batch.pairs), terms[0][1][batch.pairs[0].a_key].device
    b_cat = torch.empty(count, out_features, len(terms) * rank, dtype=batch.dtype, device=device)
    for j, pair in enumerate(batch.pairs):
        for i, (_, parent) in enumerate(terms):
            b_cat[j, :, i * rank : (i + 1) * rank].copy_(parent[pair.b_key])
    # the A rows need no transpose: one concatenation in (module, term) order is the whole batch
    a_rows = torch.cat([parent[pair.a_key] for pair in batch.pairs for _, parent in terms])
    weights = torch.tensor([c for c, _ in terms], dtype=batch.dtype, device=device).repeat_interleave(rank)
    return b_cat, a_rows.to(batch.dtype).view(count, len(terms) * rank, in_features), weights


def linear_combination(
    parents: Sequence[Genome], coeffs: Sequence[float], name: str = "linear_combination"
) -> Genome:
    """``Σ_i coeffs[i] * parent_i`` in ΔW space (LoRA, re-projected to rank r) or parameter space (plain).

    The building block of ``extrapolate``, ``es`` and ``interpolate`` (``detached(checks_its_child=True,
    checks_its_parents=True)``); ``check_parents`` must have passed. Checks the finiteness of what it
    does not decompose itself (``ValueError`` naming the parent or, as ``name``'s child, the key): entries
    outside the LoRA pairs, parents with a zero coefficient, a plain genome's child; the child's factors
    one batch at a time (``within_range``, then ``check_finite`` on that batch only where it fails). A
    non-finite LoRA factor of a parent fails the decomposition (``lowrank.ProductOverflow``: the Gram
    matrices and triangular factors it is checked on carry every entry's NaN or infinity). That skips
    two passes over the parents and 336 small sums over a Qwen2.5-0.5B-shaped child (~10 ms of ~80 at
    one thread).
    """
    first = parents[0]
    pairs = lora_pairs(first)
    mixed = _mixed_keys(first, pairs)
    child = copy_others(first, mixed)
    terms = [(c, p) for c, p in zip(coeffs, parents, strict=True) if c != 0] or [(0.0, first)]
    decomposed = {id(p) for _, p in terms} if pairs else set()
    factors = lora_keys(pairs)
    for index, parent in enumerate(parents):
        unseen = (
            parent if id(parent) not in decomposed else {k: v for k, v in parent.items() if k not in factors}
        )
        check_finite(unseen, f"parent {index}")
    if pairs:

        def combine(batch: PairBatch) -> None:
            b_cat, a_cat, weights = _concatenate(terms, batch)
            b, a = lowrank.reproject_concatenated(b_cat, a_cat, batch.a_shape[0], weights)
            store_factors(child, batch, b, a, like=first)
            like = first[batch.pairs[0].b_key].dtype, first[batch.pairs[0].a_key].dtype
            if not (within_range(b, like[0]) and within_range(a, like[1])):
                keys = [key for pair in batch.pairs for key in (pair.a_key, pair.b_key)]
                check_finite({key: child[key] for key in keys}, overflowing_child(name))

        units = [unit for batch in pair_batches(first, pairs) for unit in chunks(batch)]
        run_parallel(combine, units, [rows(unit) for unit in units], first[pairs[0].a_key].device)
    else:
        for key in mixed:
            dtype = compute_dtype(first[key].dtype)
            total = sum(c * p[key].to(dtype) for c, p in zip(coeffs, parents, strict=True))
            child[key] = torch.as_tensor(total, dtype=dtype).to(first[key].dtype)
    check_finite({k: v for k, v in child.items() if k not in factors}, overflowing_child(name))
    return ordered_like(child, first)


@detached
def dare(
    parents: Sequence[Genome],
    *,
    rng: torch.Generator,
    fitness: Fitness = None,
    drop: float = 0.5,
    base: Genome | None = None,
) -> Genome:
    """DARE-style drop-and-rescale, then average (factor / parameter space; LoRA or plain).

    DARE (Yu et al. 2023, arXiv 2311.03099, Eq. 2) treats each model as ``base + δ_i``, drops each entry
    of ``δ_i`` with probability ``drop`` and rescales the survivors by ``1 / (1 - drop)``; the merge here
    averages the sparsified deltas: ``child = base + mean_i(m_i ⊙ δ_i) / (1 - drop)``. ``base`` defaults to
    the parents' entry-wise mean (no common ancestor is known to a pure operator); pass the common
    ancestor when there is one. For LoRA this acts on ``A`` and ``B`` separately: meaningful for parents
    that share a gauge (e.g. descendants of one adapter), not a ΔW merge.

    The drops are decided by 15-bit random integers, so ``drop`` takes effect rounded to a multiple of
    ``2⁻¹⁵`` (0.5, 0.25, ... exactly) and the rescale uses the rounded value, keeping the merge unbiased.

    Args:
        parents: One or more genomes.
        rng: Source of all randomness.
        fitness: Unused (accepted for the common signature).
        drop: Drop probability in ``[0, 1)``.
        base: Optional reference genome with the parents' keys, shapes and dtypes.

    Raises:
        ValueError: Mismatched parents or base, or ``drop`` outside ``[0, 1)``.
    """
    check_parents(parents)
    if base is not None:
        check_parents([parents[0], base], names=["parent 0", "base"])
    check_fitness(fitness, len(parents))
    if not 0 <= drop < 1:
        raise ValueError(f"drop: must be in [0, 1), got {drop}")
    first = parents[0]
    mixed = _mixed_keys(first, lora_pairs(first))
    child = copy_others(first, mixed)
    # A draw below the threshold drops its entry: drop probability threshold / levels (see the docstring).
    threshold = min(round(drop * _MASK_LEVELS), _MASK_LEVELS - 1)
    # the mean of the kept deltas, rescaled by the kept fraction
    scale = 1 / (len(parents) * (1 - threshold / _MASK_LEVELS))
    for key in first:
        if key not in mixed:
            continue
        dtype = compute_dtype(first[key].dtype)
        work = [p[key].to(dtype) for p in parents]
        centre = _mean(work) if base is None else base[key].to(dtype)
        draws = _mask_draws(torch.Size((len(work), *centre.shape)), rng).to(centre.device)
        # A float mask (mixed bool-float arithmetic is slow), written by the comparison itself: on CPU
        # 6x faster than comparing to bool and converting (measured on a Qwen2.5-0.5B-shaped B).
        keep = torch.ge(draws, threshold, out=torch.empty(draws.shape, dtype=dtype, device=draws.device))
        merged = torch.addcmul(centre, work[0] - centre, keep[0], value=scale)
        for tensor, kept in zip(work[1:], keep[1:], strict=True):
            merged.addcmul_(tensor - centre, kept, value=scale)
        child[key] = merged.to(first[key].dtype)
    return ordered_like(child, first)


def _mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The entry-wise mean of same-shape tensors, in a new tensor (no ``(n, ...)`` stack)."""
    if len(tensors) == 1:
        return tensors[0].clone()
    total = torch.add(tensors[0], tensors[1])
    for tensor in tensors[2:]:
        total.add_(tensor)
    return total.div_(len(tensors))


_MASK_BITS = 15
_MASK_LEVELS = 1 << _MASK_BITS


def _mask_draws(shape: torch.Size, rng: torch.Generator) -> torch.Tensor:
    """Independent uniform integers in ``[0, 2**15)``, one per entry of ``shape`` (int16, on ``rng``'s device).

    Four draws come from each 64-bit word of the generator (its low 15 bits of each 16-bit lane; an int64
    ``random_`` leaves the top bit zero): a quarter of the generator calls of ``torch.rand``, which draws
    one 24-bit float per entry and is most of DARE's cost on a LoRA genome.
    """
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=rng.device).random_(generator=rng)
    return words.view(torch.int16)[:count].bitwise_and_(_MASK_LEVELS - 1).view(shape)


@detached
def uniform(parents: Sequence[Genome], *, rng: torch.Generator, fitness: Fitness = None) -> Genome:
    """Module-wise uniform crossover (module space; LoRA or plain).

    Each module comes whole from one parent drawn uniformly: a LoRA module's ``A`` and ``B`` together (so
    its ``ΔW`` is exactly that parent's), a plain module's ``weight`` and ``bias`` together.

    Raises:
        ValueError: Mismatched parents.
    """
    check_parents(parents)
    check_fitness(fitness, len(parents))
    first = parents[0]
    pairs = lora_pairs(first)
    groups = module_groups(first, pairs)
    child = copy_others(first, {key for group in groups for key in group})
    choice = torch.randint(len(parents), (len(groups),), generator=rng, device=rng.device).tolist()
    for group, index in zip(groups, choice, strict=True):
        for key in group:
            child[key] = parents[index][key].clone()
    return ordered_like(child, first)


@detached
def svd_splice(parents: Sequence[Genome], *, rng: torch.Generator, fitness: Fitness = None) -> Genome:
    """SVD-subspace splice (ΔW space, LoRA only; exactly two parents).

    Per module, with ``ΔW_1 = Σ_j s_j u_j v_jᵀ`` the SVD of the better parent (the first one without
    fitness) and ``k`` uniform in ``[1, r - 1]``: ``ΔW = P_k(ΔW_1) + (ΔW_2 - P_k(ΔW_2))``, the top ``k``
    components of parent 1 and components ``k+1..r`` of parent 2, where ``P_k`` is the best rank-k
    approximation. The result has rank ``<= r`` and needs no re-projection; a parent spliced with itself
    gives that parent's ``ΔW``. A rank-1 module has no split point: ``k`` is 0 or 1, and the module's
    ``ΔW`` comes whole from one parent, each with probability 1/2.

    Raises:
        ValueError: A plain genome, not exactly two parents, or mismatched parents.
    """
    check_parents(parents, count=2)
    ranked = _best_first(2, check_fitness(fitness, 2))
    top, rest = parents[ranked[0]], parents[ranked[1]]
    first = parents[0]
    pairs = require_lora(first, "svd_splice")
    child = copy_others(first, lora_keys(pairs))
    device = first[pairs[0].a_key].device
    units: list[tuple[PairBatch, torch.Tensor]] = []  # (chunk, its k)
    for batch in pair_batches(first, pairs):  # all draws here, in batch order, before any thread starts
        rank = batch.a_shape[0]
        low, high = (1, rank) if rank > 1 else (0, 2)
        k = torch.randint(low, high, (len(batch.pairs), 1), generator=rng, device=rng.device).to(device)
        units += zip(chunks(batch), k.split(CHUNK_PAIRS), strict=True)

    def splice(unit: tuple[PairBatch, torch.Tensor]) -> None:
        chunk, k = unit
        b, a = stack_factors([top, rest], chunk, column_major=False)  # (2G, ...): both parents in one batch
        from_top = torch.arange(chunk.a_shape[0], device=device) < k  # (G, r)
        keep = torch.cat([from_top, ~from_top]).to(b.dtype)  # top's components < k, rest's from k on
        store_factors(child, chunk, *lowrank.splice(b, a, keep), like=first)

    run_parallel(splice, units, [rows(chunk) for chunk, _ in units], device)
    return ordered_like(child, first)


@detached(checks_its_child=True, checks_its_parents=True)
def extrapolate(
    parents: Sequence[Genome], *, rng: torch.Generator, fitness: Fitness = None, max_step: float = 0.5
) -> Genome:
    """Extrapolation past the better parent (ΔW space for LoRA; parameter space for plain).

    ``child = better + η (better - worse)`` with ``η ~ U(0, max_step)``, one draw per child; for LoRA on
    ``ΔW`` (rank up to 2r), re-projected to rank r. Without fitness the first parent counts as better.

    Raises:
        ValueError: Not exactly two parents, mismatched parents, or a negative ``max_step``.
    """
    check_parents(parents, count=2)
    ranked = _best_first(2, check_fitness(fitness, 2))
    max_step = check_strength(max_step, "max_step")
    eta = max_step * float(torch.rand((), generator=rng, device=rng.device))
    coeffs = [0.0, 0.0]
    coeffs[ranked[0]], coeffs[ranked[1]] = 1 + eta, -eta
    return linear_combination(
        parents, coeffs, "extrapolate"
    )  # in the given order: other entries from the first parent


def centred_ranks(fitness: Sequence[float]) -> list[float]:
    """Fitness shaping by centred ranks in ``[-0.5, 0.5]`` (Salimans et al. 2017, arXiv 1703.03864, §2.2).

    Tied values share their average rank; a single value gets 0.
    """
    count = len(fitness)
    if count == 1:
        return [0.0]
    ranks = [sum(g < f for g in fitness) + (sum(g == f for g in fitness) - 1) / 2 for f in fitness]
    return [r / (count - 1) - 0.5 for r in ranks]


@detached(checks_its_child=True, checks_its_parents=True)
def es(
    parents: Sequence[Genome], *, rng: torch.Generator, fitness: Fitness = None, step: float = 0.5
) -> Genome:
    """Fitness-weighted ES-style combination (ΔW space for LoRA; parameter space for plain).

    An evolution-strategies step from the parents' mean along the rank-weighted fitness direction:
    ``child = mean + step * Σ_i w_i (θ_i - mean)`` with centred ranks ``w_i`` (OpenAI-ES fitness shaping),
    i.e. weights ``1/n + step * w_i`` that sum to one. With two parents and the default step the child is
    ``0.75 * better + 0.25 * worse``. For LoRA on ``ΔW``, re-projected to rank r. ``rng`` is unused: the
    operator is deterministic given fitness.

    Raises:
        ValueError: Missing fitness, mismatched parents, or a negative step.
    """
    check_parents(parents)
    values = check_fitness(fitness, len(parents))
    if values is None:
        raise ValueError("fitness: the es crossover needs one fitness value per parent")
    step = check_strength(step, "step")
    coeffs = [1 / len(parents) + step * w for w in centred_ranks(values)]
    return linear_combination(parents, coeffs, "es")


@detached(checks_its_child=True, checks_its_parents=True)
def interpolate(
    parents: Sequence[Genome], *, rng: torch.Generator, fitness: Fitness = None, weight: float | None = None
) -> Genome:
    """Interpolation in ΔW space re-projected to rank r (LoRA); parameter-space interpolation (plain).

    ``ΔW = (1 - t) ΔW_1 + t ΔW_2`` with ``t = weight`` or, when ``weight`` is None, ``t ~ U(0, 1)``. At
    ``t = 0`` (``1``) the child's ΔW is parent 1's (parent 2's), up to rounding.

    Raises:
        ValueError: Not exactly two parents, mismatched parents, or ``weight`` outside ``[0, 1]``.
    """
    check_parents(parents, count=2)
    check_fitness(fitness, 2)
    if weight is not None and not 0 <= weight <= 1:
        raise ValueError(f"weight: must be in [0, 1], got {weight}")
    t = float(torch.rand((), generator=rng, device=rng.device)) if weight is None else float(weight)
    return linear_combination(parents, [1 - t, t], "interpolate")


@detached
def clone_mutate(
    parents: Sequence[Genome],
    *,
    rng: torch.Generator,
    fitness: Fitness = None,
    mutation: str = "gaussian",
    strength: float = 0.05,
) -> Genome:
    """Clone the best parent (the first without fitness) and mutate it (the mutation's space).

    Args:
        parents: One or more genomes.
        rng: Source of all randomness.
        fitness: Optional, picks the parent to clone.
        mutation: Name in ``evolve.operators.MUTATIONS``.
        strength: The mutation's strength.

    Raises:
        ValueError: Mismatched parents, or what the mutation raises.
        KeyError: An unknown mutation name.
    """
    # Imported here because the registry module imports this one; looking the name up at call time
    # also lets mutations registered by users be used.
    from evolve.operators import MUTATIONS

    check_parents(parents)
    best = _best_first(len(parents), check_fitness(fitness, len(parents)))[0]
    return MUTATIONS[mutation](parents[best], rng=rng, strength=strength)
