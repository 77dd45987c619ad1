"""Patches on the objective: the ``torch.nn.functional`` loss functions (the tensors that reach the loss after
the user's own reshaping; the ``nn.*Loss`` modules call these too) and, in full mode, ``torch.distributions``
objects built from tensors that require grad (a policy from the model's output, a VAE's posterior: the objective
is then a likelihood or a policy gradient, not a curve that must descend)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from nnwizard.record.records import LossCall
from nnwizard.record.tensors import cpu_copy, shape_of

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.full import FullPolicy
    from nnwizard.record.light import LightPolicy
    from nnwizard.record.recorder import Recorder

LOSS_FUNCTIONS = (
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
    "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
    "multi_margin_loss", "triplet_margin_loss", "ctc_loss", "multilabel_margin_loss",
)
_compiling = torch.compiler.is_compiling   # True while torch.compile traces a graph (not recorded: light mode)
_grad_enabled = torch.is_grad_enabled


def loss_functions(rec: "Recorder", make: Callable[[str, Callable], Callable]) -> None:
    """Every loss function of ``LOSS_FUNCTIONS`` this torch has, wrapped by ``make(name, original)``."""
    for name in LOSS_FUNCTIONS:
        if hasattr(F, name):
            rec.patch(F, name, lambda original, name=name: make(name, original))


def called(rec: "Recorder", name: str, original: Callable, args, kwargs):
    """The loss function itself, called with ``rec.in_loss`` set (the losses and modules it calls are not the
    program's own calls); when it raises, its name and target are kept for the crash audit."""
    rec.in_loss = 1
    try:
        return original(*args, **kwargs)
    except Exception:
        y = args[1] if len(args) > 1 else kwargs.get("target")
        rec.recording.failed_loss = (name, cpu_copy(y) if isinstance(y, torch.Tensor) else None)
        raise
    finally:
        rec.in_loss = 0


def loss_full(rec: "Recorder", full: "FullPolicy") -> Callable[[str, Callable], Callable]:
    """Full mode: each outermost loss call is recorded (``FullPolicy.loss_called``), the graph mode paused."""
    graph = full.graph

    def make(name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def loss(*args, **kwargs):
            if rec.in_loss:
                return original(*args, **kwargs)
            graph.pause()
            try:
                value = called(rec, name, original, args, kwargs)
                try:
                    full.loss_called(name, args, kwargs, value, original)
                except Exception:  # noqa: BLE001 - recording must never break the loss
                    pass
            finally:
                graph.resume()
            return value
        return loss
    return make


def loss_light(rec: "Recorder", light: "LightPolicy") -> Callable[[str, Callable], Callable]:
    """Light mode: no loss call is kept (watch runs are long) and no value read (no sync); the listeners get
    the live tensors. With no ``on_loss`` listener (watch), ``on_loss_args`` gets a name-only LossCall, the
    inline listener's work is done here (``listeners.py``) and the others are called as one (fewer steps)."""
    on_loss, on_args = rec.events.fns["on_loss"], rec.events.fns["on_loss_args"]
    listen = rec.events.combined("on_loss_args")
    recording, tensor = rec.recording, torch.Tensor
    w = rec.inline
    cap = w.max_per_step if w is not None else 0

    def make(name: str, original: Callable) -> Callable:
        named = LossCall(fn=name, from_model=True)   # one name-only call for every call of this function

        @functools.wraps(original)
        def loss(*args, **kwargs):
            if rec.in_loss or _compiling():   # (inside a graph torch.compile traces: not recorded)
                return original(*args, **kwargs)
            value = called(rec, name, original, args, kwargs)
            x = args[0] if args else kwargs.get("input")
            if not isinstance(x, tensor):
                return value
            if on_loss:
                _told(rec, name, x, args, kwargs, value, on_args)
                return value
            if w is not None:  # the inline listener's on_loss_args
                try:
                    cur = w.step_calls
                    losses = cur["losses"]
                    if _grad_enabled() and isinstance(value, tensor) and len(losses) < cap:
                        losses.append((name, args, kwargs, value))
                        cur["targets"].append(args[1] if len(args) > 1 else kwargs.get("target"))
                except Exception:  # noqa: BLE001 - a listener must never break the user's run
                    recording.listener_errors += 1
            if listen is not None:
                try:
                    listen(rec, named, args, kwargs, value)
                except Exception:  # noqa: BLE001 - a listener must never break the user's run
                    recording.listener_errors += 1
            return value
        return loss
    return make


def _told(rec: "Recorder", name: str, x, args, kwargs, value, on_args: list) -> None:
    """Light mode with an ``on_loss`` listener: the call described (shapes, reduction, grad mode) to it, then to
    the ``on_loss_args`` ones."""
    try:
        call = LossCall(fn=name, input_shape=list(x.shape), input_dtype=str(x.dtype).replace("torch.", ""),
                        target_shape=shape_of(args[1] if len(args) > 1 else kwargs.get("target")),
                        reduction=kwargs.get("reduction", "mean"), grad_enabled=torch.is_grad_enabled(),
                        step=rec.steps_taken, from_model=True)
    except Exception:  # noqa: BLE001 - recording must never break the loss
        return
    rec.notify("on_loss", call)
    for fn in on_args:
        rec.events.call(rec, fn, call, args, kwargs, value)


def distributions(rec: "Recorder") -> None:
    """Full mode: ``torch.distributions.Distribution.__init__`` counts distributions built from tensors that
    require grad (``Recording.distributions``)."""
    def make(original):
        @functools.wraps(original)
        def init(this, *args, **kwargs):
            original(this, *args, **kwargs)
            if any(isinstance(v, torch.Tensor) and v.requires_grad for v in vars(this).values()):
                rec.recording.distributions += 1
        return init

    rec.patch(torch.distributions.Distribution, "__init__", make)
