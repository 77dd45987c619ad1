"""Run-time replacements of one piece of the user's script, for the script-mode simplify-ladder
(probes/script_ladder.py). Each is a context manager handed to ``ScriptTarget.rerun(patches=[...])``:
it is entered once the recorder is installed and exited before the recorder is removed, so it changes
the running program, never the user's file, and leaves torch as it found it (classes, hooks).

- :class:`Subset`: ``replace_batch`` for the recorder: the first ``k`` DataLoader batches, cycled
  (the fixed subset every rung trains on), optionally turned into synthetic batches of the same
  shape and dtype with a known rule (``y = x[0] > 0``, labels in the observed label space).
- :class:`Meter`: a listener measuring, at every backward, the loss and the training accuracy of the
  tensors that reached the loss (the loss call's input and target, or the model's output and the
  batch's labels when the script computes its loss by hand).
- :class:`SwapOptimizer`: every ``torch.optim`` optimizer class the script can reach (``torch.optim.X``,
  ``from torch.optim import X``, ``torch.optim.adam.Adam``) builds ``SGD(lr)`` over the same parameter
  groups instead.
- :class:`SwapModel`: the top-level model's output replaced by a small model's output on the same
  input; the small model is stepped by its own optimizer whenever the script steps the optimizer that
  holds the model's parameters.
- :class:`SwapLoss`: every ``backward()`` on the script's loss runs on the standard loss of the same
  output and target instead (cross-entropy for class indices, MSE for same-size values).
- :class:`RepeatFirstStep`: for a script without a DataLoader, every training call of the model gets
  its first call's tensors again and every training loss call its first target (script-overfit).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from nnwizard import reference

_OPTIMIZERS = {name: obj for name, obj in vars(torch.optim).items()
               if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer}
_SGD = torch.optim.SGD


def pair_of(batch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(inputs, labels)`` of a batch that is a pair of tensors, else None."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return batch[0], batch[1]
    return None


class _Hooks:
    """Local forward hooks on the script's model, removed on exit."""

    def __init__(self, index: int, name: str):
        self.index, self.name = index, name
        self.module: nn.Module | None = None
        self._handles: list = []

    def _is_model(self, info) -> bool:
        return info.index == self.index and info.name == self.name

    def _hook(self, module: nn.Module, hook: Callable) -> None:
        self._handles.append(module.register_forward_hook(hook))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        while self._handles:
            self._handles.pop().remove()


# ------------------------------------------------------------------------------------ data
class Subset:
    """replace_batch: the first ``k`` batches the script's DataLoaders yield, then those again in
    turn; with ``synthetic``, each replaced by inputs of the same shape and dtype drawn from a fixed
    generator and labels ``x[0] > 0`` in the labels' own dtype (module mode's synthetic rung)."""

    def __init__(self, k: int, task: str, seed: int, synthetic: bool = False):
        self.k, self.task, self.seed, self.synthetic = k, task, seed, synthetic
        self.kept: list = []
        self.problem: str | None = None

    def __call__(self, batch, index):
        if len(self.kept) < self.k:
            self.kept.append(self._made(batch, len(self.kept)))
            return self.kept[-1]
        self.kept.append(self.kept.pop(0))
        return self.kept[-1]

    def _made(self, batch, i: int):
        if not self.synthetic:
            return batch
        from nnwizard.probes.ladder import synthetic_batches

        pair = pair_of(batch)
        if pair is None or not pair[0].is_floating_point():
            self.problem = "the script's batches are not (float inputs, labels) pairs"
            return batch
        x, y = pair
        task = "classification" if not y.is_floating_point() and self.task != "regression" else self.task
        xs, ys = synthetic_batches([(x, y)], task, self.seed + i)[0]
        made = (xs, ys.to(y.dtype))
        return list(made) if isinstance(batch, list) else made


