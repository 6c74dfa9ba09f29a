"""The verifier's contract: one case per status, legal-but-tricky programs, the checks, bad input."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from populora_env.verifier import (
    STATUSES,
    Execution,
    Verifier,
    VerifierConfig,
    canonical_text,
    outputs_equal,
    parse_args,
    verdicts,
)
from populora_env.verifier import verifier as verifier_module
from populora_env.verifier.prefilter import ALLOWED_MODULES

DOUBLE = "def f(x):\n    return x * 2"

STATUS_CASES = {
    "ok": (DOUBLE, "3"),
    "syntax": ("def f(x):\n    return x +", "1"),
    "forbidden": ("import os\ndef f(x):\n    return os.getcwd()", "1"),
    "timeout": ("def f(x):\n    while True:\n        x += 1", "1"),
    "memory": ("def f(x):\n    return [0] * (10 ** 10)", "1"),
    "runtime": ("def f(x):\n    return 1 // x", "0"),
    "nondeterministic": ("def f(n):\n    return ''.join(set(str(i) for i in range(n)))", "40"),
    "bad_output": ("def f(x):\n    return object()", "1"),
    "bad_input": (DOUBLE, "__import__('os').system('true')"),
}


def test_every_status_has_a_case():
    assert set(STATUS_CASES) == set(STATUSES) == verdicts.KNOWN


def test_a_forged_line_with_an_unknown_status_is_bad_output_and_keeps_the_worker(bare_verifier):
    """A program past the language layer can write to its result pipe; a line with a status the host does
    not know must cost that call a verdict, not the worker (which the host would replace)."""
    program = (
        "import os\ndef f(x):\n    for fd in range(3, 16):\n        try:\n"
        "            os.write(fd, b'pwned\\x1f=1\\x1f\\n')\n        except OSError:\n            pass\n    return x"
    )
    workers = [w.pid for pool in bare_verifier._pools for w in pool]
    assert bare_verifier.run(program, "1").status == "bad_output"
    assert [w.pid for pool in bare_verifier._pools for w in pool] == workers


@pytest.mark.parametrize("status", sorted(STATUS_CASES))
def test_one_case_per_status(verifier, status):
    program, args = STATUS_CASES[status]
    execution = verifier.run(program, args)
    assert execution.status == status, execution
    assert (execution.output is not None) == (status == "ok")
    assert (execution.detail == "") == (status == "ok")


def test_run_returns_canonical_output(verifier):
    assert verifier.run(DOUBLE, "3") == Execution("ok", "6", "")
    assert verifier.run(DOUBLE, "[1, 2]").output == "[1, 2, 1, 2]"


LEGAL = [
    ("def f(s):\n    return s[::-1] + 'é✓'", "'ab'", "'baé✓'"),
    ("def f(n):\n    return 2 ** n", "300", str(2**300)),
    ("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)", "900", "900"),
    ("def f(d):\n    d['z'] = 1\n    d['a'] = 2\n    return d", "{'m': 0}", "{'m': 0, 'z': 1, 'a': 2}"),
    ("def f(x):\n    return x / 3", "1", repr(1 / 3)),
    ("def f(x):\n    return (x.encode(), complex(1, -2), -0.0)", "'hi'", "(b'hi', (1-2j), -0.0)"),
    ("def f(xs):\n    xs.append(len(xs))\n    return xs", "[5, 5]", "[5, 5, 2]"),
    ("def f(x):\n    try:\n        return int('no')\n    except ValueError:\n        return -x", "4", "-4"),
    ("def f(x):\n    return frozenset({3, 1, 2}), set()", "0", "({1, 2, 3}, set())"),
    ("def f(a, b):\n    return a + b", "(1, ), (2, 3)", "(1, 2, 3)"),
    ("def f():\n    return None", "", "None"),
    ("import math\nfrom collections import Counter\ndef f(xs):\n    return math.gcd(*xs), dict(Counter(xs))",
     "[4, 6, 4]", "(2, {4: 2, 6: 1})"),
    # codecs Python imports lazily: the child may not read the installation (uid drop, Landlock)
    ("def f(s):\n    return s.encode('shift_jis'), s.encode('cp1252', 'replace')", "'日本'",
     "(b'\\x93\\xfa\\x96{', b'??')"),
    ("def f(s, b):\n    return s.encode('idna'), s.encode('punycode'), b.decode('koi8_r'), 'ab'.encode('utf-16-le')",
     "'bücher', b'\\xc1\\xc2'", "(b'xn--bcher-kva', b'bcher-kva', 'аб', b'a\\x00b\\x00')"),
]  # fmt: skip


@pytest.mark.parametrize("program,args,expected", LEGAL)
def test_legal_but_tricky_programs_give_exact_outputs(verifier, program, args, expected):
    execution = verifier.run(program, args)
    assert execution.status == "ok", execution
    assert outputs_equal(execution.output, expected)
    assert verifier.check_deduction(program, args, expected)


# One use of every allowed module, imported by the program itself (from the installation, through the
# worker's directory descriptors) or taken from the worker's preloaded modules.
MODULE_USES = {
    "abc": "type(abc.ABC).__name__",
    "array": "array.array('i', [1, 2]).tolist()",
    "bisect": "bisect.bisect([1, 3, 5], 4)",
    "calendar": "calendar.monthrange(2024, 2)",
    "cmath": "cmath.sqrt(-4)",
    "collections": "dict(collections.Counter('abca'))",
    "copy": "copy.deepcopy([[1], [2]])",
    "decimal": "str(decimal.Decimal('1.10') + decimal.Decimal('2.2'))",
    "difflib": "difflib.SequenceMatcher(None, 'abcd', 'bcde').ratio()",
    "enum": "enum.Enum('C', 'A B').B.value",
    "fractions": "str(fractions.Fraction(3, 6))",
    "functools": "functools.reduce(operator.mul, [1, 2, 3, 4])",
    "heapq": "heapq.nsmallest(2, [5, 1, 4])",
    "itertools": "list(itertools.accumulate([1, 2, 3]))",
    "json": "json.dumps({'a': [1, None]})",
    "math": "math.gcd(12, 18)",
    "numbers": "isinstance(3, numbers.Integral)",
    "operator": "operator.itemgetter(1)('ab')",
    "re": "re.findall('[0-9]+', 'a1b22')",
    "statistics": "statistics.median([3, 1, 2])",
    "string": "string.ascii_lowercase[:3]",
    "textwrap": "textwrap.wrap('aa bb cc', 5)",
    "typing": "typing.get_origin(typing.List[int]) is list",
    "unicodedata": "unicodedata.name('é')",
}


@pytest.mark.parametrize("preload", [(), VerifierConfig().preload, tuple(sorted(ALLOWED_MODULES))])
def test_programs_can_use_every_allowed_module_whatever_the_preload(preload):
    assert set(MODULE_USES) == ALLOWED_MODULES
    program = (
        f"import {', '.join(sorted(MODULE_USES))}\ndef f():\n    return [{', '.join(MODULE_USES.values())}]"
    )
    namespace: dict = {}
    exec(program, namespace)  # our own program: the expected values, computed here
    expected = canonical_text(namespace["f"]())
    with Verifier(workers=1, preload=preload) as v:
        assert v.run(program, "") == Execution("ok", expected, "")


def test_workers_hold_only_what_they_need(bare_verifier):
    """Every module the worker holds is copied into each child's page tables: the worker imports the
    preload list and what it needs to serve and fork, not `typing`, `json`, `ast` or the codecs."""
    execution = bare_verifier.run("import sys\ndef f():\n    return sorted(sys.modules)", "")
    assert execution.ok, execution
    held = set(parse_args(execution.output)[0])
    assert set(VerifierConfig().preload) <= held
    assert not held & {"typing", "json", "ast", "dataclasses", "enum", "re", "statistics", "encodings.cp1252"}


def test_each_pool_runs_under_its_configured_hash_seed():
    """The workers were started with -I, which ignores PYTHONHASHSEED: every worker drew a random seed,
    so outputs and determinism verdicts changed from one Verifier (or worker) to the next."""
    value = "[hash('x'), ''.join(set('abcdefgh'))]"
    for seed, other in ((11, 29), (3, 5)):
        env = {"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin:/bin"}
        want = subprocess.run([sys.executable, "-c", f"print({value})"], env=env, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        for _ in range(2):  # fresh workers each time: the same output
            with Verifier(check_determinism=False, hash_seeds=(seed, other), workers=2) as v:
                assert [v.run(f"def f():\n    return {value}", "").output for _ in range(3)] == [want] * 3


def _parities(seed: int, texts: list[str]) -> list[int]:
    """``hash(text) % 2`` of each text under ``PYTHONHASHSEED=seed``, from a fresh interpreter."""
    env = {"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin:/bin"}
    code = f"print([hash(t) % 2 for t in {texts!r}])"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return [int(p) for p in done.stdout.strip()[1:-1].split(",")]


@functools.cache
def _parity_text(first: int, second: int) -> str:
    """A text whose ``hash(text) % 2`` is ``first`` under ``PYTHONHASHSEED=11`` and ``second`` under 29."""
    texts = [f"k{i}" for i in range(64)]
    pairs = zip(texts, _parities(11, texts), _parities(29, texts), strict=True)
    return next(t for t, a, b in pairs if (a, b) == (first, second))


def _record_sends(monkeypatch) -> list[int]:
    """The hash seeds of the requests sent to workers from now on (the list fills as they are sent)."""
    sent: list[int] = []
    send = verifier_module.WorkerHandle.send

    def logged_send(self, message, deadline, max_reply):
        sent.append(self.hash_seed)
        return send(self, message, deadline, max_reply)

    monkeypatch.setattr(verifier_module.WorkerHandle, "send", logged_send)
    return sent


def test_the_second_hash_seed_run_starts_while_the_first_runs(monkeypatch):
    """With its pool and a CPU idle and nothing else to run, a call's second run is sent before the first's
    result is back (a call's latency was both runs one after the other)."""
    events: list[tuple[str, int]] = []
    send, poll_frame = verifier_module.WorkerHandle.send, verifier_module.WorkerHandle.poll_frame

    def logged_send(self, message, deadline, max_reply):
        events.append(("send", self.hash_seed))
        return send(self, message, deadline, max_reply)

    def logged_poll(self):
        frame = poll_frame(self)
        if frame is not None:
            events.append(("reply", self.hash_seed))
        return frame

    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0) as v:
        v._cpus = 2  # (early second runs take idle CPUs only: as on a machine with two)
        monkeypatch.setattr(verifier_module.WorkerHandle, "send", logged_send)
        monkeypatch.setattr(verifier_module.WorkerHandle, "poll_frame", logged_poll)
        assert v.run(DOUBLE, "3").output == "6"
        assert events[:2] == [("send", 11), ("send", 29)] and len(events) == 4, events
        # with no CPU to spare the runs go one after the other: the time-out is wall-clock, and a program
        # that took most of it alone timed out sharing a CPU with its own second run (a review)
        v._cpus = 1
        events.clear()
        assert v.run(DOUBLE, "4").output == "8"
        assert events == [("send", 11), ("reply", 11), ("send", 29), ("reply", 29)], events


