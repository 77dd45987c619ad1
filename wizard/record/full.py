"""The full measuring policy (diagnosis, ``Recorder(mode="full")``): every step, forward and loss call is
recorded, with small CPU copies (the first batches, model inputs, loss inputs and targets, a deep copy of each
model before its first forward), the graph mode (``graph.py``) and hand-written updates (``manual.py``).

Module calls are watched through a patched ``nn.Module.__call__`` rather than the global hooks (a submodule's
call inside a forward passes straight through: no hook path for it). Each optimizer's gradient norm (and the
largest parameter change, ``updates.py``, up to step UPDATE_STEPS) is measured on its first FULL_DETAIL steps,
then on every FULL_EVERY-th (an optimizer over more than FULL_LARGE values: its first FULL_DETAIL_LARGE, then
every FULL_EVERY_LARGE-th), on the last 3 of the step budget and on any step whose loss is non-finite
(``StepRecord.grad_norm`` / ``update`` is None and ``grads_total`` / ``grads_none`` 0 on the others: their
parameters' gradients are not walked; a NaN gradient between two measured steps shows in the next step's
loss); the per-step signals (loss, zero_grad, carried gradients, LRs, model modes, forwards, loss calls) are
recorded on every step; the NaN/Inf check of the forwards' inputs since the last step
(``StepRecord.nonfinite_input``) runs on the same steps. See benchmarks/recorder_overhead.py.
"""

from __future__ import annotations

import copy
import math
import sys
import time
import weakref
from operator import itemgetter
from typing import Any

import torch

from nnwizard.record.autograd import reached, step_nodes
from nnwizard.record.graph import GraphMode
from nnwizard.record.manual import ManualUpdates
from nnwizard.record.models import owner, reads_training
from nnwizard.record.patches import backward, data, losses, modules, optimizers, processes, seeding
from nnwizard.record.policy import Policy
from nnwizard.record.records import ForwardEvent, LossCall, OptimizerInfo, StepRecord
from nnwizard.record.tensors import (cpu_copy, dtype_name, fingerprint, nonfinite_inputs, nonzero, same_storage,
                                     tensors_in, total_norm, trainable_grads)
from nnwizard.record.updates import UpdateMeter

KEEP = 4        # DataLoader batches copied to CPU
KEEP_PAIRS = 16  # training model inputs and loss inputs/targets copied to CPU
# past them, a loss call site (or another model at the same site) not seen in the first KEEP_PAIRS calls still has its
# first SITE_PAIRS calls kept (a second phase: a student trained after its teacher), for up to LATE_SITES sites
SITE_PAIRS, LATE_SITES = 2, 6
SPAN_CHECKS = 4  # steps at whose first backward the graph of the step before is looked for
SPAN_NODES = 2000  # graph nodes of each of those steps kept to check the next step's graph against
FULL_DETAIL = 12  # the first steps whose gradient norm and parameter change are always measured (the trace table shows the first 11),
FULL_EVERY = 8    # then every FULL_EVERY-th step's, the last 3 of the step budget's, and any step with a non-finite loss
FULL_LARGE = 1_000_000  # an optimizer over more values than this has its gradient norm (one memory-bound pass over
FULL_DETAIL_LARGE = 3   # every gradient: ~3 ms per 7M values on one core, several % of a dense model's step) and parameter change
FULL_EVERY_LARGE = 8    # measured on its first FULL_DETAIL_LARGE steps, then every FULL_EVERY_LARGE-th (and the last 3, non-finite losses)
UPDATE_STEPS = 64  # the parameter change (StepRecord.update) is measured up to this step
INPUTS_KEPT = 8    # arguments of the forwards since the last step checked for NaN/Inf at the step

_LR, _NONE = itemgetter("lr"), type(None)


def cadence(groups: list[dict]) -> tuple[int, int]:
    """An optimizer's detail cadence from its param groups (as recorded): its first FULL_DETAIL steps, then
    every FULL_EVERY-th; over more than FULL_LARGE values FULL_DETAIL_LARGE, FULL_EVERY_LARGE."""
    return (FULL_DETAIL_LARGE, FULL_EVERY_LARGE) if sum(g["values"] for g in groups) > FULL_LARGE else (FULL_DETAIL, FULL_EVERY)


