"""What a probe is: the decorator that registers it, the context it gets, the result it returns; and the
listeners a probe module declares for the observed run of a script (``run_listener``).

Probes measure and never conclude: a probe returns a named *outcome* and the numbers behind it; the
YAML trees decide what an outcome means. Artifacts (plots, tables, image grids) are plain data that
the report layer renders, so no probe imports matplotlib or rich.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.target import Target

Status = Literal["passed", "failed", "errored", "skipped"]


# --------------------------------------------------------------------------------------- artifacts
@dataclass
class LinePlot:
    """One or more series against the step (or a given x)."""

    name: str
    title: str
    series: dict[str, list[float]]
    xlabel: str = "step"
    ylabel: str = "loss"
    x: list[float] | None = None
    logy: bool = False
    logx: bool = False
    marks: dict[str, float] = field(default_factory=dict)  # label -> x position of a vertical line
    xs: dict[str, list[float]] = field(default_factory=dict)  # a series' own x positions (instead of ``x``)
    kind: str = "line"


@dataclass
class BarPlot:
    name: str
    title: str
    labels: list[str]
    values: list[float]
    ylabel: str = ""
    logy: bool = False
    kind: str = "bar"


@dataclass
class ImageGrid:
    """Images as nested lists (H, W) or (H, W, 3), values in [0, 1], each with a caption."""

    name: str
    title: str
    images: list[Any]
    captions: list[str]
    kind: str = "images"


@dataclass
class Table:
    """A table for the report; rows whose index is in ``marked`` are flagged."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    marked: list[int] = field(default_factory=list)
    kind: str = "table"


Artifact = LinePlot | BarPlot | ImageGrid | Table


# ---------------------------------------------------------------------------------------- results
@dataclass
class ProbeResult:
    status: Status
    outcome: str
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    duration_s: float = 0.0
    id: str = ""
    params: dict[str, Any] = field(default_factory=dict)


def passed(summary: str, outcome: str = "ok", artifacts: list | None = None, **data: Any) -> ProbeResult:
    """Nothing wrong was measured."""
    return ProbeResult("passed", outcome, summary, data, list(artifacts or []))


def failed(outcome: str, summary: str, artifacts: list | None = None, **data: Any) -> ProbeResult:
    """A fault was measured; ``outcome`` names which one."""
    return ProbeResult("failed", outcome, summary, data, list(artifacts or []))


def skipped(summary: str, outcome: str = "skipped", **data: Any) -> ProbeResult:
    """The probe does not apply to this target (e.g. no user ``evaluate`` to audit): no evidence is
    missing, so it does not stop a verdict from being ``healthy``."""
    return ProbeResult("skipped", outcome, summary, data)


def cannot_run(summary: str, outcome: str = "skipped", *, reason: str = "precondition", **data: Any) -> ProbeResult:
    """The probe applies but could not measure (the user's code it needs raised, the data could not
    be read, it does not fit the time budget: ``reason`` says which, e.g. ``"raised"``, ``"budget"``).
    Status ``skipped``; it adds no evidence, and a session without findings is ``inconclusive``."""
    return ProbeResult("skipped", outcome, summary, {**data, "cannot_run": reason})


def moot_result(finding: str, confidence: float) -> ProbeResult:
    """The skipped result of a probe deliberately not run because ``finding`` is already confirmed: it
    would train with that fault in place. It adds no evidence (reason ``not-needed``)."""
    return cannot_run(f"not run: {finding} is already confirmed ({confidence:.2f}); this probe would train with "
                      f"that fault in place (fix it, then diagnose again)", reason="not-needed",
                      confirmed=finding, confidence=confidence)


def could_not_run(result: ProbeResult) -> bool:
    """True when ``result`` stands for a measurement that is missing: errored (raised or timed out)
    or skipped by ``cannot_run``."""
    return result.status == "errored" or (result.status == "skipped" and bool(result.data.get("cannot_run")))