def test_an_early_second_run_is_cut_short_when_its_first_run_failed(monkeypatch, caplog):
    """A program failing at once under the first seed and looping under the second: the verdict is the
    first run's failure, and the early second run, whose results for that call are never read, is not
    waited for up to the time-out: its worker stops it and stays (it was replaced, ~150 ms of the dispatch
    loop's time, and a hostile-family test that counts the workers failed now and then); the calls that were
    ok in the first run get their second run as usual."""
    loops_second, never_loops = _parity_text(0, 1), _parity_text(0, 0)
    program = (
        "def f(x, fail):\n    if hash(x) % 2:\n        while True:\n            pass\n"
        "    if fail:\n        raise ValueError(x)\n    return 1\n"
    )
    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0, timeout=30.0) as v:
        v._cpus = 2
        second_pool = v._pools[1][0].pid
        with caplog.at_level(logging.DEBUG, logger="populora_env.verifier"):
            got = v.run_many([(program, f"{loops_second!r}, True"), (program, f"{never_loops!r}, False")])
        assert [(e.status, e.output) for e in got] == [("runtime", None), ("ok", "1")], got
        assert "ValueError" in got[0].detail
        assert v._pools[1][0].pid == second_pool  # the looping run was stopped, not waited for, by its worker
        assert any("cut short" in r.getMessage() for r in caplog.records)
        assert v.run_many([(program, f"{never_loops!r}, False"), (DOUBLE, "4")])[1].output == "8"


def test_a_cut_second_run_keeps_the_results_it_finished(monkeypatch):
    """An early second run cut short during its second call answers for its first: that call is not run a
    third time (one request to the second pool, not two), and both verdicts are right."""
    loops_second, never_loops = _parity_text(0, 1), _parity_text(0, 0)
    # the first run's failing call takes a while (a few hundred ms), so the second run has finished the
    # call before it and is looping when it is cut
    program = (
        "def f(x, fail):\n    if hash(x) % 2:\n        while True:\n            pass\n"
        "    if fail:\n        for _ in range(3_000_000):\n            pass\n        raise ValueError(x)\n"
        "    return 1\n"
    )
    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0, timeout=30.0) as v:
        v._cpus = 2
        second_pool = v._pools[1][0].pid
        sent = _record_sends(monkeypatch)
        got = v.run_many([(program, f"{never_loops!r}, False"), (program, f"{loops_second!r}, True")])
        assert [(e.status, e.output) for e in got] == [("ok", "1"), ("runtime", None)], got
        assert sent == [11, 29], sent
        assert v._pools[1][0].pid == second_pool


