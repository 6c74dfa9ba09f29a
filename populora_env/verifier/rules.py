"""Names the language layer refuses, shared by the host's pre-filter and the worker's run-time checks.

Imported by the host as ``populora_env.verifier.rules`` (through ``prefilter``) and by the worker as a
top-level module (``_child``), which cannot import the package: one definition for both halves.
"""

from __future__ import annotations

import _ast  # (the C module: the worker imports no `ast`; the pre-filter's nodes are these classes)

TYPE_CHECKING = False  # `typing` stays out of the worker (see _worker.py)
if TYPE_CHECKING:
    from typing import Any

#: Attributes a program may not read although their names have no underscore: the frames and code of
#: generators, coroutines and tracebacks (``gen.gi_frame.f_back.f_globals`` reaches the child's own
#: modules), attribute access by name at run time (``attrgetter``; a ``Formatter`` subclass's hooks get
#: the objects a format string walks to), the evaluators of string annotations (``get_type_hints``, which
#: ``singledispatch`` calls, runs them through ``eval`` with the real built-ins), and the modules that the
#: allowed ones import under a public name (``typing.sys.modules`` holds every module).
#: ``make_dataclass`` builds a class from a namespace dict of any names (``__class__``, ``__reduce_ex__``...)
#: and ``global_enum`` copies a class's ``__members__`` into the globals of the module its ``__module__``
#: names (the verifier's own, ``builtins``); ``copy.dispatch_table`` (copyreg's) makes ``copy`` rebuild any
#: class's instances from what a program's function returns; ``enum.pickle_by_enum_name`` returns the real
#: built-in ``getattr``; ``NamedTupleMeta`` sets every name of a namespace it is given on the class it makes
#: (round 24): all turned into escapes by red-team reviews.
#: ``FORBIDDEN_ATTRIBUTES`` is checked against the running Python's allowed modules by the tests.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next",
        "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "attrgetter", "methodcaller", "get_field",
        "Formatter", "get_type_hints", "ForwardRef", "singledispatch", "singledispatchmethod",
        "update_wrapper", "wraps", "WRAPPER_ASSIGNMENTS", "WRAPPER_UPDATES",
        "sys", "os", "builtins", "bltns", "inspect", "types", "importlib", "contextlib", "warnings", "codecs",
        "copyreg", "random", "datetime", "keyword", "abc", "gc", "io", "time",
        "make_dataclass", "global_enum", "dispatch_table", "pickle_by_enum_name", "NamedTupleMeta",
        "update_abstractmethods",
    }
)  # fmt: skip

#: Names among ``FORBIDDEN_ATTRIBUTES`` that are names of modules and, as often, of a program's own attributes
#: (``event.time``, ``self.types``, ``collections.abc``, ``device.os``, ``car.inspect()``): the pre-filter lets
#: attributes of these names
#: through, and the child checks what each read gives at run time (``_child._checked_read``): a module off the
#: allowlist is refused, whatever object held it. In ``from x import <name>``, a format field and a class
#: pattern they stay refused (no read a check could see).
MODULE_READS = frozenset(
    {"types", "contextlib", "warnings", "random", "datetime", "keyword", "abc", "io", "time", "os", "inspect"}
)

#: The special methods a program may define (any other dunder-named ``def`` is refused): construction,
#: representation, comparison, arithmetic, containers, iteration, context managers and calls. Refused by
#: omission, among others: ``__class__`` (``dataclasses.replace`` calls ``obj.__class__(**fields)``),
#: ``__init_subclass__`` and ``__class_getitem__`` (subclassing the typing module's attribute-forwarding
#: alias class), ``__reduce__``/``__reduce_ex__``/``__setstate__`` and the copy hooks (``copy`` sets the
#: attributes a reconstruction state names, on the object a program's callable returns: any module),
#: ``__getattr__``/``__getattribute__``/``__setattr__``, descriptors (``__get__``, ``__set_name__``),
#: metaclass hooks (``__instancecheck__``, ``__prepare__``, ``__mro_entries__``) and ``__del__``.
ALLOWED_SPECIAL_METHODS = frozenset(
    {
        "__init__", "__new__", "__post_init__", "__repr__", "__str__", "__format__", "__bytes__", "__hash__",
        "__bool__", "__len__", "__length_hint__", "__iter__", "__next__", "__reversed__", "__contains__",
        "__getitem__", "__setitem__", "__delitem__", "__missing__", "__call__", "__enter__", "__exit__",
        "__await__", "__aiter__", "__anext__", "__aenter__", "__aexit__",
        "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
        "__neg__", "__pos__", "__abs__", "__invert__", "__int__", "__float__", "__complex__", "__index__",
        "__round__", "__trunc__", "__floor__", "__ceil__", "__divmod__", "__rdivmod__",
        *(
            f"__{prefix}{op}__"
            for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift",
                       "rshift", "and", "xor", "or")
            for prefix in ("", "r", "i")
        ),
    }
)  # fmt: skip

