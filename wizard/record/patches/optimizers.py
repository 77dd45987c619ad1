"""Patches on optimizers and what steps them: construction, ``zero_grad``, the step hooks, each optimizer
class's ``step`` (full mode), gradient clipping, LR schedulers and ``GradScaler.scale``."""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from nnwizard.record.records import ClipCall, wrapped_optimizer

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.full import FullPolicy
    from nnwizard.record.recorder import Recorder

CLIP_KEEP = 200  # full mode: gradient-clipping calls recorded


def optimizer_init(rec: "Recorder") -> None:
    """``Optimizer.__init__``: an optimizer is recorded as it is built (the policy may note the line)."""
    def make(original):
        @functools.wraps(original)
        def __init__(this, *args, **kwargs):
            original(this, *args, **kwargs)
            try:
                rec.policy.optimizer_built(rec.optimizer_info(this))
            except Exception:  # noqa: BLE001 - recording must never break the user's optimizer
                pass
        return __init__

    rec.patch(torch.optim.Optimizer, "__init__", make)


def step_hooks(rec: "Recorder", pre: Callable, post: Callable) -> None:
    """torch's global optimizer step pre/post hooks (every optimizer's ``step()``)."""
    from torch.optim import optimizer as optimizer_mod

    for h in (optimizer_mod.register_optimizer_step_pre_hook(pre), optimizer_mod.register_optimizer_step_post_hook(post)):
        rec.on_exit(h.remove)


def closure_of(args: tuple, kwargs: dict | None) -> Callable | None:
    """The closure an optimizer step hook's ``step(closure)`` call got (``args[0]`` is the optimizer itself)."""
    closure = kwargs.get("closure") if kwargs else None
    if closure is None and len(args) > 1 and callable(args[1]):
        closure = args[1]
    return closure


def with_closure(args: tuple, kwargs: dict | None, closure: Callable) -> tuple[tuple, dict | None]:
    """A step pre hook's result that makes ``step()`` run ``closure`` instead of the one it got."""
    if kwargs and "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs


def zero_grad(rec: "Recorder", make: Callable[[Callable], Callable]) -> None:
    """``zero_grad`` of optimizers and of modules, wrapped by ``make`` (a policy's)."""
    rec.patch(torch.optim.Optimizer, "zero_grad", make)
    rec.patch(nn.Module, "zero_grad", make)


def zero_grad_full(rec: "Recorder", full: "FullPolicy") -> Callable[[Callable], Callable]:
    """Full mode's ``zero_grad``: the step record's flags and the count, which optimizers cleared their own
    gradients (no scan at the next backward), an open hand-written update closed; the graph mode paused."""
    graph, manual = full.graph, full.manual

    def make(original):
        @functools.wraps(original)
        def zero_grad(this, *args, **kwargs):
            if manual.open is not None:
                manual.close()
            rec.zero_grad_since = True
            rec.zero_after_backward = rec.zero_after_backward or rec.backwards_since_step > 0
            rec.zeroed_since_backward = True
            rec.recording.zero_grads += 1
            if isinstance(this, torch.optim.Optimizer):
                full.cleared.add(id(wrapped_optimizer(this) or this))
            graph.pause()
            try:
                return original(this, *args, **kwargs)
            finally:
                graph.resume()
        return zero_grad
    return make


def zero_grad_light(rec: "Recorder") -> Callable[[Callable], Callable]:
    """Light mode's ``zero_grad``: the step record's two flags and the count; nothing to pause."""
    def make(original):
        @functools.wraps(original)
        def zero_grad(this, *args, **kwargs):
            rec.zero_grad_since = True
            if rec.backwards_since_step:
                rec.zero_after_backward = True
            rec.recording.zero_grads += 1
            return original(this, *args, **kwargs)
        return zero_grad
    return make


def step_wrapper(rec: "Recorder", full: "FullPolicy", cls) -> None:
    """Full mode: an optimizer class's ``step`` (torch's profiling wrapper, which runs the step hooks) is
    wrapped once so that the graph mode leaves the stack before that wrapper's ``record_function`` op (else
    the op passes through the mode's Python ``__torch_function__`` on entry and exit of every step);
    the step pre hook's pause stays for a class first seen at its step, and for a closure."""
    if cls in full.wrapped_steps:
        return
    full.wrapped_steps.add(cls)
    graph = full.graph

    def make(original):
        @functools.wraps(original)   # (copies torch's `hooked` mark: the class is not wrapped again)
        def step(this, *args, **kwargs):
            if full.opt_paused or not graph.installed:  # nested, or kept by a scheduler after the recording
                return original(this, *args, **kwargs)
            full.opt_paused = True
            full.step_wraps += 1
            graph.pause()
            try:
                return original(this, *args, **kwargs)
            finally:
                full.step_wraps -= 1
                if full.opt_paused:
                    full.opt_paused = False
                    graph.resume()
        step.__wrapped__ = getattr(original, "__wrapped__", original)  # still the step without torch's hooks
        return step

    rec.patch(cls, "step", make)