def test_an_early_second_run_about_to_finish_an_ok_call_is_not_cut(monkeypatch):
    """The first run's slow ``ok`` call is followed by one that fails at once, and the second run, slower (by
    a quarter: the program loops longer under the second seed, so that a cut at once always comes before it
    finishes), is given twice as long again as it has run before it is cut. It was cut at once, and the slow
    call ran a third time (7 of 15 requests in a review, with the two runs equally slow). With the second run
    slower by half and given as long again as it had run, a busy machine stretched its wall time past that
    now and then (one CI run failed)."""
    slower_second = _parity_text(0, 1)
    program = (
        "def f(x, a):\n    if a < 0:\n        raise ValueError(a)\n"
        "    for _ in range(a * 25_000 * (10 if hash(x) % 2 else 8)):\n        pass\n    return a\n"
    )
    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0, timeout=30.0) as v:
        v._cpus = 2
        sent = _record_sends(monkeypatch)
        for i in range(2):
            sent.clear()
            calls = [f"{slower_second!r}, 30", f"{slower_second!r}, -1"]
            got = v.run_many([(f"{program}# {i}", args) for args in calls])
            assert [(e.status, e.output) for e in got] == [("ok", "30"), ("runtime", None)], got
            assert sent == [11, 29], sent


def test_a_worker_stops_its_request_when_cut_and_ignores_a_late_cut():
    """The worker's side of a cut (an empty frame): a request looping under a 30 s time-out answers at
    once for the calls it finished (none here, of three: the two children still at their gates are sent
    away too), and the worker serves the next request; a cut that arrives after its request was answered
    is skipped, not read as the next request's frame."""
    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0, timeout=30.0) as v:
        worker = v._pools[1][0]

        def request(program: str, calls: list[str]) -> None:
            busy: dict = {}
            v._send(worker, [verifier_module._Task(program, calls, 1, "literal")], busy)

        request("def f(x):\n    while True:\n        pass", ["1", "2", "3"])
        time.sleep(0.3)
        worker.cut()
        assert worker.receive(time.monotonic() + 10) == b""
        request(DOUBLE, ["4"])
        assert worker.receive(time.monotonic() + 10).startswith(b"ok")
        worker.cut()  # late: the request was answered
        request(DOUBLE, ["5"])
        reply = worker.receive(time.monotonic() + 10)
        assert reply.count(b"\n") == 1 and b"10" in reply, reply
        assert v.run(DOUBLE, "6") == Execution("ok", "12", "")


def test_a_verifier_recovers_when_replacement_workers_fail_to_start(monkeypatch):
    """An early second run's worker died, and its replacement and the one started for the first run's
    busy worker both failed to start: the killed handle stayed in its pool, and its descriptor numbers,
    reused by the next worker's pipes, made every later call fail (a review). The call fails; the next
    ones run."""
    send, ready = verifier_module.WorkerHandle.send, verifier_module.WorkerHandle.wait_ready
    state = {"kill": False, "fail": 0}

    def send_then_kill(self, message, deadline, max_reply):
        send(self, message, deadline, max_reply)
        if state["kill"] and self.hash_seed == 29:
            state["kill"] = False
            os.kill(self.pid, 9)

    def failing_start(self, timeout=60.0):
        if state["fail"]:
            state["fail"] -= 1
            self.kill()
            raise verifier_module.WorkerDied("cannot start (injected)")
        return ready(self, timeout)

    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0) as v:
        v._cpus = 2
        monkeypatch.setattr(verifier_module.WorkerHandle, "send", send_then_kill)
        monkeypatch.setattr(verifier_module.WorkerHandle, "wait_ready", failing_start)
        state.update(kill=True, fail=2)
        with pytest.raises(verifier_module.WorkerDied, match="injected"):
            v.run(DOUBLE, "1")
        assert [v.run(DOUBLE, str(i)).output for i in range(2, 5)] == ["4", "6", "8"]


def test_early_second_runs_are_spread_over_the_second_pool(monkeypatch):
    """The second runs started early are the last work there is: they are dealt out over the second pool's
    workers like the end of a queue, not sent as one request that one worker runs one call after another
    while the others wait (with as many workers as calls, each second run has a worker of its own)."""
    jobs: dict[int, list[int]] = {11: [], 29: []}  # programs per request, by pool
    send = verifier_module.WorkerHandle.send

    def counting_send(self, message, deadline, max_reply):
        jobs[self.hash_seed].append(len(message["jobs"]))
        return send(self, message, deadline, max_reply)

    with Verifier(workers=3, hash_seeds=(11, 29), cache_size=0) as v:
        v._cpus = 6  # (early second runs take idle CPUs only: as on a machine with six)
        monkeypatch.setattr(verifier_module.WorkerHandle, "send", counting_send)
        programs = [(f"def f(x):\n    return x * {i}", "2") for i in range(3)]
        assert [e.output for e in v.run_many(programs)] == ["0", "2", "4"]
    assert jobs == {11: [1, 1, 1], 29: [1, 1, 1]}, jobs


def test_a_second_run_started_early_counts_only_where_the_first_was_ok():
    """A call that fails under the first hash seed is that failure, whatever the second run gave (as when
    the second run came only after a first ``ok``); where the first is ``ok``, the two are compared."""
    pick = {(a, b): _parity_text(a, b) for a in (0, 1) for b in (0, 1)}
    program = "def f(x):\n    return 1 // (hash(x) % 2)"
    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0) as v:
        v._cpus = 2  # (early second runs take idle CPUs only: as on a machine with two)
        for _ in range(2):  # the calls one at a time (each second run early), then in one batch
            alone = [v.run(program, repr(pick[key])) for key in sorted(pick)]
            assert [e.status for e in alone] == ["runtime", "runtime", "nondeterministic", "ok"], alone
            together = v.run_many([(program, repr(pick[key])) for key in sorted(pick)])
            assert [e.status for e in together] == [e.status for e in alone], together
        assert "ZeroDivisionError" in alone[1].detail and alone[3].output == "1"


def test_a_second_run_whose_worker_dies_is_run_again(monkeypatch):
    """An early second run lost to its worker's death (here: killed twice, so the retry is lost too) is
    not taken for the program's: the call's second run is made again, as after a first ``ok``."""
    kills = []
    send = verifier_module.WorkerHandle.send

    def send_then_kill(self, message, deadline, max_reply):
        send(self, message, deadline, max_reply)
        if self.hash_seed == 29 and len(kills) < 2:
            kills.append(self.pid)
            os.kill(self.pid, 9)

    with Verifier(workers=1, hash_seeds=(11, 29), cache_size=0) as v:
        v._cpus = 2  # (early second runs take idle CPUs only: as on a machine with two)
        monkeypatch.setattr(verifier_module.WorkerHandle, "send", send_then_kill)
        assert v.run(DOUBLE, "3") == Execution("ok", "6", "")
        assert len(kills) == 2


