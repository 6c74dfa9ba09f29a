"""Verifier worker: a long-lived, isolated process that forks one fresh child per call.

Started by the host as ``python -s -S -B _worker.py CONFIG`` with a chosen ``PYTHONHASHSEED`` in an environment
of its own (the script's folder is put first on ``sys.path``, so this process never imports the heavy
``populora_env`` package, torch or pettingzoo). It isolates itself (see ``sandbox.py``; its own seccomp filter last) and then serves requests,
each a frame of a 4-byte big-endian length and a payload, on stdin/stdout:

    request   marshal of {"jobs": [(program, [call, ...]), ...], "mode": str, "timeout": s, "memory_mb": n, ...}
    response  one verdict line per call of every job, in order (``verdicts.py``), concatenated
    cut       an empty frame, sent while a request runs: its child is killed and the calls not done yet are
              left out of the response (their lines are missing, not failed); one that arrives after the
              response was written is read before the next request and ignored

``CONFIG`` is the hex of a marshalled dict. The first frame the worker writes is its isolation report, as
the ``repr`` of a dict of plain literals. The host writes every marshal payload; nothing a program can
influence reaches the host as anything but verdict lines.

**Small on purpose.** A fork copies the page-table entries of every anonymous page and mapping of this
process, the child's exit tears them down again, and the child copies each shared page it writes to: a
fork and exit of this process costs about 60 microseconds per MB it holds and 2 per mapping (measured
here: 1.2-1.3 ms with the 24 allowed modules and all codecs preloaded, 10.9 MB and 197 mappings; 0.65 ms for
the bare interpreter). So the worker imports only what it needs to serve and fork (no ``json``, ``signal``,
``struct``, ``typing`` or ``dataclasses``), and programs import what they use themselves, from the
installation, in their own child: see :func:`_imports_through_fds` for how they reach it after the uid
drop.
"""

from __future__ import annotations

import _signal  # `signal` imports `enum`; the built-in module has all the worker needs
import gc
import marshal
import os
import select
import sys
from time import monotonic  # bound before the child's clock guard wraps time's (_child._guard_clocks)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # first (python also put it first: see below)

import _child
import sandbox
import verdicts

TYPE_CHECKING = False  # `typing` stays out of the worker (see above)
if TYPE_CHECKING:
    from typing import Any

_SHIFT_SIZES = tuple(range(2, 480, 16))  # bytes objects of every small-object size class from 48 to 512 bytes
_GATED = 8  # children forked in a row, each waiting at its gate (``Worker.handle``)
_COLLECTOR_SHIFT = 101  # containers a shifted pool's child holds before its program runs (`_start_child`)

_SIGNAL_NAMES = {
    getattr(_signal, name): name for name in dir(_signal) if name.startswith("SIG") and "_" not in name
}


