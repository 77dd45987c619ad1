"""Every rank stops at the same optimizer step.

A rank that stopped alone (its own step budget, its own clock) would leave the others waiting in the next
step's gradient all-reduce for a peer that is gone: the run would end in a communication error or a hang
that the script does not have. So no rank stops on its own: the step budget is agreed through the shared
store before the script starts (the first rank to write it sets it; every rank reads the same value), and
a rank that reaches the time limit proposes to halt two steps later (the first proposal stands; a rank of
a data-parallel job is never more than one step ahead of another, because every backward waits for the
others). Each rank reads the agreed values after every optimizer step, a store round trip (about 20 us on
one machine), and raises :class:`~nnwizard.recorder.StopRun` when it reaches them.
"""

from __future__ import annotations

from nnwizard.recorder import StopRun

MARGIN = 2   # a rank past the time limit halts this many steps later: a peer may already be one step ahead


class StepAgreement:
    """A recorder listener; ``channel`` a :class:`~nnwizard.distributed.channel.Channel` shared by every rank."""

    def __init__(self, channel, rank: int, max_steps: int | None, time_limit_s: float | None):
        self.channel, self.rank = channel, rank
        self.time_limit_s = time_limit_s
        self.stop = channel.first("stop", max_steps) if max_steps else None
        self.halt: int | None = None
        self.proposed = False
        self.reason: str | None = None

    def on_step_post(self, rec, optimizer, step) -> None:
        n = rec.recording.total_steps
        if self.halt is None:
            halt = self.channel.get("halt")
            if halt is None and not self.proposed and self.time_limit_s is not None and rec.now() > self.time_limit_s:
                self.proposed = True
                halt = self.channel.first("halt", n + MARGIN)
                if halt == n + MARGIN:
                    self.channel.put("halt-by", {"rank": self.rank, "step": n, "seconds": round(rec.now(), 1)})
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
