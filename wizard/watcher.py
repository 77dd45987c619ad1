"""Watch mode (CONTRACT §7): the recorder, always on and cheap, over the user's real run.

``with nnwizard.watch(model, optimizer):`` around the user's own loop, or ``nnwizard watch --script
train.py`` (``watch_cmd``), both feed one :class:`Watch`, a listener of the shared recorder
(``nnwizard.record``, light mode). Per optimizer step it reads the loss (the tensor ``backward()``
ran on) and the global gradient norm the recorder measured (on the steps its interval picks, always
on the logged ones), and runs the anomaly triggers (``nnwizard.anomaly``); every ``every`` steps (and at each anomaly) it also measures the largest
per-layer gradient norms and the update/weight ratio, and writes one JSON line to
``DIR/watch.jsonl`` (and TensorBoard scalars under ``DIR/tensorboard`` when ``tensorboard`` is
installed). At an anomaly it saves ``DIR/anomaly-step<N>/`` (``nnwizard.bundle``) *inside* the
step, before the optimizer changed anything, prints its path in one line and goes on or stops.

Watch also keeps, on the models the recorder found, each model call's arguments, keyword arguments
and output (the batch as the model got it, for re-executing the step): ``nnwizard.record.calls``'s
CallKeeper, at no cost to torch's hook-free path. The checks run in the recorder's ``on_step_pre``,
which for a ``step(closure)`` (Lightning, LBFGS) comes inside the closure after its first call, so
after its backward and before the update.

Per step (the fast path) watch stores references and one history tuple and asks the detector's
one comparison (``Detector.quick``); the full trigger statistics, the per-layer norms, the
update/weight ratio and the JSON line run only on logged steps (every ``every``), on the steps
quick() flags (a NaN/Inf loss or norm, a value past the conservative spike/explosion bounds) and
at least every ``Detector.gap`` steps.

Steps are numbered as the recorder numbers them: 1 for the first ``optimizer.step()``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnwizard.anomaly import Anomaly, Detector, Triggers
from nnwizard.bundle import jsonable, rng_state, save_bundle
from nnwizard.record import StopRun, cpu_copy, total_norm
from nnwizard.record.calls import CallKeeper, compiled_inner

DEFAULT_OUT = "nnwizard-watch"
DEFAULT_EVERY = 10
HISTORY = 500  # covers the triggers' window of 50 measured gradient norms at the longest interval (10)
TOP_LAYERS = 3
UPDATE_SHARE = 0.005  # the update/weight ratio may cost this share of the steps since it was last measured
LOG_SHARE = 0.01  # every=None: a logged step's extra work may cost this share of the steps between two lines
LOG_EVERY_MAX = 10  # every=None: lines at most this many times DEFAULT_EVERY apart
FLUSH_S = 1.0  # watch.jsonl is flushed at most this often (and at every anomaly and at the end)


_VIEWS = ("ViewBackward", "ReshapeAliasBackward", "UnsafeViewBackward", "SqueezeBackward", "UnsqueezeBackward",
          "ToCopyBackward", "CloneBackward", "AliasBackward", "ExpandBackward")


def _path_to(container: Any, x: torch.Tensor, depth: int = 0) -> list | None:
    """Keys/indices leading from a model output to ``x`` (or to the tensor ``x`` is a reshape/cast of)."""
    if isinstance(container, torch.Tensor):
        if container is x:
            return []
        # (the output number too: a graph torch.compile made is one autograd node for all of its outputs)
        node, nr, seen = x.grad_fn, x.output_nr, 0
        while node is not None and seen < 8 and container.grad_fn is not None:
            if node is container.grad_fn and nr == container.output_nr:
                return []
            if not type(node).__name__.startswith(_VIEWS):
                break
            nxt = [(fn, n) for fn, n in node.next_functions if fn is not None]
            (node, nr), seen = (nxt[0] if len(nxt) == 1 else (None, 0)), seen + 1
        if container.numel() == x.numel() and container.numel() and \
                container.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            return []
        return None
    if depth > 3:
        return None
    items = container.items() if isinstance(container, dict) else enumerate(container) if isinstance(container, (list, tuple)) else ()
    for key, value in items:
        found = _path_to(value, x, depth + 1)
        if found is not None:
            return [key, *found]
    return None


def _scale_of(t: torch.Tensor, value: torch.Tensor) -> float | None:
    """``t`` is ``value`` (1.0) or ``value`` times/divided by a constant (that factor), else None."""
    if t is value:
        return 1.0
    node = t.grad_fn
    if node is None or value.grad_fn is None or not type(node).__name__.startswith(("DivBackward", "MulBackward")):
        return None
    if any(fn is value.grad_fn for fn, _ in node.next_functions):
        v, tv = float(value.detach()), float(t.detach())
        if math.isfinite(v) and math.isfinite(tv) and v != 0:
            return tv / v
        # a non-finite loss: read the constant off the graph node (loss / k, loss * k)
        for name in ("_saved_other", "_saved_self"):
            try:
                c = getattr(node, name, None)
            except RuntimeError:  # saved tensors freed by a backward already run
                c = None
            c = float(c) if isinstance(c, torch.Tensor) and c.numel() == 1 and not c.requires_grad else \
                float(c) if isinstance(c, (int, float)) else None
            if c is not None and math.isfinite(c) and c != 0:
                return 1.0 / c if type(node).__name__.startswith("DivBackward") else c
        return None
    return None


def _loss_slots(out: Any) -> list[tuple[Any, torch.Tensor]]:
    """Where a model output may carry its own loss: ``out.loss`` / ``out["loss"]`` (Hugging Face), ``out[0]``."""
    slots = []
    value = getattr(out, "loss", None) if not isinstance(out, dict) else out.get("loss")
    if isinstance(value, torch.Tensor):
        slots.append(("loss", value))
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        slots.append((0, out[0]))
    return slots


def _loss_parts(loss: tuple) -> dict:
    """A loss call as watch keeps it per step, (fn, args, kwargs, value), split into its parts."""
    fn, args, kwargs, value = loss
    return {"fn": fn, "x": args[0] if args else kwargs.get("input"),
            "target": args[1] if len(args) > 1 else kwargs.get("target"), "extra": tuple(args[2:]),
            "kwargs": {k: v for k, v in kwargs.items() if k not in ("input", "target")}, "value": value}


_grad_enabled = torch.is_grad_enabled          # (one lookup less per call: these run every step)
_Tensor = torch.Tensor


def _total_norm(tensors: list[torch.Tensor]) -> float:
    return total_norm(torch._foreach_norm(tensors))


def _update_ratio(before: list[torch.Tensor], after: list[torch.Tensor]) -> float | None:
    """``||after - before|| / ||before||`` over all the tensors (``before`` is overwritten)."""
    wn = _total_norm(before)
    torch._foreach_sub_(before, after)  # in place: before - after
    dn = _total_norm(before)
    return dn / wn if wn > 0 else None


def _copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each tensor: one ``torch._foreach_clone`` where this torch has it (new in 2026), else a
    clone each."""
    clone = getattr(torch, "_foreach_clone", None)
    return clone(tensors) if clone is not None else [t.clone() for t in tensors]


