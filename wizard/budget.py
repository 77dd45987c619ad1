"""The session's cost model: what one plain training step of the user's model costs, and how much
of the session's time each probe may spend.

``calibrate`` times the user's own step (forward, backward, optimizer step; synchronised on CUDA) on
a fresh model at the batch the probes will use, or takes ``measured_step_s`` from a target that ran
the real program. When a step at the user's batch is too dear to afford the few hundred steps a
diagnosis of a small model takes, the probes work on the first ``SLICE`` samples of each batch (or
``SMALL_SLICE`` when that is still too dear), and the step time of that slice is measured too.

The session has one budget in seconds (``--budget``; by default ``max(20 s, 40 plain steps)`` less a
fifth for loading and reporting; in script mode at least the plain steps of the reruns a stuck curve calls for,
each with the script's start-up: ``ScriptTarget.default_plain_steps``). Fixed-cost probes (the loop audits: a handful of steps each) run
first and get a time limit sized by their own declared cost. Probes that train for many steps plan
their step counts with ``plan_steps`` from an allowance ``allot`` gives them out of what is left,
where the engine keeps, for the probes of the session's queued trees that are still to run:

- the fixed-cost ones' declared cost in measured steps (``fixed``), so an audit queued later is never
  starved, however dear a step is;
- the budgeted ones' ``floor`` (their smallest run, ``floors``), so an early probe cannot take what a
  later one needs at least (a floor that cannot fit what is left anyway is not kept);
- while a probe that measures symptoms is still to run, the ``future`` share of the trees one measured
  symptom may queue, so that the probes known now do not take the budget those trees will need.

What is left beyond that is shared in proportion to the shares. One whose minimum does not fit is
skipped and says so; under nnwizard's own budget (no ``--budget``) a floor still runs while the session is
short of ``CEILING`` times its budget (``Budget.stretch``: fixed costs the step time does not price can spend it
early). A run may go past its plan while its own measured steps still fit its allowance
(``ProbeContext.more_steps``), and one whose cut run cannot conclude may borrow up to ``LEND`` of what
the probes after it (known, and those a measured symptom may queue) were to share above their floors,
never their floors.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

SLICE = 16            # samples per batch for the probes when the user's batch is too dear ...
SMALL_SLICE = 8       # ... and when even that slice is too dear
DEFAULT_MIN_S = 20.0  # the default budget: max(DEFAULT_MIN_S, DEFAULT_STEPS plain steps) ...
DEFAULT_STEPS = 40
DEFAULT_SHARE = 0.8   # ... of which this part is for the probes (the rest: start-up, loading, reports)
SCRIPT_MAX_S = 180.0  # a script's reruns raise its default budget up to this (4 s steps on a loaded CPU: not 14 minutes)
AFFORD_STEPS = 300    # a budget below this many plain steps at the user's batch makes the probes slice
CEILING = 2.0         # past this multiple of the budget, nothing more runs the user's code
LIMIT_MARGIN = 3.0    # a fixed-cost probe's time limit: this many times its cost in measured steps ...
LIMIT_FLOOR_S = 10.0  # ... plus this (building models, reading batches)
LEND = 0.5            # of what the probes still to come were to share, a probe whose cut run cannot conclude may take
CALIBRATION_S = 0.5   # the step time is the median of the steps timed within this (at least two, the first a warm-up)
CALIBRATION_STEPS = 8


@dataclass
class Budget:
    total_s: float
    step_s: float | None = None        # one plain step at the batch the probes use
    user_step_s: float | None = None   # one plain step at the user's own batch
    batch: int | None = None           # samples per batch the probes use (None: the user's batches)
    user_batch: int | None = None
    how: str = "not measured"
    explicit: bool = False             # --budget was given
    started: float = field(default_factory=time.monotonic)
    timeouts: int = 0
    pending: dict[str, float] = field(default_factory=dict)  # shares of the budgeted probes still to come
    floors: dict[str, float] = field(default_factory=dict)   # their smallest runs, in steps (ProbeSpec.floor)
    fixed: dict[str, float] = field(default_factory=dict)    # declared costs of the fixed-cost probes still to come
    future: float = 0.0  # the share of the trees a measured symptom may still queue (0 once nothing measures one)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @contextmanager
    def paused(self):
        """Time spent inside (waiting for the user's answer at a prompt) is not spent on the diagnosis."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.started += time.monotonic() - t0

    def remaining(self) -> float:
        return self.total_s - self.elapsed()

    def reserve_s(self) -> float:
        """Seconds the fixed-cost probes still to come cost by their declared cost in measured steps."""
        return sum(self.fixed.values()) * (self.step_s or 0.0)

    def spare(self) -> float:
        """Seconds left beyond what the fixed-cost probes still to come cost."""
        return self.remaining() - self.reserve_s()

    def stretch(self, need_s: float) -> bool:
        """Whether a run a conclusion needs may take ``need_s`` seconds past the budget: only under nnwizard's own
        default (``--budget`` makes the limit firm), and only while the session stays short of CEILING times it."""
        return not self.explicit and self.elapsed() + need_s <= CEILING * self.total_s

    def keep_s(self, within: float, exclude: str = "") -> float:
        """Seconds the smallest runs of the budgeted probes still to come (but ``exclude``) need, in
        queue order, each one only while the floors so far fit ``within``: a floor that cannot fit
        what is left is not kept (that probe will say it did not fit), so it starves no one."""
        step, kept = self.step_s or 0.0, 0.0
        for probe_id in self.pending:
            need = self.floors.get(probe_id, 0.0) * step
            if probe_id != exclude and kept + need <= within:
                kept += need
        return kept

    def plain_steps(self, seconds: float) -> float | None:
        """``seconds`` in plain steps of the user's batch."""
        step = self.user_step_s or self.step_s
        return seconds / step if step else None

    def allot(self, share: float, cost: float, timeout_s: float, probe_timeout: float | None = None,
              probe_id: str = "", floor: float = 0.0) -> tuple[float | None, float, str | None, float]:
        """(allowance in seconds or None, time limit, reason to skip or None, seconds it may borrow)
        for one probe. A budgeted probe gets its ``floor`` (its smallest run, in steps) where that
        fits beside the floors of the budgeted probes still to come, and its part of the rest in
        proportion to the shares of those probes and of the trees a measured symptom may still queue.
        What it may borrow is what those were to share above their floors."""
        step = self.step_s or 0.0
        lendable = 0.0
        if self.elapsed() > CEILING * self.total_s:
            return None, 0.0, (f"the session is past {CEILING:.0f}x its budget of {self.total_s:.0f} s "
                               f"({self.elapsed():.0f} s spent): not run"), lendable
        if share > 0:
            # what is left may be nothing: the probe then plans 0 steps and says what it could not do
            left = max(0.0, self.spare())
            own = min(floor * step, left)
            if own < floor * step and self.stretch(floor * step):
                # nnwizard's own budget is spent (fixed costs a step time does not price: building a large
                # model again, a GPU's launch-bound steps): a smallest run still goes ahead, since a verdict
                # needs it and it costs a few steps
                own = floor * step
            keep = self.keep_s(left - own, exclude=probe_id)
            others = sum(s for p, s in self.pending.items() if p != probe_id)
            ahead = share + others + self.future
            self.pending.pop(probe_id, None)
            surplus = max(0.0, left - own - keep)
            allowance = own + surplus * share / ahead
            # what it may borrow: the parts of the known probes after it and of the trees a measured symptom
            # may queue (those run only if the symptom is measured; a needed conclusion comes first)
            lendable = surplus * (others + self.future) / ahead
            limit = max(timeout_s, 2 * allowance + LIMIT_FLOOR_S + 6 * step)
        else:
            allowance = None
            # sized by the probe's own cost; after a time-out no more than that (no generous floor),
            # so that user code that hangs costs each later probe its own need, not the default limit
            need = LIMIT_MARGIN * cost * step + LIMIT_FLOOR_S
            limit = need if self.timeouts else max(timeout_s, need)
        if probe_timeout is not None:
            limit = probe_timeout
            allowance = None if allowance is None else min(allowance, 0.8 * probe_timeout)
        return allowance, limit, None, lendable

    def grace_s(self) -> float:
        """How long a cancelled probe may take to leave the native op it is in."""
        return min(30.0, max(1.0, 2 * (self.step_s or 0.0)))

    def describe(self) -> str:
        if self.step_s is None:
            return f"budget {self.total_s:.0f} s (step time {self.how})"
        text = f"budget {self.total_s:.0f} s; a plain step takes {_s(self.user_step_s or self.step_s)}"
        if self.user_batch:
            text += f" at batch {self.user_batch}"
        if self.batch and self.batch != self.user_batch:
            text += f", probes use {self.batch}-sample slices ({_s(self.step_s)} a step)"
        return f"{text} ({self.how})"

    def as_dict(self) -> dict[str, Any]:
        return dict(total_s=round(self.total_s, 2), step_s=_r(self.step_s), user_step_s=_r(self.user_step_s),
                    batch=self.batch, user_batch=self.user_batch, how=self.how, explicit=self.explicit,
                    elapsed_s=round(self.elapsed(), 2),
                    plain_steps_used=_r(self.plain_steps(self.elapsed())), timeouts=self.timeouts)


def paused(budget: Budget | None):
    """``budget.paused()``, or nothing to pause when the session has no budget."""
    return budget.paused() if budget is not None else nullcontext()


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 5)