def test_a_program_with_many_large_outputs_is_split_over_requests(monkeypatch):
    """A worker's reply is one frame, refused over a cap: 1 700 calls of one program returning 10 000
    emoji each overflowed 64 MiB, the worker was replaced twice and every call became a cached
    `runtime`. The calls are now split so that each reply's worst case fits; here the cap is three
    calls' worth."""
    sent: list[int] = []  # calls per request
    send = verifier_module.WorkerHandle.send

    def counting_send(self, message, deadline, max_reply):
        sent.append(sum(len(calls) for _, calls in message["jobs"]))
        return send(self, message, deadline, max_reply)

    with Verifier(workers=1) as v:
        monkeypatch.setattr(
            verifier_module, "MAX_REPLY_BYTES", 3 * verifier_module._line_bytes(v.config.max_output_chars)
        )
        monkeypatch.setattr(verifier_module.WorkerHandle, "send", counting_send)
        program = "def f(i):\n    return 'x' * i"
        executions = v.run_many([(program, str(i)) for i in range(10)])
        assert [e.output for e in executions] == [repr("x" * i) for i in range(10)]
        assert v.check_induction(program, [(str(i), repr("x" * i)) for i in range(11, 20)]) == 1.0
    assert max(sent) == 3 and sum(sent) == 2 * (10 + 9)  # two hash seeds; no request over three calls


def test_a_worker_death_is_not_cached(monkeypatch):
    """A verdict that is the worker's failure (an oversized reply here; the OOM killer, a hang under
    load) says nothing lasting about the program: the next run of the same call runs it again."""
    with Verifier(workers=1, max_output_chars=100_000) as v:
        line_bytes = verifier_module._line_bytes
        monkeypatch.setattr(verifier_module, "_line_bytes", lambda chars: 1)  # every reply "oversized"
        program = "def f(x):\n    return 'x' * x"
        failed = v.run(program, "80000")  # an 80 000-byte reply, over the 64 KiB least cap
        assert failed.status == "runtime" and "oversized frame" in failed.detail, failed
        monkeypatch.setattr(verifier_module, "_line_bytes", line_bytes)
        assert v.run(program, "80000").ok


def test_a_host_holding_many_descriptors_can_verify():
    """select() refuses descriptors >= 1024: a host with that many open (data loaders, sockets) could not
    start a Verifier. Run in a subprocess so this test's descriptors stay few."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200:
        pytest.skip("the hard descriptor limit is under 1 200 here")
    script = (
        "import os, resource\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))\n"
        "held = [os.open('/dev/null', os.O_RDONLY) for _ in range(1100)]\n"
        "from populora_env.verifier import Verifier\n"
        "with Verifier(workers=1) as v:\n"
        "    print(v.run('def f(x):\\n    return x * 2', '3').output)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "6", done.stderr[-2000:]


def test_answer_checks_parse_within_the_configured_limits():
    """With max_depth=80 a 60-deep output is ok, but the checks parsed answers at the default depth 50:
    the program's own output was a wrong answer."""
    program = "def f(n):\n    x = 0\n    for _ in range(n):\n        x = [x]\n    return x"
    with Verifier(workers=1, max_depth=80) as v:
        output = v.run(program, "60").output
        assert output is not None and output.count("[") == 60
        assert v.check_deduction(program, "60", output) and v.check_abduction(program, output, "60")
        assert v.check_induction(program, [("60", output)]) == 1.0


def test_sets_of_strings_render_independently_of_hash_seed(verifier):
    execution = verifier.run("def f(n):\n    return {str(i) for i in range(n)}", "30")
    assert execution.status == "ok"
    assert execution.output == "{" + ", ".join(sorted(repr(str(i)) for i in range(30))) + "}"


def test_check_deduction(verifier):
    assert verifier.check_deduction(DOUBLE, "3", "6")
    assert verifier.check_deduction(DOUBLE, "3", " 6.0 ")  # Python ==, as CRUXEval
    assert verifier.check_deduction(DOUBLE, "3", "\n6\f")  # Python's whitespace around it
    for space in ("\xa0", "\u2028", "\u3000", "\x1c", "\v"):  # str.strip's, which Python refuses
        assert not verifier.check_deduction(DOUBLE, "3", space + "6")
    assert not verifier.check_deduction(DOUBLE, "3", "7")
    assert not verifier.check_deduction(DOUBLE, "3", "__import__('os')")
    assert not verifier.check_deduction(STATUS_CASES["runtime"][0], "0", "None")


def test_check_abduction_accepts_any_input_that_gives_the_output(verifier):
    program = "def f(x):\n    return x % 3"
    assert verifier.check_abduction(program, "1", "1")
    assert verifier.check_abduction(program, "1", "4")
    assert not verifier.check_abduction(program, "1", "5")
    assert not verifier.check_abduction(program, "1", "(lambda: 1)()")


def test_check_induction_scores_the_fraction_of_pairs(verifier):
    answer = "def f(x):\n    return x + 1"
    assert verifier.check_induction(answer, [("1", "2"), ("5", "6"), ("0", "0"), ("3", "9")]) == 0.5
    assert verifier.check_induction("def f(x):\n    return x +", [("1", "2")]) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        verifier.check_induction(answer, [])


def test_run_many_keeps_order_and_shares_nothing_between_programs(verifier):
    programs = [f"def f(x):\n    return x + {i}" for i in range(12)]
    items = [(p, str(j)) for j in range(3) for p in programs]
    results = verifier.run_many(items)
    assert [r.output for r in results] == [str(j + i) for j in range(3) for i in range(12)]


COUNTER = "n = [0]\ndef f(x):\n    n[0] += 1\n    return n[0]"
FAILS_AFTER_COUNTING = (
    "n = [0]\ndef f(x):\n    n[0] += 1\n    if x == 0:\n        raise ValueError\n    return n[0]"
)
MARKS_A_MODULE = "import fractions\ndef f(x):\n    if x == 0:\n        fractions.marker = 1\n    return hasattr(fractions, 'marker')"


def test_calls_of_one_program_are_independent():
    """Calls of the same program share no state: each runs in a child of its own, with fresh module globals
    and imports, so ``run_many`` gives what separate ``run`` calls give."""
    with Verifier(cache_size=0) as v:  # a cache would answer the repeated calls itself
        assert [r.output for r in v.run_many([(COUNTER, "1"), (COUNTER, "2"), (COUNTER, "3")])] == ["1"] * 3
        assert v.check_induction(COUNTER, [("1", "1"), ("2", "1"), ("3", "1")]) == 1.0
        # the determinism re-run repeats only the calls that succeeded: shared state made them differ
        first, second = v.run_many([(FAILS_AFTER_COUNTING, "0"), (FAILS_AFTER_COUNTING, "5")])
        assert (first.status, second.status, second.output) == ("runtime", "ok", "1")
        # a guarded program may not mark a module; the next calls never see the mark either way
        marked = v.run_many([(MARKS_A_MODULE, "0"), (MARKS_A_MODULE, "1"), (MARKS_A_MODULE, "2")])
        assert [(r.status, r.output) for r in marked] == [
            ("forbidden", None),
            ("ok", "False"),
            ("ok", "False"),
        ]


