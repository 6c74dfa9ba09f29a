"""The verifier's records: :class:`VerifierConfig`, :class:`Execution`, :class:`IsolationReport`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from .prefilter import ALLOWED_MODULES

__all__ = ["STATUSES", "Execution", "IsolationReport", "Status", "VerifierConfig"]

Status = Literal[
    "ok", "syntax", "forbidden", "timeout", "memory", "runtime", "nondeterministic", "bad_output", "bad_input"
]
STATUSES: tuple[str, ...] = get_args(Status)


@dataclass(frozen=True)
class Execution:
    """The verdict of one call ``f(<args>)``.

    Attributes:
        status: One of :data:`Status`; ``"ok"`` only when ``f`` returned plain literal data.
        output: Canonical literal text of the return value when ``ok``, else ``None``.
        detail: A short human-readable reason (empty when ``ok``).
    """

    status: Status
    output: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the call returned plain literal data."""
        return self.status == "ok"


MAX_SECONDS = 86_400
"""Longest ``timeout`` / ``start_timeout`` accepted (larger or infinite values overflow the deadlines)."""
MAX_WORKERS = 256
"""Most worker processes per hash-seed pool (two pools start them all up front)."""

MAX_BATCH = 8
"""Most programs in one request to a worker (``VerifierConfig.programs_per_request``, its default). The
worker compiles a request's programs and forks their children in a row before running them one by one
(see ``_worker.Worker.handle``), which spares it most of the page faults it pays on every page it writes
after a fork; more than a few per request gains little and leaves workers idle at the end of a
``run_many``."""


@dataclass(frozen=True)
class VerifierConfig:
    """Options of a :class:`Verifier`."""

    timeout: float = 2.0
    """Wall-clock seconds allowed per call (the child's CPU limit is derived from it)."""
    memory_mb: int = 512
    """Address space each program may add to its process, in MiB (its limit is the interpreter's size when it
    is forked plus this; the absolute limit where the worker cannot read its own size)."""
    workers: int | None = None
    """Worker processes per hash-seed pool, at most ``MAX_WORKERS``; ``None`` uses the number of CPUs (capped so)."""
    check_determinism: bool = True
    """Re-run every successful call in a second pool with another ``PYTHONHASHSEED`` and compare."""
    hash_seeds: tuple[int, int] = (11, 29)
    """The two hash seeds of the determinism pools."""
    max_program_chars: int = 20_000
    """Longer programs are ``bad_input`` without running."""
    max_literal_chars: int = 10_000
    """Longer argument, output or answer texts are ``bad_input`` (or a failed check)."""
    max_output_chars: int = 10_000
    """Return values whose canonical text is longer are ``bad_output``."""
    max_depth: int = 50
    """Deepest nesting in arguments and return values: the most containers any value sits inside (``[1]``
    and ``[[]]`` nest 1 deep, ``[[1]]`` 2), so ``max_depth=3`` admits ``[[[1]]]`` and ``[[[[]]]]`` and
    refuses ``[[[[1]]]]``."""
    recursion_limit: int = 3_000
    """Python recursion limit inside the program's process. Three times CPython's default (1000), for the
    moderate recursion of dataset programs: a program that catches ``RecursionError`` between 1000 and 3000
    frames deep gets a different answer than under a default interpreter (set 1000 to match it)."""
    cache_size: int = 65_536
    """Verdicts kept in memory by ``(program, args)``, least recently used dropped first (also beyond
    ``verifier.CACHE_MAX_CHARS`` characters in all); 0 disables the cache."""
    isolate: bool = True
    """Apply the kernel isolation layers. Turning this off is for debugging only."""
    language_guards: bool = True
    """Apply the language-level layers (static pre-filter, guarded built-ins). Turning this off is for
    testing the kernel layers alone."""
    programs_per_request: int = MAX_BATCH
    """Most programs a worker is sent at once (1 to ``MAX_BATCH``, 8). Its children are forked from one process holding
    all of them, so a program that escapes the language layer can read the others' sources and arguments
    (README, threat model); 1 keeps each program alone with its own, at some throughput (the worker then
    pays its copy-on-write faults once per program instead of once per request: 4-9% fewer CRUXEval
    programs per second, measured)."""
    start_timeout: float = 60.0
    """Seconds to wait for a worker to start."""
    preload: tuple[str, ...] = ("bisect", "collections", "functools", "heapq", "math", "operator")
    """Allowed modules every worker imports once at start, so programs that use them import nothing. Any
    other allowed module (and any codec) is imported by the program's own process when it asks, which
    costs that program milliseconds (measured here: ``re`` ~10 ms, ``statistics`` ~15 ms). Each preloaded
    module makes every fork dearer (a fork copies the page tables of all the worker holds; ``re`` and
    ``string`` add ~0.2 ms to every program), so the default is small modules programs often use, and
    ``()`` is fastest for programs that import nothing."""

    def __post_init__(self) -> None:
        positive = ("timeout", "memory_mb", "max_program_chars", "max_literal_chars", "max_output_chars",
                    "max_depth", "recursion_limit", "start_timeout", "programs_per_request")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"VerifierConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("timeout", "start_timeout"):  # deadlines are computed from them (select, rlimits)
            if not getattr(self, name) <= MAX_SECONDS:
                raise ValueError(
                    f"VerifierConfig.{name} must be at most {MAX_SECONDS} s (a day), got {getattr(self, name)!r}"
                )
        if self.programs_per_request > MAX_BATCH:
            raise ValueError(
                f"VerifierConfig.programs_per_request must be at most {MAX_BATCH}, got {self.programs_per_request!r}"
            )
        if self.memory_mb < 64:
            raise ValueError(
                f"VerifierConfig.memory_mb must be >= 64 (a Python process needs it), got {self.memory_mb}"
            )
        for name, most in (("memory_mb", 1 << 20), ("recursion_limit", 1_000_000)):  # rlimits and C ints
            if getattr(self, name) > most:
                raise ValueError(f"VerifierConfig.{name} must be at most {most}, got {getattr(self, name)!r}")
        if self.workers is not None and not (
            isinstance(self.workers, int) and 1 <= self.workers <= MAX_WORKERS
        ):  # each worker is a process, and each of the two hash-seed pools starts them all up front
            raise ValueError(
                f"VerifierConfig.workers must be None or an int in [1, {MAX_WORKERS}], got {self.workers!r}"
            )
        seeds = self.hash_seeds
        if (
            len(seeds) != 2
            or seeds[0] == seeds[1]
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 32 for x in seeds)
        ):
            raise ValueError(
                f"VerifierConfig.hash_seeds must be two different ints in [0, 2**32) (PYTHONHASHSEED's range), "
                f"got {seeds!r}"
            )
        if self.cache_size < 0:
            raise ValueError(f"VerifierConfig.cache_size must be >= 0, got {self.cache_size}")
        unknown = sorted(set(self.preload) - ALLOWED_MODULES)
        if isinstance(self.preload, str) or unknown:
            raise ValueError(
                f"VerifierConfig.preload must be a tuple of allowed modules; not allowed: {unknown or self.preload!r}"
                f" (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
            )


