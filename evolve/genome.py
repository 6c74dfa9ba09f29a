"""Genomes: parameter dicts, LoRA pair discovery in PEFT's key format, parent validation, helpers."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import math
import numbers
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import torch

from evolve.lowrank import ProductOverflow

Genome = dict[str, torch.Tensor]
"""A genome is a flat parameter dict: a PEFT LoRA state dict (``get_peft_model_state_dict``) or a plain
one (``module.state_dict()``, an SB3 policy's ``state_dict()``). Operators act on every floating tensor of
a plain genome, buffers included: to keep e.g. BatchNorm running statistics out of mutation and
extrapolation (noise can make a running variance negative), pass ``dict(module.named_parameters())``."""

# PEFT names the factors `<module>.lora_A.weight` (r x in) and `<module>.lora_B.weight` (out x r) in
# `get_peft_model_state_dict`; a raw `model.state_dict()` carries the adapter name in between
# (`<module>.lora_A.default.weight`). An adapted nn.Embedding has `<module>.lora_embedding_A` (r x vocab)
# and `<module>.lora_embedding_B` (dim x r), no `.weight` (raw: `...lora_embedding_A.default`); its
# ΔW = B @ A is the embedding matrix's change transposed, a product like any other. All are recognised,
# also with no module in front: one LoRA layer's own `state_dict()` (`lora_A.default.weight` beside
# `base_layer.weight`) was taken for a plain genome, its factors averaged entry by entry and its frozen base
# weight mutated (a review).
_A_TAG = ".lora_A."
_B_TAG = ".lora_B."
_EMBEDDING_A = re.compile(r"(?:(.+)\.)?lora_embedding_A(\.[^.]+)?")
_EMBEDDING_B = re.compile(r"(?:.+\.)?lora_embedding_B(\.[^.]+)?")
# Trained parts of an adapter besides its factors: PEFT's `lora_bias=True` (`<module>.lora_B.bias`) and DoRA's
# magnitudes (`use_dora=True`). The operators would pass them through from the first parent, so that an
# interpolation all the way to the second parent kept the first's bias (an audit): refused by name instead.
_ADAPTER_EXTRA = re.compile(r"(?:.+\.)?(?:lora_B(?:\.[^.]+)?\.bias|lora_magnitude_vector(?:\..+)?)")


@dataclass(frozen=True)
class LoraPair:
    """One adapted module: the keys of its two factors, ``ΔW = B @ A``."""

    module: str
    """The module's name (the key up to ``.lora_A``)."""
    a_key: str
    """Key of ``A``, shape ``(rank, in_features)``."""
    b_key: str
    """Key of ``B``, shape ``(out_features, rank)``."""


@dataclass(frozen=True)
class PairBatch:
    """LoRA pairs whose factors share shapes and dtype, so operators can stack them into one batch."""

    pairs: tuple[LoraPair, ...]
    a_shape: tuple[int, int]
    """``(rank, in_features)``."""
    b_shape: tuple[int, int]
    """``(out_features, rank)``."""
    dtype: torch.dtype
    """The dtype the batch is computed in (float32, or float64 for float64 factors)."""


def _split_a_key(key: str) -> tuple[str, str] | None:
    """``(module, key of B)`` for the key of an ``A`` factor; None for any other key. The module of a bare
    layer's factors (``lora_A.weight``) is ``""``."""
    if key.endswith(".weight") and (_A_TAG in key or key.startswith(_A_TAG[1:])):
        head, _, tail = ("." + key).rpartition(_A_TAG)
        return head[1:], (head + _B_TAG)[1:] + tail
    if match := _EMBEDDING_A.fullmatch(key):
        head = match[1] or ""
        return head, f"{head}{'.' if head else ''}lora_embedding_B{match[2] or ''}"
    return None


def _is_b_key(key: str) -> bool:
    bare_or_tagged = _B_TAG in key or key.startswith(_B_TAG[1:])
    return (bare_or_tagged and key.endswith(".weight")) or _EMBEDDING_B.fullmatch(key) is not None


def lora_pairs(genome: Genome) -> tuple[LoraPair, ...]:
    """Find the LoRA factor pairs of a genome, in the genome's key order.

    Args:
        genome: A parameter dict.

    Returns:
        One ``LoraPair`` per adapted module; empty for a plain (non-LoRA) genome.

    Raises:
        ValueError: A factor without its partner, a factor that is not 2-D, ``A``/``B`` ranks that
            disagree, rank 0, or no input or output features, or a trained part of the adapter that the
            operators do not combine (a LoRA bias, DoRA's magnitudes); the message names the key.
        TypeError: A factor that is not a floating-point tensor; the message names the key.
    """
    pairs = []
    b_keys = {key for key in genome if _is_b_key(key)}
    for key in genome:
        split = _split_a_key(key)
        if split is None:
            continue
        head, b_key = split
        if b_key not in genome:
            raise ValueError(f"LoRA factor {key!r} has no partner {b_key!r}")
        b_keys.discard(b_key)
        a, b = genome[key], genome[b_key]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            raise TypeError(
                f"LoRA factors of {head!r} must be tensors (got {type(a).__name__}, {type(b).__name__})"
            )
        if not (a.is_floating_point() and b.is_floating_point()):
            # (the operators' results, truncated back to an integer dtype, would be garbage children)
            raise TypeError(
                f"LoRA factors of {head!r} must be floating-point tensors (got {a.dtype}, {b.dtype})"
            )
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"LoRA factors of {head!r} must be 2-D (got {tuple(a.shape)}, {tuple(b.shape)})")
        if a.shape[0] != b.shape[1]:
            raise ValueError(
                f"LoRA factors of {head!r} disagree on rank: A {tuple(a.shape)}, B {tuple(b.shape)}"
            )
        if a.shape[0] == 0:
            raise ValueError(f"LoRA factors of {head!r} have rank 0 (A {tuple(a.shape)}, B {tuple(b.shape)})")
        if a.shape[1] == 0 or b.shape[0] == 0:  # (failed inside the decompositions, naming no key)
            raise ValueError(
                f"LoRA factors of {head!r} adapt a layer with no {'inputs' if a.shape[1] == 0 else 'outputs'} "
                f"(A {tuple(a.shape)}, B {tuple(b.shape)})"
            )
        pairs.append(LoraPair(module=head, a_key=key, b_key=b_key))
    if b_keys:
        raise ValueError(f"LoRA factor {sorted(b_keys)[0]!r} has no lora_A partner")
    if pairs:
        extra = next((key for key in genome if _ADAPTER_EXTRA.fullmatch(key)), None)
        if extra is not None:
            raise ValueError(
                f"{extra!r} is a trained part of the LoRA adapter (PEFT's lora_bias=True or use_dora=True) that "
                "the weight-space operators do not combine (they would copy it from the first parent whatever "
                "the operator): adapt with LoraConfig(lora_bias=False, use_dora=False)"
            )
    return tuple(pairs)


