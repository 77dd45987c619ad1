"""Patches on ``backward()``: ``torch.autograd.backward`` (``Tensor.backward`` calls it) and, in full mode,
``Tensor.backward`` itself (the graph mode must leave the stack before ``Tensor.backward``'s own
``__torch_function__`` check). The policy sees the outermost backward only, before it runs."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from nnwizard.record.records import STEP_BLANK, StepRecord

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.full import FullPolicy
    from nnwizard.record.light import LightPolicy
    from nnwizard.record.recorder import Recorder


def backward_full(rec: "Recorder", full: "FullPolicy") -> None:
    graph = full.graph

    def make(original):
        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            if rec.in_backward:
                return original(tensors, *args, **kwargs)
            rec.in_backward += 1
            graph.pause()
            try:
                full.before_backward(tensors)
                result = original(tensors, *args, **kwargs)
            finally:
                rec.in_backward -= 1
                graph.resume()
            return result
        return backward

    rec.patch(torch.Tensor, "backward", make)
    rec.patch(torch.autograd, "backward", make)


def backward_light(rec: "Recorder", light: "LightPolicy") -> None:
    """Light mode's ``torch.autograd.backward`` wrapper: one frame for the common case, a CPU tensor, no
    GradScaler, no discovery and no budget (:meth:`LightPolicy.before_backward`'s work inline, its listener
    called directly, an inline listener's work done here: see ``listeners.py``); anything else goes through
    :meth:`LightPolicy.before_backward`."""
    listen = rec.events.combined("on_backward")
    tensor = torch.Tensor
    w = rec.inline
    cap = w.max_per_step if w is not None else 0
    new, blank = object.__new__, STEP_BLANK
    reach, recording = rec.reach, rec.recording

    def make(original):
        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            if rec.in_backward:
                return original(tensors, *args, **kwargs)
            rec.in_backward = 1
            try:
                if rec.scales or reach.forwards or rec.max_steps is not None \
                        or not isinstance(tensors, tensor) or tensors.is_cuda:
                    light.before_backward(tensors)
                else:
                    step = rec.pending_step
                    if step is None:  # (blank_step, inline: the step's first backward opens its record)
                        step = rec.pending_step = new(StepRecord)
                        step.__dict__ = d = blank.copy()
                        d["step"], d["losses"], d["lrs"], d["none_names"], d["forwards"], d["training"] = \
                            recording.total_steps + 1, [], [], [], {}, {}
                    recording.backwards += 1
                    rec.backwards_since_step += 1
                    step.backwards += 1
                    light.loss_t = (tensors, None, None)  # a CPU loss, no GradScaler: read as it is at the step
                    if w is not None:  # the inline listener's on_backward, its common case: the last loss call itself
                        try:
                            cur = w.step_calls
                            backward, losses = cur["backward"], cur["losses"]
                            if losses and tensors is losses[-1][3] and len(backward) < cap:
                                backward.append({"kind": "loss-call", "loss": len(losses) - 1, "scale": 1.0})
                            else:
                                w.on_backward(rec, tensors)
                        except Exception:  # noqa: BLE001 - a listener must never break the user's run
                            recording.listener_errors += 1
                    if listen is not None:
                        try:
                            listen(rec, tensors)
                        except Exception:  # noqa: BLE001 - a listener must never break the user's run
                            recording.listener_errors += 1
                return original(tensors, *args, **kwargs)
            finally:
                rec.in_backward = 0
        return backward

    rec.patch(torch.autograd, "backward", make)
