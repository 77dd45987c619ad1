"""Time limits that the program being run cannot cancel.

Inside a worker, ``armed(seconds, what)`` tells the supervisor a deadline; when it passes, the supervisor asks
the worker to stop what runs (``StopRun`` raised in that thread, as the run's own limit would), and kills the
worker's whole process tree if it still runs a grace period later, whatever the script did with signals or
exceptions (its own ``signal.alarm``, a retry loop that catches ``BaseException``). Without a supervisor
(nnwizard used as a library, the tests) ``armed`` only keeps the in-process limits. Importable without torch."""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from typing import Callable

_arm: Callable[[int, float, str, int, bool], None] | None = None
_clear: Callable[[int], None] | None = None
_ids = itertools.count(1)


def install(arm: Callable[[int, float, str, int, bool], None], clear: Callable[[int], None]) -> None:
    """The worker's channel: ``arm(id, seconds, what, thread ident, stop)`` and ``clear(id)``."""
    global _arm, _clear
    _arm, _clear = arm, clear


_interrupt = threading.Event()
_by_message = [False]


def supervised() -> bool:
    return _arm is not None


def interrupts_by_message(value: bool | None = None) -> bool:
    """Whether Ctrl-C reaches this process as the supervisor's message (a diagnosis: the script's own
    KeyboardInterrupt is then evidence), not as a signal (watch: the user's real run)."""
    if value is not None:
        _by_message[0] = value
    return _by_message[0]


def request_interrupt() -> None:
    """The user pressed Ctrl-C (the supervisor said so): a KeyboardInterrupt now is theirs, not the script's."""
    _interrupt.set()


def interrupt_requested() -> bool:
    return _interrupt.is_set()


@contextmanager
def armed(seconds: float | None, what: str, stop: bool = True):
    """A deadline ``seconds`` from now for the block (``stop``: ask this thread to stop at the deadline; else the
    supervisor only kills the tree after the grace period). Yields a function that moves the deadline."""
    if not seconds or _arm is None:
        yield lambda seconds: None
        return
    ident, thread = next(_ids), threading.get_ident()
    _arm(ident, seconds, what, thread, stop)

    def move(new_seconds: float) -> None:
        _arm(ident, new_seconds, what, thread, stop)

    try:
        yield move
    finally:
        _clear(ident)
