"""The hardened program verifier: runs untrusted ``def f`` programs and checks answers against them.

    from populora_env.verifier import Verifier, Execution

    with Verifier() as v:
        v.run("def f(x):\\n    return x * 2", "3")     # Execution(status="ok", output="6", detail="")

See :class:`Verifier`, the README's threat model and, in full, docs/threat-model.md.
"""

from __future__ import annotations

from .literals import LiteralError, canonical_text, outputs_equal, parse_args, parse_literal
from .records import STATUSES, Execution, IsolationReport, Status, VerifierConfig
from .verifier import Verifier

__all__ = [
    "STATUSES",
    "Execution",
    "IsolationReport",
    "LiteralError",
    "Status",
    "Verifier",
    "VerifierConfig",
    "canonical_text",
    "outputs_equal",
    "parse_args",
    "parse_literal",
]