def test_state_left_in_a_preloaded_module_is_not_seen_by_the_next_call():
    """Every call has a child of its own: a change one call makes to a module the worker preloaded is gone
    for the next, so outputs cannot count or see the calls before them. When calls shared their program's
    child, the determinism re-run (in reverse order) caught only some of it: counting the calls before
    one escaped for any output symmetric in the position (a red-team review: ``[x, seen % 2]``). A guarded
    program may not write to a module at all now: shown with the language layer off."""
    counting = (
        "import functools\ndef f(x):\n    try:\n        functools.seen += 1\n    except AttributeError:\n"
        "        functools.seen = 0\n    return [x, functools.seen % 2]"
    )
    marks = (
        "import math\ndef f(x):\n    if x == 'B':\n        math.seen_b = True\n    if x == 'C':\n"
        "        return hasattr(math, 'seen_b')\n    return 0"
    )
    with Verifier(workers=1, cache_size=0) as guarded:
        assert guarded.run(counting, "0").status == "forbidden"
    with Verifier(workers=1, cache_size=0, language_guards=False) as verifier:
        runs = verifier.run_many([(counting, str(i)) for i in range(5)])
        assert [(r.status, r.output) for r in runs] == [("ok", f"[{i}, 0]") for i in range(5)]
        assert [r.output for r in verifier.run_many([(marks, "'A'"), (marks, "'B'"), (marks, "'C'")])] == [
            "0", "0", "False"]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("'x' * 20000", "renders to 20002 characters"),
        ("list(range(20000))", "too many elements"),
        ("10 ** 5000", "integer string conversion"),
        ("float('inf')", "NaN or infinite"),
        ("[1, {'a': (float('nan'),)}]", "NaN or infinite"),
        # a set display cannot be parsed back where a hashable value must be: no answer could match
        ("{frozenset({1, 2})}", "frozenset inside a set or a dict key"),
        ("{frozenset(): 1}", "frozenset inside a set or a dict key"),
        ("{(1, frozenset({2})): 3}", "frozenset inside a set or a dict key"),
    ],
)
def test_oversized_and_non_finite_returns_are_bad_output(verifier, body, detail):
    result = verifier.run(f"def f(x):\n    return {body}", "1")
    assert (result.status, result.output) == ("bad_output", None) and detail in result.detail


def test_bad_types_raise_type_error_naming_the_argument(verifier):
    with pytest.raises(TypeError, match="program"):
        verifier.run(123, "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="args"):
        verifier.run(DOUBLE, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="answer"):
        verifier.check_deduction(DOUBLE, "1", 2)  # type: ignore[arg-type]


def test_oversized_text_is_bad_input(verifier):
    assert verifier.run(DOUBLE + "\n" + "#" * 30_000, "1").status == "bad_input"
    assert verifier.run(DOUBLE, "[" + "1, " * 6_000 + "]").status == "bad_input"
    assert verifier.run(DOUBLE, "[" * 500 + "]" * 500).status == "bad_input"


def test_use_after_close_is_a_clear_error():
    v = Verifier(workers=1)
    v.close()
    v.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        v.run(DOUBLE, "1")


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="timeout"):
        VerifierConfig(timeout=0)
    with pytest.raises(ValueError, match="workers"):
        VerifierConfig(workers=0)
    with pytest.raises(ValueError, match="hash_seeds"):
        VerifierConfig(hash_seeds=(1, 1))
    # values that passed and then failed every call (an rlimit or C int overflow in the child)
    for field, value in (("hash_seeds", (-1, 3)), ("hash_seeds", (1, 1 << 32)), ("memory_mb", 1 << 44),
                         ("recursion_limit", 1 << 31)):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            VerifierConfig(**{field: value})
    with pytest.raises(ValueError, match=r"preload.*'os'"):
        VerifierConfig(preload=("math", "os"))


def test_a_killed_worker_is_replaced_and_its_program_gets_a_verdict(caplog):
    with Verifier(workers=1) as v:
        victim = v._pools[0][0]
        os.kill(victim.pid, 9)
        victim.process.wait()
        assert v.run(DOUBLE, "21") == Execution("ok", "42", "")
        assert v._pools[0][0].pid != victim.pid
        assert v.run(DOUBLE, "5").output == "10"


def test_isolation_report_and_warning_when_degraded(caplog, monkeypatch):
    with Verifier(workers=1) as v:
        assert v.isolation.rlimits
        if sys.platform == "linux":
            assert v.isolation.seccomp, v.isolation.errors  # libseccomp is a documented requirement
    monkeypatch.setattr(verifier_module, "_warned_isolation", False)
    with (
        caplog.at_level(logging.WARNING, logger="populora_env.verifier"),
        Verifier(workers=1, isolate=False) as v,
    ):
        assert not v.isolation.full
        assert v.run(DOUBLE, "2").output == "4"
    with caplog.at_level(logging.WARNING, logger="populora_env.verifier"), Verifier(workers=1, isolate=False):
        pass  # a second degraded verifier in the same process: no second warning
    assert sum("isolation is partial" in r.message for r in caplog.records) == 1


def test_host_literal_parsing_is_guarded():
    assert parse_args("[1, 2], 3") == ([1, 2], 3)
    assert parse_args("(1, 2)") == ((1, 2),)
    assert parse_args("") == ()
    for bad in ["1), g(2", "x=1", "*[1]", "1e999", "float('nan')", "-" * 5000 + "1", "[[[[" * 100]:
        with pytest.raises(ValueError):
            parse_args(bad)
    assert not outputs_equal("[" * 10_000, "[" * 10_000)


def test_literal_verdicts_do_not_depend_on_the_callers_stack(verifier):
    """Parsing runs out of recursion sooner when the caller is deep in its own stack: a valid answer was
    then "not a literal" (and ``canonical_text``'s ``RecursionError`` escaped ``parse_args``). A parse
    that runs out of recursion is run again on a fresh stack; only there is it the text's own doing."""
    nested = "[" * 40 + "1" + "]" * 40
    program = "def f(x):\n    return x"

    def deep(n: int, call):
        return deep(n - 1, call) if n else call()

    here = len(inspect.stack(0))
    depth = sys.getrecursionlimit() - here - 30  # 30 frames left: too few for 40 levels of parsing
    assert deep(depth, lambda: parse_args(nested)) == parse_args(nested)
    assert deep(depth, lambda: outputs_equal(nested, nested))
    assert deep(depth, lambda: verifier.check_deduction(program, nested, nested))
    assert deep(depth, lambda: verifier.check_abduction(program, nested, nested))
    with pytest.raises(ValueError):  # too deep for any stack: still refused, from any depth
        deep(depth, lambda: parse_args("[" * 150 + "]" * 150))


def test_a_syntax_error_is_syntax_with_the_language_guards_off(bare_verifier):
    # Without the host's parse the worker's compile is the first to see it: one verdict per call.
    broken = "def f(x:\n    return x"
    assert [e.status for e in bare_verifier.run_many([(broken, "1"), (broken, "2")])] == ["syntax"] * 2
    assert bare_verifier.run(broken, "1").detail.startswith("SyntaxError")


