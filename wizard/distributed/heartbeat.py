"""No hang, ever: a heartbeat per rank, and the watchdog that reads them.

Each rank runs a :class:`Heartbeat` thread that every ``BEAT_S`` writes to the shared store what the rank is
doing (its step, a counter of what it did, and what it waits in right now: a collective with its line, a
DistributedDataParallel forward or backward, ``init_process_group``). The :class:`Watchdog` (the parent of
``--nproc``, or rank 0 under the user's torchrun) reads them and decides that the ranks are stuck:

- a rank waits in a collective (or a DDP/FSDP forward or backward) while another rank has finished or is gone
  (its process ended, its heartbeat stopped) for more than ``GONE_S``;
- a rank has waited in one for more than ``STALL_S`` and no other rank did anything meanwhile;
- the run passed its hard deadline.

It then writes ``abort`` with the reason; every rank's heartbeat thread (the main thread may be blocked inside
a collective, which releases the GIL) dumps the Python stacks of its threads with ``faulthandler``, sends them
and the rank's digest so far, and ends its process (``os._exit``: a thread cannot unwind a main thread blocked
in a C++ call). A rank that does not answer within ``ANSWER_S`` is killed by whoever launched it.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
import threading
import time
from typing import Callable

BEAT_S = 0.5
PARTIAL_EVERY = 4  # beats between two copies of the digest so far (``partial/<rank>``: a rank that dies keeps it)
STALL_S = 10.0
GONE_S = 3.0
LOST_S = 6.0      # a heartbeat older than this (the process still listed) counts as gone
ANSWER_S = 4.0    # what the watchdog waits for every rank's stacks after an abort
ABORTED = 75      # a rank's exit code after an abort (its script was stopped from outside)


def python_stacks() -> str:
    """This process's Python stacks, every thread, as faulthandler writes them (it needs a real file)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


class Heartbeat(threading.Thread):
    """One rank's heartbeat (a daemon thread). ``on_abort(reason)`` runs in this thread when the watchdog
    aborts the run; by default it sends the stacks and the digest and ends the process with ``exit_code``.
    ``deadline_s``: a hard limit of this rank's own (seconds from now), for when no one else watches."""

    def __init__(self, channel, digest, rank: int, *, exit_code: int = ABORTED, deadline_s: float | None = None,
                 watchdog: "Watchdog | None" = None, on_abort: Callable[[str], None] | None = None):
        super().__init__(name=f"nnwizard-heartbeat-{rank}", daemon=True)
        self.channel, self.digest, self.rank = channel, digest, rank
        self.exit_code, self.watchdog = exit_code, watchdog
        self.deadline = time.monotonic() + deadline_s if deadline_s else None
        self.on_abort = on_abort
        self._stop_event = threading.Event()
        self.state = "running"

    def run(self) -> None:
        beats, sent = 0, -1
        while not self._stop_event.wait(BEAT_S):
            try:
                self.beat()
                beats += 1
                if beats % PARTIAL_EVERY == 0 and self.digest.events != sent:
                    sent = self.digest.events
                    self._partial()
                reason = self.channel.get("abort")
                if reason is None and self.watchdog is not None:
                    reason = self.watchdog.check()
                    if reason is not None:
                        self.watchdog.abort(reason)
                if reason is None and self.deadline is not None and time.monotonic() > self.deadline:
                    reason = {"kind": "deadline", "text": f"rank {self.rank} passed its hard time limit"}
                    self.channel.put("abort", reason)
                if reason is not None and self.state == "running":
                    self.aborted(reason)
                    return
            except Exception:  # noqa: BLE001 - the store may be gone at the very end: stop beating
                if self._stop_event.is_set():
                    return

    def beat(self) -> None:
        d = self.digest
        busy = dict(d.busy) if d.busy else None
        if busy is not None:
            busy["waited_s"] = round(d.now() - busy["since"], 2)
        self.channel.put(f"hb/{self.rank}", {"pid": os.getpid(), "state": self.state, "step": d.step_now(),
                                              "events": d.events, "busy": busy, "t": d.now()})

    def _partial(self) -> None:
        try:
            snap = self.digest.snapshot()
        except RuntimeError:   # (a list or dict the script's thread changed meanwhile: the next beat sends it)
            return
        self.channel.put(f"partial/{self.rank}", snap)

    def aborted(self, reason) -> None:
        """Send the stacks and the digest so far, then end the process (or run ``on_abort``)."""
        self.state = "aborted"
        try:
            self.channel.put(f"stack/{self.rank}", python_stacks())
            snap = self.digest.snapshot()
            snap["exit"] = "aborted"
            snap["abort"] = reason
            self.channel.put(f"digest/{self.rank}", snap)
            self.beat()
            # the others write their stacks too before anyone ends: a rank that ended first would release a peer from
            # the collective it waits in (a lost-peer error), and that peer's stack would no longer show where it was
            end = time.monotonic() + ANSWER_S / 2
            while time.monotonic() < end and any(self.channel.get(f"stack/{r}") is None for r in range(self.digest.world)):
                time.sleep(0.05)
        except Exception:  # noqa: BLE001 - the store is gone: nothing more to send
            pass
        if self.on_abort is not None:
            self.on_abort(reason)
        else:
            os._exit(self.exit_code)

    def finish(self) -> None:
        """The rank's run ended normally: one last heartbeat, then the thread stops."""
        self.state = "finished"
        try:
            self.beat()
        except Exception:  # noqa: BLE001
            pass
        self._stop_event.set()


