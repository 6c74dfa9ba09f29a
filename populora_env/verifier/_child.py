"""Runs one program inside a freshly forked, already isolated child and streams one verdict per call.

Loaded by the worker as a top-level module (the worker never imports the ``populora_env`` package).
Each verdict is one line written to the result pipe (``verdicts.line``: status, output and detail
separated by ``\x1f``, never JSON); the worker turns a missing line (crash, kill, time-out) into a verdict
of its own.
"""

from __future__ import annotations

import _ast
import _string
import builtins
import gc
import marshal
import opcode
import os
import sys
from _collections import _tuplegetter
from _functools import _lru_cache_wrapper as _LRU_CACHE_WRAPPER
from _weakref import ref as _weak_reference

import literals  # top-level in the worker process, see _worker.py
from rules import (
    ALLOWED_SPECIAL_METHODS,
    CHECKED_READS,
    CLASS_NAMESPACE_DUNDERS,
    FORBIDDEN_ATTRIBUTES,
    FORBIDDEN_MODULES,
    MODULE_READS,
    READABLE_DUNDERS,
    RUN_TIME_READS,
    SHADOWING_STORES,
    dunder_shaped,
    own_private,
    plain_super,
)
from sandbox import (
    current_frame,
    generic_lookup,
    lru_cached_function,
    make_immutable,
    real_mro,
    set_class_attribute,
)
from verdicts import line as _line

TYPE_CHECKING = False  # `typing` stays out of the worker (see literals.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_ALLOWED_MODULES: frozenset[str] = frozenset()


def _guarded_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    if name == "__future__" and not level and tuple(fromlist or ()) == ("annotations",):  # the pre-filter's
        return _fresh_future()  # one allowed __future__ import
    if name == "time" and not level and type(fromlist) is list and not fromlist:
        # C code's import (PyImport_Import passes an empty list, an import statement None or a tuple; no
        # program can call this function itself):
        # `date.strftime` and `timetuple` take `time` so, whose clocks refuse in guarded calls (`_guard_clocks`);
        # from a program's frame they failed where a frame of the standard library's succeeded (round 29)
        return _real_import(name, globals, locals, fromlist, level)
    if level or name.split(".")[0] not in _ALLOWED_MODULES or _forbidden_module(name, fromlist):
        raise ImportError(f"import of {name!r} is not allowed")
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__name__", None) != name:
        # the import system imports a from-list's submodules by the package's __name__: a package renamed
        # `importlib` made `from json import util` give importlib.util (a red-team review's full escape)
        raise ImportError(f"import of {name!r} is not allowed (the module was renamed)")
    module = _real_import(name, globals, locals, fromlist, level)
    if "." in name and (submodule := sys.modules.get(name)) is not None and _off_the_allowlist(submodule):
        raise ImportError(f"import of {name!r} is not allowed")
    if (
        len(sys.modules) != _GUARDED[0]
    ):  # (an import of a loaded module, `import math` in a loop: nothing new)
        _install_guards()  # for the modules this import brought (`typing`, `collections`, `enum`...)
    for item in fromlist or ():  # and whatever module a from-list hands out is an allowed one, by its name
        value = getattr(module, item, None) if type(item) is str else None
        refused = _off_the_allowlist(value) if isinstance(value, type(sys)) else None
        if refused is not None:
            raise ImportError(f"import of {refused!r} is not allowed")
    return module


def _off_the_allowlist(module: Any) -> str | None:
    """The name of ``module`` if a program may not import it (off the allowlist, a forbidden submodule, or not
    the module ``sys.modules`` holds under its name), else None."""
    found = module.__name__ if type(module.__name__) is str else "?"
    if found.split(".")[0] not in _ALLOWED_MODULES or _forbidden_module(found, ()):
        return found
    if "." in found and not _inside_its_package(module, found):
        return found
    return None if sys.modules.get(found) is module else found


def _inside_its_package(module: Any, name: str) -> bool:
    """Whether the submodule ``name`` was loaded from its own file in its package's folder (``a/b.py`` or
    ``a/b/__init__.py`` for ``a.b``; the folder's own path differs between the worker and a child, which opens
    the standard library through a descriptor) or from no file: with a package's ``__path__`` changed,
    ``import json.os`` loaded ``os.py`` as ``json.os`` (red-team round 39, which wrote ``json.__path__`` through a
    copy that is refused now)."""
    own_file = getattr(module, "__file__", None)
    if type(own_file) is not str:
        return own_file is None
    tail = "/" + name.replace(".", "/")
    return own_file.endswith((tail + ".py", tail + "/__init__.py"))


_INSTALLED: list[Any] = []  # the guards' replacement functions, known by identity (a program can set
# attributes on functions: an attribute marking a function as a guard's was set on a program's own)


def _installed(function: Any) -> bool:
    """Whether ``function`` is one of the guards' replacements (``_INSTALLED``)."""
    return any(function is mine for mine in _INSTALLED)


def _forbidden_module(name: str, fromlist: Any) -> bool:
    """Whether ``import name`` or ``from name import *fromlist`` loads a forbidden submodule (``json.tool``)."""
    parts = name.split(".")
    names = {".".join(parts[: i + 1]) for i in range(len(parts))}
    names.update(f"{name}.{item}" for item in fromlist or () if type(item) is str)
    return not names.isdisjoint(FORBIDDEN_MODULES)


def _refuse_at_run_time(event: str, what: str) -> None:
    """Raises the audit event ``event``: in a guarded call the hook records it (the verdict is ``forbidden``)
    and raises; in an unguarded one (``language_guards=False``, and the worker itself) nothing happens and
    the guarded operation goes on as the standard library would."""
    sys.audit(event, what)


def _describe_name(name: Any) -> str:
    """A name for a verdict detail, without running a program's ``__repr__``."""
    return repr(name)[:60] if type(name) is str else f"a {type(name).__name__}"


# What ``copy`` may not rebuild an object into: a ``__reduce_ex__`` (or a ``copy.dispatch_table`` entry, or an
# enum member's) returning ``(lambda: some_module, (), state)`` made copy set the attributes ``state`` names on
# that module (``dataclasses.exec``: a full escape, found by red-team reviews). Copying a module, class or
# function never goes through a reconstruction otherwise (copy returns them as they are, or refuses).
_NOT_REBUILT = (type(sys), type, type(_guarded_import), type(len), type(list[int]))
# (``types.GenericAlias`` too: it relays ``__dict__`` to its origin, a module's globals for an alias of one)
# The built-ins ``copy`` may not rebuild with: a bound method reduces to ``(getattr, (obj, its __name__))``,
# and a program's callable named ``__globals__`` bound to any function made ``copy.copy`` read that
# function's globals (a red-team review's full escape).
_NOT_CALLED = tuple(
    getattr(builtins, name)
    for name in ("getattr", "setattr", "delattr", "eval", "exec", "compile", "__import__", "vars", "globals",
                 "locals", "open", "breakpoint", "input")
)  # fmt: skip
# State keys ``copy`` may not set: dunders, and the names whose module globals shadow the built-ins the
# standard library calls with privileged arguments (``dataclasses.exec``), set through an object that
# forwards attribute writes (typing's alias class) when the module itself was refused.
_NOT_SET = SHADOWING_STORES


def _is_typing(obj: Any) -> bool:
    """Whether ``obj`` is one of typing's objects (an alias, a special form...)."""
    alias = getattr(sys.modules.get("typing"), "_BaseGenericAlias", ())
    return type(obj).__module__ == "typing" or isinstance(obj, alias)


# ``type``'s own descriptors of a class's MRO and namespace: ``cls.__mro__`` and ``vars(cls)`` go through the
# metaclass, whose property of that name (a run-time metaclass's) showed a check another MRO than the one
# the interpreter looks methods up in (a red-team review)
_REAL_MRO = real_mro
_REAL_NAMESPACE = type.__dict__["__dict__"].__get__


def _program_hook(cls: Any, name: str) -> bool:
    """Whether a class of the program's in ``cls``'s MRO defines the method ``name``, or a ``__getattr__`` or
    ``__getattribute__`` that could hand one out (only a class made at run time can: a class statement
    defines no special method off the allowlist)."""
    names = (name, "__getattr__", "__getattribute__")
    # trusted: the classes modules hold, not those merely recorded as made while a module was imported (a
    # program made one during an import with `__deepcopy__ = typing.cast`, which handed it copy's memo: red-team
    # round 37)
    return any(
        not _REAL_NAMESPACE(k).keys().isdisjoint(names) for k in _REAL_MRO(cls) if not _held_by_a_module(k)
    )


def _state_keys(part: Any) -> Any:
    """The names a part of a reconstruction's state sets: a dict's keys, or the first items of a tuple of pairs,
    which copy's ``__dict__.update`` takes as well (red-team round 38)."""
    if type(part) is dict:
        return part
    if type(part) is tuple and part and all(type(pair) is tuple and len(pair) == 2 for pair in part):
        return [pair[0] for pair in part]
    return ()


def _copied_as_own(obj: Any) -> bool:
    """Whether ``copy`` rebuilds ``obj`` under the rules for a program's object (``_reconstruct``'s guard): one the
    program may write (``_is_own``), or an instance of a class no module holds (made while a module was
    imported: a program made one with ``__reduce_ex__ = typing.assert_type``, whose reduction it chose, and copy
    wrote private attributes into ``calendar.c``, red-team round 37)."""
    kind = type(obj)  # (never isinstance: it reads an object's own `__class__`, a property in round 38)
    rebuilt_as_such = any(cls is type or cls is _MODULE for cls in _REAL_MRO(kind))  # (classes, modules)
    return _is_own(obj) or not (rebuilt_as_such or _held_by_a_module(kind))


def _instance_hook(obj: Any, name: str) -> bool:
    """Whether ``obj``'s own ``__dict__`` holds ``name`` or a key that is not an exact ``str`` (``copy.deepcopy``
    looks its hook up on the instance: a ``cached_property`` whose ``attrname`` was set to ``__deepcopy__``
    planted one there, round 25; a ``str`` subclass key's ``__eq__`` answered this check and copy's lookup
    differently, round 26). Compared as exact strings: no program code runs."""
    if _a_class(obj):  # (copied as they are: copy never looks a hook up on a class)
        return False
    try:
        own = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return False
    if type(own) is not dict:
        return True
    return any(type(key) is not str or key == name for key in list(dict.keys(own)))


def _plain_getattr(func: Any, args: Any) -> bool:
    """Whether a reconstruction is ``getattr(obj, name)`` with a name a program's source may read: what a
    method reduces to (``str.lower``, a bound method of the program's), unlike the callable named
    ``__globals__`` of a red-team review's escape."""
    return (
        func is getattr
        and type(args) is tuple
        and len(args) == 2
        and type(args[1]) is str
        and args[1][:1] != "_"
        and args[1] not in FORBIDDEN_ATTRIBUTES
        and args[1] != "samples"  # statistics.NormalDist.samples: OS-seeded random draws (red-team round 19)
    )


def install_copy_guard() -> None:
    """Imports ``copy`` and wraps it (the worker, before its first fork): ``collections.UserDict.copy``
    imports ``copy`` itself, past ``_guarded_import``, so a child could get it unwrapped (a red-team
    review's finding); the preloaded, wrapped ``copy`` is the one every later import finds."""
    _real_import("copy")
    _install_guards()


def _install_guards() -> None:
    """Wraps what the loaded standard modules need wrapped (each guard once per process, a no-op for a module
    not loaded yet) and records their classes as standard: the worker before its first fork, the guarded
    import after each import that loaded modules (a walk of every module: 7 µs per `import math` in a
    function called 300 000 times made a program time out, a review's finding)."""
    _guard_copy()
    _guard_typing()
    _guard_collections()
    _guard_enum()
    _guard_functools()
    _guard_clocks()
    _guard_abc()
    register_standard()
    _GUARDED[0] = len(sys.modules)


_GUARDED = [0]  # how many modules sys.modules held when the guards were last installed


def _done_by_an_import() -> bool:
    """Whether the guard running this (``ABCMeta.register``, a module's attribute write) is called by a module's
    own code while it is imported: its module-level code (``numbers`` registers ``complex``) or the import system
    (a C module's initialisation: ``_decimal`` registers its type, ``math`` sets its functions; a package's
    submodule set on it), not any code below an import's frames: a program's C callables, run from ``re``'s
    pattern cache while ``encodings.idna`` was imported, registered the module type (red-team round 40)."""
    caller = _callers_frame()
    if caller is None or _who_makes_the_class() != "import":
        return False
    code = caller.f_code
    return code.co_filename in _IMPORT_FILES or (
        code.co_name == "<module>" and code.co_filename not in _PROGRAM_FILES
    )


def _guard_abc() -> None:
    """Replaces ``abc.ABCMeta.register`` (once per process) with one that refuses, in a guarded call (event
    ``populora.abc_register``, recorded), to register a class of the standard library's as a virtual subclass:
    ``issubclass`` then says yes for it wherever the ABC is asked, and a program's ``UserDict`` subclass with
    the module type registered passed the copy guard's test with a ``__new__`` returning a module (red-team
    round 39). A program registers its own classes as before, and a module being imported its own (the import
    system's frames met before any program frame, as for ``check_class``)."""
    abc = sys.modules.get("abc")
    meta: Any = getattr(abc, "ABCMeta", None)
    register = vars(meta).get("register") if isinstance(meta, type) else None
    if register is None or _installed(register):
        return

    def guarded_register(cls: Any, subclass: Any) -> Any:
        if (not _a_class(subclass) or not _is_own(subclass)) and not _done_by_an_import():
            _refuse_at_run_time("populora.abc_register", getattr(subclass, "__name__", "?"))
        return register(cls, subclass)

    guarded_register.__name__ = guarded_register.__qualname__ = "register"
    guarded_register.__doc__ = register.__doc__
    _INSTALLED.append(guarded_register)
    meta.register = guarded_register


def install_module_guard() -> None:
    """Routes every write and delete of a module's attribute (``ModuleType.__setattr__``, ``__delattr__``; the
    worker, before its first fork) through a check that refuses, in a guarded call (event
    ``populora.module_write``, recorded), any not made by a module's import (``_done_by_an_import``) or by the
    child's own guards. A program's own writes were refused already (``_owned``), but public unbound methods of
    standard classes write their attribute names into whatever object they are handed:
    ``calendar.Calendar.setfirstweekday(json, 5)`` set ``json._firstweekday``, ``abc.abstractmethod(json)``
    ``json.__isabstractmethod__`` (red-team round 40), and a module's globals are what the standard library
    runs on (``copy.dispatch_table``, ``json.__path__``: round 39). One rule for every writer instead of a list
    of such methods. ``object.__setattr__(module, ...)`` still writes past it (CPython lets a class's slot of
    Python be skipped): no allowed module calls it with an object it was handed, and a program cannot read it
    (a special method)."""
    module = type(sys)
    if _installed(vars(module).get("__setattr__")):
        return
    write, delete = object.__setattr__, object.__delattr__

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if _guard_armed() and not _done_by_an_import() and not _done_by_the_child():
            _refuse_at_run_time("populora.module_write", f"{_describe_name(name)} of {_what(self)}")
        write(self, name, value)

    def __delattr__(self: Any, name: str) -> None:
        if _guard_armed() and not _done_by_an_import() and not _done_by_the_child():
            _refuse_at_run_time("populora.module_write", f"{_describe_name(name)} of {_what(self)}")
        delete(self, name)

    for name, guard in (("__setattr__", __setattr__), ("__delattr__", __delattr__)):
        _INSTALLED.append(guard)
        set_class_attribute(module, name, guard)