def plan_steps(budget: Budget | None, allowance: float | None, wanted: int, minimum: int = 1, cost: float = 1.0,
               runs: int = 1, fixed: float = 0.0) -> int:
    """Steps per run that fit ``allowance`` seconds (see ProbeContext.plan_steps)."""
    if budget is None or not budget.step_s or allowance is None:
        return wanted
    affordable = math.floor((allowance / budget.step_s - fixed) / max(cost * runs, 1e-9))
    if affordable >= wanted:
        return wanted
    return affordable if affordable >= minimum else 0


def default_total(user_step_s: float | None, plain_steps: float | None = None) -> float:
    """The default budget: max(DEFAULT_MIN_S, DEFAULT_STEPS of the user's step) less the part kept for start-up,
    loading and reports; for a script, at least ``plain_steps`` of its step (ScriptTarget.default_plain_steps:
    the reruns a stuck curve calls for, each with the script's own start-up already counted), up to SCRIPT_MAX_S."""
    total = DEFAULT_SHARE * max(DEFAULT_MIN_S, DEFAULT_STEPS * (user_step_s or 0.0))
    return max(total, min(SCRIPT_MAX_S, (plain_steps or 0.0) * (user_step_s or 0.0)))


def _timed_steps(target, batch, give_up_s: float) -> float:
    """Seconds of one plain step on a fresh model: the median of the steps after the first (a
    warm-up) among those that fit ``CALIBRATION_S`` (two at least, ``CALIBRATION_STEPS`` at most), so
    that one step slowed by a loaded moment does not misprice every probe; the first alone if it took
    longer than ``give_up_s``."""
    model = target.fresh_model(0)
    optimizer = target.make_optimizer(model)
    cuda = target.device.type == "cuda"
    times: list[float] = []
    while len(times) < CALIBRATION_STEPS:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        target.train_step(model, batch, optimizer)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if times[-1] > give_up_s or (len(times) >= 2 and sum(times) > CALIBRATION_S):
            break
    return statistics.median(times[1:]) if len(times) > 1 else times[0]