class FullPolicy(Policy):
    """See the module docstring."""

    name = "full"

    def __init__(self, recorder):
        super().__init__(recorder)
        self.manual = ManualUpdates(self)
        self.graph = GraphMode(recorder, self.manual)
        self.updates = UpdateMeter()
        self.inputs: list[tuple] = []           # arguments of the forwards since the last step (at most INPUTS_KEPT)
        self.window_values: list[float] = []    # training loss-call values since the last step
        self.site = None   # the frame that called torch's own loss module now running (see model_called)
        self.in_opt_step = False                # inside optimizer.step(): its in-place updates are not hand-written ones
        self.opt_paused = False                 # the graph mode is paused for an optimizer.step() (its post hook resumes)
        self.step_wraps = 0                     # optimizer steps running inside the class step wrapper
        self.wrapped_steps: set = set()         # optimizer classes whose step is wrapped
        self.cleared: set[int] = set()          # id() of optimizers whose zero_grad() ran since the last step
        self.trainable_n: dict[int, int] = {}   # id(optimizer) -> its trainable tensors at its last measured step
        self.carried_by: dict[int, float] = {}  # optimizer index -> its share of grads still set at the first backward after a step
        self.loss_value: tuple | None = None    # (weakref, value) of the last loss call's result
        self.kept_pairs = 0
        self.site_pairs: dict[tuple, int] = {}  # (loss call site, last model): calls whose inputs were kept

    # -- installing ----------------------------------------------------------------------------------
    def install(self) -> None:
        rec = self.recorder
        modules.module_call_full(rec, self)
        optimizers.step_hooks(rec, self.step_pre, self.step_post)
        optimizers.zero_grad(rec, optimizers.zero_grad_full(rec, self))
        optimizers.optimizer_init(rec)
        optimizers.clipping_full(rec, self)
        backward.backward_full(rec, self)
        optimizers.schedulers(rec)
        data.loaders(rec, self)
        modules.checkpoints(rec)
        optimizers.grad_scaler(rec, read_now=True)
        losses.distributions(rec)
        losses.loss_functions(rec, losses.loss_full(rec, self))
        processes.child_processes(rec)
        seeding.manual_seed(rec)
        self.graph.install()

    def uninstall(self) -> None:
        self.graph.uninstall()

    def finish(self) -> None:
        if self.manual.open is not None:
            self.manual.close(budget=False)
        self.manual.candidates = {}
        self.graph.forget()
        self.inputs = []

    # -- what the shell tells ----------------------------------------------------------------------------
    def cadence(self, groups: list[dict]) -> tuple[int, int]:
        return cadence(groups)

    def model_seen(self, info, inner, frame) -> None:
        info.reads_training = reads_training(info.module)
        try:
            info.initial = copy.deepcopy(inner)   # (a DistributedDataParallel copy needs its process group)
        except Exception:  # noqa: BLE001 - some modules cannot be copied; probes then skip
            info.initial = None
        info.owner = owner(info.module, frame)

    def optimizer_seen(self, info: OptimizerInfo) -> None:
        optimizers.step_wrapper(self.recorder, self, type(info.optimizer))

    def optimizer_built(self, info: OptimizerInfo) -> None:
        if info.where is None:
            info.where = self.recorder.where()   # the line that built it (a fix names it)

    def scheduler_stepped(self, entry: dict) -> None:
        if "where" not in entry:
            entry["where"] = self.recorder.where()   # the line that steps it (a fix names it)

    def batch_fetched(self) -> None:
        if self.manual.open is not None:
            self.manual.close()

    def batch_served(self, batch) -> None:
        recording = self.recorder.recording
        if len(recording.batches) < KEEP:
            recording.batches.append(cpu_copy(batch))
        if self.graph.label_watch:
            self.graph.seed_labels(batch)

    # -- models -----------------------------------------------------------------------------------------
    def model_called(self, module, args) -> ForwardEvent | None:
        """A top-level module call begins (see ``patches.modules``; the graph mode leaves the stack until
        :meth:`model_output`): a model's forward event, its first inputs copied, and whether they are finite."""
        rec, graph = self.recorder, self.graph
        rec.depth = 1
        if self.opt_paused:  # a step that raised (no post hook ran) and was caught by the script
            self.opt_paused = self.in_opt_step = False
            graph.resume()
        graph.pause()
        if rec.in_loss:
            return None
        if self.manual.open is not None:
            self.manual.close()
        known = rec.known_module(module)
        if known is not None and known[1] is None:
            if known[2]:   # torch's own loss module: its loss function's call site is this call's
                self.site = sys._getframe(2)   # (model_called <- __call__ <- the caller)
            return None   # a loss module (or a submodule called directly) seen before: no forward event
        reach = rec.reach
        pending = reach.forwards
        found = rec.forward_event(module)
        if found is None:
            return None
        if reach.forwards is not pending:   # the cap dropped the oldest pending forwards (Reach.flush)
            kept = {id(e) for e in reach.forwards}
            for dropped in pending:
                if id(dropped) not in kept:
                    dropped.overflow = True
                    reach.overflowed += 1
        info, event = found
        recording = rec.recording
        event.calls_at, event.fetch = len(recording.loss_calls), rec.fetches
        rec.last_event = event
        if not graph.live and not (event.grad_enabled and event.training):
            graph.set_live(True)   # an evaluation's forward: its predictions (argmax) are watched until the next step
        recording.forwards.append(event)
        rec.last_forward_at = len(recording.forwards) - 1
        if graph.labels:
            graph.label_check(event, args)
        if event.grad_enabled and len(recording.model_inputs) < KEEP_PAIRS:
            recording.model_inputs.append((event.model, cpu_copy(tuple(args))))
            recording.model_input_forwards.append(rec.last_forward_at)
        elif not event.grad_enabled and len(recording.eval_inputs) < KEEP_PAIRS:
            recording.eval_inputs.append((event.model, fingerprint(args)))
        if len(self.inputs) < INPUTS_KEPT:   # checked for NaN/Inf at the step, when its gradient norm is measured
            self.inputs.append(args)
        rec.check_forwards()
        if rec.listening:
            rec.notify("on_forward", info, args)
        return event

    def model_output(self, event: ForwardEvent, output) -> None:
        """The model's forward returned ``output``: what its loss and a later backward are traced back to (the
        first output tensor; up to 4 outputs' graph nodes)."""
        rec = self.recorder
        self.graph.label_output(event, output)
        if isinstance(output, torch.Tensor):
            out, node = output, output.grad_fn
            outs = [node] if node is not None else []
        else:
            out = next(tensors_in(output), None)
            if out is None:
                return
            node = out.grad_fn
            outs = [t.grad_fn for t, _ in zip(tensors_in(output), range(4)) if t.grad_fn is not None]
        rec.last_out = (event.model, weakref.ref(out), list(out.shape))
        reach = rec.reach
        pending = reach.forwards
        if pending and pending[-1] is event:   # every output (an RNN's hidden state too): for graphs carried across steps
            event.node, event.outs = node, outs
            if node is not None and len(pending) > 1 and event.grad_enabled:
                if not event.training:
                    reach.absorb(event, lambda e: not e.training)
                elif event.loader is not None:
                    reach.absorb(event, lambda e: e.training and e.model == event.model
                                 and e.loader == event.loader and e.fetch < event.fetch)

    # -- losses -----------------------------------------------------------------------------------------
    def loss_called(self, name: str, args, kwargs, value, original=None) -> None:
        """A loss function returned ``value``: its LossCall (shapes, dtypes, value, reduction, whether its input
        comes from a model's output, the line), the first calls' inputs and targets copied."""
        rec = self.recorder
        x = args[0] if args else kwargs.get("input")
        y = args[1] if len(args) > 1 else kwargs.get("target")
        if not isinstance(x, torch.Tensor):
            return
        reduction = kwargs.get("reduction", "mean") if kwargs else "mean"
        if kwargs and (kwargs.get("size_average") is False or kwargs.get("reduce") is False):
            reduction = "sum" if kwargs.get("reduce") is not False else "none"
        grad = torch.is_grad_enabled()
        v = None
        is_tensor = isinstance(value, torch.Tensor)
        if is_tensor:
            n = value.numel()
            if n:
                v = value.item() if n == 1 else float(value.detach().float().mean())   # (item(): no detach op)
                self.loss_value = (weakref.ref(value), v)
                if grad:
                    self.window_values.append(v)
        from_model, out_shape, direct, from_last = self._from_model(x)
        if rec.in_model:  # called inside a model's forward (Hugging Face models compute their own loss); a loss
            from_model = True  # module's own call (nn.CrossEntropyLoss) is a top-level call too, but not a model's
        event = rec.last_event
        if from_model and event is not None and (from_last or rec.in_model):
            event.scored = True   # (the forward that made the input: not a teacher's run after its student's)
        same = False
        y_tensor = isinstance(y, torch.Tensor)
        if y_tensor:
            ref = self.graph.derived.get(id(y))
            same = (ref is not None and ref() is y) or (
                y is not x and y.dtype == x.dtype and y.numel() > 0
                and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
        last_model = rec.last_model
        training = last_model.module.training if last_model else None
        call = LossCall(fn=name, input_shape=list(x.shape), input_dtype=dtype_name(x.dtype),
                        target_shape=list(y.shape) if y_tensor else None,
                        target_dtype=dtype_name(y.dtype) if y_tensor else None, value=v, reduction=reduction,
                        grad_enabled=grad, training=training, step=rec.recording.total_steps,
                        where=rec.where(3, self.site),   # (3: the loss wrapper's caller)
                        from_model=from_model, model_output_shape=out_shape, target_is_output=same)
        if last_model is not None:
            call.model = last_model.index
        if from_model and event is not None:
            call.forward = rec.last_forward_at
            if y_tensor and y.grad_fn is not None and x.grad_fn is not None:   # (rare in supervised training: searched
                call.target_grad = self._target_reaches_input_model(x, y)      # only then)
        if grad and (self.kept_pairs < KEEP_PAIRS or self._late_site(call)):
            self.kept_pairs += 1
            self.site_pairs[call.where, call.model] = self.site_pairs.get((call.where, call.model), 0) + 1
            call.inputs, call.targets = cpu_copy(x), cpu_copy(y)
            call.replay = (original, tuple(args[2:]), {k: v for k, v in kwargs.items() if k not in ("input", "target")})
            if y_tensor and self.inputs:
                call.target_arg = same_storage(y, self.inputs[-1])
        if is_tensor:
            call.node = value.grad_fn
        if not self.graph.live:   # (a target derived from the output by ops the mode did not see looks separate)
            call.watched = False
        rec.recording.loss_calls.append(call)
        if call.node is not None:
            reach = rec.reach
            if training is False and reach.losses:   # an evaluation's loss with a graph: see Reach.absorb
                for old in reach.losses:
                    if old.training is False:
                        old.node = None
                reach.losses = [c for c in reach.losses if c.node is not None]
            reach.losses.append(call)
            # the backward on this very value reaches this call and, when x is the last output (or its
            # graph reaches it), that forward: before_backward need not search the graph
            reach.link(value, call, event if event is not None and direct is not None and event.node is direct else None)
        if rec.listening:
            rec.notify("on_loss", call)
            rec.notify("on_loss_args", call, args, kwargs, value)  # watch: the live tensors

    def _target_reaches_input_model(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether the loss target ``y`` backpropagates into a forward of a model whose forward the input ``x`` comes
        from (a TD target computed by the network being trained, with grad on); a teacher's output (another model)
        is not."""
        pending = self.recorder.reach.forwards[-64:]
        node_model = {id(n): e.model for e in pending for n in e.outs}
        if not node_model:
            return False
        mine = {node_model[i] for i in reached(x.grad_fn, set(node_model), limit=400)}
        outs = {i for i, m in node_model.items() if m in mine}
        return bool(outs and reached(y.grad_fn, outs, limit=400))

    def _late_site(self, call: LossCall) -> bool:
        """Past KEEP_PAIRS: keep this call's inputs too when its site (where, and which model ran last) has fewer
        than SITE_PAIRS kept and is one of the first LATE_SITES sites seen late (marks it ``late``)."""
        kept = self.site_pairs.get((call.where, call.model))
        if kept is None and len(self.site_pairs) >= LATE_SITES or (kept or 0) >= SITE_PAIRS:
            return False
        call.late = True
        return True

    def _from_model(self, x: torch.Tensor) -> tuple[bool, list | None, Any, bool]:
        """Does the loss input ``x`` come from a model's output: (yes, that output's shape, the output's graph node
        when ``x`` is the last forward's first output or its graph reaches it, and whether ``x`` comes from the last
        forward itself rather than from an earlier one still pending)."""
        rec = self.recorder
        if rec.last_out is None:
            return False, None, None, False
        _, ref, shape = rec.last_out
        out = ref()
        if out is None:   # (the output was freed: taken to be the last one's)
            return bool(x.requires_grad), shape, None, bool(x.requires_grad)
        if x is out:
            return True, shape, out.grad_fn, True
        target = out.grad_fn
        # a view of the output (out.squeeze(1), out.view(-1, C)) comes from it whether or not a graph says so; the
        # search below still finds the output's node for it (the backward then needs none, see Reach.linked)
        shared = bool(x.numel()) and x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
        if target is None and (shared or x.grad_fn is None):
            return shared, shape, None, shared
        # (the last forward ran without a graph, a teacher under no_grad after its student: the pending search below)
        stack, seen = [x.grad_fn] if target is not None else [], 0
        while stack and seen < 200:
            node = stack.pop()
            if node is None:
                continue
            seen += 1
            if node == target:
                return True, shape, target, True
            stack.extend(fn for fn, _ in node.next_functions)
        if shared:
            return True, shape, None, True
        # any output of a forward no backward has reached yet (a second output, e.g. an actor-critic's value
        # head, or an output saved over an episode before one backward)
        reach = rec.reach
        outs = {id(n) for e in reach.forwards[-64:] for n in e.outs} | reach.dropped_outs.keys()
        if outs and x.grad_fn is not None and reached(x.grad_fn, outs, limit=200):
            return True, shape, None, False
        return False, shape, None, False

    # -- backward ---------------------------------------------------------------------------------------
    def before_backward(self, tensors_) -> None:
        """Before the outermost ``backward()``: the step's loss, the gradients carried from the last step (at
        its first backward), which pending forwards and loss calls it reaches (``reach.py``)."""
        rec, manual = self.recorder, self.manual
        if manual.open is not None:
            manual.close()
        loss = tensors_ if isinstance(tensors_, torch.Tensor) else next(tensors_in(tensors_), None)
        recording = rec.recording
        recording.backwards += 1
        step = rec.pending_step or rec.step_record()
        if rec.backwards_since_step == 0 and recording.total_steps:
            self._first_backward(step, loss)
        rec.backwards_since_step += 1
        rec.zeroed_since_backward = False
        step.backwards += 1
        reach = rec.reach
        if loss is not None and loss.numel():
            self._backward_loss(step, loss)
            if len(recording.steps) < SPAN_CHECKS and loss.grad_fn is not None and len(reach.trained_nodes) < SPAN_NODES:
                reach.trained_nodes += step_nodes(loss.grad_fn, SPAN_NODES)   # (for the next step's span check)
        reach.backward(step, loss)
        if rec.loader_stack:
            rec.loader_stack[-1].backwards[-1] += 1
        if manual.stale():
            manual.refresh()   # (else nothing changed since it last ran)
        if rec.listening:
            rec.notify("on_backward", loss)
        rec.check_backwards()

    def _first_backward(self, step: StepRecord, loss: torch.Tensor | None) -> None:
        """The first backward after an optimizer step: the gradients still set from before it, and (on the
        first SPAN_CHECKS steps) whether this graph reaches the last step's forwards."""
        rec = self.recorder
        recording, reach = rec.recording, rec.reach
        step.carried, self.carried_by = self._carried()
        if reach.prev_nodes and loss is not None and len(recording.steps) <= SPAN_CHECKS:
            if reached(loss.grad_fn, {id(n) for n in reach.prev_nodes}) and len(recording.graph_spans) < 8:
                recording.graph_spans.append(f"{rec.where() or '?'} at step {len(recording.steps) + 1}")
        reach.prev_nodes = []

    def _backward_loss(self, step: StepRecord, loss: torch.Tensor) -> None:
        """The value ``backward()`` gets (unscaled by a GradScaler's scale) joins the step's losses; the tensor
        is watched by the graph mode afterwards (an op on it that keeps its graph)."""
        rec = self.recorder
        known = self.loss_value
        if known is not None and known[0]() is loss:  # backward on the loss call's own result: read once
            value = known[1]
        else:
            value = float(loss.detach().float().mean()) if loss.numel() > 1 else float(loss.detach())
        if rec.scales:
            scaled = rec.scales.pop(id(loss), None)
            if scaled is not None and scaled[0]() is loss and scaled[1]:
                value /= scaled[1]
            if len(rec.scales) > 16:
                rec.scales = {k: v for k, v in rec.scales.items() if v[0]() is not None}
        step.losses.append(value)
        step.loss = value
        self.graph.spend(loss)

    def _carried(self) -> tuple[float | None, dict[int, float]]:
        """Share of the optimizers' trainable tensors whose .grad is still non-zero now, at the first
        backward after a step (cleared gradients are None or all zero): over all of them (and the
        parameters a hand-written update changed), and per optimizer index (each optimizer's own
        tensors: with several optimizers, each must clear its own before its own backward). When every
        optimizer's zero_grad() ran since the last step (and no backward since), none is carried: no scan."""
        recording = self.recorder.recording
        counts: dict[int, list[int]] = {}   # optimizer index (-1: hand-updated tensors) -> [non-zero, tensors]
        owned = []
        for info in recording.optimizers:
            n = self.trainable_n.get(id(info.optimizer)) if id(info.optimizer) in self.cleared else None
            if n is not None:   # its zero_grad() ran since the last step: nothing to scan
                if n:
                    counts[info.index] = [0, n]
                continue
            owned += [(info.index, p.grad) for g in info.optimizer.param_groups for p in g["params"] if p.requires_grad]
        updated = recording.manual_updated   # parameters a hand-written update changed (not merely outside every optimizer)
        if updated:
            seen = {id(p) for info in recording.optimizers for g in info.optimizer.param_groups for p in g["params"]}
            owned += [(-1, p.grad) for key, (p, _) in self.manual.candidates.items()
                      if key == id(p) and key in updated and key not in seen]
        if not owned:   # every optimizer cleared its own (or none has a trainable tensor)
            return (0.0, dict.fromkeys(counts, 0.0)) if counts else (None, {})
        for i, _ in owned:
            counts.setdefault(i, [0, 0])[1] += 1
        live = [(i, g) for i, g in owned if g is not None]
        if live:
            for (i, _), moved in zip(live, nonzero(torch._foreach_norm([g.detach() for _, g in live]))):
                if moved:
                    counts[i][0] += 1
        return sum(c[0] for c in counts.values()) / sum(c[1] for c in counts.values()), \
            {i: c[0] / c[1] for i, c in counts.items()}

    # -- optimizer steps ----------------------------------------------------------------------------------
    def step_pre(self, optimizer, args, kwargs):
        """The optimizer step pre hook: measure (for ``step(closure)``: after the closure's first call, the
        closure being the user's loop, watched by the graph mode)."""
        if self.manual.open is not None:
            self.manual.merge()
        self.in_opt_step = True   # its in-place updates are not hand-written ones
        graph = self.graph
        if not self.opt_paused:
            self.opt_paused = True
            graph.pause()
        closure = optimizers.closure_of(args, kwargs)
        if closure is not None:
            policy = self
            state = {"first": True}

            def measured_closure(*a, **k):
                paused = policy.opt_paused
                if paused:  # the closure is the user's loop: watched
                    policy.opt_paused = False
                    graph.resume()
                try:
                    result = closure(*a, **k)
                finally:
                    if paused:
                        policy.opt_paused = True
                        graph.pause()
                if state["first"]:
                    state["first"] = False
                    policy.measure(optimizer, closure=True)
                return result

            return optimizers.with_closure(args, kwargs, measured_closure)
        self.measure(optimizer)
        return None

    def measure(self, optimizer, closure: bool = False) -> None:
        """Before the update: the step's per-step signals, and on the steps :meth:`_detail_due` picks its
        gradients and the values its change is measured against."""
        rec = self.recorder
        info = rec.known_optimizer(optimizer)
        step = rec.pending_step or rec.step_record()
        step.closure = closure
        step.optimizer, step.t = info.index, time.monotonic() - rec.t0
        if info.index in self.carried_by:  # this optimizer's own gradients, measured at the first backward after the last step
            step.carried = self.carried_by[info.index]
        step.zero_grad = rec.zero_grad_since
        step.zero_grad_after_backward = rec.zero_after_backward
        step.epoch, step.batch = rec.epoch, rec.batch_index
        step.scheduler_steps = rec.scheduler_count
        if rec.lr_scale:
            rec.rescale_lrs(optimizer)
        groups = optimizer.param_groups
        step.lrs = list(map(float, map(_LR, groups)))
        step.grad_enabled = torch.is_grad_enabled()
        values = self.window_values
        step.loss_calls = len(values)
        step.loss_call_mean = sum(values) / len(values) if values else None
        inputs, self.inputs = self.inputs, []
        if self._detail_due(info, step):
            self._measure_detail(optimizer, step, inputs)
        if rec.listening:
            rec.notify("on_step_pre", optimizer, step)

    def _detail_due(self, info: OptimizerInfo, step: StepRecord) -> bool:
        """Is this step measured in detail (see :meth:`_measure_detail`)? The optimizer's own steps on its
        ``cadence`` (counted per optimizer: a GAN's two alternate), the last 3 of the step budget and any step
        whose loss is non-finite."""
        own = info.steps + 1
        first, every = info.cadence
        max_steps = self.recorder.max_steps
        return own <= first or not own % every or (max_steps is not None and step.step > max_steps - 3) \
            or (step.loss is not None and not math.isfinite(step.loss))

    def _measure_detail(self, optimizer, step: StepRecord, inputs: list[tuple]) -> None:
        """A step :meth:`_detail_due` picks: which trainable tensors have a gradient (``grads_total`` /
        ``grads_none``, their names on the first 3 steps), the global gradient norm (0.0 when none has one),
        NaN/Inf in the forwards' inputs since the last step, and (up to step UPDATE_STEPS) the parameter values
        the step's change is measured against. The other steps keep the defaults (0, 0, None): the per-step
        signals (loss, zero_grad, carried gradients, LRs, modes) are recorded on every step."""
        rec = self.recorder
        trainable, grads = trainable_grads(optimizer.param_groups)
        self.trainable_n[id(optimizer)] = len(trainable)
        none = list(map(type, grads)).count(_NONE)   # (list.count(None) would call Tensor.__eq__)
        if none:
            grads = [g for g in grads if g is not None]
        step.grads_total, step.grads_none = len(trainable), none
        if inputs:
            step.nonfinite_input = step.nonfinite_input or nonfinite_inputs(inputs)
        if grads:
            total = rec.unclipped(step, total_norm(torch._foreach_norm([g if not g.requires_grad else g.detach()
                                                                        for g in grads])))
            step.grad_norm = total
            step.grads_nonfinite = not math.isfinite(total)
        else:
            step.grad_norm = 0.0
        if step.step <= 3 and none:
            models = rec.recording.models
            names = {id(p): f"{m.name}.{n}" if len(models) > 1 else n for m in models for n, p in m.module.named_parameters()}
            step.none_names = [names.get(id(p), "?") for p in trainable if p.grad is None][:40]
        if trainable and step.step <= UPDATE_STEPS:
            self.updates.before(optimizer, trainable)

    def step_post(self, optimizer, args, kwargs):
        """The optimizer step post hook: the step's record completes (see :meth:`_after_step`)."""
        self.in_opt_step = False
        try:
            self._after_step(optimizer)
        finally:
            if self.opt_paused and not self.step_wraps:   # (else the class's step wrapper resumes)
                self.opt_paused = False
                self.graph.resume()

    def _after_step(self, optimizer) -> None:
        rec = self.recorder
        step = rec.pending_step or rec.step_record()
        rec.pending_step = None
        info = rec.known_optimizer(optimizer)
        info.steps += 1
        self.updates.after(optimizer, step)
        now = time.monotonic() - rec.t0
        step.duration_s = now - rec.last_step_t
        rec.last_step_t = now
        recording = rec.recording
        recording.steps.append(step)
        recording.total_steps += 1
        rec.zero_grad_since = rec.zero_after_backward = False
        rec.backwards_since_step = 0
        rec.clip_norm = None
        self.cleared = set()
        self.graph.count_alive()
        self.window_values = []
        rec.reach.stepped()
        if self.graph.installed:
            self.graph.set_live(self.graph.due(recording.total_steps + 1))
        if rec.listening:
            rec.notify("on_step_post", optimizer, step)
        rec.check_steps()
