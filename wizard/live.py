"""The live line while the user's program is observed: ``step k of N · loss x · 12.3 s``, as events for the view.

A recorder listener (``on_step_post``) that sends a ``script-progress`` event at most every ``EVERY_S`` seconds;
the terminal view redraws one status line from them, so a run of many seconds never looks stuck."""

from __future__ import annotations

import math
import time

EVERY_S = 0.25


class Progress:
    """Also says, once, when the script went on training after nnwizard stopped its run (it catches the stop, a
    BaseException): the supervisor then ends it at once instead of waiting for the deadline's grace."""

    def __init__(self, listener, every_s: float = EVERY_S):
        self.listener, self.every_s = listener, every_s
        self._last = 0.0
        self._said = False

    def on_backward(self, rec, loss) -> None:
        stopped = rec.recording.stopped
        if stopped and not self._said:   # (a backward pass after the stop: the script trains on)
            from nnwizard.engine import Event

            self._said = True
            note = (f"the script went on training after nnwizard stopped its run ({stopped}) after step "
                    f"{rec.recording.total_steps}: it catches the stop (a BaseException) and carries on")
            rec.recording.notes.append(note)
            self.listener(Event("script-note", data={"text": note, "kind": "stop-caught"}))

    def on_step_post(self, rec, optimizer, step) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        from nnwizard.engine import Event

        loss = step.loss
        self.listener(Event("script-progress", data={
            "step": rec.steps_taken, "max_steps": rec.max_steps, "elapsed": rec.now(),
            "loss": loss if loss is None or math.isfinite(loss) else str(loss)}))


def progress_text(data: dict) -> str:
    """``step 12 of 60 · loss 0.4312 · 3.1 s``."""
    total = f" of {data['max_steps']}" if data.get("max_steps") else ""
    loss = data.get("loss")
    shown = "" if loss is None else f" · loss {loss:.4g}" if isinstance(loss, float) else f" · loss {loss}"
    return f"step {data['step']}{total}{shown} · {data['elapsed']:.1f} s"
