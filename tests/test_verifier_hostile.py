"""Hostile programs, family by family, against the real verifier.

Every program runs twice: through the default verifier (language guards and kernel layers) and through
one with the language guards off, so that the kernel layers alone must contain it. For each: the verdict
is in the expected set, the host is unharmed, nothing is written outside the child, and no process is
left behind.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import random
import sys
import uuid
import warnings
from pathlib import Path

import pytest

from populora_env import dsl
from populora_env.verifier import Execution, Verifier, VerifierConfig
from populora_env.verifier import prefilter as prefilter_module
from populora_env.verifier.literals import parse_args
from populora_env.verifier.prefilter import Prefiltered, prefilter
from populora_env.verifier.rules import FORBIDDEN_ATTRIBUTES, MODULE_READS

from .conftest import CRUXEVAL

ESCAPE_DIR = Path("/tmp") / f"populora-hostile-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", autouse=True)
def escape_dir():
    """A world-writable folder with a world-writable file: only the sandbox stands in the way."""
    ESCAPE_DIR.mkdir(mode=0o777, exist_ok=True)
    os.chmod(ESCAPE_DIR, 0o777)
    victim = ESCAPE_DIR / "victim.txt"
    victim.write_text("keep me")
    os.chmod(victim, 0o666)
    yield ESCAPE_DIR
    for p in ESCAPE_DIR.iterdir():
        p.unlink()
    ESCAPE_DIR.rmdir()


def _p(body: str, header: str = "") -> str:
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"{header}def f(x):\n{lines}\n"


E = str(ESCAPE_DIR)
HOST = os.getpid()

# name -> (program, statuses accepted with guards on, statuses accepted with the kernel layers alone)
FAMILIES: dict[str, tuple[str, set[str], set[str]]] = {
    "loop_swallowing_base_exception": (
        _p("while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"),
        {"timeout"}, {"timeout"}),
    "loop_disabling_alarms": (
        _p("signal.alarm(0)\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
           "while True:\n    pass", "import signal\n"), {"forbidden"}, {"timeout"}),
    "cpu_burn_in_c": (_p("return len(str(7 ** (10 ** 7)))"), {"timeout", "runtime"}, {"timeout", "runtime"}),
    "cpu_burn_in_a_c_loop": (_p("return sum(range(10 ** 15))"), {"timeout"}, {"timeout"}),  # no bytecode runs
    "deep_recursion": (_p("return f(x + 1)"), {"runtime"}, {"runtime"}),
    "deep_recursion_raised_limit": (
        _p("sys.setrecursionlimit(10 ** 8)\ndef g(n):\n    return g(n + 1) + 1\nreturn g(0)", "import sys\n"),
        {"forbidden"}, {"runtime", "memory", "timeout"}),
    # CPython 3.11 recurses in C with no depth check here: the child dies of SIGSEGV (runtime, red-team round 32)
    "recursion_in_c_hashing_a_nested_tuple": (
        _p("t = ()\nfor i in range(300000):\n    t = (t,)\nreturn hash(t)"), {"runtime"}, {"runtime"}),
    "recursion_in_c_through_chained_iterators": (
        _p("it = iter([1])\nfor i in range(300000):\n    it = map(abs, it)\nreturn next(it)"), {"runtime"},
        {"runtime"}),
    "memory_list": (_p("return len([0] * (10 ** 10))"), {"memory"}, {"memory"}),
    # Touching memory costs ~1 s per GiB here: a slow grower may meet the clock before the limit.
    "memory_growth": (_p("a = []\nwhile True:\n    a.append(' ' * 10 ** 7)"), {"memory", "timeout"}, {"memory", "timeout"}),
    "fork": (_p("return os.fork()", "import os\n"), {"forbidden"}, {"runtime"}),
    "fork_bomb": (_p("while True:\n    os.fork()", "import os\n"), {"forbidden"}, {"runtime"}),
    "multiprocessing": (
        _p("p = multiprocessing.Process(target=print)\np.start()\nreturn 1", "import multiprocessing\n"),
        {"forbidden"}, {"runtime"}),
    "subprocess": (_p(f"subprocess.Popen(['touch', '{E}/sub'])\nreturn 1", "import subprocess\n"), {"forbidden"}, {"runtime"}),
    "detached_session": (_p("os.setsid()\nos.fork()\nreturn 1", "import os\n"), {"forbidden"}, {"runtime"}),
    "file_write": (_p(f"open('{E}/written', 'w').write('x')\nreturn 1"), {"forbidden"}, {"runtime"}),
    "file_delete": (_p(f"os.remove('{E}/victim.txt')\nreturn 1", "import os\n"), {"forbidden"}, {"runtime"}),
    "file_read_outside": (_p("return open('/etc/hostname').read()"), {"forbidden"}, {"runtime"}),
    "network": (_p("s = socket.socket()\ns.connect(('127.0.0.1', 9))\nreturn 1", "import socket\n"),
                {"forbidden"}, {"runtime"}),
    "environment": (_p("os.environ['POPULORA_PWNED'] = '1'\nos.chdir('/')\nreturn 1", "import os\n"),
                    {"forbidden"}, {"ok"}),
    "kill_parent": (_p("os.kill(os.getppid(), 9)\nreturn 1", "import os\n"), {"forbidden"}, {"runtime"}),
    "kill_host": (_p(f"os.kill({HOST}, 9)\nreturn 1", "import os\n"), {"forbidden"}, {"runtime"}),
    "kill_everyone": (_p("os.kill(-1, 9)\nreturn 1", "import os\n"), {"forbidden"}, {"runtime"}),
    "sys_exit": (_p("sys.exit(0)", "import sys\n"), {"forbidden"}, {"runtime"}),
    "os_exit": (_p("os._exit(0)", "import os\n"), {"forbidden"}, {"runtime"}),
    "keyboard_interrupt": (_p("raise KeyboardInterrupt"), {"runtime"}, {"runtime"}),
    "custom_base_exception": (_p("class Boom(BaseException):\n    pass\nraise Boom('x')"), {"runtime"}, {"runtime"}),
    "dunder_import": (_p(f"__import__('os').system('touch {E}/imp')\nreturn 1"), {"forbidden"}, {"ok"}),
    "importlib": (_p(f"importlib.import_module('os').system('touch {E}/il')\nreturn 1", "import importlib\n"),
                  {"forbidden"}, {"ok"}),
    "subclasses_walk": (
        _p("return [c.__name__ for c in ().__class__.__base__.__subclasses__()][:3]"), {"forbidden"}, {"ok"}),
    "globals_walk": (_p("return sorted(f.__globals__['__builtins__'])[:2]"), {"forbidden"}, {"ok"}),
    "ctypes": (_p(f"ctypes.CDLL(None).system(b'touch {E}/ct')\nreturn 1", "import ctypes\n"), {"forbidden"}, {"ok"}),
    "exec_compile": (_p(f"exec(compile(\"open('{E}/ex', 'w')\", 'x', 'exec'))\nreturn 1"), {"forbidden"}, {"runtime"}),
    "unicode_lookalike": (_p(f"ｅｘｅｃ(\"open('{E}/uni', 'w')\")\nreturn 1"), {"forbidden"}, {"runtime"}),
    "random": (_p("return random.random()", "import random\n"), {"forbidden"}, {"nondeterministic"}),
    "time": (_p("return time.time()", "import time\n"), {"forbidden"}, {"nondeterministic"}),
    "id": (_p("return id(object())"), {"forbidden"}, {"nondeterministic"}),
    "hash_str": (_p("return hash('populora')"), {"nondeterministic"}, {"nondeterministic"}),
    "set_order": (_p("return list({str(i) for i in range(40)})"), {"nondeterministic"}, {"nondeterministic"}),
    "urandom": (_p("return os.urandom(8)", "import os\n"), {"forbidden"}, {"nondeterministic"}),
    "always_equal": (_p("class Eq:\n    def __eq__(self, other):\n        return True\nreturn Eq()"),
                     {"bad_output"}, {"bad_output"}),
    "int_subclass": (_p("class I(int):\n    pass\nreturn I(3)"), {"bad_output"}, {"bad_output"}),
    "str_subclass": (_p("class S(str):\n    def __eq__(self, o):\n        return True\nreturn [S('a')]"),
                     {"bad_output"}, {"bad_output"}),
    "reduce_trick": (_p("class R:\n    def __reduce__(self):\n        return (print, ('pwned',))\nreturn R()"),
                     {"forbidden"}, {"bad_output"}),
    "hanging_repr": (_p("class H:\n    def __repr__(self):\n        while True:\n            pass\nreturn [H()]"),
                     {"bad_output"}, {"bad_output"}),
    "self_reference": (_p("a = [1]\na.append(a)\nreturn a"), {"bad_output"}, {"bad_output"}),
    "generator": (_p("return (i for i in range(3))"), {"bad_output"}, {"bad_output"}),
    "thread_after_return": (
        _p(f"threading.Thread(target=lambda: open('{E}/th', 'w')).start()\nreturn 1", "import threading\n"),
        {"forbidden"}, {"runtime"}),
    "atexit_after_return": (
        _p(f"atexit.register(lambda: open('{E}/ae', 'w'))\nreturn 1", "import atexit\n"), {"forbidden"}, {"ok"}),
    "finalizer_on_a_cycle_after_return": (  # collected whenever the collector runs, after f has returned
        _p(f"class D:\n    def __del__(self):\n        open('{E}/cyc', 'w').write('x')\nd = D()\nd.me = d\n"
           "del d\nreturn [1]"),
        {"forbidden"}, {"ok"}),
    "finalizer_after_return": (
        _p(f"class D:\n    def __del__(self):\n        open('{E}/fin', 'w').write('x')\nD()\nreturn [1]"),
        {"forbidden"}, {"ok"}),
    "stdout_flood_then_return": (_p("for _ in range(200):\n    print('x' * 10000)\nreturn 1"), {"ok"}, {"ok"}),
    "stdout_flood_forever": (_p("while True:\n    print('x' * 10000)"), {"timeout"}, {"timeout"}),
    # the kernel signals a file's owner on I/O: any signal, to its worker (the test sees a lost worker)
    "sigkill_to_worker_through_fcntl": (
        _p("r, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, os.getppid())\nfcntl.fcntl(r, fcntl.F_SETSIG, 9)\n"
           "fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)\nos.write(w, b'x')\nreturn 1", "import os, fcntl\n"),
        {"forbidden"}, {"runtime"}),
    "worker_rescheduled": (
        _p("os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))\nreturn 1", "import os\n"),
        {"forbidden"}, {"runtime"}),
    "worker_reniced": (_p("os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)\nreturn 1", "import os\n"),
                       {"forbidden"}, {"runtime"}),
    "worker_pinned": (_p("os.sched_setaffinity(os.getppid(), {0})\nreturn 1", "import os\n"),
                      {"forbidden"}, {"runtime"}),
    # a line on every descriptor (its result pipe among them), then asleep without using CPU: the worker
    # has its verdict and must not wait for the child to exit
    "asleep_after_its_last_verdict": (
        _p("for fd in range(3, 64):\n    try:\n        os.write(fd, b'forged\\n')\n    except OSError:\n        pass\n"
           "select.select([], [], [], 10 ** 6)", "import os, select\n"), {"forbidden"}, {"bad_output"}),
    # each `x is 1` warns when compiled, in the worker: 64 KiB of warnings on a pipe nobody reads
    "compile_warnings_flood": ("def f(x):\n" + " x is 1\n" * 2400 + " return 1\n", {"ok"}, {"ok"}),
    # CPython 3.11 copies a finally body for each way out of its try: 2**19 copies, seconds and gigabytes
    "nested_finally_blowup": (
        "def f(x):\n" + "".join(" " * (i + 1) + "try:\n" + " " * (i + 2) + "x += 1\n" + " " * (i + 1) + "finally:\n"
                                for i in range(19)) + " " * 20 + "x += 2\n    return x\n",
        {"forbidden"}, {"forbidden"}),
    # CPython 3.11 folds `'a'*4096 + 'a'*4096 + ...` while compiling, keeping every intermediate: 8 GB
    "constant_folding_blowup": ("def f(x):\n    return len(" + "+".join(["'a'*4096"] * 2000) + ")\n",
                                {"forbidden"}, {"forbidden"}),
    # NormalDist.samples draws from `random`'s generator, seeded by the OS: a coin flip passed half the time
    "statistics_random_draw": (_p("return statistics.NormalDist().samples(1)[0] > 0", "import statistics\n"),
                               {"forbidden"}, {"ok", "nondeterministic"}),
    "frame_walk_to_the_child_globals": (
        _p("def g():\n    yield gen.gi_frame.f_back\ngen = g()\n"
           "return sorted(next(gen).f_globals)[:3]"), {"forbidden"}, {"ok"}),
    "module_held_by_an_allowed_one": (_p("return typing.sys.modules['os'].getuid()", "import typing\n"),
                                      {"forbidden"}, {"ok"}),
    # `case C(name=p)` reads any attribute (dunders too) with no `.name` in the source
    "match_class_attribute": (
        _p("match len:\n    case object(__self__=b):\n        pass\nmatch b:\n    case object(__import__=imp):\n"
           "        pass\nreturn imp('os').getuid()"), {"forbidden"}, {"ok"}),
    # get_type_hints evaluates string annotations with the real built-ins
    "string_annotation_evaluated": (
        "import typing\nclass C:\n    x: \"len.__self__.__import__('os')\"\n"
        "def f(x):\n    return typing.get_type_hints(C)['x'].getuid()\n", {"forbidden"}, {"ok"}),
    # a Formatter subclass's hook is handed the object a format string walked to
    "formatter_subclass": (
        "import string\nclass F(string.Formatter):\n    def format_field(self, v, spec):\n        F.got = v\n"
        "        return ''\ndef f(x):\n    F().format('{0.__globals__[__builtins__][len]}', string.capwords)\n"
        "    return F.got('ab')\n", {"forbidden"}, {"ok"}),
    "star_import": (_p("return sys.modules['os'].getuid()", "from json.tool import *\n"), {"forbidden"}, {"ok"}),
    "submodule_holding_sys": (_p("return json.tool.sys.modules['os'].getuid()", "import json.tool\n"),
                              {"forbidden"}, {"ok"}),
    # each `return` in a finally body copies every enclosing finally body again: exponential in the depth
    "nested_finally_returns_blowup": (
        "def f(x):\n" + "".join(" " * (i + 1) + "try:\n" for i in range(20)) + " " * 21 + "x += 1\n"
        + "".join(" " * (i + 1) + "finally:\n" + " " * (i + 2) + "return x\n" for i in reversed(range(20))),
        {"forbidden"}, {"forbidden"}),
    # a positional class pattern reads the attribute __match_args__ names; a dataclass sets it from fields
    "match_args_of_a_dataclass": (
        "import dataclasses, numbers\ndef gd(obj, name):\n    X = dataclasses.make_dataclass('X', [name], "
        "bases=(numbers.Number,))\n    X.register(type(obj))\n    match obj:\n        case X(v):\n"
        "            return v\ndef f(x):\n    return str(gd(f, '_' + '_globals__')['_' + '_builtins__'])[:20]\n",
        {"forbidden"}, {"ok"}),
    "three_argument_type": (
        _p("M = type('M', (type,), {'_' + '_instancecheck__': lambda c, o: True})\nreturn str(M)"),
        {"forbidden"}, {"ok"}),
    "update_wrapper_by_name": (
        _p("class B:\n    pass\nb = B()\nfunctools.update_wrapper(b, f, assigned=('gi_' + 'code',), updated=())\n"
           "return 1", "import functools\n"), {"forbidden"}, {"ok", "runtime"}),
    "format_string_walking_frames": (
        _p("def g():\n    yield '{0.gi_frame.f_back}'.format(gen)\ngen = g()\nreturn next(gen)[:7]"),
        {"forbidden"}, {"ok"}),
    "reads_the_package_data": (
        _p("import os\nroot = os.path.dirname(os.path.dirname(sandbox_file))\n"
           "return open(os.path.join(root, 'data', 'examples.jsonl')).read()[:20]",
           f"sandbox_file = {str(Path(prefilter_module.__file__).with_name('sandbox.py'))!r}\n"),
        {"forbidden"}, {"runtime"}),
    "attribute_by_name": (
        _p("return [operator.attrgetter('gi_frame')(i for i in [x]) is None]", "import operator\n"),
        {"forbidden"}, {"ok"}),
    # README, "Not guaranteed": the verifier's own folder stays readable (the worker imports from it)
    "reads_the_verifier_folder": (
        _p("return len(open(verdicts_file).read()) > 0",
           f"verdicts_file = {str(Path(prefilter_module.__file__).with_name('verdicts.py'))!r}\n"),
        {"forbidden"}, {"ok"}),
    # a failed lookup keeps the object it failed on (Python 3.10+): a format string built at run time walks
    # anywhere (no static check sees it) and the AttributeError hands the object back (a red-team review)
    "attribute_error_hands_back_a_format_walk": (
        _p("try:\n    ('{0.' + '_' + '_globals__.zzz}').format(json.dumps)\nexcept AttributeError as e:\n"
           "    g = e.obj\nreturn g['_' + '_builtins__']['_' + '_import__']('os').getuid()", "import json\n"),
        {"forbidden"}, {"ok"}),
    "attribute_error_object_by_keyword_pattern": (
        _p("u = chr(95) * 2\ntry:\n    ('{0.' + u + 'globals' + u + '.nope}').format(textwrap.dedent)\n"
           "except AttributeError as e:\n    match e:\n        case AttributeError(obj=g):\n            pass\n"
           "return g[u + 'builtins' + u]['eval']('len.__self__.__import__(\"os\").getuid()')", "import textwrap\n"),
        {"forbidden"}, {"ok"}),
    # a property a program put on a standard class (here ABCMeta) was handed what a run-time format string
    # walked to: contextlib.redirect_stdout, whose __enter__ does getattr(sys, self._stream) (a red-team review)
    "property_planted_on_a_standard_class": (
        "import typing\nfrom collections.abc import Mapping\nbox = []\ndef grab(c):\n    box.append(c)\n"
        "    return 1\ntype(Mapping).grab = property(grab)\ndef f(x):\n    u = '_' + '_'\n"
        "    ('{0.' + u + 'globals' + u + '[contextlib].redirect_stdout.grab}').format(typing.cast)\n"
        "    got = []\n    class R(box[0]):\n        _stream = 'modules'\n        _new_target = {}\n"
        "        _old_targets = got\n        def __init__(self):\n            pass\n    with R():\n"
        "        mods = got[0]\n    return mods['os'].getuid()\n",
        {"forbidden"}, {"ok"}),
    # a constant format string that names only public attributes passes the pre-filter; `.sys` is forbidden
    "format_constant_walking_a_forbidden_name": (
        "import typing\nfrom collections.abc import MutableMapping\nbox = []\n"
        "MutableMapping.grab = property(lambda m: box.append(m) or 1)\ndef f(x):\n"
        "    '{0.sys.modules[os].environ.grab}'.format(typing)\n    return str(type(box[0]))\n",
        {"forbidden"}, {"ok"}),
    "format_method_unbound": (_p("m = str.format\nreturn m('{0.' + '_' * 2 + 'doc' + '_' * 2 + '}', 1)"),
                              {"forbidden"}, {"ok"}),
    "format_field_nested_in_a_spec": (_p("s = '{0:{1.' + '_' * 2 + 'doc' + '_' * 2 + '}}'\nreturn s.format(1, 2)"),
                                      {"forbidden"}, {"runtime"}),
    # str's own format method reached through super() of a str subclass (a red-team review)
    "format_through_super": (
        "import typing\nclass S(str):\n    pass\ndef f(x):\n    u = '_' * 2\n"
        "    s = S('{0.' + u + 'globals' + u + '[sys].modules[os].environ[PATH]}')\n"
        "    return super(S, s).format(typing.cast)[:60]\n",
        {"forbidden"}, {"ok"}),
    # UserString.format calls str's on its data, past the check of format reads; a typing alias of the
    # AttributeError relayed its `obj`, the real __import__ (a red-team review's full escape)
    "user_string_format_and_an_alias_of_the_error": (
        "import collections, typing, json\ndef f(x):\n    u = '_' * 2\n"
        "    s = collections.UserString('{0.' + u + 'globals' + u + '[' + u + 'builtins' + u + '][' + u + 'import' + u + '].zzz}')\n"
        "    try:\n        s.format(json.dumps)\n    except AttributeError as e:\n        err = e\n"
        "    a = type(typing.List[int])(err, (int,), name='L')\n    return a.obj('os').getuid()\n",
        {"forbidden"}, {"ok"}),
    "user_string_format_map": (
        "import collections, typing\ndef f(x):\n    u = '_' * 2\n"
        "    s = collections.UserString('{t.' + u + 'globals' + u + '[sys].modules[os].environ[PATH]}')\n"
        "    return s.format_map({'t': typing.cast})[:60]\n",
        {"forbidden"}, {"ok"}),
    "alias_of_an_exception": (
        _p("try:\n    x.zzz\nexcept AttributeError as e:\n    err = e\n"
           "return str(type(typing.List[int])(err, (int,), name='L').obj)", "import typing\n"),
        {"forbidden"}, {"ok"}),
    # the enum machinery sets _value_, _name_, __objclass__ on what a class's __new__ returns (a review)
    "enum_new_returning_a_module": (
        "import enum, json\nclass E(enum.Enum):\n    def __new__(cls, v):\n        return json\n    A = 'json'\n"
        "def f(x):\n    return [n for n in dir(json) if n.startswith('_') and not n.startswith('__')]\n",
        {"forbidden"}, {"ok"}),
    # a typing alias named '__builtins__' reduced to a lookup in typing's globals: the real builtins'
    # ModuleSpec, whose loader loads any built-in module (a red-team review's full escape)
    "typing_alias_copied_by_name": (
        "import typing, copy\ndef f(x):\n    a = type(typing.List[int])(int, ('_' + '_spec__',), name='_' + '_builtins__')\n"
        "    b = copy.copy(a).loader.load_module('builtins')\n    return b.eval(\"len('ab')\", {})\n",
        {"forbidden"}, {"ok"}),
    # a run-time class's __deepcopy__ was handed copy's own memo: the originals and their live __dict__
    "deepcopy_hook_handed_the_memo": (
        "import copy, calendar\ndef f(x):\n    got = []\n"
        "    K = type(int)('K', (), {'_' + '_deepcopy__': lambda self, memo: got.append(memo) or self})\n"
        "    copy.deepcopy([calendar.c, K()])\n    for d in got[0].values():\n        if type(d) is list:\n"
        "            live = [v for v in d if type(v) is dict]\n    live[0]['_firstweekday'] = 3\n"
        "    return calendar.c.firstweekday\n",
        {"forbidden"}, {"ok"}),
    # standard classes whose names do not lead back to them (a namedtuple made at import, a C type)
    "standard_class_not_found_by_name": (_p("difflib.Match.count = 7\nreturn 1", "import difflib\n"),
                                         {"forbidden"}, {"ok"}),
    "c_type_under_another_name": (_p("json.scanner.c_make_scanner.planted = 1\nreturn 1", "import json\n"),
                                  {"forbidden"}, {"ok"}),
    # total_ordering writes comparison methods into the class it is given
    "total_ordering_of_a_standard_class": (_p("functools.total_ordering(numbers.Real)\nreturn 1",
                                              "import functools, numbers\n"), {"forbidden"}, {"ok"}),
    # a mixin's __new__ returned json: the enum machinery reset json.__name__ to 'importlib', and
    # `from json import util` then imported importlib.util (a red-team review's full escape)
    "enum_mixin_new_renaming_a_module": (
        "import enum, json\nclass Mix:\n    def __new__(cls, v):\n        return json\n"
        "class E(Mix, enum.Enum):\n    A = 'importlib'\ndef f(x):\n    from json import util\n"
        "    return str(util.find_spec('builtins').loader.load_module('builtins'))\n",
        {"forbidden"}, {"ok"}),
    # the enum guard trusted an attribute the program can set on its own function
    "enum_new_marked_as_a_wrapper": (
        "import enum, json\ndef mark(fn):\n    fn.guarded = True\n    return fn\nclass E(enum.Enum):\n"
        "    @mark\n    def __new__(cls, v):\n        return json\n    A = 'importlib'\n"
        "def f(x):\n    from json import util\n    return str(util)\n",
        {"forbidden"}, {"ok"}),
    "typing_flags_on_standard_objects": (_p("typing.no_type_check(json)\ntyping.final(numbers.Number)\nreturn 1",
                                            "import typing, json, numbers\n"), {"forbidden"}, {"ok"}),
    # a standard class whose module name is taken by its own instance
    "standard_class_shadowed_by_its_instance": (
        _p("K = type(enum.auto().value)\nK.planted = 7\nreturn 1", "import enum\n"), {"forbidden"}, {"ok"}),
    # `from json import tool` loaded the forbidden submodule: argparse's FileType is `open`, Path all of pathlib
    "forbidden_submodule_by_from_import": (
        _p("return tool.argparse.FileType('r')(verdicts_file).read()[:3]",
           "from json import tool\n"
           f"verdicts_file = {str(Path(prefilter_module.__file__).with_name('verdicts.py'))!r}\n"),
        {"forbidden"}, {"ok"}),
    # a bound method named `format` (`obj`) reduces to getattr(obj, 'format'): copy read str's raw format,
    # which walked to copy's globals, and AttributeError.obj handed them back (a red-team review's full
    # escape: the real built-ins, the verdict forged, the request's other programs read)
    "copy_reading_format_and_obj_by_a_method_name": (
        "import copy\nclass C:\n    def m(self):\n        return 0\ndef format(*a):\n    return 0\n"
        "def obj(*a):\n    return 0\ndef f(x):\n    MT = type(C().m)\n    raw = copy.copy(MT(format, str))\n"
        "    u = chr(95) * 2\n    try:\n        raw('{0.' + u + 'globals' + u + '.nope}', copy.copy)\n"
        "    except AttributeError as e:\n        g = copy.copy(MT(obj, e))\n"
        "    return sorted(g[u + 'builtins' + u])[:3]\n",
        {"forbidden"}, {"ok"}),
    "copy_reading_an_exception_s_obj_by_a_method_name": (
        "import copy\nclass C:\n    def m(self):\n        return 0\ndef obj(*a):\n    return 0\n"
        "def f(x):\n    try:\n        [x].nope\n    except AttributeError as e:\n"
        "        return copy.copy(type(C().m)(obj, e))\n",
        {"forbidden"}, {"ok"}),
    # a metaclass's `__mro__` property hid a run-time class's __deepcopy__ from the check, which then handed
    # it copy's memo: the live __dict__ of a standard object, a method shadowed in it (a red-team review)
    "deepcopy_hook_behind_a_metaclass_mro": (
        "import copy, textwrap\ndef f(x):\n    u = chr(95) * 2\n    T = type(int)\n"
        "    M = T('M', (T,), {u + 'mro' + u: property(lambda c: ())})\n    got = []\n"
        "    K = M('K', (), {u + 'deepcopy' + u: lambda self, memo: got.append(memo) or 1})\n"
        "    w = textwrap.TextWrapper(width=5)\n    copy.deepcopy([w, K()])\n"
        "    live = [v for v in got[0].values() if type(v) is list and w in v][0]\n"
        "    [o for o in live if type(o) is dict and 'width' in o][0]['wrap'] = lambda t: ['shadowed']\n"
        "    return w.wrap('hello world')\n",
        {"forbidden"}, {"ok"}),
    "deepcopy_hook_handed_out_by_getattr": (
        "import copy, textwrap\ndef f(x):\n    u = chr(95) * 2\n    got = []\n"
        "    def ga(self, name):\n        if name == u + 'deepcopy' + u:\n"
        "            return lambda memo: got.append(memo) or 1\n        raise AttributeError(name)\n"
        "    K = type(int)('K', (), {u + 'getattr' + u: ga})\n"
        "    copy.deepcopy([textwrap.TextWrapper(width=5), K()])\n    return len(got)\n",
        {"forbidden"}, {"ok"}),
    # a checked read inside another (`e.obj.obj`): the rewrite walked the outer read it had replaced, and
    # left the inner one unchecked (found in review): AttributeError.obj read as any other attribute
    "chained_checked_reads": (
        "def f(x):\n    try:\n        [x].nope\n    except AttributeError as e:\n        return e.obj.obj\n",
        {"forbidden"}, {"runtime"}),
    # module names are attribute names a program may use (`event.time`) since a breakage review: what the
    # read gives is checked at run time, and a module off the allowlist is refused
    "module_off_the_allowlist_as_an_attribute": (_p("return str(typing.types)", "import typing\n"),
                                                  {"forbidden"}, {"ok"}),
    "nondeterministic_module_as_an_attribute": (
        _p("return str(calendar.datetime.datetime.now())", "import calendar\n"),
        {"forbidden"}, {"nondeterministic"}),
    # red-team round 19: `import typing as __builtins__` made typing's globals (sys among them) the built-ins of
    # the functions defined after it; a class named like a run-time check replaced it; a run-time metaclass's
    # namespace supplied a class body's `super`; copy read NormalDist.samples by a method's name
    "builtins_rebound_by_an_import_alias": ("import typing as __builtins__\ndef f(x):\n    return sys.platform\n",
                                            {"forbidden"}, {"ok"}),
    "check_replaced_by_a_class_name": (
        "import json\nclass __populora_own__:\n    def __new__(cls, target, name):\n        return target\n"
        "def f(x):\n    json.loads = len\n    return json.loads('abc')\n", {"forbidden"}, {"ok"}),
    "super_from_a_metaclass_namespace": (
        "import typing, json\ndef prep(name, bases, **kw):\n"
        "    return {'super': lambda: super(type(typing.List), typing.List)}\n"
        "M = type(int)('M', (type(int),), {'_' + '_prepare__': prep})\nclass C(metaclass=M):\n"
        "    init = super().__init__\ndef f(x):\n    C.init(json, name='json')\n    return repr(typing.List)\n",
        {"forbidden"}, {"ok"}),
    "normaldist_samples_through_copy": (
        "import copy, statistics\nclass P:\n    def m(self):\n        pass\ndef samples():\n    pass\n"
        "def f(x):\n    draw = copy.copy(type(P().m)(samples, statistics.NormalDist(0, 1)))\n    return draw(1)[0] > 0\n",
        {"forbidden"}, {"ok", "nondeterministic"}),
    # red-team round 20: a run-time subclass of typing's alias class (`**{'_root': True}`, no keyword the
    # pre-filter sees) with a `__dict__` property showed the origin check a dict of its own and relayed
    # AttributeError.obj; an alias of a function wrote `__orig_class__` on the module it returned
    "typing_alias_subclassed_with_an_unpacked_root": (
        "import typing\ndef fake(self):\n    return {'_' + '_origin__': int}\nclass K:\n    pass\ndef f(x):\n"
        "    A = type(int)('A', (type(typing.List[int]),), {'_' + '_dict__': property(fake)}, **{'_root': True})\n"
        "    try:\n        K().missing\n    except AttributeError as e:\n        err = e\n"
        "    return type(A(err, (int,), name='x').obj).__name__\n",
        {"forbidden"}, {"ok"}),
    "typing_alias_of_a_function_called": (
        "import typing, json\ndef g():\n    return json\ndef f(x):\n    type(typing.List[int])(g, (int,))()\n"
        "    return sorted(k for k in dir(json) if k.startswith('_' + '_orig'))\n",
        {"forbidden"}, {"ok"}),
    # red-team round 21 (a full escape: the real sys, the hook off, the request's other programs read): a
    # mixin's own __init_subclass__ skipped typing's refusal, a typing alias relayed `_sys` from a list[int]-style
    # alias of the module collections, and EnumType's method comparison handed a program's __eq__
    # object.__reduce_ex__, which reads the attributes a class lists in __slotnames__
    "typing_subclass_past_a_mixin_s_init_subclass": (
        "import typing, collections\nT = type(int)\ndef isub(cls, **kw):\n    return None\ndef f(x):\n"
        "    M = T('M', (), {'_' + '_init_subclass__': classmethod(isub)})\n"
        "    K = T('K', (M, type(typing.List[int]).mro()[1]), {})\n"
        "    return K(type(list[int])(collections, ())).OrderedDict.__name__\n",
        {"forbidden"}, {"runtime"}),  # unguarded: the alias refuses a module as its origin (round 32)
    "enum_comparison_handing_out_object_methods": (
        "import enum\nT = type(int)\nbox = []\ndef eq(self, other):\n    box.append(other)\n    return False\n"
        "def f(x):\n    O = T('O', (), {'_' + '_eq__': eq, '_' + '_hash__': None})()\n"
        "    Mix = T('Mix', (), {'_' + '_reduce_ex__': staticmethod(O)})\n    class E(Mix, enum.Enum):\n"
        "        A = 1\n    return [str(b) for b in box]\n",
        {"forbidden"}, {"ok"}),
    "enum_new_as_a_staticmethod_returning_a_module": (
        "import enum, json\ndef g(cls, *args):\n    return json\nclass E(enum.Enum):\n    __new__ = staticmethod(g)\n"
        "    RED = ('importlib',)\ndef f(x):\n    return json.__name__\n",
        {"forbidden"}, {"ok"}),
    # red-team round 22 (two full escapes): a program's subclass of types.GenericAlias hands every attribute
    # read, __dict__ included, to its origin (a module): functools.cached_property's cache became typing's
    # globals (the real sys), and UserDict's copy updated a dict of the program's with json's globals
    "generic_alias_subclass_under_cached_property": (
        "import typing, functools\ndef f(x):\n    def grab(o):\n        return None\n"
        "    cp = functools.cached_property(grab)\n    G = type(int)('G', (type(list[int]),), {'_' + '_origin__': cp})\n"
        "    cp.attrname = 'sys'\n    return str(typing.get_origin(G(typing, ())))\n",
        {"forbidden"}, {"runtime"}),  # the run-time class refused (its __origin__); unguarded: no subclass
    "generic_alias_subclass_copied_as_a_user_dict": (
        "import collections, copy, json\nD = {}\nH = type(int)('H', (), {'_' + '_dict__': property(lambda s: D)})\n"
        "class K(type(list[int]), collections.UserDict):\n    def __new__(cls, *a):\n        if not a:\n"
        "            a = (H(), ())\n        return super().__new__(cls, *a)\n    def __init__(self, *a):\n"
        "        pass\ndef f(x):\n    try:\n        copy.copy(K(json, ()))\n    except KeyError:\n        pass\n"
        "    return sorted(D)[:3]\n",
        {"forbidden"}, {"runtime"}),  # the run-time class refused (its __dict__); unguarded: no subclass
    # super() with a class as its first argument hands out its bases' methods unbound: with the module type
    # as a base, super().__init__(json, 'importlib') renames a module (the renaming of an earlier escape)
    "super_in_a_classmethod": (
        "import json\nclass B(type(json)):\n    @classmethod\n    def m(cls):\n        return super().__init__\n"
        "def f(x):\n    B.m()(json, 'importlib')\n    return json.__name__\n",
        {"forbidden"}, {"ok"}),
    "super_in_a_method_called_with_a_class": (
        "import json\nclass B(type(json)):\n    def m(self):\n        return super().__init__\n"
        "def f(x):\n    B.m(B)(json, 'importlib')\n    return json.__name__\n",
        {"forbidden"}, {"ok"}),
    "super_in_a_nested_function_given_a_class": (
        "import json\nclass B(type(json)):\n    def m(self):\n        def g(cls):\n            return super().__init__\n"
        "        return g(B)\ndef f(x):\n    B('z').m()(json, 'importlib')\n    return json.__name__\n",
        {"forbidden"}, {"ok"}),
    # the proxy's own __self__ read through the instance's class first, where a run-time class put a name
    "super_with_a_planted_self": (
        "import json\nclass B(type(json)):\n    def m(self):\n        return super().__init__\ndef f(x):\n"
        "    u = chr(95) * 2\n    A = type(int)('A', (type(json),), {u + 'self' + u: 1, u + 'self_class' + u: int})\n"
        "    C = type(int)('C', (B, A), {})\n    C.m(C)(json, 'importlib')\n    return json.__name__\n",
        {"forbidden"}, {"ok"}),
}  # fmt: skip


def _userns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return None


def leftover_processes(v) -> list[int]:
    """Processes living in a worker's private user namespace, other than the workers themselves."""
    workers = {w.pid for pool in v._pools for w in pool}
    spaces = {_userns(pid) for pid in workers} - {None, _userns(os.getpid())}
    if not spaces:
        return []
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if p not in workers and _userns(p) in spaces]


