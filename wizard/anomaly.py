"""Anomaly triggers of watch mode: decide, from the numbers of one optimizer step and the recent
history, whether this step is an event worth a replay bundle.

Defaults (each a fraction or multiple of the run's own recent values, so they hold for any loss and
any model; ``Triggers`` takes other values):

- ``nonfinite``   the loss or the global gradient norm is NaN/Inf (the first such step of the run).
- ``loss-spike``  with at least ``min_history`` finite losses in the window of the last ``window``
                  steps, the loss lies more than ``spike_ranges`` times the window's own range
                  (max - min) above the window's maximum, and more than ``spike_floor`` (10%) of the
                  run's starting level (the median of its first 5 losses) above it. Minibatch noise
                  stays inside the range the run has already shown; a divergence leaves it by several
                  widths at once. The floor keeps a converged run (loss 1e-3, a batch at 1e-2) quiet.
                  Also a *divergence*, whatever the window holds (a climb that widens its own range,
                  a jump in the first ``min_history`` steps): ``diverge_steps`` (3) losses in a row above
                  ``early_factor`` (30) times the first loss, within the first ``early_steps`` (10)
                  steps; or, later, above ``diverge_factor`` (100) times the starting level and 10 times
                  the largest of the first 5 losses. One hard batch never makes a row. Only for a run
                  with one optimizer (``Detector.solo``) and a positive start: the losses of several
                  objectives (a GAN's generator) may rise by design, and a signed loss (policy
                  gradients) has no scale at its start.
- ``grad-explosion`` the global gradient norm exceeds ``explode_factor`` times the window's median,
                  twice its maximum (a norm that has grown steadily does not count; a jump does) and
                  the run's starting level (the median of its first 5 norms): in a converged run a hard
                  batch's gradient is many times the tiny median and still small.
- ``stalled``     the loss has not moved (|change| <= 1e-7 of its size) for ``stall_steps``
                  consecutive steps, or the gradient norm was exactly zero for all of them.

Each kind fires once per run by default (``repeat=False``): the first event is the one to replay;
the steps after it are consequences. After a ``loss-spike`` or ``grad-explosion`` the window keeps
the spike out, so a run that recovers is not flagged again for the same level.

Fast path (watch mode, every step): :meth:`Detector.quick` is one chained comparison of the loss
(and of the gradient norm on the steps it was measured) with bounds set at the last full
:meth:`Detector.check`; a value inside them is queued and folded into the windows at the next full
check, outside them (NaN, Inf, a possible spike or explosion) the caller runs the full check at
this very step. The bounds are conservative for the next ``gap`` steps: the loss bound is the spike
limit of the newest ``window - gap + 1`` losses only, which every later window of the next ``gap``
steps contains, so its maximum and range, and so its limit, can only be larger; the norm bound is
twice the newest norms' maximum (an explosion needs twice the window's maximum). So
``nonfinite``, ``loss-spike`` and ``grad-explosion`` fire at exactly the step the per-step check
would fire at; only ``stalled`` is decided at the next full check (at most ``gap`` steps late).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Triggers:
    window: int = 50
    min_history: int = 20
    spike_ranges: float = 3.0
    spike_floor: float = 0.1
    diverge_factor: float = 100.0
    early_factor: float = 30.0
    early_steps: int = 10
    diverge_steps: int = 3
    explode_factor: float = 10.0
    stall_steps: int = 100
    repeat: bool = False
    enabled: tuple[str, ...] = ("nonfinite", "loss-spike", "grad-explosion", "stalled")


@dataclass
class Anomaly:
    kind: str
    step: int
    reason: str
    loss: float
    grad_norm: float | None


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


@dataclass
class Detector:
    """Feeds on (step, loss, grad_norm) once per optimizer step; returns an Anomaly or None."""

    triggers: Triggers = field(default_factory=Triggers)
    losses: deque = field(default_factory=deque)
    norms: deque = field(default_factory=deque)
    fired: set = field(default_factory=set)
    _still: int = 0
    _zero: int = 0               # steps since the first of a run of measured norms that were all exactly 0
    _zero_since: int | None = None
    _last: float | None = None
    _first: list = field(default_factory=list)
    _first_level: float = math.nan   # median of the first 5 losses (computed once they are in)
    _first_norms: list = field(default_factory=list)
    gap: int = 10                 # at most this many steps between two full checks (quick() says so then)
    _queue: list = field(default_factory=list)   # (step, loss, norm, ...) that passed quick(), not folded in yet
    _lo: float = math.inf         # quick(): a loss passes when _lo < loss <= _hi (inf/-inf: nothing passes yet)
    _hi: float = -math.inf
    _nhi: float = -math.inf       # quick(): a measured gradient norm passes when norm <= _nhi
    solo: bool = True             # the run's only optimizer (watch clears it when a second one steps)
    seen: int = 0                 # steps fed by watch (its per-optimizer line cadence)
    _fed: int = 0                 # finite losses fed (checked or queued)
    _above: int = 0               # of them, the latest in a row above the divergence limit

    def quick(self, step: int, loss: float | None, grad_norm: float | None) -> bool:
        """True when no trigger but ``stalled`` can fire at this step (the values are queued for the
        next :meth:`check`); False: call :meth:`check` now. See the module docstring. (``Watch.on_step_pre``
        runs the same comparison inline: a change here goes there too.)"""
        if loss is None or not self._lo < loss <= self._hi or (grad_norm is not None and not grad_norm <= self._nhi) \
                or len(self._queue) >= self.gap - 1:
            return False
        self._queue.append((step, loss, grad_norm))
        return True

    def _absorb(self) -> None:
        """Fold the queued values into the windows, as check() would have at their steps (none of them
        could fire: finite, below the spike limit and the explosion bound; the starting levels are
        known, see _bounds)."""
        queue, self._queue = self._queue, []
        losses = [q[1] for q in queue]
        # the stall count: the run of unchanged losses at the queue's end (continuing the count before when the
        # whole queue is unchanged), found from the end: a moving loss stops the search at once
        i, before = len(losses) - 1, self._last
        while i >= 0:
            loss, last = losses[i], losses[i - 1] if i else before
            if last is None or abs(loss - last) > 1e-7 * max(abs(loss), abs(last), 1e-12):
                break
            i -= 1
        run = len(losses) - 1 - i
        self._still = self._still + run if i < 0 else run
        self._last = losses[-1]
        measured = [q for q in queue if q[2] is not None]
        if measured:
            if measured[-1][2] != 0.0:  # (the run of zero norms is over)
                self._zero_since = None
            else:
                zero_since = self._zero_since
                for q in measured:
                    zero_since = (zero_since or q[0]) if q[2] == 0.0 else None
                self._zero_since = zero_since
            self.norms.extend([q[2] for q in measured])
        self._fed += len(queue)
        self._above = 0    # (a queued loss was below quick()'s bound, so below the divergence limit)
        self.losses.extend(losses)
        while len(self.losses) > self.triggers.window:
            self.losses.popleft()
        while len(self.norms) > self.triggers.window:
            self.norms.popleft()

    def __post_init__(self) -> None:  # the windows drop their oldest value themselves
        self.losses = deque(self.losses, maxlen=self.triggers.window)
        self.norms = deque(self.norms, maxlen=self.triggers.window)

    def _bounds(self) -> None:
        """quick()'s bounds for the next ``gap`` steps (see the module docstring)."""
        t = self.triggers
        keep = t.window - max(self.gap, 1) + 1
        self._lo, self._hi, self._nhi = -math.inf, -math.inf, -math.inf
        if len(self._first) < 5 or len(self._first_norms) < 5 or keep < 1 or self._fed <= t.early_steps:
            return  # the starting levels are not known yet (or the early divergence limit holds): every step in full
        spike_on = "loss-spike" in t.enabled and ("loss-spike" not in self.fired or t.repeat)
        if not spike_on:
            self._hi = sys.float_info.max
        elif self.losses:
            newest = list(self.losses)[-keep:]
            hi, lo = max(newest), min(newest)
            limit = max(hi + t.spike_ranges * (hi - lo), hi + t.spike_floor * self._first_level)
            self._hi = min(limit, self._diverge_limit())
        explode_on = "grad-explosion" in t.enabled and ("grad-explosion" not in self.fired or t.repeat)
        if not explode_on:
            self._nhi = sys.float_info.max
        elif self.norms:
            self._nhi = 2 * max(list(self.norms)[-keep:])

    def _diverge_limit(self) -> float:
        """The loss above which a one-optimizer run has left its starting level (inf: no limit)."""
        t, first = self.triggers, self._first
        if not self.solo or not first or not first[0] > 0:
            return math.inf
        if self._fed <= t.early_steps:
            return t.early_factor * first[0]
        if len(first) < 5 or not self._first_level > 0 or min(first) <= 0:
            return math.inf
        return max(t.diverge_factor * self._first_level, 10 * max(first))

    def _fire(self, kind: str) -> bool:
        if kind not in self.triggers.enabled or (kind in self.fired and not self.triggers.repeat):
            return False
        self.fired.add(kind)
        return True

    def check(self, step: int, loss: float | None, grad_norm: float | None) -> Anomaly | None:
        if self._queue:
            self._absorb()
        found = self._check(step, loss, grad_norm)
        self._bounds()
        return found

    def _check(self, step: int, loss: float | None, grad_norm: float | None) -> Anomaly | None:
        t = self.triggers
        found: Anomaly | None = None
        lv = loss if loss is not None else math.nan
        if (loss is not None and not _finite(loss)) or (grad_norm is not None and not _finite(grad_norm)):
            what = "loss" if loss is not None and not _finite(loss) else "gradient norm"
            value = loss if what == "loss" else grad_norm
            if self._fire("nonfinite"):
                found = Anomaly("nonfinite", step, f"{what} is {value} at step {step}", lv, grad_norm)
            return found  # a non-finite value never enters the windows
        spike = explode = False
        if loss is not None and len(self._first) < 5:
            self._first.append(loss)
            self._first_level = abs(statistics.median(self._first))
        if loss is not None and len(self.losses) >= t.min_history:
            hi, lo = max(self.losses), min(self.losses)
            limit = max(hi + t.spike_ranges * (hi - lo), hi + t.spike_floor * self._first_level)
            if loss > limit and hi > lo:
                spike = True
                if self._fire("loss-spike"):
                    found = Anomaly("loss-spike", step, f"loss {loss:.4g} at step {step} is {(loss - hi) / (hi - lo):.1f}x "
                                    f"the recent range above the last {len(self.losses)} steps' maximum {hi:.4g} "
                                    f"(range {lo:.4g}..{hi:.4g})", lv, grad_norm)
        if loss is not None:
            self._fed += 1
            self._above = self._above + 1 if not spike and loss > self._diverge_limit() else 0
            if self._above >= t.diverge_steps and self._fire("loss-spike"):
                spike = True
                found = Anomaly("loss-spike", step, f"loss {loss:.4g} at step {step} is {loss / self._first[0]:.0f}x the "
                                f"run's first loss {self._first[0]:.4g}, {self._above} steps in a row above "
                                f"{self._diverge_limit():.4g}: the run has diverged from its start", lv, grad_norm)
        if grad_norm is not None and len(self._first_norms) < 5:
            self._first_norms.append(grad_norm)
        if found is None and grad_norm is not None and len(self.norms) >= t.min_history:
            hi = max(self.norms)   # (twice the maximum first: the medians' sorts only for a norm above it, rarely)
            med = statistics.median(self.norms) if grad_norm > 2 * hi else 0.0
            if med > 0 and grad_norm > t.explode_factor * med and grad_norm > statistics.median(self._first_norms):
                explode = True
                if self._fire("grad-explosion"):
                    found = Anomaly("grad-explosion", step, f"gradient norm {grad_norm:.4g} at step {step} is "
                                    f"{grad_norm / med:.1f}x the median {med:.4g} of the last {len(self.norms)} measured steps "
                                    f"(max {hi:.4g})", lv, grad_norm)
        # stalled: the loss does not move, or no gradient reaches the parameters
        if loss is not None:
            still = self._last is not None and abs(loss - self._last) <= 1e-7 * max(abs(loss), abs(self._last), 1e-12)
            self._still = self._still + 1 if still else 0
            self._last = loss
        if grad_norm is not None:  # a step without a measured norm (watch samples it) keeps the run going
            self._zero_since = (self._zero_since or step) if grad_norm == 0.0 else None
        self._zero = step - self._zero_since + 1 if self._zero_since is not None else 0
        if found is None and max(self._still, self._zero) >= t.stall_steps and self._fire("stalled"):
            why = (f"the loss has stayed at {loss:.6g} for {self._still} steps" if self._still >= t.stall_steps
                   else f"the gradient norm has been exactly 0 for {self._zero} steps")
            found = Anomaly("stalled", step, why, lv, grad_norm)
        if loss is not None and not spike:
            self.losses.append(loss)
            while len(self.losses) > t.window:
                self.losses.popleft()
        if grad_norm is not None and not explode:
            self.norms.append(grad_norm)
            while len(self.norms) > t.window:
                self.norms.popleft()
        return found
