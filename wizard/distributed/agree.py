"""Every rank stops at the same optimizer step.

A rank that stopped alone (its own step budget, its own clock) would leave the others waiting in the next
step's gradient all-reduce for a peer that is gone: the run would end in a communication error or a hang
that the script does not have. So no rank stops on its own: the step budget is agreed through the shared
store before the script starts (the first rank to write it sets it; every rank reads the same value), and
a rank that reaches the time limit proposes to halt ``MARGIN`` steps later (the first proposal stands). A rank
of a data-parallel job is never more than one step ahead of another (every backward waits for the others),
and each rank reads the store for a halt at least every ``POLL_STEPS`` steps (and every ``POLL_S`` seconds),
so every rank learns of it before it passes that step. A read is a round trip to the store's process (about
20 us on an idle machine, much more on a loaded one): hence not every step. A rank raises
:class:`~nnwizard.record.StopRun` when it reaches the agreed budget or the halt.
"""

from __future__ import annotations

from nnwizard.record import StopRun

POLL_STEPS = 8    # a rank reads the store for a halt at least this often (in steps) ...
POLL_S = 0.25     # ... and this often (in seconds)
MARGIN = POLL_STEPS + 2   # a halt comes this many steps after the step it was proposed at: every peer reads it before


class StepAgreement:
    """A recorder listener; ``channel`` a :class:`~nnwizard.distributed.channel.Channel` shared by every rank."""

    def __init__(self, channel, rank: int, max_steps: int | None, time_limit_s: float | None):
        self.channel, self.rank = channel, rank
        self.time_limit_s = time_limit_s
        self.stop = channel.first("stop", max_steps) if max_steps else None
        self.halt: int | None = None
        self.proposed = False
        self.reason: str | None = None
        self._polled = (0, -1.0)   # (step, seconds) of the last read of the store

    def on_step_post(self, rec, optimizer, step) -> None:
        n = rec.recording.total_steps
        now = rec.now()
        late = self.time_limit_s is not None and now > self.time_limit_s and not self.proposed
        if self.halt is None and (late or n - self._polled[0] >= POLL_STEPS or now - self._polled[1] >= POLL_S):
            self._polled = (n, now)
            halt = self.channel.get("halt")
            if halt is None and late:
                self.proposed = True
                halt = self.channel.first("halt", n + MARGIN)
                if halt == n + MARGIN:
                    self.channel.put("halt-by", {"rank": self.rank, "step": n, "seconds": round(now, 1)})
            if halt is not None:
                self.halt = int(halt)
        if self.stop is not None and n >= self.stop and (self.halt is None or self.stop <= self.halt):
            self._end(rec, f"the budget of {self.stop} optimizer steps, agreed by every rank, was reached")
        if self.halt is not None and n >= self.halt:
            by = self.channel.get("halt-by") or {}
            who = f"rank {by['rank']}" if "rank" in by else "a rank"
            limit = f"the time limit of {self.time_limit_s:.0f} s" if self.time_limit_s else "the time limit"
            self._end(rec, f"{limit} was reached on {who}; every rank halted at step {self.halt}")

    def _end(self, rec, reason: str) -> None:
        self.reason = reason
        rec.recording.stopped = reason
        raise StopRun(reason)