def _no_grad(fn, *args):
    """``fn(*args)`` with autograd off: ``torch.no_grad()`` without its context manager's Python frames
    (about 12k instructions a time under callgrind; this runs on the logged steps)."""
    was = _grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        return fn(*args)
    finally:
        torch._C._set_grad_enabled(was)


MAX_PER_STEP = 64  # model calls / loss calls / backwards kept for one step (a loop with no step() stays bounded)


class Watch:
    """See the module docstring; made by :func:`nnwizard.watch` (context manager) or the CLI."""

    max_per_step = MAX_PER_STEP

    def __init__(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 out: str | Path = DEFAULT_OUT, on_anomaly: str = "continue", *, every: int | None = None,
                 triggers: Triggers | None = None, ring: int = 4, tensorboard: bool | None = None,
                 max_bundles: int = 5, quiet: bool = False, script: str | Path | None = None,
                 files: list[Path] | None = None):
        if on_anomaly not in ("continue", "stop"):
            raise ValueError(f"on_anomaly must be 'continue' or 'stop', not {on_anomaly!r}")
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1, not {every}")
        self.model, self.optimizer, self.out = model, optimizer, Path(out)
        self.on_anomaly, self.ring_size = on_anomaly, int(ring)
        # every=None: lines every DEFAULT_EVERY steps, or a multiple of it chosen from their measured cost
        self.every, self.adaptive = int(every or DEFAULT_EVERY), every is None
        self.log_every = self.every             # the interval in use (see _pace)
        self._line_cost = 0.0                   # seconds a logged step's extra work took (running mean)
        self.triggers = triggers or Triggers()
        self.tensorboard, self.max_bundles, self.quiet = tensorboard, max_bundles, quiet
        main = sys.modules.get("__main__")
        self.script = str(Path(script).resolve()) if script else getattr(main, "__file__", None)
        self.files = [Path(f) for f in files] if files else ([Path(self.script)] if self.script else [])
        self.bundles: list[Path] = []
        self.anomalies: list[Anomaly] = []
        self.stopped: str | None = None
        self.steps = 0
        self._detectors: dict[int, Detector] = {}
        self._history: deque = deque(maxlen=HISTORY)
        self._ring: deque = deque(maxlen=max(self.ring_size, 0))
        self.step_calls: dict = self._fresh()
        self._calls = CallKeeper(self)         # the watched models' calls of each step (into step_calls["calls"])
        self._seen: dict[int, bool] = {}
        self._recorder = None
        self._owns_recorder = False
        self._log = None
        self._tb = None
        self._t0 = time.monotonic()
        self._t_shift = 0.0                     # our clock minus the recorder's (its StepRecord.t): see start()
        self._last_line_t = self._t0
        self._last_line_step = 0
        self._flushed = 0.0
        self._ratio_cost = 0.0                  # seconds the update ratio took (copy and difference)
        self._ratio_step = 0
        self._ratio_started = 0.0
        self._line_t = 0.0                       # seconds the logged step's work took before the update
        self._named: tuple | None = None       # (key, result) of the last _names call
        self._before: list[torch.Tensor] | None = None
        self._sampled: dict | None = None
        self._written_step = 0                  # the step of the last line written (loss_between starts after it)
        self._first: dict | None = None        # the run's first step with a positive LR (the history keeps only the last HISTORY)
        self._first0: tuple | None = None      # the latest step while none had a positive LR (a history tuple)
        self._opt_det: dict[int, tuple] = {}    # id(optimizer) -> (optimizer, index, Detector)
        self._last_det: tuple = (None, 0, None)  # the last of those looked up (one optimizer: every step's)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, recorder=None) -> "Watch":
        """Open the output folder; with no recorder given, start one (light mode) listening to us."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._log = open(self.out / "watch.jsonl", "a", encoding="utf-8")
        if self.tensorboard is not False:
            try:
                import tensorboard  # noqa: F401
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out / "tensorboard"))
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                if self.tensorboard:
                    raise
                self._tb = None
        if recorder is None:
            from nnwizard.record import Recorder

            # inline: our loss-call and backward work runs inside its hooks (on_loss_args, on_backward)
            recorder = Recorder("light", files=self.files, listeners=[self], inline=self)
            recorder.__enter__()
            self._owns_recorder = True
        self._recorder = recorder
        self._t_shift = recorder.t0 - self._t0  # (both monotonic: a step's time since our start)
        recorder.norm_every_max = self.every  # every logged step has the gradient norms measured
        return self

    def close(self) -> None:
        if self._owns_recorder and self._recorder is not None:
            self._recorder.__exit__(None, None, None)
        self._recorder = None
        self._calls.close()
        if self._log is not None and self._history and self._history[-1][0] > self._written_step:
            self._write(self._entry(self._history[-1]))   # the run's last step ends the curve (and loss_between)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self.step_calls = self._fresh()
        self._ring.clear()

    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return exc_type is not None and issubclass(exc_type, StopRun) and self.stopped is not None

    # -- what belongs to the watched run ----------------------------------------------------------
    def _models(self) -> list[nn.Module]:
        found = [self.model] if self.model is not None else []
        if self._recorder is not None:
            for m in self._recorder.recording.models:
                inner = compiled_inner(m.module)
                if all(inner is not f for f in found):
                    found.append(inner)
        return found

    def _names(self, optimizer) -> tuple[dict[str, nn.Module], dict[int, str]]:
        models = self._models()
        key = (id(optimizer), tuple(id(m) for m in models), tuple(len(g["params"]) for g in optimizer.param_groups))
        if self._named is None or self._named[0] != key:
            self._named = (key, self._names_of(optimizer, models))
        return self._named[1]

    @staticmethod
    def _names_of(optimizer, found: list[nn.Module]) -> tuple[dict[str, nn.Module], dict[int, str]]:
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        models = [m for m in found if any(id(p) in params for p in m.parameters())]
        keyed = {("model" if i == 0 else f"model{i}"): m for i, m in enumerate(models)}
        names: dict[int, str] = {}
        for key, m in keyed.items():
            for n, p in m.named_parameters():
                names.setdefault(id(p), n if len(keyed) == 1 else f"{key}.{n}")
        return keyed, names

    @staticmethod
    def _fresh() -> dict:
        """The current step's model calls, loss calls (and their targets, for the ring), backwards."""
        return {"calls": [], "losses": [], "targets": [], "backward": [], "rng": None}

    # -- recorder listener API --------------------------------------------------------------------
    def _ours(self, module: nn.Module) -> bool:
        """Is this top-level model call part of the watched model (itself, or a submodule called directly)?"""
        seen = self._seen.get(id(module))
        if seen is None:
            inner = compiled_inner(module)   # (a compiled model's wrapper is ours when the model it runs is)
            seen = self.model is None or inner is self.model or any(m is inner for m in self.model.modules())
            self._seen[id(module)] = seen
        return seen

    def on_forward(self, rec, info, args) -> None:
        module = info.module
        if not self._calls.keeps(module) and self._ours(module):
            self._calls.keep(module, args)

    def on_loss_args(self, rec, call, args, kwargs, value) -> None:
        cur = self.step_calls
        losses = cur["losses"]
        if not _grad_enabled() or not isinstance(value, _Tensor) or len(losses) >= MAX_PER_STEP:
            return
        losses.append((call.fn, args, kwargs, value))  # references only: see _loss_parts
        # the target alone goes into the ring (the input is a model output: it and its graph are not kept)
        cur["targets"].append(args[1] if len(args) > 1 else kwargs.get("target"))

    def on_backward(self, rec, loss) -> None:
        cur = self.step_calls
        backward, losses = cur["backward"], cur["losses"]
        if len(backward) >= MAX_PER_STEP:
            return
        if losses and loss is losses[-1][3]:  # the common case: the last loss call itself
            backward.append({"kind": "loss-call", "loss": len(losses) - 1, "scale": 1.0})
        elif isinstance(loss, _Tensor):
            try:
                backward.append(self._relate(loss))
            except Exception:  # noqa: BLE001 - an odd graph: this step just cannot be re-executed
                backward.append(None)

    def _relate(self, t: torch.Tensor) -> dict | None:
        """How the tensor backward() runs on was made from this step's calls: a loss call (times a
        constant) or a model output's own loss. Done before the backward frees the graph's saved values."""
        cur = self.step_calls
        calls = cur["calls"]
        for j, loss in enumerate(cur["losses"]):
            scale = _scale_of(t, loss[3])
            if scale is not None:
                return {"kind": "loss-call", "loss": j, "scale": scale}
        for i, c in enumerate(calls):
            if "out" not in c:
                continue
            path = _path_to(c["out"], t)
            if path is not None and t.numel() == 1:
                return {"kind": "output", "call": i, "path": path, "scale": 1.0}
            for key, inner in _loss_slots(c["out"]):
                scale = _scale_of(t, inner)
                if scale is not None:
                    return {"kind": "output", "call": i, "path": [key], "scale": scale}
        return None

    def on_step_post(self, rec, optimizer, step) -> None:
        """After the update: a logged step's line is finished (update ratio) and written; the step's
        calls join the ring of earlier steps."""
        if self.optimizer is not None and optimizer is not self.optimizer:
            return
        if self._sampled is not None:
            self._finish_line(optimizer)
        cur = self.step_calls
        calls = cur["calls"]
        if self.ring_size and (calls or cur["losses"]):
            for c in calls:
                c.pop("out", None)  # the output (and its graph) is not kept past its step
            self._ring.append((self.steps, cur["rng"], calls, cur["targets"]))
        self.step_calls = {"calls": [], "losses": [], "targets": [], "backward": [], "rng": None}  # (_fresh, inline)

    def _finish_line(self, optimizer) -> None:
        line, self._sampled = self._sampled, None
        if line is not None:
            started = time.perf_counter()
            if self._before is not None:
                params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
                if len(params) == len(self._before):
                    line["update_ratio"] = _no_grad(_update_ratio, self._before, params)
                self._before = None
                cost = time.perf_counter() - self._ratio_started
                self._ratio_cost = cost if not self._ratio_cost else 0.8 * self._ratio_cost + 0.2 * cost
                started = time.perf_counter()  # the ratio has its own budget (UPDATE_SHARE)
            self._write(line)
            self._pace(self._line_t + time.perf_counter() - started)

    def _pace(self, cost: float) -> None:
        """every=None: the line interval, a multiple of ``every``, at which a logged step's extra work
        (full check, per-layer norms, the line) costs at most LOG_SHARE of the steps between two lines,
        both measured in this run (the recorder's step time)."""
        self._line_cost = cost if not self._line_cost else 0.8 * self._line_cost + 0.2 * cost
        step_s = self._recorder.step_seconds if self._recorder is not None else 0.0
        if self.adaptive and step_s > 0 and self.steps > 1:
            need = self._line_cost / (LOG_SHARE * step_s * self.every)
            self.log_every = self.every * min(max(math.ceil(need), 1), LOG_EVERY_MAX)

    # -- per step ----------------------------------------------------------------------------------
    def _detector(self, optimizer) -> tuple[int, Detector]:
        known = self._opt_det.get(id(optimizer))
        if known is not None and known[0] is optimizer:
            self._last_det = known
            return known[1], known[2]
        index = 0
        if self._recorder is not None:
            index = self._recorder.optimizer_index(optimizer) or 0
        detector = self._detectors.setdefault(index, Detector(self.triggers))
        if len(self._detectors) > 1:   # several objectives: their losses may rise by design (a GAN)
            for each in self._detectors.values():
                each.solo = False
        self._opt_det[id(optimizer)] = self._last_det = (optimizer, index, detector)
        return index, detector

    def _entry(self, h: tuple) -> dict:
        """A history tuple (step, loss, grad_norm, lrs, optimizer index, the recorder's time) as its JSON entry."""
        step, loss, norm, lrs, index, t = h
        entry = {"step": step, "loss": loss, "grad_norm": norm, "lr": lrs[0] if lrs else None}
        if len(lrs) > 1:
            entry["lrs"] = lrs
        if index:
            entry["optimizer"] = index
        entry["t"] = round(t + self._t_shift, 3)
        return entry

    def on_step_pre(self, rec, optimizer, step_rec) -> None:
        """The recorder measured this step (for ``step(closure)``: inside the closure, after its first
        call, so after its backward): triggers, log, bundle, before the optimizer changes anything.

        Fast path (most steps): a history tuple and the detector's one comparison (``Detector.quick``);
        the full check, the JSON line and a bundle only on logged steps and where quick() says so."""
        if self.optimizer is not None and optimizer is not self.optimizer:
            return
        self.steps = n = step_rec.step
        # None: not measured on this step (LightPolicy.norm_due), or no gradient at all
        norm = step_rec.grad_norm if step_rec.grads_total > step_rec.grads_none else None
        loss, lrs = step_rec.loss, step_rec.lrs
        last = self._last_det
        if last[0] is optimizer:
            index, detector = last[1], last[2]
        else:
            index, detector = self._detector(optimizer)
        h = (n, loss, norm, lrs, index, step_rec.t)  # (the recorder's clock: no clock read of our own)
        self._history.append(h)
        if self._first is None:
            self._first_step(h)
        detector.seen = own = detector.seen + 1   # this optimizer's own steps: lines by its own count, so
        if own % self.log_every and own != 1:     # alternating optimizers (D, G) all log
            # Detector.quick, inline (one frame less on most steps): inside the bounds, queued for the next check
            queue = detector._queue
            if loss is not None and detector._lo < loss <= detector._hi and (norm is None or norm <= detector._nhi) \
                    and len(queue) < detector.gap - 1:
                queue.append(h)   # (its first three: step, loss, norm)
                return
        self._step_full(optimizer, detector, h, own, step_rec.grad_norm_clipped)

    def _first_step(self, h: tuple) -> None:
        """Until the run's first step with a positive LR (a warmup may start at 0): keep it, or the latest."""
        lrs = h[3]
        if lrs and lrs[0] > 0:
            self._first = self._entry(h)
        else:
            self._first0 = h

    def _step_full(self, optimizer, detector: Detector, h: tuple, own: int, clipped: float | None = None) -> None:
        """on_step_pre past its fast path: the full check, on a logged step the line (before the
        update), at an anomaly the bundle and the stop. ``clipped``: the global norm after the script's
        clip_grad_norm_ (the line's grad_norm is the norm before it; top_grads are after it)."""
        loss, norm = h[1], h[2]
        anomaly = detector.check(self.steps, loss, norm)
        if own % self.log_every == 0 or own == 1 or anomaly is not None:
            started = time.perf_counter()
            line = self._entry(h)
            if clipped is not None:
                line["grad_norm_clipped"] = clipped
            keyed, names = self._names(optimizer)
            measured = self._recorder.grad_norms if self._recorder is not None and norm is not None else None
            if measured is not None:  # the recorder's per-tensor norms of this very step
                params, norms = measured[0], list(map(float, measured[1]))
            else:
                params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
                norms = [float(n) for n in torch._foreach_norm([p.grad.detach() for p in params])] if params else []
                if params and line["grad_norm"] is None:  # an anomaly between two measured steps
                    line["grad_norm"] = math.sqrt(sum(n * n for n in norms))
            if params:
                order = sorted(range(len(norms)), key=lambda i: -norms[i] if math.isfinite(norms[i]) else -math.inf)
                bad = [i for i, n in enumerate(norms) if not math.isfinite(n)]
                line["top_grads"] = {names.get(id(params[i]), f"param{i}"): norms[i] for i in (bad + order)[:TOP_LAYERS]}
                line["nonfinite"] = {"loss": loss is not None and not math.isfinite(loss), "grad_tensors": len(bad)}
            steps = self.steps - self._last_line_step
            now = time.monotonic()
            line["step_s"] = round((now - self._last_line_t) / steps, 6) if steps > 0 else None
            self._last_line_t, self._last_line_step = now, self.steps
            trainable = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
            line["update_ratio"] = None
            # the update ratio copies every parameter: on the logged steps where the steps since the last
            # one paid for it (at most UPDATE_SHARE of their measured time)
            if anomaly is None and trainable and (steps <= 0 or line["step_s"] is None or
                                                  self._ratio_cost <= UPDATE_SHARE * line["step_s"] * (self.steps - self._ratio_step)):
                self._ratio_started, self._ratio_step = time.perf_counter(), self.steps
                self._before = _no_grad(_copies, trainable)  # (no detach per tensor)
            self._sampled = line
            self._line_t = time.perf_counter() - started
        if anomaly is not None:
            self.anomalies.append(anomaly)
            line = self._sampled
            line["anomaly"] = anomaly.kind
            line["reason"] = anomaly.reason
            if len(self.bundles) < self.max_bundles:
                path = self._save(optimizer, anomaly, line)
                if path is not None:
                    line["bundle"] = str(path)
            if self.on_anomaly == "stop":
                self._write(line)
                self._sampled = None
                self.stopped = f"stopped at step {self.steps}: {anomaly.reason}"
                if self._recorder is not None:
                    self._recorder.recording.stopped = self.stopped
                self._say(f"nnwizard watch: {self.stopped} (--on-anomaly stop)")
                raise StopRun(self.stopped)

    # -- bundle -------------------------------------------------------------------------------------
    def _step_data(self, keyed: dict[str, nn.Module]) -> dict:
        """The current step as replay needs it: model calls, loss calls, how the backward tensor was made."""
        cur = self.step_calls
        key_of = {id(m): k for k, m in keyed.items()}
        calls = cur["calls"]
        out = {"calls": [{"model": key_of[id(c["module"])], "args": cpu_copy(c["args"]), "kwargs": cpu_copy(c["kwargs"])}
                         for c in calls], "losses": [], "backward": []}
        for loss in map(_loss_parts, cur["losses"]):
            source = None
            if isinstance(loss["x"], torch.Tensor):
                for i, c in enumerate(calls):
                    if "out" in c:
                        path = _path_to(c["out"], loss["x"])
                        if path is not None:
                            source = {"call": i, "path": path, "shape": list(loss["x"].shape),
                                      "dtype": str(loss["x"].dtype).replace("torch.", "")}
            out["losses"].append({"fn": loss["fn"], "input": source, "target": cpu_copy(loss["target"]),
                                  "extra": cpu_copy(loss["extra"]), "kwargs": cpu_copy(loss["kwargs"]),
                                  "value": float(loss["value"].detach().float().mean())})
        out["backward"] = list(cur["backward"])
        if not out["backward"] or any(b is None for b in out["backward"]):
            out["replayable"] = False
            out["why_not"] = ("no backward() was seen in this step" if not out["backward"] else
                              "the tensor backward() ran on is not a torch.nn.functional loss of the model's output "
                              "(nor the output's own loss): the step cannot be re-executed from the saved calls")
        else:
            out["replayable"] = bool(calls)
            if not calls:
                out["why_not"] = "no model forward was seen in this step"
        return out

    def _save(self, optimizer, anomaly: Anomaly, line: dict) -> Path | None:
        keyed, names = self._names(optimizer)
        for c in self.step_calls["calls"]:  # a model the step called without training it (a frozen encoder)
            if all(c["module"] is not m for m in keyed.values()):
                keyed[f"model{len(keyed)}"] = c["module"]
        folder = self.out / f"anomaly-step{anomaly.step}"
        try:
            step_data = self._step_data(keyed)
            grads = {names.get(id(p), f"param{i}"): p.grad.detach().to("cpu", copy=True)
                     for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]) if p.grad is not None}
            ring = [{"step": step, "rng": rng,
                     "calls": [{"model": next((k for k, m in keyed.items() if m is c["module"]), None),
                                "args": cpu_copy(c["args"]), "kwargs": cpu_copy(c["kwargs"])} for c in calls],
                     "targets": cpu_copy(targets)} for step, rng, calls, targets in self._ring]
            rng = rng_state(cuda=any(p.is_cuda for g in optimizer.param_groups for p in g["params"]))
            if self.step_calls["rng"] is not None:
                rng["torch"] = self.step_calls["rng"]
            meta = {"step": anomaly.step, "trigger": anomaly.kind, "reason": anomaly.reason, "loss": anomaly.loss,
                    "grad_norm": anomaly.grad_norm if anomaly.grad_norm is not None else line.get("grad_norm"), "lrs": [g.get("lr") for g in optimizer.param_groups],
                    "history": [self._entry(h) for h in self._history],
                    "first": self._first or (self._entry(self._first0) if self._first0 else None), "script": self.script, "argv": list(sys.argv),
                    "cwd": str(Path.cwd()), "models": {k: type(m).__name__ for k, m in keyed.items()},
                    "optimizer": type(optimizer).__name__, "line": {k: v for k, v in line.items() if k != "bundle"},
                    "replayable": step_data.get("replayable", False), "why_not": step_data.get("why_not"),
                    "losses": [{"fn": l["fn"], "value": l["value"], "from_model": l["input"] is not None}
                               for l in step_data["losses"]], "backward": step_data["backward"],
                    "ring_steps": [r["step"] for r in ring]}
            started = time.monotonic()
            hooks = self._calls.unhook(keyed.values())  # our own hooks must not travel in the pickled model
            try:
                save_bundle(folder, meta, keyed, optimizer, names, grads, step_data, ring, rng)
            finally:
                self._calls.rehook(hooks)
            seconds = time.monotonic() - started
        except Exception as exc:  # noqa: BLE001 - watching must never break the run
            self._say(f"nnwizard watch: step {anomaly.step}: {anomaly.reason}; the bundle could not be saved "
                      f"({type(exc).__name__}: {exc})")
            return None
        self.bundles.append(folder)
        line["bundle_s"] = round(seconds, 3)
        self._say(f"nnwizard watch: {anomaly.kind} at step {anomaly.step} ({anomaly.reason}); replay bundle: {folder}")
        return folder

    # -- output -------------------------------------------------------------------------------------
    def _write(self, line: dict) -> None:
        if self._log is None:
            return
        # the loss at each multiple of `every` since the previous line (lines may be further apart: see _pace), so
        # that watch.jsonl and the TensorBoard scalars hold the same curve at every `every` steps, non-finite included
        last, self._written_step = self._written_step, line["step"]
        between = [[h[0], h[1]] for h in self._history if last < h[0] < line["step"] and h[0] % self.every == 0]
        if between:
            line["loss_between"] = between
        try:  # a line of plain finite numbers (the common case) needs no conversion
            text = json.dumps(line, allow_nan=False)
        except (TypeError, ValueError):  # NaN/Inf (written as strings) or a value json does not know
            text = json.dumps(jsonable(line))
        self._log.write(text + "\n")
        now = time.monotonic()
        if "anomaly" in line or now - self._flushed >= FLUSH_S:  # a flush is a system call: at most once a second
            self._log.flush()
            self._flushed = now
        if self._tb is not None:
            step = line["step"]
            for at, v in between:
                if isinstance(v, (int, float)):
                    self._tb.add_scalar("nnwizard/loss", v, at)
            for key in ("loss", "grad_norm", "lr", "update_ratio"):
                v = line.get(key)
                if isinstance(v, (int, float)):   # NaN and Inf too: the curve shows where it broke
                    self._tb.add_scalar(f"nnwizard/{key}", v, step)

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


def watch(model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, out: str | Path = DEFAULT_OUT,
          on_anomaly: str = "continue", **options: Any) -> Watch:
    """``with nnwizard.watch(model, optimizer, out=..., on_anomaly="continue"|"stop"):`` around a loop.

    Options: ``every`` (steps between JSON lines; default None: 10, or a multiple of 10 at which
    a line costs at most 1% of the steps between two, see ``Watch._pace``), ``triggers`` (an
    ``nnwizard.anomaly.Triggers``), ``ring`` (earlier batches kept for the bundle, default 4),
    ``tensorboard`` (None: when installed), ``max_bundles`` (5), ``quiet``."""
    return Watch(model, optimizer, out, on_anomaly, **options)
