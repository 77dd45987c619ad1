"""What really reaches the loss: a ``TorchFunctionMode`` that records every loss call (the
functional losses, which the loss modules call too) with copies of the tensors it got, and the
normalising op (softmax, log_softmax, sigmoid, logsigmoid, tanh) that produced its input, with the
user's file:line and the dimension it normalised over.

    with LossCalls(files) as calls:
        target.train_step(model, batch, optimizer)       # or loss_fn(model(x), y)
    first = calls.first                                  # TracedLoss | None
    first.name, first.input, first.target, first.producer   # "cross_entropy", tensors, Producer | None

Like the op tracer it never changes values and is thread-local (enter it in the probe's thread).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from nnwizard.record.frames import UserCode

LOSSES = {
    "cross_entropy": "class", "nll_loss": "class", "binary_cross_entropy": "binary",
    "binary_cross_entropy_with_logits": "binary", "mse_loss": "regression", "l1_loss": "regression",
    "smooth_l1_loss": "regression", "huber_loss": "regression", "kl_div": "distribution",
}
NORMALISERS = {"softmax", "log_softmax", "sigmoid", "logsigmoid", "log_sigmoid", "tanh"}
# ops that keep the values (only the layout or dtype changes): a softmax stays a softmax through them
PASSTHROUGH = {"squeeze", "unsqueeze", "view", "reshape", "flatten", "permute", "transpose", "contiguous", "float",
               "double", "half", "to", "__getitem__", "clone", "detach", "view_as", "reshape_as", "t", "mT", "select"}


@dataclass
class Producer:
    op: str
    dim: int | None
    size: int | None          # the size of the normalised dimension
    where: str | None
    in_model: bool            # called inside the model's forward (vs after it, in the loop)

    def describe(self) -> str:
        dim = f"(dim={self.dim})" if self.dim is not None else "()"
        place = "inside the model" if self.in_model else "after the model, in the loop"
        return f"{self.op}{dim}" + (f" at {self.where}" if self.where else "") + f" ({place})"


@dataclass
class TracedLoss:
    """A loss call as the tracer saw it: copies of its input and target, and the op that normalised the input."""

    name: str
    kind: str
    input: torch.Tensor
    target: torch.Tensor | None
    producer: Producer | None = None
    where: str | None = None
    kwargs: dict = field(default_factory=dict)


class LossCalls(TorchFunctionMode):
    def __init__(self, files: list[Path] | None = None, model: torch.nn.Module | None = None, limit: int = 8):
        super().__init__()
        self.code = UserCode(files)
        self.model, self.limit = model, limit
        self.calls: list[TracedLoss] = []
        self._producers: dict[int, Producer] = {}
        self._keep: list[torch.Tensor] = []  # outputs whose ids are keys above stay alive
        self._depth = 0
        self._handles: list = []

    @property
    def first(self) -> TracedLoss | None:
        return self.calls[0] if self.calls else None

    def __enter__(self):
        if self.model is not None:
            self._handles = [self.model.register_forward_pre_hook(lambda *a: self._enter_model()),
                             self.model.register_forward_hook(lambda *a: self._leave_model())]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return super().__exit__(*exc)

    def _enter_model(self):
        self._depth += 1

    def _leave_model(self):
        self._depth = max(0, self._depth - 1)

    def _where(self) -> str | None:
        return self.code.where(sys._getframe(2), fallback=False)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in LOSSES:  # recorded before the call: what reached a loss that raises counts too
            try:
                self._record_loss(name, args, kwargs)
            except Exception:  # noqa: BLE001 - recording must never break the user's computation
                pass
        out = func(*args, **kwargs)
        try:
            self._observe(name, args, kwargs, out)
        except Exception:  # noqa: BLE001
            pass
        return out

    def _record_loss(self, name: str, args, kwargs) -> None:
        first = args[0] if args else kwargs.get("input")
        if not isinstance(first, torch.Tensor) or len(self.calls) >= self.limit:
            return
        target = args[1] if len(args) > 1 else kwargs.get("target")
        self.calls.append(TracedLoss(
            name, LOSSES[name], first.detach().clone(),
            target.detach().clone() if isinstance(target, torch.Tensor) else None,
            self._producers.get(id(first)), self._where(),
            {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool))}))

    def _observe(self, name: str, args, kwargs, out) -> None:
        first = args[0] if args else None
        if not isinstance(out, torch.Tensor) or not isinstance(first, torch.Tensor):
            return
        if name in NORMALISERS:
            dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else None)
            size = first.shape[dim] if isinstance(dim, int) and -first.dim() <= dim < first.dim() else None
            op = {"log_sigmoid": "logsigmoid"}.get(name, name)
            self._producers[id(out)] = Producer(op, dim, size, self._where(), self._depth > 0)
            self._keep.append(out)
        elif name in PASSTHROUGH and id(first) in self._producers:
            self._producers[id(out)] = self._producers[id(first)]
            self._keep.append(out)