def require_lora(genome: Genome, operator: str) -> tuple[LoraPair, ...]:
    """Return the genome's LoRA pairs, or raise for a plain genome.

    Raises:
        ValueError: The genome has no ``...lora_A.weight`` / ``...lora_B.weight`` keys.
    """
    pairs = lora_pairs(genome)
    if not pairs:
        raise ValueError(
            f"operator {operator!r} needs a LoRA genome (PEFT keys '...lora_A.weight' / '...lora_B.weight'); "
            "got a plain genome"
        )
    return pairs


_Operator = TypeVar("_Operator", bound=Callable[..., Genome])


@overload
def detached(
    operator: _Operator, *, checks_its_child: bool = False, checks_its_parents: bool = False
) -> _Operator: ...
@overload
def detached(
    *, checks_its_child: bool = False, checks_its_parents: bool = False
) -> Callable[[_Operator], _Operator]: ...


def detached(
    operator: _Operator | None = None, *, checks_its_child: bool = False, checks_its_parents: bool = False
) -> _Operator | Callable[[_Operator], _Operator]:
    """Runs ``operator`` on detached views of its genome or parents (and of a genome given by keyword,
    ``dare``'s ``base``), after checking that their floating-point tensors are finite and that ``rng`` is a
    ``torch.Generator``.

    A genome of parameters that require grad (``dict(module.named_parameters())``) then gives a child of
    plain tensors: no autograd graph holding the parents alive, and no failure in the operators that
    write into preallocated tensors (``out=`` does not support autograd). The views share the parents'
    storage: nothing is copied. A NaN or infinity in a parent is a ``ValueError`` naming the parent and
    the key (ΔW-space operators failed inside LAPACK naming neither; the others passed it to the child).
    The first argument may be given by keyword too (``genome=`` / ``parents=``). A genome where parents
    belong (or the reverse) is a ``TypeError`` saying so, and a child whose values overflowed its dtype
    (finite parents, extreme magnitudes) a ``ValueError`` naming the operator and the key, never an
    infinite child. ``checks_its_child=True`` (``@detached(checks_its_child=True)``) leaves that last check
    to an operator that copies most of its child from the checked input and checks the rest itself
    (``neftune_a``: a second pass over the whole genome was ~8% of its time). ``checks_its_parents=True``
    leaves the parents' check to an operator that finds non-finite LoRA factors in its own decomposition
    (``ProductOverflow``) and checks the rest itself (``crossovers.linear_combination``): on that error the
    parents are checked here, so the message still names the parent and the key.
    """
    if operator is None:
        return functools.partial(
            detached, checks_its_child=checks_its_child, checks_its_parents=checks_its_parents
        )
    first = next(iter(inspect.signature(operator).parameters))
    name = getattr(operator, "__name__", "operator")

    @functools.wraps(operator)
    def run(*args: Any, **kwargs: Any) -> Genome:
        if args:
            genomes, args = args[0], args[1:]
        elif first in kwargs:
            genomes = kwargs.pop(first)
        else:
            return operator(*args, **kwargs)  # its own TypeError for the missing argument
        if first == "parents":
            if isinstance(genomes, Mapping | str) or not isinstance(genomes, Sequence):
                raise TypeError(f"{name}: parents must be a sequence of genomes (dicts of tensors), got a "
                                f"{type(genomes).__name__}")  # fmt: skip
            for index, genome in enumerate(genomes):
                if not isinstance(genome, Mapping):
                    raise TypeError(f"{name}: parent {index} must be a genome (a dict of tensors), got a "
                                    f"{type(genome).__name__}")  # fmt: skip
                check_tensors(genome, f"parent {index}")
                if not checks_its_parents:
                    check_finite(genome, f"parent {index}")
            genomes = [_detach(g) for g in genomes]
        elif isinstance(genomes, Mapping):
            check_tensors(genomes, "genome")
            check_finite(genomes, "genome")
            genomes = _detach(genomes)
        elif first == "genome":
            raise TypeError(f"{name}: genome must be a dict of tensors, got a {type(genomes).__name__}")
        if "rng" in kwargs and not isinstance(kwargs["rng"], torch.Generator):  # (failed reading `.device`)
            raise TypeError(f"{name}: rng must be a torch.Generator, got a {type(kwargs['rng']).__name__}")
        for key, value in kwargs.items():
            if key in _GENOME_KEYWORDS and value is not None and not isinstance(value, Mapping):
                raise TypeError(
                    f"{name}: {key} must be a genome (a dict of tensors), got a {type(value).__name__}"
                )
            if key in _GENOME_KEYWORDS and isinstance(value, Mapping):
                check_tensors(value, key)
                check_finite(value, key)
        kwargs = {
            k: _detach(v) if k in _GENOME_KEYWORDS and isinstance(v, Mapping) else v
            for k, v in kwargs.items()
        }
        try:
            child = operator(genomes, *args, **kwargs)
        except ProductOverflow as error:
            parents = [genomes] if isinstance(genomes, Mapping) else list(genomes)
            if checks_its_parents:  # a non-finite factor, named; else an overflow, named below
                for index, parent in enumerate(parents):
                    check_finite(parent, f"parent {index}")
            raise ValueError(f"{name}: {_overflowing(parents) or error}") from None
        if not checks_its_child:
            check_finite(child, overflowing_child(name))
        return child

    return run  # type: ignore[return-value]


