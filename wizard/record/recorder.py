"""The recorder shell: what one recording installs and removes again, who it tells, and the objects of the
program it knows (models, optimizers, schedulers, DataLoaders). What it measures at each event is its
policy's (``full.py`` for diagnosis, ``light.py`` for watch), chosen once from ``mode``; the patches that
intercept torch are in ``patches/``.

Usage::

    from nnwizard.record import Recorder, StopRun

    with Recorder(mode="full", files=[script_path], max_steps=40) as rec:
        try:
            run_the_users_code()            # nothing in it changes
        except StopRun:                     # raised from an optimizer-step post hook once the budget
            pass                            # is spent (a BaseException: `except Exception` can't eat it)
    recording = rec.recording               # a Recording (records.py); every hook/patch is removed again

``files``: the user's source files (for file:line); ``max_steps``, ``time_limit_s``, ``limit_batches`` (per
DataLoader iteration), ``max_forwards`` bound the run; ``replace_batch(batch, index)`` replaces every batch a
DataLoader yields; ``lr_scale`` scales every learning rate the script sets (an intervention rerun);
``listeners`` follow the run (``listeners.py``), ``inline`` is one of them whose per-call work the light hooks
do themselves.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.data import DataLoader

from nnwizard.record.frames import UserCode, plain_text
from nnwizard.record.full import FullPolicy
from nnwizard.record.light import LightPolicy
from nnwizard.record.listeners import Listeners, StopRun
from nnwizard.record.models import NN_METHODS, mode_layers, not_a_model
from nnwizard.record.reach import Reach
from nnwizard.record.records import (ForwardEvent, LoaderInfo, ModelInfo, OptimizerInfo, RecordedError, Recording,
                                     SchedulerEvent, StepRecord, blank_step, inner_model, wrapped_optimizer)
from nnwizard.record.tensors import values_in

POLICIES = {"full": FullPolicy, "light": LightPolicy}
MODES = tuple(POLICIES)


class Recorder:
    """See the module docstring. The state of the step being recorded lives here (the policy and the
    patches share it); each attribute below is set by the patches and read by the policy."""

    def __init__(self, mode: str = "full", *, files: list[Path] | None = None, max_steps: int | None = None,
                 time_limit_s: float | None = None, limit_batches: int | None = None, max_forwards: int | None = None,
                 replace_batch: Callable[[Any, int], Any] | None = None, listeners: list | None = None,
                 lr_scale: float | None = None, inline: Any = None):
        if mode not in MODES:
            raise ValueError(f"mode must be 'full' or 'light', not {mode!r}")
        self.mode, self.full = mode, mode == "full"
        self.code = UserCode(files)
        self.files, self.folders = self.code.files, self.code.folders
        self.max_steps, self.time_limit_s, self.limit_batches = max_steps, time_limit_s, limit_batches
        self.max_forwards, self.replace_batch, self.lr_scale = max_forwards, replace_batch, lr_scale
        self.listeners = list(listeners or [])
        self.inline = inline
        self.recording = Recording(mode=mode)
        self.events = Listeners(self.listeners, self.recording, inline)
        self.listening = False                   # any listener method at all (else the hooks skip notify)
        self.cap_evaluation = True               # limit_batches caps evaluation passes too (off: only training passes)
        self.evaluation_capped = False           # an evaluation pass ended at the cap
        self.t0 = 0.0                            # time.monotonic() when the recording started (StepRecord.t counts from it)
        # the step being recorded and what happened since the last one
        self.pending_step: StepRecord | None = None
        self.backwards_since_step = 0
        self.zero_grad_since = False             # a zero_grad() (optimizer or model) ran since the last step
        self.zero_after_backward = False         # ... after a backward of this step
        self.zeroed_since_backward = False       # a zero_grad came after the latest backward
        self.clip_norm: torch.Tensor | None = None   # what clip_grad_norm_ returned since the last step
        self.last_step_t = 0.0
        self.epoch, self.batch_index = 0, -1     # the DataLoader pass (1 = first) and batch the step takes
        self.scheduler_count = 0                 # scheduler.step() calls so far
        self.fetches = 0                         # DataLoader batches served (all loaders)
        self.loader_stack: list[LoaderInfo] = [] # the DataLoader passes under way, innermost last
        self.scales: dict[int, tuple] = {}       # GradScaler.scale outputs -> (weakref, its scale or the scaler)
        self.last_model: ModelInfo | None = None
        self.last_event: ForwardEvent | None = None  # the last forward event, and its position in recording.forwards
        self.last_forward_at: int | None = None
        self.last_out: tuple | None = None       # (model index, output tensor weakref, shape) of the last forward
        self.reach = Reach(self)                 # forwards and loss calls waiting for a backward to reach them
        # the calls under way (the patches keep them from counting twice): module calls, loss functions, backward,
        # scheduler steps
        self.depth, self.in_model, self.in_loss, self.in_backward, self.in_sched = 0, False, 0, 0, 0
        self._undo: list[Callable[[], None]] = []
        self._module_ids: dict[int, tuple] = {}   # id(module) -> (weakref, model index (None: a submodule / loss), torch loss module)
        self._loaded: dict[int, weakref.ref] = {}   # modules returned by torch.load or given a state dict (full)
        self._lazy: list[ModelInfo] = []          # models registered with lazy parameters not yet initialised
        self._opt_ids: dict[int, OptimizerInfo] = {}
        self._scaled: set[int] = set()            # lr_scale: ids of the optimizers whose rates are scaled
        self._lr_written: dict[int, list] = {}    # lr_scale: id(optimizer) -> its groups' learning rates as last written
        self.norm_every_max = 0                   # light mode: the longest gradient-norm interval (watch sets its log interval)
        self.policy = POLICIES[mode](self)        # what is measured at each event, chosen once

    # -- install / remove -------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        self.t0, self.last_step_t = time.monotonic(), 0.0
        self.events = Listeners(self.listeners, self.recording, self.inline)
        try:
            self.listening = self.events.any
            self.policy.install()
        except BaseException:
            self._uninstall()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._uninstall()
        self.finish()

    def patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        """Replace ``owner.name`` by ``make(original)`` until the recording ends."""
        had = name in owner.__dict__
        original = owner.__dict__.get(name) if had else getattr(owner, name)
        wrapper = make(original)
        setattr(owner, name, wrapper)

        def undo(owner=owner, name=name, had=had, original=original):
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._undo.append(undo)

    def on_exit(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the recording ends (in reverse order of registration, with the patches')."""
        self._undo.append(undo)

    @property
    def installed(self) -> bool:
        return bool(self._undo)

    def _uninstall(self) -> None:
        self.policy.uninstall()
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # noqa: BLE001 - restore the rest whatever happens
                pass
        for info in self.recording.optimizers:  # a scaled-LR intervention is undone on the user's optimizer
            if self.lr_scale and id(info.optimizer) in self._scaled:
                for g in info.optimizer.param_groups:
                    g["lr"] = g["lr"] / self.lr_scale

    # -- what listeners and patches use -------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def steps_taken(self) -> int:
        return self.recording.total_steps

    @property
    def step_seconds(self) -> float:
        """Light mode: the running mean of a step's wall time (0.0 until measured, and in full mode)."""
        return self.policy.step_s

    @property
    def grad_norms(self) -> tuple | None:
        """Light mode: (parameters, per-tensor gradient norms) of the step being measured, when it is."""
        return self.policy.grad_norms

    def notify(self, name: str, *args) -> None:
        self.events.notify(self, name, *args)

    def where(self, depth: int = 1, frame=None) -> str | None:
        """``file:line in function`` of the innermost frame in the user's files (else outside torch), from
        the frame ``depth`` calls out (1: the caller's), or from ``frame``."""
        return self.code.where(frame or sys._getframe(depth))

    def check_time(self) -> None:
        if self.time_limit_s is not None and self.now() > self.time_limit_s:
            self.recording.stopped = f"the time limit of {self.time_limit_s:.0f} s was reached"
            raise StopRun(self.recording.stopped)

    def check_forwards(self) -> None:
        if self.max_forwards is not None and sum(m.forwards for m in self.recording.models) > self.max_forwards:
            self.recording.stopped = f"{self.max_forwards} model forward calls were recorded"
            raise StopRun(self.recording.stopped)
        self.check_time()

    def check_backwards(self) -> None:
        """No optimizer step so far and more backward passes than the step budget: the run ends."""
        rec = self.recording
        if self.max_steps is not None and not rec.total_steps and rec.backwards > self.max_steps:
            rec.stopped = f"the budget of {self.max_steps} backward passes was reached (no optimizer.step() so far)"
            raise StopRun(rec.stopped)

    def check_steps(self, what: str = "optimizer steps") -> None:
        if self.max_steps is not None and self.recording.total_steps >= self.max_steps:
            self.recording.stopped = f"the budget of {self.max_steps} {what} was reached"
            raise StopRun(self.recording.stopped)
        if self.time_limit_s is not None:
            self.check_time()

    def step_record(self) -> StepRecord:
        """The StepRecord being filled (opened by the step's first event)."""
        if self.pending_step is None:   # (without the dataclass __init__: a StepRecord is made every step)
            self.pending_step = blank_step(self.recording.total_steps + 1)
        return self.pending_step

    def unclipped(self, step: StepRecord, total: float) -> float:
        """The step's global gradient norm as the script's ``clip_grad_norm_`` found it before clipping, when it
        clipped since the last step (``total``, measured after the clip, is kept as ``grad_norm_clipped``: a
        clipped norm never exceeds max_norm, so neither a growth nor an explosion would show in it)."""
        clipped = self.clip_norm
        if clipped is None or clipped.numel() != 1:
            return total
        step.grad_norm_clipped = total
        return float(clipped)

    @property
    def in_loader_pass(self) -> bool:
        """A DataLoader pass is under way (its batches number the steps)."""
        return bool(self.loader_stack)

    def set_position(self, epoch: int, batch: int) -> None:
        """The pass and batch the next steps take, for a loop the recorder cannot see (a slice loop over range)."""
        self.epoch, self.batch_index = epoch, batch

    def flush_pending(self, keep: int = 0) -> None:
        """Forwards and loss calls no backward reached by now stay evaluation (see ``Reach.flush``)."""
        self.reach.flush(keep)

    # -- models -----------------------------------------------------------------------------------
    def model_index(self, module: nn.Module) -> int | None:
        """The recorded model ``module`` is (registered at its first top-level call); None for a loss module, a
        submodule of a known model called directly, or a parameterless transform."""
        key = id(module)
        known = self._module_ids.get(key)
        if known is not None and known[0]() is module:  # (an id of a module freed since may be reused)
            return known[1]
        index = None
        if isinstance(module, nn.modules.loss._Loss):
            index = None
        elif any(any(m is module for m in info.module.modules()) for info in self.recording.models):
            index = None   # a submodule of a known model, called directly
        elif not (params := list(module.parameters())) and not_a_model(module, sys._getframe(1)):
            index = None   # a transform (Normalize, an nn.Flatten called on its own): no parameters to train
        else:
            index = len(self.recording.models)
            inner = inner_model(module)   # (a wrapper's methods are its library's: the user's class is the inner one)
            shadowed = [n for n in NN_METHODS if n in type(inner).__dict__ and not type(inner).__module__.startswith("torch.")
                        and n not in ("__call__", "__setattr__", "__getattr__", "to", "state_dict", "load_state_dict")]
            info = ModelInfo(index=index, name=type(inner).__name__, module=module, params=values_in(params),
                             trainable=values_in([p for p in params if p.requires_grad]), mode_layers=mode_layers(module),
                             first_step=self.steps_taken, shadowed=shadowed,
                             wrapper=type(module).__name__ if inner is not module else None)
            self.policy.model_seen(info, inner, sys._getframe(1))
            ref = self._loaded.get(key)
            if ref is not None and ref() is module:
                shapes = [tuple(p.shape) for p in params]
                info.copy_of = next((m.index for m in self.recording.models if m.name == info.name
                                     and [tuple(p.shape) for p in m.module.parameters()] == shapes), None)
            self.recording.models.append(info)
            if any(map(is_lazy, params)):   # counted again at the end, once its first forward made them
                self._lazy.append(info)
            for opt in self.recording.optimizers:
                self._link(opt)
        torch_loss = index is None and isinstance(module, nn.modules.loss._Loss) \
            and type(module).__module__.startswith("torch.")
        try:
            self._module_ids[key] = (weakref.ref(module), index, torch_loss)
        except TypeError:  # pragma: no cover - a module that cannot be weakly referenced
            self._module_ids[key] = (lambda: module, index, torch_loss)
        return index

    def known_module(self, module: nn.Module) -> tuple | None:
        """(weakref, model index or None, whether it is torch's own loss module) of a module seen before."""
        known = self._module_ids.get(id(module))
        return known if known is not None and known[0]() is module else None

    def loaded(self, module: nn.Module) -> None:
        """``module`` came from torch.load or was given a state dict: a new instance of a model seen before is
        then a copy of it (``ModelInfo.copy_of``), not a new model."""
        self._loaded[id(module)] = weakref.ref(module)

    def forward_event(self, module) -> tuple[ModelInfo, ForwardEvent] | None:
        """A top-level module call that is a model's (both modes): its forward event, counted and queued for
        the backward that reaches it; None for anything else (a loss module, a submodule called directly)."""
        index = self.model_index(module)
        if index is None:
            return None
        info = self.recording.models[index]
        info.forwards += 1
        self.last_model = info
        top = self.loader_stack[-1] if self.loader_stack else None
        event = ForwardEvent(model=index, training=module.training, grad_enabled=torch.is_grad_enabled(),
                             step=self.steps_taken, loader=top.index if top else None,
                             iteration=top.iterations - 1 if top else -1)
        reach = self.reach
        reach.forwards.append(event)
        if len(reach.forwards) > 64:
            reach.flush(keep=32)
        return info, event

    # -- optimizers -------------------------------------------------------------------------------
    def optimizer_info(self, optimizer) -> OptimizerInfo:
        info = self._opt_ids.get(id(optimizer))
        if info is None or info.optimizer is not optimizer:
            inner = wrapped_optimizer(optimizer)
            if inner is not None:   # a wrapper that delegates to an optimizer: that one is the optimizer
                return self.optimizer_info(inner)
            groups = []
            for g in optimizer.param_groups:
                params = [p for p in g["params"]]
                groups.append({"lr": float(g.get("lr", math.nan)) if not isinstance(g.get("lr"), torch.Tensor) else float(g["lr"]),
                               "params": params, "tensors": len(params), "values": values_in(params),
                               **{k: v for k, v in g.items() if k not in ("params", "lr") and isinstance(v, (int, float, bool, str, tuple))}})
            cadence = self.policy.cadence(groups)
            same = self._same_family(optimizer)
            if same is not None:  # built again over the same parameters (in the loop): the same optimizer, restarted
                same.optimizer, same.groups, same.built, same.cadence = optimizer, groups, same.built + 1, cadence
                if len(same.built_at) < 64:
                    same.built_at.append(same.steps)
                info = self._opt_ids[id(optimizer)] = same
            else:
                info = OptimizerInfo(index=len(self.recording.optimizers), name=type(optimizer).__name__,
                                     optimizer=optimizer, groups=groups, cadence=cadence)
                self._opt_ids[id(optimizer)] = info
                self.recording.optimizers.append(info)
                self._link(info)
            if self._undo:   # installed
                self.policy.optimizer_seen(info)
            if self.lr_scale and id(optimizer) not in self._scaled:
                self._scaled.add(id(optimizer))
                for g in optimizer.param_groups:
                    g["lr"] = g["lr"] * self.lr_scale
                self._lr_written[id(optimizer)] = [g["lr"] for g in optimizer.param_groups]
        return info

    def known_optimizer(self, optimizer) -> OptimizerInfo:
        """``optimizer_info`` with its most common case first: an optimizer already recorded."""
        info = self._opt_ids.get(id(optimizer))
        if info is None or info.optimizer is not optimizer:
            info = self.optimizer_info(optimizer)
        return info

    def optimizer_index(self, optimizer) -> int | None:
        """The index of ``optimizer`` among the recorded ones (None: not recorded)."""
        info = self._opt_ids.get(id(optimizer))
        return info.index if info is not None else None

    def rescale_lrs(self, optimizer) -> None:
        """A scaled-LR intervention (``lr_scale``), before each step: a learning rate the script set by hand
        since the last step (``param_group['lr'] = get_lr(it)``, a warm-up or cosine schedule written in the loop)
        is scaled too, so the rerun runs the script's own schedule times the scale. A new value counts as set by
        hand when it lies nearer (in ratio) to the unscaled counterpart of the value last written than to that
        value itself: a rate derived from the current one (``g['lr'] *= 0.5``, an LRScheduler's step, both
        already scaled) is left as it is."""
        written = self._lr_written.get(id(optimizer))
        groups = optimizer.param_groups
        if written is None or len(written) != len(groups):
            self._lr_written[id(optimizer)] = [g["lr"] for g in groups]
            return
        scale = self.lr_scale
        for i, g in enumerate(groups):
            lr, last = g["lr"], written[i]
            if lr == last or isinstance(lr, torch.Tensor) or not lr:
                continue
            if not last or abs(math.log(lr / (last / scale))) < abs(math.log(lr / last)):
                g["lr"] = lr * scale
            written[i] = g["lr"]

    def _same_family(self, optimizer) -> OptimizerInfo | None:
        """An optimizer recorded before of the same class over exactly the same parameters: a new one
        replaces it (the recording keeps one object per family, so a loop that builds an optimizer per
        step does not keep every one of them, with its state, alive)."""
        name = type(optimizer).__name__
        ids = None
        for info in reversed(self.recording.optimizers):
            if info.name == name and info.optimizer is not optimizer:
                ids = ids if ids is not None else {id(p) for g in optimizer.param_groups for p in g["params"]}
                if {id(p) for g in info.groups for p in g["params"]} == ids:
                    return info
        return None

    def _link(self, info: OptimizerInfo) -> None:
        ids = {id(p) for g in info.groups for p in g["params"]}
        info.models = [m.index for m in self.recording.models if any(id(p) in ids for p in m.parameters())]
        owned = {id(p) for m in self.recording.models for p in m.parameters()}
        info.foreign = len(ids - owned)

    # -- schedulers and data loaders --------------------------------------------------------------
    def scheduler_seen(self, scheduler) -> dict:
        for s in self.recording.schedulers:
            if s["object"] is scheduler:
                return s
        opt = getattr(scheduler, "optimizer", None)
        entry = {"name": type(scheduler).__name__, "index": len(self.recording.schedulers), "object": scheduler,
                 "optimizer": self.optimizer_info(opt).index if opt is not None else None, "steps": 0}
        self.recording.schedulers.append(entry)
        return entry

    def scheduler_stepped(self, scheduler) -> None:
        entry = self.scheduler_seen(scheduler)
        entry["steps"] += 1
        self.policy.scheduler_stepped(entry)
        opt = getattr(scheduler, "optimizer", None)
        if self.lr_scale and opt is not None and id(opt) in self._lr_written:  # (its rates derive from scaled ones)
            self._lr_written[id(opt)] = [g["lr"] for g in opt.param_groups]
        lr = float(opt.param_groups[0]["lr"]) if opt is not None and opt.param_groups else None
        event = SchedulerEvent(name=entry["name"], index=entry["index"], at_step=self.steps_taken, epoch=self.epoch, lr=lr)
        self.recording.scheduler_steps.append(event)
        self.scheduler_count += 1
        self.notify("on_scheduler", event)

    def loader_info(self, loader: DataLoader) -> LoaderInfo:
        for info in self.recording.loaders:
            if info.loader is loader:
                return info
        try:
            dataset_len = len(loader.dataset)
        except Exception:  # noqa: BLE001 - iterable datasets have no length
            dataset_len = None
        try:
            length = len(loader)
        except Exception:  # noqa: BLE001
            length = None
        sampler = getattr(loader, "sampler", None)
        info = LoaderInfo(index=len(self.recording.loaders), loader=loader, dataset_len=dataset_len,
                          batch_size=getattr(loader, "batch_size", None),
                          shuffle=isinstance(sampler, torch.utils.data.RandomSampler),
                          drop_last=bool(getattr(loader, "drop_last", False)), length=length)
        self.recording.loaders.append(info)
        return info

    # -- the end ----------------------------------------------------------------------------------
    def finish(self) -> Recording:
        """Close what is still open (called on exit): pending forwards with no backward are evaluation."""
        rec = self.recording
        for info in self._lazy:
            params = list(info.module.parameters())
            info.params, info.trainable = values_in(params), values_in([p for p in params if p.requires_grad])
        self.policy.finish()
        rec.seconds = round(self.now(), 3)
        rec.pass_cap = self.limit_batches
        self.reach.clear()
        return rec

    def record_error(self, exc: BaseException) -> RecordedError:
        text = plain_text(str(exc)).strip().splitlines()
        where = self.code.in_traceback(exc, fallback="near") if self.files else None
        err = RecordedError(type=type(exc).__name__, message=text[0][:400] if text else "", where=where,
                            traceback="".join(traceback.format_exception(exc)[-8:]), step=self.steps_taken, exception=exc)
        self.recording.error = err
        return err