@pytest.mark.parametrize("guards", ["guarded", "kernel_only"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hostile_family_is_contained(name, guards, verifier, bare_verifier):
    program, guarded_ok, kernel_ok = FAMILIES[name]
    v = verifier if guards == "guarded" else bare_verifier
    environ, cwd, limit = dict(os.environ), os.getcwd(), sys.getrecursionlimit()
    host_builtins = {name: id(value) for name, value in vars(builtins).items()}
    workers = [w.pid for pool in v._pools for w in pool]

    execution = v.run(program, "1")

    assert execution.status in (guarded_ok if guards == "guarded" else kernel_ok), execution
    assert sorted(p.name for p in ESCAPE_DIR.iterdir()) == ["victim.txt"]
    assert (ESCAPE_DIR / "victim.txt").read_text() == "keep me"
    assert dict(os.environ) == environ and os.getcwd() == cwd
    assert sys.getrecursionlimit() == limit
    assert {name: id(value) for name, value in vars(builtins).items()} == host_builtins  # every built-in
    if v.isolation.namespaces:
        assert leftover_processes(v) == []
    assert [w.pid for pool in v._pools for w in pool] == workers, "a worker was lost"
    assert v.run("def f(x):\n    return x + 1", "1").output == "2", "verifier unusable afterwards"


def test_answers_that_are_code_are_never_run(verifier):
    program = "def f(x):\n    return x"
    code = f"__import__('os').system('touch {E}/answer')"
    assert not verifier.check_deduction(program, "1", code)
    assert not verifier.check_abduction(program, "1", code)
    assert verifier.check_induction(program, [(code, "1")]) == 0.0
    assert sorted(p.name for p in ESCAPE_DIR.iterdir()) == ["victim.txt"]


def test_kernel_layers_are_all_active_here(bare_verifier):
    """This machine offers every layer (CI runs on the same kind): a regression here is a real loss."""
    report = bare_verifier.isolation
    if not report.full and not os.environ.get("CI"):
        pytest.skip(f"partial isolation on this machine: {report}")
    assert report.seccomp and report.landlock_abi >= 1 and report.namespaces and report.unprivileged


# Sources the pre-filter must reject: each hides its forbidden part from a naive text search somehow.
DISGUISED = [
    "def f(x):\n    return x. __dict__",
    "def f(x):\n    return x.\\\n__dict__",
    "def f(x):\n    return x._private_",
    "def f(x):\n    global __b\n    return x",
    "def f(x):\n    return (lambda: 0).__globals__",
    "def f(x):\n    return f\"{__import__('os')}\"",
    "def f(x):\n    return [id for id in x]",
    "def f(x):\n    return ｅｖａｌ('1')",
    "def f(x):\n    return x.ｅ if 0 else __name__ or vars()",
    "from math import *\nimport os\ndef f(x):\n    return x",
    "def f(x):\n    from math import _x\n    return x",
    "def f(x):\n    return(getattr)(x, 'y')",
    "def f(x):\n    return 1if x else(exec)",
    # no `_`, no `import`, no banned word: the class pattern, type() and format checks must still run
    "class C:\n    pass\ndef f(x):\n    match x:\n        case C(y):\n            return y",
    "def f(x):\n    return type('M', (type,), {})",
    "def f(x):\n    return '{0.gi_yieldfrom}'.format(x)",
    "def f(x):\n    u = chr(95) * 2\n    T = type\n    M = T('M', (T,), {u + 'instancecheck' + u: lambda c, o: True})\n"
    "    def rd(obj, name):\n        C = M('C', (), {u + 'match' + chr(95) + 'args' + u: (name,)})\n"
    "        match obj:\n            case C(v):\n                return v\n"
    "    imp = rd(rd(len, u + 'self' + u), u + 'imp' + 'ort' + u)\n    return str(imp('o' + 's'))",
]


def _walk_finds(source: str) -> str | None:
    with warnings.catch_warnings():  # mutated sources: invalid escapes, numbers glued to names
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    allowed = prefilter_module._allowed_in_context(tree)
    return next(
        (reason for node in ast.walk(tree) if (reason := prefilter_module._forbidden(node, allowed))), None
    )


@pytest.mark.filterwarnings("ignore::SyntaxWarning", "ignore::DeprecationWarning")
def test_the_prefilter_text_shortcut_never_skips_a_finding():
    """``prefilter`` skips walking a tree when the source's text shows nothing it could report; on every
    source here, real and mutated, a skipped walk would have found nothing."""
    sources = [program for program, _, _ in FAMILIES.values()] + DISGUISED
    if CRUXEVAL.exists():
        sources += [json.loads(line)["code"] for line in CRUXEVAL.read_text().splitlines()]
    rng = random.Random(0)
    sources += [dsl.render(dsl.random_program(rng, 6, i / 200))[0] for i in range(200)]  # always here
    inserts = ["__x", "._y", "id", "import math\n", " eval", "_", "vars()", "x.__class__", "ｉｄ", "é"]
    mutated = []
    for source in sources[:300]:
        for _ in range(5):
            at = rng.randrange(len(source) + 1)
            mutated.append(source[:at] + rng.choice(inserts) + source[at:])
    checked = 0
    for source in sources + mutated:
        try:
            finding = _walk_finds(source)
        except (SyntaxError, ValueError):
            continue
        checked += 1
        if not prefilter_module._needs_walk(source):
            assert finding is None, (source, finding)
        else:
            assert finding is None or prefilter(source).status != "ok", source
    assert checked > 300
    for source in DISGUISED:
        assert prefilter(source).status == "forbidden", source


def test_every_module_an_allowed_one_holds_publicly_is_a_forbidden_attribute():
    """``typing.sys`` is ``sys``: each public attribute of an allowed module (or of a submodule a program
    may import) that is a module outside the allowlist must be a forbidden attribute name, on this
    Python; a submodule that holds others (``json.tool``: ``argparse``) must be a forbidden module."""
    import importlib
    import pkgutil
    import types

    from populora_env.verifier.prefilter import ALLOWED_MODULES, FORBIDDEN_ATTRIBUTES, FORBIDDEN_MODULES

    reachable: set[str] = set()
    seen: set[str] = set()
    todo = [importlib.import_module(name) for name in sorted(ALLOWED_MODULES)]
    for package in list(todo):  # and every public submodule a program may import (`import json.decoder`)
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), f"{package.__name__}."):
            if (
                not any(p.startswith("_") for p in info.name.split("."))
                and info.name not in FORBIDDEN_MODULES
            ):
                todo.append(importlib.import_module(info.name))
    while todo:
        module = todo.pop()
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for name, value in vars(module).items():
            if name.startswith("_") or not isinstance(value, types.ModuleType):
                continue
            if value.__name__.split(".")[0] in ALLOWED_MODULES:
                todo.append(value)
            else:
                reachable.add(name)
    assert reachable and reachable <= FORBIDDEN_ATTRIBUTES, sorted(reachable - FORBIDDEN_ATTRIBUTES)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        (
            "io_setup",
            "libc.syscall(206 if machine == 'x86_64' else 0, 4096, ctypes.byref(ctypes.c_ulong(0)))",
        ),
        ("inotify_init1", "libc.inotify_init1(0)"),
        ("flock", "libc.flock(os.open('/dev/null', os.O_RDONLY), 2)"),
        ("memfd_secret", "libc.syscall(447, 0) if machine == 'x86_64' else -1"),
    ],
)
def test_machine_wide_resources_are_refused_to_programs(bare_verifier, name, call):
    """Calls that take from resources every process shares (aio contexts, nobody's inotify instances,
    locks) fail with EPERM in a child, with the language guards off."""
    program = (
        "import ctypes, os, platform\ndef f(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        f"    machine = platform.machine()\n    result = {call}\n    return [result, ctypes.get_errno()]\n"
    )
    execution = bare_verifier.run(program, "1")
    assert execution.status == "ok", execution
    result, error = parse_args(execution.output)[0]
    assert result == -1 and error in (1, 0 if name == "memfd_secret" else 1), (name, execution)


def test_an_output_that_does_not_parse_back_is_bad_output(bare_verifier):
    """The child renders only literals; text that does not parse back was made by the program itself
    (here an int past the digit limit it raised), and no answer could ever be equal to it."""
    program = "import sys\ndef f(x):\n    sys.set_int_max_str_digits(0)\n    return 10 ** 5000"
    execution = bare_verifier.run(program, "1")
    assert (execution.status, execution.output) == ("bad_output", None), execution
    assert "does not parse back" in execution.detail


def test_a_compile_the_prefilter_misses_is_stopped_by_the_worker_memory_cap(monkeypatch):
    """The worker compiles programs before any limit of a child applies; its own address space is capped
    (a soft limit its children lower again), so a compile that would take gigabytes is a ``memory``
    verdict and the worker serves on. The pre-filter's node count is switched off to reach it. The program
    nests 20 ``finally`` blocks, whose copies the compiler cannot do without (a constant-folding blow-up,
    used here before, is no such case: CPython stops folding where an allocation fails, so the compile
    failed or succeeded within the cap by where in memory it ran out, and the two pools disagreed)."""
    from populora_env.verifier import Verifier

    monkeypatch.setattr(prefilter_module, "MAX_COMPILED_NODES", 10**15)
    prefilter_module.prefilter.cache_clear()
    try:
        with Verifier(
            workers=1, cache_size=0, timeout=20.0
        ) as v:  # the compile takes seconds on a busy machine
            program = (
                "def f(x):\n"
                + "".join(
                    " " * (i + 1) + "try:\n" + " " * (i + 2) + "x += 1\n" + " " * (i + 1) + "finally:\n"
                    for i in range(20)
                )
                + " " * 21
                + "x += 1\n    return x\n"
            )  # 2**20 copies of the innermost body: gigabytes
            execution = v.run(program, "1")
            assert (execution.status, execution.detail) == (
                "memory",
                "MemoryError while compiling the program",
            )
            assert v.run("def f(x):\n    return x + 1", "1").output == "2"
            # a child's limit is its program's, not the worker's
            big = v.run("def f(x):\n    return len(bytearray(300 * 2**20))", "1")
            assert (big.status, big.output) == ("ok", str(300 * 2**20))
    finally:
        prefilter_module.prefilter.cache_clear()


def test_folding_estimate_follows_what_cpython_folds():
    """The estimate counts what ``compile`` folds (a ``*`` past 4 096 characters is not folded, so the
    ``+`` after it is not either), and expression arguments are checked like programs."""
    from populora_env.verifier.prefilter import folded_chars, prefilter_expression

    assert folded_chars(ast.parse("'a' * 4096 + 'b'")) == 4096 + 4097
    assert folded_chars(ast.parse("'a' * 4097 + 'b'")) == 0
    assert folded_chars(ast.parse("(1,) * 256 + (2,)")) == 8 * 256 + 8 * 257
    assert folded_chars(ast.parse("x + 'a' * 2")) == 2
    chain = "+".join(["'a'*4096"] * 1200)
    assert prefilter_expression(f"len({chain})").status == "forbidden"
    assert prefilter(f"def f(x):\n    return len({chain})").status == "forbidden"
    assert prefilter("def f(x):\n    return len(" + "+".join(["'ab'*4"] * 400) + ")").status == "ok"
    # the cheap gate before the walk counts non-ASCII characters as the estimate does (4 bytes)
    assert prefilter("def f(x):\n    return len(" + "+".join(["'é'*4096"] * 100) + ")").status == "forbidden"


def test_folding_estimate_follows_folded_factors_and_subscripts():
    """A red-team review: a factor CPython folds from an expression (``(0,)*(255+1)``, ``(0,)*+256``) or a
    subscript (``('x'*4096,)[0]``) was no constant to the estimate, so a chain of 1 326 such terms (19 919
    characters) passed and took 8-14 s and ~1.8 GB of compiling in the worker ("ok" or a lost worker, as
    the machine's load went)."""
    from populora_env.verifier.prefilter import folded_chars

    for factor in (
        "256",
        "(255+1)",
        "+256",
        "~-257",
        "(2**8)",
        "(1<<8)",
        "(512//2)",
        "(256,)[0]",
        "((not 0)*256)",
    ):
        assert folded_chars(ast.parse(f"(0,)*{factor}")) == 8 * 256, factor
    assert folded_chars(ast.parse("(0,)*(2**200)")) == 8 * 256  # (not folded by CPython: bounded as any int)
    assert folded_chars(ast.parse("'-' * (40 + 2)")) == 42
    for term in ("(0,)*(255+1)", "(0,)*+256", "('x'*4096,)[0]", "(0,)*b'\\xff'[0]"):
        program = "X = " + " + ".join([term] * 1330) + "\ndef f():\n    return len(X)\n"
        assert prefilter(program).status == "forbidden", term
    assert prefilter("def f(x):\n    return '-' * (40 + 2) + x + '=' * (10 * 2)").status == "ok"


def test_folding_estimate_bounds_what_cpython_folds_on_random_constant_expressions():
    """Differential: for random constant expressions of ints, floats, strings, bytes and tuples under every
    operator, unary operator and subscript, the estimate is at least the bytes of every constant CPython
    itself folds a ``+`` or ``*`` (any binary operator) into (an estimate below it let folding through)."""
    import dis
    import random
    import warnings

    from populora_env.verifier.prefilter import folded_chars

    def size(value: object) -> int:
        if isinstance(value, str):
            return len(value) * (1 if value.isascii() else 4)
        return len(value) * (8 if isinstance(value, tuple) else 1) if isinstance(value, (bytes, tuple)) else 0

    atoms = ["0", "1", "2", "7", "64", "255", "256", "-1", "True", "1.5", "None", "'ab'", "'é'", "b'xy'", "''",
             "()", "(0,)", "(1, 'a')", "('x'*3,)"]  # fmt: skip
    binary = ["+", "-", "*", "**", "<<", ">>", "//", "%", "/", "|", "^", "&"]
    rng = random.Random(0)

    def expression(depth: int) -> str:
        r = rng.random()
        if depth == 0 or r < 0.25:
            return rng.choice(atoms)
        if r < 0.7:
            return f"({expression(depth - 1)} {rng.choice(binary)} {expression(depth - 1)})"
        if r < 0.8:
            return f"({rng.choice(['-', '+', '~', 'not '])}{expression(depth - 1)})"
        if r < 0.92:
            return f"({expression(depth - 1)})[{expression(depth - 1)}]"
        return "(" + ", ".join(expression(depth - 1) for _ in range(rng.randint(1, 3))) + ",)"

    def folded(source: str) -> int:
        code = compile(source, "<expression>", "eval")
        ops = [i.opname for i in dis.get_instructions(code) if i.opname != "RESUME"]
        return size(code.co_consts[0]) if ops == ["LOAD_CONST", "RETURN_VALUE"] else 0

    folds = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ("'int' object is not subscriptable; perhaps you missed a comma?")
        for _ in range(6000):
            tree = ast.parse(expression(rng.randint(1, 5)), mode="eval")
            made = [folded(ast.unparse(node)) for node in ast.walk(tree) if isinstance(node, ast.BinOp)]
            folds += sum(1 for m in made if m)
            assert folded_chars(tree) >= sum(made), ast.unparse(tree)
    assert folds > 300  # (the expressions do fold: the bound is tested, not met by nothing)
    # a chain above a term whose factor the estimate cannot value (a review: that term was taken to be exactly
    # 4 096 characters long, the next `*` then "not folded", and every `+` above it went uncounted)
    for first in ("'a'*(not 0.0)*64", "'a'*+b'\\x01'[0]*64", "(0,)*(not 0.0)*8"):
        rest = " + (0,)*256" if first.startswith("(0,)") else " + 'a'*4096"
        tree = ast.parse(f"({first})" + rest * 40, mode="eval")
        made = sum(folded(ast.unparse(node)) for node in ast.walk(tree) if isinstance(node, ast.BinOp))
        assert folded_chars(tree) >= made > 40 * 40 // 2 * 2048, first


def test_only_statistics_samples_is_refused_not_every_attribute_of_that_name():
    """``NormalDist.samples`` draws from ``random``; a program's own attribute ``samples`` is fine."""
    draws = "def f(x):\n    return {}().samples(1)[0] > 0"
    assert prefilter("import statistics\n" + draws.format("statistics.NormalDist")).status == "forbidden"
    assert prefilter("from statistics import NormalDist as N\n" + draws.format("N")).status == "forbidden"
    assert (
        prefilter("import statistics\ndef f(x):\n    return statistics.NormalDist(0, 1).cdf(x)").status
        == "ok"
    )
    assert prefilter("class A:\n    samples = 3\ndef f(x):\n    return A().samples + x").status == "ok"
    from populora_env.verifier.prefilter import prefilter_expression

    assert prefilter_expression("statistics.NormalDist().samples(1)").status == "forbidden"


def test_a_long_elif_chain_with_a_finally_is_not_refused_for_the_callers_stack():
    """``elif`` branches are nested ``If`` nodes: the size estimate walked them by recursion, so 1 000 of
    them (a program CPython runs) were ``forbidden``, and a shorter chain too when checked from deep in
    the caller's stack (a verdict the cache then kept)."""
    branches = "".join(f"    elif x == {i}:\n        y = {i}\n" for i in range(1, 1000))
    program = f"def f(x):\n    try:\n        y = 0\n    finally:\n        pass\n    if x == 0:\n        y = 0\n{branches}    return y\n"

    def deep(n: int):
        return deep(n - 1) if n else prefilter(program)

    prefilter.cache_clear()
    assert deep(sys.getrecursionlimit() - 100).status == "ok"
    assert prefilter(program).status == "ok"


def test_from_future_import_annotations_is_the_one_future_import_allowed(verifier):
    """Models write ``from __future__ import annotations`` above typed code: a right induction answer scored
    0 (``forbidden``). Exactly that statement is allowed; any other ``__future__`` import is not."""
    typed = "from __future__ import annotations\ndef f(x: int) -> int:\n    return x * 2\n"
    assert verifier.check_induction(typed, [("3", "6"), ("4", "8")]) == 1.0
    # string annotations of a typed record (typing.NamedTuple; dataclasses is not allowed)
    record = ("from __future__ import annotations\nfrom typing import NamedTuple\nclass P(NamedTuple):\n"
              "    x: int\ndef f(a: int) -> int:\n    return P(a).x * 2\n")  # fmt: skip
    assert verifier.check_induction(record, [("3", "6"), ("4", "8")]) == 1.0
    assert verifier.run("X = dir()\ndef f():\n    return X", "").output == "['__builtins__', '__name__']"
    for other in ("import __future__", "from __future__ import annotations, division",
                  "from __future__ import annotations as a", "from __future__ import barry_as_FLUFL"):  # fmt: skip
        assert verifier.run(f"{other}\ndef f(x):\n    return x", "1").status == "forbidden", other


def test_a_builtin_class_name_rebound_by_the_program_is_no_self_matching_pattern(verifier):
    """``case str(v)`` reads no attribute only while ``str`` is the built-in: rebound to a dataclass whose
    field is named ``gi_frame`` (a metaclass matching anything), the pattern walked from a generator to
    the child's frames and globals (the real ``os``; an ``ok`` verdict for the kernel's release)."""
    escape = (
        "from dataclasses import dataclass\n"
        "class M(type):\n    def __instancecheck__(cls, obj): return True\n"
        "@dataclass\nclass G(metaclass=M): gi_frame: int\n"
        "def walk(obj, cls):\n    str = cls\n    match obj:\n        case str(v): return v\n"
        "def f(x):\n    def gen():\n        yield 1\n    g = gen()\n    return walk(g, G) is not None\n"
    )
    verdict = verifier.run(escape, "1")  # refused now for its dataclasses import and its metaclass hook too
    assert verdict.status == "forbidden", verdict
    for binding in ("def f(str):", "def f(x):\n    for str in [1]: pass", "def f(x):\n    global str",
                    "from string import ascii_letters as str\ndef f(x):"):  # fmt: skip
        program = f"{binding}\n    match x:\n        case str(v): return v\n    return 0"
        assert verifier.run(program, "'a'").status == "forbidden", binding
    plain = "def f(x):\n    match x:\n        case str(v): return v + '!'\n        case int(n): return n + 1"
    assert verifier.run(plain, "'a'").output == "'a!'" and verifier.run(plain, "1").output == "2"


def test_the_future_record_a_call_changes_is_its_own(verifier):
    """The one ``__future__`` import handed out the worker's own record: a call that changed it changed the
    next call's (nondeterministic verdicts, depending on the order of a run_many). Each call gets a fresh
    record (and a child of its own)."""
    program = ("from __future__ import annotations\n"
               "def f(x):\n    annotations.optional = annotations.optional + (x,)\n"
               "    return len(annotations.optional)")  # fmt: skip
    alone = verifier.run(program, "1")
    assert alone.status == "ok"
    assert verifier.run_many([(program, "1"), (program, "2"), (program, "3")]) == [alone] * 3


