"""The :class:`Verifier`: runs untrusted programs in isolated children and checks answers against them."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .literals import LiteralError, outputs_equal, parse_args, parse_literal
from .pool import WorkerDied, WorkerHandle, WorkerHung, readable
from .prefilter import ALLOWED_MODULES, compile_guard, prefilter, prefilter_expression
from .records import MAX_BATCH, MAX_WORKERS, Execution, IsolationReport, VerifierConfig
from .sandbox import build_seccomp_programs
from .verdicts import parse_line

__all__ = ["Verifier"]

logger = logging.getLogger("populora_env.verifier")
_warned_isolation = False


@dataclass
class _Task:
    """A program and the argument texts it is called with, for one hash-seed pool (a request to a worker
    carries up to ``MAX_BATCH`` of them)."""

    program: str
    calls: list[str]
    pool: int
    mode: str
    results: list[list[Any]] | None = None
    attempts: int = 0
    alone: bool = False  # sent in a request of its own (after a worker died on a batch holding it)
    lost: bool = False  # its results are its worker's death or hang, not the program's: never cached
    # a first run's second run, started before the first's results came back (``Verifier._dispatch``), and
    # for that second run, the first run it checks
    twin: _Task | None = None
    first: _Task | None = None
    # an early second run's: when it was sent, when to stop it (its first run made part of it needless), and
    # whether its worker was told to stop it (its results are then those of its first calls, maybe none)
    started: float = 0.0
    cut_at: float | None = None
    cut: bool = False


EARLY_RUN_GRACE = 0.1
"""Least seconds an early second run (see ``Verifier._dispatch``) may go on after its first run came back with
a call that failed (it may go on ``EARLY_RUN_GRACE_FACTOR`` times as long again as it has run, at least this):
then its worker is told to stop it, and the calls that were ``ok`` and that it had not finished run again as
usual. A second run behind its first, about to finish an ``ok`` call, is not stopped for nothing (a review:
cut at once, a slow ``ok`` call before a fast failing one ran a third time in 7 of 15 requests; given only as
long again as it had run, a second run a quarter slower in CPU was cut now and then on a busy machine, 1 in 12
with a CPU-bound process beside it, none in 20 with twice), and a program failing at once under one seed and
looping under the other costs about what it did before.
"""

EARLY_RUN_GRACE_FACTOR = 2.0
"""How many times as long again as it has run an early second run may go on before a cut (see
``EARLY_RUN_GRACE``)."""


MAX_REPLY_BYTES = 64 << 20
"""Most bytes a request's reply may take at worst (every call at ``max_output_chars``): a program's calls
are split over requests, and requests hold fewer programs, to stay under it. The worker's reply is one frame
read whole, and a frame over the request's worst case is a broken worker."""

CACHE_MAX_CHARS = 1 << 27
"""Most characters (programs, argument texts, outputs, details; a non-ASCII text counts 4 a character, its
storage at worst) the verdict cache holds, whatever ``cache_size`` allows: 65 536 entries of 20 000-character
programs would otherwise be gigabytes."""


