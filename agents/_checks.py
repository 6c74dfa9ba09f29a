"""Checks of the numbers agents' public functions and configs take: Python's own, bools refused (``True`` passed
as 1 and was refused only once an episode had begun, a robustness review)."""

from __future__ import annotations

import math
import numbers
from typing import Any


def plain_number(value: Any) -> Any:
    """numpy's numbers (a value read from an array) as Python's: a ``numbers.Integral`` as ``int``, another
    ``numbers.Real`` as ``float``; bools and everything else as they are (for the checks below to judge)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or type(value) in (int, float):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def is_int(value: Any) -> bool:
    """A Python ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite Python ``int`` or ``float`` that is not a ``bool`` (``math.isfinite`` raised a bare TypeError
    naming no argument for a string)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
