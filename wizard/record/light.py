"""The light measuring policy (watch, ``Recorder(mode="light")``): built to cost little on a long run.

The global module hooks stay only until every optimizer's parameters belong to a model seen (or
DISCOVERY_STEPS steps), then every module call runs torch's hook-free path again (a new optimizer brings them
back until its model is seen); the loss functions are patched only when a listener asks for loss calls; the
loss is read once per step at the optimizer's pre-step point (on CUDA without a host sync: a non-blocking copy
queued before the backward, see :meth:`LightPolicy.loss_reading`); the gradient norm (``_foreach_norm``) is
measured on the first NORM_FIRST steps and then at an interval chosen from its measured cost so that it stays
within NORM_SHARE of the measured step time (``recording.norm_interval``, at most ``Recorder.norm_every_max``;
``StepRecord.grad_norm`` is None on the other steps); only the last LIGHT_KEEP step records and scheduler events
are kept (``recording.total_steps`` counts them all), no loss calls and no forward events.
"""

from __future__ import annotations

import math
import time
from collections import deque
from operator import attrgetter, itemgetter

import torch

from nnwizard.record.patches import backward, data, losses, modules, optimizers
from nnwizard.record.policy import Policy
from nnwizard.record.records import StepRecord, blank_step
from nnwizard.record.tensors import tensors_in, total_norm, trainable_grads

LIGHT_KEEP = 256  # the last StepRecords / scheduler events kept (a watched run may be very long)
DISCOVERY_STEPS = 20  # global module hooks stay at most this many steps once an optimizer stepped
NORM_SHARE = 0.01  # the gradient-norm reduction may cost this share of a step (sets its interval)
NORM_FIRST = 5  # steps that always measure it (the triggers' starting level)
NORM_EVERY_MAX = 10  # the longest interval between two gradient-norm measurements (Recorder.norm_every_max: watch's)

_REQUIRES, _LR = attrgetter("requires_grad"), itemgetter("lr")
_monotonic, _grad_enabled = time.monotonic, torch.is_grad_enabled   # (one lookup less: these run every step)
_NONE = type(None)