_GENOME_KEYWORDS = frozenset({"base"})
"""The keyword arguments of operators that take a genome (``dare``'s ``base``): checked and detached like the
parents. Others that are mappings are not genomes: a ``fitness`` given as a dict was reported as a genome
holding floats."""


def overflowing_child(operator: str) -> str:
    """How ``check_finite`` names a child that came out non-finite from finite inputs."""
    return f"{operator}'s child (finite inputs: the result overflows its dtype)"


def _overflowing(parents: Sequence[Mapping[str, Any]]) -> str:
    """Where a parent's ``B @ A`` overflows its dtype (the error path of ``detached``); ``""`` where none
    does (their combination does)."""
    for pair in lora_pairs(dict(parents[0])):
        for index, parent in enumerate(parents):
            b, a = parent[pair.b_key], parent[pair.a_key]
            if not bool(torch.isfinite(b.to(compute_dtype(b.dtype)) @ a.to(compute_dtype(a.dtype))).all()):
                whose = "the genome" if len(parents) == 1 else f"parent {index}"
                return f"B @ A of {whose} overflows {b.dtype} at key {pair.a_key!r}"
    return ""


def check_tensors(genome: Mapping[str, Any], which: str) -> None:
    """``TypeError`` naming the first key of ``genome`` whose value is not a ``torch.Tensor`` (a list or a NumPy
    array failed inside an operator, naming no key)."""
    for key, value in genome.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{which} must map names to torch tensors: {key!r} holds a {type(value).__name__}"
            )