class Verifier:
    """Executes ``f(<args>)`` for untrusted programs and checks deduction, abduction and induction answers.

    Each program runs in a fresh child forked from a long-lived, isolated worker process (see the README's
    threat model); with ``check_determinism`` every program runs in two worker pools started with different
    hash seeds. Arguments, outputs and answers are plain literals, never executed; comparison is Python
    ``==`` on parsed plain values. Verdicts are cached by ``(program, args)``.

    Example:
        >>> with Verifier() as v:
        ...     v.run("def f(x):\\n    return x * 2", "3")
        Execution(status='ok', output='6', detail='')

    Args:
        config: Options; keyword arguments override its fields (``Verifier(timeout=1.0)``).
    """

    def __init__(self, config: VerifierConfig | None = None, **overrides: Any) -> None:
        if config is None:
            config = VerifierConfig(**overrides)
        elif overrides:
            config = replace(config, **overrides)
        self.config = config
        self._lock = threading.RLock()
        self._cache: OrderedDict[tuple[str, str, str], Execution] = OrderedDict()  # (program, args, mode)
        self._cache_chars = 0  # characters held by the cache's keys and verdicts
        self._closed = False
        n = config.workers or min(os.cpu_count() or 1, MAX_WORKERS)  # (a given count is checked against it)
        seeds = config.hash_seeds if config.check_determinism else config.hash_seeds[:1]
        self._worker_config: dict[str, Any] = {
            "isolate": config.isolate,
            "allowed_modules": sorted(ALLOWED_MODULES),
            "preload": list(config.preload),
            "language_guards": config.language_guards,
        }
        if config.isolate:
            programs, error = build_seccomp_programs()
            self._worker_config["seccomp"] = [bpf.hex() for bpf in programs] if programs else None
            self._worker_config["seccomp_error"] = error
        self._pools: list[list[WorkerHandle]] = [[] for _ in seeds]
        self._seeds = list(seeds)
        # the CPUs this process may run on: early second runs only use idle ones (``_dispatch``)
        self._cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        try:
            for index, (pool, seed) in enumerate(zip(self._pools, seeds)):
                pool.extend(WorkerHandle(seed, self._pool_config(index)) for _ in range(n))
            for pool in self._pools:
                for worker in pool:
                    worker.wait_ready(config.start_timeout)
        except BaseException:
            self.close()
            raise
        self.isolation = IsolationReport.from_worker(self._pools[0][0].report)
        self._warn_once()

    # ------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Stops all worker processes; later calls raise ``RuntimeError``. Safe to call twice."""
        with self._lock:
            self._closed = True
            for pool in self._pools:
                for worker in pool:
                    worker.close()
                pool.clear()

    def _warn_once(self) -> None:
        global _warned_isolation
        if (not self.isolation.full or self.isolation.errors) and not _warned_isolation:
            _warned_isolation = True
            logger.warning(
                "verifier isolation is %s on this machine (%s): %s",
                "full, with problems" if self.isolation.full else "partial",
                ", ".join(f"{k}={v}" for k, v in self.isolation.__dict__.items() if k != "errors"),
                "; ".join(self.isolation.errors) or "no reason given",
            )

    # ------------------------------------------------------------------------------------ running
    def run(self, program: str, args: str, *, expression_args: bool = False) -> Execution:
        """Runs ``f(<args>)`` once (twice with different hash seeds when checking determinism).

        Args:
            program: Python source defining a top-level ``def f``.
            args: The text of the argument list, e.g. ``"[1, 2], 3"`` for two arguments.
            expression_args: Treat ``args`` as Python expressions evaluated inside the sandbox, in the
                program's namespace, for datasets whose inputs are not all literals (CRUXEval has
                ``dict(a=1)``, ``'x'.upper()``, lambdas). Never use it for answers: answers are literals.

        Returns:
            The verdict.

        Raises:
            TypeError: ``program`` or ``args`` is not a ``str``.
            RuntimeError: The verifier is closed.
        """
        return self.run_many([(program, args)], expression_args=expression_args)[0]

    def literalize_args(self, program: str, expression: str) -> Execution:
        """Evaluates an argument-list expression in the sandbox and returns its canonical literal text.

        ``literalize_args(p, "dict(a=1), 'x'.upper()").output == "{'a': 1}, 'X'"``; inputs that are not
        plain data (a lambda, a range) give ``bad_output``. ``f`` is defined but not called.
        """
        return self.literalize_many([(program, expression)])[0]

    def literalize_many(self, items: Sequence[tuple[str, str]]) -> list[Execution]:
        """:meth:`literalize_args` for many ``(program, expression)`` pairs, spread over the workers."""
        return self._run_mode(items, "literalize")

    def run_many(self, items: Sequence[tuple[str, str]], *, expression_args: bool = False) -> list[Execution]:
        """Runs many ``(program, args)`` pairs spread over the workers; verdicts come back in order.

        Every call runs in a fresh child process of its own: ``run_many`` gives what separate ``run`` calls give.
        """
        return self._run_mode(items, "expression" if expression_args else "literal")

    def _run_mode(self, items: Sequence[tuple[str, str]], mode: str) -> list[Execution]:
        items = list(items)
        for i, item in enumerate(items):
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"items[{i}] must be a (program, args) tuple, got {type(item).__name__}")
            items[i] = (_require_str("program", item[0]), _require_str("args", item[1]))
        with self._lock:
            if self._closed:
                raise RuntimeError("this Verifier is closed; create a new one")
            known: list[Execution | None] = [self._cached(p, a, mode) for p, a in items]
            pending: dict[str, dict[str, None]] = {}  # program -> its distinct argument texts, in order
            for (program, args), verdict in zip(items, known):
                if verdict is None:
                    pending.setdefault(program, {})[args] = None
            todo = {program: list(calls) for program, calls in pending.items()}
            fresh = self._execute(todo, mode) if todo else {}
            return [v if v is not None else fresh[(p, a)] for (p, a), v in zip(items, known)]

    def _cached(self, program: str, args: str, mode: str) -> Execution | None:
        cached = self._cache.get((program, args, mode))
        if cached is not None:
            self._cache.move_to_end((program, args, mode))
        return cached

    def _precheck(self, program: str, args: str, mode: str) -> Execution | None:
        """The verdict of the host's static checks, or ``None`` when the call is to be run."""
        cfg = self.config
        if len(program) > cfg.max_program_chars:
            return Execution(
                "bad_input", None, f"program is {len(program)} characters, over {cfg.max_program_chars}"
            )
        static = prefilter(program) if cfg.language_guards else compile_guard(program)
        if static.status != "ok":
            return Execution(static.status, None, static.detail)
        if mode == "literal":  # the worker compiles the text, checked here to be literals only
            try:
                parse_args(args, max_chars=cfg.max_literal_chars, max_depth=cfg.max_depth)
            except LiteralError as e:
                return Execution("bad_input", None, str(e))
            return None
        if len(args) > cfg.max_literal_chars:
            return Execution(
                "bad_input", None, f"args is {len(args)} characters, over {cfg.max_literal_chars}"
            )
        checked = prefilter_expression(args) if cfg.language_guards else None
        if checked is not None and checked.status != "ok":
            return Execution("bad_input" if checked.status == "syntax" else "forbidden", None, checked.detail)
        return None

    def _execute(self, todo: dict[str, list[str]], mode: str) -> dict[tuple[str, str], Execution]:
        """Checks and runs every pending call under the first hash seed and re-runs the successful ones
        under the second: a call that already failed is invalid whatever the seed, so it costs one run, not
        two, unless the second pool and a CPU were idle (its run then started early, see ``_dispatch``, and
        is cut short after a grace). The host's static checks of a program are made while the workers run the
        programs before it, and a program's second run is queued as soon as its first one is back."""
        fresh: dict[tuple[str, str], Execution] = {}
        runs: dict[tuple[str, str], list[list[Any]]] = {}

        def first_runs() -> Iterator[_Task]:
            for program, calls in todo.items():
                to_run = []
                for args in calls:
                    verdict = self._precheck(program, args, mode)
                    if verdict is None:
                        to_run.append(args)
                    else:
                        fresh[(program, args)] = verdict
                for start in range(0, len(to_run), per_request):  # a reply stays under MAX_REPLY_BYTES
                    yield _Task(program, to_run[start : start + per_request], 0, mode)

        lost: set[tuple[str, str]] = set()

        def finished(task: _Task) -> _Task | None:
            first = task.first or task
            second = first.twin
            if second is not None and (first.results is None or second.results is None):
                return None  # a run started early and the run it checks: the one back last takes both
            results = first.results or []
            for args, result in zip(first.calls, results):
                runs.setdefault((first.program, args), []).append(result)
                if first.lost:
                    lost.add((first.program, args))
            if first.pool + 1 < len(self._pools):
                ok = [result[0] == "ok" for result in results]
                # an early second run counts for the calls ok in the first pool only, as if run after them;
                # one its worker's death ended is made again, and so are the calls a cut left out
                done = 0
                if second is not None and not second.lost:
                    done = len(second.results or [])
                    for args, good, result in zip(second.calls, ok, second.results or []):
                        if good:
                            runs[(first.program, args)].append(result)
                again = [args for args, good in zip(first.calls[done:], ok[done:]) if good]
                if again:
                    return _Task(first.program, again, first.pool + 1, mode)
            return None

        # a request's calls, at most: its reply's worst case (each call's line at max_output_chars)
        per_request = max(1, MAX_REPLY_BYTES // _line_bytes(self.config.max_output_chars))
        self._dispatch(first_runs(), finished, per_request)
        for key, results in runs.items():
            # literal outputs agree when their values are equal (the answers' own comparison): a dict built
            # in set order is the same dict under both seeds, in another insertion order
            same = self._equal if mode != "literalize" else None
            verdict = self._parsed_back(_combine(results, self._seeds, same), mode)
            fresh[key] = verdict
            if key not in lost:  # a worker's death or hang says nothing lasting about the program
                self._cache_put((*key, mode), verdict)
        return fresh

    def _parsed_back(self, verdict: Execution, mode: str) -> Execution:
        """An ``ok`` verdict whose output does not parse back as a literal (an argument list in
        ``literalize`` mode) is ``bad_output``: the child renders only literals, so such text was written
        by the program itself (a forged line on its result pipe, or an int past the digit limit it
        raised), and no answer could ever equal it."""
        if verdict.status != "ok" or verdict.output is None:
            return verdict
        parse = parse_args if mode == "literalize" else parse_literal
        try:
            parse(verdict.output, max_chars=self.config.max_output_chars, max_depth=self.config.max_depth)
        except LiteralError as error:
            return Execution(
                "bad_output", None, f"the output does not parse back as a literal: {error}"[:200]
            )
        return verdict

    def _cache_put(self, key: tuple[str, str, str], verdict: Execution) -> None:
        if self.config.cache_size == 0:
            return
        old = self._cache.pop(key, None)
        if old is not None:
            self._cache_chars -= _entry_chars(key, old)
        self._cache[key] = verdict
        self._cache_chars += _entry_chars(key, verdict)
        while len(self._cache) > self.config.cache_size or self._cache_chars > CACHE_MAX_CHARS:
            self._cache_chars -= _entry_chars(*self._cache.popitem(last=False))

    def _dispatch(
        self, source: Iterator[_Task], finished: Callable[[_Task], _Task | None], max_calls: int
    ) -> None:
        """Feeds tasks to idle workers of their pool, a few programs per request, until every task has
        results. Tasks come from ``source`` (drawn as workers need them) and from ``finished``, called on
        each task with results, which may return a follow-up task. A request carries at most
        ``max_calls`` calls (one task's, whatever their number: tasks are split to fit)."""
        n_pools = len(self._pools)
        most = self.config.programs_per_request
        queue: list[list[_Task]] = [[] for _ in range(n_pools)]
        busy: dict[int, tuple[WorkerHandle, list[_Task]]] = {}  # out_fd -> (worker, its batch)
        idle = [list(pool) for pool in self._pools]
        drained = False

        def draw(count: int) -> None:
            nonlocal drained
            while not drained and len(queue[0]) < count:
                task = next(source, None)
                if task is None:
                    drained = True
                else:
                    queue[0].append(task)

        def in_flight_alone(task: _Task) -> bool:  # whether ``task`` is a request of its own, in flight
            return any(len(b) == 1 and b[0] is task for _, b in busy.values())

        def settle(task: _Task) -> None:  # a task with results: its follow-up, if any, is queued
            follow = finished(task)
            if follow is not None:
                queue[follow.pool].append(follow)

        def coming(p: int) -> bool:  # whether more tasks may still join queue[p]
            # (a task in flight whose second run started early brings none: that run is queued already)
            return (
                not drained
                or any(queue[:p])
                or any(t.pool < p and t.twin is None for _, batch in busy.values() for t in batch)
            )

        try:
            while True:
                for p in range(n_pools):
                    if p and idle[p] and drained and not any(queue[: p + 1]) and len(busy) < self._cpus:
                        # Nothing else to run in this pool before its tasks come back from the one before:
                        # their runs here start now, while they run there, not after (the determinism
                        # check's two runs at once), each in a request of its own, on as many workers as
                        # there are idle CPUs: the time-out is wall-clock, and runs sharing a CPU timed out
                        # where one after the other they did not (a review). What such a run does for calls
                        # that fail there is never read (and it is cut short, see EARLY_RUN_GRACE).
                        spare = min(len(idle[p]), self._cpus - len(busy))
                        early = [t for _, b in busy.values() for t in b if t.pool == p - 1 and t.twin is None]
                        for task in early[:spare]:
                            task.twin = _Task(
                                task.program,
                                list(task.calls),
                                p,
                                task.mode,
                                first=task,
                                started=time.monotonic(),
                            )
                            self._send(idle[p].pop(), [task.twin], busy)
                    while idle[p]:
                        if p == 0:
                            draw(most)
                        if not queue[p]:
                            break
                        batch = self._take(queue[p], len(self._pools[p]), coming(p), max_calls, most)
                        self._send(idle[p].pop(), batch, busy)
                if not busy:
                    if drained and not any(queue):
                        return
                    continue
                # with checks left to make, make some while the workers run (then look again at once)
                spare = not drained and len(queue[0]) < most * len(self._pools[0])
                deadline = min(min(w.busy_until or 0.0, b[0].cut_at or math.inf) for w, b in busy.values())
                wait = 0.0 if spare else max(0.0, deadline - time.monotonic())
                ready = readable(list(busy), wait)
                if spare and not ready:
                    draw(len(queue[0]) + 1)
                    continue
                now = time.monotonic()
                for fd, (worker, batch) in list(busy.items()):
                    # (an early second run to cut is always a request of its own: see where cut_at is set)
                    if fd not in ready and len(batch) == 1 and (batch[0].cut_at or math.inf) <= now:
                        batch[0].cut, batch[0].cut_at = True, None
                        logger.debug("verifier worker %d: early second run cut short", worker.pid)
                        worker.cut()  # (it answers soon, for the calls it finished)
                        continue
                    if fd not in ready and (worker.busy_until or 0.0) > now:
                        continue
                    pool = batch[0].pool
                    try:
                        if fd not in ready:
                            raise WorkerHung(f"verifier worker {worker.pid} missed its deadline")
                        payload = worker.poll_frame()
                        if payload is None:
                            continue
                        n_calls = sum(len(t.calls) for t in batch)
                        # (a cut request answers for the calls it finished: the first ones, maybe none)
                        results = _checked_results(payload, n_calls, cut=len(batch) == 1 and batch[0].cut)
                        for task in batch:
                            task.results, results = results[: len(task.calls)], results[len(task.calls) :]
                        done = batch
                    except WorkerDied as e:
                        worker = self._replace(worker, pool)
                        done = _after_death(batch, e, queue[pool])
                    del busy[fd]
                    idle[pool].append(worker)
                    for task in done:
                        second = task.twin
                        if (
                            second is not None
                            and second.results is None
                            and not second.cut
                            and in_flight_alone(second)
                            and not all(result[0] == "ok" for result in task.results or [])
                        ):
                            # Its first run failed for some call: what the second run does there is never
                            # read (and a program failing at once under one seed and looping under the
                            # other would hold the worker up to the time-out), so it is stopped after a grace
                            # (see EARLY_RUN_GRACE); the calls ok in the first run that it had not finished
                            # then run again as usual.
                            second.cut_at = now + max(
                                EARLY_RUN_GRACE, EARLY_RUN_GRACE_FACTOR * (now - second.started)
                            )
                        settle(task)
        except BaseException:
            # Interrupted (Ctrl-C, a host check that raised, a worker that cannot start): the busy workers'
            # answers would be read as the next call's, so they are replaced now.
            self._abandon(busy)
            raise

    def _abandon(self, busy: dict[int, tuple[WorkerHandle, list[_Task]]]) -> None:
        for worker, batch in list(busy.values()):
            try:
                # (INFO: what an interrupt is expected to do; a Ctrl-C of `populora verify` printed a warning
                # for each worker; an audit)
                self._replace(worker, batch[0].pool, "was busy with an interrupted call", logging.INFO)
            except BaseException:  # a worker that cannot start now fails the next call, clearly
                worker.kill()
        busy.clear()

    @staticmethod
    def _take(
        queue: list[_Task], workers: int, coming: bool, max_calls: int, most: int = MAX_BATCH
    ) -> list[_Task]:
        """The next request's tasks: up to ``most`` holding up to ``max_calls`` calls (at least one
        task); when no more are ``coming``, fewer as the queue runs short so that every worker of the pool
        keeps getting work; a task marked ``alone`` by itself."""
        if queue[0].alone:
            return [queue.pop(0)]
        size = most if coming else max(1, min(most, len(queue) // (2 * workers)))
        batch: list[_Task] = []
        calls = 0
        while queue and len(batch) < size and not queue[0].alone:
            if batch and calls + len(queue[0].calls) > max_calls:
                break
            calls += len(queue[0].calls)
            batch.append(queue.pop(0))
        return batch

    def _send(
        self, worker: WorkerHandle, batch: list[_Task], busy: dict[int, tuple[WorkerHandle, list[_Task]]]
    ) -> None:
        cfg = self.config
        jobs = []
        for task in batch:  # (literal argument texts were checked in _precheck: literals only)
            jobs.append((task.program, list(task.calls)))
        request = {
            "jobs": jobs, "timeout": cfg.timeout, "memory_mb": cfg.memory_mb,
            "max_output": cfg.max_output_chars, "max_depth": cfg.max_depth, "recursion_limit": cfg.recursion_limit,
            "guards": cfg.language_guards,
            "mode": batch[0].mode,
        }  # fmt: skip
        # The worker enforces each call's wall time itself; this deadline only catches a stuck worker.
        n_calls = sum(len(task.calls) for task in batch)
        deadline = time.monotonic() + cfg.timeout * n_calls * 1.5 + 10.0 * len(batch)
        largest = n_calls * _line_bytes(cfg.max_output_chars)  # the reply's worst case
        busy[worker.out_fd] = (worker, batch)  # before sending: an interrupted send leaves it abandoned
        try:
            worker.send(request, deadline, largest)
        except WorkerDied:
            del busy[worker.out_fd]
            worker = self._replace(worker, batch[0].pool)
            busy[worker.out_fd] = (worker, batch)
            worker.send(request, deadline, largest)

    def _pool_config(self, pool: int) -> dict[str, Any]:
        """The workers' config for a pool: ``heap_shift`` makes each pool's children allocate at other
        addresses (see ``_worker.Worker``)."""
        return {**self._worker_config, "heap_shift": pool}

    def _replace(
        self, worker: WorkerHandle, pool: int, why: str = "died or hung", level: int = logging.WARNING
    ) -> WorkerHandle:
        worker.kill()
        logger.log(level, "verifier worker %d %s; starting a replacement", worker.pid, why)
        fresh = WorkerHandle(self._seeds[pool], self._pool_config(pool))
        fresh.wait_ready(self.config.start_timeout)
        members = self._pools[pool]
        members[members.index(worker)] = fresh
        return fresh

    # ------------------------------------------------------------------------------------ checks
    def check_deduction(self, program: str, args: str, answer: str) -> bool:
        """Whether ``answer`` (literal text) equals ``f(<args>)``; ``False`` if the program fails."""
        answer = _require_str("answer", answer)
        execution = self.run(program, args)
        return execution.ok and self._equal(execution.output or "", answer)

    def check_abduction(self, program: str, output: str, answer: str) -> bool:
        """Whether ``f(<answer>)`` equals ``output``; any argument list that produces it counts."""
        output = _require_str("output", output)
        execution = self.run(program, answer)
        return execution.ok and self._equal(execution.output or "", output)

    def check_induction(self, answer_program: str, pairs: Sequence[tuple[str, str]]) -> float:
        """The fraction of ``(args, output)`` pairs that ``answer_program`` reproduces."""
        pairs = list(pairs)
        if not pairs:
            raise ValueError("check_induction needs at least one (args, output) pair")
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"pairs[{i}] must be an (args, output) tuple of str")
            pairs[i] = (pair[0], _require_str(f"pairs[{i}] output", pair[1]))
        executions = self.run_many([(answer_program, args) for args, _ in pairs])
        hits = sum(e.ok and self._equal(e.output or "", out) for e, (_, out) in zip(executions, pairs))
        return hits / len(pairs)

    def _equal(self, output: str, expected: str) -> bool:
        """``outputs_equal`` within this verifier's limits: any output it returns ``ok`` parses (up to
        ``max_output_chars`` and ``max_depth``), and so does an answer within them."""
        cfg = self.config
        return outputs_equal(
            output,
            expected,
            max_chars=max(cfg.max_literal_chars, cfg.max_output_chars),
            max_depth=cfg.max_depth,
        )


def _require_str(name: str, value: object) -> str:
    """``value`` as an exact ``str``. A subclass (``numpy.str_``, a user's class) is copied to a plain
    ``str`` without running any of its methods: ``marshal`` would send ``numpy.str_`` as its UCS-4 bytes
    and refuse other subclasses, and the cache would key a verdict by an object that only compares equal.

    Raises:
        TypeError: ``value`` is not a ``str``; the message names ``name``.
    """
    if type(value) is str:
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, got {type(value).__name__}")
    return str.__str__(value)  # str's own method: an exact copy of the characters


def _after_death(batch: list[_Task], error: WorkerDied, queue: list[_Task]) -> list[_Task]:
    """Deals out a batch whose worker died or hung: returns the tasks that got a verdict, queues the others.

    The programs of a batch go back one per request, as if never sent; a program alone gets one retry on a
    fresh worker, then the worker's failure as its verdict (a hang at once: ``timeout``). An early second run
    being cut short, or to be (always a request of its own), is back with no results: the calls it was
    needed for run again as usual.
    """
    if batch[0].cut or batch[0].cut_at is not None:  # (not run again: its first run failed)
        batch[0].results = []
        return batch
    if len(batch) > 1:
        for task in reversed(batch):
            task.alone = True
            queue.insert(0, task)
        return []
    task = batch[0]
    task.attempts += 1
    hung = isinstance(error, WorkerHung)
    if task.attempts < 2 and not hung:
        queue.insert(0, task)
        return []
    task.results = [["timeout" if hung else "runtime", None, str(error)]] * len(task.calls)
    task.lost = True
    return [task]


def _line_bytes(max_output_chars: int) -> int:
    """Most bytes of one verdict line as the worker passes it on: its cap on what one child writes (the
    output at 4 UTF-8 bytes a character, a detail, status and separators within 4096), plus the newline."""
    return 4 * max_output_chars + 4096 + 1


def _checked_results(payload: bytes, n: int, cut: bool = False) -> list[list[Any]]:
    """The ``n`` results of a request's reply (of its first calls, maybe none, if the request was ``cut``)."""
    lines = payload.split(b"\n")
    if (len(lines) > n + 1 if cut else len(lines) != n + 1) or lines[-1]:
        raise WorkerDied("verifier worker answered with the wrong number of results")
    results = [parse_line(line) for line in lines[:-1]]  # None also for a status outside STATUSES
    if None in results:
        raise WorkerDied("verifier worker answered out of protocol")
    return results  # type: ignore[return-value]


def _entry_chars(key: tuple[str, str, str], verdict: Execution) -> int:
    """An entry's size in ASCII characters: a text with any other character is stored at up to 4 bytes
    each (CPython's widest form), so it counts 4 a character (``isascii`` reads a flag: O(1))."""
    return sum(
        len(t) * (1 if t.isascii() else 4) for t in (key[0], key[1], verdict.output or "", verdict.detail)
    )


def _combine(
    runs: list[list[Any]], seeds: list[int], same: Callable[[str, str], bool] | None = None
) -> Execution:
    """One verdict from the runs under different hash seeds: the first run's, if every run agrees with it.

    Args:
        same: Whether two ``ok`` outputs agree when their texts differ (``None``: only equal texts do).
    """
    first = runs[0]
    for other, seed in zip(runs[1:], seeds[1:]):
        if (other[0], other[1]) != (first[0], first[1]) and not (
            same is not None
            and first[0] == other[0] == "ok"
            and isinstance(first[1], str)
            and isinstance(other[1], str)
            and same(first[1], other[1])
        ):
            if "timeout" in (first[0], other[0]):
                return Execution("timeout", None, "timed out under one of the two hash seeds")
            return Execution(
                "nondeterministic", None,
                f"hash seed {seeds[0]}: {first[0]} {str(first[1] or first[2])[:60]!r}; "
                f"hash seed {seed}: {other[0]} {str(other[1] or other[2])[:60]!r}",
            )  # fmt: skip
    return Execution(first[0], first[1], first[2])