# ---------------------------------------------------------------------------------------- context
@dataclass
class ProbeContext:
    """Everything a probe may use. ``results`` holds the probes already run in this session."""

    target: "Target"
    params: dict[str, Any] = field(default_factory=dict)
    results: dict[str, ProbeResult] = field(default_factory=dict)
    seed: int = 0
    deadline: float | None = None  # time.monotonic() value after which long loops should stop
    cap: float | None = None  # the latest deadline the probe's time limit allows
    on_progress: Callable[[float, str], None] | None = None
    budget: Any = None  # the session's nnwizard.budget.Budget (None: nothing measured, plan as asked)
    allowance_s: float | None = None  # seconds this probe may plan its steps within (None: no limit)
    plan: dict[str, Any] = field(default_factory=dict)  # what plan_steps decided, for the report
    lendable_s: float = 0.0  # seconds the budgeted probes still to come were to share when this one was allotted
    started: float = field(default_factory=lambda: time.monotonic())  # when the probe began (its steps are timed from here)
    # (finding, confidence) already confirmed when the probe started: a run the budget would cut is then not run
    moot: tuple[str, float] | None = None

    @property
    def device(self):
        return self.target.device

    def param(self, name: str, default: Any) -> Any:
        return self.params.get(name, default)

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def plan_steps(self, wanted: int, minimum: int = 1, cost: float = 1.0, runs: int = 1, fixed: float = 0.0) -> int:
        """Steps per run that fit this probe's allowance: ``wanted`` when they fit (always when the
        session measured no step time), fewer down to ``minimum``, 0 when even that does not fit.
        ``cost`` is one step in plain training steps, ``runs`` how many runs of that length the probe
        makes, ``fixed`` its other work in plain steps (evaluations, model copies)."""
        from nnwizard.budget import plan_steps

        steps = plan_steps(self.budget, self.allowance_s, wanted, minimum, cost, runs, fixed)
        if steps < wanted and minimum > 0 and self.moot is not None:
            # cut short beside a confirmed finding it could not add much to: not run (see ``unaffordable``)
            self.plan.update(wanted=wanted, planned=0, runs=runs, fits=steps)
            return 0
        if not steps and minimum > 0 and self.allowance_s is not None:
            # the minimum does not fit this probe's share: take it from what the session has left
            # (the probes after it then share less), so a needed check is not skipped while time remains
            need = (minimum * cost * runs + fixed) * self.budget.step_s
            if need <= self.budget.spare():
                self.allowance_s, steps = need, minimum
                self.plan["borrowed_s"] = round(need, 2)
                self.extend_deadline(need)
        self.plan.update(wanted=wanted, planned=steps, runs=runs)
        return steps

    def extend_deadline(self, need_s: float) -> None:
        """Move the safety-net deadline so that ``need_s`` more seconds of work fit (never past the probe's cap)."""
        end = max(self.deadline or 0.0, time.monotonic() + 1.25 * need_s + 3)
        self.deadline = end if self.cap is None else min(self.cap, end)

    def more_steps(self, done: int, planned: int, wanted: int, borrow: bool = False) -> bool:
        """Whether a run that ``plan_steps`` planned at ``planned`` of ``wanted`` steps takes another
        after ``done``. Within the plan, yes (the deadline is the safety net). Past it, up to
        ``wanted``, while the probe's own steps so far say one more fits its allowance: the plan
        priced a step at the session's calibration, and the probe's steps may be cheaper (a smaller
        slice, a less loaded moment). A probe whose cut run cannot conclude (``borrow``) may go on
        into up to ``LEND`` of what the probes still to come were to share, never into their
        ``floor`` (their smallest runs); they then plan from what is left."""
        from nnwizard.budget import LEND

        if done < planned:
            return True
        if done >= wanted or done == 0 or self.allowance_s is None:
            return False
        spent = time.monotonic() - self.started
        per_step = spent / done
        room = self.allowance_s + (LEND * self.lendable_s if borrow else 0.0)
        if spent + per_step > room or self.budget.spare() < per_step:
            return False
        if spent + per_step > self.allowance_s:  # borrowing: never what the probes still to come need at least
            if self.budget.spare() - per_step < self.budget.keep_s(self.budget.spare()):
                return False
        if self.deadline is not None and self.deadline - time.monotonic() < per_step + 1:
            end = time.monotonic() + per_step + 2  # the safety net moves with the measured steps, never past the cap
            if self.cap is not None and end > self.cap:
                return False
            self.deadline = end
        self.plan["extended_to"] = done + 1
        return True

    def unaffordable(self, minimum: int, what: str, **data: Any) -> "ProbeResult":
        """The skipped result of a probe whose ``minimum`` steps do not fit its allowance (or, with
        ``moot``, whose wanted steps do not: it is then not needed)."""
        if self.moot is not None and "fits" in self.plan:
            result = moot_result(*self.moot)
            result.summary += f"; the budget fits {self.plan['fits']} of its {self.plan['wanted']} steps"
            return result
        b = self.budget
        return cannot_run(f"{self.allowance_s or 0:.1f} s of the session budget ({b.total_s:.0f} s; --budget gives more) "
                       f"fit fewer than the {minimum} {what} at {b.step_s:.3g} s a step", **data, reason="budget")

    def progress(self, fraction: float, text: str = "") -> None:
        if self.on_progress is not None:
            self.on_progress(fraction, text)


