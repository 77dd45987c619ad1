"""Patch on child processes (full mode): ``multiprocessing``'s ``BaseProcess.start`` (``torch.multiprocessing``,
``spawn`` and pools use it too) counts the processes the program starts (``Recording.child_processes``). The
recorder watches only the program's own process, so a script that trains in children (Hogwild) records no step;
the count lets the report say why. Nothing about the processes changes."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.recorder import Recorder


def child_processes(rec: "Recorder") -> None:
    import multiprocessing.process as mp_process

    def make(original):
        @functools.wraps(original)
        def start(process, *args, **kwargs):
            rec.recording.child_processes += 1
            return original(process, *args, **kwargs)
        return start

    rec.patch(mp_process.BaseProcess, "start", make)
