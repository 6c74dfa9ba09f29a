"""Low-rank linear algebra for LoRA factors: the SVD of ``B @ A`` and same-rank re-projection, never dense.

``ΔW = B_cat @ A_cat`` with ``B_cat (m, R)`` and ``A_cat (R, n)`` (``R`` = rank times number of terms) is
factored as ``B_cat = Q_b R_b`` and ``A_catᵀ = Q_a R_a`` (Householder QR), so
``ΔW = Q_b (R_b R_aᵀ) Q_aᵀ`` and the SVD of ``ΔW`` is ``(Q_b U_c) S (Q_a V_c)ᵀ`` from the SVD of the small
``R x R`` core ``U_c S V_cᵀ = R_b R_aᵀ``. Cost O((m + n) R²) instead of O(m n min(m, n)) for a dense SVD.
This is the textbook route to the SVD of a matrix given as a product of thin factors (orthogonalise
each factor, decompose the small core; Golub & Van Loan, *Matrix Computations*, 4th ed., chapters on the
QR factorisation and the SVD) and the one DESIGN.md measured against PEFT's dense ``svd`` merge.

Where the concatenated factors are well-conditioned, the crossovers that re-project (``reproject_concatenated``)
or splice (``splice``) take the triangular factors from the column-scaled Gram matrices instead (Cholesky
QR with a condition bound, ``GRAM_MAX_CONDITION``): matrix products in place of ``geqrf``, about a third
off those operators' time; everything else, and every matrix that fails the bound, goes through
Householder QR as below.

The orthonormal ``Q`` factors are never formed: ``torch.geqrf`` keeps them as Householder reflectors.
Results are expanded through them as ``Q w = X (R⁻¹ w)``, one matrix product with the factor ``X``
itself, wherever a per-matrix check bounds the rounding that ``R⁻¹`` could amplify (``coordinates``), and
by ``torch.ormqr`` applying the reflectors elsewhere (a zero factor, a null component).

Gauge. ``B A = (B M)(M⁻¹ A)`` for any invertible ``M``, so a factorisation needs a rule. Operators return
the balanced one, ``B = U √S`` and ``A = √S Vᵀ``, except for (near-)null components: with ``√s`` below
``NULL_TOL`` times the parents' typical ``A`` row norm the row of ``A`` keeps that typical norm and the
column of ``B`` becomes ``u s / ‖a‖`` (zero for ``s = 0``). ``ΔW`` is the same either way; the point is
trainability: a component with a zero row in ``A`` *and* a zero column in ``B`` gets zero gradient in
both and could never be learned again (a fresh adapter has ``B = 0``, so ``√S`` everywhere would kill it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NULL_TOL = 1e-3
"""Components with ``√s < NULL_TOL * a_scale`` keep ``A`` rows of norm ``a_scale`` (see the module doc)."""


class ProductOverflow(ValueError):
    """``B @ A`` of a batch overflows its dtype (``evolve.genome.detached`` names the operator and key)."""


MAX_AMPLIFICATION = 100.0
"""Largest rounding amplification ``coordinates`` accepts (float32: relative error up to ~1e-5)."""


@dataclass(frozen=True)
class LowRankSVD:
    """The SVD of ``b @ a`` in implicit form: ``U = Q_b u``, ``V = Q_a v``, singular values ``s``.

    All tensors carry the same leading batch dims ``...`` as the inputs.
    """

    b: torch.Tensor
    """The factor ``b (..., m, R)`` itself (the caller's tensor, not a copy)."""
    a: torch.Tensor
    """The factor ``a (..., R, n)`` itself."""
    b_reflectors: torch.Tensor
    """``geqrf`` output for ``b``: ``(..., m, R)``."""
    b_tau: torch.Tensor
    a_reflectors: torch.Tensor
    """``geqrf`` output for ``aᵀ``: ``(..., n, R)``."""
    a_tau: torch.Tensor
    u: torch.Tensor
    """Left singular vectors of the core, ``(..., k_b, k)`` with ``k_b = min(m, R)``."""
    s: torch.Tensor
    """Singular values, descending, ``(..., k)`` with ``k = min(k_b, k_a)``."""
    v: torch.Tensor
    """Right singular vectors of the core, ``(..., k_a, k)`` with ``k_a = min(n, R)``."""


def lowrank_svd(b: torch.Tensor, a: torch.Tensor) -> LowRankSVD:
    """SVD of ``b @ a`` without forming the product.

    Args:
        b: ``(..., m, R)``.
        a: ``(..., R, n)``.

    Returns:
        The implicit SVD; expand it with ``apply_q``.
    """
    m, rank_in = b.shape[-2:]
    n = a.shape[-1]
    b_reflectors, b_tau = torch.geqrf(b)  # b = Q_b R_b
    # aᵀ of a row-major ``a`` is already column-major, LAPACK's layout; ``b`` may come in either layout.
    a_reflectors, a_tau = torch.geqrf(a.mT)  # aᵀ = Q_a R_a
    r_b = b_reflectors[..., : min(m, rank_in), :].triu()  # (..., k_b, R)
    r_a = a_reflectors[..., : min(n, rank_in), :].triu()  # (..., k_a, R)
    core = r_b @ r_a.mT  # (..., k_b, k_a)
    if not bool(torch.isfinite(core).all()):  # LAPACK failed on it naming nothing, or gave an infinite child
        raise ProductOverflow(f"B @ A overflows {core.dtype}: the factors are too large to decompose")
    u, s, vh = torch.linalg.svd(core, full_matrices=False)
    return LowRankSVD(b, a, b_reflectors, b_tau, a_reflectors, a_tau, u, s, vh.mT)


def _padded(small: torch.Tensor, rows: int) -> torch.Tensor:
    """``small (..., k, c)`` stacked on zeros to ``(..., rows, c)``, row-major."""
    padded = small.new_zeros(*small.shape[:-2], rows, small.shape[-1])
    padded[..., : small.shape[-2], :] = small
    return padded


def apply_q(reflectors: torch.Tensor, tau: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
    """``Q @ small`` for the thin ``Q`` stored as Householder reflectors by ``torch.geqrf``.

    Computed as ``(smallᵀ Qᵀ)ᵀ`` with ``ormqr``'s right-hand form so that LAPACK's column-major output is
    already the row-major layout PEFT stores ``B`` in (no transposing copy afterwards).

    Args:
        reflectors: ``(..., m, R)`` from ``geqrf``.
        tau: ``(..., min(m, R))`` from ``geqrf``.
        small: ``(..., k, c)`` with ``k <= m``: coordinates in the basis of ``Q``'s first ``k`` columns.

    Returns:
        ``(..., m, c)``, row-major.
    """
    other = _padded(small, reflectors.shape[-2]).mT  # (..., c, m), column-major: plain copy in LAPACK
    return torch.ormqr(reflectors, tau, other, left=False, transpose=True).mT


def apply_q_transposed(reflectors: torch.Tensor, tau: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
    """``(Q @ small)ᵀ``, row-major ``(..., c, m)``: the layout PEFT stores ``A`` in (see ``apply_q``)."""
    rows = reflectors.shape[-2]
    padded_t = small.new_zeros(*small.shape[:-2], small.shape[-1], rows)  # (..., c, m)
    padded_t[..., : small.shape[-2]] = small.mT
    return torch.ormqr(reflectors, tau, padded_t.mT).mT


def take_columns(x: torch.Tensor, rank: int) -> torch.Tensor:
    """The first ``rank`` columns (last dim) of ``x``, zero-padded when there are fewer."""
    if x.shape[-1] >= rank:
        return x[..., :rank]
    return torch.nn.functional.pad(x, (0, rank - x.shape[-1]))


def take_right_vectors(v: torch.Tensor, rank: int) -> torch.Tensor:
    """The first ``rank`` columns of the core's right vectors ``v (..., k_a, k)``, completed when there are
    fewer (a rank above ``min(in, out)``: only ``k < rank`` components exist) by unit vectors orthogonal to
    them (cycled when ``k_a < rank``). The extra components have ``s = 0``, so ``ΔW`` does not change, but
    their ``A`` rows get the typical norm (``gauge``) instead of zero rows that, beside zero columns of
    ``B``, could never be trained again."""
    k_a, k = v.shape[-2:]
    if k >= rank:
        return v[..., :rank]
    eye = torch.eye(k_a, dtype=v.dtype, device=v.device).expand(*v.shape[:-2], k_a, k_a)
    basis = torch.linalg.qr(torch.cat([v, eye], dim=-1)).Q  # (..., k_a, k_a); its first k columns span v
    extra = basis[..., k:] if k_a > k else basis
    picks = [i % extra.shape[-1] for i in range(rank - k)]
    return torch.cat([v, extra[..., picks]], dim=-1)


FRESH_ROW_NORM = 3**-0.5
"""``row_scale`` where ``A`` is all zero: the expected row norm of PEFT's default ``A`` initialisation
(Kaiming-uniform with ``a = √5``: entries uniform in ``±1/√in``, variance ``1/(3 in)`` each)."""


def row_scale(a: torch.Tensor) -> torch.Tensor:
    """RMS row norm of ``a (..., R, n)``: ``(..., 1)``, the typical norm of one row of ``A``; ``FRESH_ROW_NORM``
    where ``a`` is all zero (with ``B != 0`` such an adapter still trains, ``∂L/∂A = Bᵀ ∂L/∂W``; a zero
    scale made every component of its child null in both factors, never trainable again)."""
    scale = torch.linalg.vector_norm(a, dim=(-2, -1)).div(a.shape[-2] ** 0.5).unsqueeze(-1)
    return torch.where(scale > 0, scale, torch.full_like(scale, FRESH_ROW_NORM))


def gauge(s: torch.Tensor, a_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-component scales ``(d_b, d_a)`` with ``d_b * d_a = s``: balanced, with the null rule of the module doc.

    Args:
        s: ``(..., r)`` non-negative singular values.
        a_scale: ``(..., 1)`` typical ``A`` row norm.
    """
    root = s.clamp(min=0).sqrt()
    d_a = torch.where((root >= NULL_TOL * a_scale) & (root > 0), root, a_scale.expand_as(root))
    d_b = torch.where(d_a > 0, s / d_a.clamp(min=torch.finfo(s.dtype).tiny), torch.zeros_like(s))
    return d_b, d_a


def to_factors(
    svd: LowRankSVD,
    u: torch.Tensor,
    s: torch.Tensor,
    v: torch.Tensor,
    a_scale: torch.Tensor,
    b_keep: torch.Tensor | None = None,
    *,
    keep: torch.Tensor | None = None,
    sum_halves: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand core-basis components into LoRA factors ``B (..., m, r)`` and ``A (..., r, n)``.

    Args:
        svd: Supplies the ``Q`` bases.
        u: ``(..., k_b, r)`` left vectors in ``Q_b``'s basis (orthonormal columns).
        s: ``(..., r)`` component magnitudes.
        v: ``(..., k_a, r)`` right vectors in ``Q_a``'s basis.
        a_scale: ``(..., 1)`` typical ``A`` row norm (see ``gauge``).
        b_keep: Optional ``(..., r)`` 0/1 mask applied to ``B``'s columns only: a dropped component
            contributes nothing to ``ΔW`` while its ``A`` row stays, so training can revive it.
        keep: Optional ``(..., r)`` 0/1 mask applied to both factors (a zero column of ``B`` and a zero
            row of ``A``); meant for ``sum_halves``.
        sum_halves: The batch is two stacks of ``G`` matrices, ``(2G, ...)``; return the sum of the
            first stack's factors and the second's, ``(G, ...)``, computed as fused products with no
            intermediate per-stack factors. With complementary ``keep`` masks this takes each component
            from one stack (``svd_splice``).
    """
    d_b, d_a = gauge(s, a_scale)
    if b_keep is not None:
        d_b = d_b * b_keep
    if keep is not None:
        d_b, d_a = d_b * keep, d_a * keep
    if sum_halves and svd.b.shape[0] % 2:
        raise ValueError(f"sum_halves: the batch must hold two stacks, got {svd.b.shape[0]} matrices")

    def b_of(coords: torch.Tensor) -> torch.Tensor:  # B = X_b @ coords (summed over the stacks)
        if not sum_halves:
            return svd.b @ coords
        (x1, x2), (c1, c2) = _halves(svd.b), _halves(coords)
        return torch.baddbmm(x1 @ c1, x2, c2)

    def a_of(coords: torch.Tensor) -> torch.Tensor:  # A = coordsᵀ @ X_a (summed over the stacks)
        if not sum_halves:
            return coords.mT @ svd.a
        (x1, x2), (c1, c2) = _halves(svd.a), _halves(coords)
        return torch.baddbmm(c1.mT @ x1, c2.mT, x2)

    b = _expand(svd.b_reflectors, svd.b_tau, u, d_b, b_of, apply_q, sum_halves)
    a = _expand(svd.a_reflectors, svd.a_tau, v, d_a, a_of, apply_q_transposed, sum_halves)
    return b, a


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x[:G], x[G:])`` for ``x (2G, ...)``: the two stacks of a ``sum_halves`` batch."""
    half = x.shape[0] // 2
    return x[:half], x[half:]


def _add_halves(x: torch.Tensor) -> torch.Tensor:
    first, second = _halves(x)
    return first + second


def _expand(
    reflectors: torch.Tensor,
    tau: torch.Tensor,
    vectors: torch.Tensor,
    scale: torch.Tensor,
    through_factor: Callable[[torch.Tensor], torch.Tensor],
    through_reflectors: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    sum_halves: bool = False,
) -> torch.Tensor:
    """``Q @ (vectors * scale)`` in a factor's layout: by a product with the factor where ``coordinates``
    accepts it, by the Householder reflectors for the matrices of the batch it does not. With
    ``sum_halves`` (see ``to_factors``) ``through_factor`` returns the sum of the halves itself, and a
    module whose expansion is rejected in either half goes through the reflectors in both."""
    small = vectors * scale.unsqueeze(-2)
    found = coordinates(reflectors, vectors)
    combine = _add_halves if sum_halves else (lambda x: x)
    if found is None or not bool(found[1].any()):
        return combine(through_reflectors(reflectors, tau, small))
    coords, accurate = found
    if sum_halves:
        first, second = _halves(accurate)
        accurate = first & second
    result = through_factor(coords * scale.unsqueeze(-2))
    if not bool(accurate.all()):
        rejected = ~accurate
        both = torch.cat([rejected, rejected]) if sum_halves else rejected  # first stack's, then second's
        result[rejected] = combine(through_reflectors(reflectors[both], tau[both], small[both]))
    return result


def coordinates(reflectors: torch.Tensor, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``R⁻¹ @ vectors`` and, per matrix of the batch, whether that expands the vectors accurately.

    With ``X = Q R`` (``geqrf`` of ``X (..., m, R)``, ``m >= R``), ``Q @ w = X @ (R⁻¹ w)``: one matrix
    product with the factor instead of applying ``R`` Householder reflectors (``ormqr``), 2-3x faster on
    Qwen2.5-0.5B-shaped factors here. It is accurate only while ``R⁻¹`` does not amplify rounding: the
    relative error of ``X @ (R⁻¹ w)`` is about ``ε ‖R‖ ‖R⁻¹ w‖`` (``ε`` the unit roundoff), so each
    column's factor ``‖R‖_F ‖R⁻¹ w_j‖`` (an upper bound of it) is checked against ``MAX_AMPLIFICATION``,
    for the vectors actually expanded. A zero factor (a fresh adapter's ``B = 0``) or a null component
    fails the check, and the caller applies the reflectors instead; a rank-deficient factor passes when
    the expanded vectors avoid its deficient directions (``[B, B]`` of a parent crossed with itself).

    Args:
        reflectors: ``(..., m, R)`` from ``geqrf``.
        vectors: ``(..., k, c)`` coordinates in the basis of ``Q``'s first ``k`` columns.

    Returns:
        ``(coords (..., R, c), accurate (...))`` (bool), or None where the shapes do not allow it
        (``m < R``, or ``k != R``).
    """
    rows, width = reflectors.shape[-2:]
    if rows < width or vectors.shape[-2] != width:
        return None
    r = reflectors[..., :width, :].triu()
    coords = torch.linalg.solve_triangular(r, vectors, upper=True)
    amplification = torch.linalg.matrix_norm(r).unsqueeze(-1) * torch.linalg.vector_norm(coords, dim=-2)
    return coords, (amplification <= MAX_AMPLIFICATION).all(dim=-1)  # NaN and inf fail


def reproject(
    bs: Sequence[torch.Tensor], as_: Sequence[torch.Tensor], coeffs: Sequence[float], rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best rank-``rank`` factors of ``Σ_i coeffs[i] * bs[i] @ as_[i]`` (Eckart–Young), computed low-rank.

    Exact (up to rounding) when the sum has rank ``<= rank``. Terms with a zero coefficient are skipped.

    Args:
        bs: ``(..., m, r_i)`` each.
        as_: ``(..., r_i, n)`` each.
        coeffs: One real weight per term.
        rank: Output rank ``r``.

    Returns:
        ``(B (..., m, r), A (..., r, n))`` in the balanced gauge, both row-major; ``A``'s typical row
        norm for null components is the RMS row norm over the non-skipped terms' ``A``.
    """
    terms = [(c, b, a) for c, b, a in zip(coeffs, bs, as_, strict=True) if c != 0] or [(0.0, bs[0], as_[0])]
    b_cat = torch.cat([b for _, b, _ in terms], dim=-1)  # (..., m, R)
    a_cat = torch.cat([a for _, _, a in terms], dim=-2)  # (..., R, n)
    weights = torch.cat([torch.full((a.shape[-2],), c, dtype=a.dtype, device=a.device) for c, _, a in terms])
    return reproject_concatenated(b_cat, a_cat, rank, weights)


def reproject_concatenated(
    b_cat: torch.Tensor, a_cat: torch.Tensor, rank: int, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reproject`` for terms already concatenated: ``ΔW = b_cat @ diag(weights) @ a_cat``, ``b_cat (..., m, R)``,
    ``a_cat (..., R, n)`` and ``weights (R,)`` (all ones when None). The weights go into the small matrices
    (the Gram matrix of ``b_cat`` and the coordinates the child is expanded with), never into a copy of
    ``b_cat``, except for the matrices that go through Householder QR.

    Decomposed from the factors' Gram matrices (``_reproject_by_gram``) where both concatenated factors
    are well-conditioned, by Householder QR (``lowrank_svd``) elsewhere: related parents (a child and its
    parent), factors with a steeply falling spectrum, zero or overflowing factors, more columns than rows.
    """
    batch_shape, (m, width), n = b_cat.shape[:-2], b_cat.shape[-2:], a_cat.shape[-1]
    b_cat, a_cat = b_cat.reshape(-1, m, width), a_cat.reshape(-1, width, n)
    if not b_cat.shape[0]:
        return b_cat.new_empty(*batch_shape, m, rank), a_cat.new_empty(*batch_shape, rank, n)
    tri_a = _gram_triangle(a_cat @ a_cat.mT)
    fast = tri_a.accepted
    if bool(fast.any()):  # A first: where related parents' stacks fail it, B's Gram matrix is not formed
        gram_b = b_cat.mT @ b_cat
        tri_b = _gram_triangle(gram_b if weights is None else gram_b * (weights.unsqueeze(-1) * weights))
        fast = fast & tri_b.accepted
    if bool(fast.all()):
        b, a = _reproject_by_gram(b_cat, a_cat, tri_b, tri_a, rank, weights)
        return b.view(*batch_shape, m, rank), a.view(*batch_shape, rank, n)
    some = bool(fast.any())
    rest = ~fast
    b_rest, a_rest = (b_cat[rest], a_cat[rest]) if some else (b_cat, a_cat)
    svd = lowrank_svd(b_rest if weights is None else _weighted_column_major(b_rest, weights), a_rest)
    u, s, v = take_columns(svd.u, rank), take_columns(svd.s, rank), take_right_vectors(svd.v, rank)
    b, a = to_factors(svd, u, s, v, row_scale(a_rest))
    if some:
        gram = _reproject_by_gram(b_cat[fast], a_cat[fast], tri_b[fast], tri_a[fast], rank, weights)
        b, a = _in_slots(fast, gram, (b, a))
    return b.view(*batch_shape, m, rank), a.view(*batch_shape, rank, n)


def _weighted_column_major(b: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``b * weights`` (columns scaled) written column-major, the layout ``geqrf`` factors in: one pass
    instead of a product and ``geqrf``'s own transposing copy."""
    out = torch.empty(*b.shape[:-2], b.shape[-1], b.shape[-2], dtype=b.dtype, device=b.device)
    return torch.mul(b.mT, weights.unsqueeze(-1), out=out).mT


def _in_slots(
    taken: torch.Tensor, ours: tuple[torch.Tensor, torch.Tensor], others: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors computed for the matrices ``taken`` (a bool mask) and for the rest, each in its own slot."""
    merged = []
    for mine, theirs in zip(ours, others, strict=True):
        whole = mine.new_empty(len(taken), *mine.shape[1:])
        whole[taken], whole[~taken] = mine, theirs
        merged.append(whole)
    return merged[0], merged[1]


GRAM_MAX_CONDITION = 1000.0
"""Largest condition bound ``‖R_s‖_F ‖R_s⁻¹‖_F`` (>= the 2-norm condition number) of a column-scaled
concatenated factor that ``reproject_concatenated`` decomposes from its Gram matrix; above it, or where
the Cholesky factorisation fails, the matrix goes through Householder QR. In a sweep of related and
unrelated parents with flat and falling spectra (641 stacks, 600x400 to 4864x896) the children taken
below this bound stayed within 2e-6 (relative) of the Eckart–Young optimum, as Householder's do; with
the bound at 1e8, a ``B`` whose spectrum falls 1000-fold was taken and came out 1.3e-5 off
(``tests/test_operators.py`` keeps such a case)."""


@dataclass(frozen=True)
class _Triangle:
    """``X = Q̃ R`` from the Gram matrix ``XᵀX`` (see ``_gram_triangle``), batched like ``X``."""

    r: torch.Tensor
    """``R = R_s D`` ``(..., R, R)``, upper triangular."""
    r_scaled_inv: torch.Tensor
    """``R_s⁻¹`` ``(..., R, R)``."""
    scale: torch.Tensor
    """``D``, the column norms of ``X`` (1 for a zero column), ``(..., R)``."""
    accepted: torch.Tensor
    """Per matrix: the factorisation succeeded and ``‖R_s‖_F ‖R_s⁻¹‖_F <= GRAM_MAX_CONDITION``."""

    def __getitem__(self, index: torch.Tensor | slice) -> _Triangle:
        return _Triangle(self.r[index], self.r_scaled_inv[index], self.scale[index], self.accepted[index])


def _gram_triangle(gram: torch.Tensor) -> _Triangle:
    """A triangular factor of ``X`` from its Gram matrix ``XᵀX (..., R, R)``: ``X = Q̃ R`` with ``R = R_s D``,
    ``D`` the column norms and ``R_sᵀ R_s`` the Cholesky factorisation of the column-scaled ``D⁻¹ XᵀX D⁻¹``
    (a zero column or a non-finite value is not accepted). On MPS nothing is accepted and nothing factored
    (no float64 there for the core, and not every routine here): Householder QR, as before."""
    if gram.device.type == "mps":
        refused = torch.zeros(gram.shape[:-2], dtype=torch.bool, device=gram.device)
        return _Triangle(gram, gram, gram.diagonal(dim1=-2, dim2=-1), refused)  # (never read where refused)
    squares = gram.diagonal(dim1=-2, dim2=-1)
    norms = squares.clamp(min=0).sqrt()
    scale = torch.where(norms > 0, norms, torch.ones_like(norms))
    lower, info = torch.linalg.cholesky_ex(gram / (scale.unsqueeze(-1) * scale.unsqueeze(-2)))
    r_scaled = lower.mT
    eye = torch.eye(r_scaled.shape[-1], dtype=r_scaled.dtype, device=r_scaled.device)
    r_scaled_inv = torch.linalg.solve_triangular(r_scaled, eye.expand_as(r_scaled), upper=True)
    bound = torch.linalg.matrix_norm(r_scaled) * torch.linalg.matrix_norm(r_scaled_inv)
    # Products below the normal range round to subnormals, which carry fewer digits: a column whose squared
    # norm is under tiny / eps (float32: |column| < 3e-16) lost precision in its Gram entries.
    finfo = torch.finfo(gram.dtype)
    normal = (squares >= finfo.tiny / finfo.eps).all(dim=-1)
    accepted = (info == 0) & (bound <= GRAM_MAX_CONDITION) & normal  # NaN and inf fail the comparisons
    return _Triangle(r_scaled * scale.unsqueeze(-2), r_scaled_inv, scale, accepted)


def _reproject_by_gram(
    b_cat: torch.Tensor,
    a_cat: torch.Tensor,
    tri_b: _Triangle,
    tri_a: _Triangle,
    rank: int,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reproject_concatenated`` with the triangular factors taken from the Gram matrices (Cholesky QR)
    instead of Householder QR: a batched matrix product per factor instead of ``geqrf`` (for 16 stacked
    4864 x 32 factors at one thread here, 2.8 ms against 9.5).

    With ``X_b = Q̃_b R_b`` and ``X_a = Q̃_a R_a`` (``_gram_triangle``), ``ΔW = Q̃_b C Q̃_aᵀ`` with the core
    ``C = R_b R_aᵀ``, exactly for any invertible factors. From ``CᵀC = V S² Vᵀ`` (``eigh`` in float64,
    as accurate as an SVD of the float32 core and cheaper), the child is ``B = X_b R_aᵀ V D_a⁻¹`` and
    ``A = D_a Vᵀ R_a⁻ᵀ X_aᵀ`` with ``D_b D_a = S`` (``gauge``): ``B`` needs no inverse, as
    ``R_b⁻¹ C = R_aᵀ``, and ``U = C V S⁻¹`` is never formed (null components included).

    Rounding in the Gram matrices leaves ``Q̃`` off orthonormal by about ``ε κ²`` (Fukaya, Nakatsukasa,
    Yanagisawa and Yamamoto, "CholeskyQR2", 2014), which only ranks the components in a slightly
    distorted norm; with the columns scaled to unit norm first (van der Sluis 1969) and ``κ`` bounded
    by ``GRAM_MAX_CONDITION`` the child stays the Eckart–Young optimum to float32 rounding.

    ``A`` is expanded through ``R_a⁻¹``: rounding amplified at most ``κ`` fold (``coordinates``), below
    ``GRAM_MAX_CONDITION`` on accepted matrices (measured: no larger errors than Householder's).

    Raises:
        ProductOverflow: A singular value overflows the factors' dtype.
    """
    coords_b, coords_a = _gram_coordinates(tri_b, tri_a, rank, row_scale(a_cat))
    if weights is not None:  # tri_b is of X_b = b_cat diag(weights): B = X_b @ coords_b
        coords_b = coords_b * weights.unsqueeze(-1)
    return b_cat @ coords_b, coords_a.mT @ a_cat


def _gram_coordinates(
    tri_b: _Triangle, tri_a: _Triangle, rank: int, a_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``rank`` components of ``X_b X_aᵀ`` as coordinates on the factors themselves (see
    ``_reproject_by_gram``): ``(R_aᵀ V D_a⁻¹ (..., R, rank), R_a⁻¹ V D_a (..., R, rank))``, so that
    ``B = X_b @ first`` and ``A = secondᵀ @ X_aᵀ``, in the balanced gauge with ``gauge``'s null rule.

    Raises:
        ProductOverflow: A singular value overflows the factors' dtype.
    """
    dtype = tri_a.r.dtype
    core = tri_b.r.double() @ tri_a.r.double().mT
    # CᵀC squares the core: taken of C / ‖C‖ (float64 factors of 1e77 overflowed it), then scaled back
    size = core.abs().amax(dim=(-2, -1)).unsqueeze(-1)  # (..., 1); a norm's squares could overflow
    size = torch.where(size > 0, size, torch.ones_like(size))
    unit = core / size.unsqueeze(-1)
    eigenvalues, vectors = torch.linalg.eigh(unit.mT @ unit)  # ascending
    top = min(rank, vectors.shape[-1])
    s = (eigenvalues[..., -top:].flip(-1).clamp(min=0).sqrt() * size).to(dtype)
    if not bool(torch.isfinite(s).all()):
        raise ProductOverflow(f"B @ A overflows {dtype}: the factors are too large to decompose")
    v = take_right_vectors(vectors[..., -top:].flip(-1).to(dtype), rank)
    _, d_a = gauge(take_columns(s, rank), a_scale)  # D_b = S D_a⁻¹ is never needed
    coords_b = (tri_a.r.mT @ v) / d_a.unsqueeze(-2)  # R_b⁻¹ U D_b = R_b⁻¹ C V D_a⁻¹ = R_aᵀ V D_a⁻¹
    coords_b[..., top:] = 0  # components past the core's size (rank > R) have s = 0: no B column
    coords_a = (tri_a.r_scaled_inv @ (v * d_a.unsqueeze(-2))) / tri_a.scale.unsqueeze(-1)  # R_a⁻¹ V D_a
    return coords_b, coords_a


def splice(b: torch.Tensor, a: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per module, the sum of two adapters' SVD components picked by ``keep``: ``svd_splice``'s child.

    Args:
        b: ``(2G, m, r)``: the first adapter of each of ``G`` modules, then the second (``stack_factors``).
        a: ``(2G, r, n)``, likewise.
        keep: ``(2G, r)`` 0/1 per component (in descending order of singular value) of each adapter.

    Returns:
        ``(B (G, m, r), A (G, r, n))``: ``Σ_{adapters} Σ_{kept j} s_j u_j v_jᵀ`` in the balanced gauge (a
        component that is not kept leaves a zero column of ``B`` and a zero row of ``A``). Modules whose two
        adapters are well-conditioned go through their Gram matrices (``_gram_coordinates``), the others
        through Householder QR (``adapter_svd``, ``to_factors``).
    """
    rank, count = a.shape[-2], b.shape[0] // 2
    if not count:
        return b.new_empty(0, *b.shape[1:]), a.new_empty(0, *a.shape[1:])
    tri_b, tri_a = _gram_triangle(b.mT @ b), _gram_triangle(a @ a.mT)
    accepted = tri_b.accepted & tri_a.accepted
    fast = accepted[:count] & accepted[count:]  # per module: both adapters

    def by_gram(modules: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        rows = _both_halves(modules, count)
        coords_b, coords_a = _gram_coordinates(tri_b[rows], tri_a[rows], rank, row_scale(a[rows]))
        kept = keep[rows].unsqueeze(-2)
        (x1, x2), (c1, c2) = _halves(b[rows]), _halves(coords_b * kept)
        (y1, y2), (e1, e2) = _halves(a[rows]), _halves(coords_a * kept)
        return torch.baddbmm(x1 @ c1, x2, c2), torch.baddbmm(e1.mT @ y1, e2.mT, y2)

    if bool(fast.all()):
        return by_gram(slice(None))
    rest = _both_halves(~fast, count)
    svd, u, s, v = adapter_svd(b[rest], a[rest])
    b_child, a_child = to_factors(svd, u, s, v, row_scale(a[rest]), keep=keep[rest], sum_halves=True)
    if bool(fast.any()):
        b_child, a_child = _in_slots(fast, by_gram(fast), (b_child, a_child))
    return b_child, a_child


def _both_halves(modules: torch.Tensor | slice, count: int) -> torch.Tensor | slice:
    """Rows of both adapters of the selected modules in a ``(2G, ...)`` stack (``splice``)."""
    return modules if isinstance(modules, slice) else torch.cat([modules, modules])


def adapter_svd(
    b: torch.Tensor, a: torch.Tensor
) -> tuple[LowRankSVD, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVD of one adapter ``b (..., m, r) @ a (..., r, n)``, truncated or zero-padded to its rank ``r``.

    Returns:
        ``(svd, u (..., k_b, r), s (..., r), v (..., k_a, r))``: the implicit SVD and its components in
        the core basis, ready for spectrum edits and ``to_factors``.
    """
    rank = a.shape[-2]
    svd = lowrank_svd(b, a)
    return svd, take_columns(svd.u, rank), take_columns(svd.s, rank), take_right_vectors(svd.v, rank)