def test_a_frame_reached_at_run_time_is_forbidden_whatever_the_program_does_with_the_error(verifier):
    """The pre-filter refuses constant format strings that walk to frame attributes only; one built at run
    time read the frames above the program as text (the worker's locals: the request's other programs;
    found by a red-team audit). The format check refuses such a walk when the program reads ``.format``
    (the audit hook, which refuses every frame attribute read in a guarded call, is the layer behind it:
    tested on its own below), and the verdict is ``forbidden`` even where the program catches the error."""
    gen = "    box = []\n    def gen():\n        s = '{0.gi' + '_frame.f_back}'\n"
    walk = f"def f(x):\n{gen}        yield s.format(box[0])\n    g = gen()\n    box.append(g)\n    return next(g)[:6]"
    caught = (f"def f(x):\n{gen}        try:\n            yield s.format(box[0])\n        except BaseException:\n"
              "            yield 'caught'\n    g = gen()\n    box.append(g)\n    return next(g)")  # fmt: skip
    traceback = ("def f(x):\n    try:\n        1 / 0\n    except Exception as e:\n"
                 "        s = '{0.' + '__traceback__.tb_frame}'\n        return s.format(e)[:5]")  # fmt: skip
    coroutine = ("def f(x):\n    async def c():\n        pass\n    k = c()\n    try:\n"
                 "        s = '{0.cr' + '_frame}'\n        return s.format(k)[:5]\n    finally:\n        k.close()")  # fmt: skip
    for program, field in (
        (walk, "0.gi_frame.f_back"),
        (caught, "0.gi_frame.f_back"),
        (traceback, "0.__traceback__.tb_frame"),
        (coroutine, "0.cr_frame"),
    ):
        verdict = verifier.run(program, "1")
        detail = f"a format string walks to a private or forbidden name at run time ({field})"
        assert verdict == Execution("forbidden", None, detail), verdict
    # the determinism re-run and the calls after a refused one agree; programs that read no frame are untouched
    assert verifier.run_many([(walk, "1"), ("def f(x):\n    return x * 2", "3")])[1].output == "6"
    record = (
        "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f(x):\n    return repr(P(x, 2))"
    )
    assert verifier.run(record, "1").output == "'P(x=1, y=2)'"  # namedtuple calls sys._getframe itself


def test_without_the_language_guards_a_program_may_read_frames():
    """``language_guards=False`` (trusted programs) turns the run-time frame refusal off with the rest."""
    program = "def f(x):\n    def g():\n        yield 1\n    return type(g().gi_frame).__name__"
    with Verifier(language_guards=False, workers=1) as trusting:
        assert trusting.run(program, "1").output == "'frame'"


def _in_a_fresh_interpreter(script: str, stdin: str | None = None) -> list[str]:
    """The output lines of ``script`` run by a fresh interpreter whose path starts with the verifier's own folder
    (``import _child, sandbox, verdicts`` as the worker imports them): for the child's guards one by one, in a
    process of their own (an audit hook cannot be removed, class creation stays routed). It must exit 0."""
    import subprocess

    folder = Path(prefilter_module.__file__).parent
    prelude = f"import sys\nsys.path.insert(0, {str(folder)!r})\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + script], input=stdin, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_audit_hook_refuses_getframe_and_class_changes_and_the_standard_library_falls_back():
    """The hook itself, armed in a fresh interpreter (it cannot be removed, so not in this one), for what no
    program is known to reach past the pre-filter: ``sys._getframe`` fails with the ValueError that
    ``namedtuple``, ``typing`` and ``enum`` catch (they then name no module) and is not recorded; a class
    change (the gadget a red-team review used: ``copy`` setting ``__class__`` of a module) fails and is."""
    script = (
        "import collections, enum, typing\n"
        "import _child\n"
        "_child.install_frame_guard()\n"
        "_child.arm_frame_guard(True)\n"
        "try:\n    sys._getframe()\nexcept ValueError:\n    pass\nelse:\n    raise SystemExit('getframe')\n"
        "assert _child.frame_guard_refusal() == ''\n"
        "P = collections.namedtuple('P', 'x y')\n"
        "assert repr(P(1, 2)) == 'P(x=1, y=2)'\n"
        "E = enum.Enum('E', 'A B')\nassert E.B.value == 2\n"
        "T = typing.TypeVar('T')\nassert repr(T) == '~T'\n"
        "def g():\n    yield 1\n"
        "try:\n    g().gi_frame\nexcept RuntimeError:\n    pass\nelse:\n    raise SystemExit('gi_frame')\n"
        "assert _child.frame_guard_refusal() == 'the program reached a frame at run time (gi_frame)'\n"
        "_child.arm_frame_guard(True)\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    tb = e.__traceback__\n"
        "try:\n    tb.tb_frame\nexcept RuntimeError:\n    pass\nelse:\n    raise SystemExit('tb_frame')\n"
        "_child.arm_frame_guard(True)\n"
        "class A: pass\nclass B: pass\n"
        "try:\n    A().__class__ = B\nexcept RuntimeError:\n    pass\nelse:\n    raise SystemExit('class')\n"
        "assert 'changed an object' in _child.frame_guard_refusal()\n"
        "_child.disarm_frame_guard()\n"
        "A().__class__ = B\nsys._getframe()\n"
        "print(sorted(_child._NOT_SET))\n"
    )
    # the child's copy of the pre-filter's shadowing names (the worker cannot import the package) agrees
    assert _in_a_fresh_interpreter(script) == [str(sorted(prefilter_module._SHADOWING_STORES))]


def test_the_run_time_checks_are_called_by_names_no_program_can_bind():
    """The rewritten code calls its checks by names with a dot, which no source can bind (spelled as
    identifiers, a class or a parameter of that name replaced them: red-team round 19), and a class body
    declares them global, so that a namespace a run-time metaclass's ``__prepare__`` made cannot supply them
    either. Run in a fresh interpreter (the hook cannot be removed), past the pre-filter."""
    source = (
        "import json\nclass __populora_own__:\n    def __new__(cls, t, n):\n        return t\n"
        "def prep(name, bases, **kw):\n"
        "    return {'populora.own': lambda t, n: t, '__populora_own__': lambda t, n: t}\n"
        "M = type(int)('M', (type(int),), {'__prepare__': prep})\n"
        "class C(metaclass=M):\n    'doc'\n    json.loads = len\n"
    )
    script = (
        "import _child\n"
        f"code = _child._compile({source!r}, '<p>', 'exec', True)\n"
        "names = set()\ntodo = [code]\nwhile todo:\n    unit = todo.pop()\n    names.update(unit.co_names)\n"
        "    todo.extend(c for c in unit.co_consts if type(c) is type(code))\n"
        "print(sorted(n for n in names if '.' in n))\n"
        "table = _child.safe_builtins(frozenset({'json'}))\n"
        "_child.install_frame_guard()\n_child.arm_frame_guard(True)\n"
        "try:\n    exec(code, {'__builtins__': table, '__name__': '__program__'})\n"
        "except RuntimeError:\n    pass\nelse:\n    raise SystemExit('written')\n"
        "print(_child.frame_guard_refusal())\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "['populora.own']",
        "the program wrote or deleted the attribute 'loads' of the module 'json', not one of its own",
    ]


@pytest.mark.parametrize(
    "binding",
    ["import json as __builtins__", "from json import dumps as __builtins__", "class __builtins__:\n    pass",
     "def g(__builtins__):\n    pass", "g = lambda __builtins__: 0",
     "try:\n    pass\nexcept ValueError as __builtins__:\n    pass",
     "match 1:\n    case __builtins__:\n        pass", "match [1]:\n    case [*__builtins__]:\n        pass",
     "match {}:\n    case {**__builtins__}:\n        pass"],
    ids=["import_as", "from_import_as", "class", "parameter", "lambda_parameter", "except_as", "capture",
         "star_capture", "mapping_rest"],
)  # fmt: skip
def test_no_form_binds_a_dunder_name(binding):
    found = prefilter(binding + "\ndef f(x):\n    return x\n")
    assert found.status == "forbidden", found
    assert found.detail.endswith(": binding the dunder name '__builtins__' is not allowed"), found


def test_format_strings_built_at_run_time_still_format():
    """The format check leaves ordinary formatting alone: positional and keyword fields, public attributes,
    item keys, nested width fields, ``format_map``, the unbound ``str.format``, objects of a program's own
    with a ``format`` method, and f-strings."""
    program = (
        "class Doc:\n    def format(self, n):\n        return 'doc' * n\n"
        "def f(x):\n    s = '{2.' + 'real}|{0:>{w}}|{p[k]}|{0:0{1}d}'\n"
        "    return [s.format(x, 4, 5, w=4, p={'k': 'v'}), '{a}-{b}'.format_map({'a': 1, 'b': 2}),\n"
        "            list(map(str.format, ['{}!', '<{}>'], 'ab')), Doc().format(2), f'{x:>{x}}']\n"
    )
    with (
        Verifier(workers=1, cache_size=0) as guarded,
        Verifier(workers=1, cache_size=0, language_guards=False) as plain,
    ):
        expected = "['5|   3|v|0003', '1-2', ['a!', '<b>'], 'docdoc', '  3']"
        assert guarded.run(program, "3") == plain.run(program, "3") == Execution("ok", expected, "")


@pytest.mark.parametrize(
    ("body", "header", "target"),
    [
        ("functools.seen = 1", "import functools\n", "'seen' of the module 'functools'"),
        ("m = functools\nm.partial = len", "import functools\n", "'partial' of the module 'functools'"),
        ("del json.dumps", "import json\n", "'dumps' of the module 'json'"),
        ("numbers.Number.grab = property(len)", "import numbers\n", "'grab' of the class 'Number'"),
        ("(a, fractions.Fraction.x) = (1, 2)", "import fractions\n", "'x' of the class 'Fraction'"),
        (
            "for typing.Any.x in [1]:\n    pass",
            "import typing\n",
            "'x' of the class 'Any'",
        ),
        (
            "calendar.c.formatweek = len",
            "import calendar\n",
            "'formatweek' of an object of the class 'TextCalendar' (a method of the class)",
        ),
    ],
)
def test_a_program_writes_no_attribute_of_what_is_not_its_own(verifier, body, header, target):
    """Standard modules and classes take no attribute writes or deletes from a guarded program, in any target
    position, nor standard objects one that shadows a method of their class: a program's names written into
    them changed what the standard library did next (``functools.seen``), and a ``property`` put on
    ``abc.ABCMeta`` was handed what a run-time format string walked to (red-team reviews; the second a full
    escape)."""
    program = _p(f"{body}\nreturn 1", header)
    assert prefilter(program).status == "ok"  # (the static half cannot tell whose object it is)
    _refused_at_run_time(
        verifier, program, f"the program wrote or deleted the attribute {target}, not one of its own"
    )


def test_a_program_writes_the_attributes_of_its_own_objects(verifier):
    """Its classes, their instances (also of its subclasses of standard classes), its functions, and the
    plain attributes of standard objects (``decimal``'s context, ``collections.defaultdict``,
    ``textwrap.TextWrapper``, exceptions, ``functools.partial``, an ``lru_cache`` wrapper), in every target
    position; classes it makes through the functional forms of ``namedtuple``, ``enum`` and ``typing`` are
    its own (a review of programs the checks broke)."""
    program = (
        "import decimal, collections, fractions, textwrap, functools, enum, typing, json\n"
        "@functools.lru_cache(maxsize=None)\ndef sq(n):\n    return n * n\n"
        "class P:\n    def __init__(self, a):\n        self.a, self.b = a, [a]\n        self.a += 1\n"
        "    def drop(self):\n        del self.b\n        return self.a\n"
        "class F(fractions.Fraction):\n    pass\n"
        "def f(x):\n    p = P(x)\n    P.k = 2\n    f.memo = {}\n    (p.c, (p.d, q)) = (1, (2, 3))\n"
        "    for p.e in range(3):\n        pass\n    F.tag = 'f'\n"
        "    decimal.getcontext().prec = 5\n    d = collections.defaultdict(int)\n    d.default_factory = list\n"
        "    w = textwrap.TextWrapper(width=15)\n    w.width = 25\n    sq.calls = 0\n    part = functools.partial(pow, 2)\n"
        "    part.label = 'pow2'\n    Pt = collections.namedtuple('Pt', 'x y')\n    Pt.origin = Pt(0, 0)\n"
        "    Color = enum.Enum('Color', 'RED GREEN')\n    Color.RED.points = 3\n"
        "    Pair = typing.NamedTuple('Pair', [('a', int)])\n    Pair.zero = Pair(0)\n"
        "    try:\n        json.loads('{')\n    except json.JSONDecodeError as e:\n        e.source = 'in'\n"
        "        seen = e.source\n"
        "    return [p.drop(), P.k, p.c, p.d, p.e, F.tag, str(decimal.Decimal(1) / 3), d['z'], w.width, sq.calls,\n"
        "            part.label, tuple(Pt.origin), Color.RED.points, tuple(Pair.zero), seen]\n"
    )
    expected = Execution(
        "ok", "[2, 2, 1, 2, 2, 'f', '0.33333', [], 25, 0, 'pow2', (0, 0), 3, (0,), 'in']", ""
    )
    assert verifier.run(program, "1") == expected
    with Verifier(workers=1, cache_size=0, language_guards=False) as plain:
        assert plain.run(program, "1") == expected


def test_a_format_read_spelled_with_compatibility_characters_is_checked(verifier):
    """Identifiers are NFKC-normalised when compiled: ``.ｆｏｒｍａｔ`` reads ``format`` with no ``format`` in the
    text. The checks are chosen from the compiled names, not the text."""
    program = "def f(x):\n    return ('{0.' + '_' * 2 + 'doc' + '_' * 2 + '}').\uff46\uff4f\uff52\uff4d\uff41\uff54(1)\n"
    assert "format" not in program
    _refused_at_run_time(
        verifier, program, "a format string walks to a private or forbidden name at run time (0.__doc__)"
    )


def test_guarded_user_strings_aliases_and_enums_still_work(verifier):
    """The replaced ``UserString.format``/``format_map``, the alias guard (a class, special form or alias as
    origin) and the enum guard leave ordinary use alone."""
    program = (
        "import collections, typing, enum\nclass C(enum.IntEnum):\n    A = 1\n    B = 2\n"
        "class Co(enum.Flag):\n    R = 1\n    G = 2\ndef f(x):\n    s = collections.UserString('{0}-{1:>3}')\n"
        "    m = collections.UserString('{a}')\n"
        "    return [s.format(1, 2), m.format_map({'a': x}), str(typing.List[int]), typing.Optional[int] == typing.Union[int, None],\n"
        "            typing.get_origin(typing.Annotated[list[int], 'm']) is typing.Annotated, typing.List[int].copy is list.copy,\n"
        "            C.B + 1, (Co.R | Co.G).value, C(2).name, enum.Enum('E', 'P Q').Q.value]\n"
    )
    expected = Execution("ok", "['1-  2', '1', 'typing.List[int]', True, True, True, 3, 3, 'B', 2]", "")
    assert verifier.run(program, "1") == expected
    with Verifier(workers=1, cache_size=0, language_guards=False) as plain:
        assert plain.run(program, "1") == expected


@pytest.mark.parametrize(
    ("program", "args", "output"),
    [
        # a program's own exception with an `obj` field (only AttributeError's is the failed lookup's)
        (
            "class Missing(Exception):\n    def __init__(self, obj):\n        self.obj = obj\ndef f(x):\n"
            "    try:\n        raise Missing(x)\n    except Missing as e:\n        return e.obj\n",
            "3",
            "3",
        ),
        # item keys with one leading underscore (JSON records' `_id`)
        (
            "def f(doc):\n    return 'id={0[_id]} t={0[title]}'.format(doc)\n",
            "{'_id': 'a1', 'title': 'x'}",
            "'id=a1 t=x'",
        ),
        # a malformed template fails when called, not when its method is read
        (
            "def f(ts):\n    out = []\n    for t in ts:\n        render = t.format\n        try:\n"
            "            out.append(render(42))\n        except (ValueError, IndexError) as e:\n"
            "            out.append('bad')\n    return out\n",
            "['{}', '{', '{0} {1}']",
            "['42', 'bad', 'bad']",
        ),
        # a public attribute that merely starts like a frame attribute (`f_name`), in a constant format string
        (
            "class P:\n    def __init__(self, a):\n        self.f_name = a\ndef f(a):\n"
            "    return '{0.f_name}!'.format(P(a))\n",
            "'Ada'",
            "'Ada!'",
        ),
        # deep copies of methods: `str.lower` and a program object's bound method reduce to getattr(obj, name)
        (
            "import copy\nclass A:\n    def get(self):\n        return 7\ndef f(ws):\n"
            "    key = copy.deepcopy({'k': str.lower})['k']\n    return [sorted(ws, key=key), copy.copy(A().get)()]\n",
            "['b', 'A', 'c']",
            "[['A', 'b', 'c'], 7]",
        ),
        # and methods named like the checked reads, which copy makes through the same check
        (
            "import copy\nclass A:\n    def format(self, s):\n        return s + '!'\n    def obj(self):\n"
            "        return 3\ndef f(x):\n    a = A()\n"
            "    return [copy.copy(a.format)(x), copy.deepcopy(a.obj)(), copy.copy(x.format)()]\n",
            "'hi'",
            "['hi!', 3, 'hi']",
        ),
        # a UserDict holding a defaultdict is copied with the defaultdict's own copy
        (
            "import collections, copy\nclass G(collections.UserDict):\n    def __init__(self):\n"
            "        self.data = collections.defaultdict(list)\ndef f(x):\n    g = G()\n    c = copy.copy(g)\n"
            "    c.data['z'].append(x)\n    return [type(c.data) is collections.defaultdict, dict(c.data), dict(g.data)]\n",
            "1",
            "[True, {'z': [1]}, {}]",
        ),
    ],
)
def test_ordinary_programs_the_run_time_checks_once_refused(verifier, program, args, output):
    """Programs a review of the run-time checks found refused or changed, now as in plain Python."""
    assert verifier.run(program, args) == Execution("ok", output, "")


def test_a_dunder_item_key_in_a_run_time_format_string_is_refused(verifier):
    """Item keys with one underscore are data (``_id``); a dunder key still is not walked at run time."""
    program = "def f(d):\n    return ('{0[' + '_' * 2 + 'x' + '_' * 2 + ']}').format(d)\n"
    _refused_at_run_time(
        verifier, program, "a format string walks to a private or forbidden name at run time (0[__x__])"
    )


def test_enum_mixins_and_typing_decorators_on_a_program_s_own_still_work(verifier):
    """Enums with data types (str, int), and typing's final/no_type_check/runtime_checkable on the program's
    own classes and functions, under the guards of enum's __new__ and of typing's flag-setting decorators."""
    program = (
        "import enum, typing\nclass Color(str, enum.Enum):\n    R = 'r'\nclass N(int, enum.Enum):\n    A = 1\n"
        "@typing.final\nclass Leaf:\n    pass\n@typing.no_type_check\ndef g(a: 'x') -> 'y':\n    return a\n"
        "@typing.runtime_checkable\nclass P(typing.Protocol):\n    def m(self): ...\n"
        "def f(x):\n    from json import decoder\n"
        "    return [Color.R.value, N.A + 1, g(x), isinstance(Leaf(), P), decoder.JSONDecoder().decode('[1]')]\n"
    )
    assert verifier.run(program, "1") == Execution("ok", "['r', 2, 1, False, [1]]", "")


def test_the_guarded_import_refuses_forbidden_submodules_however_named():
    """The child's import refuses ``json.tool`` whether named whole or in a ``from`` list (the pre-filter's
    second layer, for a program that reaches ``__import__`` at run time), and still imports other names."""
    script = (
        "import _child\n"
        "imp = _child.safe_builtins(frozenset({'json'}))['__import__']\n"
        "for name, fromlist in [('json.tool', ()), ('json', ('tool',)), ('json', ('decoder', 'tool'))]:\n"
        "    try:\n        imp(name, None, None, fromlist)\n    except ImportError:\n        pass\n"
        "    else:\n        raise SystemExit(name + repr(fromlist))\n"
        "print(imp('json', None, None, ('decoder',)).decoder.__name__, 'json.tool' in sys.modules)\n"
        "import json\njson.__name__ = 'importlib'\n"
        "try:\n    imp('json', None, None, ('util',))\nexcept ImportError:\n    pass\n"
        "else:\n    raise SystemExit('renamed')\n"
        "import opcode\nprint(_child._ATTRIBUTE_WRITES == {opcode.opmap['STORE_ATTR'], opcode.opmap['DELETE_ATTR']})\n"
    )
    # and the run-time check of attribute writes knows this Python's opcodes for them
    assert _in_a_fresh_interpreter(script) == ["json.decoder False", "True"]


def test_the_copy_gadget_that_switched_a_module_s_class_reads_nothing(monkeypatch):
    """A red-team review's escape: ``copy.copy`` of an object whose ``__reduce_ex__`` state set a module's
    ``__class__`` to a dataclass of the program's, so that ``dataclasses.replace`` read any attribute by name
    (``typing.sys._getframe``), up to the worker's frame holding the request's other programs: ``ok`` with
    their sources as output. The pre-filter now refuses it (``dataclasses`` is no longer allowed; also
    ``make_dataclass``, ``__reduce_ex__``); with the pre-filter switched off, the guarded import refuses
    ``dataclasses`` at run time: nothing read."""
    from populora_env.verifier import verifier as verifier_module

    gadget = (
        "import copy, dataclasses, typing\nModule = type(typing)\n"
        "def grab(obj, name):\n"
        "    M = dataclasses.make_dataclass('M', [name], bases=(Module,), init=False,\n"
        "                                   namespace={'__new__': lambda cls, **kw: kw})\n"
        "    class R:\n"
        "        def __reduce_ex__(self, proto):\n"
        "            return (lambda: obj, (), (None, {'__class__': M}))\n"
        "    copy.copy(R())\n"
        "    return dataclasses.replace(obj)[name]\n"
        "def f(x):\n"
        "    getframe = grab(grab(typing, 'sys'), '_getframe')\n"
        "    k = 0\n"
        "    while ('{0.f' + '_code.co_name}').format(getframe(k)) != 'handle':\n"
        "        k += 1\n"
        "    return ('{0.f' + '_locals[jobs]}').format(getframe(k))\n"
    )
    assert prefilter(gadget) == Prefiltered(
        "forbidden", "line 1: import of module 'dataclasses' is not allowed"
    )
    monkeypatch.setattr(verifier_module, "prefilter", lambda program: Prefiltered("ok"))
    victims = [(f"def f(x):\n    return 'SECRET-{i}' + str(x)\n", "2") for i in range(15)]
    with Verifier(workers=1, cache_size=0) as v:
        first, *rest = v.run_many([(gadget, "1"), *victims])
    assert first == Execution(
        "runtime", None, "while defining the program: ImportError: import of 'dataclasses' is not allowed"
    )
    assert [v.output for v in rest] == [f"'SECRET-{i}2'" for i in range(15)]


# Escapes of the language layer found by red-team reviews, each now refused by the pre-filter (the detail
# names the first rule it breaks; most also break others).
LANGUAGE_ESCAPES = {
    # typing's alias class forwards every attribute without double underscores to its origin: as a dataclass
    # base, dataclasses.replace read any field name there (typing.sys) and called the class's own __class__
    "alias_forwarding": (  # (the dataclass half of it, dataclasses.replace, is refused at its import now)
        "import typing\nclass B(type(typing.List[int]), _root=True):\n    pass\ndef f(x):\n    return 1\n",
        "line 2: the private keyword argument '_root' is not allowed",
    ),
    "alias_without_root": (
        "import typing\nclass B(type(typing.List[int])):\n    def __init_subclass__(cls, **kw):\n        pass\n"
        "def f(x):\n    return 1\n",
        "line 3: defining the special method '__init_subclass__' is not allowed",
    ),
    "class_method_named_class": (
        "class D:\n    def __class__(self, **kw):\n        return kw\ndef f(x):\n    return 1\n",
        "line 2: defining the special method '__class__' is not allowed",
    ),
    # enum.global_enum copied __members__ into the globals of the module __module__ named: a forged _line
    "global_enum_writes_a_module": (
        "import enum, dataclasses\ndef f(x):\n    C = dataclasses.make_dataclass('C', [], namespace={'__module__': "
        "'_child', '__members__': {'_guard': {'on': False}}})\n    enum.global_enum(C)\n    return 1\n",
        "line 1: import of module 'dataclasses' is not allowed",
    ),
    "global_enum_alone": (
        "import enum\ndef f(x):\n    E = enum.Enum('E', {'A': 1}, module='builtins')\n    enum.global_enum(E)\n"
        "    return 1\n",
        "line 4: access to attribute 'global_enum' is not allowed",
    ),
    # copy's reconstruction set any attribute a program's __reduce_ex__ state named, on any object
    "copy_setattr": (
        "import copy, math\ndef put(obj, name, value):\n    class R:\n        def __reduce_ex__(self, proto):\n"
        "            return (lambda: obj, (), (None, {name: value}))\n    copy.copy(R())\n"
        "def f(x):\n    put(math, 'pi', 3)\n    return 1\n",
        "line 4: defining the special method '__reduce_ex__' is not allowed",
    ),
    # copyreg's table, under a public name: copy rebuilt K's instances from what the lambda returned
    "copy_dispatch_table": (
        "import copy, math\nclass K:\n    pass\ndef f(x):\n"
        "    copy.dispatch_table[K] = lambda k: (lambda: math, (), (None, {'pi': 3}))\n    copy.copy(K())\n"
        "    return math.pi\n",
        "line 5: access to attribute 'dispatch_table' is not allowed",
    ),
    # dataclasses called the module global `exec` with the globals of the module a class's __module__ named
    # `dataclasses.exec = grab` (then dataclass() handed grab the real built-ins); the module itself is not
    # allowed now, and no module's exec/eval/compile may be shadowed
    "exec_shadowed_in_a_module": (
        "import collections\ndef f(x):\n    collections.eval = print\n    return 1\n",
        "line 3: assigning an attribute named 'eval' is not allowed",
    ),
    # enum's pickling helper returns the real built-in getattr (then sys, builtins, _child, os, exec)
    "enum_pickle_getattr": (
        "import enum\nclass E(enum.Enum):\n    A = 1\ndef f(x):\n    g = enum.pickle_by_enum_name(E.A, 4)[0]\n"
        "    return repr(g(enum, 'sys'))\n",
        "line 5: access to attribute 'pickle_by_enum_name' is not allowed",
    ),
    # a format field spelled with escapes: the fast path saw no brace and passed the source unwalked
    "escaped_format_field": (
        "def f(x):\n    return '\\x7b0.\\x5f_doc\\x5f_}'.format(1)\n",
        "line 2: a format string that reaches private or frame attributes is not allowed",
    ),
    "type_as_a_value": (
        "def f(x):\n    T = type\n    K = T('K', (), {'a': 1})\n    return K.a\n",
        "line 2: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
        "a class from a dict of any names)",
    ),
    "type_look_alike_as_a_value": (  # fullwidth letters: NFKC makes them `type`, the source text has no "type"
        "def f(x):\n    T = \uff54\uff59\uff50\uff45\n    return 1\n",
        "line 2: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
        "a class from a dict of any names)",
    ),
    "class_keywords_unpacked": (
        "import typing\nclass B(type(typing.List[int]), **{'r' + 'oot': True}):\n    pass\ndef f(x):\n    return 1\n",
        "line 2: class bases or keywords unpacked with * or ** are not allowed",
    ),
}


_INJECTED = '"a\\"\\n box.append(1)\\n #"'  # a field name that closes a string and adds a statement