def test_run_many_sends_programs_in_batches_with_exact_verdicts(monkeypatch):
    sent: list[int] = []
    send = verifier_module.WorkerHandle.send

    def counting_send(self, message, deadline, max_reply):
        sent.append(len(message["jobs"]))
        return send(self, message, deadline, max_reply)

    monkeypatch.setattr(verifier_module.WorkerHandle, "send", counting_send)
    programs = [f"def f(x):\n    return x * {i}" for i in range(40)]
    items = [(p, a) for p in programs for a in ("2", "3")]
    items.append(("def f(x):\n    return 1 // x", "0"))  # a failure in the middle of a batch
    items += [(f"def f(x):\n    return x - {i}", "1") for i in range(5)]
    with Verifier(workers=2) as v:
        results = v.run_many(items)
    assert [(e.status, e.output) for e in results] == (
        [("ok", str(int(a) * i)) for i in range(40) for a in ("2", "3")]
        + [("runtime", None)]
        + [("ok", str(1 - i)) for i in range(5)]
    )
    assert max(sent) == verifier_module.MAX_BATCH and sum(sent) == 46 + 45  # second runs: the 45 ok ones


def test_a_worker_dying_during_a_batch_costs_no_program_its_verdict(caplog):
    slow = "def f(x):\n    n = 0\n    for i in range(10 ** 7):\n        n += i\n    return x"  # ~1 s
    items = [(slow, "0")] + [(f"def f(x):\n    return x + {i}", "1") for i in range(15)]
    with Verifier(workers=1, check_determinism=False, timeout=10.0) as v:
        victim = v._pools[0][0].pid
        killer = threading.Timer(0.15, os.kill, (victim, 9))  # while the slow program runs
        killer.start()
        results = v.run_many(items)
        killer.join()
        assert [e.output for e in results] == ["0"] + [str(1 + i) for i in range(15)]
        assert v._pools[0][0].pid != victim
    assert f"verifier worker {victim} died or hung" in caplog.text


def test_a_host_check_that_raises_mid_run_leaves_the_verifier_usable(monkeypatch):
    real = verifier_module.prefilter

    def failing(program: str):
        if "boom" in program:
            raise RuntimeError("host check failed")
        return real(program)

    monkeypatch.setattr(verifier_module, "prefilter", failing)
    items = [(f"def f(x):\n    return x + {i}", "1") for i in range(30)]
    items.insert(20, ("def f(x):\n    return 'boom'", "1"))
    with Verifier(workers=2) as v:
        with pytest.raises(RuntimeError, match="host check failed"):
            v.run_many(items)
        # no answer of the interrupted call is left in a pipe to be read as the next call's
        assert [e.output for e in v.run_many(items[:20] + items[21:])] == [str(1 + i) for i in range(30)]
        assert v.run(DOUBLE, "4").output == "8"


def test_hostile_programs_in_a_batch_leave_their_neighbours_alone():
    hostile = {
        "timeout": "def f(x):\n    while True:\n        x += 1",
        "memory": "def f(x):\n    return [0] * (10 ** 10)",
        "runtime": "def f(x):\n    raise SystemExit(3)",
    }
    items = [(f"def f(x):\n    return x + {i}", "1") for i in range(6)]
    items += [(program, "1") for program in hostile.values()]
    items += [(f"def f(x):\n    return x - {i}", "1") for i in range(6)]
    with Verifier(workers=1, check_determinism=False, timeout=0.5) as v:
        results = v.run_many(items)
        assert _children_of(v._pools[0][0].pid) == []  # every child reaped, none waiting at its gate
    assert [e.status for e in results] == ["ok"] * 6 + list(hostile) + ["ok"] * 6
    assert [e.output for e in results[:6] + results[9:]] == [str(1 + i) for i in range(6)] + [
        str(1 - i) for i in range(6)
    ]


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or gone meanwhile
        if int(fields[1]) == pid:
            children.append(int(entry))
    return children


def test_an_interrupt_mid_run_leaves_no_answer_for_the_next_call(monkeypatch, caplog):
    # Ctrl-C is not held back until the workers answer; the busy workers are replaced instead, so that
    # their answers (here: as many verdicts as the next call expects) are never read as the next call's.
    # That is what an interrupt is expected to do: no warning (a Ctrl-C of `populora verify` printed one
    # for each worker; an audit).
    real = verifier_module.prefilter

    def interrupting(program: str):
        if "stop" in program:
            raise KeyboardInterrupt
        return real(program)

    monkeypatch.setattr(verifier_module, "prefilter", interrupting)
    slow = "def f(x):\n    n = 0\n    for i in range(10 ** 6):\n        n += i\n    return x + {}"
    first = [(slow.format(i), "1") for i in range(16)] + [("def f(x):\n    return 'stop'", "1")]
    with Verifier(workers=2, check_determinism=False) as v:
        with caplog.at_level(logging.INFO, logger="populora_env.verifier"), pytest.raises(KeyboardInterrupt):
            v.run_many(first)
        replaced = [r for r in caplog.records if "was busy with an interrupted call" in r.getMessage()]
        assert replaced and all(r.levelno == logging.INFO for r in replaced)
        second = [(f"def f(x):\n    return x * {i}", "3") for i in range(16)]
        assert [e.output for e in v.run_many(second)] == [str(3 * i) for i in range(16)]


def test_programs_run_as_plain_python_not_under_the_verifiers_future_imports(verifier):
    # The verifier's modules use `from __future__ import annotations`; compile() would pass it on.
    undefined = verifier.run("def f(x: undefined_name):\n    return x", "1")
    assert undefined.status == "runtime" and "NameError" in undefined.detail
    assert verifier.run("def f(x: int) -> str:\n    return str(x)", "1").output == "'1'"


def test_the_cache_is_bounded_in_characters_as_well_as_entries(monkeypatch):
    from populora_env.verifier import verifier as verifier_module

    monkeypatch.setattr(verifier_module, "CACHE_MAX_CHARS", 2_000)
    programs = [f"def f(x):\n    return x + {i}  # {'.' * 300}" for i in range(20)]
    with Verifier(workers=1) as v:
        assert [r.output for r in v.run_many([(p, "1") for p in programs])] == [str(1 + i) for i in range(20)]
        held = list(v._cache)
        assert 0 < len(held) <= 2_000 // 300 and v._cache_chars <= 2_000
        assert v._cache_chars == sum(len(p) + len(a) + len(r.output or "") + len(r.detail)
                                     for (p, a, _), r in v._cache.items())  # fmt: skip
        assert held[-1][0] == programs[-1]  # the most recent verdicts are the ones kept
    # a text with one non-ASCII character is stored at up to 4 bytes a character: it counts so
    wide = Execution("ok", "'" + "\U0001f600" * 10 + "'", "")
    assert verifier_module._entry_chars(("ab", "1", "literal"), wide) == 2 + 1 + 4 * 12