#: Dunder names a class's namespace may hold beside ``ALLOWED_SPECIAL_METHODS`` when a program makes the class
#: (a class statement, or the standard library on its behalf: ``collections.namedtuple``, the ``enum`` and
#: ``typing`` forms), checked as each class is made (``_child.check_class``): what a class statement puts
#: there itself, and the names ``namedtuple`` and ``typing`` add. A class made at run time could hold any
#: name (``__slotnames__``, ``__setstate__``, ``__getattr__``...), where a class statement holds only what the
#: pre-filter lets a program write (red-team round 23).
CLASS_NAMESPACE_DUNDERS = frozenset(
    {
        "__module__", "__qualname__", "__doc__", "__annotations__", "__classcell__", "__orig_bases__",
        "__slots__", "__match_args__", "__getnewargs__",
    }
)  # fmt: skip

#: Submodules of allowed packages that a program may not import: ``json.tool`` holds ``sys`` and
#: ``argparse`` (the tests walk every submodule of the allowed packages for such).
FORBIDDEN_MODULES = frozenset({"json.tool"})

SHADOWING_STORES = frozenset({"exec", "eval", "compile"})
"""Attribute names a program may not assign or delete: a module global of that name shadows the built-in
its functions call (``dataclasses.exec = f``)."""

CHECKED_READS = frozenset({"format", "format_map", "obj"})
"""Attribute names whose reads the child checks at run time (``_child._checked_read``): ``str.format`` walks
the attributes a format string names, and one built at run time is one no static check sees; ``obj`` of an
exception is the object a failed lookup kept (since Python 3.10), which handed a program whatever such a walk
had reached, the real built-ins (red-team reviews). A class pattern reads attributes too (``case
str(format=f)``): the pre-filter refuses these names as its keywords."""

#: Every attribute name whose reads the child checks at run time (``CHECKED_READS`` and ``MODULE_READS``):
#: where no check can run (a class pattern's keyword, a value pattern), the pre-filter refuses them.
RUN_TIME_READS = CHECKED_READS | MODULE_READS


#: Dunder attributes a program may read (not write): the name of a class, function or module, a string
#: (``type(x).__name__`` in a ``__repr__``), and an object's class (``self.__class__(...)``), what ``type(x)``
#: gives (a class statement may not define ``__class__``; the class of an object is changed by no program).
READABLE_DUNDERS = frozenset({"__name__", "__qualname__", "__class__"})


def dunder_shaped(name: str) -> bool:
    """Whether a name starts and ends with two underscores (``__x__``; ``"__"`` too): the test the child applies
    to names a program hands it at run time (slots, namespace keys, copy state, alias relays, format fields)."""
    return name[:2] == name[-2:] == "__"


def own_private(name: str) -> bool:
    """Whether an attribute name is one a program may use on its own objects, checked at run time
    (``_child._checked_private``, ``_child._owned``): a private name, ``_x``, or one that class-private name
    mangling rewrites, ``__x``; never a dunder, nor a name ending in ``_`` (``_value_``, ``_convert_``: the
    ``enum`` machinery's names)."""
    return len(name) > 1 and name[:1] == "_" and name[-1:] != "_"


def plain_super(node: Any) -> bool:
    """``super()``, the zero-argument form, or ``super(B, x)`` with two names: the forms on which the
    pre-filter lets a program read a special method, and which the child rewrites into a checked read."""
    return (
        type(node) is _ast.Call
        and type(node.func) is _ast.Name
        and node.func.id == "super"
        and (not node.args or (len(node.args) == 2 and all(type(a) is _ast.Name for a in node.args)))
        and not node.keywords
    )