@pytest.mark.parametrize(
    "setup",
    [
        # a base's field renamed: the subclass's generated methods paste the new name
        "@dataclasses.dataclass\nclass A:\n    a: int = 0\n"
        f"dataclasses.fields(A)[0].name = {_INJECTED}\n"
        "@dataclasses.dataclass(init=False, eq=False)\nclass B(A):\n    pass\n",
        # a functional TypedDict takes any string as a key, and dataclass() reads its annotations
        f"T = typing.TypedDict('T', {{{_INJECTED}: int}})\ndataclasses.dataclass(init=False, eq=False)(T)\n",
        # an enum member named __annotations__ is the class's annotations
        f"E = enum.Enum('E', {{'__annotations__': {{{_INJECTED}: int}}}})\n"
        "dataclasses.dataclass(init=False, eq=False)(E)\n",
        # a str subclass answers isidentifier() and formats as it likes (dataclasses pastes f'{f.name}')
        "class S(str):\n    def isidentifier(self):\n        return True\n    def __format__(self, spec):\n"
        "        return 'a, *, b=box.append(1)'\n"
        "dataclasses.dataclass(typing.TypedDict('T', {S('a'): int}))\n",
        "@dataclasses.dataclass\nclass S:\n    a: int = 0\nclass G:\n    name = property(lambda f: 'a=box.append(1)')\n"
        "dataclasses.Field.name = G.name\n@dataclasses.dataclass\nclass D(S):\n    pass\n",
        # a metaclass whose __dict__ property shows dataclasses other annotations than the class holds
        "M = type(int)('M', (type(int),), {'__dict__': property(lambda c: {'__annotations__': {'a=box.append(1)': int}})})\n"
        "dataclasses.dataclass(M('C', (), {}))\n",
        # a metaclass whose own metaclass makes it hash and compare equal to type (a set lookup ran them)
        "MM = type(int)('MM', (type(int),), {'__hash__': lambda c: hash(type(int)), '__eq__': lambda c, o: True})\n"
        "M = MM('M', (type(int),), {'__dict__': property(lambda c: {'__annotations__': {'a=box.append(1)': int}})})\n"
        "dataclasses.dataclass(M('C', (), {}))\n",
        # a metaclass holding __dataclass_fields__ for its classes, and a Field subclass as a default
        "F = type(int)('F', (dataclasses.Field,), {})\n"
        "C = type(int)('C', (), {'__annotations__': {'a': int}, 'a': F(0, None, True, True, None, True, {}, False)})\n"
        "dataclasses.dataclass(C)\n",
    ],
    ids=[
        "renamed_field",
        "typed_dict",
        "enum_annotations",
        "str_subclass",
        "field_name_slot_replaced",
        "metaclass_dict",
        "metaclass_equal_to_type",
        "field_subclass",
    ],
)
def test_dataclasses_is_refused_whatever_route_a_program_takes_into_its_generated_code(verifier, setup):
    """``dataclasses`` writes field names into the source of the methods it generates and compiles it: a
    name holding a quote and a newline ran statements of the program's choosing, with the real built-ins.
    Red-team reviews found these eight routes past every check in turn (the last ran program code inside
    the class processing and changed ``Field.name`` after any check could run), so ``dataclasses`` is no
    longer an allowed module: each program is refused at its import."""
    program = f"import dataclasses, enum, typing\nbox = []\n{setup}def f(x):\n    return len(box)\n"
    detail = "line 1: import of module 'dataclasses' is not allowed"
    assert prefilter(program) == Prefiltered("forbidden", detail)
    assert verifier.run(program, "1") == Execution("forbidden", None, detail)


# What the check of the classes a program makes says (``_child.check_class``): many programs below reach the
# guards they test through a class made at run time, which that check now refuses first.
_CLASS_CHECK = ("the program made a metaclass at run time", "the program made a class holding the name")


def _below_the_class_check(program: str) -> Execution:
    """The verdict of ``program``'s call by the child's language layer with the guards the worker installs but
    the check of the classes programs make (``sandbox.route_class_creation``) and the closing of
    ``types.GenericAlias``'s subclasses and of ``super`` to subclasses (``GenericAlias`` itself is closed):
    in a fresh interpreter, the program prepared and run by ``_child`` in a forked child, no pre-filter and
    no OS sandbox. The guards behind those, for programs that reach them only through such classes."""
    script = (
        "import json, os\nimport _child, sandbox, verdicts\n"
        "sandbox.close_to_subclasses(type(list[int]))\n_child.install_frame_guard()\n"
        "_child.install_copy_guard()\nallowed, program = json.loads(sys.stdin.read())\n"
        "prepared = _child.prepare(program, ['1'], allowed=frozenset(allowed)).call(0)\n"
        "read, write = os.pipe()\nif os.fork() == 0:\n"
        "    _child.run_program(prepared, write, max_output=100000, max_depth=50)\n    os._exit(0)\n"
        "os.wait()\nprint(json.dumps(verdicts.parse_line(os.read(read, 200000).rstrip(b'\\n'))))\n"
    )
    request = json.dumps([sorted(prefilter_module.ALLOWED_MODULES), program])
    (line,) = _in_a_fresh_interpreter(script, stdin=request)
    return Execution(*json.loads(line))


def _past_the_class_check(verifier, program: str) -> Execution:
    """``program``'s verdict from the verifier, or, where the verifier refused a class the program made (as it
    must then), from the guards behind that check (``_below_the_class_check``)."""
    got = verifier.run(program, "1")
    if got.status == "forbidden" and got.detail.startswith(_CLASS_CHECK):
        return _below_the_class_check(program)
    return got


def _refused_at_run_time(verifier, program: str, detail: str) -> None:
    """``program`` passes the pre-filter (the static half) and its call is ``forbidden`` with ``detail``: by the
    verifier, or by the guards behind the check of the classes programs make where that check refused a
    class the program made first (both layers are then tested)."""
    assert prefilter(program).status == "ok"
    assert _past_the_class_check(verifier, program) == Execution("forbidden", None, detail)


def test_copy_imported_by_the_standard_library_itself_is_guarded_too(verifier):
    """``collections.UserDict.copy`` imports ``copy`` itself, past the program's guarded import: the worker
    now preloads and wraps ``copy``, so that route refuses a rebuild into a module as well (a red-team
    review's finding: it set attributes on ``typing`` and on ``ABCMeta``)."""
    program = (
        "import collections, math\ndef f(x):\n"
        "    U = type(int)('U', (collections.UserDict,), {'__copy__': None,\n"
        "        '__reduce_ex__': lambda self, p: (lambda: math, (), {'pi': 3})})\n"
        "    try:\n        U().copy()\n    except Exception:\n        pass\n    return math.pi\n"
    )
    assert "import copy" not in program
    _refused_at_run_time(
        verifier, program, "the program made copy rebuild an object into a module (copy.copy/deepcopy)"
    )


def test_a_typing_alias_of_a_module_relays_nothing(verifier):
    """typing's alias class relays every name without double underscores to its origin: an alias of the
    ``dataclasses`` module, written to by ``copy`` (the module itself refused), set ``dataclasses.exec``
    (a red-team review's full escape). An alias of a module or function now refuses to relay."""
    program = (
        "import typing, math\ndef f(x):\n"
        "    alias = type(typing.List[int])(math, (int,), name='L')\n"
        "    try:\n        return alias.gcd is math.gcd\n    except Exception:\n        return 'caught'\n"
    )
    _refused_at_run_time(verifier, program, "the program made a typing alias relay attributes of a module")
    plain = "import typing\ndef f(x):\n    return [typing.List[int].copy is list.copy, str(typing.Dict[str, int])]"
    assert verifier.run(plain, "1").output == "[True, 'typing.Dict[str, int]']"


def test_copy_rebuilds_into_no_typing_object(verifier):
    """An alias of a standard class (``string.Template``), rebuilt by ``copy`` with a slot state, relayed the
    write to the class: any run-time name set on it (a red-team review's finding). Refused now."""
    program = (
        "import copy, typing, string\ndef f(x):\n    G = type(typing.List[int])\n"
        "    R = type(int)('R', (), {'__reduce_ex__': lambda s, p: (G, (string.Template, (int,)), (None, {'hid' + 'den': 42}))})\n"
        "    try:\n        copy.copy(R())\n    except Exception:\n        pass\n    return 1\n"
    )
    _refused_at_run_time(
        verifier, program, "the program made copy rebuild an object into a _GenericAlias (copy.copy/deepcopy)"
    )


def test_a_program_s_subclass_of_the_alias_class_writes_nothing_through_it(verifier):
    """A subclass of typing's alias class (``**{'_root': True}`` unpacked at run time) rebuilt by ``copy``
    relayed a write of any run-time name to its origin, a standard class (``fractions.Fraction``); a direct
    write through an alias is refused too (a red-team review's findings). Since round 20 such a subclass is
    refused when it is made."""
    through_copy = (
        "import typing, copy, fractions\ndef f(x):\n    A = type(typing.List[int])\n"
        "    S = type(int)('S', (A,), {}, **{'_' + 'root': True})\n    s = S(fractions.Fraction, (int,))\n"
        "    R = type(int)('R', (), {'__reduce_ex__': lambda self, p: (lambda: s, (), (None, {'lim' + 'it_x': 42}))})\n"
        "    copy.copy(R())\n    return 1\n"
    )
    _refused_at_run_time(verifier, through_copy, "the program subclassed one of typing's own classes ('S')")
    direct = "import typing, fractions\ndef f(x):\n    a = type(typing.List[int])(fractions.Fraction, (int,))\n    a.limit_x = 1\n    return 1\n"
    _refused_at_run_time(verifier, direct, "the program set an attribute through a typing alias ('limit_x')")


def test_copy_rebuilds_into_no_existing_object_of_the_standard_library(verifier):
    """A run-time class's ``__reduce_ex__`` whose callable returns an object that exists already made ``copy``
    write the state into it: a standard object a program may not write itself (``calendar.c``). Copies of
    standard objects, made anew by their classes, still work."""
    program = (
        "import copy, calendar\ndef f(x):\n    K = type(int)('K', (), {'__reduce_ex__': lambda self, p: "
        "(lambda: calendar.c, (), {'firstweekday': 3})})\n    copy.copy(K())\n    return calendar.c.firstweekday\n"
    )
    _refused_at_run_time(
        verifier, program, "the program made copy rebuild an object into a TextCalendar (copy.copy/deepcopy)"
    )
    copies = (
        "import copy, collections, fractions, decimal, array, statistics, enum\nclass P:\n"
        "    def __init__(self):\n        self.a = [1]\nE = enum.Enum('E', 'A B')\ndef f(x):\n"
        "    objs = [P(), collections.Counter('aab'), collections.OrderedDict(a=1), fractions.Fraction(1, 3),\n"
        "            decimal.Decimal('1.5'), array.array('i', [1, 2]), statistics.NormalDist(1, 2), E.A,\n"
        "            collections.deque([1])]\n    c = copy.deepcopy(objs)\n    d = [copy.copy(o) for o in objs]\n"
        "    return [c[0].a, c[1] == objs[1], str(c[3]), str(d[4]), list(c[5]), c[6] == objs[6], c[7] is E.A,\n"
        "            list(c[8])]\n"
    )
    assert verifier.run(copies, "1") == Execution(
        "ok", "[[1], True, '1/3', '1.5', [1, 2], True, True, [1]]", ""
    )


@pytest.mark.parametrize(
    "callable_", ["functools.partial(lambda: calendar.c)", "max", "calendar.TextCalendar"]
)
def test_a_copy_of_a_program_s_object_is_the_program_s_own(verifier, callable_):
    """A run-time class's ``__reduce_ex__`` can name any callable: one that returns an object that exists
    already (``calendar.c``, through a ``functools.partial`` or ``max``) had ``copy`` write the state into it,
    private names included (a red-team review). A copy of a program's object must be the program's own (a
    new standard object too, as with the class)."""
    made = "([calendar.c],)" if callable_ == "max" else "()"
    program = (
        "import copy, calendar, functools\ndef f(x):\n    K = type(int)('K', (), {'_' + '_reduce_ex__': "
        f"lambda self, p: ({callable_}, {made}, {{'_' + 'firstweekday': 3}})}})\n    copy.copy(K())\n"
        "    return calendar.c.firstweekday\n"
    )
    _refused_at_run_time(
        verifier, program, "the program made copy rebuild an object into a TextCalendar (copy.copy/deepcopy)"
    )


def test_a_user_dict_copy_writes_into_nothing_but_a_new_instance(verifier):
    """``UserDict.__copy__`` made its copy with ``self.__class__.__new__`` and wrote into its ``__dict__``: a
    run-time class whose ``__class__`` property named a class whose ``__new__`` returned ``json`` had its
    attributes (``__path__`` included) written into json's globals, then ``from json import code`` ran any
    code (a red-team review's full escape). The copy is made with ``type(self)`` now and must be new."""
    program = (
        "import collections, copy, json\ndef f(x):\n    u = '_' * 2\n"
        "    P = type(int)('P', (), {u + 'new' + u: lambda c: json})\n    d = {'planted': 1, 'data': {}}\n"
        "    U = type(int)('U', (collections.UserDict,), {u + 'class' + u: property(lambda s: P),\n"
        "                                                 u + 'dict' + u: property(lambda s: d)})\n"
        "    copy.copy(U())\n    return hasattr(json, 'planted')\n"
    )
    assert prefilter(program).status == "ok"
    assert _past_the_class_check(verifier, program) == Execution("ok", "False", "")
    # the standard library's own UserDict.__copy__ (this process's) writes into the module
    import types

    target = types.ModuleType("target")
    namespace = {"__builtins__": __builtins__}
    exec(program.replace("import collections, copy, json", "import collections, copy"), namespace)
    namespace["json"] = target
    assert namespace["f"](1) is True and target.planted == 1
    copies = (
        "import collections, copy\nclass D(collections.UserDict):\n    pass\n"
        "class L(collections.UserList):\n    pass\ndef f(x):\n    d, l = D(a=1), L([1, 2])\n    d.tag = 't'\n"
        "    c, m = copy.copy(d), copy.copy(l)\n    c['b'] = 2\n    m.append(3)\n"
        "    return [dict(d), dict(c), c.tag, list(l), list(m), type(c) is D, type(m) is L]\n"
    )
    expected = "[{'a': 1}, {'a': 1, 'b': 2}, 't', [1, 2], [1, 2, 3], True, True]"
    assert verifier.run(copies, "1") == Execution("ok", expected, "")


def test_the_object_a_failed_lookup_kept_is_not_handed_out(verifier):
    """``AttributeError.obj`` (Python 3.10+) is the object a lookup failed on: it handed back what a format
    string built at run time had walked to (a red-team review). Reading ``obj`` of an exception is refused at
    run time (also as a class pattern's keyword, statically); ``obj`` of a program's own object is not."""
    caught = (
        "def f(x):\n    try:\n        x.nope\n    except AttributeError as e:\n        return str(e.obj)\n"
    )
    _refused_at_run_time(
        verifier,
        caught,
        "the program read the object a failed lookup kept in an exception (AttributeError.obj)",
    )
    own = (
        "class H:\n    def __init__(self, obj):\n        self.obj = obj\ndef f(x):\n    return H(x).obj + 1\n"
    )
    assert verifier.run(own, "1") == Execution("ok", "2", "")
    pattern = "def f(x):\n    match x:\n        case str(format=m):\n            return m\n"
    assert prefilter(pattern).detail == "line 3: a class pattern may not read the attribute 'format'"


def test_copy_takes_no_program_memo(verifier):
    """``copy.deepcopy(x, memo)`` with a program's mapping: its ``get`` swapped the reconstruction state after
    the guard had checked it (dunder and ``exec`` keys set; a red-team review's finding). A plain dict is
    refused too: deepcopy keeps every original it copies in its memo, with each instance's live ``__dict__``,
    and a program read and wrote private attributes through it (a later review). A deep copy still works."""
    program = "import copy\nclass M(dict):\n    pass\nclass K:\n    pass\ndef f(x):\n    copy.deepcopy(K(), M())\n    return 1\n"
    _refused_at_run_time(verifier, program, "the program gave copy a memo of its own (a M)")
    plain = (
        "import copy, calendar\ndef f(x):\n    m = {}\n    copy.deepcopy(calendar.c, m)\n"
        "    return [sorted(v) for v in m.values() if type(v) is dict]\n"
    )
    _refused_at_run_time(verifier, plain, "the program gave copy a memo of its own (a dict)")
    nested = "import copy\ndef f(x):\n    a = [x]\n    b = copy.deepcopy([a, a, {'k': (a,)}])\n    return [b, b[0] is b[1] is b[2]['k'][0]]\n"
    assert verifier.run(nested, "1") == Execution("ok", "[[[1], [1], {'k': ([1],)}], True]", "")


def test_copy_does_not_rebuild_a_bound_method_with_getattr(verifier):
    """A bound method reduces to ``(getattr, (obj, name))`` with the name its callable reports: a program's
    callable named ``__globals__`` bound to ``enum.unique`` made ``copy.copy`` return enum's globals, the
    real built-ins among them (a red-team review's full escape)."""
    program = (
        "import copy, enum\nclass C:\n    def m(self):\n        pass\ndef f(x):\n    u = '_' * 2\n"
        "    N = type(int)('N', (), {u + 'name' + u: u + 'globals' + u, u + 'call' + u: lambda self, *a: None})\n"
        "    method = type(C().m)\n    return str(type(copy.copy(method(N(), enum.unique))))\n"
    )
    _refused_at_run_time(
        verifier, program, "the program made copy rebuild an object by calling the built-in getattr"
    )


@pytest.mark.parametrize(
    ("build", "detail"),
    [
        ("lambda s, p: (Box, (), type(int)('T', (tuple,), {})((None, {'ex' + 'ec': 1})))",
         "the program made copy set an attribute it may not set (a T)"),
        ("lambda s, p: (type(list[int]), (math, ()), {'pi': 3})",
         "the program made copy rebuild an object into a GenericAlias (copy.copy/deepcopy)"),
    ],
    ids=["tuple_subclass_state", "generic_alias_target"],
)  # fmt: skip
def test_copy_refuses_state_subclasses_and_generic_aliases(verifier, build, detail):
    """A state that is a subclass of tuple or dict was read by ``copy`` as one, past the key check; a
    ``types.GenericAlias`` relays ``__dict__`` to its origin (a module's globals). Both refused."""
    program = (
        "import copy, math\nclass Box:\n    pass\ndef f(x):\n"
        f"    K = type(int)('K', (), {{'__reduce_ex__': {build}}})\n"
        "    try:\n        copy.copy(K())\n    except Exception:\n        pass\n    return math.pi\n"
    )
    _refused_at_run_time(verifier, program, detail)


def test_copy_sets_no_shadowing_or_dunder_state(verifier):
    """``copy`` sets the attributes a reconstruction state names on what it rebuilt: a state naming ``exec``
    (for an object that forwards writes) or a dunder is refused, whatever the target."""
    program = (
        "import copy\nclass Box:\n    pass\ndef f(x):\n"
        "    K = type(int)('K', (), {'__reduce_ex__': lambda self, p: (Box, (), (None, {'ex' + 'ec': 1}))})\n"
        "    copy.copy(K())\n    return 1\n"
    )
    _refused_at_run_time(verifier, program, "the program made copy set an attribute it may not set ('exec')")


def _module_into_copy(build_class: str) -> str:
    """A program that makes ``copy`` rebuild an object into the module ``math`` and set ``math.pi`` there,
    through a class made by ``build_class`` (whose ``__reduce_ex__`` the special-method rule cannot see)."""
    return (
        "import copy, enum, math\ndef f(x):\n"
        "    rebuild = lambda self, p: (lambda: math, (), (None, {'pi': 3}))\n"
        f"    obj = {build_class}\n    try:\n        copy.copy(obj)\n    except Exception:\n        pass\n"
        "    return math.pi\n"
    )


@pytest.mark.parametrize(
    "build_class",
    [
        "type(int)('K', (), {'__reduce_ex__': rebuild})()",  # type itself, as type(int)
        "enum.Enum('E', {'a': 1, '__copy__': None, '__reduce_ex__': rebuild}, module='m').a",  # enum's names
    ],
)
def test_copy_refuses_to_rebuild_into_a_module(verifier, build_class):
    """Classes with any special methods can still be made at run time (``type(int)(name, bases, ns)``, the
    enum functional API's names); ``copy`` is the gadget that turned ``__reduce_ex__`` into a write of any
    attribute on any object. In a guarded call it refuses to rebuild into a module, class or function, and
    the verdict is ``forbidden`` whatever the program does with the error (a red-team review's finding)."""
    program = _module_into_copy(build_class)
    assert prefilter(program).status == "ok"  # past the static half
    assert _past_the_class_check(verifier, program) == Execution(
        "forbidden", None, "the program made copy rebuild an object into a module (copy.copy/deepcopy)"
    )


# Red-team round 23 (a full escape: the real built-ins, os, a forged verdict): a class made at run time held
# __slotnames__ and __setstate__, and a metaclass made at run time an mro() leaving object out; copy then read
# EnumType._convert_ bound to an enum of the program's, which reads any module of sys.modules.
ROUND_23 = (
    "import copy\nimport enum\nclass K:\n    pass\ndef keep(self, state):\n    K.got = state\ndef f(x):\n"
    "    T = type(K)\n    MM = T('MM', (T,), {'mro': lambda cls: (cls, enum.EnumType, T)})\n"
    "    M = MM('M', (enum.EnumType,), {})\n    class E(enum.Enum, metaclass=M):\n        pass\n"
    "    S = T('S', (super,), {'_' + '_slotnames__': ['_convert_', 'a', 'b', 'c'], '_' + '_setstate__': keep})\n"
    "    copy.copy(S(M, E))\n    Z = K.got[1]['_convert_']('Z', 'enum', lambda n: n == 'bltns')\n"
    "    return repr(list(Z)[0].value)\n"
)


@pytest.mark.parametrize(
    ("program", "detail"),
    [
        (ROUND_23, "the program made a metaclass at run time (a class deriving from 'type')"),
        (  # the same without the metaclass: copy read a private attribute named in __slotnames__
            "import copy, string\nclass K:\n    pass\ndef keep(self, state):\n    K.got = state\ndef f(x):\n"
            "    S = type(K)('S', (string.Template,), {'_' + '_slotnames__': ['_invalid'], "
            "'_' + '_setstate__': keep})\n    copy.copy(S('abc'))\n    return sorted(K.got[1])\n",
            "the program made a class holding the name '__slotnames__' (at run time or through the standard "
            "library)",
        ),
        (  # the enum functional API puts dunder names in the class it makes
            "import enum\ndef f(x):\n    return enum.Enum('E', {'a': 1, '_' + '_getattr__': len}).a.value\n",
            "the program made a class holding the name '__getattr__' (at run time or through the standard "
            "library)",
        ),
        (  # a str subclass equal to a dunder name is that name to CPython's slot lookups
            "class S(str):\n    pass\ndef f(x):\n    return type(S)('X', (), {S('a'): 1}).a\n",
            "the program made a class holding the name a key of the class S (at run time or through the "
            "standard library)",
        ),
    ],
    ids=["round_23", "slotnames", "enum_functional_api", "str_subclass_key"],
)
def test_classes_made_at_run_time_hold_only_what_a_class_statement_may(verifier, program, detail):
    """Every class made in a child is checked as it is made (``_child.check_class``, installed on
    ``type.__new__`` by ``sandbox.route_class_creation``): one a program makes may not be a metaclass, nor hold
    a dunder name outside the special methods a class statement may define and the names class statements
    and the standard library's class factories add; the verdict is ``forbidden`` whatever the program does
    with the error."""
    assert prefilter(program).status == "ok"
    assert verifier.run(program, "1") == Execution("forbidden", None, detail)


def test_the_guards_behind_the_class_check_refuse_round_23_too():
    """Behind the check of the classes programs make (``_below_the_class_check``): ``copy`` refuses the private
    attribute a program's class named in ``__slotnames__`` (round 23's read of ``EnumType._convert_``), and
    ``_convert_`` itself refuses in a guarded call (armed here by hand, as ``run_program`` arms it)."""
    assert _below_the_class_check(ROUND_23) == Execution(
        "forbidden", None, "the program made copy set an attribute it may not set ('_convert_')"
    )
    script = (
        "import _child\n_child.install_frame_guard()\n"
        "import enum\n_child._install_guards()\n_child.arm_frame_guard(True)\ntry:\n"
        "    enum.IntEnum._convert_('Z', 'enum', lambda name: False)\nexcept RuntimeError:\n    pass\n"
        "print(_child.frame_guard_refusal())\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "the program made an enum of the globals of the module 'enum' (EnumType._convert_)"
    ]


# Red-team round 24, against the check of the classes programs make (no full escape; two crashed the child).
ROUND_24_NAMED_TUPLE_META = (
    "import typing\nclass Fake:\n    def __init__(self):\n        self.n = 0\n    def __contains__(self, x):\n"
    "        return True\n    def __iter__(self):\n        self.n += 1\n        return iter(() if self.n == 1 else (tuple,))\n"
    "def g(self, name):\n    return 'hooked:' + name\ndef f(x):\n    M = typing.NamedTupleMeta\n"
    "    return [M('K', Fake(), {'__module__': 'm', '_' + '_getattr__': g})().anything]\n"
)


@pytest.mark.parametrize(
    ("program", "detail"),
    [
        (  # type's __new__ through super() of a metaclass: no check of the metatype, a class written over an int
            "import enum\nclass E(enum.Enum):\n    A = 1\ndef f(x):\n    M = type(E)\n    n = super(M, E).__new__\n"
            "    return n(int, 'X', (), {})\n",
            "the program made a class of a metaclass by __new__ (super() of a metaclass)",
        ),
        (  # object.__new__(type): an uninitialised class (CPython's own check passed since type's __new__ is ours)
            "class C:\n    def __new__(cls, t):\n        return super().__new__(t)\ndef f(x):\n    z = C(type(int))\n"
            "    z.a = 1\n    return 1\n",
            "the program made a class of a metaclass by __new__ ('type')",
        ),
        (
            "import typing, json\ndef f(x):\n    typing.dataclass_transform(evil=x)(json)\n    return 1\n",
            "the program wrote or deleted the attribute set by typing.dataclass_transform on a module, not one of "
            "its own",
        ),
        (  # slots named as special methods: descriptors in their place
            "class K:\n    pass\ndef f(x):\n    return type(K)('X', (), {'_' + '_slots__': ('_' + '_getattr__', 'a')}).a\n",
            "the program made a class holding the name '__getattr__' (a slot) (at run time or through the standard "
            "library)",
        ),
        (  # iterated by the check and again by CPython: an iterable of the program's could give other names
            "class K:\n    pass\nclass It:\n    def __iter__(self):\n        return iter(['a'])\ndef f(x):\n"
            "    return type(K)('X', (), {'_' + '_slots__': It()}).a\n",
            "the program made a class holding the name __slots__ given as a It (at run time or through the "
            "standard library)",
        ),
    ],
    ids=[
        "super_of_a_metaclass",
        "object_new_of_type",
        "dataclass_transform",
        "dunder_slots",
        "slots_iterable",
    ],
)
def test_round_24_findings_are_refused(verifier, program, detail):
    assert prefilter(program).status == "ok"
    assert verifier.run(program, "1") == Execution("forbidden", None, detail)


def test_named_tuple_meta_checks_the_namespace_it_sets_on_its_class(verifier):
    """``typing.NamedTupleMeta`` made its class from a namespace of its own and then set every name of the one
    it was given (``__getattr__``...) on it, past the check of the classes programs make (round 24): refused by
    name in the pre-filter, and, behind it, its ``__new__`` checks the namespace and wants a real tuple of
    bases."""
    assert prefilter(ROUND_24_NAMED_TUPLE_META) == Prefiltered(
        "forbidden", "line 13: access to attribute 'NamedTupleMeta' is not allowed"
    )
    assert _below_the_class_check(ROUND_24_NAMED_TUPLE_META) == Execution(
        "forbidden",
        None,
        "the program made a class holding the name a Fake of bases (at run time or through the standard library)",
    )
    real_bases = ROUND_24_NAMED_TUPLE_META.replace("Fake()", "(typing.NamedTuple,)").replace(
        "_' + '_getattr__", "_' + '_getattr__"
    )
    assert _below_the_class_check(real_bases) == Execution(
        "forbidden",
        None,
        "the program made a class holding the name '__getattr__' (at run time or through the standard library)",
    )
    ordinary = "import typing\nclass N(typing.NamedTuple):\n    x: int\n    y: int = 2\ndef f(x):\n    return N(x).y\n"
    assert verifier.run(ordinary, "1") == Execution("ok", "2", "")


# Red-team round 25 (a full escape): CPython's own read in an augmented assignment went unchecked, and a
# `__radd__` was handed `str.format` unchecked, then `AttributeError.obj`: the real `sys`.
ROUND_25 = (
    "import collections\ngot = []\nclass G:\n    def __radd__(self, other):\n        got.append(other)\n"
    "        return 0\nclass S(str):\n    pass\ndef f(x):\n    u = '_' * 2\n"
    "    s = S('{0.' + u + 'globals' + u + '[sys].nope}')\n    s.format += G()\n    raw = got.pop()\n"
    "    try:\n        raw(collections.namedtuple)\n    except AttributeError as e:\n        e.obj += G()\n"
    "    sysmod = got.pop()\n    return [str(sysmod), sysmod.getrecursionlimit()]\n"
)
AUGMENTED = (
    "class A:\n    _n = 0\n    def __init__(self):\n        self._count = 1\n        self.__secret = 2\n"
    "        self.time = 3.5\n        self.items = [1]\n    def bump(self):\n        self._count += 10\n"
    "        self.__secret *= 3\n        self.time += 0.5\n        self.items += [2]\n        A._n += 1\n"
    "        return (self._count, self.__secret, self.time, self.items, A._n)\n"
    "def f(x):\n    a = A()\n    alias = a.items\n    r = a.bump()\n    return [r, alias is a.items]\n"
)