def test_the_two_pools_allocate_program_objects_at_other_offsets(bare_verifier):
    """Objects hashed by address (a set of plain instances) iterate in an order the hash seed does not
    change; the pools' workers hold different numbers of small blocks, so the same allocation lands at
    another offset in each pool and such outputs differ between the two runs. (Without it, the offset
    within a page was the same in both, and a set of instances passed as deterministic about half the
    time in workers that had served other programs.)"""
    execution = bare_verifier.run("def f(x):\n    return id(object()) % 4096", "1")
    assert execution.status == "nondeterministic", execution


def test_objects_of_every_size_class_land_at_other_offsets_in_the_two_pools():
    """Address-ordered outputs of objects the heap shift missed: class objects (over 512 bytes, glibc's)
    and iterators (48 bytes: no shifted block of that size class) came out alike in both pools, so the
    same program passed as ``ok`` with outputs that changed with what its worker had served before.

    The shift makes the two pools differ likely, not certainly (a set of a few objects can iterate alike
    under two offsets): counted over sets of 3 to 12 objects, fresh and after other programs, at least a
    third of the runs must be ``nondeterministic``. Measured for the classes: 18 of 30 in one build of the
    worker, 28 to 30 of 30 in 25 builds padded with a constant (the heap moves with any change to the code), 0 without the
    shift (the two pools' addresses agree). A single case asserted alone (8 classes) passed or failed with
    unrelated code changes."""
    classes = (
        "def f(n):\n    cs = []\n    for i in range(n):\n        class A:\n            k = i\n"
        "        cs.append(A)\n    return [c.k for c in set(cs)]"
    )
    iterators = "def f(n):\n    its = [iter([k]) for k in range(n)]\n    return [next(it) for it in set(its)]"
    filler = [(f"def f(x):\n    return [x] * {i} + {list(range(i * 7))}", "1") for i in range(1, 8)]
    with Verifier(workers=1, cache_size=0) as v:
        for program in (classes, iterators):
            caught = []
            for round_ in range(3):
                if round_:
                    v.run_many(filler)  # other programs served by the same workers in between
                caught += [v.run(program, str(n)).status == "nondeterministic" for n in range(3, 13)]
            assert sum(caught) >= len(caught) / 3, (program, caught)


def test_when_the_collector_runs_does_not_depend_on_what_the_worker_served_before():
    """A finalizer on a cycle runs when the cyclic collector does: with the worker's generation counts
    inherited, a program counting allocations until then got another count from a fresh worker than from
    a used one, in every position of a batch (a red-team review); each child now starts the collector
    from zero, so the count is the program's own (in each pool: the second pool's children start it 101
    containers on, which makes such a count `nondeterministic` under the two-seed check, red-team round 46;
    one pool is checked here)."""
    counts_until_collected = (
        "def f(x):\n    box = []\n    def gen(cell):\n        try:\n            yield 1\n        finally:\n"
        "            box.append(1)\n    cell = []\n    g = gen(cell)\n    next(g)\n    cell.append(g)\n"
        "    del cell, g\n    keep = []\n    while not box and len(keep) < 5000:\n        keep.append([])\n"
        "    return len(keep)\n"
    )
    filler = [(f"def f(x):\n    return [x] * {i} + {list(range(i * 7))}", "1") for i in range(1, 16)]
    with Verifier(workers=1, cache_size=0, check_determinism=False) as v:
        fresh = v.run(counts_until_collected, "0")
        assert fresh.status == "ok" and int(fresh.output) < 5000, fresh
        for served in (3, 15):
            v.run_many(filler[:served])
            later = v.run_many(
                [*filler[:served], (counts_until_collected, "1"), (counts_until_collected, "2")]
            )
            assert [r.output for r in later[served:]] == [fresh.output] * 2, served


@pytest.mark.parametrize("programs_per_request", [None, 1])
def test_an_output_does_not_depend_on_the_programs_of_its_request(programs_per_request):
    """Compiling interns a program's names and identifier-like constants, and a program can test whether a
    string it builds was interned already (``namedtuple`` interns its field names; ``is``): with the
    worker holding a request's compiled programs as it forked, a program learnt what the others held and
    its output changed with its batch, alike in both pools (red-team reviews, round 48 among them). The
    worker keeps compiled code as marshal bytes; each child loads its own."""
    spy = (
        "import collections\ndef f(x):\n    s = ''.join([x, 'xw', 'sec', 'ret'])\n"
        "    P = collections.namedtuple('P', [s])\n    return [k for k in dir(P) if k == s][0] is s\n"
    )
    victim = "def f(x):\n    zqxwsecret = x\n    return 'zqxwsecret'\n"
    filler = [(f"def f(x):\n    return {i}", "1") for i in range(20)]  # a long queue: full requests
    config = {} if programs_per_request is None else {"programs_per_request": programs_per_request}
    with Verifier(workers=1, cache_size=0, **config) as v:
        assert v.run(spy, "'zq'") == Execution("ok", "True", "")
        batched = v.run_many([(victim, "1"), (spy, "'zq'"), *filler, (spy + "# 2\n", "'zq'")])
        assert [batched[1], batched[-1]] == [Execution("ok", "True", "")] * 2


_AS_PYTHON_BUILDS_THEM = [
    # a frozenset constant that marshal gives back in another order (entries 7 and 15 collide): the
    # program keeps its text and its child compiles it (red-team round 49)
    ("def f():\n    return [x for x in {7, 15}]", ""),
    ("def f():\n    return [[x for x in {7, 15}], [y for y in {0, 8, 16, 3}]]", ""),
    # code nested too deeply for marshal ("object too deeply nested to marshal" was a `syntax` verdict)
    (
        "def f():\n    g = "
        + "lambda: " * 1000
        + "7\n    for _ in range(1000):\n        g = g()\n    return g",
        "",
    ),
    ("def f(s):\n    return list(s)", "{7, 15}"),  # two elements: added in source order
    ("def f(s):\n    return list(s)", "{7, 9, 15}"),  # three or more: a frozenset constant, then an update
    ("def f(s, t):\n    return [list(s), list(t[0])]", "{15, 7}, [{0, 8, 16, 3}]"),
    # equal constants of one compiled call are one object
    ("def f(a, b, c, d):\n    return [a is b, c is d]", "1000, 1000, 'a b', 'a b'"),
    ("def f(a, b):\n    return [a[0] is b, a is a]", "(2.5, 'x y'), 2.5"),
    ("def f(a, b):\n    return a is b", "(1, (2, 3)), (1, (2, 3))"),
]