def _clip_owners(name: str):
    from torch.nn.utils import clip_grad as clip_mod

    return [owner for owner in (torch.nn.utils, clip_mod) if name in owner.__dict__]


def clipping_full(rec: "Recorder", full: "FullPolicy") -> None:
    """Full mode: ``clip_grad_norm_`` / ``clip_grad_value_`` (``torch.nn.utils`` and its ``clip_grad`` module,
    where scripts import them from) record where they ran relative to backward and step (``ClipCall``), and the
    norm before clipping is kept for the step's gradient norm (after the clip every norm is at most max_norm)."""
    graph = full.graph

    def make(original):
        @functools.wraps(original)
        def clip(*args, **kwargs):
            fresh = rec.backwards_since_step > 0 and not rec.zeroed_since_backward
            graph.pause()
            try:
                result = original(*args, **kwargs)
            finally:
                graph.resume()
            if isinstance(result, torch.Tensor):   # (clip_grad_value_ returns None)
                rec.clip_norm = result
            if len(rec.recording.clips) < CLIP_KEEP:
                limit = args[1] if len(args) > 1 else kwargs.get("max_norm", kwargs.get("clip_value"))
                norm = float(result) if isinstance(result, torch.Tensor) and result.numel() == 1 else None
                rec.recording.clips.append(ClipCall(
                    fn=original.__name__, where=rec.where(), step=rec.steps_taken, fresh=fresh,
                    limit=float(limit) if isinstance(limit, (int, float)) else None, norm=norm))
            return result
        return clip

    for name in ("clip_grad_norm_", "clip_grad_value_"):
        for owner in _clip_owners(name):
            rec.patch(owner, name, make)


def clipping_light(rec: "Recorder") -> None:
    """Light mode: ``clip_grad_norm_``'s result, the norm before clipping, is kept for the step's measured
    gradient norm (after the clip every norm is at most max_norm: an explosion would never show)."""
    def make(original):
        @functools.wraps(original)
        def clip_grad_norm_(*args, **kwargs):
            result = original(*args, **kwargs)
            if isinstance(result, torch.Tensor):
                rec.clip_norm = result
            return result
        return clip_grad_norm_

    for owner in _clip_owners("clip_grad_norm_"):
        rec.patch(owner, "clip_grad_norm_", make)


def schedulers(rec: "Recorder") -> None:
    """``LRScheduler.step`` (and ``ReduceLROnPlateau.step``): each step recorded once (a scheduler's own
    initial step at construction registers it without counting)."""
    from torch.optim import lr_scheduler

    def make(original):
        @functools.wraps(original)
        def step(this, *args, **kwargs):
            if rec.in_sched or getattr(this, "_is_initial", False):
                if getattr(this, "_is_initial", False):
                    rec.scheduler_seen(this)
                return original(this, *args, **kwargs)
            rec.in_sched += 1
            try:
                return original(this, *args, **kwargs)
            finally:
                rec.in_sched -= 1
                rec.scheduler_stepped(this)
        return step

    rec.patch(lr_scheduler.LRScheduler, "step", make)
    if "step" in lr_scheduler.ReduceLROnPlateau.__dict__:
        rec.patch(lr_scheduler.ReduceLROnPlateau, "step", make)


def grad_scaler(rec: "Recorder", read_now: bool) -> None:
    """``GradScaler.scale``: its output's scale, so that the loss backward() gets is read unscaled. ``read_now``
    (full mode): the scale as a float at once; else the scaler itself, read at the step (no host sync)."""
    try:
        from torch.amp import GradScaler
    except ImportError:  # pragma: no cover
        return

    def make(original):
        @functools.wraps(original)
        def scale(this, outputs):
            result = original(this, outputs)
            if isinstance(result, torch.Tensor) and result is not outputs:
                try:
                    rec.scales[id(result)] = (weakref.ref(result), float(this.get_scale()) if read_now else this)
                except Exception:  # noqa: BLE001
                    pass
            return result
        return scale

    rec.patch(GradScaler, "scale", make)
