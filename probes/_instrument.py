"""Shared instruments for probes: module-level forward tracing, and reading an exception raised by
the user's code into a named kind with the place it came from."""

from __future__ import annotations

import re
import traceback
import warnings
from contextlib import contextmanager
from typing import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import nnwizard
import nnwizard.probes


def shape_of(x) -> list | None:
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return list(x[0].shape)
    return None


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


def graph_nodes(roots, limit: int = 200_000) -> list:
    """Every distinct autograd node reachable from ``roots`` (tensors or grad_fn nodes), depth first,
    at most ``limit``. The list keeps the nodes alive, so their ids stay unique while it is held."""
    seen: dict[int, object] = {}
    stack = [r.grad_fn if isinstance(r, torch.Tensor) else r for r in roots]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(fn for fn, _ in node.next_functions)
    return list(seen.values())


# ---------------------------------------------------------------------------------- exceptions
_KINDS = [
    ("no-grad", r"does not require grad|does not have a grad_fn"),
    ("inplace", r"modified by an inplace operation"),
    ("label-range", r"out of bounds|index .* is out of range|device-side assert|Assertion .t >= 0"),
    ("dtype", r"expected scalar type|Expected .*Long|not implemented for '(Float|Int|Long|Half|Bool)'|"
              r"expected .*dtype|Found dtype|must have the same dtype|expected both .* same dtype"),
    ("shape", r"shapes cannot be multiplied|size mismatch|must match the size|Expected input batch_size|"
              r"expected input\[|Given groups=|doesn't match the broadcast shape|invalid for input of size|"
              r"Expected .* dimensions|expected .*D .* input|input.size\(-1\) must be equal|"
              r"Target size .* must be the same as input size|Using a target size|shape .* is invalid|"
              r"number of dims|Expected target size|dimension out of range|mismatch in shape|same number of dim"),
    ("memory", r"out of memory|CUDA error: out of memory"),
]


def error_kind(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    for kind, pattern in _KINDS:
        if re.search(pattern, text, re.IGNORECASE):
            return kind
    return "other"


def user_frame(exc: BaseException, files: list[Path] | None = None) -> str | None:
    """``file:line in function`` of the innermost frame in the user's files (else outside torch)."""
    frames = traceback.extract_tb(exc.__traceback__)
    wanted = {str(f.resolve()) for f in files or []}
    for frame in reversed(frames):
        resolved = str(Path(frame.filename).resolve())
        if resolved in wanted or (not wanted and "site-packages" not in resolved and "/torch/" not in resolved):
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    ours = tuple(str(Path(m.__file__).resolve().parent) for m in (nnwizard, nnwizard.probes))
    for frame in reversed(frames):
        resolved = str(Path(frame.filename).resolve())
        if "site-packages" not in resolved and not resolved.startswith(ours):
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return None


def first_line(exc: BaseException, limit: int = 240) -> str:
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    return f"{type(exc).__name__}: {message[:limit]}"


def expected_input(module: nn.Module) -> str | None:
    """What a layer expects of its input, in words, for the layer shape mismatch evidence."""
    if isinstance(module, nn.Linear):
        return f"{module.in_features} input features in the last dimension"
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return f"{module.in_channels} input channels in dimension 1"
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
        return f"{module.num_features} features/channels in dimension 1"
    if isinstance(module, nn.LayerNorm):
        return f"trailing dimensions {list(module.normalized_shape)}"
    if isinstance(module, (nn.RNNBase,)):
        return f"{module.input_size} features in the last dimension"
    if isinstance(module, nn.Embedding):
        return f"integer indices in [0, {module.num_embeddings})"
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)')


def anomaly_origin(run: Callable[[], object], files: list[Path] | None = None) -> str | None:
    """Replay ``run`` (a forward and backward) once under ``torch.autograd.detect_anomaly`` and
    return ``file:line in function: code`` of the forward call whose saved result autograd
    complained about (e.g. a tensor later modified in place). Anomaly mode is slow, so this is
    only for replaying a single step that already failed."""
    wanted = {str(f.resolve()) for f in files or []}
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
        mine = [f for f in frames if str(Path(f[0]).resolve()) in wanted] or [
            f for f in frames if "site-packages" not in f[0] and "/torch/" not in f[0]]
        if mine:
            file, line, function, code = mine[-1]
            return f"{Path(file).name}:{line} in {function}: {code.strip()}"
    return None