@pytest.mark.parametrize(
    ("program", "detail"),
    [
        (
            ROUND_25,
            "a format string walks to a private or forbidden name at run time (0.__globals__[sys].nope)",
        ),
        (
            "class G:\n    def __radd__(self, other):\n        return 0\ndef f(x):\n    try:\n        x.nope\n"
            "    except AttributeError as e:\n        e.obj += G()\n    return 1\n",
            "the program read the object a failed lookup kept in an exception (AttributeError.obj)",
        ),
        (  # a slot named by a str subclass equal to a dunder name
            "class K:\n    pass\nclass S(str):\n    pass\ndef f(x):\n"
            "    return type(K)('C', (), {'_' + '_slots__': [S('_' + '_deepcopy__')]}).__name__\n",
            "the program made a class holding the name a slot named by a S (at run time or through the standard "
            "library)",
        ),
        (  # a cached_property writes its value into the instance's __dict__ under its attrname
            "import functools\nclass K:\n    pass\ndef f(x):\n    cp = functools.cached_property(lambda self: 1)\n"
            "    cp.attrname = '_' + '_deepcopy__'\n    K.h = cp\n    return K().h\n",
            "the program wrote or deleted the attribute '__deepcopy__' by a cached_property, not one of its own",
        ),
    ],
    ids=["round_25", "exception_object_augmented", "slot_str_subclass", "cached_property_attrname"],
)
def test_round_25_findings_are_refused(verifier, program, detail):
    assert prefilter(program).status == "ok"
    assert verifier.run(program, "1") == Execution("forbidden", None, detail)


# Red-team round 26 (no full escape): copy's memo reached a program's hook again, past both of round 25's
# fixes: a str subclass equal to '__deepcopy__' as a cached_property's attrname, its __eq__ answering each check
# otherwise; the memo's keep-alive list held a standard object's live __dict__.
ROUND_26 = (
    "import functools, copy, calendar\ncalls = [0]\nclass S(str):\n    def __eq__(self, other):\n"
    "        calls[0] += 1\n        return calls[0] > 1\n    def __hash__(self):\n        return hash(str(self))\n"
    "got = []\nclass K:\n    pass\ndef hook(self):\n    def grab(memo):\n        got.append(memo)\n        return 5\n"
    "    return grab\ndef f(x):\n    cp = functools.cached_property(hook)\n    cp.attrname = S('_' + '_deepcopy__')\n"
    "    K.h = cp\n    k = K()\n    k.h\n    cal = calendar.TextCalendar(3)\n    calls[0] = 0\n"
    "    copy.deepcopy([k, cal])\n    return type(got[0]).__name__\n"
)
RENAMED_WHILE_RUNNING = (  # the name read again after the function ran, which renamed it
    "import functools, copy\nclass K:\n    pass\nmade = []\ndef rebuild():\n    made.append(1)\n    return K()\n"
    "def hook(self):\n    cp.attrname = '_' + '_reduce_ex__'\n    return lambda proto: (rebuild, ())\n"
    "cp = functools.cached_property(hook)\ncp.attrname = 'h'\ndef f(x):\n    K.h = cp\n    k = K()\n    k.h\n"
    "    copy.copy(k)\n    return made\n"
)


def test_round_26_findings_are_refused(verifier):
    """A cached_property reads its name once, as an exact non-dunder str, and writes under it what its function
    returns (a name changed while the function ran is not the one written); a plain cached property still
    works, deep copies included."""
    assert verifier.run(ROUND_26, "0") == Execution(
        "forbidden",
        None,
        "the program wrote or deleted the attribute a S by a cached_property, not one of its own",
    )
    assert verifier.run(RENAMED_WHILE_RUNNING, "0") == Execution("ok", "[]", "")
    ordinary = (
        "import functools, copy, collections\nclass K:\n    def __init__(self, v):\n        self.v = v\n"
        "    @functools.cached_property\n    def sq(self):\n        return self.v * self.v\ndef f(x):\n"
        "    k = K(x)\n    a = k.sq\n    k.v = 100\n    d = copy.deepcopy([k, collections.OrderedDict(a=[1])])\n"
        "    return [a, k.sq, d[0].sq, d[0].v, dict(d[1])]\n"
    )
    assert verifier.run(ordinary, "3") == Execution("ok", "[9, 9, 9, 100, {'a': [1]}]", "")


def test_deep_copies_inside_a_rebuild_are_guarded_and_instance_keys_compared_exactly():
    """``copy._reconstruct`` deep-copies the state of what it rebuilds with its keyword default ``deepcopy``,
    which was copy's own, past every check (round 26): a hook in that state is refused now; and an instance
    ``__dict__`` key that is not an exact str counts as a hook (a str subclass's ``__eq__`` answered the
    check and copy's own lookup differently). Armed here by hand, in a fresh interpreter."""
    script = (
        "import _child\n_child.install_frame_guard()\n_child.install_copy_guard()\nimport copy\n"
        "class Hooked:\n    pass\nh = Hooked()\nh.__dict__['_' + '_deepcopy__'] = lambda memo: memo\n"
        "class Outer:\n    def __reduce_ex__(self, proto):\n        return (Outer, (), h)\n"
        "class S(str):\n    pass\nodd = Hooked()\nodd.__dict__[S('x')] = 1\n"
        "for case in (Outer(), odd):\n    _child.arm_frame_guard(True)\n    try:\n        copy.deepcopy([case])\n"
        "    except RuntimeError:\n        pass\n    print(_child.frame_guard_refusal())\n"
    )
    assert (
        _in_a_fresh_interpreter(script)
        == ["a __deepcopy__ of the program's (class Hooked) would be handed copy's memo, the originals in it"]
        * 2
    )


# Red-team round 27 (no full escape; a child crash): a program's subclass of super passed the checks of
# private names and special methods with names it held itself, and super's own lookup handed out the
# standard library's (Fraction._numerator, object.__new__ -> an uninitialised class, typing.List's __init__).
ROUND_27 = {
    "private": (
        "import fractions\nclass X:\n    pass\nclass P(X, fractions.Fraction):\n    pass\nclass S(super):\n"
        "    _numerator = 0\ndef f(n):\n    return [S(X, P(3, 4))._numerator]\n",
        "the program read the private attribute '_numerator' of an object of the class 'S', not one of its own",
    ),
    "object_new": (
        "class A:\n    pass\nclass S(super):\n    def __new__(cls, a, b):\n        return super().__new__(cls)\n"
        "def f(n):\n    t = S(A, A()).__new__(type(A))\n    return [t.__name__]\n",
        "the program read the special method '__new__' of an object of the class 'S', not one of its own",
    ),
}


@pytest.mark.parametrize("name", sorted(ROUND_27))
def test_super_is_closed_to_subclasses_and_checked_as_super_behind_that(verifier, name):
    """The worker closes ``super`` to subclasses (as ``types.GenericAlias``); behind that, the check of private
    names and special methods treats any ``super`` instance as a proxy (the classes after its own in its
    object's MRO), and an object whose class looks attributes up its own way as not the program's."""
    program, detail = ROUND_27[name]
    assert verifier.run(program, "1") == Execution(
        "runtime", None, "while defining the program: TypeError: type 'super' is not an acceptable base type"
    )
    assert _below_the_class_check(program) == Execution("forbidden", None, detail)


# Red-team round 28 (a full escape: the wall clock): `datetime.date.today()` imports `time` by the `__import__`
# of the innermost Python frame, the real one when the standard library's frame runs it for the program.
ROUND_28 = {
    "subclass_fromtimestamp": (
        "import calendar, collections, itertools\ndef f(x):\n"
        "    d = next(iter(calendar.Calendar().itermonthdates(2024, 1)))\n    class D(type(d)):\n"
        "        @classmethod\n        def fromtimestamp(cls, t):\n            return t\n"
        "    t = list(collections.Counter(itertools.islice(iter(D.today, 0), 1)))[0]\n    return int(t) // 60\n"
    ),
    "template_default": (
        "import calendar, collections, string\ndef f(x):\n"
        "    d = next(iter(calendar.Calendar().itermonthdates(2024, 1)))\n"
        "    return string.Template('$a').substitute(collections.defaultdict(d.today))\n"
    ),
}


@pytest.mark.parametrize("name", sorted(ROUND_28))
def test_the_clocks_refuse_whoever_calls_them(verifier, name):
    """``time``'s clocks and ``datetime``'s ``today``/``now``/``utcnow`` refuse in guarded calls, whatever frame
    calls them; dates that do not come from the clock still work."""
    assert verifier.run(ROUND_28[name], "0") == Execution(
        "forbidden", None, "the program read the clock (date.today)"
    )
    dates = (  # strftime and timetuple import time in C, from the program's frame too (round 29); the
        # worker's time zone is UTC whatever the host's ('%s' converts through it)
        "import calendar\ndef f(x):\n    d = next(iter(calendar.Calendar().itermonthdates(2024, 1)))\n"
        "    return [d.isoformat(), calendar.monthrange(2024, 2), str(type(d).fromordinal(738000)),\n"
        "            d.strftime('%Y/%m/%d %a'), d.timetuple().tm_yday, d.strftime('%s')]\n"
    )
    assert verifier.run(dates, "0") == Execution(
        "ok", "['2024-01-01', (3, 29), '2021-07-29', '2024/01/01 Mon', 1, '1704067200']", ""
    )
    assert verifier.run("def f(x):\n    import time\n    return 1\n", "0").status == "forbidden"


def test_time_s_clocks_refuse_only_in_guarded_calls_and_only_the_clock():
    """The worker's own ``time.monotonic()`` (its deadlines) and unguarded calls read the clocks as before; in a
    guarded call each clock refuses, and ``localtime``/``gmtime``/``strftime`` refuse only without a time to
    convert. Armed here by hand, in a fresh interpreter."""
    script = (
        "import time\nimport _child\n_child.install_frame_guard()\n_child.install_copy_guard()\n"
        "assert time.monotonic() > 0 and time.time() > 0\n"
        "for call in (lambda: time.time(), lambda: time.perf_counter_ns(), lambda: time.localtime(),\n"
        "             lambda: time.strftime('%Y'), lambda: time.gmtime(None)):\n"
        "    _child.arm_frame_guard(True)\n    try:\n        call()\n    except RuntimeError:\n        pass\n"
        "    print(_child.frame_guard_refusal())\n"
        "_child.arm_frame_guard(True)\n"
        "print(time.strftime('%Y', time.gmtime(0)), time.localtime(0).tm_year > 1960, repr(_child.frame_guard_refusal()))\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "the program read the clock (time)",
        "the program read the clock (perf_counter_ns)",
        "the program read the clock (localtime)",
        "the program read the clock (strftime)",
        "the program read the clock (gmtime)",
        "1970 True ''",
    ]


# Red-team round 30 (a full escape: sys and os): a program's class mixing UserDict with collections.abc's
# _CallableGenericAlias, a subclass of types.GenericAlias made before the worker closed GenericAlias, relayed
# `__dict__` to any origin, and the guarded UserDict copy updated a program object's dict with collections'.
ROUND_30 = (
    "import collections, collections.abc, copy\nclass Sink:\n    pass\nSRC = [collections]\n"
    "class Y(collections.UserDict, type(collections.abc.Callable[[int], int])):\n    def __new__(cls, *a):\n"
    "        return super().__new__(cls, SRC[0], ([], int))\ndef f(x):\n    y = Y()\n    sink = Sink()\n"
    "    SRC[0] = sink\n    try:\n        copy.copy(y)\n    except KeyError:\n        pass\n    return repr(sink._sys)\n"
)


def test_round_30_findings_are_refused(verifier):
    """The worker closes the subclasses of ``types.GenericAlias`` (and of ``super``) to subclasses too; behind
    that, the guarded ``UserDict``/``UserList`` copy reads and writes the real instance dicts; and a class
    made with a tuple subclass as its bases (which skipped the metaclass check: a run-time metaclass with an
    ``mro`` leaving ``type`` out, then an uninitialised class and a crash) is refused."""
    assert verifier.run(ROUND_30, "1") == Execution(
        "runtime",
        None,
        "while defining the program: TypeError: type '_CallableGenericAlias' is not an acceptable base type",
    )
    # behind that, the copy reads the real instance dicts; since round 39 it refuses a copy that is a
    # GenericAlias (its __dict__ is the origin's) before any dict is read
    assert _below_the_class_check(ROUND_30) == Execution(
        "forbidden", None, "the program made copy rebuild an object into a Y (copy.copy/deepcopy)"
    )
    crash = (
        "class K:\n    pass\nclass T(tuple):\n    pass\nclass Z:\n    def __new__(cls, *a):\n"
        "        return super().__new__(*a)\ndef f(x):\n"
        "    M = type(K)('M', T((type(K),)), {'mro': lambda cls: (cls, object)})\n"
        "    X = M('X', T((type(K),)), {})\n    u = Z.__new__(Z, X)\n    return repr(super(u, u))\n"
    )
    assert verifier.run(crash, "1") == Execution(
        "forbidden",
        None,
        "the program made a class holding the name bases given as a T (at run time or through the standard "
        "library)",
    )
    copies = (
        "import collections, copy\nclass D(collections.UserDict):\n    pass\ndef f(x):\n    d = D(a=1)\n"
        "    d.tag = 't'\n    c = copy.copy(d)\n    return [dict(c), c.tag]\n"
    )
    assert verifier.run(copies, "1") == Execution("ok", "[{'a': 1}, 't']", "")


def test_a_generic_alias_takes_only_a_class_as_its_origin(verifier):
    """Red-team round 32 (no read path found): ``types.GenericAlias`` relays ``__dict__`` to its origin, and one
    made over a module had ``functools.update_wrapper`` (``lru_cache``) copy the module's globals, ``sys`` and
    the real ``__builtins__`` among them, into a standard object's ``__dict__``. Called from Python, the alias
    class refuses an origin that is not a class (``sandbox.require_class_origins``); aliases over classes, from
    ``list[int]``, the standard library's ``__class_getitem__`` or the class itself, are as before."""
    gadget = (
        "import functools, typing\ndef f(x):\n    w = functools.lru_cache(type(list[int])(typing, (int,)))\n"
        "    return [n for n in ['sys', 'types', 'collections'] if hasattr(w, n)]\n"
    )
    assert verifier.run(gadget, "1") == Execution(
        "runtime", None, "TypeError: GenericAlias: the origin must be a class, not a module"
    )
    aliases = (
        "import collections, collections.abc, functools\ndef f(x):\n    a = list[int]\n"
        "    b = type(a)(dict, (str, int))\n    return [repr(b), b == dict[str, int], repr(a),"
        " repr(collections.abc.Callable[[int], str]), repr(collections.deque[int]), repr(functools.partial[int])]\n"
    )
    assert verifier.run(aliases, "1") == Execution(
        "ok",
        "['dict[str, int]', True, 'list[int]', 'collections.abc.Callable[[int], str]', 'collections.deque[int]', "
        "'functools.partial[int]']",
        "",
    )


# Red-team round 34 (a full escape: the real built-ins, sys, os, a forged verdict). A program's callables ran
# during an import, from C, below no frame of its own: a functools.partial as the __eq__ of a key re's pattern
# cache held, compared when encodings.idna (imported for a codec) compiled its pattern, made classes through
# map(type, ...) that counted as the standard library's (a metaclass with the program's __prepare__); a class
# body then looked `str` up in that __prepare__'s mapping, for a positional pattern reading __globals__.
ROUND_34_PARTS = (
    "import re, functools\nL = []\nR = []\ndef prep(*args, **kwargs):\n"
    "    return {'str': L[1]('C', (), {'__match_args__': ('__globals__',)})}\ndef inst(cls, obj):\n    return True\n",
    'def f(x):\n    T = type(int)\n    pat = "[\\u002E\\u3002\\uFF0E\\uFF61]"\n'
    "    maker = map(T, ['M', 'MC'], [(T,), (T,)], [{'__prepare__': prep}, {'__instancecheck__': inst}])\n"
    "    class X(int):\n        __eq__ = functools.partial(dict.fromkeys, map(L.append, maker))\n"
    "        def __hash__(self):\n            return 0\n    re.compile(pat, X(0))\n    try:\n"
    "        'a'.encode('idna')\n    except Exception:\n        pass\n",
    "    class K(metaclass=L[0]):\n        match re.compile:\n            case str(g):\n                R.append(g)\n"
    "    imp = R[0]['__builtins__']['__import__']\n    return [len(imp('sys').modules), imp('os').getuid()]\n",
)


def test_round_34_classes_made_during_an_import_are_checked_unless_a_module_made_them(verifier):
    """A class made while a module is imported counts as the module's only if its metaclass and bases are
    standard and what the program rules refuse in its namespace is the module's own code (``_child.
    _made_by_a_module``); others are checked as a program's. Behind that, a positional class pattern in a
    class body is refused (its class name is looked up in what ``__prepare__`` gave), and ``super(E, e).obj``
    of an ``AttributeError`` is refused like ``e.obj``. Since round 54 the attacks are refused at their driver,
    the partial as ``__eq__``."""
    made = ROUND_34_PARTS[0] + ROUND_34_PARTS[1] + "    return [c.__name__ for c in L]\n"
    assert verifier.run(made, "1") == _hook_refused()
    escape = verifier.run("".join(ROUND_34_PARTS), "1")
    assert escape.status == "forbidden" and "a positional class pattern in a class body" in escape.detail
    hook = (  # a C callable as __getattr__, made the same way: a class holding the name, refused
        "import re, functools\nL = []\ndef f(x):\n    maker = map(type(int), ['E'], [(object,)], "
        "[{'_' + '_getattr__': len}])\n    class X(int):\n"
        "        __eq__ = functools.partial(dict.fromkeys, map(L.append, maker))\n        def __hash__(self):\n"
        "            return 0\n    re.compile(\"[\\u002E\\u3002\\uFF0E\\uFF61]\", X(0))\n    'a'.encode('idna')\n"
        "    return L[0]().zzz\n"
    )
    assert verifier.run(hook, "1") == _hook_refused()
    class_body = "class K:\n    match 1:\n        case int(g):\n            pass\ndef f(x):\n    return 1\n"
    assert verifier.run(class_body, "1").status == "forbidden"
    assert "a positional class pattern in a class body" in verifier.run(class_body, "1").detail
    super_obj = (
        "class MyAE(AttributeError):\n    pass\ndef f(x):\n    try:\n        raise MyAE('a')\n"
        "    except MyAE as err:\n        return repr(super(MyAE, err).obj)\n"
    )
    assert verifier.run(super_obj, "1") == Execution(
        "forbidden", None, "the program read the object a failed lookup kept in an exception (super.obj)"
    )
    # what modules make while a guarded call imports them is still theirs: typing's and enum's metaclasses,
    # codecs imported for str.encode, patterns in methods, super() reads of a class attribute named obj
    fine = (
        "class B:\n    obj = 5\nclass C(B):\n    def g(self, v):\n        match v:\n            case int(n):\n"
        "                return super().obj + n\ndef f(x):\n    import typing, enum, fractions, statistics, difflib, "
        "calendar, decimal, json, string, textwrap, numbers\n    class Color(enum.Enum):\n        RED = 1\n"
        "    class P(typing.NamedTuple):\n        a: int\n"
        "    return [C().g(x), 'a'.encode('idna'), 'b'.encode('punycode'), Color.RED.value, P(2).a, "
        "str(fractions.Fraction(1, 3)), statistics.mean([1, 2])]\n"
    )
    assert verifier.run(fine, "1") == Execution("ok", "[6, b'a', b'b-', 1, 2, '1/3', 1.5]", "")


# Red-team round 35: the check of round 34 took any class recorded as standard for the module's own, and a
# class made during the import is recorded so: a first class holding only the program's __new__ passed, then
# served as every hook of the next (a metaclass's __prepare__ and __instancecheck__; __deepcopy__, handed the
# memo holding a standard object's live __dict__, wrote its private attribute).
ROUND_35_METACLASS = "import re, functools\nL = []\nG = []\ndef newA(cls, *a, **k):\n    G.append(a)\n    return {'hidden': 42, 'type': len}\ndef nss():\n    yield {'_' + '_new__': newA}\n    yield {'_' + '_instancecheck__': L[0], '_' + '_prepare__': L[0]}\ndef f(x):\n    T = type(int)\n    maker = map(T, ['A', 'M'], [(object,), (T,)], nss())\n    class X(int):\n        __eq__ = functools.partial(dict.fromkeys, map(L.append, maker))\n        def __hash__(self):\n            return 0\n    re.compile(\"[\\u002E\\u3002\\uFF0E\\uFF61]\", X(0))\n    try:\n        'a'.encode('idna')\n    except Exception:\n        pass\n    class K(metaclass=L[1]):\n        seen = hidden\n        t = type('abc')\n    return [K.seen, K.t, isinstance(5, K), len(G)]\n"
ROUND_35_DEEPCOPY = "import re, functools, calendar, copy\nL = []\nG = []\ndef newA(cls, *a):\n    G.append(a)\n    return G\ndef nss():\n    yield {'_' + '_new__': newA}\n    yield {'_' + '_deepcopy__': L[0], '_' + '_getattr__': L[0]}\ndef f(x):\n    T = type(int)\n    maker = map(T, ['A', 'K'], [(object,), (object,)], nss())\n    class X(int):\n        __eq__ = functools.partial(dict.fromkeys, map(L.append, maker))\n        def __hash__(self):\n            return 0\n    re.compile(\"[\\u002E\\u3002\\uFF0E\\uFF61]\", X(0))\n    try:\n        'a'.encode('idna')\n    except Exception:\n        pass\n    k = L[1]()\n    k.zzz\n    cal = calendar.TextCalendar(3)\n    copy.deepcopy([cal, k])\n    memo = G[-1][0]\n    live = [v for v in memo.values() if type(v) is list and any(o is cal for o in v)][0]\n    dd = [type(o).__name__ for o in live]\n    d = [o for o in live if type(o) is dict][0]\n    d['_firstweekday'] = 5\n    return [dd, [[type(e).__name__ for e in g] for g in G[:-1]], sorted(d), cal.firstweekday]\n"


def test_round_35_a_class_made_during_an_import_vouches_for_nothing(verifier):
    """Only classes modules hold (or found under their names) count as a module's values; every special method
    of a class made during an import is the module's code (or built in) for it to be the module's class
    (since round 54 refused at the driver)."""
    assert verifier.run(ROUND_35_METACLASS, "1") == _hook_refused()
    assert verifier.run(ROUND_35_DEEPCOPY, "1") == _hook_refused()


def test_every_allowed_module_and_codec_imports_in_a_guarded_call(verifier):
    """What the allowed modules and the codecs make while a guarded call imports them is theirs
    (``_child._made_by_a_module`` vouches for every class of theirs, and only a module's own code registers a
    standard class with an ABC): none of it is refused. docs/threat-model.md says so; the codecs are imported by
    ``str.encode``, below no frame of the program's."""
    import encodings
    import pkgutil

    modules = ", ".join(sorted(prefilter_module.ALLOWED_MODULES))
    codecs = sorted(m.name for m in pkgutil.iter_modules(encodings.__path__) if m.name != "aliases")
    program = (
        f"def f(names):\n    import {modules}\n    done = 0\n    for name in names:\n        try:\n"
        "            'a'.encode(name)\n            done += 1\n        except Exception:\n            pass\n"
        "    return done > 80\n"
    )
    assert verifier.run(program, repr(codecs)) == Execution("ok", "True", "")


def test_state_pairs_have_their_names_checked_like_a_dict_s():
    """``_child._state_keys``: copy's ``__dict__.update`` takes a tuple of pairs as it takes a dict, so the
    reconstruction guard checks the names of both (red-team round 38); other tuples (``partial``'s state) set
    no names this way."""
    script = (
        "import _child\nprint(list(_child._state_keys((('_x', 1), ('exec', 2)))))\n"
        "print(list(_child._state_keys({'a': 1})), list(_child._state_keys((len, (1, 2), {}, None))))\n"
    )
    assert _in_a_fresh_interpreter(script) == ["['_x', 'exec']", "['a'] []"]


# How red-team rounds 34 to 40 ran a program's callables below no frame of its own: `make(names, bases,
# namespaces)` plants a key in re's pattern cache whose __eq__ is a functools.partial over map(type, ...), and
# encodings.idna, imported for 'a'.encode('idna'), compiles the same pattern: the classes are made during that
# import and appended to L. Since round 53 such classes are the program's (made from a lookup, not a call:
# `_child._made_by_calls`), so the tests below check end results; `_made_by_a_module`'s own checks, which these
# attacks reached until then, are tested white-box (test_a_module_s_class_is_judged_by_what_it_holds...).
_KEY_AS_DRIVER = (
    "L = []\n"
    "def make(names, bases, nss):\n"
    "    maker = map(MAKER, names, bases, nss)\n"
    "    class X(int):\n"
    "        __eq__ = functools.partial(dict.fromkeys, map(L.append, maker))\n"
    "        def __hash__(self):\n"
    "            return HASH\n"
)
_DURING_AN_IMPORT = _KEY_AS_DRIVER.replace("HASH", "0") + (
    '    re.compile("[\\u002E\\u3002\\uFF0E\\uFF61]", X(0))\n'
    "    try:\n"
    "        'a'.encode('idna')\n"
    "    except Exception:\n"
    "        pass\n"
)


def _made_during_an_import(imports: str, body: str, maker: str = "type(int)") -> str:
    """A program importing ``re``, ``functools`` and ``imports``, with ``make`` and ``L`` above its ``body``;
    ``make`` calls ``maker`` (``type`` itself, or a standard-library function forwarding to it, which puts
    that function's file on the stack) from C while ``encodings.idna`` is imported."""
    return f"import re, functools, {imports}\n" + _DURING_AN_IMPORT.replace("MAKER", maker) + body


def _subclass_refused(name: str) -> Execution:
    return Execution(
        "forbidden", None,
        f"the program subclassed {name} (the functions its objects call could be set again after their class was "
        "checked)",
    )  # fmt: skip


def _hook_refused(name: str = "__eq__", kind: str = "partial") -> Execution:
    """The verdict on a program whose class holds ``kind`` under ``name`` (red-team round 54's rule,
    ``_child._runs_in_a_frame``): since then every driver above is refused as its first class is made, before
    any class of its is made during an import; the checks behind (``_made_by_calls``, ``_made_by_a_module``,
    copy's guards) stay, tested white-box where no program reaches them."""
    return Execution(
        "forbidden", None,
        f"the program gave a class '{name}' as a '{kind}', not a function (a program's special methods and "
        "descriptors run in frames of its own)",
    )  # fmt: skip


# Red-team round 36: classes made with no frame of the program's on the stack at all (`f` rebound to a
# functools.partial the child's own frame calls; a partial as an exception's __str__, called when its verdict
# is written) were never checked and were recorded as standard; and a class a module holds (`dict`) passed as a
# hook under a refused name (`__deepcopy__ = dict` copied copy's memo).
ROUND_36 = {
    "deepcopy_dict": _made_during_an_import(
        "calendar, copy",
        (
            "def f(x):\n"
            "    make(['K'], [(object,)], [{'_' + '_deepcopy__': dict}])\n"
            "    k = L[0]()\n"
            "    cal = calendar.TextCalendar(3)\n"
            "    r = copy.deepcopy([cal, k])\n"
            "    memo = r[1]\n"
            "    live = [v for v in memo.values() if type(v) is list and any(o is cal for o in v)][0]\n"
            "    d = [o for o in live if type(o) is dict][0]\n"
            "    d['_firstweekday'] = 5\n"
            "    return [sorted(d), cal.firstweekday, len(L)]\n"
        ),
    ),
    "noframe_memo": (
        "import functools, itertools, calendar, copy\n"
        "L = []\n"
        "def g(_):\n"
        "    cal = calendar.TextCalendar(3)\n"
        "    memo = copy.deepcopy([cal, L[0]()])[1]\n"
        "    live = [v for v in memo.values() if type(v) is list and any(o is cal for o in v)][0]\n"
        "    d = [o for o in live if type(o) is dict][0]\n"
        "    d['_firstweekday'] = 5\n"
        "    return (cal.firstweekday, type(L[1]).__name__)\n"
        "def f(x):\n"
        "    return 0\n"
        "T = type(int)\n"
        "nss = [{'_' + '_deepcopy__': lambda self, memo: memo}, {'_' + '_prepare__': lambda *a, **k: {}}]\n"
        "f = functools.partial(dict.fromkeys, itertools.chain(map(L.append, map(T, ['K', 'M'], [(object,), (T,)], nss)), map(g, [0])))\n"
    ),
    "via_str": (
        "import functools, itertools\n"
        "L = []\n"
        "def g(_):\n"
        "    return L[0]().zzz + ' ' + type(L[1]).__name__\n"
        "T = type(int)\n"
        "class E(Exception):\n"
        "    __str__ = functools.partial(str.join, '', itertools.chain(filter(None, map(L.append, map(T, ['K', 'M'], [(object,), (T,)], [{'_' + '_getattr__': lambda s, n: 'hooked ' + n}, {}]))), map(g, [0])))\n"
        "def f(x):\n"
        "    raise E()\n"
    ),
}