def check_class_store(cls: Any, name: str, value: Any) -> None:
    """The check of every write of a class's attribute (``sandbox.route_class_stores``): in a guarded call, a
    descriptor that does not call only the program's own functions (``_runs_in_a_frame``, ``_parts_of``) is
    refused (event ``populora.class_hook``, recorded) as a value of any class but the standard library's, by
    the rule ``check_class`` applies to the classes a program's own code writes, whoever stores it
    (``calendar.Calendar.setfirstweekday`` stored one for the program: red-team round 57). Stored after the class was made, ``P._is_runtime_protocol =
    classmethod(property(partial))`` served round 54's driver as well as the class statement did. (No program
    stores a special method: the pre-filter refuses their names as attributes.)"""
    kind = type(value)
    # a plain function is what total_ordering stores; a value that is no descriptor (an import's enum members,
    # ints, dicts) costs one lookup per class; whoever stores a descriptor, its functions are the program's
    # (`calendar.Calendar.setfirstweekday(P, classmethod(property(UserList.pop)))` stored one from calendar's
    # frame, red-team round 57)
    if (
        kind is not _FUNCTION
        and _a_descriptor_kind(kind)
        and _guard_armed()
        and not _is_standard(cls)
        and not _runs_in_a_frame(value, False, True)
    ):
        _refuse_at_run_time(
            "populora.class_hook",
            f"{_describe_name(name)} as a {_describe_name(type(value).__name__)}",
        )


def _done_by_the_child() -> bool:
    """Whether the guard running this is called by this module's own code (``_guard_clocks`` replacing
    ``time``'s clocks as a guarded call imports it): its caller's globals are this module's."""
    caller = _callers_frame()
    return caller is not None and caller.f_globals is globals()