@pytest.mark.parametrize("expression_args", [False, True])
@pytest.mark.parametrize(("program", "args"), _AS_PYTHON_BUILDS_THEM)
def test_values_that_depend_on_how_python_builds_a_call_come_out_as_python_s(
    verifier, program, args, expression_args
):
    """Arguments parsed as literals were sent to the worker as ready values: sets rebuilt in another order
    (``{7, 15}`` listed ``[7, 15]``, Python ``[15, 7]``), equal constants separate objects; and compiled
    code kept as marshal bytes re-ordered a frozenset constant (round 48's fix; red-team round 49). The
    expected values are plain Python's here: the program run, its call compiled on its own (ints hash alike
    under every seed, so their order is the same in the verifier's two pools)."""
    namespace: dict = {}
    exec(program, namespace)
    expected = repr(eval(f"f({args})", namespace))
    assert verifier.run(program, args, expression_args=expression_args) == Execution("ok", expected, "")


@pytest.mark.parametrize("expression_args", [False, True])
def test_argument_strings_are_interned_as_a_compiled_call_s_constants(verifier, expression_args):
    """``f('abc')`` written out interns its constant, as the program's own ``'abc'``: Python says
    ``a is b``. Arguments parsed as literals came un-interned (``False``; expression mode said ``True``),
    an ``ok`` output no run of the program gives (red-team round 48). Strings of other characters are not
    interned by Python either."""
    same = "def f(a, l, c):\n    b = 'abc'\n    d = 'a b'\n    return [a is b, l[0] is b, c is d]"
    args = "'abc', ['abc'], 'a b'"
    assert verifier.run(same, args, expression_args=expression_args) == Execution(
        "ok", "[True, True, False]", ""
    )
    nested = (
        "def f(d):\n    k = 'key_1'\n"
        "    return [x is k for x in [*d, *d.values(), *d['t'], *d['t'][1]] if x == k]"
    )
    nested_args = "{'key_1': 'key_1', 't': ('key_1', {'key_1'})}"
    assert verifier.run(nested, nested_args, expression_args=expression_args) == Execution(
        "ok", "[True, True, True, True]", ""
    )


def test_the_memory_a_program_gets_does_not_depend_on_what_the_worker_served_before():
    """A program's address space is capped at its process's size when forked plus ``memory_mb``: with an
    absolute cap it got what its worker had not taken, less after the worker had compiled a large program,
    and a program that counted how much it could allocate before ``MemoryError`` told a fresh worker from a
    used one, alike in both pools (a red-team review). What is left is the allocator's rounding: the room
    free in the heap a child inherits moves the count by bytes to a few pages (one seed here: the two pools'
    heaps are shifted on purpose, so a count to the byte differs between them and is ``nondeterministic``)."""
    probe = (
        "def f(unit):\n    lo, hi = 0, 1 << 30\n    while hi - lo > unit:\n        mid = (lo + hi) // 2\n"
        "        try:\n            b = bytes(mid)\n            del b\n            lo = mid\n"
        "        except MemoryError:\n            hi = mid\n    return lo // unit\n"
    )
    big = (
        "def f(x):\n    d = {"
        + ", ".join(f"'k{i}': [{i}, 'v{i}']" for i in range(20_000))
        + "}\n    return len(d)\n"
    )
    config = {"workers": 1, "cache_size": 0, "max_program_chars": len(big), "check_determinism": False}
    with Verifier(**config) as v:
        fresh = v.run(probe, "1")
        assert fresh.status == "ok", fresh
        assert v.run(big, "1") == Execution("ok", "20000", "")  # the worker grows compiling it
        used = v.run(probe + "# again\n", "1")
        assert used.status == "ok", used
    # The allocator's room moves with the worker's heap layout: 103 KiB here once one more function was
    # defined in _child (2026-12-02), where the bug this guards against took the worker's whole growth from
    # compiling `big`, 55-66 MiB of address space (a scratch measurement)
    assert abs(int(used.output) - int(fresh.output)) <= 256 << 10, (fresh, used)
    assert abs(int(fresh.output) - (512 << 20)) < 8 << 20  # memory_mb's 512 MiB, give or take the heap's room


def test_dicts_equal_under_both_hash_seeds_are_deterministic(verifier):
    """A dict built in set order has another insertion order under each hash seed but is the same value
    (answers are compared with ``==``): ``ok``, with the first run's text; a list in set order is not."""
    counts = verifier.run("def f(s):\n    return {c: s.count(c) for c in set(s)}", "'hello world'")
    assert counts.status == "ok", counts
    assert verifier.check_deduction(
        "def f(s):\n    return {c: s.count(c) for c in set(s)}",
        "'hello world'",
        "{'h': 1, 'e': 1, 'l': 3, 'o': 2, ' ': 1, 'w': 1, 'r': 1, 'd': 1}",
    )
    listed = verifier.run("def f(s):\n    return [c for c in set(s)]", "'hello world'")
    assert listed.status == "nondeterministic", listed


def test_str_subclasses_are_read_as_plain_strings(verifier):
    """``numpy.str_`` (what arrays hand out) went to the worker as its UCS-4 bytes (a ``syntax`` verdict,
    cached under the equal plain string); another subclass could not be sent at all. Each is copied to a
    plain ``str`` without running any of its methods."""
    import numpy as np

    class Hostile(str):
        def __str__(self):
            raise AssertionError("never called")

        def __eq__(self, other):
            raise AssertionError("never called")

        __hash__ = str.__hash__

    program, args = "def f(x):\n    return x * 2", "3"
    for kind in (np.str_, Hostile):
        assert verifier.run(kind(program), kind(args)) == Execution("ok", "6", "")
        assert verifier.run(program, kind(args), expression_args=True) == Execution("ok", "6", "")
        assert verifier.check_deduction(kind(program), kind(args), kind("6"))
        assert verifier.check_abduction(program, kind("6"), kind("3"))
        assert verifier.check_induction(kind(program), [(kind("3"), kind("6"))]) == 1.0
    assert verifier.run(program, args) == Execution("ok", "6", "")
    with pytest.raises(TypeError, match="args must be str"):
        verifier.run(program, b"3")  # type: ignore[arg-type]


def test_verdicts_do_not_depend_on_the_host_s_warning_filters(verifier, capfd):
    """Python warns of some text it parses (``"\\d"``, ``0x1for``): with warnings turned into errors on the host
    (``-W error``) the pre-filter and the answer parser raised ``SyntaxError`` where the workers, which ignore
    warnings, ran the program, and the pre-filter cached that verdict; under the default filters every parse
    printed a warning on the host's stderr, which a player's text repeats at will (red-team round 33)."""
    import warnings

    from populora_env.verifier.literals import parse_literal
    from populora_env.verifier.prefilter import prefilter

    program = "def f(x):\n    return [0x1for x in (1, 2)]  # round 33\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prefilter(program).status == "ok"
        assert verifier.run(program, "0") == Execution("ok", "[31]", "")
        assert verifier.check_deduction("def f(x):\n    return x", "'\\\\d'", "'\\d'")
        filters = list(warnings.filters)
    assert filters[0][0] == "error"  # the caller's filters, back after each parse
    capfd.readouterr()
    for _ in range(3):
        assert parse_literal("'\\d'") == "\\d"
        assert prefilter(f"def f(x):\n    return [0x1for x in x]  # {_}\n").status == "ok"
    assert capfd.readouterr().err == ""
