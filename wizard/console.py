"""The rich Console every view prints through: on a terminal, its width; elsewhere (a CI log, a file, a pipe) no
hard wrap at 80 columns, so that paths and file:line stay whole (``COLUMNS`` still sets a width)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

WIDE = 160   # a table's width when the output is no terminal


def make_console(stderr: bool = False, **kwargs) -> Console:
    stream = kwargs.get("file") or (sys.stderr if stderr else sys.stdout)
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    # bound to the stream as it is now: while the user's program runs, sys.stdout/sys.stderr are nnwizard's captures
    # of its output, and a console that looked them up at each write would draw the live line into them
    kwargs.setdefault("file", stream)
    if not (tty or os.environ.get("COLUMNS") or "width" in kwargs):
        kwargs.update(width=WIDE, soft_wrap=True)
    return Console(**kwargs)