def _detach(genome: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in genome.items()}


def check_finite(genome: Mapping[str, Any], which: str) -> None:
    """``ValueError`` naming the first key of ``genome`` whose floating-point tensor holds a NaN or an
    infinity (``first_non_finite``)."""
    key = first_non_finite(genome)
    if key is not None:
        raise ValueError(f"{which} has non-finite values (NaN or inf) at key {key!r}")


def first_non_finite(tensors: Mapping[Any, Any]) -> Any:
    """The first key of ``tensors`` whose floating-point tensor holds a NaN or an infinity, or ``None``. One
    float32 sum per tensor (NaN and inf propagate; a sum that overflows is looked at entry by entry), stacked
    per device: ~2 ms for a Qwen2.5-0.5B-shaped LoRA genome on one thread. Values that are not floating-point
    tensors are skipped."""
    by_device: dict[torch.device, list[tuple[Any, torch.Tensor]]] = {}
    for key, value in tensors.items():
        if (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and value.numel()
            and not value.is_meta
        ):
            by_device.setdefault(value.device, []).append((key, value))
    with torch.no_grad():
        for entries in by_device.values():
            sums = torch.stack([value.detach().sum(dtype=torch.float32) for _, value in entries])
            if bool(torch.isfinite(sums).all()):
                continue
            for (key, value), total in zip(entries, sums.tolist(), strict=True):
                if not math.isfinite(total) and not bool(torch.isfinite(value.detach()).all()):
                    return key
    return None


def check_parents(
    parents: Sequence[Genome], *, count: int | None = None, names: Sequence[str] | None = None
) -> None:
    """Check that parents can be combined: same keys, shapes, dtypes (hence the same LoRA ranks), devices.

    Args:
        parents: The parent genomes.
        count: The exact number of parents the operator needs, if it needs one.
        names: What the messages call each genome (default ``parent <index>``; ``dare``'s base: ``base``).

    Raises:
        ValueError: No parents, the wrong number of them, or a key that is missing or differs in shape,
            dtype or device; the message names the key and the parent.
    """
    if len(parents) == 0:
        raise ValueError("parents: need at least one parent genome")
    if count is not None and len(parents) != count:
        raise ValueError(f"parents: this operator needs exactly {count} parents, got {len(parents)}")
    label = list(names) if names is not None else [f"parent {i}" for i in range(len(parents))]
    first = parents[0]
    for index, other in enumerate(parents[1:], start=1):
        if other.keys() != first.keys():
            missing = sorted(set(first) - set(other))
            extra = sorted(set(other) - set(first))
            key, where = (missing[0], "missing from") if missing else (extra[0], "only in")
            raise ValueError(f"parents differ at key {key!r}: {where} {label[index]}")
        for key, tensor in first.items():
            theirs = other[key]
            if theirs.shape != tensor.shape:
                rank = " (LoRA rank differs)" if "lora_" in key else ""
                raise ValueError(
                    f"parents differ at key {key!r}: shape {tuple(tensor.shape)} in {label[0]}, "
                    f"{tuple(theirs.shape)} in {label[index]}{rank}"
                )
            if theirs.dtype != tensor.dtype:
                raise ValueError(
                    f"parents differ at key {key!r}: dtype {tensor.dtype} in {label[0]}, {theirs.dtype} in "
                    f"{label[index]}"
                )
            if theirs.device != tensor.device:
                raise ValueError(
                    f"parents differ at key {key!r}: device {tensor.device} in {label[0]}, {theirs.device} in "
                    f"{label[index]} (move them to one device first)"
                )