def _import_optimizer_machinery() -> None:
    """Build a throwaway optimizer before the session's clock starts. torch imports ``torch._dynamo``
    when a process builds its first optimizer (``add_param_group``), seconds on a slow machine; the
    user's own training pays it once too. That is process start-up, like importing torch, not work
    of any probe (3.5 s on the shared 2-core machine at load 7, where a 3k-parameter CNN step took 0.18 s)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)


def _samples(y: Any) -> int | None:
    """Samples in a batch's target: a 0-d tensor (one sample's scalar target) is one."""
    if isinstance(y, torch.Tensor):
        return len(y) if y.dim() else 1
    return len(y) if hasattr(y, "__len__") else None


def calibrate(target, total_s: float | None = None, limit_s: float = 60.0) -> Budget:
    """The session's Budget, from ``target.measured_step_s`` or by timing the user's step (isolated:
    a step that raises or hangs leaves the step time unmeasured or a lower bound)."""
    from nnwizard.isolation import run_probe
    from nnwizard.probes.api import BUILTIN_OUTCOMES, ProbeContext, ProbeResult, ProbeSpec

    _import_optimizer_machinery()
    budget = Budget(total_s=total_s or 0.0, explicit=total_s is not None)
    batch = target.batch()
    budget.user_batch = _samples(batch[1]) if batch is not None else None
    measured = getattr(target, "measured_step_s", None)
    if measured:
        budget.user_step_s = budget.step_s = float(measured)
        budget.how = "measured in the real run"
    elif batch is not None:
        def work(ctx):
            out = {"user": _timed_steps(target, batch, limit_s / 4)}
            total = total_s or default_total(out["user"])
            if budget.user_batch and budget.user_batch > SLICE and out["user"] * AFFORD_STEPS > total:
                # a 16-sample step is not timed when even its share of the user's step is twice too dear
                if out["user"] * SLICE / budget.user_batch * AFFORD_STEPS <= 2 * total:
                    small = (batch[0][:SLICE], batch[1][:SLICE])
                    out["slice"] = _timed_steps(target, small, limit_s / 8)
                if out.get("slice", math.inf) * AFFORD_STEPS > total:
                    smaller = (batch[0][:SMALL_SLICE], batch[1][:SMALL_SLICE])
                    out["small"] = _timed_steps(target, smaller, limit_s / 8)
            return ProbeResult("passed", "ok", "timed", out)

        spec = ProbeSpec("step-cost", work, "timed one plain training step", {"ok": "timed", **BUILTIN_OUTCOMES}, limit_s, __name__)
        result = run_probe(spec, ProbeContext(target), limit_s)
        if result.status == "passed":
            budget.user_step_s = budget.step_s = result.data["user"]
            budget.how = "timed on the user's step"
            for key, size in (("slice", SLICE), ("small", SMALL_SLICE)):
                small = result.data.get(key)
                if small is not None and small < 0.8 * budget.step_s:  # a slice only where it is really cheaper
                    budget.step_s, budget.batch = small, size
        elif "timeout_s" in result.data:
            budget.user_step_s = budget.step_s = limit_s / 2  # a lower bound: two steps did not fit
            budget.how = f"the user's step did not finish two calls in {limit_s:.0f} s"
        else:
            budget.how = f"the user's step raised ({result.summary[:120]})"
    if total_s is None:
        budget.total_s = default_total(budget.user_step_s, getattr(target, "default_plain_steps", None))
    return budget
