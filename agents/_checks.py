"""Checks of the numbers agents' public functions and configs take: Python's own, bools refused (``True`` passed
as 1 and was refused only once an episode had begun, a robustness review)."""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any) -> bool:
    """A Python ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite Python ``int`` or ``float`` that is not a ``bool`` (``math.isfinite`` raised a bare TypeError
    naming no argument for a string)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