class Watchdog:
    """Reads every rank's heartbeat; ``check()`` returns the reason to abort (a dict with ``kind`` and ``text``)
    or None. ``alive(rank)``, when given, says whether the rank's process still runs (the launcher knows)."""

    def __init__(self, channel, world: int, *, deadline_s: float | None = None, alive: Callable[[int], bool] | None = None,
                 stall_s: float = STALL_S, gone_s: float = GONE_S):
        self.channel, self.world = channel, world
        self.deadline = time.monotonic() + deadline_s if deadline_s else None
        self.alive = alive
        self.stall_s, self.gone_s = stall_s, gone_s
        self._events: dict[int, tuple[int, float]] = {}   # rank -> (events, when they last changed)
        self._seen: dict[int, tuple[float, float]] = {}   # rank -> (its clock in the last beat, when it changed)
        self.beats: dict[int, dict | None] = {}

    def _read(self) -> dict[int, dict | None]:
        beats = {r: self.channel.get(f"hb/{r}") for r in range(self.world)}
        now = time.monotonic()
        for r, b in beats.items():
            if b is None:
                continue
            events = b.get("events", 0)
            last = self._events.get(r)
            if last is None or last[0] != events:
                self._events[r] = (events, now)
            seen = self._seen.get(r)
            if seen is None or seen[0] != b.get("t"):
                self._seen[r] = (b.get("t"), now)
        self.beats = beats
        return beats

    def ended(self, r: int, beat: dict | None) -> str | None:
        """'finished' / 'aborted' / 'gone' for a rank that no longer runs the script, else None."""
        if beat is not None and beat.get("state") in ("finished", "aborted"):
            return beat["state"]
        if self.alive is not None and not self.alive(r):
            return "gone"
        seen = self._seen.get(r)
        if beat is not None and seen is not None and time.monotonic() - seen[1] > LOST_S:
            return "gone"
        return None

    def check(self) -> dict | None:
        beats = self._read()
        now = time.monotonic()
        ended = {r: self.ended(r, b) for r, b in beats.items()}
        waiting = {r: b["busy"] for r, b in beats.items() if b and b.get("busy") and not ended[r]}
        left = [r for r, e in ended.items() if e]
        for r, busy in waiting.items():
            if left and busy.get("waited_s", 0) > self.gone_s:
                others = ", ".join(f"rank {o} {ended[o]}" for o in left)
                return {"kind": "peer-gone", "rank": r, "busy": busy, "ended": {str(o): ended[o] for o in left},
                        "text": f"rank {r} waits in {busy['name']}" + (f" at {busy['where']}" if busy.get("where") else "")
                                + f" (step {busy.get('step')}, {busy.get('waited_s', 0):.0f} s) for a peer that will not "
                                  f"come: {others}"}
        stuck = {r: b for r, b in waiting.items() if b.get("waited_s", 0) > self.stall_s}
        if stuck:
            quiet = all(now - self._events.get(r, (0, now))[1] > self.stall_s
                        for r, b in beats.items() if b is not None and r not in stuck and not ended[r])
            if quiet:
                parts = [f"rank {r} in {b['name']}" + (f" at {b['where']}" if b.get("where") else "")
                         + f" since step {b.get('step')}" for r, b in sorted(stuck.items())]
                return {"kind": "stalled", "busy": {str(r): b for r, b in stuck.items()},
                        "text": f"no rank made progress for {self.stall_s:.0f} s: " + "; ".join(parts)}
        if self.deadline is not None and now > self.deadline:
            return {"kind": "deadline", "busy": {str(r): b for r, b in waiting.items()},
                    "text": "the run passed its time limit" + (": " + "; ".join(
                        f"rank {r} in {b['name']}" for r, b in sorted(waiting.items())) if waiting else "")}
        return None

    def abort(self, reason: dict) -> None:
        """Tell every rank to stop (the first reason written stands)."""
        if self.channel.get("abort") is None:
            self.channel.put("abort", reason)

    def answered(self) -> set[int]:
        return {r for r in range(self.world) if self.channel.get(f"stack/{r}") is not None
                or (self.channel.get(f"hb/{r}") or {}).get("state") == "finished"}
