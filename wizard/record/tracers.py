"""Small tracers probes run around their own forward and backward passes (module mode, replays): every module
call of a forward with its shapes (:func:`trace_modules`), the argmax/max/topk reductions an evaluation makes
(:class:`Reductions`), and the forward call autograd's anomaly mode blames for a failed backward
(:func:`anomaly_origin`). The op tracer and the loss-call tracer are ``optrace.py`` and ``losscalls.py``."""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nnwizard.record.frames import UserCode, site
from nnwizard.record.tensors import shape_of


@dataclass
class Call:
    path: str
    type: str
    input: list | None
    output: list | None = None
    raised: bool = False


@dataclass
class ModuleTrace:
    """Every module call of a forward pass, in order, with input and output shapes; ``failing`` is
    the innermost module that was running when an exception escaped."""

    calls: list[Call] = field(default_factory=list)
    stack: list[Call] = field(default_factory=list)
    modules: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def failing(self) -> Call | None:
        return self.stack[-1] if self.stack else None


@contextmanager
def trace_modules(model: nn.Module, leaves_only: bool = False):
    trace = ModuleTrace()
    handles = []
    for path, module in model.named_modules():
        if leaves_only and any(True for _ in module.children()):
            continue
        name = path or "(model)"
        trace.modules[name] = module

        def pre(mod, args, _name=name):
            call = Call(_name, type(mod).__name__, shape_of(args[0]) if args else None)
            trace.calls.append(call)
            trace.stack.append(call)

        def post(mod, args, output, _name=name):
            if trace.stack and trace.stack[-1].path == _name:
                trace.stack.pop().output = shape_of(output)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield trace
    finally:
        if trace.stack:
            trace.stack[-1].raised = True
        for h in handles:
            h.remove()


class Reductions(TorchFunctionMode):
    """Records argmax / max / topk calls that reduce a dimension of size 1 (``single``: (op, input shape))."""

    def __init__(self):
        super().__init__()
        self.single: list[tuple[str, list]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("argmax", "max", "topk") and args and isinstance(args[0], torch.Tensor):
            x, dim = args[0], kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else None)
            if name == "topk":
                dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
            if isinstance(dim, int) and x.dim() and -x.dim() <= dim < x.dim() and x.shape[dim] == 1 and x.numel() > 1:
                self.single.append((name, list(x.shape)))
        return func(*args, **kwargs)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)')


def anomaly_origin(run: Callable[[], object], files: list[Path] | None = None) -> str | None:
    """Replay ``run`` (a forward and backward) once under ``torch.autograd.detect_anomaly`` and
    return ``file:line in function: code`` of the forward call whose saved result autograd
    complained about (e.g. a tensor later modified in place). Anomaly mode is slow, so this is
    only for replaying a single step that already failed."""
    code = UserCode(files)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=False):
                run()
        except Exception:  # the failure is what is being replayed
            pass
    for warning in caught:
        text = str(warning.message)
        if "Traceback of forward call" not in text:
            continue
        frames = _FRAME.findall(text)
        mine = [f for f in frames if code.is_user(f[0])] or [f for f in frames if code.kind(f[0]) >= 2]
        if mine:
            file, line, function, text = mine[-1]
            return f"{site(file, line, function)}: {text.strip()}"
    return None