@pytest.mark.parametrize(
    ("name", "refused"),
    [("deepcopy_dict", "'__deepcopy__'"), ("noframe_memo", "'__deepcopy__'"), ("via_str", "'__getattr__'")],
)
def test_round_36_classes_made_below_no_program_frame_are_checked(verifier, name, refused):
    """In a guarded call, a class made below no frame of the program's and none of the import system's is judged
    as one made during an import (``_child._made_by_a_module``), and a class stands for a module's value only as
    an allowed special method (``__call__ = dict``) or ``__class_getitem__ = classmethod(GenericAlias)``."""
    expected = Execution(
        "forbidden",
        None,
        f"the program made a class holding the name {refused} (at run time or through the standard library)",
    )
    if name == "deepcopy_dict":  # (since round 54 refused at the driver, the partial as __eq__ or __str__)
        expected = _hook_refused()
    elif name == "via_str":
        expected = _hook_refused("__str__")
    assert verifier.run(ROUND_36[name], "1") == expected


# Red-team round 37: standard-library functions a program reads by public name pass as "a module's code" in a
# class made during an import (`__deepcopy__ = typing.cast` returned copy's memo; `__reduce_ex__ =
# typing.assert_type` let the program choose the reduction, and copy wrote private attributes into calendar.c),
# and classes made below the child's own frames (`f` rebound to a partial) still went through that vouching.
ROUND_37_NO_FRAME = "\nimport functools, typing, copy\nT = type(int)\ndef g(acc, cls):\n    x = cls()\n    m = copy.deepcopy([x, [1,2]])\n    return str(type(m).__name__) + \":\" + str(sorted(str(type(v).__name__) for v in (m.values() if isinstance(m, dict) else m)))\ndef f():\n    return 0\nf = functools.partial(functools.reduce, g, map(T, ['K'], [()], [{'__deepcopy__': typing.cast}]), 0)\n"
ROUND_37_MEMO = _made_during_an_import(
    "typing, copy, calendar",
    (
        "def f(x):\n"
        "    make(['K'], [(object,)], [{'_' + '_deepcopy__': typing.cast}])\n"
        "    m = copy.deepcopy([L[0](), calendar.c])[0]\n"
        "    return len(L)\n"
    ),
)
ROUND_37_REDUCE = _made_during_an_import(
    "typing, copy, calendar",
    (
        "def h():\n"
        "    return calendar.c\n"
        "def f(x):\n"
        "    make(['R'], [(tuple,)], [{'_' + '_reduce_ex__': typing.assert_type}])\n"
        "    copy.copy(L[0]((h, (), {'_firstweekday': 2})))\n"
        "    return calendar.firstweekday()\n"
    ),
)


def test_round_37_copy_trusts_only_classes_modules_hold(verifier):
    """A class made below no frame of the program's nor of an import is checked as the program's; copy's guards
    trust the hooks of classes modules hold only (``_child._program_hook``), and rebuild an instance of a class no
    module holds under the rules for the program's own objects (``_child._copied_as_own``)."""
    assert verifier.run(ROUND_37_NO_FRAME, "") == Execution(
        "forbidden",
        None,
        "the program made a class holding the name '__deepcopy__' (at run time or through the standard library)",
    )
    # (typing.cast, written in no file running the import, no longer makes the class a module's: round 46's lead)
    # (since round 54 refused at the driver, the partial as __eq__)
    assert verifier.run(ROUND_37_MEMO, "1") == _hook_refused()
    assert verifier.run(ROUND_37_REDUCE, "1") == _hook_refused()


# Red-team round 38: a class made during an import lied about its class (`__class__ = property(statistics.mode)`),
# so the copy guard's isinstance() took its instance for a class and skipped the rules for the program's own
# objects; the rebuild (a metaclass whose __new__ is typing.cast) landed on calendar.c, and a state given as pairs
# instead of a dict set its private attribute.
ROUND_38_CLASS = _made_during_an_import(
    "typing, copy, calendar, statistics",
    (
        "def f(x):\n"
        "    make(['M', 'R'], [(type(int),), (tuple,)], [{'_' + '_new__': staticmethod(typing.cast)},\n"
        "         {'_' + '_reduce_ex__': typing.assert_type, '_' + '_class__': property(statistics.mode)}])\n"
        "    M, R = L\n"
        "    r = R((M, (calendar.c,), (('_firstweekday', 2),)))\n"
        "    before = calendar.firstweekday()\n"
        "    copy.copy(r)\n"
        "    return [before, calendar.firstweekday(), type(r).__name__]\n"
    ),
)
ROUND_38_PAIRS = _made_during_an_import(
    "typing, copy, calendar, statistics",
    (
        "def f(x):\n"
        "    make(['M', 'R'], [(type(int),), (tuple,)], [{'_' + '_new__': staticmethod(typing.cast)},\n"
        "         {'_' + '_reduce_ex__': typing.assert_type}])\n"
        "    M, R = L\n"
        "    r = R((M, (calendar.c,), (('_firstweekday', 2),)))\n"
        "    copy.copy(r)\n"
        "    return [calendar.firstweekday(), type(r).__name__]\n"
    ),
)


def test_round_38_copy_reads_real_types_and_state_pairs(verifier):
    """A class made during an import that sets ``__class__`` is not the module's, and copy's guards judge objects
    by their real type, never ``isinstance`` (a state of pairs has its names checked like a dict's too: a second
    line no program reaches without such a class). Since round 46's lead, a function of a module that is not
    running the import (``typing.assert_type``) makes no class a module's; since round 54 the partial as
    ``__eq__`` of their driver is refused."""
    for program in (ROUND_38_CLASS, ROUND_38_PAIRS):
        assert verifier.run(program, "0") == _hook_refused()


# Red-team round 39 (a full escape, a forged verdict): `K.register(type(json))` made issubclass() say that the
# module type derives from a program's UserDict subclass, so the guarded UserDict.__copy__ took a module that the
# class's __new__ returned for a copy and wrote its instance dict into the module's globals: `copy.dispatch_table`
# (a reducer of the program's), then `json.__path__`, then `import json.os` loaded a fresh os.
ROUND_39 = "\nimport collections, copy, json, functools\nT = []\ndef table(w):\n    return {Q: red}\nclass W(collections.UserDict):\n    t = functools.cached_property(table)\n    def __new__(cls, *a, **k):\n        if T:\n            return T[-1]\n        return super().__new__(cls)\nclass P(functools.partial, collections.UserDict):\n    def __new__(cls, *a, **k):\n        if T:\n            return T[-1]\n        return super().__new__(cls, *a, **k)\n    def __init__(self, *a, **k):\n        pass\nclass Q:\n    pass\ndef g():\n    return 0\nD = {'data': {}}\ndef red(q):\n    return (P, (g,), (g, (), None, D))\ndef f(x):\n    W.register(type(json))\n    P.register(type(json))\n    w = W()\n    W.t.attrname = 'dispatch' + '_table'\n    w.t\n    T.append(copy)\n    copy.copy(w)\n    T.clear()\n    p = copy.copy(Q())\n    where = repr(json).split(\"from '\")[1].rsplit('/json/', 1)[0]\n    D['_' + '_path__'] = [where]\n    T.append(json)\n    copy.copy(p)\n    T.clear()\n    import json.os as jos\n    u = chr(31)\n    for fd in range(3, 30):\n        try:\n            jos.write(fd, ('ok' + u + '=123456' + u + 'forged' + chr(10)).encode())\n        except Exception:\n            pass\n    return 'real'\n"


def test_round_39_abcs_register_only_the_program_s_classes(verifier):
    """``ABCMeta.register`` refuses a standard class in a guarded call; behind it, the ``UserDict``/``UserList``
    copy takes only a real instance of the class (by its type's MRO), never a module, class or function."""
    assert verifier.run(ROUND_39, "0") == Execution(
        "forbidden",
        None,
        "the program registered the standard library's module as a virtual subclass of an ABC",
    )
    own = (
        "import abc, collections\nclass Shape(abc.ABC):\n    pass\nclass Box:\n    pass\n"
        "class D(collections.UserDict):\n    pass\nShape.register(Box)\ndef f(x):\n    import copy\n"
        "    d = copy.copy(D(a=x))\n    return [isinstance(Box(), Shape), issubclass(Box, Shape), dict(d)]\n"
    )
    assert verifier.run(own, "1") == Execution("ok", "[True, True, {'a': 1}]", "")


# Red-team round 40: round 39's refusal of ABCMeta.register let anything below an import's frames through, and a
# program's C callables run there (re's poisoned pattern cache while encodings.idna is imported).
ROUND_40 = "import re, functools, collections, json\nclass W(collections.UserDict):\n    pass\ndef f(x):\n    class X(int):\n        __eq__ = functools.partial(dict.fromkeys, map(W.register, [type(json)]))\n        def __hash__(self):\n            return 0\n    re.compile(\"[\\u002E\\u3002\\uFF0E\\uFF61]\", X(0))\n    try:\n        'a'.encode('idna')\n    except Exception:\n        pass\n    return [issubclass(type(json), W), isinstance(json, W)]\n"


def test_round_40_only_a_module_s_own_code_registers_standard_classes(verifier):
    """A standard class is registered with an ABC in a guarded call only by a module's code as it is imported
    (its module level, or the import system for a C module); the standard library's own registrations work."""
    assert verifier.run(ROUND_40, "0") == _hook_refused()  # (since round 54 refused at its driver)
    numbers = (
        "def f(x):\n    import numbers, decimal, fractions\n    return [isinstance(1, numbers.Integral), "
        "isinstance(decimal.Decimal(1), numbers.Number), isinstance(fractions.Fraction(1, 2), numbers.Rational)]\n"
    )
    assert verifier.run(numbers, "0") == Execution("ok", "[True, True, True]", "")


# Left open by round 40: public unbound methods of standard classes write their attribute names into whatever
# object they are handed, a module too.
MODULE_WRITES = {
    "calendar.Calendar.setfirstweekday(json, 5)": "'_firstweekday' of the module 'json'",
    "abc.abstractmethod(json)": "'__isabstractmethod__' of the module 'json'",
    "calendar.Calendar.setfirstweekday(calendar, 5)": "'_firstweekday' of the module 'calendar'",
}


def test_the_standard_library_writes_no_module_attribute_for_a_program(verifier):
    """In a guarded call a module's attributes change only as it is imported (the import system, a module's
    level code) or by the child's guards: a standard function handed a module in place of its object is refused;
    calendar's own module-level settings, imports of every kind (a C module, a codec, a package's submodule) and
    a program's own module keep working."""
    for call, what in MODULE_WRITES.items():
        program = f"import abc, calendar, json\ndef f(x):\n    {call}\n    return 1\n"
        assert verifier.run(program, "0") == Execution(
            "forbidden",
            None,
            f"the program made the standard library write or delete the attribute {what} (a module changes only "
            "as it is imported)",
        ), call
    fine = (
        "import calendar\nN = 1\ndef f(x):\n    global N\n    N += x\n    c = calendar.Calendar()\n"
        "    c.setfirstweekday(3)\n    calendar.setfirstweekday(2)\n    import json.decoder, unicodedata, decimal\n"
        "    return [N, c.firstweekday, calendar.firstweekday(), 'a'.encode('idna'), str(decimal.Decimal(1) / 4)]\n"
    )
    assert verifier.run(fine, "1") == Execution("ok", "[2, 3, 2, b'a', '0.25']", "")


def test_standard_classes_are_immutable_for_guarded_programs(verifier):
    """Red-team round 41: public unbound methods of standard classes write their names into any class they are
    handed, a standard class or metaclass too; with the language layer on, every class a module holds is
    immutable (CPython's own refusal, whoever writes). A program's classes, its subclasses of standard ones
    among them, stay writable, copies of standard objects work, and unguarded programs see the modules as usual."""
    writes = {
        "calendar.Calendar.setfirstweekday(json.JSONEncoder, 5)": "'_firstweekday' attribute of immutable type 'JSONEncoder'",
        "calendar.Calendar.setfirstweekday(abc.ABCMeta, 5)": "'_firstweekday' attribute of immutable type 'ABCMeta'",
        "abc.abstractmethod(json.JSONDecoder)": "'__isabstractmethod__' attribute of immutable type 'JSONDecoder'",
    }
    # a class made at import that no module holds, frozen once its import is over (red-team round 43)
    writes["calendar.Calendar.setfirstweekday(type(decimal.getcontext().flags), 5)"] = (
        "'_firstweekday' attribute of immutable type 'SignalDict'"
    )
    for call, what in writes.items():
        program = f"import abc, calendar, decimal, json\ndef f(x):\n    {call}\n    return 1\n"
        assert verifier.run(program, "0") == Execution("runtime", None, f"TypeError: cannot set {what}"), call
    own = (
        "import collections, copy, enum, json, textwrap\nclass D(collections.UserDict):\n    pass\n"
        "class E(json.JSONEncoder):\n    pass\nclass F(enum.IntEnum):\n    A = 1\nclass C:\n    n = 0\n"
        "def f(x):\n    D.x = 1\n    E.y = 2\n    del D.x\n    C.n += x\n    w = copy.copy(textwrap.TextWrapper(width=7))\n"
        "    return [E.y, hasattr(D, 'x'), C.n, w.width, F.A + 1]\n"
    )
    assert verifier.run(own, "3") == Execution("ok", "[2, False, 3, 7, 2]", "")


def test_standard_classes_stay_mutable_without_the_language_layer():
    """``language_guards=False``: the modules behave as usual, a standard class's attributes can be written."""
    program = (
        "import calendar, json\ndef f(x):\n    calendar.Calendar.setfirstweekday(json.JSONEncoder, 5)\n"
        "    return json.JSONEncoder._firstweekday\n"
    )
    with Verifier(VerifierConfig(workers=1, language_guards=False)) as unguarded:
        assert unguarded.run(program, "0") == Execution("ok", "5", "")


def test_a_submodule_loaded_from_outside_its_package_is_off_the_allowlist():
    """Round 39's chain ended with ``json.__path__`` changed and ``import json.os`` loading ``os.py`` as
    ``json.os``, which passed as a submodule of ``json``: a submodule must come from a file in its top-level
    package's folder (``_child._off_the_allowlist``), whatever wrote the path (in a fresh interpreter)."""
    script = (
        "import importlib.util, json, json.decoder, collections.abc, os\nimport _child\n"
        "_child._ALLOWED_MODULES = frozenset({'json', 'collections'})\n"
        "spec = importlib.util.spec_from_file_location('json.os', os.__file__)\n"
        "fresh = importlib.util.module_from_spec(spec)\nsys.modules['json.os'] = fresh\n"
        "print(_child._off_the_allowlist(fresh))\n"
        "print(_child._off_the_allowlist(json.decoder), _child._off_the_allowlist(collections.abc))\n"
    )
    assert _in_a_fresh_interpreter(script) == ["json.os", "None None"]


def test_classes_the_standard_library_makes_at_import_are_standard(verifier):
    """``decimal``'s ``SignalDict`` is made with ``type()`` by its C part while ``decimal`` is imported and held by
    no module under that name: it counted as a program's class, which programs wrote (a method replaced, a
    private attribute set; red-team round 31). Classes made while no program frame is on the stack are
    recorded as standard now; a program's own classes, ``namedtuple``'s included, stay writable."""
    refused = {
        "type(fl).hello = 5": "'hello' of the class 'SignalDict'",
        "fl._secret = 7": "'_secret' of an object of the class 'SignalDict'",
    }
    for write, what in refused.items():
        program = (
            f"import decimal\ndef f(x):\n    fl = decimal.getcontext().flags\n    {write}\n    return 1\n"
        )
        assert verifier.run(program, "0") == Execution(
            "forbidden", None, f"the program wrote or deleted the attribute {what}, not one of its own"
        )
    own = (
        "import decimal, collections\nP = collections.namedtuple('P', 'a')\nclass C:\n    pass\ndef f(x):\n"
        "    P.extra = 1\n    C.y = 2\n    c = decimal.Context(prec=5)\n"
        "    return [str(c.divide(decimal.Decimal(1), decimal.Decimal(3))), P.extra, C.y]\n"
    )
    assert verifier.run(own, "0") == Execution("ok", "['0.33333', 1, 2]", "")


def test_augmented_assignments_to_checked_names_work_as_in_plain_python(verifier):
    """``self._count += 10``, a class-private ``self.__secret *= 3``, ``self.time += 0.5``, a list's in-place
    ``+=`` (the same list after), a class attribute: read through the proxy of ``_augmented``, in CPython's
    order and with its in-place operators."""
    namespace: dict = {}
    exec(AUGMENTED, namespace)  # our own program: plain Python's answer
    assert verifier.run(AUGMENTED, "1") == Execution("ok", repr(namespace["f"](1)), "")


def test_deepcopy_refuses_a_hook_in_an_instance_dict():
    """``copy.deepcopy`` looks its hook up on the instance: one planted in an instance's ``__dict__`` (round 25,
    by a ``cached_property``) is refused like a class's, armed here by hand."""
    script = (
        "import _child\n_child.install_frame_guard()\n_child.install_copy_guard()\nimport copy\n"
        "class K:\n    pass\nk = K()\nk.__dict__['_' + '_deepcopy__'] = lambda memo: memo\n"
        "_child.arm_frame_guard(True)\ntry:\n    copy.deepcopy([k])\nexcept RuntimeError:\n    pass\n"
        "print(_child.frame_guard_refusal())\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "a __deepcopy__ of the program's (class K) would be handed copy's memo, the originals in it"
    ]


# Red-team round 41: CPython records a failed lookup in an AttributeError by setting its `name` and `obj` at each
# lookup the error leaves until its C fields are set; a program's subclass with properties of those names kept
# them unset and was handed every object on the way, the child's own proxy of an augmented assignment too, which
# answers any name with what the program chooses: copy then wrote `re.I._value_`, deepcopy handed its memo over.
ROUND_41 = (
    "got = []\nclass K(AttributeError):\n    def g(self):\n        return None\n    def s(self, v):\n"
    "        got.append(type(v).__name__)\n    obj = property(g, s)\n    name = property(g, s)\n"
    "class A:\n    def g(self):\n        raise K()\n    _x = property(g)\n"
    "def f(x):\n    a = A()\n    try:\n        a._x += 1\n    except K:\n        pass\n    return got\n"
)


def test_round_41_a_failed_lookup_hands_a_program_only_what_plain_python_does(verifier):
    """The proxy of an augmented assignment records a failed lookup as the object's own lookup would, so the error
    reaches no further: the program's properties see the name and the object, as in plain Python, never the
    proxy; a format string may not walk to an exception's ``obj`` at run time."""
    namespace: dict = {}
    exec(ROUND_41, namespace)
    assert namespace["f"](0) == ["str", "A"]  # plain Python's answer
    assert verifier.run(ROUND_41, "0") == Execution("ok", "['str', 'A']", "")
    walk = "import json\ndef f(x):\n    try:\n        json.nothing\n    except AttributeError as e:\n        return ('{0.o' + 'bj}').format(e)\n"
    assert verifier.run(walk, "0") == Execution(
        "forbidden",
        None,
        "a format string walks to a private or forbidden name at run time (0.obj)",
    )


def test_copy_refuses_the_proxy_of_an_augmented_assignment():
    """The second line behind round 41: ``copy`` and ``deepcopy`` refuse the child's own proxy, whose lookups answer
    any name (``__reduce_ex__``, ``__deepcopy__``) with what the program chose (armed here by hand)."""
    script = (
        "import _child\n_child.install_frame_guard()\n_child.install_copy_guard()\nimport copy\n"
        "class T:\n    pass\nt = T()\nt.format = lambda *a: (T, ())\nproxy = _child._augmented(t, 'format')\n"
        "for how in (copy.copy, copy.deepcopy, lambda p: copy.deepcopy([p])):\n"
        "    _child.arm_frame_guard(True)\n    try:\n        how(proxy)\n    except (RuntimeError, TypeError):\n        pass\n"
        "    print(_child.frame_guard_refusal())\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "the program made copy rebuild an object into a _Augmented (copy.copy/deepcopy)",
        "a __deepcopy__ of the program's (class _Augmented) would be handed copy's memo, the originals in it",
        "a __deepcopy__ of the program's (class _Augmented) would be handed copy's memo, the originals in it",
    ]


def test_classes_programs_make_the_ordinary_ways_still_work(verifier):
    """Class statements (special methods, ``__slots__``, bases with metaclasses), the standard library's class
    factories (``namedtuple``, ``typing.NamedTuple``, ``TypedDict``, ``Protocol``, ``Generic``, enum classes and
    the enum functional API, which marks a class whose module it cannot name with a ``__reduce_ex__`` of its
    own), a module imported inside ``f`` (its classes are made at import), and a class made at run time that
    holds only what a class statement may."""
    program = (
        "import collections, enum, typing\nT = typing.TypeVar('T')\n"
        "class Box(typing.Generic[T]):\n    __slots__ = ('v',)\n    def __init__(self, v):\n        self.v = v\n"
        "    def __repr__(self):\n        return 'Box'\n    def __eq__(self, o):\n        return self.v == o.v\n"
        "    __hash__ = None\nclass N(typing.NamedTuple):\n    x: int\n    y: int = 2\n"
        "class TD(typing.TypedDict):\n    a: int\nclass Pr(typing.Protocol):\n    def m(self) -> int: ...\n"
        "class C(enum.IntEnum):\n    A = 1\n    B = 2\nclass Fl(enum.Flag):\n    R = enum.auto()\n    G = enum.auto()\n"
        "def f(x):\n    import fractions, statistics\n    P = collections.namedtuple('P', 'a b')\n"
        "    E = enum.Enum('E', 'p q')\n    Q = type(P)('Q', (), {'z': x, '_' + '_repr__': lambda s: 'Q!'})\n"
        "    return [P(1, 2)._asdict()['a'], N(1).y, TD(a=3)['a'], C.B + 1, (Fl.R | Fl.G).value, E.q.value,\n"
        "            repr(Box(1)), Box(1) == Box(1), Q.z, repr(Q()), str(fractions.Fraction(1, 3)),\n"
        "            statistics.median([3, 1, 2])]\n"
    )
    assert verifier.run(program, "4") == Execution(
        "ok", "[1, 2, 3, 3, 3, 2, 'Box', True, 4, 'Q!', '1/3', 2]", ""
    )


def test_a_program_s_namedtuple_names_the_program_s_module():
    """``namedtuple`` reads its caller's module with ``sys._getframe``, refused in guarded calls: a program's
    class came out as ``collections.Pt`` (a breakage review); as in plain Python now, an explicit ``module``
    kept, ``typing.NamedTuple`` alike."""
    program = (
        "import collections, typing\nfrom collections import namedtuple\nPt = collections.namedtuple('Pt', 'x y')\n"
        "Q = namedtuple('Q', ['a'], defaults=[3])\nclass N(typing.NamedTuple):\n    z: int\ndef f(x):\n"
        "    return [str(type(Pt(1, 2))), repr(Pt(1, 2)), Q().a, str(N), str(collections.namedtuple('R', 'k', module='m'))]\n"
    )
    namespace = {"__name__": "__program__"}
    exec(program, namespace)  # our own program: plain Python's answer
    with Verifier(workers=1) as v:
        assert v.run(program, "0") == Execution("ok", repr(namespace["f"](0)), "")


def test_class_creation_routes_through_the_check_and_stays_plain_python():
    """``sandbox.route_class_creation`` (in a fresh interpreter): the check sees every class made after it is
    installed (``type()``, class statements, a metaclass's call, ctypes' metaclasses written in C, whose own
    ``tp_new`` calls type's slot and must not loop) with its arguments; CPython's errors pass through as
    themselves; the check's own exception refuses the class."""
    script = (
        "import ctypes, enum, sandbox\nseen = []\n"
        "def check(metatype, args):\n    seen.append((metatype.__name__, args[0] if args else None))\n"
        "    if len(args) == 3 and 'refuse' in args[2]:\n        raise PermissionError('refused')\n"
        "assert sandbox.route_class_creation(check) is None\n"
        "class A:\n    pass\nB = type('B', (A,), {'x': 1})\nclass E(enum.Enum):\n    R = 1\n"
        "class S(ctypes.Structure):\n    _fields_ = [('a', ctypes.c_int)]\nArr = ctypes.c_char * 3\n"
        "assert S(5).a == 5 and B.x == 1 and E.R.value == 1 and len(Arr().raw) == 3\n"
        "try:\n    type('X', (1,), {})\nexcept TypeError as e:\n    print('TypeError', e)\n"
        "class Base:\n    def __init_subclass__(cls, **kw):\n        raise LookupError(kw)\n"
        "try:\n    class Sub(Base, flag=1):\n        pass\nexcept LookupError as e:\n    print('LookupError', e)\n"
        "try:\n    type('Y', (), {'refuse': 1})\nexcept PermissionError as e:\n    print('PermissionError', e)\n"
        "try:\n    type.__new__(int, 'Z', (), {})\nexcept TypeError as e:\n    print('TypeError', e)\n"
        "print(seen)\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "TypeError metaclass conflict: the metaclass of a derived class must be a (non-strict) subclass of the "
        "metaclasses of all its bases",
        "LookupError {'flag': 1}",
        "PermissionError refused",
        "TypeError type.__new__(X): X is not a subtype of type (a type)",
        "[('type', 'A'), ('type', 'B'), ('EnumType', 'E'), ('PyCStructType', 'S'), ('PyCArrayType', "
        "'c_char_Array_3'), ('type', 'X'), ('type', 'Base'), ('type', 'Sub'), ('type', 'Y')]",
    ]


@pytest.mark.parametrize("name", sorted(LANGUAGE_ESCAPES))
def test_language_escapes_found_by_review_are_refused(verifier, name):
    program, detail = LANGUAGE_ESCAPES[name]
    assert prefilter(program) == Prefiltered("forbidden", detail)
    assert verifier.run(program, "1") == Execution("forbidden", None, detail)