def check_fitness(fitness: Sequence[float] | torch.Tensor | None, count: int) -> list[float] | None:
    """Validate a per-parent fitness (higher is better) and return it as a list of floats.

    Raises:
        ValueError: Wrong length or a non-finite value.
    """
    if fitness is None:
        return None
    if isinstance(fitness, torch.Tensor) and fitness.ndim != 1:
        raise ValueError(
            f"fitness: need a 1-D tensor (one value per parent), got shape {tuple(fitness.shape)}"
        )
    if isinstance(fitness, np.ndarray) and fitness.ndim != 1:
        raise ValueError(f"fitness: need a 1-D array (one value per parent), got shape {fitness.shape}")
    ordered = Sequence | torch.Tensor | np.ndarray
    if isinstance(fitness, str | bytes | Mapping | Set) or not isinstance(fitness, ordered):
        # ("12" was read as [1.0, 2.0], a set in no order, a dict by its keys)
        raise ValueError(
            f"fitness: need a sequence of numbers in the parents' order (a list, tuple or 1-D tensor), got a "
            f"{type(fitness).__name__}"
        )
    try:
        values = [float(f) for f in (fitness.tolist() if isinstance(fitness, torch.Tensor) else fitness)]
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(
            f"fitness: need one number per parent ({count}), got {fitness!r:.100} ({error})"
        ) from None
    if len(values) != count:
        raise ValueError(f"fitness: need one value per parent ({count}), got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"fitness: values must be finite, got {values}")
    return values


def check_strength(strength: float, name: str = "strength") -> float:
    """Validate a non-negative finite operator strength.

    Raises:
        TypeError: Not a real number (``None``, a string, a bool; a 0-d real torch tensor or numpy array
            counts as its value); the message names the argument.
        ValueError: Negative or non-finite (or beyond the float range); the message names the argument.
    """
    if isinstance(strength, torch.Tensor | np.ndarray) and strength.ndim == 0 and _real_dtype(strength):
        strength = strength.item()
    if isinstance(strength, bool) or not isinstance(strength, numbers.Real):
        raise TypeError(f"{name}: must be a number, got {type(strength).__name__} {strength!r:.60}")
    try:
        value = float(strength)
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be a finite number >= 0, got {strength!r:.60}")
    return value


def _real_dtype(array: torch.Tensor | np.ndarray) -> bool:
    """Whether a tensor or array holds real numbers: integers or floats, not bools or complex numbers."""
    if isinstance(array, torch.Tensor):
        return array.dtype != torch.bool and not array.is_complex()
    return array.dtype.kind in "iuf"


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype operators compute in: float64 stays float64, everything else is done in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def pair_batches(genome: Genome, pairs: Sequence[LoraPair]) -> list[PairBatch]:
    """Group pairs whose factors share shapes and dtypes (first-appearance order, so deterministic)."""
    groups: dict[tuple, list[LoraPair]] = {}
    for pair in pairs:
        a, b = genome[pair.a_key], genome[pair.b_key]
        dtype = compute_dtype(torch.promote_types(a.dtype, b.dtype))
        groups.setdefault((tuple(a.shape), tuple(b.shape), a.dtype, b.dtype, dtype), []).append(pair)
    return [
        PairBatch(pairs=tuple(group), a_shape=sig[0], b_shape=sig[1], dtype=sig[4])
        for sig, group in groups.items()
    ]


_Unit = TypeVar("_Unit")

CHUNK_PAIRS = 16
"""Most pairs in one unit of the crossovers' ``run_parallel`` work (the mutations use whole batches). Fixed,
so a unit, and so a result, never depends on the thread count."""


def chunks(batch: PairBatch, size: int = CHUNK_PAIRS) -> list[PairBatch]:
    """``batch`` split into consecutive batches of at most ``size`` pairs."""
    return [replace(batch, pairs=batch.pairs[i : i + size]) for i in range(0, len(batch.pairs), size)]


def rows(batch: PairBatch) -> int:
    """Rows the batch's factorisations go through: a measure of its work for ``run_parallel``."""
    return len(batch.pairs) * (batch.a_shape[1] + batch.b_shape[0])


_PER_THREAD_COUNTS = "parallel backend: OpenMP" in torch.__config__.parallel_info()
"""Whether torch's thread count can be set per thread (OpenMP builds; a native-backend build has one
shared intra-op pool and warns when its size is set again). Without it the units run in order."""
_LOCK = threading.Lock()
_POOLS: dict[int, ThreadPoolExecutor] = {}  # by size, kept between calls: threads started per call cost
# page faults (glibc gives each thread's allocations an arena of its own, trimmed and faulted in again
# when the thread ends). Never shut down here: a caller on another thread may be using one.


def _thread_count_setters() -> tuple[Callable[[int], Any], Callable[[int], Any] | None] | None:
    """The C setters of the calling thread's own OpenMP and MKL counts that torch's CPU library links
    (``omp_set_num_threads``; ``MKL_Set_Num_Threads_Local``, the C name of MKL's per-thread setter, absent
    without MKL), or None where the library or OpenMP's setter is not found.

    ``torch.set_num_threads`` also sets the process-wide default that every thread takes at its first use
    of torch, so a worker setting itself to one thread with it could hand one thread, for good, to any
    thread that starts using torch at that moment (seen in about 3 runs in 8 of the concurrent-callers
    test). These two touch only the calling thread.
    """
    try:
        torch_cpu = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        set_openmp = torch_cpu.omp_set_num_threads
    except (OSError, AttributeError):
        return None
    set_openmp.argtypes, set_openmp.restype = [ctypes.c_int], None
    set_mkl = getattr(torch_cpu, "MKL_Set_Num_Threads_Local", None)
    if set_mkl is not None:
        set_mkl.argtypes, set_mkl.restype = [ctypes.c_int], ctypes.c_int
    return set_openmp, set_mkl


_SETTERS = _thread_count_setters() if _PER_THREAD_COUNTS else None


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Torch at ``count`` intra-op threads inside, the caller's count again after (``None``: unchanged)."""
    if count is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _one_torch_thread() -> None:
    """Set the calling thread's torch to one thread, for good. Its first use of torch takes the process
    default, so that happens first (``get_num_threads``); then only this thread's counts are set where
    the setters were found, else ``torch.set_num_threads`` (which moves the default too: ``_pool`` puts it
    back)."""
    torch.get_num_threads()
    if _SETTERS is None:
        torch.set_num_threads(1)
        return
    set_openmp, set_mkl = _SETTERS
    set_openmp(1)
    if set_mkl is not None:
        set_mkl(1)


def _pool(workers: int) -> ThreadPoolExecutor:
    """The shared worker pool of ``workers`` threads, each set to run torch on one thread.

    torch's thread count belongs to each thread (OpenMP's per-thread setting, MKL's local one); a thread
    takes torch's process-wide default, the last count set anywhere, when it first uses torch. A new
    pool is started in full here (all workers set to one) and the default then put back to the caller's
    count, which matters only where ``_one_torch_thread`` had to use ``torch.set_num_threads``.
    """
    with _LOCK:
        if workers not in _POOLS:
            pool = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="evolve-operators", initializer=_one_torch_thread
            )
            started = threading.Barrier(workers)
            wait([pool.submit(started.wait, 60) for _ in range(workers)])  # all threads up, initialised
            torch.set_num_threads(torch.get_num_threads())  # the default back to the caller's own count
            _POOLS[workers] = pool
        return _POOLS[workers]


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: no pools, and a lock nobody holds."""
    global _LOCK
    _LOCK = threading.Lock()
    _POOLS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def run_parallel(
    work: Callable[[_Unit], None], units: Sequence[_Unit], costs: Sequence[int], device: torch.device
) -> None:
    """Call ``work`` on every unit, on a pool of single-threaded workers when torch may use more than one
    thread here (``torch.get_num_threads()`` of the calling thread) and the tensors are on the CPU.

    The batched LAPACK routines the ΔW-space operators spend their time in (QR, the small SVDs) run one
    matrix after another on one core whatever torch's thread count, so independent units on separate
    threads are what uses a machine's other cores (1.6-1.7x on two cores here). Each worker runs torch
    on one thread: torch's own threads inside each worker would oversubscribe the cores (measured 10x
    slower). With one thread allowed the units run in the calling thread, also on one thread, so a
    result does not depend on the thread count; the caller's own setting is never changed. ``work`` must
    not draw random numbers (the draw order would depend on scheduling) and must write only its own
    units' keys.

    On a torch without per-thread counts (not built with OpenMP) the units run in order in the caller.

    Args:
        work: Called once per unit.
        units: The independent pieces of work.
        costs: One relative cost per unit; the costliest start first.
        device: Where the tensors live; off the CPU the units run in order, as queued kernels.

    Raises:
        Whatever ``work`` raises (the first failing unit's error in input order, once every unit has
        finished).
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads < 2 or not _PER_THREAD_COUNTS:
        for unit in units:
            work(unit)
        return
    pool = _pool(threads)
    order = sorted(range(len(units)), key=lambda i: -costs[i])
    futures = {i: pool.submit(work, units[i]) for i in order}
    wait(futures.values())  # all of them, also after a failure: none may outlive the call
    for i in range(len(units)):
        futures[i].result()


