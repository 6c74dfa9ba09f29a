"""The verdict line: how a child reports one call to its worker, and the worker to the host.

One line per call: ``status US (=output | -) US detail LF`` (US = ``\\x1f``). Canonical output text is
built from reprs, which escape control characters, so it holds neither separator. The host parses these
lines itself, with no ``json``, ``pickle`` or ``marshal`` on anything a program could influence.

Imported by the host as ``populora_env.verifier.verdicts`` and by the worker as a top-level module.
"""

from __future__ import annotations

TYPE_CHECKING = False  # the worker imports this module: `typing` stays out of it (see literals.py)
if TYPE_CHECKING:
    from typing import Any


#: The statuses a line may carry (``records.Status`` lists the same; a test keeps them equal).
KNOWN = frozenset(
    {
        "ok",
        "syntax",
        "forbidden",
        "timeout",
        "memory",
        "runtime",
        "nondeterministic",
        "bad_output",
        "bad_input",
    }
)


def line(status: str, output: str | None = None, detail: str = "") -> bytes:
    """One verdict line (``detail`` is cut to 300 characters and made single-line)."""
    detail = detail[:300].replace("\n", " ").replace("\x1f", " ")
    body = "-" if output is None else "=" + output
    return f"{status}\x1f{body}\x1f{detail}\n".encode("utf-8", "backslashreplace")


def parse_line(raw: bytes) -> list[Any] | None:
    """The ``[status, output, detail]`` of a verdict line (without its LF), or ``None`` if malformed or its
    status is unknown. The worker turns such a line from a child into ``bad_output`` for that call."""
    parts = raw.decode("utf-8", "replace").split("\x1f")
    if len(parts) != 3 or parts[0] not in KNOWN or not parts[1] or parts[1][0] not in "=-":
        return None
    return [parts[0], parts[1][1:] if parts[1][0] == "=" else None, parts[2]]