@pytest.mark.parametrize(
    ("program", "args", "output"),
    [
        ("class A:\n    def __init__(self, x):\n        self.x = x\nclass B(A):\n    def __init__(self, x):\n"
         "        super().__init__(x)\n        self.y = x + 1\ndef f(x):\n    b = B(x)\n    return (b.x, b.y)\n",
         "2", "(2, 3)"),
        ("class E(Exception):\n    def __init__(self, msg, code):\n        super().__init__(msg)\n        self.code = code\n"
         "def f(x):\n    try:\n        raise E('bad', x)\n    except E as e:\n        return (str(e), e.code, e.args)\n",
         "3", "('bad', 3, ('bad',))"),
        ("class A:\n    def __repr__(self):\n        return 'A'\nclass B(A):\n    def __repr__(self):\n"
         "        return super().__repr__() + '!'\ndef f(x):\n    return repr(B()) * x\n", "2", "'A!A!'"),
        ("class S:\n    inst = None\n    def __new__(cls):\n        if cls.inst is None:\n"
         "            cls.inst = super().__new__(cls)\n        return cls.inst\ndef f(x):\n    return S() is S()\n",
         "1", "True"),
        ("class D(dict):\n    def __getitem__(self, k):\n        return super().__getitem__(k) * 2\n"
         "    def __missing__(self, k):\n        return 0\ndef f(x):\n    d = D(a=x)\n    return [d['a'], d['b']]\n",
         "4", "[8, 0]"),
        ("class Thing:\n    def __init__(self, n):\n        self.n = n\n    def __repr__(self):\n"
         "        return f'{self.__class__.__name__}({self.n})'\ndef f(x):\n"
         "    return [repr(Thing(x)), [type(v).__name__ for v in (1, 'a', x)], type(Thing(1)).__qualname__]\n",
         "3", "['Thing(3)', ['int', 'str', 'int'], 'Thing']"),
        ("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f(a, b):\n    p = P(a, b)\n"
         "    return (tuple(p._replace(x=0)), p._asdict(), P._fields, tuple(P._make([5, 6])), P._field_defaults)\n",
         "1, 2", "((0, 2), {'x': 1, 'y': 2}, ('x', 'y'), (5, 6), {})"),
        ("class P:\n    __slots__ = ('x', 'y')\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
         "    __hash__ = None\n    def __str__(self):\n        return f'<{self.x},{self.y}>'\n    __repr__ = __str__\n"
         "def f(x):\n    p = P(x, 2)\n    try:\n        hash(p)\n    except TypeError:\n        return repr(p)\n",
         "1", "'<1,2>'"),
        ("from collections import namedtuple\nEvent = namedtuple('Event', 'name time')\nclass Clock:\n"
         "    def __init__(self):\n        self.time = 0\n        self.types = ['a']\n    def tick(self, d):\n"
         "        self.time += d\n        return self.time\ndef f(x):\n    c = Clock()\n    c.tick(x)\n"
         "    es = [Event('b', 2), Event('a', x)]\n"
         "    return [c.time, c.types, min(es, key=lambda e: e.time).name, Event('go', 1).time]\n",
         "0", "[0, ['a'], 'a', 1]"),
        ("import collections.abc\nfrom collections import abc\ndef f(x):\n"
         "    return [isinstance(x, collections.abc.Iterable), isinstance(x, abc.Sized)]\n", "[1]", "[True, True]"),
        ("def f(x):\n    return str.format is str.format and str.format('{}', x) == str(x)\n", "1", "True"),
        ("def f(x):\n    return [input.__name__, input.__qualname__]\n", "1", "['input', 'input']"),
        ("class Tok:\n    def __init__(self, type, value):\n        self.type = type\n        self.value = value\n"
         "def f(pairs):\n    toks = [Tok(type, n) for type, n in pairs]\n    kinds = []\n    for type, _ in pairs:\n"
         "        kinds.append(type)\n    return [t.type for t in toks] + kinds\n",
         "[('num', 1), ('op', 2)]", "['num', 'op', 'num', 'op']"),
        ("class A:\n    def __init__(self, x):\n        self.x = x\n    def __add__(self, o):\n"
         "        return self.__class__(self.x + o.x)\nclass B(A):\n    def __init__(self, x):\n"
         "        super(B, self).__init__(x * 10)\ndef f(x):\n    b = B(x) + B(x)\n    return [type(b).__name__, b.x]\n",
         "1", "['B', 200]"),
        ("import json\nclass C:\n    pass\ndef f(x):\n    c = C()\n    c.x = x\n    json.y: int\n    return c.x\n",
         "1", "1"),
        ("import typing, json\nclass K:\n    def __new__(cls):\n        return json\ndef f(x):\n"
         "    type(typing.List[int])(K, (int,))()\n    return sorted(k for k in dir(json) if k.startswith('_' + '_orig'))\n",
         "1", "[]"),
    ],
    ids=["super_init", "exception_super_init", "super_repr", "singleton_super_new", "dict_subclass",
         "class_name", "namedtuple_api", "slots_and_aliases", "module_names_as_attributes", "collections_abc",
         "unbound_format_is_itself", "refused_builtin_named_as_itself", "type_as_a_variable", "two_argument_super_and_class", "annotation_of_a_module_attribute", "alias_call_returning_a_module"],
)  # fmt: skip
def test_common_idioms_a_review_found_refused_now_run(verifier, program, args, output):
    """``super().__init__(...)`` and the other special methods of the allowlist read on ``super()``, a class's
    ``__name__``/``__qualname__`` (also as ``x.__class__.__name__``), the namedtuple API's private names,
    special methods and ``__slots__`` bound in a class body, and attributes named like modules (``event.time``,
    ``collections.abc``): refused by the pre-filter until a breakage review counted them in LLM-written
    programs."""
    assert verifier.run(program, args) == Execution("ok", output, "")


@pytest.mark.parametrize(
    ("program", "detail"),
    [
        ("import json\ndef f(x):\n    json.__name__ = 'importlib'\n    return 1\n",
         "line 3: access to attribute '__name__' is not allowed"),
        ("def f(x):\n    del x.__class__.__qualname__\n    return 1\n",
         "line 2: access to attribute '__qualname__' is not allowed"),
        ("class B:\n    pass\ndef f(x):\n    x.__class__ = B\n    return 1\n",
         "line 4: access to attribute '__class__' is not allowed"),
        ("def f(x):\n    return (lambda type=type: type)()\n",
         "line 2: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
         "a class from a dict of any names)"),
        ("def f(type):\n    class C:\n        T = type\n    return C.T\n",
         "line 3: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
         "a class from a dict of any names)"),
        ("def f(x):\n    global type\n    type = 1\n    return type\n",
         "line 4: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
         "a class from a dict of any names)"),
        ("def f(xs):\n    return [t for t in type]\n",
         "line 2: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
         "a class from a dict of any names)"),
        ("class B:\n    def m(self):\n        return super().__getattribute__('x')\ndef f(x):\n    return 1\n",
         "line 3: access to attribute '__getattribute__' is not allowed"),
        ("class P:\n    __slots__ = ('__dict__',)\ndef f(x):\n    return 1\n",
         "line 2: use of dunder name '__slots__' is not allowed"),
        ("__getattr__ = print\ndef f(x):\n    return 1\n", "line 1: use of dunder name '__getattr__' is not allowed"),
        ("def f(x):\n    return x._value_\n", "line 2: access to private attribute '_value_' is not allowed"),
        ("class E:\n    time = 1\ndef f(x):\n    match E():\n        case E(time=t):\n            return t\n",
         "line 5: a class pattern may not read the attribute 'time'"),
        ("import typing\ndef f(x):\n    return typing.sys\n", "line 3: access to attribute 'sys' is not allowed"),
        ("from calendar import datetime\ndef f(x):\n    return 1\n", None),
        ("import collections.abc\ndef f(x):\n    match x:\n        case collections.abc:\n            return 1\n",
         "line 4: a pattern may not read the attributes the child checks at run time"),
    ],
    ids=["name_written", "qualname_deleted", "class_written", "type_as_a_default",
         "type_in_a_class_body", "type_declared_global", "type_as_the_first_iterable",
         "super_getattribute", "private_slots", "module_getattr", "other_private_names", "module_name_pattern",
         "sys_stays_refused", "module_name_imported", "value_pattern_checked_name"],
)  # fmt: skip
def test_the_idioms_allowed_since_stay_narrow(verifier, program, detail):
    if detail is not None:
        assert prefilter(program) == Prefiltered("forbidden", detail)
    else:  # past the pre-filter: the guarded import refuses a module off the allowlist in a from-list
        assert prefilter(program).status == "ok"
        assert verifier.run(program, "1") == Execution(
            "runtime", None, "while defining the program: ImportError: import of 'datetime' is not allowed"
        )


PRIVATE_OWN = (
    "class Acct:\n    _count = 0\n    def __init__(self, b):\n        self._balance = b\n        self.__secret = b * 2\n"
    "        Acct._count += 1\n    @property\n    def balance(self):\n        return self._balance\n"
    "    def _helper(self):\n        return self.__secret\n    def total(self):\n        self._balance += 1\n"
    "        return self._helper() + self._balance\n    @classmethod\n    def make(cls):\n"
    "        if not hasattr(cls, '_inst'):\n            cls._inst = cls(1)\n        return cls._inst\n"
    "class Sub(Acct):\n    def __init__(self, b):\n        super().__init__(b)\n        self.__secret = -1\n"
    "    def mine(self):\n        return (self.__secret, self._Acct__secret)\n"
    "def f(b):\n    a = Acct(b)\n    del a._balance\n    a._balance = b\n"
    "    return [a.balance, a.total(), Acct._count, Acct.make()._balance, Acct.make() is Acct.make(), Sub(2).mine()]\n"
)


def test_programs_use_private_names_on_their_own_objects(verifier):
    """``self._x``, class-private ``self.__x`` (mangled by the child as CPython does, subclass and base
    apart), class attributes, reads, writes, augmented writes and deletes: on the program's own classes and
    instances (the pre-filter lets ``rules.own_private`` names through, the child checks each at run
    time). LLM-written classes keep their state in such names (a breakage review: the most common false
    refusal)."""
    assert prefilter(PRIVATE_OWN).status == "ok"
    assert verifier.run(PRIVATE_OWN, "150") == Execution("ok", "[150, 451, 1, 1, True, (-1, 4)]", "")


def test_private_names_on_subclasses_of_built_ins_and_through_super(verifier):
    """Private names where a built-in base's lookup is CPython's generic one (``list``, ``int``, ``Exception``
    carry a ``__getattribute__`` in their namespace) and on ``super()``, ``__x`` mangled (a red-team review of
    the rule: all refused or wrong at first); patterns that would read them stay refused, with a reason."""
    program = (
        "class L(list):\n    def __init__(self, *a):\n        super().__init__(*a)\n        self._n = 3\n"
        "class E(Exception):\n    def __init__(self, c):\n        super().__init__(c)\n        self._code = c\n"
        "class Money(int):\n    def __new__(cls, v, cur):\n        m = super().__new__(cls, v)\n        m._cur = cur\n"
        "        return m\nclass A:\n    def _h(self):\n        return 1\n    def __h(self):\n        return 2\n"
        "class B(A):\n    def g(self):\n        return super()._h() + super()._A__h()\n    def k(self):\n"
        "        return self._h()\nclass C(A):\n    def __h(self):\n        return 5\n    def m(self):\n"
        "        return self.__h() + self._A__h()\n"
        "def f(x):\n    try:\n        raise E(x)\n    except E as e:\n        code = e._code\n"
        "    return [L([1])._n, code, Money(5, 'EUR')._cur, B().g(), B().k(), C().m()]\n"
    )
    namespace: dict = {}
    exec(program, namespace)  # our own program: plain Python's answer
    assert verifier.run(program, "7") == Execution("ok", repr(namespace["f"](7)), "")
    for pattern in ("{A._x: v}", "A._B()", "A._x"):
        source = f"class A:\n    _x = 1\ndef f(x):\n    match x:\n        case {pattern}:\n            return 1\n    return 0\n"
        assert prefilter(source) == Prefiltered(
            "forbidden", "line 5: a pattern may not read the attributes the child checks at run time"
        )


def test_abstract_base_classes_work_as_in_plain_python(verifier):
    """``from abc import ABC, abstractmethod`` (LLM-written class hierarchies, a breakage review): abstract
    methods refuse instances of incomplete subclasses, ``isinstance``/``issubclass`` hold; ``ABCMeta`` still
    makes no class holding names a class statement may not write, and ``update_abstractmethods`` (it sets
    ``__abstractmethods__`` on any class) stays a forbidden name."""
    program = (
        "from abc import ABC, abstractmethod\nimport abc\nclass Shape(ABC):\n    @abstractmethod\n"
        "    def area(self):\n        ...\n    def describe(self):\n"
        "        return f'{type(self).__name__} with area {self.area()}'\nclass Sq(Shape):\n"
        "    def __init__(self, s):\n        self._s = s\n    def area(self):\n        return self._s ** 2\n"
        "class Bad(Shape):\n    pass\ndef f(x):\n    try:\n        Bad()\n        made = True\n    except TypeError:\n"
        "        made = False\n    return [Sq(x).describe(), made, isinstance(Sq(1), Shape), issubclass(Sq, abc.ABC)]\n"
    )
    namespace: dict = {}
    exec(program, namespace)  # our own program: plain Python's answer
    assert verifier.run(program, "3") == Execution("ok", repr(namespace["f"](3)), "")
    made = "import abc\ndef f(x):\n    M = abc.ABCMeta\n    return M('X', (), {'_' + '_getattr__': len}).y\n"
    assert verifier.run(made, "1") == Execution(
        "forbidden",
        None,
        "the program made a class holding the name '__getattr__' (at run time or through the standard library)",
    )
    assert prefilter("import abc\ndef f(x):\n    return abc.update_abstractmethods(x)\n") == Prefiltered(
        "forbidden", "line 3: access to attribute 'update_abstractmethods' is not allowed"
    )


SPECIAL_OWN = (
    "class A:\n    def __init__(self, x):\n        self.x = x\n    def __eq__(self, o):\n        return self.x == o.x\n"
    "    def __add__(self, o):\n        return A(self.x + o.x)\nclass B(A):\n    def __init__(self, x):\n"
    "        A.__init__(self, x)\n        self.y = x\n"
    "def f(x):\n    b = B(x)\n    return [b.__eq__(B(x)), b.__add__(b).x, A.__eq__(b, A(x)), B.__hash__ is None]\n"
)


def test_programs_read_special_methods_of_their_own_classes(verifier):
    """``A.__init__(self, x)``, ``self.__eq__(o)``, ``b.__add__(b)`` (LLM-written classes, a breakage review: 16
    of 319 programs read a dunder): a special method of the allowlist read where a class of the program's
    provides it, checked at run time like a private name; one the standard library provides (an inherited
    ``object.__new__``, ``UserDict.__init__`` that writes into whatever it is given, ``int.__add__``, type's
    ``__call__``) stays refused, and reads of other dunders stay refused by the pre-filter."""
    namespace: dict = {}
    exec(SPECIAL_OWN, namespace)  # our own program: plain Python's answer
    assert verifier.run(SPECIAL_OWN, "2") == Execution("ok", repr(namespace["f"](2)), "")
    for program, detail in [
        ("class A:\n    pass\ndef f(x):\n    t = type(int)\n    return repr(A.__new__(t))\n",
         "the program read the special method '__new__' of the class 'A', not one of its own"),
        ("import collections\nclass M(collections.UserDict):\n    pass\ndef f(x):\n    import json\n"
         "    M.__init__(json)\n    return 1\n",
         "the program read the special method '__init__' of the class 'M', not one of its own"),
        ("def f(x):\n    return x.__add__(1)\n",
         "the program read the special method '__add__' of an object of the class 'int', not one of its own"),
        ("class A:\n    pass\ndef f(x):\n    return A.__call__()\n",
         "the program read the special method '__call__' of the class 'A', not one of its own"),
    ]:  # fmt: skip
        assert prefilter(program).status == "ok"
        assert verifier.run(program, "1") == Execution("forbidden", None, detail)
    rebound = (  # `super` rebound: a special method read on what it gives, refused at run time
        "import json\nsuper = lambda: json\nclass B:\n    def m(self):\n        return super().__init__\n"
        "def f(x):\n    return B().m()\n"
    )
    assert verifier.run(rebound, "1") == Execution(
        "forbidden", None, "the program read super().__init__ where super() is not bound to an instance"
    )
    assert prefilter("class A:\n    pass\ndef f(x):\n    return A.__init__.__globals__\n") == Prefiltered(
        "forbidden", "line 4: access to attribute '__globals__' is not allowed"
    )


def test_type_may_be_tested_against_with_isinstance_and_issubclass(verifier):
    """``isinstance(x, type)`` and ``issubclass(c, (type, int))`` hand ``type`` to the built-ins, which answer with
    a bool (a breakage review); where the program binds ``isinstance`` itself, its function would be handed
    ``type``, and ``type`` stays refused as a value."""
    program = (
        "def f(x):\n    return [isinstance(x, type), isinstance(int, type), issubclass(bool, (type, int))]\n"
    )
    assert verifier.run(program, "1") == Execution("ok", "[False, True, True]", "")
    refused = (
        "line 3: `type` other than called as type(x) is not allowed (`T = type` made T(name, bases, namespace): "
        "a class from a dict of any names)"
    )
    assert prefilter(
        "isinstance = lambda a, b: b\ndef f(x):\n    return isinstance(x, type)\n"
    ) == Prefiltered("forbidden", refused)


def test_no_program_code_runs_between_a_private_name_check_and_its_read(verifier):
    """``_is_standard`` compared a class's ``__module__`` with ``==``: a program's object there ran its ``__eq__``
    inside the check of a private read and deleted the class's own attribute, so that the read found
    ``string.Template._invalid`` (red-team round 24, partial). A class made with such a ``__module__`` is
    refused where it is made; behind that check, the comparison runs no program code."""
    program = (
        "import string\nclass M:\n    n = 0\n    def __eq__(self, other):\n        M.n += 1\n        if M.n == 2:\n"
        "            del M.k._invalid\n        return False\n    def __hash__(self):\n        return 0\nclass B:\n"
        "    pass\ndef f(x):\n    M.k = type(B)('K', (string.Template,), {'_' + '_module__': M(), '_invalid': 0})\n"
        "    return [type(M.k('$')._invalid).__name__, M.n]\n"
    )
    assert verifier.run(program, "1") == Execution(
        "forbidden",
        None,
        "the program made a class holding the name __module__ given as a M (at run time or through the "
        "standard library)",
    )
    assert _below_the_class_check(program) == Execution("ok", "['int', 0]", "")


@pytest.mark.parametrize(
    ("program", "detail"),
    [
        ("import collections\ndef f(x):\n    return repr(collections._sys)\n",
         "the program read the private attribute '_sys' of the module 'collections', not one of its own"),
        ("import fractions\ndef f(x):\n    return fractions.Fraction(1, 3)._numerator\n",
         "the program read the private attribute '_numerator' of an object of the class 'Fraction', not one of "
         "its own"),
        ("import fractions\nclass P(fractions.Fraction):\n    pass\ndef f(x):\n    return P(1, 3)._numerator\n",
         "the program read the private attribute '_numerator' of an object of the class 'P', not one of its "
         "own"),
        ("import collections.abc\nclass S(collections.abc.Sized):\n    def __len__(self):\n        return 0\n"
         "def f(x):\n    return S._dump_registry\n",
         "the program read the private attribute '_dump_registry' of the class 'S', not one of its own"),
        ("import collections\nclass U(collections.UserDict):\n    pass\ndef f(x):\n    return repr(U._abc_impl)\n",
         "the program read the private attribute '_abc_impl' of the class 'U', not one of its own"),
        ("def g():\n    pass\ndef f(x):\n    g._cache = 1\n    return 1\n",
         "the program wrote or deleted the attribute '_cache' of an object of the class 'function', not one of "
         "its own"),
        ("import fractions\nclass P(fractions.Fraction):\n    def g(self):\n        self._numerator += 1\n"
         "        return 1\ndef f(x):\n    return P(1, 3).g()\n",
         "the program wrote or deleted the attribute '_numerator' of an object of the class 'P', not one of its "
         "own"),
        ("def f(x):\n    return x._private\n",
         "the program read the private attribute '_private' of an object of the class 'int', not one of its own"),
    ],
    ids=["module", "standard_object", "standard_base_slot", "metaclass_method", "abc_data", "function",
         "augmented_standard_slot", "argument"],
)  # fmt: skip
def test_private_names_of_the_standard_library_stay_out_of_reach(verifier, program, detail):
    """A private name is the program's own only where it is found first on a class of the program's or in its
    instance's own dict: of modules, standard objects, standard bases and metaclasses, functions, and what
    the standard library wrote into a program's class (``_abc_impl``), reads and writes are refused at run
    time, whatever the program does with the error."""
    assert prefilter(program).status == "ok"
    assert verifier.run(program, "1") == Execution("forbidden", None, detail)


def test_attributes_named_os_and_inspect_are_checked_at_run_time(verifier):
    """``device.os``, ``car.inspect()``: names of modules and, as often, of a program's attributes (a breakage
    review), read through the run-time check of ``MODULE_READS`` like ``event.time``; a module they name is
    refused where an allowed module holds it (none holds these two today)."""
    program = (
        "class Device:\n    def __init__(self, s):\n        self.os = s\n    def inspect(self):\n"
        "        return self.os.upper()\ndef f(x):\n    d = Device(x)\n    return [d.os, d.inspect()]\n"
    )
    assert verifier.run(program, "'linux'") == Execution("ok", "['linux', 'LINUX']", "")
    assert {"os", "inspect"} <= MODULE_READS


def test_format_fields_may_walk_to_the_readable_dunders(verifier):
    """``'{0.__class__.__name__}({0.v})'.format(self)`` in a ``__repr__`` (a breakage review): a format field
    may walk to what the program's own code may read (``__class__``, ``__name__``, ``__qualname__``), in a
    constant (the pre-filter) and in a string built at run time (the child); any other dunder stays refused
    both ways."""
    constant = (
        "class P:\n    def __init__(self, v):\n        self.v = v\n    def __repr__(self):\n"
        "        return '{0.__class__.__name__}({0.v})'.format(self)\ndef f(x):\n    return repr(P(x))\n"
    )
    assert verifier.run(constant, "3") == Execution("ok", "'P(3)'", "")
    built = "def f(x):\n    u = '_' * 2\n    return ('{0.' + u + 'class' + u + '.' + u + '%s' + u + '}').format(x)\n"
    assert verifier.run(built % "qualname", "3") == Execution("ok", "'int'", "")
    assert verifier.run(built % "base", "3") == Execution(
        "forbidden",
        None,
        "a format string walks to a private or forbidden name at run time (0.__class__.__base__)",
    )
    assert prefilter(constant.replace("__name__", "__base__")) == Prefiltered(
        "forbidden", "line 5: a format string that reaches private or frame attributes is not allowed"
    )


def test_module_names_checked_at_run_time_stay_forbidden_names_elsewhere():
    """The names of ``MODULE_READS`` pass the pre-filter as attribute reads only: as from-import names, in
    format fields and as pattern keywords they are refused by ``FORBIDDEN_ATTRIBUTES``'s rules."""
    assert MODULE_READS <= FORBIDDEN_ATTRIBUTES


def test_a_program_that_rebinds_its_builtins_is_refused_past_the_pre_filter():
    """The child's own check behind the pre-filter's refusal of every dunder binding: a guarded program whose
    ``__builtins__`` global is not its table once its module has run is ``forbidden`` before ``f`` is
    called (``import typing as __builtins__`` gave the functions defined after it typing's globals, ``sys``
    among them). Run in a fresh interpreter, the program compiled by the child itself, no pre-filter."""
    script = (
        "import os\nimport _child, verdicts\n"
        "src = 'import typing as __builtins__\\ndef f():\\n    return sys.platform\\n'\n"
        "for guards in (frozenset({'typing'}), None):\n"
        "    prepared = _child.prepare(src, [''], allowed=guards).call(0)\n"
        "    read, write = os.pipe()\n"
        "    _child.run_program(prepared, write, max_output=1000, max_depth=50)\n"
        "    print(verdicts.parse_line(os.read(read, 1000).rstrip(b'\\n')))\n"
    )
    assert _in_a_fresh_interpreter(script) == [
        "['forbidden', None, 'the program rebound __builtins__']",
        str(["ok", repr(sys.platform), ""]),  # unguarded: plain Python (typing's globals hold `sys`)
    ]


def test_a_module_name_read_in_a_format_field_stays_refused(verifier):
    program = "class E:\n    time = 1\ndef f(x):\n    return ('{0.' + 'time}').format(E())\n"
    assert verifier.run(program, "1") == Execution(
        "forbidden", None, "a format string walks to a private or forbidden name at run time (0.time)"
    )


def test_ordinary_special_methods_and_keywords_stay_allowed(verifier):
    """The special-method allowlist keeps what programs write: construction, comparison, arithmetic,
    containers, iteration, hashing; keyword arguments without a leading underscore."""
    program = (
        "from typing import NamedTuple\n"
        "class P(NamedTuple):\n    x: int\n    tags: tuple = ()\n"
        "    def __add__(self, o):\n        return P(self.x + o.x)\n"
        "    def __radd__(self, o):\n        return P(self.x + o)\n"
        "class Bag:\n    def __init__(self, *xs):\n        self.xs = list(xs)\n    def __len__(self):\n"
        "        return len(self.xs)\n    def __iter__(self):\n        return iter(self.xs)\n"
        "    def __getitem__(self, i):\n        return self.xs[i]\n    def __contains__(self, v):\n        return v in self.xs\n"
        "    def __eq__(self, o):\n        return list(self) == list(o)\n    def __hash__(self):\n        return len(self)\n"
        "    def __repr__(self):\n        return f'Bag({self.xs})'\n"
        "import copy, collections\n"
        "def f(x):\n    b = Bag(*sorted([P(3), P(x)], reverse=True))\n"
        "    c = copy.deepcopy([b, collections.deque([P(2)]), collections.Counter('aab'), P(4)])\n"
        "    assert c[0] == b and c[0] is not b and c[1][0] == P(2) and c[2]['a'] == 2 and copy.copy(b) == b\n"
        "    return [repr(b), len(b), (P(1) + P(2)).x, (5 + P(1)).x, b[0].x, P(3) in b, sorted(b)[0].x]\n"
    )
    assert prefilter(program) == Prefiltered("ok")
    assert (
        verifier.run(program, "1").output
        == "['Bag([P(x=3, tags=()), P(x=1, tags=())])', 2, 3, 6, 3, True, 1]"
    )


@pytest.mark.parametrize("most", [1, 8])
def test_programs_per_request_bounds_what_an_escaped_program_can_see(most):
    """What a program that escapes the language layer reaches of the other programs: those of its request.
    With the language layer off (kernel layers only), a program walks to the worker's frame and counts the
    request's programs: up to ``programs_per_request``, and 1 keeps every program alone."""
    spy = (
        "import sys\ndef f(x):\n    frame = sys._getframe()\n    while frame.f_code.co_name != 'handle':\n"
        "        frame = frame.f_back\n    return len(frame.f_locals['jobs'])\n"
    )
    with Verifier(
        workers=1, language_guards=False, check_determinism=False, cache_size=0, programs_per_request=most
    ) as v:
        seen = v.run_many([(f"{spy}# program {i}\n", "0") for i in range(16)])  # 16 programs, not 16 calls
    assert {e.status for e in seen} == {"ok"}, seen
    assert max(int(e.output) for e in seen) == most


def test_an_induction_answer_sees_no_expected_output_and_no_other_program():
    """In the game the code students write is an induction answer, run by ``check_induction``: it is alone in
    its request and the outputs it is scored against stay in the host. With the language layer off, an
    answer that walks to the worker's frame finds one program there and no expected output in the request."""
    spy = (
        "import sys\ndef f(x):\n    frame = sys._getframe()\n    while frame.f_code.co_name != 'handle':\n"
        "        frame = frame.f_back\n    request = frame.f_locals['request']\n"
        "    return len(frame.f_locals['jobs']) + 100 * ('SEC' + 'RET' in repr(request)) + x\n"
    )
    pairs = [("0", "1"), ("1", "2"), ("2", "'SECRET'")]  # the third is never reproduced: 2 of 3 at best
    with Verifier(workers=1, language_guards=False, check_determinism=False, cache_size=0) as v:
        assert v.check_induction(spy, pairs) == pytest.approx(2 / 3)


def test_programs_per_request_is_checked():
    from populora_env.verifier import VerifierConfig

    for bad in (0, 9):
        with pytest.raises(ValueError, match="programs_per_request"):
            VerifierConfig(programs_per_request=bad)


# A suspended generator that holds itself is freed only by the cyclic collector, whose `finally` then writes into
# the returned value; the 44 nested lists keep enough of the renderer's containers alive for a collection to start
# while the value is rendered. `flag` says what `out[39]` was when `f` returned (computed with no allocation after).
_FINALLY_WRITES_THE_VALUE = """def f(n):
    deep = []
    for _ in range(44):
        deep = [deep]
    out = [deep] + [[i] for i in range(1, 40)]
    nines = [999]
    def g():
        me = yield
        try:
            yield
        finally:
            out[39] = [999]
    gen = g()
    next(gen)
    gen.send(gen)
    del gen
    pad = [[] for _ in range(n)]
    result = [out, pad, None]
    result[2] = out[39] == nines
    return result
"""


def test_the_program_s_finalizers_do_not_change_its_value_while_it_is_rendered(verifier, bare_verifier):
    """Red-team round 46: the collector ran as the verdict was rendered, and a finalizer changed the value being
    rendered: `ok` with an output no run of the program returns (a gold answer no student can work out)."""
    rendered = 0
    for v in (verifier, bare_verifier):
        for n in range(200, 680, 40):
            execution = v.run(_FINALLY_WRITES_THE_VALUE, str(n))
            assert execution.status in ("ok", "nondeterministic"), execution
            if execution.status == "ok":
                out, _, flag = ast.literal_eval(execution.output)
                assert (out[39] == [999]) == flag, (n, execution.output[-40:])
                rendered += 1
    assert rendered  # (the collector runs at the same count in both runs of a call here: most calls are `ok`)