# --------------------------------------------------------------------------------------- registry
@dataclass
class ProbeSpec:
    id: str
    func: Callable[[ProbeContext], ProbeResult]
    title: str
    outcomes: dict[str, str]  # outcome name -> what it means (the trees branch on these)
    timeout_s: float
    module: str
    share: float = 0.0  # of the session budget, for probes that plan their steps from it (0: fixed cost)
    cost: float = 1.0  # what the probe costs at its defaults, in plain training steps (sizes its limit)
    floor: float = 0.0  # a budgeted probe's smallest run, in plain steps: what a probe before it that borrows leaves it

    def __call__(self, ctx: ProbeContext) -> ProbeResult:
        return self.func(ctx)


_REGISTRY: dict[str, ProbeSpec] = {}
_LOADED = False
BUILTIN_OUTCOMES = {"errored": "the probe raised or timed out", "skipped": "the probe did not apply"}


def probe(id: str, *, title: str, outcomes: dict[str, str], timeout_s: float = 60.0, share: float = 0.0,
          cost: float = 1.0, floor: float = 0.0):
    """Register a probe. ``outcomes`` lists every outcome it may return (``ok`` for quiet). A probe
    whose work grows with the steps it trains takes a ``share`` of the session budget and plans its
    steps with ``ctx.plan_steps`` (and may declare the ``floor`` of its smallest run in plain steps);
    the others declare their ``cost`` in plain training steps."""

    def register(func: Callable[[ProbeContext], ProbeResult]) -> Callable[[ProbeContext], ProbeResult]:
        if id in _REGISTRY and _REGISTRY[id].func is not func:
            raise ValueError(f"probe {id!r} is registered twice ({_REGISTRY[id].module}, {func.__module__})")
        _REGISTRY[id] = ProbeSpec(id, func, title, {**outcomes, **BUILTIN_OUTCOMES}, timeout_s, func.__module__,
                                  share, cost, floor)
        return func

    return register


def load_all() -> dict[str, ProbeSpec]:
    """Import the built-in probe modules and every ``nnwizard.probes`` entry point."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import nnwizard.probes as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name != "api" and not info.name.startswith("_"):
                importlib.import_module(f"nnwizard.probes.{info.name}")
        for ep in entry_points(group="nnwizard.probes"):
            ep.load()
    return dict(_REGISTRY)


# ------------------------------------------------------------------------------- run listeners
@dataclass
class RunListenerSpec:
    """A listener a probe module declares for the observed run of a script: ``make()`` gives a fresh one per run
    (a recorder listener, see ``nnwizard.record.listeners``); ``close()``, when it has one, runs after the run."""

    name: str
    make: Callable[[], Any]
    module: str


_RUN_LISTENERS: dict[str, RunListenerSpec] = {}


def run_listener(name: str):
    """Register a listener class for the observed run of a script (script mode). It follows the run through the
    recorder's listener methods (``on_forward``, ``on_loss_args``, ``on_step_post``...) and stores what it measured
    in ``recording.listened[name]``, where the probe that reads it finds it."""

    def register(cls):
        if name in _RUN_LISTENERS and _RUN_LISTENERS[name].make is not cls:
            raise ValueError(f"run listener {name!r} is registered twice ({_RUN_LISTENERS[name].module}, {cls.__module__})")
        _RUN_LISTENERS[name] = RunListenerSpec(name, cls, cls.__module__)
        return cls

    return register


def run_listeners() -> list[RunListenerSpec]:
    """The run listeners the probe modules declare, in the order they were registered."""
    load_all()
    return list(_RUN_LISTENERS.values())


def registered(id: str) -> bool:
    """A probe of the registry (not work of the session's own run like one, e.g. the step timing)."""
    return id in _REGISTRY


def get(id: str) -> ProbeSpec:
    from nnwizard.errors import ProbeNotFound

    registry = load_all()
    if id not in registry:
        raise ProbeNotFound(f"unknown probe {id!r}; known probes: {', '.join(sorted(registry))}")
    return registry[id]
