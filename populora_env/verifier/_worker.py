"""Verifier worker: a long-lived, isolated process that forks one fresh child per program.

Started by the host as ``python -I -B _worker.py CONFIG_JSON`` with a chosen ``PYTHONHASHSEED`` (the script's
folder is put first on ``sys.path``, so this process never imports the heavy ``populora_env`` package, torch or
pettingzoo). It pre-imports the modules programs may use, isolates itself
(see ``sandbox.py``; its own seccomp filter last) and then serves requests framed as a 4-byte big-endian
length plus UTF-8 JSON on stdin/stdout:

    request  {"program": str, "calls": [args_text, ...], "timeout": s, "memory_mb": n}
    response {"results": [[status, output, detail], ...]}

The first frame it writes is its isolation report.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import struct
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `python -I` does not add it

import _child
import sandbox
from prefilter import ALLOWED_MODULES


def read_exact(fd: int, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send(fd: int, message: Any) -> None:
    data = json.dumps(message).encode()
    payload = struct.pack(">I", len(data)) + data
    while payload:
        payload = payload[os.write(fd, payload) :]


class Worker:
    """Serves requests; one child process per program, killed with its process group on time-out."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        for name in sorted(ALLOWED_MODULES):
            importlib.import_module(name)  # children need no file access to import these
        _preload_codecs()
        isolate = bool(config.get("isolate", True))
        # The host compiled the filters (see sandbox.build_seccomp_programs); hex text in the config.
        programs = tuple(bytes.fromhex(h) for h in config["seccomp"]) if config.get("seccomp") else None
        seccomp_error = config.get("seccomp_error") if isolate else "isolation disabled"
        if programs is None and not seccomp_error:
            seccomp_error = "the worker was given no seccomp filter"
        self.devnull = os.open("/dev/null", os.O_RDWR)
        self.report = sandbox.isolate_worker() if isolate else {"errors": []}
        self.bpf: sandbox.SeccompProgram | None = None  # the child's own filter, on top of the worker's
        if programs is not None:
            try:
                sandbox.load_seccomp_program(programs[0])
                self.bpf = sandbox.SeccompProgram(programs[1])
            except OSError as e:
                seccomp_error = f"cannot load the seccomp filter: {e}"
        self.report["seccomp"] = self.bpf is not None
        if seccomp_error:
            self.report["errors"].append(seccomp_error)
        self.report["rlimits"] = True
        gc.freeze()  # children then leave the preloaded objects alone instead of copying their pages

    def handle(self, request: dict[str, Any]) -> list[list[Any]]:
        calls: list[str] = request["calls"]
        results: list[list[Any]] = []
        while len(results) < len(calls):
            results.extend(self._run_child(request["program"], calls[len(results) :], request))
        return results

    def _run_child(self, program: str, calls: list[str], request: dict[str, Any]) -> list[list[Any]]:
        """Runs a child over ``calls``; returns at least one verdict (more if the child lasted)."""
        timeout = float(request["timeout"])
        mode = str(request.get("mode", "literal"))
        prepared = _child.prepare(
            program,
            calls,
            mode=mode,
            max_depth=int(request["max_depth"]),
            allowed=ALLOWED_MODULES if request.get("guards", True) else None,
        )
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # ---------------------------------------------------------------- the child
            try:
                self._enter_child(
                    write_fd, read_fd, cpu_seconds=int(timeout * len(calls)) + 1, request=request
                )
            except BaseException as e:
                os.write(write_fd, _child.setup_failed(e) * len(calls))
                os._exit(0)
            try:
                _child.run_program(
                    prepared, write_fd, max_output=int(request["max_output"]),
                    max_depth=int(request["max_depth"]), mode=mode,
                )  # fmt: skip
            finally:
                os._exit(0)
        os.close(write_fd)
        try:
            os.setpgid(pid, pid)  # the child does the same; whoever is first wins the race
        except OSError:
            pass
        try:
            return self._collect(pid, read_fd, len(calls), timeout, int(request["max_output"]))
        finally:
            os.close(read_fd)

    def _enter_child(self, write_fd: int, read_fd: int, *, cpu_seconds: int, request: dict[str, Any]) -> None:
        os.setpgid(0, 0)
        sandbox.die_with_parent()
        os.close(read_fd)
        for fd in (0, 1, 2):
            os.dup2(self.devnull, fd)
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, 1 << 16)
        # SIGINT stays ignored as in the worker: nothing can send it to a child (its own process group in
        # the worker's session, no terminal; seccomp stops kill() of other processes), and resetting the
        # handler here cost each child ~20 copy-on-write page faults.
        _child.set_recursion_limit(int(request["recursion_limit"]))
        sandbox.apply_child_limits(cpu_seconds, int(request["memory_mb"]) << 20)
        if self.bpf is not None:
            self.bpf.load()

    def _collect(self, pid: int, fd: int, n_calls: int, timeout: float, max_output: int) -> list[list[Any]]:
        results: list[list[Any]] = []
        buffer = b""
        cap = 4 * max_output + 4096
        deadline = time.monotonic() + timeout
        verdict: list[Any] | None = None
        while len(results) < n_calls:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                verdict = ["timeout", None, f"no result within {timeout:g} s (wall clock)"]
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer and len(results) < n_calls:
                line, buffer = buffer.split(b"\n", 1)
                results.append(_parse_line(line))
                deadline = time.monotonic() + timeout  # each call gets its own wall-clock budget
            if len(buffer) > cap:
                verdict = ["bad_output", None, "the child wrote more than the output cap"]
                break
        if len(results) == n_calls and verdict is None:
            _, status = os.waitpid(pid, 0)
            return results
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        if verdict is None:
            verdict = _death_verdict(status)
        return [*results, verdict]


def _preload_codecs() -> None:
    """Imports every codec module now: after the uid drop the Python installation may be unreadable
    (e.g. under /root), and ``'x'.encode('shift_jis')`` imports its codec lazily."""
    import encodings
    import pkgutil

    for module in pkgutil.iter_modules(encodings.__path__):
        try:
            importlib.import_module(f"encodings.{module.name}")
        except Exception:
            pass  # Windows-only codecs (mbcs, oem) do not import here


def _parse_line(line: bytes) -> list[Any]:
    parsed = _child.parse_line(line)
    return parsed if parsed is not None else ["bad_output", None, "malformed result line from the child"]


def _kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(OSError):
            target()


def _death_verdict(status: int) -> list[Any]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return ["timeout", None, f"CPU time limit reached ({signal.Signals(sig).name})"]
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return ["runtime", None, f"the program crashed the process ({name})"]
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return ["runtime", None, f"the program ended its process (exit code {code}) before returning"]


def main() -> None:
    config = json.loads(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host's Ctrl-C is the host's to handle
    worker = Worker(config)
    send(1, {"ready": True, "report": worker.report, "pid": os.getpid()})
    while True:
        try:
            (size,) = struct.unpack(">I", read_exact(0, 4))
            request = json.loads(read_exact(0, size))
        except EOFError:
            return
        send(1, {"results": worker.handle(request)})


if __name__ == "__main__":
    main()
