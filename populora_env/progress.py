"""Whether a progress bar has someone to watch it."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def watched() -> bool:
    """Whether a tqdm bar on standard error is seen as a bar: standard error is a terminal, or ``tqdm.auto``
    chose its notebook widget. In a log file or a pipe (CI, ``nohup``) every redraw of a bar is one more line
    (an audit), so the package's long jobs draw no bar there and write their own lines, if any, instead."""
    isatty = getattr(sys.stderr, "isatty", None)
    return "notebook" in tqdm.__module__ or bool(isatty is not None and isatty())
