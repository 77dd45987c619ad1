"""A torch-op tracer shared by probes: every torch function call made while it is active, with the
module that was running, the user's file:line, and whether the op made a non-finite value.

Usage::

    from nnwizard.record.optrace import OpTracer

    with OpTracer(model, files=user_source_files(target)) as trace:
        loss = loss_fn(model(x), y)          # or target.train_step(model, batch, optimizer)
    bad = trace.first_nonfinite              # OpRecord | None: the op that *created* NaN/Inf
    for rec in trace.unsafe:                 # log/div/sqrt/rsqrt/reciprocal/fractional pow
        print(rec.op, rec.where, rec.min_abs)

Each :class:`OpRecord` has ``index`` (order of the call), ``op`` (``"log"``, ``"div"``,
``"linear"``...), ``module`` (dotted path of the innermost running module, ``""`` outside the
model), ``module_type``, ``phase`` (``"forward"`` inside the model, ``"loss"`` after the model's
forward returned, ``"update"`` inside ``optimizer.step``, ``"other"`` before the first forward),
``where`` (``file:line in function`` of the nearest frame in the user's files, computed only for
records that are kept with a location, see ``locate``), ``nonfinite_in`` / ``nonfinite_out``, and for
the epsilon-sensitive ops ``min_abs`` (smallest |argument| or |denominator|) and ``negative``
(a negative argument under log/sqrt/fractional pow).

Options: ``record="interesting"`` (default) keeps epsilon-sensitive ops and non-finite outputs only;
``record="all"`` keeps every op (costlier: one ``isfinite`` reduction per op either way, plus a stack
walk per kept record). ``locate`` (default True) fills ``where``. ``backward=True`` hooks the autograd
node of each traced output so that the first backward node that turned finite incoming gradients
into non-finite ones is reported as ``first_nonfinite_backward`` (an :class:`OpRecord` of the forward
op that created that node). ``optimizer`` marks ops run inside its ``step`` as phase ``"update"``.
``on_op(record, func, args, output, kwargs)`` is called for every op (after the record is built, whether it is
kept or not), so callers can take their own measurements (activation statistics, batch mixing...).

The tracer never changes values; it runs inside a ``TorchFunctionMode`` which is thread-local, so it
traces the thread that entered it (probes run in a worker thread: enter it there).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nnwizard.record.frames import UserCode
from nnwizard.record.tensors import tensors_in

_OWN = (__file__, )   # the tracer's own frames (skipped when locating an op)
# op name -> which argument is "the one that must stay away from zero" (0 = first, 1 = denominator)
UNSAFE_OPS: dict[str, int] = {
    "log": 0, "log2": 0, "log10": 0, "log_": 0, "sqrt": 0, "sqrt_": 0, "rsqrt": 0, "rsqrt_": 0,
    "reciprocal": 0, "reciprocal_": 0, "div": 1, "div_": 1, "true_divide": 1, "__truediv__": 1,
    "__itruediv__": 1, "__rtruediv__": 0, "__rdiv__": 0, "pow": 0, "__pow__": 0, "pow_": 0,
}
_NEGATIVE_BAD = {"log", "log2", "log10", "log_", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "pow", "__pow__", "pow_"}
_SKIP = {"__get__", "__set__", "dim", "size", "numel", "is_floating_point", "__len__", "__repr__", "__format__",
         "__bool__", "__index__", "item", "tolist", "data_ptr", "requires_grad_", "detach", "to", "cpu", "cuda",
         "__getitem__", "__setitem__", "clone", "__iter__", "__contains__", "stride", "storage_offset",
         "is_contiguous", "contiguous", "__hash__", "__eq__", "_is_view", "untyped_storage", "__reduce_ex__",
         "register_hook", "backward", "grad_fn", "__array__", "numpy", "__deepcopy__", "type", "element_size"}


@dataclass
class OpRecord:
    index: int
    op: str
    module: str
    module_type: str
    phase: str
    where: str | None = None
    nonfinite_in: bool = False
    nonfinite_out: bool = False
    min_abs: float | None = None
    negative: bool = False
    max_abs_in: float | None = None
    shape: list | None = None
    direct: bool = False  # called straight from the user's code (not from inside a library function)

    def describe(self) -> str:
        layer = f" in {self.module_type} '{self.module}'" if self.module else ""
        at = f" at {self.where}" if self.where else ""
        return f"{self.op}{layer}{at}"


@dataclass
class OpTrace:
    records: list[OpRecord] = field(default_factory=list)
    count: int = 0
    first_nonfinite: OpRecord | None = None           # first op whose output is non-finite from finite inputs
    first_nonfinite_any: OpRecord | None = None       # first op with a non-finite output at all
    first_nonfinite_backward: OpRecord | None = None  # forward op whose backward node made the first NaN/Inf grad
    backward_node: str | None = None                  # that node's name, e.g. "LogBackward0"

    @property
    def unsafe(self) -> list[OpRecord]:
        return [r for r in self.records if r.min_abs is not None]

    def first_nonfinite_phase(self) -> tuple[OpRecord | None, str | None]:
        """The op that first made a NaN/Inf and the part of the step it ran in: ``"forward"``, ``"loss"``,
        ``"backward"`` (the forward op whose backward node made it) or ``"update"``; (None, None) when none did, or
        (the op, None) for one of another phase."""
        rec, phase = self.first_nonfinite, None
        if rec is not None and rec.phase in ("forward", "loss", "other"):
            phase = "forward" if rec.phase == "forward" else "loss"
        elif self.first_nonfinite_backward is not None:
            rec, phase = self.first_nonfinite_backward, "backward"
        elif rec is not None and rec.phase == "update":
            phase = "update"
        return rec, phase


def _nonfinite(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.numel() > 0 and not bool(torch.isfinite(t).all())


def _absmin(value) -> tuple[float | None, bool]:
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.numel() == 0:
            return None, False
        v = value.detach()
        return float(v.abs().min()), bool((v < 0).any())
    if isinstance(value, (int, float)):
        return abs(float(value)), value < 0
    return None, False


class _Mode(TorchFunctionMode):
    def __init__(self, tracer: "OpTracer"):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.tracer.enabled:
            return out
        name = getattr(func, "__name__", None) or str(func)
        if name in _SKIP:
            return out
        try:
            self.tracer._observe(name, func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - the tracer must never break the user's computation
            pass
        return out


class OpTracer:
    """Context manager; see the module docstring."""

    def __init__(self, model: nn.Module | None = None, files: list[Path] | None = None, *,
                 record: str = "interesting", locate: bool = True, backward: bool = False,
                 optimizer: torch.optim.Optimizer | None = None,
                 on_op: Callable[[OpRecord, Any, tuple, Any, dict], None] | None = None, max_records: int = 20000):
        self.model, self.record, self.locate, self.backward = model, record, locate, backward
        self.optimizer, self.on_op, self.max_records = optimizer, on_op, max_records
        self.code = UserCode(files)
        self.files = self.code.files
        self.enabled = True   # False: ops pass untraced (a caller waiting for the step it wants)
        self.trace = OpTrace()
        self._stack: list[tuple[str, str]] = []
        self._forward_done = False
        self._in_step = False
        self._handles: list = []
        self._hooked: set[int] = set()
        self._attached: list[nn.Module] = []
        self._mode = _Mode(self)

    # -- context ------------------------------------------------------------------------------------
    def __enter__(self) -> OpTrace:
        if self.model is not None:
            self.attach(self.model)
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(lambda *a: setattr(self, "_in_step", True)))
            self._handles.append(self.optimizer.register_step_post_hook(lambda *a: setattr(self, "_in_step", False)))
        self._mode.__enter__()
        return self.trace

    def attach(self, model: nn.Module) -> None:
        """Name the ops ``model`` runs by its modules (for a model built after the tracer was entered,
        as a script builds its own)."""
        if any(m is model for m in self._attached):
            return
        self._attached.append(model)
        for path, module in model.named_modules():
            name = path
            self._handles.append(module.register_forward_pre_hook(
                lambda m, a, _n=name: self._stack.append((_n, type(m).__name__))))
            self._handles.append(module.register_forward_hook(self._post_hook(name)))

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _post_hook(self, name: str):
        def post(module, args, output):
            if self._stack and self._stack[-1][0] == name:
                self._stack.pop()
            if name == "":
                self._forward_done = True
        return post

    # -- where ----------------------------------------------------------------------------------------
    def _where(self) -> str | None:
        """``file:line in function`` of the innermost frame in the user's files (or outside torch and
        nnwizard when no files were given)."""
        where, _ = self._locate()
        return where

    def _locate(self) -> tuple[str | None, bool]:
        return self.code.locate(sys._getframe(2), _OWN)

    # -- observing ------------------------------------------------------------------------------------
    def _phase(self) -> str:
        if self._in_step:
            return "update"
        if self._stack:
            return "forward"
        return "loss" if self._forward_done else "other"

    def _observe(self, name: str, func, args, kwargs, out) -> None:
        outs = [t for t in tensors_in(out) if isinstance(t, torch.Tensor)]
        if not outs and self.on_op is None:
            return
        trace = self.trace
        trace.count += 1
        module, mtype = self._stack[-1] if self._stack else ("", "")
        rec = OpRecord(trace.count, name.strip("_") if name.startswith("__") else name, module, mtype, self._phase())
        rec.op = {"truediv": "div", "itruediv": "div", "rtruediv": "div", "rdiv": "div"}.get(rec.op, rec.op)
        rec.nonfinite_out = any(_nonfinite(t) for t in outs)
        inputs = list(tensors_in(args)) + list(tensors_in(kwargs))
        keep = self.record == "all"
        if rec.nonfinite_out:
            rec.nonfinite_in = any(_nonfinite(t) for t in inputs)
            keep = True
        if name in UNSAFE_OPS:
            position = UNSAFE_OPS[name]
            if name in ("pow", "__pow__", "pow_"):
                exponent = args[1] if len(args) > 1 else kwargs.get("exponent")
                fractional = isinstance(exponent, (int, float)) and (exponent < 0 or exponent != int(exponent))
                position = 0 if fractional else -1
            if position >= 0:
                arg = args[position] if len(args) > position else kwargs.get("other")
                rec.min_abs, negative = _absmin(arg)
                rec.negative = negative and name in _NEGATIVE_BAD
                keep = keep or rec.min_abs is not None
        if keep:
            floats = [t for t in inputs if t.is_floating_point() and t.numel()]
            if floats:
                rec.max_abs_in = max(float(t.detach().abs().nan_to_num(0.0, 0.0, 0.0).max()) for t in floats)
            rec.shape = list(outs[0].shape) if outs else None
            if self.locate:
                rec.where, rec.direct = self._locate()
            if len(trace.records) < self.max_records:
                trace.records.append(rec)
            if rec.nonfinite_out:
                if trace.first_nonfinite_any is None:
                    trace.first_nonfinite_any = rec
                if trace.first_nonfinite is None and not rec.nonfinite_in:
                    trace.first_nonfinite = rec
        if self.backward and rec.phase in ("forward", "loss", "other"):
            for t in outs:
                if t.grad_fn is not None and t.requires_grad:
                    self._hook_node(t.grad_fn, rec)
        if self.on_op is not None:
            self.on_op(rec, func, args, out, kwargs)

    def _hook_node(self, node, rec: OpRecord) -> None:
        if id(node) in self._hooked:
            return
        self._hooked.add(id(node))
        if rec.where is None and self.locate:
            rec.where = self._where()

        def hook(grad_inputs, grad_outputs, _rec=rec, _node=node):
            trace = self.trace
            if trace.first_nonfinite_backward is not None:
                return
            incoming = any(g is not None and _nonfinite(g) for g in grad_outputs)
            produced = any(g is not None and _nonfinite(g) for g in grad_inputs)
            if produced and not incoming:
                trace.first_nonfinite_backward = _rec
                trace.backward_node = type(_node).__name__ if not hasattr(_node, "name") else _node.name()

        try:
            node.register_hook(hook)
        except Exception:  # noqa: BLE001
            pass