class LightPolicy(Policy):
    """See the module docstring."""

    name = "light"

    def __init__(self, recorder):
        super().__init__(recorder)
        recorder.recording.steps = deque(maxlen=LIGHT_KEEP)   # bounded memory over a long run
        recorder.recording.scheduler_steps = deque(maxlen=LIGHT_KEEP)
        recorder.norm_every_max = NORM_EVERY_MAX
        self.module_hooks: list = []             # the global module forward hooks while installed
        self.hooked_at = 0                       # steps taken when they were installed
        self.norm_cost = 0.0                     # seconds one gradient-norm reduction took
        self.loss_t: tuple | None = None         # how to read the last backward's loss (loss_reading)
        self.pinned: torch.Tensor | None = None  # CUDA: the pinned host scalar the loss is copied to
        self.step_info = None                    # the optimizer info the step pre hook looked up
        self.pre_listener = self.post_listener = None   # the listeners' on_step_pre / on_step_post as one callable

    # -- installing ----------------------------------------------------------------------------------
    def install(self) -> None:
        rec = self.recorder
        events = rec.events
        self.pre_listener, self.post_listener = events.combined("on_step_pre"), events.combined("on_step_post")
        self.hook_modules()
        rec.on_exit(self.unhook_modules)
        optimizers.step_hooks(rec, self.measure, self.after_step)
        optimizers.zero_grad(rec, optimizers.zero_grad_light(rec))
        optimizers.optimizer_init(rec)
        optimizers.clipping_light(rec)
        backward.backward_light(rec, self)
        optimizers.schedulers(rec)
        data.loaders(rec)
        optimizers.grad_scaler(rec, read_now=False)
        if events.fns["on_loss"] or events.fns["on_loss_args"]:
            losses.loss_functions(rec, losses.loss_light(rec, self))

    def optimizer_seen(self, info) -> None:
        if not info.models:   # find the models it trains
            self.hook_modules()

    # -- discovery: the global module hooks ---------------------------------------------------------------
    def hook_modules(self) -> None:
        """The global module forward hooks (they make every module call of the process slower: kept only
        until the models that own the optimizers' parameters are known)."""
        if not self.module_hooks:
            rec = self.recorder
            rec.depth, self.hooked_at = 0, rec.recording.total_steps
            self.module_hooks = modules.global_hooks(self.forward_pre, self.forward_post)

    def unhook_modules(self) -> None:
        while self.module_hooks:
            self.module_hooks.pop().remove()

    def discovered(self) -> bool:
        """After a step: every optimizer's parameters belong to models seen (or the discovery budget is
        spent), so the global module hooks can go."""
        rec = self.recorder
        opts = rec.recording.optimizers
        if rec.max_forwards is not None or not opts:
            return False
        if all(o.models and not o.foreign for o in opts):
            return True
        return rec.recording.total_steps - self.hooked_at >= DISCOVERY_STEPS

    def forward_pre(self, module, args):
        """The global forward pre hook: a top-level model call's forward event (no copies)."""
        rec = self.recorder
        rec.depth += 1
        if rec.depth != 1 or rec.in_loss:
            return None
        found = rec.forward_event(module)
        if found is None:
            return None
        rec.check_forwards()
        rec.notify("on_forward", found[0], args)
        return None

    def forward_post(self, module, args, output):
        rec = self.recorder
        rec.depth = max(rec.depth - 1, 0)
        return None

    # -- backward ---------------------------------------------------------------------------------------
    def before_backward(self, tensors_) -> None:
        """Before ``backward()`` (the common case runs inline in ``patches.backward``): counted, and how the step
        reads its loss (see :meth:`loss_reading`); no graph search."""
        rec = self.recorder
        loss = tensors_ if isinstance(tensors_, torch.Tensor) else next(tensors_in(tensors_), None)
        recording = rec.recording
        recording.backwards += 1
        step = rec.pending_step
        if step is None:
            step = rec.pending_step = blank_step(recording.total_steps + 1)
        rec.backwards_since_step += 1
        step.backwards += 1
        if loss is not None:  # (an empty one is skipped where it is read)
            scales = rec.scales
            if scales or loss.is_cuda:
                scaled = scales.pop(id(loss), None) if scales else None
                self.loss_t = self.loss_reading(loss, scaled[1] if scaled is not None and scaled[0]() is loss else None)
                if len(scales) > 16:
                    rec.scales = {k: v for k, v in scales.items() if v[0]() is not None}
            else:  # a CPU loss, no GradScaler: read as it is at the step
                self.loss_t = (loss, None, None)
        reach = rec.reach
        if reach.forwards:  # only while the global module hooks are on (discovery)
            for event in reach.forwards:
                event.node = None
                step.forwards[event.model] = step.forwards.get(event.model, 0) + 1
                step.training[event.model] = step.training.get(event.model, True) and event.training
            reach.forwards = []
        rec.notify("on_backward", loss)
        rec.check_backwards()

    def loss_reading(self, loss: torch.Tensor, scaler) -> tuple:
        """At ``backward()``: how :meth:`measure` reads this loss at the step, as (tensor, CUDA event or None,
        GradScaler or None). On CPU the tensor itself, not detached (one ``item()`` at the step; its graph's saved
        values are freed by the backward). On CUDA no host sync: the value (unscaled on the device by the
        GradScaler's scale) is copied to a pinned host scalar with ``non_blocking=True`` and an event recorded
        behind the copy, both queued *before* the backward; the step waits on that event, i.e. for the forward
        and the loss only, while the backward and the update stay queued on the GPU."""
        if loss.is_cuda:
            try:
                loss = loss.detach()
                value = loss.float().mean() if loss.numel() > 1 else loss.float().reshape(())
                scale = getattr(scaler, "_scale", None) if scaler is not None else None
                if isinstance(scale, torch.Tensor):
                    value = value / scale.float().reshape(())
                    scaler = None
                if scaler is None:
                    if self.pinned is None:
                        self.pinned = torch.empty((), dtype=torch.float32, pin_memory=True)
                    self.pinned.copy_(value, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
                    return self.pinned, event, None
            except Exception:  # noqa: BLE001 - fall back to the plain read at the step (one sync)
                pass
        return loss, None, scaler

    # -- optimizer steps ----------------------------------------------------------------------------------
    def measure(self, optimizer, args=(), kwargs=None, closure: bool = False) -> None:
        """The optimizer step pre hook: the loss of the last backward (one read), LRs, which gradients exist,
        and the gradient norm on the steps due (see :meth:`norm_due`). A ``step(closure)`` is measured after the
        closure's first call."""
        if not closure and (kwargs and kwargs.get("closure") is not None or len(args) > 1 and callable(args[1])):
            return self._measure_after_closure(optimizer, args, kwargs)
        rec = self.recorder
        info = rec.known_optimizer(optimizer)
        step = rec.pending_step
        if step is None:
            step = rec.pending_step = blank_step(rec.recording.total_steps + 1)
        if closure:
            step.closure = True
        self.step_info = info   # (the post hook's, unless another optimizer steps in between)
        step.optimizer, step.t, step.zero_grad, step.zero_grad_after_backward, step.epoch, step.batch, \
            step.scheduler_steps, step.grad_enabled = info.index, _monotonic() - rec.t0, rec.zero_grad_since, \
            rec.zero_after_backward, rec.epoch, rec.batch_index, rec.scheduler_count, _grad_enabled()
        if rec.lr_scale:
            rec.rescale_lrs(optimizer)
        groups = optimizer.param_groups
        step.lrs = [float(groups[0]["lr"])] if len(groups) == 1 else list(map(float, map(_LR, groups)))
        reading = self.loss_t
        if reading is not None:
            loss, event, scaler = reading
            self.loss_t = None
            if event is None and scaler is None:  # a CPU loss (see loss_reading)
                try:
                    value = loss.item()  # (no detach, no warning; raises unless one value)
                except RuntimeError:
                    value = float(loss.detach().float().mean()) if loss.numel() else None
                if value is not None:
                    step.loss = value
                    step.losses.append(value)
            else:
                self._read_loss(step, loss, event, scaler)
        self.grad_norms = None
        n = step.step
        if n <= NORM_FIRST or not n % rec.recording.norm_interval and self.norm_due(n):
            self._grad_norm(step, groups)
        listen = self.pre_listener
        if listen is not None:
            try:
                listen(rec, optimizer, step)
            except Exception:  # noqa: BLE001 - a listener must never break the user's run
                rec.recording.listener_errors += 1
        return None

    def _measure_after_closure(self, optimizer, args, kwargs):
        closure = optimizers.closure_of(args, kwargs)
        state = {"first": True}
        policy = self

        def measured_closure(*a, **k):
            result = closure(*a, **k)
            if state["first"]:
                state["first"] = False
                policy.measure(optimizer, closure=True)
            return result

        return optimizers.with_closure(args, kwargs, measured_closure)

    def _read_loss(self, step: StepRecord, loss, event, scaler) -> None:
        """At the step: the loss of a CUDA backward (the pinned copy, waiting on its event) or of a GradScaler's
        scaled one (see :meth:`loss_reading`)."""
        if event is not None:  # CUDA: wait for the forward's loss copy only (see loss_reading)
            event.synchronize()
            step.loss = float(loss)
        else:
            try:
                value = loss.item()  # (no detach, no warning; raises unless one value)
            except RuntimeError:
                value = float(loss.detach().float().mean()) if loss.numel() else None
            scale = scaler.get_scale() if scaler is not None and value is not None else None
            step.loss = value / scale if scale else value
        if step.loss is not None:
            step.losses.append(step.loss)

    def _grad_norm(self, step: StepRecord, groups: list[dict]) -> None:
        """On the steps :meth:`norm_due` picks: the trainable tensors' gradients counted (``grads_total`` /
        ``grads_none``; left 0 on the other steps: walking every parameter's ``.grad`` is a Python-level
        attribute read per tensor) and their global norm (0.0 when none has a gradient), with the per-tensor
        norms kept for the listeners (``grad_norms``)."""
        started = time.perf_counter()
        params, grads = trainable_grads(groups)
        none = list(map(type, grads)).count(_NONE)
        step.grads_total, step.grads_none = len(grads), none
        if none == len(grads):
            step.grad_norm = 0.0
            return
        withgrad = [p for p, g in zip(params, grads) if g is not None] if none else list(params)
        if none:
            grads = [g for g in grads if g is not None]
        if any(map(_REQUIRES, grads)):  # (a gradient with its own graph: create_graph=True)
            grads = [g.detach() for g in grads]
        norms = torch._foreach_norm(grads)
        total = self.recorder.unclipped(step, total_norm(norms))
        step.grad_norm = total
        step.grads_nonfinite = not math.isfinite(total)
        self.grad_norms = (withgrad, norms)
        cost = time.perf_counter() - started
        self.norm_cost = cost if not self.norm_cost else 0.8 * self.norm_cost + 0.2 * cost

    def after_step(self, optimizer, args=None, kwargs=None) -> None:
        """The optimizer step post hook: the step's record joins the bounded window, its time the running step
        time, and the listeners are told."""
        rec = self.recorder
        step = rec.pending_step
        if step is None:
            step = blank_step(rec.recording.total_steps + 1)
        else:
            rec.pending_step = None
        info = self.step_info
        if info is None or info.optimizer is not optimizer:
            info = rec.known_optimizer(optimizer)
        info.steps += 1
        now = _monotonic() - rec.t0
        d = step.duration_s = now - rec.last_step_t
        recording = rec.recording
        recording.steps.append(step)
        recording.total_steps = total = recording.total_steps + 1
        rec.last_step_t, rec.zero_grad_since, rec.zero_after_backward, rec.backwards_since_step, \
            self.grad_norms, rec.clip_norm = now, False, False, 0, None, None
        if total > 1:  # the first step's time includes the program's start; outliers (an evaluation
            # between epochs) move the estimate by at most 4x its size
            s = self.step_s
            self.step_s = 0.9 * s + 0.1 * (d if d < 4 * s else 4 * s) if s else d
        if self.module_hooks:  # discovery: light mode has pending forwards only while its global module hooks are
            reach = rec.reach   # on (forward_pre), and no pending loss calls
            reach.forwards, reach.losses = [], []
            if self.discovered():
                self.unhook_modules()
        listen = self.post_listener
        if listen is not None:
            try:
                listen(rec, optimizer, step)
            except Exception:  # noqa: BLE001 - a listener must never break the user's run
                recording.listener_errors += 1
        if rec.max_steps is not None and total >= rec.max_steps or rec.time_limit_s is not None:
            rec.check_steps()

    def norm_due(self, n: int) -> bool:
        """Is the gradient norm measured at step ``n``? On the first NORM_FIRST steps, then every ``interval``
        steps: the smallest divisor of ``Recorder.norm_every_max`` (watch's log interval) at which one reduction
        costs at most NORM_SHARE of a step, both as measured in this run."""
        if n <= NORM_FIRST:
            return True
        recording = self.recorder.recording
        interval = recording.norm_interval
        if n % interval:
            return False
        if self.step_s > 0:
            need = self.norm_cost / (NORM_SHARE * self.step_s)
            top = max(int(self.recorder.norm_every_max), 1)
            recording.norm_interval = 1 if need <= 1 else \
                next((d for d in range(2, top + 1) if top % d == 0 and d >= need), top)
        return True
