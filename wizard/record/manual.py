"""Hand-written parameter updates (full mode): an in-place op on a trainable parameter after a backward,
outside ``optimizer.step()`` (``p -= lr * p.grad``, ``p.data.add_(...)``), seen by the graph mode, is a step of
its own (``StepRecord.manual``), unless an ``optimizer.step()`` follows before the next forward, backward or
zero_grad (an edit of the parameters before the optimizer's own step is merged into that step)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from nnwizard.record.tensors import nonfinite_inputs, storage_ptr

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.full import FullPolicy


class ManualUpdates:
    """The candidates (trainable parameters, by id and by storage) and the update open now, if any."""

    def __init__(self, policy: "FullPolicy"):
        self.policy, self.recorder = policy, policy.recorder
        self.candidates: dict[int, tuple] = {}   # storage ptr / id -> (param, name): trainable parameters
        self.key: tuple | None = None            # (models, optimizers) counted when the candidates were listed
        self.open: tuple | None = None   # (step, [(param, copy, grad norm)], updated ids) of a hand-written update
        self.grad_scaled: set[int] = set()       # lr_scale: ids of hand-updated parameters whose gradients are scaled

    def refresh(self) -> None:
        """List the trainable parameters of the recorded models and of the optimizers (again, when models or
        optimizers were added since, or an update is open)."""
        recording = self.recorder.recording
        key = (len(recording.models), len(recording.optimizers))
        if key == self.key and self.open is None:
            return
        self.key = key
        cand: dict[int, tuple] = {}

        def add(p, name):
            if p.requires_grad and id(p) not in cand:
                cand[id(p)] = (p, name)
                ptr = storage_ptr(p)
                if ptr is not None:
                    cand[ptr] = cand[id(p)]
        for m in recording.models:
            for n, p in m.module.named_parameters():
                add(p, f"{m.name}.{n}" if len(recording.models) > 1 else n)
        stepped = set()   # ids of the parameters an optimizer holds
        for o in recording.optimizers:   # parameters of modules no hook saw (forward called directly)
            for gi, g in enumerate(o.optimizer.param_groups):
                for pi, p in enumerate(g["params"]):
                    add(p, f"{o.name}.group{gi}[{pi}]")
                    stepped.add(id(p))
        self.candidates = cand
        if self.recorder.lr_scale:
            self._scale_gradients([p for key, (p, _) in cand.items() if key == id(p) and key not in stepped])

    def stale(self) -> bool:
        """Models or optimizers were added since the candidates were listed, or an update is open."""
        recording = self.recorder.recording
        return self.open is not None or self.key != (len(recording.models), len(recording.optimizers))

    def _scale_gradients(self, params: list) -> None:
        """A scaled-LR intervention on parameters no optimizer holds (a hand-written ``p -= lr * p.grad``):
        every gradient reaching them is scaled instead, which scales the script's own learning rate for
        plain SGD updates. Tensor hooks, removed on exit."""
        scale = self.recorder.lr_scale
        for p in params:
            if id(p) in self.grad_scaled or not p.requires_grad:
                continue
            try:
                handle = p.register_hook(lambda g, k=scale: g * k)
            except RuntimeError:  # noqa: PERF203 - a tensor that takes no hooks
                continue
            self.grad_scaled.add(id(p))
            self.recorder.on_exit(handle.remove)

    def maybe(self, name: str, first) -> None:
        """The graph mode saw the in-place op ``name`` on ``first``: a candidate changed after a backward."""
        if self.policy.in_opt_step:
            return
        cand = self.candidates
        tensors = first if isinstance(first, (list, tuple)) else [first]
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                return
            hit = cand.get(id(t)) if name == "__set__" or isinstance(t, nn.Parameter) else None
            if hit is None:
                hit = cand.get(storage_ptr(t))
            if hit is None or hit[0].grad is None:
                continue
            if self.open is None:
                if not self.recorder.backwards_since_step:
                    continue
                self._open()
            self.open[2].add(id(hit[0]))

    def _open(self) -> None:
        from nnwizard.record.full import UPDATE_STEPS   # (the full policy's schedule)

        rec, policy = self.recorder, self.policy
        step = rec.step_record()
        params = [p for key, (p, _) in self.candidates.items() if key == id(p)]
        step.manual, step.optimizer, step.t = True, -1, rec.now()
        step.nonfinite_input = step.nonfinite_input or nonfinite_inputs(policy.inputs)
        policy.inputs = []
        step.zero_grad = rec.zero_grad_since
        step.zero_grad_after_backward = rec.zero_after_backward
        step.epoch, step.batch = rec.epoch, rec.batch_index
        step.scheduler_steps = len(rec.recording.scheduler_steps)
        step.grad_enabled = torch.is_grad_enabled()
        with_grad = [p for p in params if p.grad is not None]
        step.grads_total, step.grads_none = len(params), len(params) - len(with_grad)
        norms = dict(zip(map(id, with_grad), map(float, torch._foreach_norm([p.grad.detach() for p in with_grad])))) \
            if with_grad else {}
        step.grad_norm = math.sqrt(sum(n ** 2 for n in norms.values()))
        step.grads_nonfinite = not math.isfinite(step.grad_norm)
        values = policy.window_values
        step.loss_calls, step.loss_call_mean = len(values), (sum(values) / len(values) if values else None)
        if step.step <= 3 and step.grads_none:
            names = {id(p): n for key, (p, n) in self.candidates.items() if key == id(p)}
            step.none_names = [names[id(p)] for p in params if p.grad is None][:40]
        copies = [(p, p.detach().clone(), norms.get(id(p), 0.0)) for p in params] if step.step <= UPDATE_STEPS else []
        self.open = (step, copies, set())

    def merge(self) -> None:
        """optimizer.step() follows in-place edits of parameters after a backward: one step, the
        optimizer's (the parameters changed by hand count as updated, see trace-optimizer)."""
        step, _, updated = self.open
        self.open = None
        step.manual, step.none_names, step.optimizer = False, [], -1
        self.recorder.recording.manual_updated |= updated

    def close(self, budget: bool = True) -> None:
        """The update ended (a forward, backward, zero_grad or batch came next): its step is recorded, with the
        parameters' largest change, the SGD learning rate it amounts to and its cosine with the gradient."""
        rec, policy = self.recorder, self.policy
        step, copies, updated = self.open
        self.open = None
        rec.pending_step = None
        step.updated = len(updated)
        rec.recording.manual_updated |= updated
        if copies:
            diffs = [((p.detach() - c).float(), id(p) in updated, g, p) for p, c, g in copies if p.shape == c.shape]
            step.update = max((float(d.abs().max()) for d, _, _, _ in diffs if d.numel()), default=0.0)
            moved = math.sqrt(sum(float(d.norm()) ** 2 for d, hit, _, _ in diffs if hit))
            grad = math.sqrt(sum(g ** 2 for _, hit, g, _ in diffs if hit))
            step.lrs = [moved / grad] if grad else []  # |update| / |gradient| of the updated tensors: plain SGD's lr
            pairs = [(d, p.grad) for d, hit, _, p in diffs if hit and p.grad is not None and p.grad.shape == p.shape]
            if pairs and moved and grad:
                dot = sum(float((d * g.detach().float()).sum()) for d, g in pairs)
                gnorm = math.sqrt(sum(float(g.detach().float().norm()) ** 2 for _, g in pairs))
                dnorm = math.sqrt(sum(float(d.norm()) ** 2 for d, _ in pairs))
                step.update_cos = dot / (gnorm * dnorm) if gnorm and dnorm else None
        now = rec.now()
        step.duration_s, rec.last_step_t = now - rec.last_step_t, now
        rec.recording.steps.append(step)
        rec.recording.total_steps += 1
        policy.graph.count_alive()
        rec.reach.stepped()
        rec.zero_grad_since, policy.window_values, rec.backwards_since_step = False, [], 0
        rec.zero_after_backward = False
        self.key = None  # `.data = ...` gave parameters new storage
        self.refresh()
        if budget and rec.listening:   # (no optimizer: the listeners' step budgets and caps count it all the same)
            rec.notify("on_step_post", None, step)
        if budget:
            rec.check_steps("steps (hand-written updates)")