def _guard_copy() -> None:
    """Wraps ``copy._reconstruct`` (once per process) so that the audit hook refuses (events
    ``populora.copy_*``: recorded, the verdict ``forbidden``) a rebuild into a module, class, function or
    typing object, by calling a door built-in (``getattr``...), with a state that names a dunder or
    ``exec``/``eval``/``compile`` or is a dict or tuple subclass, or with a memo that is not a plain dict;
    and ``copy.deepcopy`` refuses a memo it did not make itself."""
    copy = sys.modules.get("copy")
    if copy is None or _installed(copy._reconstruct):
        return
    reconstruct = copy._reconstruct

    def guarded(x: Any, memo: Any, func: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
        # a typing object reduces to a lookup of its name in typing's globals, which a program can set
        # (`name='__builtins__'`: a red-team review's full escape); the copy of one was refused anyway
        if _is_typing(x) or type(x) is _Augmented:  # (the proxy answers any name: a second line, round 41)
            _refuse_at_run_time("populora.copy_into", type(x).__name__)
        # a program's memo mapping: its get() could swap the state after the checks below
        if memo is not None and type(memo) is not dict:
            _refuse_at_run_time("populora.copy_memo", type(memo).__name__)
        if any(func is builtin for builtin in _NOT_CALLED) and not _plain_getattr(func, args):
            _refuse_at_run_time("populora.copy_func", getattr(func, "__name__", "?"))
        state = rest[0] if rest else kwargs.get("state")
        parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
        for part in (state, *parts):  # a subclass of dict or tuple is read by copy as one (unchecked keys)
            if isinstance(part, dict | tuple) and type(part) not in (dict, tuple):
                _refuse_at_run_time("populora.copy_state", f"a {type(part).__name__}")
        for part in parts:
            for key in _state_keys(part):
                if type(key) is not str or key in _NOT_SET or dunder_shaped(key):
                    _refuse_at_run_time("populora.copy_state", _describe_name(key))
        # the slot state of a program's object: copy read each attribute its class's `__slotnames__` names, and
        # a class made at run time named private ones of the standard library's there (`EnumType._convert_`,
        # red-team round 23; such classes are refused where they are made now, this is the second line)
        own = _copied_as_own(x)
        slots = parts[1] if len(parts) == 2 and type(parts[1]) is dict and own else {}
        for key in slots:
            if type(key) is str and (key[:1] == "_" or key in FORBIDDEN_ATTRIBUTES):
                _refuse_at_run_time("populora.copy_state", _describe_name(key))

        def build(*given: Any) -> Any:
            if func is getattr and len(given) == 2 and type(given[1]) is str and given[1] in CHECKED_READS:
                # a read the program's own code makes only through the check (a bound method named `format`
                # or `obj` reduces to it: copy read str's raw format and AttributeError.obj, a red-team
                # review's full escape)
                made = _checked_read(*given)
            else:
                made = func(*given)
            # typing's objects too: its alias class relays the attributes set on it to its origin (a class
            # of the standard library, for a red-team review)
            if isinstance(made, _NOT_REBUILT) or _is_typing(made):
                _refuse_at_run_time("populora.copy_into", type(made).__name__)
            # A program's object reduces to whatever its (run-time) class says: a callable that returns an
            # object that exists already, which copy then writes the state into (calendar.c, an enum
            # member): a copy of a program's object must be the program's own too
            if own and not _is_own(made):
                _refuse_at_run_time("populora.copy_into", type(made).__name__)
            return made

        return reconstruct(x, memo, build, args, *rest, **kwargs)

    _INSTALLED.append(guarded)
    copy._reconstruct = guarded  # type: ignore[attr-defined]

    deepcopy = copy.deepcopy
    made: list[Any] = []  # the memos of the deep copies in progress, made here

    def guarded_deepcopy(x: Any, memo: Any = None, _nil: Any = []) -> Any:  # noqa: B006 (copy's signature)
        # A memo of the program's own: deepcopy keeps every original it copies there (and the live __dict__
        # of each instance), so a program read and wrote private attributes through it (a red-team review).
        # copy's own recursion passes the memo made below.
        if memo is None:
            _refuse_a_deepcopy_hook(x)
            memo = {}
            made.append(memo)
            try:
                return deepcopy(x, memo, _nil)
            finally:
                made.pop()
        if not any(memo is mine for mine in made):
            _refuse_at_run_time("populora.copy_memo", type(memo).__name__)
        _refuse_a_deepcopy_hook(x)
        return deepcopy(x, memo, _nil)

    copy.deepcopy = guarded_deepcopy  # type: ignore[attr-defined]
    # copy's recursion into lists, tuples and dicts calls the deepcopy its functions were defined with
    for name in ("_deepcopy_list", "_deepcopy_tuple", "_deepcopy_dict"):
        function = getattr(copy, name, None)
        if function is not None and function.__defaults__ == (deepcopy,):
            function.__defaults__ = (guarded_deepcopy,)
    # and _reconstruct deep-copies the arguments and state of what it rebuilds with its keyword default
    # (round 26: those copies went past every check of guarded_deepcopy)
    if (reconstruct.__kwdefaults__ or {}).get("deepcopy") is deepcopy:
        reconstruct.__kwdefaults__ = {**reconstruct.__kwdefaults__, "deepcopy": guarded_deepcopy}


def _refuse_a_deepcopy_hook(x: Any) -> None:
    """Refuses (event ``populora.copy_hook``) a deep copy of ``x`` whose ``__deepcopy__`` would be handed copy's
    own memo, the originals in it: one of the program's (a run-time class's, or planted in the instance's dict),
    or the proxy of an augmented assignment, which answers any name with what the program chooses (round 41)."""
    if _program_hook(type(x), "__deepcopy__") or _instance_hook(x, "__deepcopy__") or type(x) is _Augmented:
        _refuse_at_run_time("populora.copy_hook", type(x).__name__)


def _guard_collections() -> None:
    """Replaces ``collections.UserDict.__copy__`` and ``UserList.__copy__`` (once per process) with versions
    that make the copy with ``type(self)`` and refuse (event ``populora.copy_into``, recorded) a ``__new__``
    that gives anything but a new instance of it. The originals call ``self.__class__.__new__`` and then
    write into the ``__dict__`` of what it returns: a run-time class whose ``__class__`` and ``__new__``
    returned the module ``json`` had its attributes written into json's globals (``__path__`` included: a
    red-team review's full escape)."""
    collections = sys.modules.get("collections")
    if collections is None or _installed(vars(collections.UserDict).get("__copy__")):
        return
    for cls, copy_data in (
        (collections.UserDict, lambda data: data.copy()),
        (collections.UserList, lambda data: data[:]),
    ):

        def __copy__(self: Any, _copy_data: Any = copy_data) -> Any:
            kind: Any = type(self)
            inst = kind.__new__(kind)
            # a real instance of the class, by its type's MRO: issubclass() takes what an ABC registered
            # (`K.register(type(json))`, then a __new__ returning json: copy wrote into its globals, red-team
            # round 39, a full escape)
            made: Any = type(inst)
            if (
                not any(cls is kind for cls in _REAL_MRO(made))
                or isinstance(inst, _NOT_REBUILT)
                or inst is self
            ):
                _refuse_at_run_time("populora.copy_into", made.__name__)
            # the real instance dicts: a class that relays `__dict__` (a GenericAlias mixed in) gave a
            # module's globals here (red-team round 30, a full escape)
            own, theirs = object.__getattribute__(self, "__dict__"), object.__getattribute__(inst, "__dict__")
            theirs.update(own)
            theirs["data"] = _copy_data(own["data"])
            return inst

        _INSTALLED.append(__copy__)
        cls.__copy__ = __copy__

    # namedtuple names the module of its class after its caller's globals, read with sys._getframe, which is
    # refused in guarded calls: a program's class came out as collections' (a breakage review); named here
    namedtuple = collections.namedtuple

    def named(typename: Any, field_names: Any, *, module: Any = None, **kwargs: Any) -> Any:
        if module is None and _called_by_the_program():
            module = "__program__"
        return namedtuple(typename, field_names, module=module, **kwargs)

    named.__name__, named.__qualname__, named.__doc__ = "namedtuple", "namedtuple", namedtuple.__doc__
    _INSTALLED.append(named)
    collections.namedtuple = named  # type: ignore[attr-defined]

    # UserString.format and format_map call str's on `self.data`, past the check of format reads (a red-team
    # review's full escape): they go through it here, the string read once
    def format(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        return _checked_read(self.data, "format")(*args, **kwargs)

    def format_map(self: Any, mapping: Any) -> Any:
        return _checked_read(self.data, "format_map")(mapping)

    collections.UserString.format = format
    collections.UserString.format_map = format_map


def _guard_functools() -> None:
    """Makes ``functools.total_ordering`` refuse a standard class (event ``populora.foreign_store``): it writes
    comparison methods into the class it is given, a write a program may not make itself (a review)."""
    functools: Any = sys.modules.get("functools")
    if functools is None or _installed(functools.total_ordering):
        return
    total_ordering = functools.total_ordering

    def guarded_total_ordering(cls: Any) -> Any:
        if isinstance(cls, type) and _is_standard(cls):
            _refuse_at_run_time(
                "populora.foreign_store", f"'<comparisons>' of the class {_describe_name(cls.__qualname__)}"
            )
        return total_ordering(cls)

    _INSTALLED.append(guarded_total_ordering)
    functools.total_ordering = guarded_total_ordering

    # cached_property writes the value it computes into the instance's __dict__ under its `attrname`, a plain
    # attribute a program can set to any name: `__deepcopy__` planted a hook copy hands its memo (round 25), and
    # a str subclass equal to it, or a name changed by the function while it ran, passed a check made first
    # (round 26): its __get__ is replaced by one that reads the name once, as an exact non-dunder str
    cached = functools.cached_property
    get = vars(cached)["__get__"]
    missing = object()

    def guarded_get(self: Any, instance: Any, owner: Any = None) -> Any:
        name = self.attrname
        if instance is None or name is None:
            return get(self, instance, owner)  # (itself, or its TypeError)
        if type(name) is not str or dunder_shaped(name):
            _refuse_at_run_time("populora.foreign_store", f"{_describe_name(name)} by a cached_property")
        try:
            cache = instance.__dict__
        except AttributeError:
            return get(self, instance, owner)  # (its TypeError: no __dict__)
        if type(cache) is not dict:
            return get(self, instance, owner)
        value = cache.get(name, missing)
        if value is missing:  # (no lock: a child runs one thread, and Python 3.12's has none)
            value = self.func(instance)
            cache[name] = value
        return value

    _INSTALLED.append(guarded_get)
    cached.__get__ = guarded_get


# The clocks a program could read through C code of the standard library: `datetime.date.today()` imports
# `time` by the `__import__` of the innermost Python frame, the real one when a frame of the standard library
# runs it (a program's `iter(D.today, 0)` consumed by `collections.Counter`), and calls `time.time()` (red-team
# round 28, a full escape: the wall clock); `datetime.now()` reads the clock in C without it.
_CLOCKS = (
    "time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "process_time",
    "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns",
)  # fmt: skip
_CLOCKS_WITHOUT = {"localtime": 0, "gmtime": 0, "ctime": 0, "asctime": 0, "strftime": 1}
"""Functions of ``time`` that read the clock when the argument at this position is missing or None."""


def _clock(name: str, real: Any, position: int | None) -> Any:
    """``real``, refusing (event ``populora.clock``, recorded in a guarded call) to read the clock: always, or
    where its time argument at ``position`` is missing or None."""

    def read(*args: Any, **kwargs: Any) -> Any:
        if position is None or len(args) <= position or args[position] is None:
            _refuse_at_run_time("populora.clock", name)
        return real(*args, **kwargs)

    read.__name__ = read.__qualname__ = name
    _INSTALLED.append(read)
    return read


def _guard_clocks() -> None:
    """Makes the clocks of ``time`` and of ``datetime``'s classes refuse in guarded calls (once per process):
    the worker imports ``time``, and unguarded calls and the worker itself read them as before."""
    time: Any = sys.modules.get("time")
    if time is not None and not _installed(time.time):
        for name in _CLOCKS:
            if hasattr(time, name):
                setattr(time, name, _clock(name, getattr(time, name), None))
        for name, position in _CLOCKS_WITHOUT.items():
            setattr(time, name, _clock(name, getattr(time, name), position))
    datetime: Any = sys.modules.get("datetime")
    if datetime is not None and not _installed(vars(datetime.datetime)["now"]):
        for cls, name in (
            (datetime.datetime, "now"),
            (datetime.datetime, "utcnow"),
            (datetime.date, "today"),
        ):
            refusing: Any = classmethod(_clock_method(f"{cls.__name__}.{name}", vars(cls)[name]))
            _INSTALLED.append(refusing)
            set_class_attribute(cls, name, refusing)


def _clock_method(name: str, original: Any) -> Any:
    """A class method of ``datetime``'s that refuses like ``_clock``, then runs ``original`` (its C class
    method) for the class it is called on (a subclass's ``today()`` gives the subclass)."""

    def method(klass: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse_at_run_time("populora.clock", name)
        return original.__get__(None, klass)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name.rpartition(".")[2]
    return method


def _not_the_program_s(obj: Any) -> bool:
    """Whether ``obj`` is a module, a standard class or function, or an instance of a standard class."""
    kind = type(obj)
    if kind is type(sys):
        return True
    if issubclass(kind, type):
        return _is_standard(obj)
    if kind is type(_guarded_import):  # a function: the program's are defined in its module
        return obj.__module__ != "__program__"
    return _is_standard(kind) and kind is not type(len)


def _own_objects_only(decorator: Any) -> Any:
    """``decorator``, refusing (event ``populora.foreign_store``) anything but the program's own objects."""

    def guarded(obj: Any) -> Any:
        if _not_the_program_s(obj):
            _refuse_at_run_time(
                "populora.foreign_store", f"set by typing.{decorator.__name__} on a {type(obj).__name__}"
            )
        return decorator(obj)

    return guarded


def _guard_enum() -> None:
    """Makes the ``__new__`` an enum class makes its members with (once per process: ``EnumType._find_new_``
    wrapped), whoever defined it (the class, a mixin of the program's), refuse (event
    ``populora.enum_member``, recorded) to give anything but a new instance of the class: the enum machinery
    sets ``_value_``, ``_name_`` and ``__objclass__`` on what it returns and calls its ``__init__`` with the
    member's values, so a ``__new__`` returning the module ``json`` had its names written and its ``__name__``
    reset, which turned ``from json import util`` into ``importlib.util`` (red-team reviews, a full escape)."""
    enum: Any = sys.modules.get("enum")
    if enum is None or _installed(vars(enum.EnumType)["_find_new_"]):
        return
    find_new = vars(enum.EnumType)["_find_new_"].__func__

    def guarded_find_new(mcls: Any, classdict: Any, member_type: Any, first_enum: Any) -> Any:
        new, save_new, use_args = find_new(mcls, classdict, member_type, first_enum)
        # anything but a built-in (object.__new__, int.__new__): a staticmethod, a partial or a callable
        # object of the program's passed unwrapped when only plain functions were (red-team round 21)
        if type(new) is not type(len):
            make = new

            def new(enum_class: Any, *args: Any, **kw: Any) -> Any:
                made = make(enum_class, *args, **kw)
                if not issubclass(type(made), enum_class):
                    _refuse_at_run_time("populora.enum_member", type(made).__name__)
                return made

        return new, save_new, use_args

    wrapper = classmethod(guarded_find_new)
    _INSTALLED.append(wrapper)
    enum.EnumType._find_new_ = wrapper

    # `_convert_` makes an enum of the globals of any module of sys.modules, named by a string (`sys`, the real
    # `builtins`), and can write the enum into them: a bound one reached a program in red-team round 23
    convert = vars(enum.EnumType)["_convert_"]

    def refused_convert(cls: Any, name: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse_at_run_time("populora.enum_convert", _describe_name(module))
        return convert(cls, name, module, *args, **kwargs)

    _INSTALLED.append(refused_convert)
    enum.EnumType._convert_ = refused_convert

    # EnumType compares the `__repr__`, `__str__`, `__format__` and `__reduce_ex__` a new enum class finds with
    # object's and its data type's (`found in (data_type_method, object_method)`): a program object there, with
    # an `__eq__` of its own, was handed `object.__reduce_ex__`, which reads any attribute a class lists in
    # `__slotnames__` (red-team round 21, a link of a full escape); such an object must be a function
    make_class = vars(enum.EnumType)["__new__"]
    compared = ("__repr__", "__str__", "__format__", "__reduce_ex__")
    plain = (type(_guarded_import), type(len), type(str.lower), type(object.__init__))

    def compared_safely(value: Any) -> bool:  # what the comparison runs no program code for
        if type(value) in (staticmethod, classmethod):  # (exact: a subclass's __get__ gives anything)
            value = value.__func__
        return type(value) in plain

    def guarded_new(metacls: Any, cls: Any, bases: Any, classdict: Any, **kwds: Any) -> Any:
        for base in bases if type(bases) is tuple else ():
            for k in _REAL_MRO(base) if isinstance(base, type) else ():
                namespace = _REAL_NAMESPACE(k)
                for name in compared:
                    if name in namespace and not compared_safely(namespace[name]):
                        _refuse_at_run_time(
                            "populora.enum_compared", f"a {type(namespace[name]).__name__} as {name}"
                        )
        return make_class(metacls, cls, bases, classdict, **kwds)

    enum.EnumType.__new__ = guarded_new


def _guard_typing() -> None:
    """Makes typing's alias class (``typing.List[int]``'s) refuse to forward attribute reads and writes to an
    origin that is not a class, a special form or an alias (a module, a function, an exception: event
    ``populora.alias_origin``, recorded): it relays every name
    without double underscores to ``__origin__``, so ``type(typing.List[int])(dataclasses, (int,))`` was a
    proxy of the module, and a write through it (by ``copy``) shadowed ``dataclasses.exec`` (a red-team
    review's full escape). Every alias the standard library makes has a class or a special form there."""
    typing: Any = sys.modules.get("typing")
    alias = getattr(typing, "_BaseGenericAlias", None)
    if alias is None or _installed(alias.__getattr__):
        return
    relay_set, call = alias.__setattr__, alias.__call__
    # the names an alias keeps for itself (the set in its __setattr__, read from the running Python's code)
    own = next((c for c in relay_set.__code__.co_consts if isinstance(c, frozenset)), frozenset())
    # the alias's own instance dict, by the descriptor of typing's class: a subclass's `__dict__` property
    # showed the check another dict than the one typing relays from (red-team round 20)
    namespace = vars(alias)["__dict__"].__get__

    origins = (type, typing._SpecialForm, alias)
    generic = type(list[int])
    generic_origin = vars(generic)["__origin__"].__get__  # (the C member: a subclass cannot replace it)

    def checked_origin(self: Any) -> Any:
        # typing's own classes only: a run-time subclass (its mixin's `__init_subclass__` ran instead of
        # typing's refusal) relayed from an origin of its choosing (red-team round 21)
        if not _is_standard(type(self)):
            _refuse_at_run_time("populora.typing_subclass", _describe_name(type(self).__qualname__))
        # what the standard library's aliases have there: a class, a special form (Union), an alias
        # (Annotated's), a `list[int]` of a class; an exception relayed the object a failed lookup kept (`obj`:
        # a red-team review), and a `list[int]`-style alias of a module relayed its private names
        # (`collections._sys`, round 21)
        origin = found = namespace(self).get("__origin__")
        while isinstance(found, generic):
            found = generic_origin(found)
        if not isinstance(found, origins):
            _refuse_at_run_time("populora.alias_origin", type(found).__name__)
        return origin

    def get(self: Any, attr: str) -> Any:
        # typing's relay (no dunder names), from the checked origin itself: typing's own code read
        # `self.__origin__` again, which a subclass could make another object
        if "__origin__" in namespace(self) and type(attr) is str and not dunder_shaped(attr):
            return getattr(checked_origin(self), attr)
        raise AttributeError(attr)

    def instantiate(self: Any, *args: Any, **kwargs: Any) -> Any:
        # typing sets `__orig_class__` on whatever its origin returns: with a function there, on a module or
        # a standard class (red-team round 20); only the program's own objects get it here (no program can
        # read a dunder; no allowed module reads that one)
        if not namespace(self).get("_inst", False):
            return call(self, *args, **kwargs)  # typing's TypeError: this alias cannot be instantiated
        result = checked_origin(self)(*args, **kwargs)
        if _is_own(result):
            try:
                result.__orig_class__ = self
            except AttributeError:
                pass
        return result

    def set_(self: Any, attr: str, value: Any) -> None:
        if not _is_standard(type(self)):
            _refuse_at_run_time("populora.typing_subclass", _describe_name(type(self).__qualname__))
        if not (type(attr) is str and (dunder_shaped(attr) or attr in own)):
            # a write relayed to the origin: nothing in the standard library sets attributes through an
            # alias, and a program's alias of a standard class (copy setting a run-time name) wrote any name
            # on that class (a red-team review's finding)
            _refuse_at_run_time("populora.alias_write", _describe_name(attr))
        relay_set(self, attr, value)

    _INSTALLED.append(get)
    alias.__getattr__, alias.__setattr__, alias.__call__ = get, set_, instantiate

    # typing's classes are subclassed with `_root=True`, by typing's own module code: a program's class made
    # at run time with `**{'_root': True}` (no keyword the pre-filter sees) subclassed the alias class and
    # gave it a `__dict__` of its choosing (red-team round 20)
    final = typing._Final
    subclass_hook = vars(final)["__init_subclass__"].__func__

    def init_subclass(cls: Any, /, *args: Any, **kwds: Any) -> None:
        if "_root" in kwds:
            _refuse_at_run_time("populora.typing_subclass", _describe_name(cls.__qualname__))
        subclass_hook(cls, *args, **kwds)

    final.__init_subclass__ = classmethod(init_subclass)

    # typing's decorators that set a flag on what they are given (`__final__`, `__no_type_check__`,
    # `_is_runtime_protocol`): only on the program's own (a review: on the module json, numbers.Number)
    for decorator in ("final", "no_type_check", "runtime_checkable"):
        original = getattr(typing, decorator, None)
        if original is not None:
            setattr(typing, decorator, _own_objects_only(original))
    # and `dataclass_transform(**kwargs)`'s decorator sets `__dataclass_transform__` (red-team round 24)
    transform = getattr(typing, "dataclass_transform", None)
    if transform is not None:

        def dataclass_transform(**kwargs: Any) -> Any:
            decorator = transform(**kwargs)
            decorator.__name__ = "dataclass_transform"
            return _own_objects_only(decorator)

        typing.dataclass_transform = dataclass_transform

    # NamedTupleMeta makes its class with namedtuple, from a namespace of its own, then sets every name of the
    # namespace it was given on it: called by a program with a namespace of any names (and bases that only
    # pretend to hold NamedTuple), past the check of the classes programs make (red-team round 24)
    meta = typing.NamedTupleMeta
    make_named = vars(meta)["__new__"]

    def named_tuple_new(cls: Any, typename: Any, bases: Any, ns: Any) -> Any:
        if type(bases) is not tuple or type(ns) is not dict:
            _refuse_at_run_time("populora.class_namespace", f"a {type(bases).__name__} of bases")
        check_class(cls, (typename, bases, ns))
        return make_named(cls, typename, bases, ns)

    _INSTALLED.append(named_tuple_new)
    meta.__new__ = named_tuple_new


def _fresh_future() -> Any:
    """A module holding a fresh copy of ``__future__.annotations``: the worker's own record (its modules use
    the directive) is never handed out, so a call that changes it changes nothing for the next call."""
    feature = _real_import("__future__").annotations
    module = type(sys)("__future__")
    module.annotations = type(feature)(feature.optional, feature.mandatory, feature.compiler_flag)  # type: ignore[attr-defined]
    return module


def _refusing(name: str) -> Any:
    """A stand-in for the built-in ``name`` that refuses to run, named as the built-in (``input`` is a name
    programs may use, ``def f(input)``: its ``__name__`` read as ``_refuse``, red-team round 20)."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("this built-in is not available to programs")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


_real_import = builtins.__import__


# What the run-time guards refuse (``_refuse_at_run_time``), as verdict details.
_RUN_TIME_REFUSALS = {
    "populora.copy_into": "the program made copy rebuild an object into a {} (copy.copy/deepcopy)",
    "populora.abc_register": "the program registered the standard library's {} as a virtual subclass of an ABC",
    "populora.module_write": "the program made the standard library write or delete the attribute {} (a module "
    "changes only as it is imported)",
    "populora.copy_state": "the program made copy set an attribute it may not set ({})",
    "populora.alias_origin": "the program made a typing alias relay attributes of a {}",
    "populora.alias_write": "the program set an attribute through a typing alias ({})",
    "populora.typing_subclass": "the program subclassed one of typing's own classes ({})",
    "populora.copy_memo": "the program gave copy a memo of its own (a {})",
    "populora.copy_hook": "a __deepcopy__ of the program's (class {}) would be handed copy's memo, the originals in it",
    "populora.copy_func": "the program made copy rebuild an object by calling the built-in {}",
    "populora.format_walk": "a format string walks to a private or forbidden name at run time ({})",
    "populora.foreign_store": "the program wrote or deleted the attribute {}, not one of its own",
    "populora.exception_object": "the program read the object a failed lookup kept in an exception ({}.obj)",
    "populora.enum_member": "an enum's __new__ of the program's gave a {}, not a new member",
    "populora.enum_compared": "the program gave an enum {}, which the enum machinery compares with object's",
    "populora.module_read": "the program read a module it may not import (.{})",
    "populora.foreign_super": "the program read super().{} of an object not its own",
    "populora.unbound_super": "the program read super().{} where super() is not bound to an instance",
    "populora.private_read": "the program read the private attribute {}, not one of its own",
    "populora.special_read": "the program read the special method {}, not one of its own",
    "populora.enum_convert": "the program made an enum of the globals of the module {} (EnumType._convert_)",
    "populora.clock": "the program read the clock ({})",
    "populora.metaclass_new": "the program made a class of a metaclass by __new__ ({})",
    "populora.metaclass": "the program made a metaclass at run time (a class deriving from {})",
    "populora.class_namespace": "the program made a class holding the name {} (at run time or through the "
    "standard library)",
    "populora.class_hook": "the program gave a class {}, not a function (a program's special methods and "
    "descriptors run in frames of its own)",
    "populora.descriptor_subclass": "the program subclassed {} (the functions its objects call could be set "
    "again after their class was checked)",
}


# Every class made in a child is checked as it is made (``sandbox.route_class_creation``, installed by the
# worker): one the program makes, by a class statement, by calling a class's metaclass (``type(K)(name,
# bases, namespace)``, ``typing.Type``, ``enum.EnumType``) or through the standard library, may hold in its
# namespace only the special methods a class statement may define and the names class statements and the
# standard library's class factories add (``CLASS_NAMESPACE_DUNDERS``), and may not be a metaclass. A class
# statement's namespace passed the pre-filter, but one made at run time held ``__slotnames__`` and
# ``__setstate__``, and a metaclass made at run time an ``mro`` leaving ``object`` out of its classes' MRO, for
# ``copy`` to read private attributes of the enum machinery (red-team round 23, a full escape). Classes the
# standard library makes at import (a module's own, or one a function of it imports for a program: the import
# system's frames are met before any of the program's) are not the program's when what they hold is the
# module's own code (``_made_by_a_module``): a program's C callables run during imports too (rounds 34, 35).
_PROGRAM_FILES = frozenset({"<program>", "<args>"})
_IMPORT_FILES = frozenset({"<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"})
_CLASS_DUNDERS = ALLOWED_SPECIAL_METHODS | CLASS_NAMESPACE_DUNDERS


def _callers_frame() -> Any:
    """The frame that called the guard whose helper runs this (``None`` at the bottom of the stack)."""
    frame = (
        current_frame()
    )  # current_frame's own, then this function's, the helper's, the guard's, its caller's
    for _ in range(4):
        frame = frame.f_back if frame is not None else None
    return frame


def _called_by_the_program() -> bool:
    """Whether the function running this is called by a program's code (its caller's frame is one)."""
    caller = _callers_frame()
    return caller is not None and caller.f_code.co_filename in _PROGRAM_FILES


def _who_makes_the_class() -> str:
    """Who makes the class being made, from the first frame on the stack that tells: ``"program"`` (one of a
    program's), ``"import"`` (the import system's: a module being imported, ``_made_by_a_module`` decides)
    or ``""`` (neither: the worker's own code, or, in a guarded call, C code running a program's callables
    from the child's own frames). The frames are read through the C API: ``sys._getframe`` is
    refused in guarded calls."""
    frame = current_frame()
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in _PROGRAM_FILES:
            return "program"
        if filename in _IMPORT_FILES:
            return "import"
        frame = frame.f_back
    return ""


_FUNCTION = type(_describe_name)
_MODULE = type(sys)


def _supplied_by_a_module(value: Any, files: frozenset[str] | None = None, depth: int = 0) -> bool:
    """Whether ``value``, a callable or descriptor in the namespace of a class made while a module is imported,
    is what a module's own code puts there: a function written in a file (a program's are
    ``<program>``/``<args>``, those compiled from strings ``<string>``), or a ``classmethod``,
    ``staticmethod`` or ``property`` of such functions (``_functions_in``; classes are judged by name:
    ``_made_by_a_module``). With ``files`` (``_files_on_the_stack``), only functions written in one of those
    files count."""
    functions = _functions_in(value)
    return functions is not None and all(
        _a_module_s_function(function, files, depth if function is value else 0) for function in functions
    )


def _a_module_s_function(function: Any, files: frozenset[str] | None, depth: int) -> bool:
    filename = function.__code__.co_filename
    return (
        type(filename) is str
        and (filename[:1] == "/" or filename[:8] == "<frozen ")
        and (files is None or filename in files)
        and _holds_what_a_module_holds(function, files, depth)
    )


def _functions_in(value: Any) -> list[Any] | None:
    """The functions ``value`` calls: itself if a function, those of its ``classmethod``, ``staticmethod`` or
    ``property``, nested ones included (a property's empty fields skipped), or ``None`` when some part is no
    function (a C callable, a partial). The one walk of those descriptors for ``_supplied_by_a_module`` and
    ``_reads_what_a_module_holds``: the second had unpacked one level only, and ``classmethod(property(f))``
    left ``f``'s names unread."""
    kind = type(value)
    if kind is _FUNCTION:
        return [value]
    if kind is classmethod or kind is staticmethod:
        return _functions_in(value.__func__)
    if kind is not property:
        return None
    found: list[Any] = []
    for part in (value.fget, value.fset, value.fdel):
        inner = [] if part is None else _functions_in(part)
        if inner is None:
            return None
        found += inner
    return found


_CONSTANTS = (str, int, float, bool, bytes, type(None))
_CONTAINERS = (tuple, list, set, frozenset, dict)


class _Plain:
    """A class with nothing in it: the instance size of a plain class's objects (``_holds_nothing``)."""


_BASICSIZE = type.__dict__["__basicsize__"].__get__


def _holds_what_a_module_holds(function: Any, files: frozenset[str] | None, depth: int) -> bool:
    """Whether what a function written in a file holds, its closure's cells and its defaults, is what a
    module's code could have given it (``_held_by_a_module_s``). A function the standard library makes at run
    time holds what it was made from: ``functools.partialmethod(c)`` read on a class gave its ``_method``,
    written in ``functools.py``, whose cell holds the partialmethod and so the program's ``c``: any program
    callable passed as a module's hook (``__getattr__``, a metaclass's ``__prepare__`` and ``mro``) of a
    class made during an import (red-team round 51)."""
    held = [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
    held += list(function.__defaults__ or ()) + list((function.__kwdefaults__ or {}).values())
    return all(_held_by_a_module_s(item, files, depth) for item in held)


def _held_by_a_module_s(item: Any, files: frozenset[str] | None, depth: int) -> bool:
    """Whether a value a module's function holds is one its module could have given it: a constant; a
    container of such values; a built-in callable; a function ``_supplied_by_a_module`` itself, bare or
    cached (``typing``'s ``_tp_cache``); a standard class; an object of a standard class that holds nothing
    (a sentinel: ``object()``, ``enum``'s ``_auto_null``). Nested four deep at most."""
    kind = type(item)
    if kind in _CONSTANTS or kind in _BUILT_IN_CALLABLES or type(len) in _REAL_MRO(kind)[1:2]:
        return True  # (the second: a C method with its defining class, `re.Pattern.match` bound)
    if depth >= 4:
        return False
    if kind in _CONTAINERS:
        values = [v for pair in dict.items(item) for v in pair] if kind is dict else list(item)
        return all(_held_by_a_module_s(value, files, depth + 1) for value in values)
    if kind is _FUNCTION:
        return _supplied_by_a_module(item, files, depth + 1)
    if kind is _LRU_CACHE_WRAPPER:  # (its `__wrapped__` is in its own dict: update_wrapper put it there)
        return _supplied_by_a_module(getattr(item, "__wrapped__", None), files, depth + 1)
    if _a_class(item):
        return _is_standard(item)
    return _holds_nothing(item)


def _holds_nothing(item: Any) -> bool:
    """Whether ``item`` is an object of a standard class with no state of its own: a plain object's size
    (a C object's fields, a ``functools.partial``'s callable, make it larger) and an empty ``__dict__``."""
    kind = type(item)
    if kind is object:
        return True
    if _BASICSIZE(kind) != _BASICSIZE(_Plain) or not _is_standard(kind):  # (type's own slot, no metaclass's)
        return False
    try:
        return object.__getattribute__(item, "__dict__") == {}  # (a standard class: no program code runs)
    except AttributeError:
        return False


def _filled(cell: Any) -> bool:
    """Whether a closure's cell holds a value (an empty one, a name not bound yet, raises on reading)."""
    try:
        cell.cell_contents  # noqa: B018  # (the read is the test)
    except ValueError:
        return False
    return True


# _child's and sandbox's files, as their code objects name them (what `_files_on_the_stack` collects)
_VERIFIER_FILES = frozenset({_describe_name.__code__.co_filename, current_frame.__code__.co_filename})


def _files_on_the_stack() -> frozenset[str]:
    """The files of the code running the class being made (``_made_by_a_module``): every frame's up to the first
    of a program's. A module's class holds, under a name the program rules refuse, functions of the module
    being imported or of the standard library code making the class for it (an ``Enum``'s from ``enum``),
    never those of a module that is not running: a program's C callables, run during an import, could
    otherwise make a class whose hooks are any function of the standard library (red-team round 46's lead)."""
    files = set()
    frame = current_frame()
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in _PROGRAM_FILES:
            break
        files.add(filename)
        frame = frame.f_back
    # the checker's own frames are always there: its guards (`UserString.format` forwarding to a program's
    # `format`) made any hook of a program's a module's (red-team round 47)
    return frozenset(files) - _VERIFIER_FILES


def _hook(value: Any) -> bool:
    """Whether ``value`` can run when its class is used: callable, or a descriptor (looked up on its class,
    so that no program code runs here)."""
    kind = type(value)
    return callable(value) or any(
        not _REAL_NAMESPACE(cls).keys().isdisjoint(("__get__", "__set__", "__delete__"))
        for cls in _REAL_MRO(kind)
    )


#: The call instructions of this interpreter's bytecode (3.10's, 3.11's, 3.12's and 3.13's names)
_CALLS = frozenset(
    opcode.opmap[name]
    for name in (
        "CALL",
        "PRECALL",
        "CALL_FUNCTION_EX",
        "CALL_KW",
        "CALL_FUNCTION",
        "CALL_FUNCTION_KW",
        "CALL_METHOD",
    )
    if name in opcode.opmap
)


def _made_by_calls() -> bool:
    """Whether every Python frame between the class being made and the import system's nearest frame (the
    verifier's own aside) is running a call: a module's code makes its classes by calls (a class statement,
    ``type(...)``, a metaclass's ``super().__new__(...)``, a C module's init run by the import system), down
    from the module's own frame. A program's callables run during an import from C where a module's code
    looks up or compares a value (a cache holding a program's key compares it with the program's ``__eq__``,
    a ``functools.partial`` over ``map(type, ...)``): in ``re``'s pattern cache (``_cache[key]`` in
    ``re._compile``; red-team rounds 34 to 52) and ``enum``'s ``_value2member_map_`` (``Enum.__new__``,
    reached by ``re.VERBOSE | re.IGNORECASE`` at the import of ``fractions``, ``string`` or ``json``: round
    53). A class made there is checked as the program's, also when a standard-library function between
    (``functools.partialmethod``'s, ``UserList.index``) calls ``type`` for it."""
    frame = current_frame()
    while frame is not None:
        code = frame.f_code
        if code.co_filename in _IMPORT_FILES:
            return True
        if code.co_filename not in _VERIFIER_FILES and not _at_a_call(frame.f_lasti, code.co_code):
            return False
        frame = frame.f_back
    return False


_CACHE = opcode.opmap.get("CACHE", -1)


def _at_a_call(at: int, instructions: bytes) -> bool:
    """Whether offset ``at`` of ``instructions`` is a call instruction or one of its inline cache entries (where
    CPython 3.11 leaves a frame that called a Python function: red-team round 54 measured it)."""
    while 0 < at < len(instructions) and instructions[at] == _CACHE:
        at -= 2
    return 0 <= at < len(instructions) and instructions[at] in _CALLS


def _made_by_a_module(metatype: Any, args: tuple[Any, ...]) -> bool:
    """Whether a class made while a module is imported (the import system's frames met before any program
    frame) is that module's: its metaclass and bases are standard classes, and under each name the program
    rules refuse (a dunder outside ``ALLOWED_SPECIAL_METHODS`` and ``CLASS_NAMESPACE_DUNDERS``) it holds
    ``None``, a list of names as ``__all__``, or a function ``_supplied_by_a_module``; a metaclass holds no
    other callable or descriptor either. A program's callables run during an import too, from C, below no
    frame of its own: a ``functools.partial`` as the ``__eq__`` of an object that ``re``'s pattern cache held
    as a key, compared when a module imported for a codec compiled its patterns, called ``type`` through
    ``map`` with the program's namespaces, and those classes (a metaclass with the program's ``__prepare__``)
    were taken for the standard library's (red-team round 34, a full escape)."""
    name, bases, namespace = args
    if type(name) is not str or type(bases) is not tuple or type(namespace) is not dict:
        return False
    if not _is_standard(metatype) or not all(
        _a_class(b) and (type(b) is type or _is_standard(b)) for b in bases
    ):
        return False
    meta = any(any(cls is type for cls in _REAL_MRO(b)) for b in bases)
    slots = dict.get(namespace, "__slots__", ())
    slots = (slots,) if type(slots) is str else list(dict.keys(slots)) if type(slots) is dict else slots
    if type(slots) not in (tuple, list) or not all(type(n) is str and n not in _HOOK_NAMES for n in slots):
        return False  # (a slot named as a special method is one whose value each instance sets)
    files = _files_on_the_stack()
    for key, value in dict.items(namespace):
        if type(key) is not str:
            return False
        if key == "__class__":  # what isinstance() reads of an instance: none of a module's classes sets it
            return False
        if len(key) > 4 and dunder_shaped(key) and key not in _CLASS_DUNDERS:
            names = key == "__all__" and type(value) in (list, tuple) and all(type(n) is str for n in value)
            # a class there is called as a hook (`__deepcopy__ = dict` copied copy's memo: red-team round 36),
            # except as `__class_getitem__ = classmethod(GenericAlias)`
            alias = (
                key == "__class_getitem__" and type(value) is classmethod and _a_held_class(value.__func__)
            )
            if not (value is None or names or alias or _supplied_by_a_module(value, files)):
                return False
            if not _reads_what_a_module_holds(value, namespace, files):
                return False
        elif key in ALLOWED_SPECIAL_METHODS and _hook(value):
            # the special methods a program may define too, but a standard class's are trusted (the copy
            # guards skip them): a module's code, a built-in one (`__hash__ = ref.__hash__`, `__call__ =
            # _idfunc`) or namedtuple's __new__, compiled from a string of its own
            if not (
                _supplied_by_a_module(value)
                or type(value) in _BUILT_IN_CALLABLES
                or _made_by_namedtuple(value)
                or _a_held_class(value)  # `_TypedDictMeta.__call__ = dict`
            ):
                return False
        elif (
            meta
            and key != "__classcell__"
            and _hook(value)
            # a metaclass's methods (its `mro`) are a module's, and read what a module gave them
            and not (
                _supplied_by_a_module(value, files) and _reads_what_a_module_holds(value, namespace, files)
            )
        ):
            return False
    return True


def _reads_what_a_module_holds(value: Any, namespace: dict[str, Any], files: frozenset[str]) -> bool:
    """Whether the names a hook's functions read (their code's ``co_names``) hold, in the namespace of the
    class being made, what a module could have put there (``_held_by_a_module_s``, a descriptor of a
    module's functions, an enum member of a standard class). ``collections.UserList.pop``,
    ``self.data.pop(i)``, as a ``__getattr__`` with a program object as ``data`` (and as a metaclass's ``mro``
    and ``__instancecheck__``) ran the program's ``pop`` as a hook of a class taken for a module's (red-team
    round 52)."""
    for function in _functions_in(value) or ():
        for name in function.__code__.co_names:
            held = dict.get(namespace, name, _ABSENT) if type(name) is str else _ABSENT
            if held is _ABSENT or held is value:
                continue
            # (`_supplied_by_a_module` takes a classmethod, staticmethod or property of a module's functions)
            if not (
                _held_by_a_module_s(held, files, 0) or _supplied_by_a_module(held, files) or _a_member(held)
            ):
                return False
    return True


_ABSENT = object()


def _a_member(value: Any) -> bool:
    """An ``int`` or ``str`` of a standard class whose own ``__dict__`` holds constants and standard classes
    (an enum member: ``string.Template``'s ``flags = re.IGNORECASE``)."""
    kind = type(value)
    if not (isinstance(value, int | str) and _is_standard(kind)):
        return False
    try:
        state = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return True
    return type(state) is dict and all(
        type(v) in _CONSTANTS or (_a_class(v) and _is_standard(v)) for v in dict.values(state)
    )


_BUILT_IN_CALLABLES = (type(len), type(object.__ne__), type(str.join))
#: Names the interpreter or the standard library looks up on a class as hooks: a slot of such a name in a class
#: made during an import makes it not the module's (the dunder slots of typing's ``ForwardRef`` are data).
_HOOK_NAMES = ALLOWED_SPECIAL_METHODS | frozenset(
    {
        "__getattr__", "__getattribute__", "__setattr__", "__delattr__", "__get__", "__set__", "__delete__",
        "__set_name__", "__init_subclass__", "__class_getitem__", "__mro_entries__", "__prepare__",
        "__instancecheck__", "__subclasscheck__", "__subclasshook__", "__copy__", "__deepcopy__", "__reduce__",
        "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs_ex__", "__getnewargs__", "__slotnames__",
        "__del__", "__dir__", "__sizeof__", "__class__", "__module__", "__qualname__",
        "__orig_bases__", "__orig_class__", "__origin__", "__args__", "__parameters__", "__wrapped__", "__func__",
        "__self__", "__globals__", "__code__", "__closure__", "__annotations__", "__match_args__", "__slots__",
        "__objclass__", "__abstractmethods__", "__bases__", "__mro__", "__name__", "mro",
    }
)  # fmt: skip


def _a_class(value: Any) -> bool:
    """Whether ``value`` is a class, by its type's real MRO (no ``__class__`` of its own is read)."""
    return any(cls is type for cls in _REAL_MRO(type(value)))


def _a_held_class(value: Any) -> bool:
    """Whether ``value`` is a class a module holds (not one recorded as the standard library's while a module
    was imported: a program made such a class with its own ``__new__``, then used it as every hook of the next
    one, red-team round 35)."""
    return _a_class(value) and _held_by_a_module(value)


def _made_by_namedtuple(value: Any) -> bool:
    """Whether ``value`` is the ``__new__`` that ``collections.namedtuple`` compiles (from a string) for a class."""
    if type(value) is not _FUNCTION:
        return False
    code, module = value.__code__, value.__module__
    return code.co_filename == "<string>" and code.co_name == "<lambda>" and str(module)[:11] == "namedtuple_"


def check_class(metatype: Any, args: tuple[Any, ...]) -> bool:
    """The check of every class made in a child (``sandbox.route_class_creation``): in a guarded call, refuses
    (events ``populora.metaclass``, ``populora.class_namespace``, ``populora.descriptor_subclass``,
    ``populora.class_hook``: recorded) a class a program makes that derives from ``type`` or from ``property``,
    ``classmethod`` or ``staticmethod``, holds a dunder name outside ``ALLOWED_SPECIAL_METHODS`` and
    ``CLASS_NAMESPACE_DUNDERS`` (or a key that is not a plain ``str``: a ``str`` subclass equal to one),
    annotations that are not a dict of ``str`` keys (the class gets a copy), typing's protocol flags that are
    not bools, or a special method or descriptor that does not run in a frame of the program's
    (``_runs_in_a_frame``). A class made while a module is imported is the module's only if every frame down to
    the import system is at a call (``_made_by_calls``) and ``_made_by_a_module`` vouches for it. Returns
    whether a program makes it (``class_made`` records which)."""
    if len(args) != 3:
        return False
    maker = _who_makes_the_class()
    if not maker and not _guard_armed():  # the worker's own code, outside guarded calls
        return False
    # In a guarded call, a class made below no frame of the program's nor of the import system's comes from C code
    # running a program's callables from the child's own frames (`f` rebound to a functools.partial, a partial as
    # an exception's __str__: red-team rounds 36 and 37): checked as the program's.
    if maker == "import" and _made_by_calls() and _made_by_a_module(metatype, args):
        return False
    _name, bases, namespace = args
    if type(bases) is not tuple:  # (a tuple subclass passed type_new and skipped the loop below: round 30)
        _refuse_at_run_time("populora.class_namespace", f"bases given as a {type(bases).__name__}")
    for base in bases if type(bases) is tuple else ():
        try:
            classes = _REAL_MRO(base)
        except TypeError:  # not a class: type_new refuses it
            continue
        if any(cls is type for cls in classes):
            _refuse_at_run_time("populora.metaclass", _describe_name(getattr(base, "__qualname__", "?")))
    if isinstance(namespace, dict):
        module = dict.get(namespace, "__module__", "")
        if type(module) is not str:  # (compared by the checks of private names)
            _refuse_at_run_time("populora.class_namespace", f"__module__ given as a {type(module).__name__}")
        slots = dict.get(namespace, "__slots__", ())
        names = (slots,) if type(slots) is str else slots if type(slots) in (tuple, list) else None
        if names is None:  # iterated here and again by CPython: a program's iterable gave each other names
            _refuse_at_run_time("populora.class_namespace", f"__slots__ given as a {type(slots).__name__}")
        for name in names or ():  # a slot is a descriptor in the class: no special method of any name
            if type(name) is not str:  # (a str subclass equal to a dunder name is that name: round 25)
                _refuse_at_run_time("populora.class_namespace", f"a slot named by a {type(name).__name__}")
            elif dunder_shaped(name) and name not in ("__dict__", "__weakref__"):
                _refuse_at_run_time("populora.class_namespace", f"{_describe_name(name)} (a slot)")
        own = _written_by_the_program(metatype, bases)
        # typing's protocol flags are bools: an object of the program's answering False to Protocol's own check
        # of its bases and True later made a "protocol" deriving from MutableSequence or Number, whose
        # descriptors typing read when array's or decimal's C init registered a class with that ABC (red-team
        # rounds 54 to 59)
        for flag in _TYPING_FLAGS:
            flagged = dict.get(namespace, flag, False)
            if type(flagged) is not bool:
                what = f"{_describe_name(flag)} as a {_describe_name(type(flagged).__name__)}, not a bool"
                _refuse_at_run_time("populora.class_namespace", what)
        # annotations are a dict of str keys, and the class gets a copy: typing calls their keys() (a partial
        # there, round 57) and the keys' startswith() (round 58), and the program's own dict took a key after
        # this check (round 59)
        annotations = dict.get(namespace, "__annotations__", {})
        if type(annotations) is not dict:
            what = f"{_describe_name('__annotations__')} as a {_describe_name(type(annotations).__name__)}"
            _refuse_at_run_time("populora.class_namespace", what)
        if odd := [key for key in dict.keys(annotations) if type(key) is not str]:
            kind = _describe_name(type(odd[0]).__name__)
            _refuse_at_run_time(
                "populora.class_namespace",
                f"{_describe_name('__annotations__')} with a key of the class {kind}",
            )
        if "__annotations__" in namespace:
            dict.__setitem__(namespace, "__annotations__", dict(annotations))
        for base in bases if type(bases) is tuple else ():
            if _a_class(base) and any(cls in _DESCRIPTOR_PARTS for cls in _REAL_MRO(base)):
                # (its instances' functions could be set again in place: `super().__init__(partial)` in a
                # method of the program's subclass of property or classmethod, red-team round 56)
                _refuse_at_run_time(
                    "populora.descriptor_subclass", _describe_name(getattr(base, "__name__", "?"))
                )
        for key, value in dict.items(namespace):
            if type(key) is str and not _runs_in_a_frame(value, key in ALLOWED_SPECIAL_METHODS, own):
                _refuse_at_run_time(
                    "populora.class_hook",
                    f"{_describe_name(key)} as a {_describe_name(type(value).__name__)}",
                )
        for key in dict.keys(namespace):
            if type(key) is not str:
                _refuse_at_run_time("populora.class_namespace", f"a key of the class {type(key).__name__}")
            elif (
                len(key) > 4
                and dunder_shaped(key)
                and key not in _CLASS_DUNDERS
                and not _unpicklable_enum(key, dict.__getitem__(namespace, key))
            ):
                _refuse_at_run_time("populora.class_namespace", _describe_name(key))
    return True


def _parts_of(value: Any) -> tuple[Any, ...] | None:
    """What a descriptor calls when it is read, or ``None`` for a value that is no descriptor: the functions of
    a ``property``, ``classmethod`` or ``staticmethod`` (of a subclass too, read through the base's own fields:
    a subclass can shadow ``fget`` with a class attribute); the ``func`` of a ``functools.partialmethod`` or
    ``cached_property`` and the functions of an ``enum.property`` (of those very classes, read from the
    instance's own dict); the function a ``functools.lru_cache`` wrapper calls; nothing of a built-in method or
    a namedtuple's field (they call no value they were given); and ``(_UNKNOWN,)`` for any other descriptor,
    which a program's class may not hold (a ``partialmethod`` of ``classmethod(property(partial))`` ran the
    partial, red-team round 55)."""
    kind = type(value)
    if not _a_descriptor_kind(kind):
        return None  # no descriptor: data
    for cls in _REAL_MRO(kind):
        getters = _DESCRIPTOR_PARTS.get(cls)
        if getters is not None:
            return tuple(get(value) for get in getters)
    fields = _held_fields(kind)
    if fields is not None:
        state = object.__getattribute__(value, "__dict__")  # (a standard class: no program code runs)
        return tuple(dict.get(state, name) for name in fields) if type(state) is dict else (_UNKNOWN,)
    if kind in _BUILT_IN_CALLABLES or kind is _tuplegetter:
        return ()
    if kind is _LRU_CACHE_WRAPPER:
        # (`functools.lru_cache` on a method: what it calls, read from the C object)
        function = lru_cached_function(value)
        return (_UNKNOWN,) if function is None else (function,)
    return (_UNKNOWN,)


def _a_descriptor_kind(kind: Any) -> bool:
    """Whether objects of the class ``kind`` are descriptors (a class on its real MRO defines ``__get__``,
    ``__set__`` or ``__delete__``, looked up in the namespaces, so that no program code runs), remembered by
    class: every store into a class asks (an import's enum members), and no class gains those names later (a
    program's class may not hold them, the standard library's are frozen)."""
    known = _DESCRIPTOR_KINDS.get(id(kind))
    if known is None:
        found = any(
            not _REAL_NAMESPACE(cls).keys().isdisjoint(("__get__", "__set__", "__delete__"))
            for cls in _REAL_MRO(kind)
        )
        known = _DESCRIPTOR_KINDS[id(kind)] = (kind, found)  # (kept alive: the id stays its)
    return known[1]


_DESCRIPTOR_KINDS: dict[int, tuple[Any, bool]] = {}
_DESCRIPTOR_PARTS = {
    property: tuple(vars(property)[name].__get__ for name in ("fget", "fset", "fdel")),
    classmethod: (vars(classmethod)["__func__"].__get__,),
    staticmethod: (vars(staticmethod)["__func__"].__get__,),
}
#: Standard descriptors of Python classes whose instances hold what they call: (module, class, fields)
_HELD_FUNCTIONS = (
    ("functools", "partialmethod", ("func",)),
    ("functools", "cached_property", ("func",)),
    ("enum", "property", ("fget", "fset", "fdel")),
    ("types", "DynamicClassAttribute", ("fget", "fset", "fdel")),
)
_UNKNOWN = object()


def _held_fields(kind: Any) -> tuple[str, ...] | None:
    """The fields of ``_HELD_FUNCTIONS`` for exactly ``kind``, found in the modules loaded (a class of a module
    not imported has no instance), or ``None``; remembered by class (``_owned`` asks on every attribute write
    of a program's)."""
    known = _HELD_BY_CLASS.get(id(kind))
    if known is not None:
        return known[1]
    found = None
    for module_name, name, fields in _HELD_FUNCTIONS:
        module = sys.modules.get(module_name)
        if module is not None and type(module) is _MODULE and dict.get(module.__dict__, name) is kind:
            found = fields
    _HELD_BY_CLASS[id(kind)] = (
        kind,
        found,
    )  # (by id, no hook of a metaclass runs; kept alive: the id stays its)
    return found


_HELD_BY_CLASS: dict[int, tuple[Any, tuple[str, ...] | None]] = {}


#: typing's flags of a Protocol class (``_child.check_class`` wants them bools)
_TYPING_FLAGS = ("_is_protocol", "_is_runtime_protocol")

#: The standard library's class factories that fill a class's namespace with functions of their own (a
#: namedtuple's ``_make`` classmethod, the enum functional API's): (module, function) -> (module, metaclass,
#: bases) of the classes each makes (its metaclass exactly, or a subclass of it when there are no bases given)
_CLASS_FACTORIES: dict[tuple[Any, str], tuple[str, str, tuple[type, ...] | None]] = {
    ("collections", "namedtuple"): ("builtins", "type", (tuple,)),
    ("enum", "_create_"): ("enum", "EnumMeta", None),  # (EnumType from 3.11, EnumMeta an alias)
}


def _written_by_the_program(metatype: Any, bases: Any) -> bool:
    """Whether a class being made is held to the rule for what the program's own code writes (its special
    methods' and descriptors' functions the program's own): unless the nearest frame outside the verifier's
    own and the standard metaclasses' ``__new__`` is one of the standard library's class factories
    (``_CLASS_FACTORIES``) and the class is of the kind that factory makes. Judged by that frame being the
    program's, a class made by the program's ``map(type(Proto), ...)`` consumed by ``collections.Counter`` or
    ``heapq`` was taken for the standard library's and could hold ``classmethod(property(UserList.pop))``
    (red-team round 58); consumed by the factories themselves, which iterate the program's names (enum's
    ``_create_``, namedtuple's ``list(map(str, field_names))``), the same (round 59; no use of it is known
    since typing's protocol flags are bools)."""
    frame = current_frame()
    # (past a standard metaclass's __new__ making the class of a class statement: ABCMeta's, EnumType's; a
    # program's own __new__ is the program's code)
    while frame is not None and (
        frame.f_code.co_filename in _VERIFIER_FILES
        or (frame.f_code.co_name == "__new__" and frame.f_code.co_filename not in _PROGRAM_FILES)
    ):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename in _PROGRAM_FILES:
        return True
    module = dict.get(frame.f_globals, "__name__") if type(frame.f_globals) is dict else None
    kind = _CLASS_FACTORIES.get((module, frame.f_code.co_name))
    if kind is None:
        return True
    home, name, made_on = kind
    source = sys.modules.get(home)
    maker = dict.get(source.__dict__, name) if type(source) is _MODULE else None
    if made_on is not None:
        same = (
            type(bases) is tuple
            and len(bases) == len(made_on)
            and all(a is b for a, b in zip(bases, made_on))
        )
        return not (metatype is maker and same)
    return not (_a_class(metatype) and any(cls is maker for cls in _REAL_MRO(metatype)))


def _runs_in_a_frame(value: Any, special: bool, own: bool = False) -> bool:
    """Whether the value a program's class holds under a special method's name (``special``), or as a
    descriptor, runs in a Python frame when the interpreter or the standard library calls it: a function,
    ``None`` (``__hash__ = None``), or a descriptor of functions (``_parts_of``). A C callable there ran the
    program's code below no frame of its own: ``__eq__ = functools.partial(dict.fromkeys, map(type(int), ...))``
    on an int subclass kept as a key by ``re``'s or ``enum``'s caches made classes while a module was imported
    (red-team rounds 34 to 53), ``classmethod(property(partial))`` under ``_is_runtime_protocol``, read by
    ``typing``'s ``__subclasshook__`` when ``array``'s C init registered it with ``MutableSequence`` (round
    54), and the same in a subclass of those or a ``partialmethod`` (round 55). With ``own`` (the program's own
    code wrote the class or the store) the functions of its special methods and descriptors must be the
    program's (round 56; a plain function of the standard library's under another name is what enum adds,
    ``_generate_next_value_``). Other values of other names are data."""
    if value is None:
        return True
    if type(value) is _FUNCTION:
        # the program's own code holds its own functions: `classmethod(property(collections.UserList.pop))`
        # forwarded to `self.data.pop`, a partial kept as plain data (red-team round 56)
        return not (own and special) or value.__code__.co_filename in _PROGRAM_FILES
    parts = _parts_of(value)
    if parts is None:
        return not special
    if special and not parts:  # (a built-in method as a special method: a program's are functions)
        return False
    return all(part is None or (part is not _UNKNOWN and _runs_in_a_frame(part, True, own)) for part in parts)


def class_made(cls: Any, by_a_program: bool) -> None:
    """``route_class_creation``'s ``made``: records a class ``check_class`` found a program's
    (``_PROGRAM_CLASSES``) or not (``made_by_the_standard_library``)."""
    if by_a_program:
        _PROGRAM_CLASSES[id(cls)] = _weak_reference(cls)
    else:
        made_by_the_standard_library(cls)


#: The classes programs made, by id (weakly: a program's classes may come and go by the million), so that no
#: module imported later makes one standard by holding an instance (``register_standard``; a red-team
#: round's hardening, no such import known)
_PROGRAM_CLASSES: dict[int, Any] = {}


def _a_program_s_class(cls: Any) -> bool:
    reference = _PROGRAM_CLASSES.get(id(cls))
    return reference is not None and reference() is cls


def made_by_the_standard_library(cls: Any) -> None:
    """Records a class no program made as standard (``route_class_creation``'s ``made``): one a module makes
    while it is imported and holds under no name, such as ``decimal``'s ``SignalDict`` (made with ``type()``
    by its C part), counted as a program's by ``_is_standard`` and written by programs (red-team round 31).
    Each is kept alive: a class freed later would leave its id to a class of the program's (an enum class
    was taken for the standard library's that way, found by this change's tests)."""
    _KEPT.append(cls)
    _STANDARD_CLASSES.add(id(cls))
    _PROGRAM_CLASSES.pop(id(cls), None)  # (a freed program class's id)


_KEPT: list[Any] = []  # the classes made_by_the_standard_library recorded (their ids stay theirs)
_KEPT_FROZEN = [0]  # how many of them register_standard has made immutable


def _unpicklable_enum(key: str, value: Any) -> bool:
    """Whether ``value`` is what ``enum``'s functional API puts under ``__reduce_ex__`` in a class whose module it
    cannot name (``sys._getframe`` is refused): a function of ``enum._make_class_unpicklable``'s own."""
    maker = getattr(sys.modules.get("enum"), "_make_class_unpicklable", None)
    return (
        key == "__reduce_ex__"
        and type(value) is type(_guarded_import)
        and type(maker) is type(_guarded_import)
        and any(value.__code__ is const for const in maker.__code__.co_consts)
    )


# The run-time half of the language layer, an audit hook (PEP 578) in every child. Where a frame comes from,
# for a program: the frame attributes of generators, coroutines, async generators and tracebacks (each read
# raises the audit event ``object.__getattr__`` with its name), ``sys._getframe``, and ``sys._current_frames``
# and trace or profile functions (given every frame). ``sys._getframe`` fails with the ValueError that
# ``collections.namedtuple``, ``typing`` and ``enum`` catch when they call it themselves (to name a new
# class's module: they then fall back), and is not recorded; the other reads fail and are. So does giving an
# object another class (``obj.__class__ = C``, event ``object.__setattr__``): no allowed module does it,
# and ``copy``'s reconstruction of a program's ``__reduce_ex__`` state did it to a module, turning
# ``dataclasses.replace`` into a read of any attribute by name (found by a red-team review).
def _frame_guard() -> tuple[
    Callable[[str, tuple[Any, ...]], None], Callable[[bool], None], Callable[[], str], Callable[[], bool]
]:
    """The hook and its controls, ``(audit, arm, refusal, armed)``, around a state no module global holds (so a
    program that can write into this module's globals still cannot switch it off there)."""
    frame_attributes = frozenset({"gi_frame", "cr_frame", "ag_frame", "tb_frame"})
    frame_events = frozenset({"sys._current_frames", "sys.settrace", "sys.setprofile"})
    run_time_refusals = dict(_RUN_TIME_REFUSALS)
    # `on` in guarded calls; `refused`: the first refusal's verdict detail
    state: dict[str, Any] = {"on": False, "refused": ""}

    def audit(event: str, args: tuple[Any, ...]) -> None:
        """The child's audit hook (added by the worker, for good: audit hooks cannot be removed): in a guarded
        call, the ways to a frame and class changes fail, whoever makes them (the program, a format string
        built at run time, a module on the program's behalf), and are recorded whatever the program does
        with the error. Not a boundary: a program that escapes the language layer can still reach it."""
        if not state["on"]:
            return
        if event == "object.__getattr__":
            if len(args) < 2 or args[1] not in frame_attributes:
                return
            refused = f"the program reached a frame at run time ({args[1]})"
        elif event == "object.__setattr__":
            if len(args) < 2 or args[1] != "__class__":
                return
            refused = "the program changed an object's class at run time (__class__)"
        elif event == "sys._getframe":
            raise ValueError("sys._getframe: frames are not available to programs")
        elif event in run_time_refusals:
            refused = run_time_refusals[event].format(args[0])
        elif event in frame_events:
            refused = f"the program reached a frame at run time ({event})"
        else:
            return
        state["refused"] = state["refused"] or refused
        raise RuntimeError(f"{refused}: not available to programs")

    def arm(on: bool) -> None:
        """On for a guarded call (off for an unguarded one), with no refusal recorded yet."""
        state["on"], state["refused"] = on, ""

    def refusal() -> str:
        """The verdict detail of the first refusal since ``arm``, or ``""``."""
        return state["refused"]

    def armed() -> bool:
        """Whether a guarded call is on (from its ``arm`` until the next: its verdict's rendering included)."""
        return bool(state["on"])

    return audit, arm, refusal, armed


_audit, arm_frame_guard, frame_guard_refusal, _guard_armed = _frame_guard()


def install_frame_guard() -> None:
    """Adds the hook to this process (the worker, before its first fork: every child has it)."""
    sys.addaudithook(_audit)


def disarm_frame_guard() -> None:
    """Off until the next call (``run_program`` arms it per call)."""
    arm_frame_guard(False)


def safe_builtins(allowed_modules: frozenset[str]) -> dict[str, Any]:
    """A copy of the built-ins with the interpreter's doors replaced (a second layer, not the boundary)."""
    global _ALLOWED_MODULES
    _ALLOWED_MODULES = allowed_modules
    table = dict(vars(builtins))
    for name in (
        "open",
        "input",
        "breakpoint",
        "help",
        "exit",
        "quit",
        "eval",
        "exec",
        "compile",
        "memoryview",
        "getattr",  # banned by the pre-filter; refused here too for a program that reaches the table
        "setattr",
        "delattr",
        "vars",
        "globals",
        "locals",
    ):
        table[name] = _refusing(name)
    table["__import__"] = _guarded_import
    table[_READ_CHECK] = _checked_read
    table[_OWN_CHECK] = _owned
    table[_SUPER_CHECK] = _checked_super
    table[_PRIVATE_CHECK] = _checked_private
    table[_AUG_CHECK] = _augmented
    return table


def setup_failed(exc: BaseException) -> bytes:
    """The verdict line for a child whose sandbox could not be set up (the program never ran)."""
    return _line("runtime", None, "sandbox setup failed: " + _describe(exc))


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except BaseException:  # a hostile __str__
        message = "<unprintable>"
    return f"{type(exc).__name__}: {message}"[:300]


_TABLES: dict[bool, dict[str, Any]] = {}


# The run-time half of the pre-filter's rule on format strings. ``str.format`` walks the attributes and items
# its fields name (``'{0.__globals__[__builtins__]}'``), and a format string built at run time is one no
# static check sees: what it walked to came back to programs through ``AttributeError.obj`` and through a
# ``property`` a program had put on a standard class on the way (red-team reviews, both full escapes). In a
# guarded program every ``.format``/``.format_map`` read compiles to a call of ``_checked_read(value, name)``,
# which checks the format string's fields (nested ones in format specs too) when the method is read: a walk
# may take only what the pre-filter lets a program's source take, no private or forbidden attribute and no
# dunder item key.


def _format_walk_refused(text: str, depth: int = 0) -> str:
    """The first field of ``text`` that walks where programs may not (``""`` if none): a private or forbidden
    attribute, ``obj`` (of an exception: the object a failed lookup kept), or a dunder item key. Fields after a
    malformed part are not looked at: ``str.format`` parses the same way and fails there, before walking them."""
    try:
        for _literal, field, spec, _conversion in _string.formatter_parser(text):
            if field is None:
                continue
            _first, rest = _string.formatter_field_name_split(field)
            for is_attribute, key in rest:
                if type(key) is not str:
                    continue
                if (
                    (
                        (key[:1] == "_" and key not in READABLE_DUNDERS)
                        or key in FORBIDDEN_ATTRIBUTES
                        or key == "obj"  # (an exception's, the object a failed lookup kept: round 41)
                    )
                    if is_attribute
                    else dunder_shaped(key)
                ):
                    return field
            if spec and "{" in spec:
                nested = _format_walk_refused(spec, depth + 1) if depth < 2 else spec
                if nested:
                    return nested
    except ValueError:  # malformed: the call fails at the same place
        return ""
    return ""


# the object a super proxy is bound to (super is closed to subclasses)
_SUPER_SELF = vars(super)["__self__"].__get__


def _checked_read(value: Any, name: str) -> Any:
    """``value.<name>`` for a guarded program's read of ``format``, ``format_map``, ``obj`` or a name of
    ``MODULE_READS``. Judged by what the read gives: ``str``'s own bound method (of a string, a ``str``
    subclass, a ``super()`` of one) after checking the string's fields (``_format_walk_refused``); ``str``'s
    unbound method as a function that checks each string it is given; an exception's ``obj`` (a failed
    lookup's object, see ``rules.py``) refused; a module a program may not import refused (``typing.io``,
    ``calendar.datetime``: modules the allowed ones hold); anything else as it is."""
    if name in MODULE_READS:
        found = getattr(value, name)
        if isinstance(found, type(sys)) and _off_the_allowlist(found) is not None:
            _refuse_at_run_time("populora.module_read", name)
        return found
    if name == "obj" and (
        isinstance(value, AttributeError)  # (the only built-in exception with an `obj`)
        or (type(value) is super and isinstance(_SUPER_SELF(value), AttributeError))  # (round 34)
    ):
        _refuse_at_run_time("populora.exception_object", type(value).__name__)
    method = getattr(value, name)
    if name == "obj":
        return method
    kind = type(method)
    if kind is _BOUND_BUILTIN and isinstance(getattr(method, "__self__", None), str):
        refused = _format_walk_refused(str.__str__(method.__self__))
        if refused:
            _refuse_at_run_time("populora.format_walk", refused)
    elif kind is _METHOD_DESCRIPTOR and getattr(method, "__objclass__", None) is str:
        return _checked_unbound(method)
    return method


def _checked_unbound(method: Any) -> Any:
    """``str.format`` (``str.format_map``) as a function that checks each string it is given; one per method,
    so that ``str.format is str.format`` holds as in plain Python."""
    for known, made in _CHECKED_UNBOUND:
        if known is method:
            return made

    def checked(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str):
            refused = _format_walk_refused(str.__str__(text))
            if refused:
                _refuse_at_run_time("populora.format_walk", refused)
        return method(text, *args, **kwargs)

    _CHECKED_UNBOUND.append((method, checked))
    return checked


_CHECKED_UNBOUND: list[tuple[Any, Any]] = []


_BOUND_BUILTIN = type("".format)
_METHOD_DESCRIPTOR = type(str.format)


_ATTRIBUTE_WRITES = frozenset({95, 96})  # STORE_ATTR, DELETE_ATTR (CPython 3.11; a test checks them)


_STANDARD_CLASSES: set[int] = set()  # ids of the classes the imported modules hold (``register_standard``)
_HELD_BY_MODULES: set[int] = set()  # the same, without the classes ``made_by_the_standard_library`` recorded
_REGISTERED_MODULES: set[str] = set()


def register_standard() -> None:
    """Records the classes every imported module holds as public or private attributes (the worker at its
    start, the guarded import after each import): the standard library makes classes whose name does not
    lead back to them (``difflib.Match``, a namedtuple made at import with ``__module__`` 'collections' when
    ``sys._getframe`` is refused; ``json.scanner.c_make_scanner``, a C type named ``Scanner``), which a
    review found programs could write into. Once ``freeze_standard_classes`` has run, each is made immutable
    too."""
    for name, module in list(sys.modules.items()):
        if name in _REGISTERED_MODULES or name == "__program__":
            continue
        _REGISTERED_MODULES.add(name)
        for value in list(vars(module).values()) if isinstance(module, type(sys)) else ():
            # a class, and the class of any other object a module holds (`enum._auto_null`: the name is
            # shadowed by its instance)
            held = value if _a_class(value) else type(value)
            if _a_program_s_class(held):  # (a program's object a module kept from what the program planted)
                continue
            _STANDARD_CLASSES.add(id(held))
            _HELD_BY_MODULES.add(id(held))
            if _FREEZING:
                _freeze(held)
    if _FREEZING:
        # and the classes made at import that no module holds (decimal's SignalDict: a red-team review wrote
        # into it after the freeze), frozen once their import is over, not while they are made (EnumType.__new__
        # deletes names of the class it makes)
        for cls in _KEPT[_KEPT_FROZEN[0] :]:
            _freeze(cls)
        _KEPT_FROZEN[0] = len(_KEPT)


def _freeze(cls: Any) -> None:
    refused = make_immutable(cls)
    if refused:
        _FREEZING.append(refused)


# empty until freeze_standard_classes runs; then "on", followed by why any class stays mutable
_FREEZING: list[str] = []


def freeze_standard_classes() -> list[str]:
    """Makes every class the imported modules hold, and every class made at import (``made_by_the_standard_library``),
    immutable (``sandbox.make_immutable``), now and after each later import (``register_standard``): the worker,
    after its guards are installed, when the language layer is on. A program's own writes were refused already (``_owned``), but public unbound methods of standard
    classes write their attribute names into any class they are handed
    (``calendar.Calendar.setfirstweekday(json.JSONEncoder, 5)`` set ``JSONEncoder._firstweekday``, red-team round
    41): CPython refuses those writes now, whoever makes them, with the ``TypeError`` it raises for its own
    built-in classes. Classes the standard library makes for a program (``namedtuple``'s, a subclass of a
    standard class) stay writable; what ``copyreg`` caches on a class (``__slotnames__``) it caches no more
    (it ignores the error).

    Returns:
        Why some classes stay mutable (another layout of the type object), or an empty list.
    """
    if not _FREEZING:
        _FREEZING.append("on")
    _REGISTERED_MODULES.clear()  # walked again, freezing what was recorded before
    register_standard()
    return sorted(set(_FREEZING[1:]))


def _is_standard(cls: Any) -> bool:
    """Whether a class is the standard library's (or the verifier's): held by a module the worker or the
    guarded import recorded (``register_standard``), or found under its own name in the module it names. A
    program's class is not, whatever its ``__module__`` says, nor one the standard library made for it
    (``collections.namedtuple``, the ``enum`` and ``typing`` functional forms)."""
    return id(cls) in _STANDARD_CLASSES or _found_under_its_name(cls)


def _held_by_a_module(cls: Any) -> bool:
    """``_is_standard`` without the classes recorded as made while a module was imported: a class of a module's
    (``register_standard``) or found under its own name in the module it names (``dict``, ``GenericAlias``)."""
    return id(cls) in _HELD_BY_MODULES or _found_under_its_name(cls)


def _found_under_its_name(cls: Any) -> bool:
    """Whether ``cls`` is found, by identity, under its ``__qualname__`` in the module its ``__module__`` names."""
    # `__module__` is any object a class's namespace held: compared only as an exact str, so that no program
    # code runs inside a check, between its answer and the read it allows (round 24)
    module = cls.__module__
    if type(module) is not str or module == "__program__":  # (the program's module is in sys.modules too)
        return False
    found: Any = sys.modules.get(module)
    for part in str(cls.__qualname__).split(".") if type(cls.__qualname__) is str else ("<?>",):
        namespace = vars(found) if isinstance(found, type | type(sys)) else {}
        found = namespace.get(part)
    return found is cls


def _is_own(target: Any) -> bool:
    """Whether a guarded program may write any attribute of ``target`` (``_owned``): not a module, a standard
    class, or an instance of one."""
    kind = type(target)
    if kind is type(sys):
        return False
    if issubclass(kind, type):
        return not _is_standard(target)
    return not _is_standard(kind)


def _shadows_a_method(target: Any, name: str) -> bool:
    """Whether writing ``name`` on an instance of a standard class would shadow a method of its class (the
    standard library calls methods with what it holds: a program's function in their place is handed it)."""
    for cls in _REAL_MRO(type(target)):
        found = _REAL_NAMESPACE(cls).get(name, _MISSING)
        if found is not _MISSING:
            kind = type(found)
            return hasattr(kind, "__get__") and not hasattr(kind, "__set__")
    return False


_MISSING = object()


def _owned(target: Any, name: str) -> Any:
    """``target``, for a guarded program's attribute write or delete (``target.name = ...``): refused (event
    ``populora.foreign_store``, recorded) where ``target`` is a module, a standard class, or an instance of
    one whose class has a method ``name``. A program wrote names into standard modules and classes, and a
    ``property`` it put on ``abc.ABCMeta`` was handed objects it could not reach (a red-team review's full
    escape); a method shadowed on a standard object would be handed what the standard library passes it.
    Plain attributes of standard instances stay writable (``textwrap.TextWrapper().width``); private ones
    (``_x``) only where ``_checked_private`` would read them."""
    if own_private(name) and not _private_reachable(target, name):
        _refuse_at_run_time("populora.foreign_store", f"{_describe_name(name)} of {_what(target)}")
    held = _held_fields(type(target))
    if held is not None and name in held:
        # (a partialmethod's `func`, an enum.property's `fget`, changed after its class was checked to a
        # partial: red-team round 56)
        _refuse_at_run_time("populora.foreign_store", f"{_describe_name(name)} of {_what(target)}")
    if not _is_own(target) and (
        type(target) is type(sys) or isinstance(target, type) or _shadows_a_method(target, name)
    ):
        what = _what(target)
        if not isinstance(target, type | type(sys)):
            what += " (a method of the class)"
        _refuse_at_run_time("populora.foreign_store", f"{_describe_name(name)} of {what}")
    return target


def _what(target: Any) -> str:
    """``target`` for a verdict detail: a module, a class or an object of a class, by name."""
    kind = type(target)
    if kind is type(sys):
        return f"the module {_describe_name(target.__name__)}"
    if issubclass(kind, type):
        return f"the class {_describe_name(target.__qualname__)}"
    return f"an object of the class {_describe_name(kind.__qualname__)}"


def _private_reachable(target: Any, name: str) -> bool:
    """Whether ``target.<name>``, a private name or a special method of the allowlist, is the program's own:
    ``target`` is a class of the program's or an instance of one (``_is_own``; a ``super()`` bound to one: the
    classes after its own), and the name is found first on a class of the program's or, on no class, in the
    instance's own dict, with no attribute lookup of the standard library's behind it. The standard
    library's stay out of reach: of modules (``collections._sys``), of its objects
    (``Fraction(1)._numerator``, ``int.__add__``), of its classes a program's class derives from
    (``UserDict.__init__``, an inherited ``object.__new__``), of the metaclass of a program's class
    (``ABCMeta._dump_registry``, ``type.__call__``)."""
    if name in _STANDARD_PRIVATE:
        return False
    if isinstance(target, super):  # `super()._helper()`: the classes after the proxy's, in its object's MRO
        bound = _SUPER_SELF(target)
        if bound is None or not _is_own(bound):
            return False
        order, this = _REAL_MRO(_SUPER_SELF_CLASS(target)), _SUPER_THIS_CLASS(target)
        after = next((order[i + 1 :] for i, cls in enumerate(order) if cls is this), ())
        found = next((cls for cls in after if name in _REAL_NAMESPACE(cls)), None)
        return found is not None and not _is_standard(found)
    if not _is_own(target):
        return False
    kind = type(target)
    metaclasses: tuple[Any, ...] = ()
    on_the_metaclass = False
    if issubclass(kind, type):  # a class: its metaclass's data descriptors come first, its other names last
        metaclasses = _REAL_MRO(kind)
        meta = next((m for m in metaclasses if name in _REAL_NAMESPACE(m)), None)
        if meta is not None:
            if _data_descriptor(_REAL_NAMESPACE(meta)[name]):
                return False
            on_the_metaclass = True
        classes = _REAL_MRO(target)
    else:
        classes = _REAL_MRO(kind)
        # a class that looks attributes up its own way (a subclass of a C type's): its namespaces say nothing
        if not generic_lookup(kind):
            return False
    for cls in classes:
        if name in _REAL_NAMESPACE(cls):
            return not _is_standard(cls)
    if on_the_metaclass:  # (`ABCMeta._dump_registry`, `type.__call__`)
        return False
    # found nowhere: the instance's own dict, unless a class's attribute lookup is not CPython's generic one
    # (a `__getattr__` of the standard library's, `super`'s own lookup for a subclass of super); `list`, `int`,
    # `Exception` have a `__getattribute__` in their namespace, the generic one
    return all(generic_lookup(cls) for cls in (*classes, *metaclasses) if cls is not type)


def _data_descriptor(value: Any) -> bool:
    """Whether ``value`` (found in a standard class's namespace) is a data descriptor, read from its class's
    namespaces (no ``hasattr``: no code of anyone's runs)."""
    return any(
        "__set__" in _REAL_NAMESPACE(cls) or "__delete__" in _REAL_NAMESPACE(cls)
        for cls in _REAL_MRO(type(value))
    )


# private names the standard library writes into a program's classes: ABCMeta's registry data
_STANDARD_PRIVATE = frozenset({"_abc_impl"})


def _checked_private(target: Any, name: str) -> Any:
    """``target.<name>`` for a guarded program's read of a private name (``_x``, a mangled ``__x``) or of a special
    method of the allowlist (``A.__init__``): refused (events ``populora.private_read``,
    ``populora.special_read``, recorded) unless ``_private_reachable``. Enum's names (``_value_``,
    ``_convert_``) and other dunders are refused by the pre-filter (``rules.own_private``)."""
    if not _private_reachable(target, name):
        event = "populora.special_read" if dunder_shaped(name) else "populora.private_read"
        _refuse_at_run_time(event, f"{_describe_name(name)} of {_what(target)}")
    return getattr(target, name)


# The names the checks are called by in a guarded program's rewritten code: names no source can spell (an
# identifier has no dot), looked up in the program's built-ins table. Spelled as identifiers, a program bound
# them itself, as a class or a parameter name, and its own function replaced the check (red-team round 19).
_READ_CHECK, _OWN_CHECK, _SUPER_CHECK = "populora.read", "populora.own", "populora.super"
_PRIVATE_CHECK, _AUG_CHECK = "populora.private", "populora.augmented"


_ERROR_NAME, _ERROR_OBJECT = vars(AttributeError)["name"], vars(AttributeError)["obj"]  # (the C fields)


class _Augmented:
    """What an augmented assignment to a checked attribute (``a.format += v``, ``self._n += 1``) reads and writes
    through (``_augmented``): CPython reads and writes the attribute it names on this proxy, in its own order,
    and the proxy reads the object's through the read check of that name and writes it on the object. No
    program ever holds one (it lives on CPython's stack for one statement)."""

    __slots__ = ("name", "read", "target")

    def __getattribute__(self, _name: str) -> Any:
        get = object.__getattribute__
        target, name = get(self, "target"), get(self, "name")
        try:
            return get(self, "read")(target, name)
        except AttributeError as e:
            # CPython records a failed lookup in the error (its C fields name and obj) at each lookup the error
            # leaves, by setting the attributes, until those fields are set: a program's subclass with
            # properties of those names keeps them unset and was handed every object on the way, this proxy
            # too (red-team round 41). Set as the object's own lookup, the one plain Python makes, records them.
            if _ERROR_NAME.__get__(e) is None and _ERROR_OBJECT.__get__(e) is None:
                _ERROR_NAME.__set__(e, name)
                _ERROR_OBJECT.__set__(e, target)
            raise

    def __setattr__(self, _name: str, value: Any) -> None:
        get = object.__getattribute__
        setattr(get(self, "target"), get(self, "name"), value)


def _augmented(target: Any, name: str) -> Any:
    """The proxy of an augmented assignment to ``target.<name>`` (see ``_Augmented``), the write checked first
    (``_owned``)."""
    _owned(target, name)
    proxy = object.__new__(_Augmented)
    for slot, value in (
        ("target", target),
        ("name", name),
        ("read", _checked_read if name in RUN_TIME_READS else _checked_private),
    ):
        object.__setattr__(proxy, slot, value)
    return proxy


def _with_checks(tree: Any) -> Any:
    """``tree`` (a module's syntax tree) with the run-time checks of a guarded program, at the same source
    positions: every read of an attribute ``format``/``format_map``/``obj`` or of ``MODULE_READS`` becomes
    ``_checked_read(value, name)``, every read of a dunder of ``super()`` ``_checked_super(super(), name)``,
    every read of a private name or a special method ``_checked_private(value, mangled name)``, the target of
    an augmented assignment to any of those the proxy ``_augmented(value, name)``, and the object of every
    other attribute write or delete ``_owned(value, name)``, each called by a name of the
    built-ins table that no source can spell. A class body declares those names global: it looks names up
    in the namespace its metaclass's ``__prepare__`` made first, and a metaclass made at run time can put
    any key there (red-team round 19, for ``super``)."""
    todo = [(tree, "")]  # each node with the name of the class whose body holds it (name mangling)
    declared = set()  # `obj.x: int`, an annotation alone: no store (its target is walked after it)
    while todo:
        node, owner = todo.pop()
        if type(node) is _ast.AnnAssign and node.value is None:
            declared.add(id(node.target))
        if type(node) is _ast.ClassDef:
            names = _ast.Global(names=[_READ_CHECK, _OWN_CHECK, _SUPER_CHECK, _PRIVATE_CHECK, _AUG_CHECK])
            for position in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
                setattr(names, position, getattr(node, position, None))
            node.body.insert(1 if _is_docstring(node.body[0]) else 0, names)  # (a class body is never empty)
        target = node.target if type(node) is _ast.AugAssign else None
        if type(target) is _ast.Attribute and (target.attr in RUN_TIME_READS or own_private(target.attr)):
            # `a.format += v`: the read an augmented assignment makes goes through the proxy `_augmented`
            # returns, checked as any read of the name (CPython's own read of it went unchecked, and a
            # `__radd__` was handed `str.format` and `AttributeError.obj`: red-team round 25, a full escape)
            declared.add(id(target))  # (its write is checked by `_augmented` itself)
            target.value = _check_call(_AUG_CHECK, target.value, _mangled(target.attr, owner), target)
        if type(node) is _ast.Attribute and type(node.ctx) is not _ast.Load and id(node) not in declared:
            node.value = _check_call(_OWN_CHECK, node.value, _mangled(node.attr, owner), node)
        # the node that takes a child's place is walked, not the child: a check's call holds the child's own
        # value (`e.obj.obj`, `calendar.datetime.datetime`: walking the replaced outer read left the inner one
        # unchecked, a finding of this file's own review)
        for field in node._fields:
            value = getattr(node, field, None)
            inside = node.name if type(node) is _ast.ClassDef and field in ("body", "type_params") else owner
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, _ast.AST):
                        value[i] = _format_check_of(item, inside)
                        todo.append((value[i], inside))
            elif isinstance(value, _ast.AST):
                replaced = _format_check_of(value, inside)
                setattr(node, field, replaced)
                todo.append((replaced, inside))
    return tree


def _mangled(name: str, owner: str) -> str:
    """``name`` as CPython compiles it in the body of a class named ``owner`` (private name mangling: ``__x``
    becomes ``_Owner__x``), for the checks that are handed it as a string."""
    stripped = owner.lstrip("_")
    if name[:2] != "__" or name[-2:] == "__" or "." in name or not stripped:
        return name
    return f"_{stripped}{name}"


def _is_docstring(statement: Any) -> bool:
    return (
        type(statement) is _ast.Expr
        and type(statement.value) is _ast.Constant
        and type(statement.value.value) is str
    )


def _format_check_of(node: Any, owner: str) -> Any:
    if type(node) is _ast.Attribute and type(node.ctx) is _ast.Load:
        if node.attr in RUN_TIME_READS:
            return _check_call(_READ_CHECK, node.value, node.attr, node)
        if dunder_shaped(node.attr) and plain_super(node.value):  # `super().__init__`
            return _check_call(_SUPER_CHECK, node.value, node.attr, node)
        if own_private(node.attr) or node.attr in ALLOWED_SPECIAL_METHODS:  # `self._n`, `A.__init__(self)`
            return _check_call(_PRIVATE_CHECK, node.value, _mangled(node.attr, owner), node)
    return node


# super's own member descriptors: `s.__self__` looks the name up in the MRO of the instance's class first,
# where a program's class made at run time can put anything under that name
_SUPER_SELF = vars(super)["__self__"].__get__
_SUPER_SELF_CLASS = vars(super)["__self_class__"].__get__
_SUPER_THIS_CLASS = vars(super)["__thisclass__"].__get__


def _checked_super(proxy: Any, name: str) -> Any:
    """``super().<name>`` for a guarded program (the pre-filter lets it read special methods of the allowlist
    this way): refused (events ``populora.unbound_super``, ``populora.foreign_super``) unless the proxy is
    bound to an instance of the program's own (``__new__``, a static method, also to a class). With a class
    as its first argument (a classmethod, a method called as ``B.m(B)``, a nested function given a class)
    ``super()`` hands out its bases' methods unbound, and ``super().__init__(json, 'importlib')``, for a
    class deriving from the module type, would rename a module (the renaming behind an earlier escape)."""
    if type(proxy) is not super or (
        type(_SUPER_SELF(proxy)) is not _SUPER_SELF_CLASS(proxy) and name != "__new__"  # static: never bound
    ):
        _refuse_at_run_time("populora.unbound_super", name)  # (an identifier of the source)
    # and bound to the program's own object: a `super` a run-time metaclass's namespace supplied to a class
    # body was `super(type(typing.List), typing.List)`, which re-initialised typing.List (red-team round 19)
    if not _is_own(_SUPER_SELF(proxy)):
        _refuse_at_run_time("populora.foreign_super", name)
    if name == "__new__":
        # a program's classes are never metaclasses (`check_class`): `super(type(E), E).__new__` is type's
        # own, and `object.__new__(type)` makes an uninitialised class (CPython's own check of it is passed
        # now that type's __new__ is the language layer's): both crashed the child (red-team round 24)
        if any(cls is type for cls in _REAL_MRO(_SUPER_THIS_CLASS(proxy))):
            _refuse_at_run_time("populora.metaclass_new", "super() of a metaclass")
        new = getattr(proxy, name)

        def checked_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(cls, type) and any(base is type for base in _REAL_MRO(cls)):
                _refuse_at_run_time("populora.metaclass_new", _describe_name(cls.__qualname__))
            return new(cls, *args, **kwargs)

        return checked_new
    return getattr(proxy, name)


def _check_call(function: str, value: Any, name: str, at: Any) -> Any:
    """The syntax tree of ``function(value, name)``, placed where ``at`` is."""
    call = _ast.Call(
        func=_ast.Name(id=function, ctx=_ast.Load()), args=[value, _ast.Constant(value=name)], keywords=[]
    )
    for made in (call, call.func, call.args[1]):
        for position in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            setattr(made, position, getattr(at, position, None))
    return call


_CHECKED_NAMES = RUN_TIME_READS | {"super"}  # (and private names and special methods: `_needs_checks`)


def _needs_checks(code: Any) -> bool:
    """Whether compiled program code reads an attribute named ``format``/``format_map``/``obj`` or one of
    ``MODULE_READS``, names ``super``, or writes or deletes any attribute (its names after NFKC, its opcodes;
    a global ``format`` counts too, harmlessly)."""
    todo = [code]
    while todo:
        unit = todo.pop()
        if (
            not _CHECKED_NAMES.isdisjoint(unit.co_names)
            or not _ATTRIBUTE_WRITES.isdisjoint(unit.co_code[::2])
            or any(own_private(name) for name in unit.co_names)
            or not ALLOWED_SPECIAL_METHODS.isdisjoint(unit.co_names)
        ):
            return True
        todo.extend(const for const in unit.co_consts if type(const) is type(code))
    return False


def _compile(text: str, filename: str, mode: str, guarded: bool) -> Any:
    """``compile`` of program text; for a guarded program that needs them, again through its syntax tree
    with the run-time checks (``_with_checks``)."""
    # dont_inherit: not this module's `from __future__ import annotations` (programs run as plain Python,
    # annotations evaluated when `f` is defined)
    code = compile(text, filename, mode, dont_inherit=True)
    if not (guarded and _needs_checks(code)):
        return code
    tree = compile(text, filename, mode, _ast.PyCF_ONLY_AST, dont_inherit=True)
    return compile(_with_checks(tree), filename, mode, dont_inherit=True)


class Compiled:
    """A program compiled by the worker, kept as its ``marshal`` bytes until its child loads it (``load``).

    Compiling interns every identifier, and every constant string made of name characters, in the
    interpreter's table of interned strings, which children inherit; a program can tell whether a string
    of its own making is in that table (``namedtuple(s, ...).__name__ is s``: namedtuple interns its name).
    Code objects held in the worker while it forked kept the names and constants of every program of a
    request there: a program read the others' identifiers, and its output changed with its batch (red-team
    rounds, 48 among them). The bytes intern nothing; each child loads its own program. (Compiling each
    program between the forks instead cost ~10% of CRUXEval programs per second, measured here: the
    compiler's writes after a fork are copy-on-write faults.)

    ``marshal`` rebuilds a frozenset constant element by element, which can move colliding entries:
    ``for x in {7, 15}`` iterated ``15, 7`` (red-team round 49). A program with a frozenset constant that
    does not come back in its order, or nested too deeply for ``marshal`` (an argument list as well), keeps
    its text instead, and its child compiles it (rare: one of CRUXEval's 800 programs has a frozenset
    constant at all)."""

    __slots__ = ("data", "source")

    def __init__(self, source: str, filename: str, mode: str, guarded: bool) -> None:
        """Compiles ``source`` (``_compile``'s errors propagate)."""
        code = _compile(source, filename, mode, guarded)
        try:
            data: bytes | None = marshal.dumps(code)
        except ValueError:  # "object too deeply nested to marshal": 998 nested lambdas (red-team round 50)
            data = None
        self.data = data if data is not None and all(_survives(f) for f in _frozensets(code)) else None
        self.source = (source, filename, mode, guarded) if self.data is None else None

    def load(self) -> Any:
        """The code object, in the child."""
        if self.data is not None:
            return marshal.loads(self.data)
        return _compile(*self.source)  # type: ignore[misc]  # (kept when there are no bytes)


def _frozensets(code: Any) -> Any:
    """The frozenset constants of ``code`` and of the code nested in it."""
    for const in code.co_consts:
        if type(const) is frozenset:
            yield const
        elif type(const) is type(code):
            yield from _frozensets(const)


def _survives(constant: frozenset[Any]) -> bool:
    """Whether ``marshal`` gives ``constant`` back in its iteration order (elements equal and of one type)."""
    back = list(marshal.loads(marshal.dumps(constant)))
    return all(type(a) is type(b) and a == b for a, b in zip(constant, back, strict=True))


class Prepared:
    """What the worker computes before forking, so the child touches (and copies) as little as possible:
    the compiled program and argument lists (``Compiled``: arguments in every mode, literal ones checked by
    the host to be literals only, so that their values are built as Python builds a call's constants:
    equal constants shared, name-like strings interned, sets in a set display's order; values sent
    ready-made came un-interned, unshared and in the order of their rebuilds, red-team rounds 48 and 49)
    and the built-ins table. No program code runs."""

    __slots__ = ("args", "code", "error", "guarded", "table")

    def __init__(self, table: dict[str, Any], guarded: bool) -> None:
        self.code: Compiled | None = None
        self.error = b""
        self.args: list[Any] = []
        self.table = table
        self.guarded = guarded
        """The language layer is on: built-ins guarded, frames refused (``_audit``)."""

    def call(self, index: int) -> Prepared:
        """The same program with its call ``index`` alone (each call runs in a child of its own)."""
        other = Prepared(self.table, self.guarded)
        other.code, other.error, other.args = self.code, self.error, self.args[index : index + 1]
        return other


def prepare(
    program: str,
    calls: list[str],
    *,
    allowed: frozenset[str] | None,
) -> Prepared:
    """Compiles ``program`` and each call's argument-list text (in ``"literal"`` mode checked by the host to
    be literals only).

    Args:
        allowed: The module allowlist of the guarded built-ins; ``None`` leaves the built-ins whole.
    """
    guards = allowed is not None
    if guards not in _TABLES:
        _TABLES[guards] = safe_builtins(allowed) if allowed is not None else dict(vars(builtins))
    prepared = Prepared(_TABLES[guards], guards)
    try:
        prepared.code = Compiled(program, "<program>", "exec", guards)
    except MemoryError:
        prepared.error = _line("memory", None, "MemoryError while compiling the program")
        prepared.args = [None] * len(calls)
        return prepared
    except (SyntaxError, ValueError, RecursionError, OverflowError) as e:
        prepared.error = _line("syntax", None, _describe(e))
        prepared.args = [None] * len(calls)  # one verdict per call (the count is all the child needs)
        return prepared
    for text in calls:
        try:
            prepared.args.append(Compiled(f"__populora_pack__(\n{text}\n)", "<args>", "eval", guards))
        except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as e:
            prepared.args.append(_line("bad_input", None, f"args are not valid Python: {_describe(e)}"))
    return prepared


def run_program(
    prepared: Prepared,
    out_fd: int,
    *,
    max_output: int,
    max_depth: int,
    mode: str = "literal",
    arm: Callable[[bool], None] = arm_frame_guard,  # bound here: replacing the module's names changes nothing
    refusal: Callable[[], str] = frame_guard_refusal,
) -> None:
    """Defines ``f`` from the prepared program and calls it once per argument, writing a verdict per call.

    The worker gives each child one call (``Worker.handle``): calls of a program that shared a child shared
    the state a call left in the modules the worker had imported. Each call runs the program's module code
    in fresh globals; its warm-up makes several calls in the worker itself.

    Args:
        mode: ``"literal"``: arguments were parsed as literals; ``"expression"``: argument texts are
            evaluated here, in the program's namespace (dataset inputs such as ``dict(a=1)``);
            ``"literalize"``: they are evaluated and their canonical literal text is the output (``f`` is
            not called).
    """
    if prepared.error:
        os.write(out_fd, prepared.error * len(prepared.args))
        return
    for args in prepared.args:
        arm(prepared.guarded)  # stays on after the call's verdict
        verdict = _define_and_call(prepared, args, mode, max_output, max_depth)
        if refused := refusal():  # whatever the program made of the error
            verdict = _line("forbidden", None, refused)
        os.write(out_fd, verdict)


def _define_and_call(prepared: Prepared, args: Any, mode: str, max_output: int, max_depth: int) -> bytes:
    """One call's verdict line: runs the module code in fresh globals, then calls its ``f``."""
    table = prepared.table
    if isinstance(args, bytes):  # an argument text that did not compile: its verdict is ready
        return args
    code, failed = _loaded(prepared.code, "the program", "syntax")  # type: ignore[arg-type]  # (no error)
    if failed:
        return failed
    args, failed = _loaded(args, "the arguments", "bad_input")
    if failed:
        return failed
    # The program's globals are a module's, listed in sys.modules: dataclasses (and typing.get_type_hints)
    # look string annotations (`from __future__ import annotations`) up there, by the class's __module__.
    program = type(sys)("__program__")  # types.ModuleType, without importing `types` into the worker
    glb: dict[str, Any] = program.__dict__
    for name in ("__doc__", "__package__", "__loader__", "__spec__"):  # as the plain dict had them: absent
        del glb[name]
    glb["__builtins__"] = table
    sys.modules["__program__"] = program  # a fresh child per call
    try:
        exec(code, glb)
    except MemoryError:
        return _line("memory", None, "MemoryError while defining the program")
    except BaseException as e:
        return _line("runtime", None, "while defining the program: " + _describe(e))
    if prepared.guarded and glb.get("__builtins__") is not table:  # (the pre-filter refuses every binding)
        return _line("forbidden", None, "the program rebound __builtins__")
    f = glb.get("f")
    if not callable(f):
        return _line("syntax", None, "the program does not define a function `f`")
    return _call(f, args, glb, mode, max_output, max_depth)


def _loaded(compiled: Compiled, what: str, status: str) -> tuple[Any, bytes]:
    """``compiled``'s code, or the verdict line of a child that cannot load it: compiled in the worker
    already, a text compiled again here compiles, unless this child's recursion limit or memory cap stops
    it."""
    try:
        return compiled.load(), b""
    except MemoryError:
        return None, _line("memory", None, f"MemoryError while loading {what}")
    except (SyntaxError, ValueError, RecursionError, OverflowError) as e:
        return None, _line(status, None, _describe(e))


def _pack(*args: Any) -> tuple[Any, ...]:
    return args


def _arguments(args: Any, glb: dict[str, Any], mode: str) -> tuple[Any, ...]:
    """The call's arguments from their code (compiled by the worker): literals (the host checked) in a
    namespace of their own, where the one name a literal may hold, ``set`` of ``set()``, is the built-in;
    expressions in the program's namespace."""
    if mode == "literal":
        return eval(args, {"__builtins__": {}, "__populora_pack__": _pack, "set": set})
    return eval(args, {**glb, "__populora_pack__": _pack})


def _call(
    f: Any,
    args_in: Any,
    glb: dict[str, Any],
    mode: str,
    max_output: int,
    max_depth: int,
    stop_collector: Callable[[], None] = gc.disable,  # bound here, as run_program's
) -> bytes:
    """One call of ``f`` and its verdict. The cyclic collector stops as the program's code ends (``f``
    returns or raises; in ``"literalize"`` mode, its arguments are evaluated): the collector would otherwise
    run as the verdict is rendered, and the finalizers of the program's garbage (a suspended generator's
    ``finally``) with it, changing the value being rendered: an ``ok`` verdict whose output no run of the
    program returns (red-team round 46). The child ends after its verdict; ``Worker._warm_up`` restarts it."""
    try:
        try:
            args = _arguments(args_in, glb, mode)
        finally:
            if mode == "literalize":
                stop_collector()
    except (literals.LiteralError, TypeError, SyntaxError) as e:
        return _line("bad_input", None, str(e))
    except MemoryError:
        return _line("memory", None, "MemoryError while evaluating the arguments")
    except BaseException as e:
        return _line("runtime", None, "while evaluating the arguments: " + _describe(e))
    if mode == "literalize":
        return _render(
            lambda: ", ".join(literals.canonical_text(a, max_depth=max_depth) for a in args), max_output
        )
    try:
        try:
            value = f(*args)
        finally:
            stop_collector()
    except MemoryError:
        return _line("memory", None, "MemoryError")
    except BaseException as e:  # SystemExit, KeyboardInterrupt and custom BaseExceptions included
        return _line("runtime", None, _describe(e))
    return _render(lambda: literals.canonical_text(value, max_depth=max_depth), max_output)


def _render(render: Any, max_output: int) -> bytes:
    try:
        text = render()
    except literals.LiteralError as e:
        return _line("bad_output", None, str(e))
    except MemoryError:
        return _line("memory", None, "MemoryError while rendering the return value")
    except BaseException as e:
        return _line("bad_output", None, "cannot render the return value: " + _describe(e))
    if len(text) > max_output:
        return _line("bad_output", None, f"return value renders to {len(text)} characters, over {max_output}")
    return _line("ok", text, "")


def set_recursion_limit(limit: int) -> None:
    """Sets the child's recursion limit (deep recursion becomes a RecursionError, not a crash)."""
    sys.setrecursionlimit(limit)