@dataclass(frozen=True)
class IsolationReport:
    """Which isolation mechanisms the workers have active on this machine.

    Attributes:
        rlimits: Per-program CPU, memory, file-size, open-file and process limits.
        seccomp: The per-program system-call filter (no fork/exec/sockets/signals/writes).
        landlock_abi: Landlock ABI in force (0: none): read-only filesystem, no TCP, scoped signals.
        namespaces: Private user, network, IPC and UTS namespaces, all capabilities dropped.
        unprivileged: Workers run as an unprivileged uid.
        no_new_privs: ``PR_SET_NO_NEW_PRIVS`` set.
        errors: Why a mechanism is missing, as reported by the workers.
    """

    rlimits: bool
    seccomp: bool
    landlock_abi: int
    namespaces: bool
    unprivileged: bool
    no_new_privs: bool
    errors: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        """Whether every mechanism is active."""
        return all((self.rlimits, self.seccomp, self.landlock_abi > 0, self.namespaces, self.unprivileged,
                    self.no_new_privs))  # fmt: skip

    @classmethod
    def from_worker(cls, report: dict[str, Any]) -> IsolationReport:
        """Builds the report from a worker's ready frame."""
        return cls(
            rlimits=bool(report.get("rlimits")),
            seccomp=bool(report.get("seccomp")),
            landlock_abi=int(report.get("landlock", 0) or 0),
            namespaces=bool(report.get("namespaces")),
            unprivileged=bool(report.get("uid_drop")),
            no_new_privs=bool(report.get("no_new_privs")),
            errors=tuple(str(e) for e in report.get("errors", ())),
        )