# ------------------------------------------------------------------------------------ measuring
class Meter(_Hooks):
    """Listener: per backward, the loss value, the training accuracy (None for regression or shapes
    it cannot read) and the labels (for the majority class). ``labels_fed``: the batch's labels went into
    the model's input (``Recording.label_inputs``), so they are no target to pair its output with."""

    CLASSIFICATION = ("cross_entropy", "nll_loss", "multi_margin_loss")

    def __init__(self, index: int, name: str, task: str, labels_fed: bool = False):
        super().__init__(index, name)
        self.task, self.labels_fed = task, labels_fed
        self.losses: list[float] = []
        self.accuracies: list[float | None] = []
        self.labels: list[torch.Tensor] = []
        self.output = self.label = self.call = None
        self.busy = False   # SwapLoss computes its loss: not the script's call

    def on_forward(self, rec, info, args) -> None:
        self._rec = rec
        if self._is_model(info) and self.module is None:
            self.module = info.module
            self._hook(info.module, self._seen)

    def _seen(self, module, args, output):
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor):
            self.output = output

    def on_batch(self, rec, batch, index) -> None:
        pair = pair_of(batch)
        self.label = pair[1] if pair is not None else None

    def on_loss_args(self, rec, call, args, kwargs, value) -> None:
        if self.busy or not torch.is_grad_enabled():
            return
        x = args[0] if args else kwargs.get("input")
        y = args[1] if len(args) > 1 else kwargs.get("target")
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            self.call = (x, y, call.fn)

    def pair(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What reached the loss since the last backward: the loss call's input and target, else the
        model's output and the batch's labels (unless those labels were part of the model's input)."""
        if self.call is not None:
            return self.call[0], self.call[1]
        if not self.labels_fed and isinstance(self.output, torch.Tensor) and isinstance(self.label, torch.Tensor):
            return self.output, self.label
        return None

    def on_backward(self, rec, loss) -> None:
        if not isinstance(loss, torch.Tensor) or not loss.numel():
            return
        self.losses.append(float(loss.detach().float().mean()))
        pair = self.pair()
        acc = None
        if pair is not None:
            out, y = (t.detach() for t in pair)
            task = self.task
            if task == "regression" and not y.is_floating_point() and out.dim() >= 2:
                task = "classification"   # integer labels scored by a hand-written loss
            try:
                acc = reference.accuracy(out.float(), y if y.is_floating_point() else y.long(), task)
            except Exception:  # noqa: BLE001 - shapes it cannot read: no accuracy
                acc = None
            if acc is not None and len(self.labels) < 4096:
                self.labels.append(y.reshape(-1).cpu())
        self.accuracies.append(acc)
        self.call = self.output = None


# ------------------------------------------------------------------------------------ optimizer
class SwapOptimizer:
    """While entered, every torch.optim optimizer class builds ``SGD(lr=lr, momentum=momentum)`` over the same parameter
    groups (their own settings dropped). ``replaced`` names the classes the script built."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0):
        self.lr, self.momentum = lr, momentum
        self.replaced: list[str] = []
        self._undo: list = []

    def _class_for(self, original: type) -> type:
        swap = self

        class SGD(_SGD):
            def __init__(self, params, *args, **kwargs):
                params = list(params)
                groups = [{"params": g["params"]} if isinstance(g, dict) else g for g in params]
                swap.replaced.append(original.__name__)
                super().__init__(groups, lr=swap.lr, momentum=swap.momentum)

        SGD.__qualname__ = f"SGD (replacing {original.__name__})"
        return SGD

    def __enter__(self):
        swapped = {id(cls): self._class_for(cls) for cls in _OPTIMIZERS.values()}
        owners = [torch.optim] + [m for name, m in list(sys.modules.items())
                                  if name.startswith("torch.optim.") and m is not None]
        for owner in owners:
            for name, value in list(vars(owner).items()):
                if isinstance(value, type) and id(value) in swapped:
                    setattr(owner, name, swapped[id(value)])
                    self._undo.append((owner, name, value))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            owner, name, value = self._undo.pop()
            setattr(owner, name, value)


# ------------------------------------------------------------------------------------ model
class SwapModel(_Hooks):
    """Listener and patch: each training or evaluation call of the script's model returns
    ``small(input)`` instead of its own output (same shape and dtype); ``small`` is stepped by
    ``optimizer`` right after every step of the script's optimizer that holds the model's parameters.
    The small model runs inside the recorder's forward pre-hook of the script's model, so the
    recorder sees it as part of that model, not as a model of its own. ``problem`` says why a call
    kept its own output (not one float tensor in, not one tensor out, another shape)."""

    def __init__(self, index: int, name: str, small: nn.Module, optimizer: torch.optim.Optimizer, in_numel: int):
        super().__init__(index, name)
        self.small, self.optimizer, self.in_numel = small, optimizer, in_numel
        self.pending: torch.Tensor | None = None
        self.params: set[int] = set()
        self.replaced = self.steps = 0
        self.problem: str | None = None

    def on_forward(self, rec, info, args) -> None:
        if not self._is_model(info):
            return
        if self.module is None:
            self.module = info.module
            self.params = {id(p) for p in info.module.parameters()}
            self._hook(info.module, self._replace)
        x = args[0] if len(args) == 1 else None
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not len(x) or x[0].numel() != self.in_numel:
            self.problem = "the model's input is not one float tensor of the recorded size"
            self.pending = None
            return
        self.pending = self.small(x)

    def _replace(self, module, args, output):
        out, self.pending = self.pending, None
        if out is None:
            return None
        if not isinstance(output, torch.Tensor) or out.shape != output.shape:
            self.problem = (f"the model returns {type(output).__name__}, not one tensor" if not isinstance(output, torch.Tensor)
                            else f"the model's output {list(output.shape)} is not the recorded {list(out.shape)}")
            return None
        self.replaced += 1
        return out.to(output.dtype)

    def on_step_post(self, rec, optimizer, step) -> None:
        if optimizer is None or not any(id(p) in self.params for g in optimizer.param_groups for p in g["params"]):
            return
        plain = getattr(type(self.optimizer).step, "__wrapped__", None)  # without the global step hooks:
        if plain is None:                                                # not one of the script's steps
            self.problem = "the small model's optimizer cannot be stepped outside the recorder"
            return
        plain(self.optimizer)
        for p in self.small.parameters():
            p.grad = None
        self.steps += 1


# ------------------------------------------------------------------------------------ loss
def standard_loss(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, str] | None:
    """The standard loss for this output and target: cross-entropy for class indices, MSE for
    same-size values; None when neither fits."""
    if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor) or not out.is_floating_point():
        return None
    if not y.is_floating_point() and y.dtype != torch.bool and out.dim() >= 2 and y.numel() \
            and tuple(y.shape) == (out.shape[0], *out.shape[2:]) and int(y.min()) >= 0 and int(y.max()) < out.shape[1]:
        return F.cross_entropy(out, y.long()), "cross-entropy"
    if y.numel() == out.numel() and out.numel():
        return F.mse_loss(out, y.reshape(out.shape).to(out.dtype)), "MSE"
    return None


class SwapLoss:
    """Patch: ``loss.backward()`` (and ``torch.autograd.backward``) on the script's loss runs on the
    standard loss of what reached it instead (read by ``meter``). Installed inside the recorder, so
    the recorder and the meter see the standard loss. ``used`` counts the names of the losses used;
    ``problem`` says why a backward kept the script's loss."""

    def __init__(self, meter: Meter):
        self.meter = meter
        self.used: dict[str, int] = {}
        self.kept = 0
        self.problem: str | None = None
        self._undo: list = []
        self._inside = False   # Tensor.backward calls torch.autograd.backward: substitute once

    def _substitute(self, tensors) -> Any:
        pair = self.meter.pair()
        if pair is None:
            self.problem = "no model output and target reached the loss"
            return None
        self.meter.busy = True
        try:
            made = standard_loss(*pair)
        finally:
            self.meter.busy = False
        if made is None:
            self.problem = (f"no standard loss fits output {list(pair[0].shape)} ({pair[0].dtype}) against target "
                            f"{list(pair[1].shape)} ({pair[1].dtype})")
            return None
        self.used[made[1]] = self.used.get(made[1], 0) + 1
        return made[0]

    def _wrap(self, original):
        swap = self

        def backward(tensors, *args, **kwargs):
            if swap._inside:
                return original(tensors, *args, **kwargs)
            swap._inside = True
            try:
                if isinstance(tensors, torch.Tensor) and tensors.numel() == 1 and not args \
                        and kwargs.get("gradient") is None and kwargs.get("grad_tensors") is None:
                    new = swap._substitute(tensors)
                    if new is not None:
                        return original(new, *args, **kwargs)
                swap.kept += 1
                return original(tensors, *args, **kwargs)
            finally:
                swap._inside = False
        return backward

    def __enter__(self):
        for owner in (torch.Tensor, torch.autograd):
            original = getattr(owner, "backward")
            setattr(owner, "backward", self._wrap(original))
            self._undo.append((owner, original))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            owner, original = self._undo.pop()
            setattr(owner, "backward", original)


# ------------------------------------------------------------------------------------ one step repeated
def _structure(obj, depth: int = 0):
    """The shapes and dtypes of the tensors in ``obj`` (nested tuples, lists and dicts), else types."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), str(obj.dtype))
    if depth < 3 and isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(_structure(o, depth + 1) for o in obj))
    if depth < 3 and isinstance(obj, dict):
        return ("dict", tuple((k, _structure(v, depth + 1)) for k, v in obj.items()))
    return type(obj).__name__


def _shorter(shape, first) -> bool:
    """Whether structure ``shape`` (see :func:`_structure`) is ``first`` cut short: the same tensors, dtypes
    and containers, each tensor's sizes at most the first's and one of them smaller (an epoch's last slice)."""
    def walk(a, b):   # None: not comparable; else whether some size is smaller
        if isinstance(a, tuple) and isinstance(b, tuple) and a and b and a[0] == b[0] == "tensor":
            if a[2] != b[2] or len(a[1]) != len(b[1]) or any(x > y for x, y in zip(a[1], b[1])):
                return None
            return a[1] != b[1]
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2 and a[0] == b[0] \
                and isinstance(a[1], tuple) and isinstance(b[1], tuple) and len(a[1]) == len(b[1]):
            smaller = False
            for x, y in zip(a[1], b[1]):
                if a[0] == "dict":
                    if x[0] != y[0]:
                        return None
                    x, y = x[1], y[1]
                r = walk(x, y)
                if r is None:
                    return None
                smaller = smaller or r
            return smaller
        return False if a == b else None
    return bool(walk(shape, first))


def _frozen(obj, depth: int = 0):
    """A copy of ``obj`` with every tensor detached and cloned (kept for the later steps)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if depth < 3 and isinstance(obj, (tuple, list)):
        made = [_frozen(o, depth + 1) for o in obj]
        return tuple(made) if isinstance(obj, tuple) else made
    if depth < 3 and isinstance(obj, dict):
        return {k: _frozen(v, depth + 1) for k, v in obj.items()}
    return obj


def _thawed(kept, like, depth: int = 0):
    """The kept tensors again, fresh (a clone each step, requiring grad where the script's did)."""
    if isinstance(kept, torch.Tensor):
        t = kept.clone()
        return t.requires_grad_(True) if isinstance(like, torch.Tensor) and like.requires_grad and t.is_floating_point() else t
    if depth < 3 and isinstance(kept, (tuple, list)):
        made = [_thawed(k, l, depth + 1) for k, l in zip(kept, like)]
        return tuple(made) if isinstance(kept, tuple) else made
    if depth < 3 and isinstance(kept, dict):
        return {k: _thawed(v, like[k], depth + 1) for k, v in kept.items()}
    return kept


class RepeatFirstStep(_Hooks):
    """Listener and patch for a script that feeds its model without a DataLoader (slices of its own
    tensors, a ``get_batch(i)``, a generator): every training call of the model gets the tensors of
    its first training call again (inputs and any carried state, e.g. an RNN's hidden state), and every
    training call of a ``torch.nn.functional`` loss gets the first call's target, whenever the shapes
    and dtypes match that first call's. A call that does not match keeps its own tensors and is
    counted (``kept_forwards`` / ``kept_targets``): the rerun then was not one batch repeated, and the
    caller says so. Evaluation calls (grad mode off or eval mode) are left alone."""

    def __init__(self, index: int, name: str, loss_names: tuple[str, ...]):
        super().__init__(index, name)
        self.loss_names = loss_names
        self.first_args = self.first_target = None
        self.shape_args = self.shape_target = None
        self.replaced_forwards = self.kept_forwards = 0
        self.replaced_targets = self.kept_targets = 0
        self.short_forwards = self.short_targets = 0   # of the kept: the first call's tensors cut short
        self._undo: list = []
        self._classes: list = []   # (model class, its forward, whether the class defined it itself)
        self.kept_steps: set[int] = set()   # optimizer steps (1-based) whose forward kept its own tensors
        self._rec = None

    # -- the model's inputs ---------------------------------------------------------------------
    def on_forward(self, rec, info, args) -> None:
        self._rec = rec
        if self._is_model(info) and self.module is None:
            # the model's class gets the wrapped forward (restored on exit), not a hook on the instance:
            # a script that pickles its model (torch.save(model, f)) must not meet nnwizard's objects
            self.module = info.module
            cls = type(info.module)
            original = cls.forward
            own = cls.__dict__.get("forward") is original   # defined by the class itself, not inherited
            repeat, model = self, info.module

            def forward(module, *args, **kwargs):
                if module is model:
                    args, kwargs = repeat._inputs(module, args, kwargs)
                return original(module, *args, **kwargs)

            cls.forward = forward
            self._classes.append((cls, original, own))

    def _inputs(self, module, args, kwargs):
        if not torch.is_grad_enabled() or not module.training:
            return args, kwargs
        shape = _structure((args, kwargs))
        if self.first_args is None:
            self.first_args, self.shape_args = _frozen((args, kwargs)), shape
            return args, kwargs
        if shape != self.shape_args:
            self.kept_forwards += 1
            self.short_forwards += _shorter(shape, self.shape_args)
            if self._rec is not None:
                self.kept_steps.add(self._rec.recording.total_steps + 1)   # the step this forward leads to
            return args, kwargs
        self.replaced_forwards += 1
        return _thawed(self.first_args, (args, kwargs))

    # -- the loss's target ----------------------------------------------------------------------
    def _loss(self, original):
        repeat = self

        def loss(*args, **kwargs):
            if torch.is_grad_enabled() and repeat.module is not None and repeat.module.training:
                if len(args) > 1:
                    y, put = args[1], lambda new: (args[0], new, *args[2:])
                else:
                    y, put = kwargs.get("target"), None
                if isinstance(y, torch.Tensor):
                    new = repeat._target(y)
                    if new is not y:
                        if put is not None:
                            args = put(new)
                        else:
                            kwargs = {**kwargs, "target": new}
            return original(*args, **kwargs)
        return loss

    def _target(self, y: torch.Tensor) -> torch.Tensor:
        shape = (tuple(y.shape), y.dtype)
        if self.first_target is None:
            self.first_target, self.shape_target = y.detach().clone(), shape
            return y
        if shape != self.shape_target:
            self.kept_targets += 1
            self.short_targets += (y.dtype == self.first_target.dtype and y.dim() == self.first_target.dim()
                                   and y.shape != self.first_target.shape
                                   and all(a <= b for a, b in zip(y.shape, self.first_target.shape)))
            return y
        self.replaced_targets += 1
        return self.first_target.clone()

    def __enter__(self):
        for name in self.loss_names:
            original = getattr(F, name, None)
            if original is not None:
                setattr(F, name, self._loss(original))
                self._undo.append((name, original))
        return self

    def __exit__(self, *exc) -> None:
        while self._classes:
            cls, original, own = self._classes.pop()
            if own:
                cls.forward = original
            else:
                del cls.forward   # inherited (e.g. nn.Sequential's): the class gets its base's again
        while self._undo:
            name, original = self._undo.pop()
            setattr(F, name, original)

    def repeated(self, tolerance: float = 0.1, remainders: float = 1 / 3) -> bool:
        """Whether the rerun was the first step repeated: later training calls of the model and of
        its loss got the first call's tensors, all but ``tolerance`` of them. Calls whose tensors are
        the first call's cut short (an epoch's last, shorter slice keeps its own) are counted apart: up
        to ``remainders`` of the calls, one per epoch of three or more batches (a small corpus)."""
        forwards = self.replaced_forwards + self.kept_forwards
        targets = self.replaced_targets + self.kept_targets

        def fits(kept: int, short: int, total: int) -> bool:
            return kept - short <= tolerance * total and short <= remainders * total

        return bool(self.replaced_forwards and self.replaced_targets
                    and fits(self.kept_forwards, self.short_forwards, forwards)
                    and fits(self.kept_targets, self.short_targets, targets))

    def describe(self) -> str:
        return (f"{self.replaced_forwards} of {self.replaced_forwards + self.kept_forwards} later training calls of the "
                f"model got the first call's tensors, {self.replaced_targets} of "
                f"{self.replaced_targets + self.kept_targets} later loss calls its target")