def read_exact(fd: int, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send(fd: int, payload: bytes) -> None:
    data = len(payload).to_bytes(4, "big") + payload
    while data:
        data = data[os.write(fd, data) :]


class Worker:
    """Serves requests; one child process per program, killed with its process group on time-out."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.allowed = frozenset(config["allowed_modules"])
        isolate = bool(config.get("isolate", True))
        for name in config.get("preload", ()):
            __import__(name)  # the host checked that each is allowed
        # The compiler imports unicodedata for the first non-ASCII identifier it meets (NFKC): imported now,
        # a worker's modules do not depend on the programs it compiled (the two pools' children would differ)
        __import__("unicodedata")
        self.keep_fds, imports_error = _imports_through_fds(self.allowed)
        # The host compiled the filters (see sandbox.build_seccomp_programs); hex text in the config.
        programs = tuple(bytes.fromhex(h) for h in config["seccomp"]) if config.get("seccomp") else None
        seccomp_error = config.get("seccomp_error") if isolate else "isolation disabled"
        if programs is None and not seccomp_error:
            seccomp_error = "the worker was given no seccomp filter"
        self.devnull = os.open("/dev/null", os.O_RDWR)
        size = sandbox.address_space_bytes()  # before Landlock hides /proc
        # kept open to read this process's size before each request (Landlock checks paths when opened)
        self.statm = sandbox.open_statm()
        self.base = 0  # this process's address space when the request's children are forked (`handle`)
        self.cut = False  # the host cut the request short (see the module's doc): no more calls of it run
        self.report = sandbox.isolate_worker() if isolate else {"errors": []}
        if imports_error is None and self.keep_fds:
            imports_error = _check_import_fds(self.keep_fds)
        self.report["imports"] = "installation" if imports_error is None else "preloaded"
        if imports_error:
            self.report["errors"].append(imports_error)
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
        # A pool's workers keep `heap_shift` more blocks of every small-object allocator size class than the
        # first pool's (16 to 512 bytes: an object, a float, bytes of 2 to 466; `bytes(0)` and `bytes(1)`
        # are shared singletons) and of a few of glibc's (larger objects: classes, big containers), so that
        # a program's objects (those not taken from a type's own free list: instances, iterators,
        # functions, classes) land at other offsets in each pool: an output that depends on their
        # addresses (the order of a set of objects hashed by address) is then far more likely to differ
        # between the determinism check's two runs, as it would between machines.
        shift = int(config.get("heap_shift", 0))
        sizes = (*_SHIFT_SIZES, 600, 1100, 2100, 4200)
        self._held = [v for _ in range(shift) for v in (object(), 0.5 + shift, *(bytes(n) for n in sizes))]
        # no program class derives from types.GenericAlias (see there; after the preloaded modules' own
        # subclass of it, collections.abc's),
        # nor from super: its own attribute lookup ignores a subclass's namespace, so a program's subclass
        # passed the checks of private names and special methods with names it held itself and handed out
        # the standard library's (red-team round 27: object.__new__, typing.List's __init__)
        # (and the subclasses of them made before: collections.abc's _CallableGenericAlias, a program's subclass
        # of which relayed __dict__ to a module for the UserDict copy, red-team round 30, a full escape)
        generic_alias = type(list[int])
        for builtin in (generic_alias, *sandbox.subclasses(generic_alias), super, *sandbox.subclasses(super)):
            closed = sandbox.close_to_subclasses(builtin)
            if closed:
                self.report["errors"].append(closed)
        # nor, called from Python, over an origin that is not a class (a module's globals copied into a
        # standard object's __dict__ by functools.update_wrapper, red-team round 32)
        origins = sandbox.require_class_origins(generic_alias)
        if origins:
            self.report["errors"].append(origins)
        routed = sandbox.route_class_creation(_child.check_class, _child.class_made)
        if routed:
            self.report["errors"].append(routed)
        _child.install_frame_guard()  # the language layer's run-time half: no frames for guarded programs
        _child.install_module_guard()  # (a module's attributes change only as it is imported)
        # (a class's special methods and descriptors run in frames of the program's: _child._runs_in_a_frame)
        stores = sandbox.route_class_stores(_child.check_class_store)
        if stores:
            self.report["errors"].append(stores)
        _child.install_copy_guard()  # (the standard library imports copy lazily too, past the guarded import)
        if config.get("language_guards", True):  # (the modules behave as usual for unguarded programs)
            self.report["errors"].extend(_child.freeze_standard_classes())
        self._warm_up()
        gc.freeze()  # children then leave the worker's objects alone instead of copying their pages
        if isolate and not sandbox.limit_worker_memory(size):
            self.report["errors"].append("cannot cap the worker's own memory (no /proc/self/statm)")

    def _warm_up(self) -> None:
        """Runs the children's code path here, on a program of ours, until CPython 3.11 has specialised
        its bytecode (the adaptive interpreter rewrites a function's instructions in place over its first
        runs) and filled its type and attribute caches: each child then reads those pages instead of
        copying them."""
        values = "1, -2.5, 'a', b'b', None, True, [1], (1, 2), {'k': 1}, {1, 2}, frozenset({'x'}), 1j"
        for mode, calls in (
            ("literal", ["1", "'s', [1.5], {'k': (1, 2)}, {1, 2, 3}, set()"]),
            ("expression", [values]),
            ("literalize", [values]),
        ):
            prepared = _child.prepare("def f(*a):\n    return a", calls, allowed=self.allowed)
            for _ in range(16):
                _child.run_program(prepared, self.devnull, max_output=10_000, max_depth=50, mode=mode)
                gc.enable()  # each call stops the collector as its program's code ends (`_child._call`)
        _child.disarm_frame_guard()  # a guarded warm-up call left it on: the worker itself reads no frames

    def handle(self, request: dict[str, Any]) -> bytes:
        """Runs every call of every job of a request, each in a child of its own, one after another.

        One child per call, not per program: calls of one program that shared a child shared the state a
        call left in a module the worker had imported (``functools.seen = n``), so an output could count
        the calls before it, which the determinism re-run cannot see for every order (a red-team review).

        After a fork every page this process writes costs it a page fault (a copy while a child lives),
        so the writes are bunched: all programs and argument lists of the request are compiled first (a
        compile writes a hundred-odd pages; each is kept as ``marshal`` bytes, so that no child finds
        another program's or call's names among the interned strings, ``_child.Compiled``), then up to
        ``_GATED`` children are forked in a row, each waiting at its gate, fully isolated, until the worker
        opens it; only then does its program run, alone, under its wall-clock limit. Serving the children
        in turn then costs the worker its faults about once per request instead of once per program
        (measured here, worker page faults per CRUXEval program: ~150 one program at a time, ~100 with the
        compiles bunched, ~60 with the children forked in a row too; compiling each program and argument list
        just before its child's fork instead cost ~10% of the programs per second, the argument lists alone
        ~4%, in scratch splits of CPU time by process: the compiler's writes after a fork are faults).
        """
        allowed = self.allowed if request.get("guards", True) else None
        jobs = [_child.prepare(program, calls, allowed=allowed) for program, calls in request["jobs"]]
        units = [job.call(index) for job in jobs for index in range(len(job.args))]
        # A shifted pool's worker holds one more block of every small size class, and a class object's, for
        # the request (the extra blocks it took at its start are lost in its history), while the other pool's
        # makes and drops the same: its children take those very blocks, the shifted pool's the next. (A class
        # is freed by the collection below: it is a cycle.)
        shifted = [
            object(), 0.5 + len(self._held), sandbox.unrecorded_class("Shift"), *(bytes(n) for n in _SHIFT_SIZES)
        ]  # fmt: skip
        if not self._held:
            shifted.clear()
        # Once per request, so that each child's own collection (`_start_child`) finds little to free: a
        # full collection empties the free lists of tuples, lists, dicts and floats, ~50 page faults in
        # every child when they are full (measured here), a few here.
        gc.collect()
        # A program's memory is `memory_mb` on top of the process it is forked as: an absolute cap left it
        # what this worker had not taken, less after a large program had been compiled, and a program that
        # counted the allocations it could make before MemoryError told a fresh worker from a used one (a
        # red-team review).
        self.base = sandbox.statm_bytes(self.statm)
        self.cut = False
        lines: list[bytes] = []
        for start in range(0, len(units), _GATED):
            if self.cut:
                break
            started = [self._start_child(unit, request) for unit in units[start : start + _GATED]]
            for child in started:
                lines.extend(self._finish_child(child, request))
        shifted.clear()
        return b"".join(lines)

    def _start_child(self, prepared: _child.Prepared, request: dict[str, Any]) -> tuple[int, int, int]:
        """Forks the child for ``prepared``'s one call; it waits, isolated, until ``_finish_child`` lets it
        run. Returns ``(pid, result read end, gate write end)``."""
        timeout = float(request["timeout"])
        mode = str(request.get("mode", "literal"))
        read_fd, write_fd = os.pipe()
        gate_read, gate_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # ---------------------------------------------------------------- the child
            try:
                self._enter_child(write_fd, read_fd, gate_read, cpu_seconds=int(timeout) + 1, request=request)
            except BaseException as e:
                os.write(write_fd, _child.setup_failed(e))
                os._exit(0)
            try:
                if not os.read(gate_read, 1):
                    os._exit(0)  # the worker closed the gate without opening it
                os.close(gate_read)
                # In a shifted pool two more of the smallest blocks and a class object's, here: the worker's
                # own allocations before the fork can use up its extra ones (`id(object()) % 4096` of a fresh
                # verifier's first program came out alike in both pools); taken before the collector's reset,
                # which they would otherwise shift
                held = (object(), object(), type("Shift", (), {})) if self._held else ()
                # The worker's objects out of the collector's way (no pages touched), then a full collection of
                # nothing: every generation count and the long-lived tallies at zero, the free lists empty
                # (the worker emptied them before forking, see `handle`). When the collector runs, and so when a
                # program's cycles and their finalizers go, is then the program's own doing, not that of what
                # the worker served before (a finalizer's timing told a fresh worker from a used one: a
                # red-team review).
                gc.freeze()
                gc.collect()
                # and in a shifted pool, the collector's count starts past zero: an output that depends on
                # when the collector first runs (how many containers a loop makes before a cycle's finalizer
                # fires) is this build's and this code path's, not one a student can work out, and now
                # differs between the determinism check's two runs (red-team round 46)
                counted: list[list[Any]] = [[] for _ in range(_COLLECTOR_SHIFT)] if self._held else []
                _child.run_program(
                    prepared, write_fd, max_output=int(request["max_output"]),
                    max_depth=int(request["max_depth"]), mode=mode,
                )  # fmt: skip
                del held, counted
            finally:
                os._exit(0)
        os.close(write_fd)
        os.close(gate_read)
        try:
            os.setpgid(pid, pid)  # the child does the same; whoever is first wins the race
        except OSError:
            pass
        return pid, read_fd, gate_write

    def _finish_child(self, child: tuple[int, int, int], request: dict[str, Any]) -> list[bytes]:
        """Opens the child's gate and collects its call's verdict line (a line of this worker's own if the
        child dies or lasts too long); the child is reaped, killed first if it must be."""
        pid, read_fd, gate_write = child
        try:
            if self.cut:  # its gate is closed unopened: the child exits without running its program
                os.close(gate_write)
                _kill_group(pid)
                os.waitpid(pid, 0)
                return []
            try:
                os.write(gate_write, b"g")
            except OSError:
                pass  # the child is gone already: its pipe tells how
            os.close(gate_write)
            return self._collect(pid, read_fd, 1, float(request["timeout"]), int(request["max_output"]))
        finally:
            os.close(read_fd)

    def _enter_child(
        self, write_fd: int, read_fd: int, gate_fd: int, *, cpu_seconds: int, request: dict[str, Any]
    ) -> None:
        os.setpgid(0, 0)
        sandbox.die_with_parent()
        os.close(read_fd)
        for fd in (0, 1, 2):
            os.dup2(self.devnull, fd)
        low = 3
        for keep in sorted({write_fd, *self.keep_fds, *((gate_fd,) if gate_fd >= 0 else ())}):
            os.closerange(low, keep)
            low = keep + 1
        os.closerange(low, 1 << 16)
        # SIGINT stays ignored as in the worker: nothing can send it to a child (its own process group in
        # the worker's session, no terminal; seccomp stops kill() of other processes), and resetting the
        # handler here cost each child ~20 copy-on-write page faults.
        _child.set_recursion_limit(int(request["recursion_limit"]))
        sandbox.apply_child_limits(cpu_seconds, self.base + (int(request["memory_mb"]) << 20))
        if self.bpf is not None:
            self.bpf.load()

    def _collect(self, pid: int, fd: int, n_calls: int, timeout: float, max_output: int) -> list[bytes]:
        lines: list[bytes] = []
        buffer = b""
        cap = 4 * max_output + 4096
        deadline = monotonic() + timeout
        verdict: bytes | None = None
        while len(lines) < n_calls:
            left = deadline - monotonic()
            ready = select.select([fd, 0], [], [], max(left, 0))[0] if left > 0 else []
            if 0 in ready:  # the host cut the request, or closed the input: either way it is over
                _read_cut()
                self.cut = True
                _kill_group(pid)
                os.waitpid(pid, 0)
                return lines
            if not ready:
                verdict = verdicts.line("timeout", None, f"no result within {timeout:g} s (wall clock)")
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer and len(lines) < n_calls:
                raw, buffer = buffer.split(b"\n", 1)
                if verdicts.parse_line(raw) is None:
                    lines.append(verdicts.line("bad_output", None, "malformed result line from the child"))
                else:
                    lines.append(raw + b"\n")
                deadline = monotonic() + timeout  # each call gets its own wall-clock budget
            if len(buffer) > cap:
                verdict = verdicts.line("bad_output", None, "the child wrote more than the output cap")
                break
        if len(lines) == n_calls and verdict is None:
            # Every verdict is in, and nothing of the child is needed any more; it exits on its own unless
            # its program keeps it alive past its last line (a blocked or sleeping child would hold this
            # worker in waitpid for good), so it is killed rather than waited for.
            _kill_group(pid)
            os.waitpid(pid, 0)
            return lines
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        return [*lines, verdict if verdict is not None else _death_verdict(status)]


def _imports_through_fds(allowed: frozenset[str]) -> tuple[list[int], str | None]:
    """Lets children import the standard library from the installation, whatever the worker's uid.

    After the uid drop the installation may be unreachable by path (pyenv under ``/root``). A directory
    opened before the drop (``O_PATH``) and named as ``/proc/self/fd/N`` still reaches it: the kernel
    checks the permissions of the files themselves, not of the path's parents, and a process may always
    follow the links of its own descriptors. Landlock still applies, on the files' real location. The
    import path and the ``__path__`` of loaded packages (``encodings``) are rewritten to those names, and
    the descriptors are kept open in every child.

    Without ``/proc/self/fd`` the worker imports the allowed modules and every codec itself, as a fallback
    (each fork then costs about twice as much).

    Returns:
        ``(descriptors, error)``: the descriptors children keep, and why programs can import only what was
        preloaded (``None`` when they can import from the installation).
    """
    own = sys.path[0]  # the worker's own folder: not for programs (python adds it a second time, as the
    roots = [p for p in sys.path[1:] if os.path.isdir(p) and os.path.abspath(p) != own]  # script's folder)
    if not os.path.isdir("/proc/self/fd") or not roots:
        _preload(allowed)
        return [], "no /proc/self/fd: programs can import only the preloaded modules"
    aliases: dict[str, str] = {}
    for root in roots:
        aliases[root] = f"/proc/self/fd/{os.open(root, os.O_PATH | os.O_DIRECTORY)}"

    def alias(path: str) -> str:
        for root, name in aliases.items():
            if path == root or path.startswith(root + os.sep):
                return name + path[len(root) :]
        return path

    sys.path[:] = aliases.values()  # the worker's own folder goes: its modules are all imported by now
    for module in list(sys.modules.values()):
        package_path = getattr(module, "__path__", None)
        if isinstance(package_path, list):
            package_path[:] = [alias(p) for p in package_path]
    sys.path_importer_cache.clear()
    finder = sys.modules["_frozen_importlib_external"].PathFinder
    finder.find_spec("__populora_warm__")  # lists the directories once here, not in every child
    finder.find_spec("encodings.__populora_warm__", sys.modules["encodings"].__path__)
    return [int(name.rsplit("/", 1)[1]) for name in aliases.values()], None


def _check_import_fds(fds: list[int]) -> str | None:
    """Whether the isolated worker can still list the installation through its descriptors."""
    try:
        os.listdir(f"/proc/self/fd/{fds[0]}")
    except OSError as e:
        return f"programs can import only built-in modules: the installation is unreadable ({e})"
    return None


def _preload(allowed: frozenset[str]) -> None:
    """Imports the allowed modules and every codec now, for a worker whose children cannot reach the
    installation (``'x'.encode('shift_jis')`` imports its codec lazily)."""
    import encodings
    import pkgutil

    for name in sorted(allowed):
        __import__(name)
    for module in pkgutil.iter_modules(encodings.__path__):
        try:
            __import__(f"encodings.{module.name}")
        except Exception:
            pass  # Windows-only codecs (mbcs, oem) do not import here


def _read_cut() -> None:
    """Reads the host's frame that arrived during a request: a cut (an empty frame), or nothing (the end of
    the input). Anything else is out of protocol and ends the worker (the host replaces it)."""
    header = os.read(0, 4)
    if header and header != bytes(4):
        raise RuntimeError(f"unexpected frame from the host during a request: {header!r}")


def _kill_group(pid: int) -> None:
    """SIGKILL to the child's process group (the child alone if the group is gone: it cannot leave it)."""
    for target in (os.killpg, os.kill):
        try:
            target(pid, _signal.SIGKILL)
            return
        except OSError:
            pass


def _death_verdict(status: int) -> bytes:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = _SIGNAL_NAMES.get(sig, str(sig))
        if sig in (_signal.SIGXCPU, _signal.SIGKILL):
            return verdicts.line("timeout", None, f"CPU time limit reached ({name})")
        return verdicts.line("runtime", None, f"the program crashed the process ({name})")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return verdicts.line(
        "runtime", None, f"the program ended its process (exit code {code}) before returning"
    )


def main() -> None:
    config = marshal.loads(bytes.fromhex(sys.argv[1]))
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # the host's Ctrl-C is the host's to handle
    worker = Worker(config)
    send(1, repr({"ready": True, "report": worker.report, "pid": os.getpid()}).encode())
    while True:
        try:
            size = int.from_bytes(read_exact(0, 4), "big")
            if not size:
                continue  # a cut that came after its request was answered
            request = marshal.loads(read_exact(0, size))
        except EOFError:
            return
        send(1, worker.handle(request))


if __name__ == "__main__":
    main()