def stack_factors(
    genomes: Sequence[Genome], batch: PairBatch, *, column_major: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack a batch's factors of one or more genomes in the compute dtype, genome by genome.

    Args:
        column_major: ``b`` column-major (``b.mT`` contiguous), the layout LAPACK's QR works in, so that
            ``torch.geqrf`` need not copy it again; else row-major as in the genomes, a copy about twice
            as fast (for operators that mostly multiply ``b`` rather than factor it: ``lowrank.splice``).

    Returns:
        ``(b, a)`` with shapes ``(len(genomes) * G, out, r)`` and ``(len(genomes) * G, r, in)``; always fresh
        tensors, never views of the genomes.
    """
    if column_major:
        b = torch.stack([genome[p.b_key].mT for genome in genomes for p in batch.pairs]).to(batch.dtype).mT
    else:
        b = torch.stack([genome[p.b_key] for genome in genomes for p in batch.pairs]).to(batch.dtype)
    a = torch.stack([genome[p.a_key] for genome in genomes for p in batch.pairs]).to(batch.dtype)
    return b, a


def store_factors(child: Genome, batch: PairBatch, b: torch.Tensor, a: torch.Tensor, like: Genome) -> None:
    """Write stacked factors ``b (G, out, r)`` and ``a (G, r, in)`` into ``child``, cast to ``like``'s dtypes."""
    for index, pair in enumerate(batch.pairs):
        # copy=True: each module gets its own storage (safetensors refuses tensors that share one).
        child[pair.b_key] = b[index].to(
            like[pair.b_key].dtype, memory_format=torch.contiguous_format, copy=True
        )
        child[pair.a_key] = a[index].to(
            like[pair.a_key].dtype, memory_format=torch.contiguous_format, copy=True
        )


def within_range(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every value of ``x`` is finite and inside ``dtype``'s range: one pass (``aminmax``; a NaN
    propagates to both ends and fails the comparisons). A value just past the range may still round
    into it when cast, so a False asks for ``check_finite`` on the cast result, which decides."""
    if not x.numel():
        return True
    low, high = torch.aminmax(x)
    limit = torch.finfo(dtype).max
    return bool(low >= -limit) and bool(high <= limit)


def lora_keys(pairs: Sequence[LoraPair]) -> set[str]:
    """All factor keys of the given pairs."""
    return {key for pair in pairs for key in (pair.a_key, pair.b_key)}


def copy_others(genome: Genome, skip: set[str]) -> Genome:
    """A new genome holding clones of every tensor of ``genome`` whose key is not in ``skip``."""
    return {key: tensor.clone() for key, tensor in genome.items() if key not in skip}


def ordered_like(child: Genome, template: Genome) -> Genome:
    """Return ``child`` with its keys in ``template``'s order (state-dict order is part of the contract)."""
    return {key: child[key] for key in template}


def module_groups(genome: Genome, pairs: Sequence[LoraPair]) -> list[list[str]]:
    """Group keys into modules that operators treat as units.

    In a LoRA genome each pair is one module (its two factors always travel together) and other keys are
    not grouped (they pass through). In a plain genome floating-point keys group by their parent prefix:
    ``"0.weight"`` and ``"0.bias"`` form one module, and so do the top-level ``"weight"`` and ``"bias"``
    of a bare layer. Integer buffers are never grouped.
    """
    if pairs:
        return [[pair.a_key, pair.b_key] for pair in pairs]
    groups: dict[str, list[str]] = {}
    for key, tensor in genome.items():
        if tensor.is_floating_point():
            groups.setdefault(key.rpartition(".")[0], []).append(key)  # top-level "weight", "bias": ""
    return list(groups.values())