def test_an_output_that_counts_to_the_first_collection_is_nondeterministic(verifier, bare_verifier):
    """Red-team round 46: each child starts the collector from zero, so a count of the containers made before a
    cycle's finalizer fired came out alike in both runs (689 here, 553 in a fresh interpreter): the shifted pool's
    children now start it 101 containers on."""
    program = (
        "def f(x):\n    box = []\n    def g():\n        me = yield\n        try:\n            yield\n"
        "        finally:\n            box.append(1)\n    gen = g()\n    next(gen)\n    gen.send(gen)\n"
        "    del gen\n    keep = []\n    n = 0\n    while not box:\n        keep.append([])\n        n += 1\n"
        "    return n"
    )
    for v in (verifier, bare_verifier):
        assert v.run(program, "0").status == "nondeterministic"


def test_a_class_made_during_an_import_holds_hooks_only_of_the_code_running_it(verifier):
    """Red-team round 46's lead: a class made while a module is imported counted as the module's when every hook
    under a name the program rules refuse was any function written in a standard-library file; a program's C
    callables, run from ``re``'s pattern cache during an import, made one with ``textwrap.dedent`` as its
    ``__getattr__`` and it was recorded as ``re.E``. Only functions of files running the class's making count."""
    for hook in ("textwrap.dedent", "collections.UserString.format"):  # (round 47: the child's own guards)
        program = _made_during_an_import(
            "textwrap, collections",
            f"def f(x):\n    make(['E'], [(object,)], [{{'_' + '_getattr__': {hook}, 'data': 'got {{0}}'}}])\n"
            "    return [repr(L), L[0]().zzz]\n",
        )
        assert verifier.run(program, "1") == _hook_refused(), hook  # (since round 54, at the driver)


# Red-team round 51: functools.partialmethod's `_method`, written in functools.py, forwards to what its cell holds
_PARTIALMETHOD_HOOK = _made_during_an_import(
    "functools",
    "def hook(self, name):\n    return 'hooked ' + name\n"
    "class H:\n    mk = functools.partialmethod(type(int))\n    gh = functools.partialmethod(hook)\n"
    "def f(x):\n    make(['E'], [(object,)], [{'_' + '_getattr__': H.gh}])\n    return [len(L), L[0]().zzz]\n",
    maker="H.mk",
)
_PARTIALMETHOD_METACLASS = _made_during_an_import(
    "functools",
    "G = []\ndef prep(*a, **k):\n    G.append('prepare')\n    return {'injected': 42}\n"
    "def inst(cls, obj):\n    return True\ndef mro(cls):\n    G.append('mro')\n    return (cls, object)\n"
    "def ga(self, name):\n    if name == '_' + '_class__':\n        return tuple\n    return 'got ' + name\n"
    "class H:\n    mk = functools.partialmethod(type(int))\n    p = functools.partialmethod(prep)\n"
    "    i = functools.partialmethod(inst)\n    m = functools.partialmethod(mro)\n"
    "    g = functools.partialmethod(ga)\n"
    "def f(x):\n    T = type(int)\n    u = '_' + '_'\n"
    "    make(['M', 'Z'], [(T,), (object,)],\n"
    "         [{u + 'prepare' + u: H.p, u + 'instancecheck' + u: H.i, 'mro': H.m}, {u + 'getattribute' + u: H.g}])\n"
    "    M, Z = L\n    class K(metaclass=M):\n        seen = injected\n    z = Z()\n"
    "    return [K.seen, isinstance(5, K), isinstance('s', K), isinstance(z, tuple), z.anything, G]\n",
    maker="H.mk",
)


# Red-team round 52: collections.UserList.index (self.data.index) as the trampoline, UserList.pop (self.data.pop)
# as the hook, reading a program object the class's namespace holds as `data`
_USERLIST = "class Maker:\n    index = type(int)\nclass U(collections.UserList):\n    pass\nu = U()\nu.data = Maker()\n"
_USERLIST_POP_HOOK = _made_during_an_import(
    "collections",
    _USERLIST + "class P:\n    def pop(self, i):\n        return 'hooked ' + i\n"
    "def f(x):\n    make(['E'], [(object,)], [{'_' + '_getattr__': collections.UserList.pop, 'data': P()}])\n"
    "    return [len(L), L[0]().zzz]\n",
    maker="u.index",
)
_USERLIST_POP_METACLASS = _made_during_an_import(
    "collections",
    _USERLIST + "G = []\nclass A:\n    seen = 'from A'\n"
    "class MroData:\n    def pop(self, i):\n        G.append('mro ran program code')\n        return (A, object)\n"
    "class InstData:\n    def pop(self, obj):\n        G.append('instancecheck ' + repr(obj))\n        return True\n"
    "class GaData:\n    def pop(self, name):\n        return 'got ' + name\n"
    "def f(x):\n    T = type(int)\n    u = '_' + '_'\n    pop = collections.UserList.pop\n"
    "    make(['M1', 'M', 'Z'], [(T,), (T,), (object,)], [{'mro': pop, 'data': MroData()},\n"
    "         {u + 'instancecheck' + u: pop}, {u + 'getattr' + u: pop, 'data': GaData()}])\n"
    "    M1, M, Z = L\n    class K(metaclass=M):\n        seen = 'from K'\n        data = InstData()\n"
    "    return [K.seen, isinstance(5, K), isinstance('s', K), Z().anything, G]\n",
    maker="u.index",
)


@pytest.mark.parametrize(
    ("hook", "metaclass"),
    [(_PARTIALMETHOD_HOOK, _PARTIALMETHOD_METACLASS), (_USERLIST_POP_HOOK, _USERLIST_POP_METACLASS)],
    ids=["round-51-closure", "round-52-namespace"],
)
def test_standard_library_code_forwarding_to_a_program_is_no_module_s_hook(verifier, hook, metaclass):
    """Classes made while ``encodings.idna`` was imported (``re``'s pattern cache running the program's C
    callables) were recorded as the standard library's with hooks that forward to program code, from files
    running their making: as ``__getattr__``, and as a metaclass's ``__prepare__``, ``__instancecheck__``
    and ``mro`` (with an object whose ``__getattribute__`` lied about its ``__class__``). Round 51:
    ``functools.partialmethod(c)`` read on a class gives its ``_method``, written in ``functools.py``, whose
    cell holds the program's ``c``: what a module's function holds must be what its module could have given
    it. Round 52, with those closures refused: ``collections.UserList.pop`` (``self.data.pop(i)``, no
    closure) with a program object as ``data`` in the same namespace: the names a hook reads must hold, in
    the namespace, what a module could have put there."""
    # (since round 54 both are refused at their driver: the partial as __eq__; round 51's before it, at its
    # trampoline, a partialmethod of type(int) in a class: round 55)
    refused = _hook_refused("mk", "partialmethod") if hook is _PARTIALMETHOD_HOOK else _hook_refused()
    assert verifier.run(hook, "1") == verifier.run(metaclass, "1") == refused


def test_a_module_s_hook_reading_an_enum_member_of_its_class_is_still_the_module_s(verifier):
    """``string.Template``'s ``__init_subclass__`` reads ``flags``, an enum member (round 52's check)."""
    program = "import string\ndef f(x):\n    return string.Template('$a-$b').substitute(a=x, b=2)"
    assert verifier.run(program, "1") == Execution("ok", "'1-2'", "")


# Red-team round 53: enum's member-value cache is a driver of its own. `re.RegexFlag(X(66))` leaves the program's
# X(66) as the key of 66 in `RegexFlag._value2member_map_`; `re.VERBOSE | re.IGNORECASE`, computed when `fractions`,
# `string` or `statistics` is imported, looks 66 up there and calls X's `__eq__` (a partial over `map(type, ...)`)
# from C, during the import.
_ENUM_DRIVER = (
    "import re, functools\n"
    + _KEY_AS_DRIVER.replace("HASH", "66")
    + "    re.RegexFlag(X(66))\n    import fractions\n"
)
_BARE_METACLASS = "def f(x):\n    make(['M'], [(type(int),)], [{}])\n    return [c.__name__ for c in L]\n"


# Red-team round 54: typing's __subclasshook__ for a Protocol subclass reads `_is_runtime_protocol` of the class,
# and array's C init, registering array with MutableSequence, asks it: a classmethod(property(partial)) there
# ran the program's C callables during `import array`, every frame between at a call.
_PROTOCOL_DRIVER = (
    "import functools, typing\nimport collections.abc\nL = []\nS = [0]\n"
    "class Flip:\n    def _" + "_bool__(self):\n        S[0] += 1\n        return S[0] != 2\n"
    "def f(x):\n    T = type(int)\n    maker = map(T, ['M'], [(T,)], [{}])\n"
    "    class Proto(typing.Protocol):\n        pass\n"
    "    class P(collections.abc.MutableSequence, Proto):\n        FLAG\n"
    "        HOOK\n"
    "    STORE\n    import array\n    return [c.__name__ for c in L] + [S[0]]\n"
)
_PROTOCOL_HOOK = "classmethod(property(functools.partial(dict.fromkeys, map(L.append, maker))))"


_ROUND_55_HOOKS = {  # the same descriptor behind a subclass of its class, the standard library's or the program's
    "protocol-hook-abc": ("abc.abstractclassmethod(abc.abstractproperty(PARTIAL))", "abstractclassmethod"),
    "protocol-hook-subclass": ("CM(property(PARTIAL))", "CM"),
    "protocol-hook-partialmethod": (
        "functools.partialmethod(classmethod(property(PARTIAL)))",
        "partialmethod",
    ),
}


@pytest.mark.parametrize(
    "driver", ["re-cache", "enum-values", "protocol-hook", "protocol-hook-stored", *_ROUND_55_HOOKS]
)
def test_a_program_s_classes_hold_functions_as_special_methods_and_descriptors(verifier, driver):
    """Every driver of red-team rounds 34 to 54 ran the program's C callables (a ``functools.partial`` over
    ``map(type, ...)``) from C while a module was imported, below no frame of the program's: as the ``__eq__`` of
    an int subclass kept as a key by ``re``'s pattern cache or ``enum``'s member-value cache (rounds 34-53), as a
    ``classmethod(property(...))`` that ``typing``'s ``__subclasshook__`` reads (round 54), in a class statement
    or stored after it, also as a subclass of those or inside a ``functools.partialmethod`` (round 55). A
    program's special methods and descriptors hold functions (``_child._runs_in_a_frame``,
    ``check_class_store``), which run in a frame of the program's wherever they are called from."""
    if driver == "re-cache":
        program, refused = _made_during_an_import("copy", _BARE_METACLASS), _hook_refused()
    elif driver == "enum-values":
        program, refused = _ENUM_DRIVER.replace("MAKER", "type(int)") + _BARE_METACLASS, _hook_refused()
    elif driver == "protocol-hook":
        program = _PROTOCOL_DRIVER.replace("HOOK", "hook = " + _PROTOCOL_HOOK).replace("STORE", "")
        refused = _hook_refused("hook", "classmethod")
    elif driver in _ROUND_55_HOOKS:  # (red-team round 55: the exact types only were checked)
        hook, kind = _ROUND_55_HOOKS[driver]
        partial = "functools.partial(dict.fromkeys, map(L.append, maker))"
        preamble = "class CM(classmethod):\n    pass\n" if driver == "protocol-hook-subclass" else ""
        program = (
            "import abc\n"
            + preamble
            + _PROTOCOL_DRIVER.replace("HOOK", "hook = " + hook.replace("PARTIAL", partial)).replace(
                "STORE", ""
            )
        )
        refused = _hook_refused("hook", kind)
        if preamble:  # (since round 56 a program may not subclass them at all)
            refused = _subclass_refused("'classmethod'")
    else:  # (a Protocol's attributes are typing's to write: refused before the rule on descriptors)
        program = _PROTOCOL_DRIVER.replace("HOOK", "pass").replace(
            "STORE", "P._is_runtime_protocol = " + _PROTOCOL_HOOK
        )
        refused = Execution("forbidden", None, "the program wrote or deleted the attribute '_is_runtime_protocol' "
                            "of the class 'f.<locals>.P', not one of its own")  # fmt: skip
    assert verifier.run(program.replace("FLAG", "pass"), "1") == refused


def test_typing_s_protocol_flags_of_a_program_s_class_are_bools(verifier):
    """Rounds 54 to 58 all needed typing to take a class deriving from ``MutableSequence`` (or ``numbers.Number``)
    for a protocol: ``_is_protocol`` an object of the program's answering False to ``Protocol.__init_subclass__``'s
    check of the bases and True to ``_proto_hook`` when ``array``'s (``decimal``'s) C init registered a class
    with that ABC, which then read the class's descriptors during the import. A program's class holds bools
    there; real protocols keep working."""
    program = (
        _PROTOCOL_DRIVER.replace("FLAG", "_is_protocol = Flip()").replace("HOOK", "pass").replace("STORE", "")
    )
    assert verifier.run(program, "1") == Execution(
        "forbidden", None, "the program made a class holding the name '_is_protocol' as a 'Flip', not a bool (at "
        "run time or through the standard library)",
    )  # fmt: skip
    fine = (
        "import typing\n@typing.runtime_checkable\nclass P(typing.Protocol):\n    def g(self) -> int: ...\n"
        "class A:\n    def g(self):\n        return 1\ndef f(x):\n    return [isinstance(A(), P), isinstance(1, P)]\n"
    )
    assert verifier.run(fine, "1") == Execution("ok", "[True, False]", "")
    # round 59: annotations checked as the class is made, then given a key of the program's through its own
    # reference to the dict: the class holds a copy (typing read the key's startswith three times before)
    later = (
        "import typing\nR = []\nclass Key:\n    def startswith(self, s):\n        R.append('read')\n"
        "        return True\nclass Proto(typing.Protocol):\n    pass\ndef f(x):\n    ann = {}\n"
        "    P = typing.runtime_checkable(type(Proto)('P', (typing.Protocol,), {'_' + '_annotations__': ann}))\n"
        "    ann[Key()] = 1\n    isinstance(1, P)\n    return R\n"
    )
    assert verifier.run(later, "1") == Execution("ok", "[]", "")


def test_functions_as_special_methods_and_descriptors_still_work(verifier):
    """What programs write (functions, lambdas, ``None`` as ``__hash__``, descriptors of functions, a partial as
    a plain attribute) and what the standard library adds for them (enum's mixin methods, total_ordering's,
    namedtuple's) are kept; a property of a C callable is refused, in a class statement or stored after it."""
    fine = (
        "import enum, functools, collections, operator\n"
        "class C(enum.IntEnum):\n    A = 1\n"
        "@functools.total_ordering\nclass T:\n    def _" + "_init__(self, v):\n        self.v = v\n"
        "    def _"
        + "_eq__(self, o):\n        return self.v == o.v\n    _"
        + "_lt__ = lambda self, o: self.v < o.v\n"
        "    _" + "_hash__ = None\n    w = property(lambda self: self.v * 2)\n"
        "    s = staticmethod(lambda: 's')\n    c = classmethod(lambda cls: cls._" + "_name__)\n"
        "    p = functools.partial(operator.add, 1)\n"
        "P = collections.namedtuple('P', 'a b')\n"
        "def f(x):\n    T.z = property(lambda self: 'z')\n"
        "    return [format(C.A), T(1) <= T(2), T(2).w, T.s(), T.c(), T.p(2), T(0).z, P(1, 2)._asdict()]\n"
    )
    assert verifier.run(fine, "1") == Execution(
        "ok", "['1', True, 4, 's', 'T', 3, 'z', {'a': 1, 'b': 2}]", ""
    )
    made = "import functools\nclass K:\n    g = property(functools.partial(len))\ndef f(x):\n    return 1\n"
    assert verifier.run(made, "1") == _hook_refused("g", "property")
    stored = "import functools\nclass K:\n    pass\ndef f(x):\n    K.g = property(functools.partial(len))\n    return 1\n"
    assert verifier.run(stored, "1") == _hook_refused("g", "property")
    # a subclass of property shadowing `fget` with a class attribute of its own (round 55), or setting its
    # function again with `super().__init__` after the class was checked (round 56): no subclass of them
    shadow = (
        "import functools\nclass MyProp(property):\n    fget = None\nclass K:\n"
        "    g = MyProp(functools.partial(len, [1]))\ndef f(x):\n    return K().g\n"
    )
    assert verifier.run(shadow, "1") == _subclass_refused("'property'")
    # the standard library's subclass of one is read through the base's field
    abstract = "import abc, functools\nclass K:\n    g = abc.abstractproperty(functools.partial(len))\ndef f(x):\n    return 1\n"
    assert verifier.run(abstract, "1") == _hook_refused("g", "abstractproperty")
    # the functions a descriptor holds, set again after its class was checked (round 56)
    for make, field in (("functools.partialmethod(g)", "func"), ("functools.cached_property(g)", "func"),
                        ("enum.property(g)", "fget")):  # fmt: skip
        program = (
            f"import enum, functools\ndef g(*a):\n    return 1\nd = {make}\nclass K:\n    h = d\n"
            f"def f(x):\n    d.{field} = functools.partial(len)\n    return 1\n"
        )
        kind = make.split("(")[0].split(".")[1]
        assert verifier.run(program, "1") == Execution(
            "forbidden", None,
            f"the program wrote or deleted the attribute '{field}' of an object of the class '{kind}', not one of its own",
        ), make  # fmt: skip
    # a standard-library function that forwards to what the program gave it (`UserList.pop`: self.data.pop) as a
    # descriptor's function, written by the program's own code (round 56); the program's own functions are kept
    forwarding = (
        "import collections\nclass K:\n    p = property(collections.UserList.pop)\ndef f(x):\n    return 1\n"
    )
    assert verifier.run(forwarding, "1") == _hook_refused("p", "property")
    # the standard library's descriptors that call what they hold: functions kept (a breakage corpus program
    # caches a method with lru_cache), a partial refused, read from the C object for lru_cache
    kept = (
        "import functools\nclass K:\n    @functools.lru_cache(maxsize=None)\n    def g(self, n):\n"
        "        return n * 2\n    @functools.cached_property\n    def c(self):\n        return 5\n"
        "    def add(self, a, b):\n        return a + b\n    h = functools.partialmethod(add, 1)\n"
        "def f(x):\n    return [K().g(3), K().c, K().h(2)]\n"
    )
    assert verifier.run(kept, "1") == Execution("ok", "[6, 5, 3]", "")
    for holder, kind in (("functools.lru_cache", "_lru_cache_wrapper"), ("functools.cached_property", "cached_property"),
                         ("functools.partialmethod", "partialmethod")):  # fmt: skip
        program = (
            f"import functools\nclass K:\n    g = {holder}(functools.partial(len))\ndef f(x):\n    return 1\n"
        )
        assert verifier.run(program, "1") == _hook_refused("g", kind), holder
    # a class the program's own __new__ makes when copy calls it: the program's code, not a metaclass's __new__ of
    # the standard library's skipped on the way down to copyreg (this change's own review)
    in_new = (
        "import collections, copy\nT = type(int)\nR = []\nS = [0]\nclass Maker:\n    def _"
        + "_new__(cls, *a):\n"
        "        S[0] += 1\n        if S[0] == 2:\n"
        "            R.append(T('K', (), {'p': property(collections.UserList.pop)}))\n"
        "        return super()._" + "_new__(cls)\ndef f(x):\n    copy.copy(Maker())\n    return len(R)\n"
    )
    assert verifier.run(in_new, "1") == _hook_refused("p", "property")
    # round 57: a descriptor of a standard-library function stored by the standard library for the program
    # (calendar's setter writes `_firstweekday` into what it is given), and annotations that are no dict
    # (typing calls their keys(), a partial kept as plain data)
    stored_for = (
        "import calendar, collections\nclass P:\n    pass\ndef f(x):\n"
        "    calendar.Calendar.setfirstweekday(P, classmethod(property(collections.UserList.pop)))\n    return 1\n"
    )
    assert verifier.run(stored_for, "1") == _hook_refused("_firstweekday", "classmethod")
    annotations = "T = type(int)\ndef f(x):\n    T('K', (), {'_' + '_annotations__': [1]})\n    return 1\n"
    assert verifier.run(annotations, "1") == Execution(
        "forbidden", None, "the program made a class holding the name '__annotations__' as a 'list' (at run time "
        "or through the standard library)",
    )  # fmt: skip
    # round 58: an annotation key of the program's (typing calls its startswith()), and a class the program's
    # map(type(...)) makes from a frame of the standard library's (collections.Counter consuming it), which had
    # turned the rule on the program's own functions off
    key = "T = type(int)\nclass Key:\n    pass\ndef f(x):\n    T('K', (), {'_' + '_annotations__': {Key(): 1}})\n    return 1\n"
    assert verifier.run(key, "1") == Execution(
        "forbidden", None, "the program made a class holding the name '__annotations__' with a key of the class "
        "'Key' (at run time or through the standard library)",
    )  # fmt: skip
    counter = (
        "import collections\nT = type(int)\ndef f(x):\n"
        "    collections.Counter(map(T, ['K'], [()], [{'p': property(collections.UserList.pop)}]))\n    return 1\n"
    )
    assert verifier.run(counter, "1") == _hook_refused("p", "property")
    # round 59: the same consumed by a class factory of the standard library's iterating the program's names
    # (enum's _create_, namedtuple's list(map(str, field_names))): the factory's leniency is for its own classes
    made = "map(T, ['K'], [()], [{'p': classmethod(property(collections.UserList.pop))}])"
    for call in (f"enum.Enum('E', zip(['A'], {made}))", f"collections.namedtuple('N', map(str, {made}))"):
        program = f"import collections, enum\nT = type(int)\ndef f(x):\n    {call}\n    return 1\n"
        assert verifier.run(program, "1") == _hook_refused("p", "classmethod"), call
    legit = (
        "import collections, enum\ndef f(x):\n    N = collections.namedtuple('N', 'a b')\n"
        "    E = enum.IntEnum('E', 'A B')\n    return [N(1, 2)._asdict(), tuple(N._make('cd')), E.B + 0]\n"
    )
    assert verifier.run(legit, "1") == Execution("ok", "[{'a': 1, 'b': 2}, ('c', 'd'), 2]", "")


def test_a_class_is_a_module_s_only_when_made_by_calls_down_from_the_import():
    """``_child._made_by_calls`` white-box, in a fresh interpreter: a module imported by ``import`` makes a class
    from a call (to C, or to a Python function, whose caller CPython 3.11 leaves on the call's inline cache), and
    a partial kept as a key's ``__eq__`` is called from a lookup (the drivers of rounds 34 to 53). A C callback at
    a call (round 54's shape: ``sorted`` comparing keys) passes this check: the rule on special methods and
    descriptors is what stops it."""
    script = (
        "import functools, os, sys, tempfile\nimport _child\n"
        "seen = []\nrecord = functools.partial(lambda *a: seen.append(_child._made_by_calls()) or True)\n"
        "class Key(int):\n    _"
        + "_eq__ = record\n    _"
        + "_lt__ = record\n    def _"
        + "_hash__(self):\n        return 7\n"
        "def python_call():\n    seen.append(_child._made_by_calls())\n"
        "folder = tempfile.mkdtemp()\nsys.path.insert(0, folder)\n"
        "with open(os.path.join(folder, 'probe_module.py'), 'w') as file:\n"
        "    file.write('import builtins\\nB = builtins.PROBE\\nB.python_call()\\nB.cache.get(7)\\n"
        "B.cache[7] if 7 in B.cache else None\\nsorted([B.Key(1), B.Key(2)])\\n')\n"
        "import builtins, types\nbuiltins.PROBE = types.SimpleNamespace(python_call=python_call, Key=Key, "
        "cache={Key(7): 1})\n"
        "import probe_module\nprint(seen)\n"
    )
    # a Python function called by the module: a call; dict.get comparing the key: a call (C, at a CALL); the key
    # compared by `in` (CONTAINS_OP) and by a subscript: lookups; sorted comparing keys: a call
    assert _in_a_fresh_interpreter(script) == ["[True, True, False, False, True]"]


def test_a_module_imported_later_holding_a_program_s_object_does_not_make_its_class_standard():
    """``_child.register_standard`` white-box, in a fresh interpreter: the classes of what a newly imported
    module holds become standard, but not a class a program made (``class_made``), as one of its objects kept
    by a module from what the program planted would have made it (a red-team round's hardening; no such import
    is known). A class the standard library made, and a program's class freed and its id reused, still count."""
    script = (
        "import gc, os, tempfile, types\nimport _child\n_child.register_standard()\n"
        "class Prog:\n    pass\nclass Lib:\n    pass\nProg.__module__ = Lib.__module__ = '__program__'\n"
        "_child.class_made(Prog, True)\n_child.class_made(Lib, False)\n"
        "folder = tempfile.mkdtemp()\nsys.path.insert(0, folder)\n"
        "with open(os.path.join(folder, 'holder.py'), 'w') as file:\n"
        "    file.write('import builtins\\nkept = builtins.PLANTED\\nlib = builtins.LIB\\n')\n"
        "import builtins\nbuiltins.PLANTED, builtins.LIB = Prog(), Lib()\nimport holder\n_child.register_standard()\n"
        "print([_child._is_standard(Prog), _child._is_standard(Lib)])\n"
    )
    assert _in_a_fresh_interpreter(script) == ["[False, True]"]


def test_a_module_s_class_is_judged_by_what_it_holds_and_the_files_running_its_making():
    """``_child._made_by_a_module`` white-box, in a fresh interpreter: since round 53 the drivers of rounds 34 to
    52 no longer reach it (their classes are refused as made from a lookup), and it stays the check of classes
    a module's calls make. ``running`` puts those modules' files on the stack, as their import would."""
    script = (
        "import collections, functools, re, string, textwrap\nimport _child\n_child.register_standard()\n"
        "class Prog:\n    def pop(self, i):\n        return i\nProg.__module__ = '__program__'\n"
        "def hook(self, name):\n    return name\nclass H:\n    gh = functools.partialmethod(hook)\n"
        "def judged(namespace, bases=(object,), running=()):\n"
        "    def call():\n        return _child._made_by_a_module(type, ('K', bases, namespace))\n"
        "    for module in running:\n        scope = {'inner': call}\n"
        "        exec(compile('def outer():\\n    return inner()\\n', module.__file__, 'exec'), scope)\n"
        "        call = scope['outer']\n    return call()\n"
        "pop, u = collections.UserList.pop, '_' + '_'\n"
        "print([judged({'x': 1}), judged({u + 'getattr' + u: textwrap.dedent}, running=[textwrap]),\n"
        "       judged({u + 'init_subclass' + u: vars(string.Template)[u + 'init_subclass' + u], 'flags': re.I},\n"
        "              running=[string]),\n"
        "       judged({u + 'eq' + u: collections.UserList.__eq__}),\n"
        "       judged({u + 'getattr' + u: pop, 'data': []}, running=[collections]),\n"
        "       judged({}, bases=(type,))])\n"
        "print([judged({u + 'getattr' + u: textwrap.dedent}), judged({u + 'getattr' + u: len}),\n"
        "       judged({u + 'deepcopy' + u: dict}), judged({u + 'class' + u: property(len)}),\n"
        "       judged({u + 'getattr' + u: H.gh}, running=[functools]),\n"
        "       judged({u + 'getattr' + u: pop, 'data': Prog()}, running=[collections]),\n"
        "       judged({'mro': pop, 'data': Prog()}, bases=(type,), running=[collections]),\n"
        "       judged({u + 'getattr' + u: classmethod(property(pop)), 'data': Prog()}, running=[collections]),\n"
        "       judged({u + 'instancecheck' + u: len}, bases=(type,)), judged({u + 'slots' + u: (u + 'eq' + u,)})])\n"
    )
    accepted, refused = _in_a_fresh_interpreter(script)
    # a plain class; a hook of a module running the making (round 46); an enum member read by string.Template's
    # __init_subclass__ (round 52); a module's special method; a module's function reading a list it was given;
    # a bare metaclass (the making's caller is a module's call)
    assert accepted == "[True, True, True, True, True, True]"
    # a hook of a module not running (round 46); a C callable (round 34); a class as a hook (round 36); a class
    # lying about its __class__ (round 38); functools.partialmethod's _method holding the program's function
    # (round 51); UserList.pop reading a program object as `data`, as a hook and a metaclass's mro (round 52), and
    # inside a classmethod of a property (only one level of descriptor had been unpacked); a metaclass's C
    # __instancecheck__ (round 35); a slot named as a special method
    assert refused == "[False, False, False, False, False, False, False, False, False, False]"
