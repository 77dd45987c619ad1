"""The recorder: watches a real PyTorch program through torch's public hooks and a few patches, and
keeps a per-step trace of what the training loop actually did. One recorder serves script mode
(diagnosis, ``mode="full"``) and watch mode (the user's real run, ``mode="light"``).

Usage::

    from nnwizard.recorder import Recorder, StopRun

    with Recorder(mode="full", files=[script_path], max_steps=40) as rec:
        try:
            run_the_users_code()            # nothing in it changes
        except StopRun:                     # raised from an optimizer-step post hook once the budget
            pass                            # is spent (a BaseException: `except Exception` can't eat it)
    recording = rec.recording               # a Recording (below); every hook/patch is removed again

What is installed while the ``with`` block runs (and removed on exit, exceptions included):

- global module forward pre/post hooks (``torch.nn.modules.module.register_module_forward_*``; full mode:
  a patched ``nn.Module.__call__`` instead): top-level module calls are *models* (loss modules excepted);
  their mode, grad mode, inputs;
- global optimizer step pre/post hooks (``torch.optim.optimizer.register_optimizer_step_*``):
  one :class:`StepRecord` per ``optimizer.step()``, with gradient norm, params without grad, LRs;
- ``Optimizer.zero_grad`` / ``Module.zero_grad``, ``Tensor.backward`` / ``torch.autograd.backward``,
  ``LRScheduler.step`` (and ``ReduceLROnPlateau.step``), ``DataLoader.__iter__`` (counting batches,
  capping batches per epoch with ``limit_batches``, optionally replacing every batch with
  ``replace_batch(batch, index)``), and the ``torch.nn.functional`` loss functions (the tensors that
  reach the loss after the user's own reshaping; ``nn.*Loss`` modules call these too);
- full mode only: a ``TorchFunctionMode`` that notices arithmetic on a loss tensor after its
  backward (a graph kept across steps: ``total += loss``), hand-written parameter updates and
  predictions/targets taken from a model's output, and CPU copies of the first few batches,
  model inputs, loss inputs/targets and a deep copy of each model before its first forward. The mode
  watches only the user's own loop code: it leaves the mode stack while a model forward, a DataLoader
  fetch, ``optimizer.step()``, a loss function, backward or zero_grad runs (see ``Recorder._pause``),
  so the ops inside them cost no Python call. After the first MODE_FIRST steps it is on the stack for
  two consecutive steps in every MODE_EVERY only (``Recorder._mode_due``: what it looks for recurs at
  every step of a loop that has it), from any forward in eval mode or without grad to the next step's
  end (an evaluation's predictions), and on every step once a hand-written update or a model fed with
  labels is being followed.

Listener API (watch mode): pass ``listeners=[obj]``; each method is optional and is called with the
recorder first:

- ``on_batch(rec, batch, index)``            a DataLoader yielded ``batch`` (index within the epoch)
- ``on_forward(rec, model_info, args)``      a top-level model forward is about to run
- ``on_loss(rec, loss_call)``                a torch.nn.functional loss was called (a LossCall)
- ``on_loss_args(rec, loss_call, args, kwargs, value)``  the same call's live arguments and result
                                             (watch keeps them to re-execute the step; in light mode
                                             with no ``on_loss`` listener, ``loss_call`` carries only
                                             the function's name, ``fn``)
- ``on_backward(rec, loss_tensor)``          before ``loss.backward()`` runs
- ``on_step_pre(rec, optimizer, step)``      before ``optimizer.step()``; ``step`` is the StepRecord
                                             being filled (gradients as the optimizer will see them)
- ``on_step_post(rec, optimizer, step)``     after it (the StepRecord is complete); also after a
                                             hand-written update (full mode), with ``optimizer`` None
- ``on_scheduler(rec, scheduler_event)``     after ``scheduler.step()``

A listener may raise :class:`StopRun` to end the run cleanly. Listener exceptions of other kinds
are swallowed (counted in ``recording.listener_errors``): watching must never break the user's run.

Light mode (watch) is built to cost little on a long run: the global module hooks stay only until
every optimizer's parameters belong to a model seen (or DISCOVERY_STEPS steps), then every module
call runs torch's hook-free path again (a new optimizer brings them back until its model is seen);
the loss functions are patched only when a listener asks for loss calls; the loss is read once per
step at the optimizer's pre-step point (on CUDA without a host sync: a non-blocking copy queued
before the backward, see ``_loss_reading``); the gradient norm
(``_foreach_norm``) is measured on the first NORM_FIRST steps and then at an interval chosen from its
measured cost so that it stays within NORM_SHARE of the measured step time (``recording.norm_interval``,
at most ``norm_every_max``; ``StepRecord.grad_norm`` is None on the other steps); only the last
LIGHT_KEEP step records and scheduler events are kept (``recording.total_steps`` counts them all),
no loss calls and no forward events.

Full mode adds the TorchFunctionMode and small copies, and records every step, forward and loss call;
it watches module calls through a patched ``nn.Module.__call__`` rather than the global hooks (a
submodule's call inside a forward passes straight through: no hook path for it). Each optimizer's
gradient norm (and the largest parameter change, measured on at most UPDATE_SAMPLE evenly spaced
values per tensor up to step UPDATE_STEPS) is measured on its first FULL_DETAIL steps, then on every
FULL_EVERY-th (an optimizer over more than FULL_LARGE values: its first FULL_DETAIL_LARGE, then every
FULL_EVERY_LARGE-th), on the last 3 of the step budget and on any step whose loss is non-finite
(``StepRecord.grad_norm`` / ``update`` is None and ``grads_total`` / ``grads_none`` 0 on the others: their
parameters' gradients are not walked; a NaN gradient between two measured steps shows in the next step's
loss); the per-step signals (loss, zero_grad, carried gradients, LRs, model modes, forwards, loss calls)
are recorded on every step; the NaN/Inf check of the forwards' inputs since the last step
(``StepRecord.nonfinite_input``) runs on the same steps. See benchmarks/recorder_overhead.py.
"""

from __future__ import annotations

import collections
import copy
import functools
import inspect
from collections import deque
import math
import re
import sys
import time
import traceback
import weakref
from dataclasses import MISSING, dataclass, field, fields
from itertools import chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import is_lazy
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader

LOSS_FUNCTIONS = (
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
    "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
    "multi_margin_loss", "triplet_margin_loss", "ctc_loss", "multilabel_margin_loss",
)
MODE_TYPES = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)
KEEP = 4        # DataLoader batches copied to CPU in full mode
KEEP_PAIRS = 16  # training model inputs and loss inputs/targets copied to CPU in full mode
# past them, a loss call site (or another model at the same site) not seen in the first KEEP_PAIRS calls still has its
# first SITE_PAIRS calls kept (a second phase: a student trained after its teacher), for up to LATE_SITES sites
SITE_PAIRS, LATE_SITES = 2, 6
LABEL_FORWARDS = 16  # full mode: the first training forwards whose arguments are checked for the batch's labels (label_inputs)
LIGHT_KEEP = 256  # light mode: the last StepRecords / scheduler events kept (a watched run may be very long)
DISCOVERY_STEPS = 20  # light mode: global module hooks stay at most this many steps once an optimizer stepped
NORM_SHARE = 0.01  # light mode: the gradient-norm reduction may cost this share of a step (sets its interval)
NORM_FIRST = 5  # light mode: steps that always measure it (the triggers' starting level)
NORM_EVERY_MAX = 10  # light mode: the longest interval between two gradient-norm measurements
CLIP_KEEP = 200  # full mode: gradient-clipping calls recorded
SPAN_CHECKS = 4  # steps at whose first backward full mode looks for the graph of the step before
SPAN_NODES = 2000  # graph nodes of each of those steps kept to check the next step's graph against
DROPPED_OUTS = 16384  # full mode: output nodes of forwards the pending cap dropped, kept (by id) until the next backward
FULL_DETAIL = 12  # full mode: the first steps whose gradient norm and parameter change are always measured (the trace table shows the first 11),
FULL_EVERY = 8    # then every FULL_EVERY-th step's, the last 3 of the step budget's, and any step with a non-finite loss
FULL_LARGE = 1_000_000  # full mode: an optimizer over more values than this has its gradient norm (one memory-bound pass over
FULL_DETAIL_LARGE = 3   # every gradient: ~3 ms per 7M values on one core, several % of a dense model's step) and parameter change
FULL_EVERY_LARGE = 8    # measured on its first FULL_DETAIL_LARGE steps, then every FULL_EVERY_LARGE-th (and the last 3, non-finite losses)
MODE_FIRST = 8    # full mode: the graph mode watches every step up to this one (and while labels are followed),
MODE_EVERY = 8    # then two consecutive steps in every MODE_EVERY (the second step sees a graph kept from the first)
UPDATE_STEPS = 64  # full mode: the parameter change (StepRecord.update) is measured up to this step
UPDATE_SAMPLE = 4096  # full mode: a parameter's change over a step is compared on at most this many evenly spaced values


class StopRun(BaseException):
    """The run's budget is spent: raised inside the user's program, caught by the runner."""


# ------------------------------------------------------------------------------------ records
_WRAPPERS = {"OptimizedModule": "_orig_mod", "_FabricModule": "_forward_module", "DataParallel": "module",
             "DistributedDataParallel": "module"}   # a wrapper class's name -> the attribute holding the model it runs


def inner_model(module: nn.Module) -> nn.Module:
    """The model a wrapper runs (torch.compile's OptimizedModule, Lightning Fabric's _FabricModule,
    (Distributed)DataParallel): its parameters are the wrapper's tensors, its layer names the user's own. Any
    other module is itself."""
    for _ in range(4):
        attr = _WRAPPERS.get(type(module).__name__)
        inner = module.__dict__.get("_modules", {}).get(attr) if attr else None
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return module


@dataclass
class ModelInfo:
    index: int
    name: str                    # the class name (of the model a wrapper runs: see inner_model)
    module: nn.Module
    params: int
    trainable: int
    mode_layers: int             # Dropout (p > 0) / BatchNorm layers: where train/eval mode matters
    reads_training: list[str] = field(default_factory=list)  # its own classes' forwards that branch on self.training
    initial: nn.Module | None = None   # deep copy of the model it runs (inner_model) before its first forward (full mode)
    forwards: int = 0
    first_step: int = 0          # optimizer steps taken before its first forward
    shadowed: list[str] = field(default_factory=list)  # nn.Module methods the user's class overrides
    copy_of: int | None = None   # loaded (torch.load / load_state_dict) as a copy of this earlier model (full mode)
    owner: nn.Module | None = field(default=None, repr=False)  # full mode: the module whose method (its forward()
    # called directly, not through __call__) called this one: the model that really ran (and owns the parameters)
    wrapper: str | None = None   # the wrapper's class name, when the module called is one (inner_model)

    def parameters(self):
        """The parameters of the model that ran: the owner's when there is one."""
        return (self.owner or self.module).parameters()


@dataclass
class OptimizerInfo:
    index: int
    name: str
    optimizer: torch.optim.Optimizer
    groups: list[dict]           # per group: lr, params (tensors), values, and the other hyperparameters
    steps: int = 0
    models: list[int] = field(default_factory=list)   # which models' parameters it holds
    foreign: int = 0             # its parameter tensors that belong to no recorded model
    built: int = 1               # objects of its class built over the same parameters (``optimizer`` is the latest)
    built_at: list[int] = field(default_factory=lambda: [0])   # ``steps`` when each was built (the first 64)
    cadence: tuple[int, int] = (0, 1)   # full mode: (its first steps measured in detail, then every n-th): _cadence
    where: str | None = None     # full mode: the user's line that built it


@dataclass
class StepRecord:
    step: int                    # 1-based, over all optimizers
    optimizer: int
    t: float                     # seconds since the recording started, at the step
    loss: float | None = None    # the last tensor backward() was called on before this step
    losses: list[float] = field(default_factory=list)   # every backward since the previous step
    backwards: int = 0
    loss_calls: int = 0          # loss-function calls (training grad mode) since the previous step
    loss_call_mean: float | None = None  # mean value of those calls
    forwards: dict[int, int] = field(default_factory=dict)  # model index -> forward calls since previous step
    training: dict[int, bool] = field(default_factory=dict)  # model index -> model.training at its forwards
    grad_enabled: bool = True
    grad_norm: float | None = None
    grad_norm_clipped: float | None = None   # the norm after the script's clip_grad_norm_ (grad_norm: before it)
    grads_none: int = 0          # trainable tensors of the optimizer with .grad None
    grads_total: int = 0         # (light mode: both counted on the steps whose gradient norm is measured, 0 on the others)
    grads_nonfinite: bool = False
    zero_grad: bool = False      # a zero_grad() (optimizer or model) ran since the previous step
    zero_grad_after_backward: bool = False  # a zero_grad() ran after a backward of this step, before its step()
    carried: float | None = None  # share of the optimizer's grads still non-zero at the first backward after the previous step
    lrs: list[float] = field(default_factory=list)
    epoch: int = 0               # training passes over the DataLoader whose batch the step took (1 = first)
    batch: int = -1              # batch index within the epoch (-1: no DataLoader)
    scheduler_steps: int = 0     # scheduler.step() calls so far
    update: float | None = None  # largest |change| of a parameter over this step (full mode; on at most UPDATE_SAMPLE values per tensor)
    update_rel: float | None = None  # the step's change as a share of the parameters' size, ||change|| / ||values|| (the same values)
    nonfinite_input: bool = False
    duration_s: float = 0.0      # wall time since the previous step
    none_names: list[str] = field(default_factory=list)  # trainable params with .grad None (full mode, first steps)
    closure: bool = False        # step(closure): measured after the closure's first call
    manual: bool = False         # a hand-written update (in-place ops on parameters no optimizer holds), not optimizer.step()
    updated: int = 0             # manual: parameter tensors the update changed, of grads_total
    update_cos: float | None = None  # manual: cosine of the update with the gradient (-1: descent; +1: it climbs the loss)


_STEP_DEFAULTS = {f.name: f.default for f in fields(StepRecord) if f.default is not MISSING}
_STEP_FRESH = tuple((f.name, f.default_factory) for f in fields(StepRecord) if f.default_factory is not MISSING)


_STEP_BLANK = {"step": 0, "optimizer": -1, "t": 0.0, **_STEP_DEFAULTS}
# the fields with a default_factory, each a fresh empty list or dict per record (_blank_step makes them literally)
_STEP_LISTS, _STEP_DICTS = ("losses", "lrs", "none_names"), ("forwards", "training")
assert dict(_STEP_FRESH) == {**dict.fromkeys(_STEP_LISTS, list), **dict.fromkeys(_STEP_DICTS, dict)}


def _wrapped_optimizer(optimizer) -> torch.optim.Optimizer | None:
    """The optimizer a wrapper delegates to (Lightning Fabric's ``_FabricOptimizer`` and Lightning's
    ``LightningOptimizer`` keep it as ``_optimizer``, Accelerate's ``AcceleratedOptimizer`` as ``optimizer``),
    when the wrapper's parameter groups are that optimizer's own; None for an optimizer itself."""
    attrs = getattr(optimizer, "__dict__", {})
    for name in ("_optimizer", "optimizer"):
        inner = attrs.get(name)
        if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
            try:
                if optimizer.param_groups is inner.param_groups:
                    return inner
            except Exception:  # noqa: BLE001 - an odd wrapper: treat it as an optimizer of its own
                return None
    return None


def _blank_step(n: int) -> StepRecord:
    """``StepRecord(step=n, optimizer=-1, t=0.0)`` without the dataclass ``__init__``'s 30 assignments
    (light mode makes one every step): a copy of the defaults (one C copy of a dict, not a merge item by
    item) and the fields' own fresh lists and dicts (``_STEP_LISTS``, ``_STEP_DICTS``)."""
    step = object.__new__(StepRecord)
    step.__dict__ = d = _STEP_BLANK.copy()
    d["step"], d["losses"], d["lrs"], d["none_names"], d["forwards"], d["training"] = n, [], [], [], {}, {}
    return step


def _cadence(groups: list[dict]) -> tuple[int, int]:
    """Full mode: an optimizer's detail cadence from its param groups (as recorded): its first FULL_DETAIL
    steps, then every FULL_EVERY-th; over more than FULL_LARGE values FULL_DETAIL_LARGE, FULL_EVERY_LARGE."""
    return (FULL_DETAIL_LARGE, FULL_EVERY_LARGE) if sum(g["values"] for g in groups) > FULL_LARGE else (FULL_DETAIL, FULL_EVERY)


_GRAD, _REQUIRES, _LR, _PARAMS = attrgetter("grad"), attrgetter("requires_grad"), itemgetter("lr"), itemgetter("params")
_monotonic, _grad_enabled = time.monotonic, torch.is_grad_enabled   # (one lookup less: light mode runs them every step)
_FUSED = ("on_loss_args", "on_backward")   # light mode: what a fused watch does inline (its step methods are called directly)
_NONE = type(None)


def _trainable_grads(groups: list[dict]) -> tuple[list, list]:
    """The trainable tensors of an optimizer's param groups and their ``.grad`` (None where unset), walked in
    C (``map``) rather than in Python: full mode's step pre hook runs it every step, light mode's on the
    steps whose gradient norm it measures."""
    params = groups[0]["params"] if len(groups) == 1 else list(chain.from_iterable(map(_PARAMS, groups)))
    if not all(map(_REQUIRES, params)):
        params = [p for p in params if p.requires_grad]
    return params, list(map(_GRAD, params))


@dataclass
class LossCall:
    fn: str
    input_shape: list
    input_dtype: str
    target_shape: list | None
    target_dtype: str | None
    value: float | None
    reduction: str
    grad_enabled: bool
    training: bool | None        # the last model's mode
    step: int                    # optimizer steps before this call
    where: str | None
    from_model: bool             # the input's graph reaches a model output (or it is one)
    model_output_shape: list | None
    target_is_output: bool = False   # the target is the input itself, detached, or its argmax
    inputs: torch.Tensor | None = None   # CPU copies (first KEEP training calls, full mode)
    targets: Any = None
    eval: bool = True            # until a backward reaches its value
    replay: Any = field(default=None, repr=False)  # (function, extra args, kwargs) to call it again
    node: Any = field(default=None, repr=False)
    # the positional argument of the latest model forward that holds the target itself (same storage): a model
    # given its targets to compute its own loss (nanoGPT's model(X, Y)); recorded with the copies above
    target_arg: int | None = None
    watched: bool = True   # the graph mode was on the stack (full mode): ``target_is_output`` could be seen
    late: bool = False     # kept past KEEP_PAIRS for a call site first seen later (not paired with model inputs)
    model: int | None = None   # the index of the model that ran last (full mode)
    forward: int | None = None  # the position in ``Recording.forwards`` of the forward whose output it scores
    target_grad: bool = False   # the target carries gradient back into the model whose output is the input (full mode)


@dataclass
class ForwardEvent:
    model: int
    training: bool
    grad_enabled: bool
    step: int
    trained: bool = False        # a later backward reached its output
    loader: int | None = None    # the DataLoader being iterated (innermost) and which of its iterations
    iteration: int = -1
    scored: bool = False         # its output went into a loss or a prediction (argmax, max, threshold; full mode)
    overflow: bool = False       # dropped from the pending forwards by their cap, no backward since (full mode)
    calls_at: int = 0            # loss calls recorded before it began (full mode)
    fetch: int = 0               # DataLoader batches served before it began, all loaders (full mode)
    absorbed: list | None = field(default=None, repr=False)  # forwards and loss calls trained if it is (see _absorb)
    node: Any = field(default=None, repr=False)
    outs: list = field(default_factory=list, repr=False)  # grad_fns of its output tensors (full mode)


@dataclass
class SchedulerEvent:
    name: str
    index: int
    at_step: int                 # optimizer steps before it
    epoch: int
    lr: float | None


@dataclass
class LoaderInfo:
    index: int
    loader: DataLoader
    dataset_len: int | None
    batch_size: int | None
    shuffle: bool
    drop_last: bool
    length: int | None
    iterations: int = 0
    batches: list[int] = field(default_factory=list)   # batches served per iteration
    backwards: list[int] = field(default_factory=list)  # backward calls during each iteration


@dataclass
class ClipCall:
    """A ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` call (full mode)."""
    fn: str
    where: str | None
    step: int                    # optimizer steps before it
    fresh: bool                  # a backward ran since the last step and no zero_grad came after it
    limit: float | None          # max_norm / clip_value
    norm: float | None           # the total norm clip_grad_norm_ returned (before clipping)


@dataclass
class RecordedError:
    type: str
    message: str
    where: str | None
    traceback: str
    step: int
    exception: BaseException | None = None


@dataclass
class Recording:
    models: list[ModelInfo] = field(default_factory=list)
    optimizers: list[OptimizerInfo] = field(default_factory=list)
    schedulers: list[dict] = field(default_factory=list)   # name, index, optimizer, object
    steps: list[StepRecord] = field(default_factory=list)
    loss_calls: list[LossCall] = field(default_factory=list)
    forwards: list[ForwardEvent] = field(default_factory=list)
    scheduler_steps: list[SchedulerEvent] = field(default_factory=list)
    loaders: list[LoaderInfo] = field(default_factory=list)
    batches: list[Any] = field(default_factory=list)        # CPU copies of the first DataLoader batches
    model_inputs: list[tuple] = field(default_factory=list)  # (model index, args) of the first training forwards
    model_input_forwards: list[int] = field(default_factory=list)  # each one's position in ``forwards``
    eval_inputs: list[tuple] = field(default_factory=list)   # (model index, fingerprint(args)) of the first no-grad forwards
    graph_kept: list[str] = field(default_factory=list)    # ops on a backwarded loss whose result outlived the step
    graph_spans: list[str] = field(default_factory=list)   # backwards whose graph reached a forward trained before the last step
    manual_updated: set = field(default_factory=set, repr=False)  # id() of parameters a hand-written update changed
    alive_losses: list[int] = field(default_factory=list)  # per step: backwarded loss tensors still referenced
    backwards: int = 0
    zero_grads: int = 0
    # torch.distributions objects built from tensors that require grad (a policy from the model's output, a
    # VAE's posterior): the objective is a likelihood or a policy gradient, not a curve that must descend (full mode)
    distributions: int = 0
    error: RecordedError | None = None
    stopped: str | None = None   # why the run was cut short (budget), None when it ended by itself
    capped_training: int = 0     # training passes (a DataLoader's or a slice loop's) the batch cap ended early
    pass_cap: int | None = None  # the batches a pass could take when the run ended (lengthened or lowered on the way)
    listener_errors: int = 0
    failed_loss: tuple | None = None  # (function name, target) of a loss call that raised
    notes: list[str] = field(default_factory=list)   # what the recording changed (e.g. worker processes off)
    clips: list[ClipCall] = field(default_factory=list)  # gradient-clipping calls (the first CLIP_KEEP)
    seconds: float = 0.0
    mode: str = "full"
    total_steps: int = 0         # optimizer steps so far (light mode keeps only the last LIGHT_KEEP records)
    norm_interval: int = 1       # light mode: steps between gradient-norm measurements (last value chosen)
    # full mode: model index -> where it was first called, in grad mode, with a positional argument computed from
    # the labels of a DataLoader batch (its second tensor of two): labels used as the model's input (forward-forward
    # overlays them on the image), not only as a target. Watched over the first LABEL_FORWARDS training forwards.
    label_inputs: dict[int, str | None] = field(default_factory=dict)

    @property
    def loss_curve(self) -> list[float]:
        return [s.loss for s in self.steps if s.loss is not None]

    def model_of(self, module: nn.Module) -> ModelInfo | None:
        return next((m for m in self.models if m.module is module), None)


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def cpu_copy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(cpu_copy(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(o) for o in obj)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    return obj


def fingerprint(obj: Any) -> tuple | None:
    """What tells one batch from another, cheaply: each of the first 4 tensors' shape, dtype and a hash of
    up to 4096 of its values (evenly spaced); None when a tensor cannot be read that way."""
    out = []
    try:
        for t, _ in zip(_tensors(obj), range(4)):
            flat = t.detach().reshape(-1)
            sample = flat[:: max(flat.numel() // 4096, 1)][:4096]
            out.append((tuple(t.shape), str(t.dtype), hash(sample.to("cpu", torch.float64).numpy().tobytes())))
    except Exception:  # noqa: BLE001 - complex, quantized, sparse or meta tensors: not told apart
        return None
    return tuple(out) or None


def _same_storage(t: torch.Tensor, args: tuple) -> int | None:
    """The index of the first tensor in ``args`` that shares ``t``'s storage (``t`` is it, a view or a slice of it)."""
    try:
        ptr = t.untyped_storage().data_ptr()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr and ptr:
                return i
    except (RuntimeError, NotImplementedError):  # tensors without storage
        pass
    return None


def _storage_ptr(t: torch.Tensor) -> int | None:
    """The address of a tensor's storage; a DTensor's (FSDP2's sharded parameters, tensor parallelism) is its local
    shard's; None for a tensor without one (a wrapper subclass holds no storage of its own)."""
    local = getattr(t, "_local_tensor", None)
    try:
        return (local if isinstance(local, torch.Tensor) else t).untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage
        return None


def total_norm(norms: list[torch.Tensor]) -> float:
    """The global norm from per-tensor norms (``torch._foreach_norm``'s), as one float."""
    if len(norms) <= 32 and not norms[0].is_cuda:  # a few CPU tensors: read one by one, faster than a stack
        return math.hypot(*map(float, norms))
    try:
        return float(torch.linalg.vector_norm(torch.stack([n.float() for n in norms])))
    except RuntimeError:  # norms on several devices
        return math.sqrt(sum(float(n) ** 2 for n in norms))


def _nonfinite(inputs: list[tuple]) -> bool:
    """Does any floating-point tensor among these forwards' arguments hold a NaN or an Inf?"""
    for args in inputs:
        for t in (args if len(args) == 1 and isinstance(args[0], torch.Tensor) else _tensors(args)):
            if t.layout != torch.strided or t.grad_fn is not None:
                continue  # sparse inputs (a graph's adjacency matrix): isfinite has no sparse kernel; a tensor the
                # graph computed (an RNN's hidden state fed back, another model's output) is not the data
            t = t.detach()
            if t.is_floating_point() and t.numel() and not math.isfinite(float(t.sum())) \
                    and not bool(torch.isfinite(t).all()) and not _additive_mask(t):  # (a sum of finite values may overflow)
                return True
    return False


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences (bold, colours): torch's own messages carry some."""
    return _ANSI.sub("", text)


def _additive_mask(t: torch.Tensor) -> bool:
    """Only 0 and -inf: an additive attention mask (nn.Transformer's square subsequent mask), not data."""
    return bool(((t == 0) | (t == float("-inf"))).all())


def _nonzero(values: list[torch.Tensor]) -> list[bool]:
    """Which of these scalar tensors are not 0 (NaN and Inf included: a gradient gone non-finite was not
    cleared), read with one host transfer where there are many."""
    if len(values) > 8:
        try:
            return torch.stack([v.float() for v in values]).ne(0).tolist()
        except RuntimeError:  # on several devices
            pass
    return [float(v) != 0 for v in values]


def _update_views(params: list[torch.Tensor], exact: bool) -> list[torch.Tensor]:
    """Full mode: the values of each parameter a step's change is measured on: all of them for a tensor
    of at most UPDATE_SAMPLE values (or ``exact``), else UPDATE_SAMPLE evenly spaced ones (a copy of
    each tensor would cost more than the step of a large model)."""
    out = []
    for p in params:
        flat = p.detach().reshape(-1)
        n = flat.numel()
        out.append(flat if exact or n <= UPDATE_SAMPLE else flat[:: -(-n // UPDATE_SAMPLE)])
    return out


def _snapshot(views: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """A copy of the values of ``views``: one flat tensor (a single copy op), or a copy of each where
    they do not concatenate (on several devices)."""
    try:
        return torch.cat(views) if len(views) != 1 else views[0].clone()
    except RuntimeError:
        return [v.clone() for v in views]


def _largest_change(after: list[torch.Tensor], before: torch.Tensor | list[torch.Tensor]) -> tuple[float, float | None]:
    """The largest |change| between the values of ``after`` now and their ``_snapshot`` before, and the change's
    norm as a share of the values' norm before (None when they were all zero)."""
    if isinstance(before, torch.Tensor):
        now = torch.cat(after) if len(after) != 1 else after[0]
        if not now.numel():
            return 0.0, None
        diff = (now - before).float()
        size = float(before.float().norm())
        return float(diff.abs().max()), (float(diff.norm()) / size if size > 0 else None)
    pairs = [(a, b) for a, b in zip(after, before) if a.numel()]
    if not pairs:
        return 0.0, None
    diffs = torch._foreach_sub([a for a, _ in pairs], [b for _, b in pairs])
    size = math.hypot(*(float(n) for n in torch._foreach_norm([b for _, b in pairs])))
    change = math.hypot(*(float(n) for n in torch._foreach_norm(diffs)))
    torch._foreach_abs_(diffs)
    return float(torch.stack([d.max().float() for d in diffs]).max()), (change / size if size > 0 else None)


_DTYPE_NAMES: dict = {}
_compiling = torch.compiler.is_compiling   # light mode: True while torch.compile traces a graph


def _values(params) -> int:
    """Values in these parameters; a lazy module's not yet initialised count 0 (their numel() raises)."""
    return sum(0 if is_lazy(p) else p.numel() for p in params)


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _shape(x) -> list | None:
    return list(x.shape) if isinstance(x, torch.Tensor) else None


_NN_METHODS = ("train", "eval", "parameters", "named_parameters", "zero_grad", "to", "state_dict", "modules",
               "children", "cuda", "cpu", "float", "double", "half", "apply", "load_state_dict", "register_buffer",
               "requires_grad_", "__call__", "__setattr__", "__getattr__")


# ops whose result, taken from a tensor that carries a graph (a model output), is a prediction, not
# a target; and ops that keep that provenance (reshape, cast)
_FROM_OUTPUT = {"argmax", "max", "detach", "topk", "round", "__gt__", "__ge__", "gt", "ge", "sign", "clone"}
_INPLACE_SETS = {"__set__", "__isub__", "__iadd__", "__imul__", "__itruediv__"}
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                              "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"})
_SCORES = {"argmax", "max", "topk", "round", "__gt__", "__ge__", "gt", "ge", "sign", "sigmoid", "softmax"}
_KEEPS_PROVENANCE = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "long", "float", "int", "to", "type",
                     "__getitem__", "contiguous", "clone", "view_as", "reshape_as", "double", "detach"}


_stack_len = torch._C._len_torch_function_stack
_stack_pop = torch._C._pop_torch_function_stack
_stack_push = torch._C._push_on_torch_function_stack
_stack_at = torch._C._get_function_stack_at


def _remove_mode(mode: TorchFunctionMode) -> None:
    """Take ``mode`` out of the torch-function mode stack wherever it is (modes the script entered
    above it and left open keep their order)."""
    above = []
    while _stack_len():
        top = _stack_pop()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _stack_push(m)


class _GraphMode(TorchFunctionMode):
    """Full mode: notices a torch op taking a loss tensor whose backward already ran and producing a
    tensor that requires grad (``running += loss`` keeps every step's graph alive)."""

    def __init__(self, recorder: "Recorder"):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rec = self.recorder
        if rec._manual_candidates and args:
            name = getattr(func, "__name__", "")
            if (name.endswith("_") and not name.startswith("__")) or name in _INPLACE_SETS:
                rec._maybe_manual(name, args[0])
        out = func(*args, **(kwargs or {}))
        if rec._labels:   # (empty once the first training forwards were checked)
            rec._label_op(func, args, kwargs, out)
        spent = rec._spent
        if spent:
            for a in args[:2]:
                if isinstance(a, torch.Tensor) and id(a) in spent and spent[id(a)]() is a:
                    if isinstance(out, torch.Tensor) and out.requires_grad:
                        rec._graph_op(args, out)
                    break
        if args and isinstance(out, torch.Tensor) and isinstance(args[0], torch.Tensor):
            name = getattr(func, "__name__", "")
            first = args[0]
            if name in _SCORES and rec._last_out is not None and rec._last_event is not None \
                    and rec._last_out[1]() is first:
                rec._last_event.scored = True
            derived = rec._derived
            if (name in _FROM_OUTPUT and first.requires_grad) or (name in _KEEPS_PROVENANCE and id(first) in derived
                                                                 and derived[id(first)]() is first):
                if not out.requires_grad:
                    if len(derived) > 256:
                        rec._derived = derived = {k: r for k, r in derived.items() if r() is not None}
                    derived[id(out)] = weakref.ref(out)
        return out


# ------------------------------------------------------------------------------------ recorder
class Recorder:
    """See the module docstring. ``files``: the user's source files (for file:line); ``max_steps``,
    ``time_limit_s``, ``limit_batches`` (per DataLoader iteration), ``max_forwards`` bound the run."""

    _pre_listener: Callable | None = None    # light mode: the listeners' on_step_pre / on_step_post (_listener)
    _post_listener: Callable | None = None
    _step_info: OptimizerInfo | None = None  # light mode: the optimizer info the step pre hook looked up
    # light mode: a watch (nnwizard.watcher.Watch) whose loss-call and backward work runs inside these hooks rather
    # than as a listener; its step methods are the step hooks' direct listener calls (set before __enter__ by the
    # watch that starts its own recorder; see _listener)
    _fast: Any = None

    def __init__(self, mode: str = "full", *, files: list[Path] | None = None, max_steps: int | None = None,
                 time_limit_s: float | None = None, limit_batches: int | None = None, max_forwards: int | None = None,
                 replace_batch: Callable[[Any, int], Any] | None = None, listeners: list | None = None,
                 lr_scale: float | None = None):
        if mode not in ("full", "light"):
            raise ValueError(f"mode must be 'full' or 'light', not {mode!r}")
        self.mode, self.full = mode, mode == "full"
        self.files = {str(Path(f).resolve()) for f in files or []}
        self.folders = {str(Path(f).resolve().parent) for f in files or []}
        self.max_steps, self.time_limit_s, self.limit_batches = max_steps, time_limit_s, limit_batches
        self.max_forwards, self.replace_batch, self.lr_scale = max_forwards, replace_batch, lr_scale
        self.listeners = list(listeners or [])
        self.recording = Recording(mode=mode)
        if not self.full:  # bounded memory over a long run
            self.recording.steps = deque(maxlen=LIGHT_KEEP)
            self.recording.scheduler_steps = deque(maxlen=LIGHT_KEEP)
        self._fns: dict[str, list] = {}           # listener methods by event name (filled on entry)
        self._listening = False                   # any listener method at all (else full mode skips _notify)
        self._module_hooks: list = []             # the global module forward hooks while installed
        self._hooked_at = 0                       # steps taken when they were installed
        self._scheduler_count = 0
        self.norm_every_max = NORM_EVERY_MAX      # light mode: watch sets its log interval here
        self.grad_norms: tuple | None = None      # light mode: (grads, per-tensor norms) of the current step
        self._norm_cost = 0.0                     # light mode: seconds one gradient-norm reduction took
        self._step_s = 0.0                        # light mode: seconds per step (running mean)
        self._loss_t: tuple | None = None         # light mode: how to read the last backward's loss (_loss_reading)
        self._pinned: torch.Tensor | None = None  # light mode, CUDA: the pinned host scalar the loss is copied to
        self._undo: list[Callable[[], None]] = []
        self._depth = 0
        self._in_model = False   # full mode: inside a model's top-level call (not a loss module's)
        self._in_loss = 0
        self._in_backward = 0
        self._in_sched = 0
        self._module_ids: dict[int, tuple] = {}   # id(module) -> (weakref, model index (None: a submodule / loss), torch loss module)
        self._pending: StepRecord | None = None
        self._pending_forwards: list[ForwardEvent] = []
        self._overflowed = 0   # full mode: forwards the pending cap dropped since the last graph search
        self._fetches = 0      # DataLoader batches served (all loaders)
        self._dropped_outs: dict[int, Any] = {}   # full mode: id -> those forwards' output nodes (held, so ids stay theirs), since the last backward
        self._pending_losses: list[LossCall] = []
        self._last_step_t = 0.0
        self._zero_grad_since = self._zero_after_backward = False
        self._window_values = []
        self._backward_since_step = 0
        self._zeroed_since_backward = False   # a zero_grad came after the latest backward
        self._carried_by: dict[int, float] = {}  # full mode: optimizer index -> its share of grads still set at the first backward after a step
        self._last_model: ModelInfo | None = None
        self._last_event: ForwardEvent | None = None
        self._trained_nodes: list = []   # grad_fns of forward outputs a backward reached since the last step, and
        # (the first SPAN_CHECKS steps) the nodes of the graphs it ran through (full)
        self._prev_nodes: list = []      # the same, of the steps before the last optimizer step
        self._manual_candidates: dict[int, tuple] = {}  # storage ptr / id -> (param, name): trainable parameters
        self._manual_key: tuple | None = None
        self._manual_open: tuple | None = None   # (step, [(param, copy, grad norm)], updated ids) of a hand-written update
        self._in_opt_step = False
        self._loaded: dict[int, weakref.ref] = {}   # modules returned by torch.load or given a state dict (full)
        self._last_out: tuple | None = None        # (model index, output tensor weakref, shape)
        self._spent: dict[int, weakref.ref] = {}
        self._spent_all: list[weakref.ref] = []
        self._graph_where: set[str] = set()
        self._loader_stack: list[LoaderInfo] = []
        self._epochs = 0
        self._batch_index = -1
        self._before_step: list[torch.Tensor] | None = None   # full mode: parameter values before optimizer.step()
        self._exact_update = False    # full mode: compare every value (a sampled comparison saw no change)
        self._view_cache: dict[int, tuple] = {}   # full mode: id(optimizer) -> (its parameters' ids and storages, _update_views)
        self._file_kinds: dict[Any, tuple] = {}   # where(): code object -> (what its file is, the file's base name)
        self._sites: dict[tuple, str] = {}        # where(): (code object, f_lasti) -> "file:line in function"
        self._loss_value: tuple | None = None   # (weakref, value) of the last loss call's result
        self._loss_link: tuple | None = None    # full mode: (weakref to a loss value, its LossCall, the ForwardEvent it comes from)
        self._scaled: set[int] = set()
        self._lr_written: dict[int, list] = {}   # lr_scale: id(optimizer) -> its groups' learning rates as last written
        self._grad_scaled: set[int] = set()      # lr_scale: ids of hand-updated parameters whose gradients are scaled
        self._scales: dict[int, tuple] = {}   # GradScaler.scale outputs -> (weakref, scale)
        self._kept: dict[int, tuple[str, weakref.ref, int]] = {}   # id -> (where, ref, step made)
        self._derived: dict[int, weakref.ref] = {}   # tensors computed from a model output without a graph
        # full mode: tensors computed from a DataLoader batch's labels (id -> weakref), while the first training
        # forwards are checked for them (_label_watch left of LABEL_FORWARDS; 0: no longer watched)
        self._labels: dict[int, weakref.ref] = {}
        self._label_watch = LABEL_FORWARDS if self.full else 0
        self._label_event: ForwardEvent | None = None   # the last forward called with labels in its input
        self._forced_workers: list = []
        self._lazy: list[ModelInfo] = []   # models registered with lazy parameters not yet initialised
        self._window_values: list[float] = []   # training loss-call values since the last step
        self._kept_pairs = 0
        self._last_forward_at: int | None = None   # the position of ``_last_event`` in the recording's forwards
        self._site_pairs: dict[tuple, int] = {}   # (loss call site, last model): calls whose inputs were kept
        self._t0 = 0.0
        self._mode_obj: _GraphMode | None = None
        self._paused = 0                          # full mode: nested calls the mode is out of the stack for
        self._popped_at: int | None = None        # the stack length it left
        self._live = False                        # the mode is on the stack now, or paused to go back (_set_live)
        self._off_at = 0                          # the stack length _set_live took it off at
        self._opt_paused = False                  # paused for an optimizer.step() (its post hook resumes)
        self._step_wraps = 0                      # optimizer steps running inside _wrap_step's wrapper
        self._wrapped_steps: set = set()          # optimizer classes whose step is wrapped
        self._opt_ids: dict[int, OptimizerInfo] = {}
        self._inputs: list[tuple] = []            # full mode: arguments of the forwards since the last step (at most 8)
        self._clip_norm: torch.Tensor | None = None   # what clip_grad_norm_ returned since the last step
        self._cleared: set[int] = set()           # full mode: id() of optimizers whose zero_grad() ran since the last step
        self._trainable_n: dict[int, int] = {}    # full mode: id(optimizer) -> its trainable tensors at its last measured step
        self._site = None   # full mode: the frame that called torch's own loss module now running (see _model_called)
        self.cap_evaluation = True       # limit_batches caps evaluation passes too (off: only training passes)
        self.evaluation_capped = False   # an evaluation pass ended at the cap

    # -- install / remove -------------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        self._t0, self._last_step_t = time.monotonic(), 0.0
        try:
            self._install()
        except BaseException:
            self._uninstall()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._uninstall()
        self.finish()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        had = name in owner.__dict__
        original = owner.__dict__.get(name) if had else getattr(owner, name)
        wrapper = make(original)
        setattr(owner, name, wrapper)

        def undo(owner=owner, name=name, had=had, original=original):
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._undo.append(undo)

    def _hook_modules(self) -> None:
        """The global module forward hooks (they make every module call of the process slower: light
        mode keeps them only until the models that own the optimizers' parameters are known)."""
        from torch.nn.modules import module as module_mod

        if not self._module_hooks:
            self._depth, self._hooked_at = 0, self.recording.total_steps
            self._module_hooks = [module_mod.register_module_forward_pre_hook(self._forward_pre),
                                  module_mod.register_module_forward_hook(self._forward_post, always_call=True)]

    def _call_patch(self, original: Callable) -> Callable:
        """Full mode watches module calls through ``nn.Module.__call__`` instead of the global module
        hooks: those put every module call of the process (each submodule of each forward) on torch's
        slow hook path for the whole run; this costs one Python call per submodule call, and sees
        every top-level module call from start to end (a model first run in a late test loop too).
        The same pre/post functions run as under the global hooks, at the top level only (a
        submodule's call inside a forward passes straight through)."""
        rec = self

        @functools.wraps(original)
        def __call__(this, *args, **kwargs):
            if rec._depth:
                return original(this, *args, **kwargs)
            try:
                event = rec._model_called(this, args)
                rec._in_model = event is not None
                output = original(this, *args, **kwargs)
                if event is not None:
                    rec._model_output(event, output)
                return output
            finally:
                rec._depth, rec._in_model, rec._site = 0, False, None
                rec._resume()
        return __call__

    def _patch_clipping(self) -> None:
        """Full mode: ``clip_grad_norm_`` / ``clip_grad_value_`` (``torch.nn.utils`` and its ``clip_grad``
        module, where scripts import them from) record where they ran relative to backward and step. Light
        mode: ``clip_grad_norm_``'s result, the norm before clipping, is kept for the step's measured gradient
        norm (after the clip every norm is at most max_norm: an explosion would never show)."""
        from torch.nn.utils import clip_grad as clip_mod

        rec = self
        if not self.full:
            def clip_light(original):
                @functools.wraps(original)
                def clip_grad_norm_(*args, **kwargs):
                    result = original(*args, **kwargs)
                    if isinstance(result, torch.Tensor):
                        rec._clip_norm = result
                    return result
                return clip_grad_norm_

            for owner in (torch.nn.utils, clip_mod):
                if "clip_grad_norm_" in owner.__dict__:
                    self._patch(owner, "clip_grad_norm_", clip_light)
            return

        def clip_patch(original):
            @functools.wraps(original)
            def clip(*args, **kwargs):
                fresh = rec._backward_since_step > 0 and not rec._zeroed_since_backward
                rec._pause()
                try:
                    result = original(*args, **kwargs)
                finally:
                    rec._resume()
                if isinstance(result, torch.Tensor):   # (clip_grad_value_ returns None)
                    rec._clip_norm = result
                if len(rec.recording.clips) < CLIP_KEEP:
                    limit = args[1] if len(args) > 1 else kwargs.get("max_norm", kwargs.get("clip_value"))
                    norm = float(result) if isinstance(result, torch.Tensor) and result.numel() == 1 else None
                    rec.recording.clips.append(ClipCall(original.__name__, rec.where(), rec.steps_taken, fresh,
                                                        float(limit) if isinstance(limit, (int, float)) else None, norm))
                return result
            return clip

        for name in ("clip_grad_norm_", "clip_grad_value_"):
            for owner in (torch.nn.utils, clip_mod):
                if name in owner.__dict__:
                    self._patch(owner, name, clip_patch)

    def _unhook_modules(self) -> None:
        while self._module_hooks:
            self._module_hooks.pop().remove()

    def _discovered(self) -> bool:
        """Light mode, after a step: every optimizer's parameters belong to models seen (or the
        discovery budget is spent), so the global module hooks can go."""
        opts = self.recording.optimizers
        if self.max_forwards is not None or not opts:
            return False
        if all(o.models and not o.foreign for o in opts):
            return True
        return self.recording.total_steps - self._hooked_at >= DISCOVERY_STEPS

    def _install(self) -> None:
        from torch.optim import lr_scheduler, optimizer as optimizer_mod

        self._fns = {name: [fn for fn in (getattr(listener, name, None) for listener in self.listeners) if fn is not None]
                     for name in ("on_batch", "on_forward", "on_loss", "on_loss_args", "on_backward", "on_step_pre",
                                  "on_step_post", "on_scheduler")}
        self._listening = any(self._fns.values())
        self._pre_listener, self._post_listener = self._listener("on_step_pre"), self._listener("on_step_post")  # (light)
        if self.full:
            self._patch(nn.Module, "__call__", self._call_patch)
        else:
            self._hook_modules()
            self._undo.append(self._unhook_modules)
        pre, post = (self._step_pre, self._step_post) if self.full else (self._measure_light, self._after_step_light)
        for h in (optimizer_mod.register_optimizer_step_pre_hook(pre),
                  optimizer_mod.register_optimizer_step_post_hook(post)):
            self._undo.append(h.remove)
        rec = self

        def zero_grad_patch(original):  # full mode (light mode: _zero_grad_light)
            @functools.wraps(original)
            def zero_grad(this, *args, **kwargs):
                if rec._manual_open is not None:
                    rec._close_manual()
                rec._zero_grad_since = True
                rec._zero_after_backward = rec._zero_after_backward or rec._backward_since_step > 0
                rec._zeroed_since_backward = True
                rec.recording.zero_grads += 1
                if isinstance(this, torch.optim.Optimizer):
                    rec._cleared.add(id(_wrapped_optimizer(this) or this))
                rec._pause()
                try:
                    return original(this, *args, **kwargs)
                finally:
                    rec._resume()
            return zero_grad

        if not self.full:
            zero_grad_patch = self._zero_grad_light
        self._patch(torch.optim.Optimizer, "zero_grad", zero_grad_patch)

        def init_patch(original):
            @functools.wraps(original)
            def __init__(this, *args, **kwargs):
                original(this, *args, **kwargs)
                try:
                    info = rec._optimizer_info(this)
                    if info.where is None and rec.full:
                        info.where = rec.where()   # the line that built it (a fix names it)
                except Exception:  # noqa: BLE001 - recording must never break the user's optimizer
                    pass
            return __init__

        self._patch(torch.optim.Optimizer, "__init__", init_patch)
        self._patch(nn.Module, "zero_grad", zero_grad_patch)
        self._patch_clipping()

        def backward_patch(original):  # full mode (light mode: _backward_light)
            @functools.wraps(original)
            def backward(tensors, *args, **kwargs):
                if rec._in_backward:
                    return original(tensors, *args, **kwargs)
                rec._in_backward += 1
                rec._pause()
                try:
                    rec._before_backward(tensors)
                    result = original(tensors, *args, **kwargs)
                finally:
                    rec._in_backward -= 1
                    rec._resume()
                return result
            return backward

        if self.full:  # the mode must leave before Tensor.backward's own __torch_function__ check
            self._patch(torch.Tensor, "backward", backward_patch)
        self._patch(torch.autograd, "backward", backward_patch if self.full else self._backward_light)  # Tensor.backward calls it

        def sched_patch(original):
            @functools.wraps(original)
            def step(this, *args, **kwargs):
                if rec._in_sched or getattr(this, "_is_initial", False):
                    if getattr(this, "_is_initial", False):
                        rec._scheduler_seen(this)
                    return original(this, *args, **kwargs)
                rec._in_sched += 1
                try:
                    return original(this, *args, **kwargs)
                finally:
                    rec._in_sched -= 1
                    rec._scheduler_stepped(this)
            return step

        self._patch(lr_scheduler.LRScheduler, "step", sched_patch)
        if "step" in lr_scheduler.ReduceLROnPlateau.__dict__:
            self._patch(lr_scheduler.ReduceLROnPlateau, "step", sched_patch)

        def iter_patch(original):
            @functools.wraps(original)
            def __iter__(this):
                if rec.full and getattr(this, "num_workers", 0) > 0:
                    rec._forced_workers.append((this, this.num_workers))
                    rec.recording.notes.append(f"DataLoader num_workers={this.num_workers} ran with 0 workers while recorded")
                    this.num_workers = 0
                if not rec.full:
                    return _LoaderIter(rec, this, original(this))
                rec._pause()   # (the iterator's set-up draws its seed with torch ops)
                try:
                    return _LoaderIter(rec, this, original(this))
                finally:
                    rec._resume()
            return __iter__

        self._patch(DataLoader, "__iter__", iter_patch)

        if self.full:  # a checkpoint loaded into a new instance of a model already seen is a copy of it, not a new model
            def load_patch(original):
                @functools.wraps(original)
                def load(*args, **kwargs):
                    result = original(*args, **kwargs)
                    if isinstance(result, nn.Module):
                        rec._loaded[id(result)] = weakref.ref(result)
                    return result
                return load

            def load_state_patch(original):
                @functools.wraps(original)
                def load_state_dict(this, *args, **kwargs):
                    rec._loaded[id(this)] = weakref.ref(this)
                    return original(this, *args, **kwargs)
                return load_state_dict

            self._patch(torch, "load", load_patch)
            self._patch(nn.Module, "load_state_dict", load_state_patch)

        def scale_patch(original):
            @functools.wraps(original)
            def scale(this, outputs):
                result = original(this, outputs)
                if isinstance(result, torch.Tensor) and result is not outputs:
                    try:
                        rec._scales[id(result)] = (weakref.ref(result), float(this.get_scale()) if rec.full else this)
                    except Exception:  # noqa: BLE001
                        pass
                return result
            return scale

        try:
            from torch.amp import GradScaler
            self._patch(GradScaler, "scale", scale_patch)
        except ImportError:  # pragma: no cover
            pass

        if self.full:
            def dist_patch(original):
                @functools.wraps(original)
                def init(this, *args, **kwargs):
                    original(this, *args, **kwargs)
                    if any(isinstance(v, torch.Tensor) and v.requires_grad for v in vars(this).values()):
                        rec.recording.distributions += 1
                return init

            self._patch(torch.distributions.Distribution, "__init__", dist_patch)

        for name in LOSS_FUNCTIONS if self.full or self._fns["on_loss"] or self._fns["on_loss_args"] else ():
            if hasattr(F, name):
                self._patch(F, name, lambda original, name=name: (self._loss_wrapper if self.full else self._loss_light)(name, original))
        if self.full:
            self._mode_obj = _GraphMode(self)
            self._mode_obj.__enter__()
            self._live = True

    def _uninstall(self) -> None:
        if self._mode_obj is not None:
            _remove_mode(self._mode_obj)
            self._mode_obj, self._paused, self._popped_at, self._live = None, 0, None, False
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # noqa: BLE001 - restore the rest whatever happens
                pass
        for loader, workers in self._forced_workers:
            try:
                loader.num_workers = workers
            except Exception:  # noqa: BLE001
                pass
        self._forced_workers = []
        for info in self.recording.optimizers:  # a scaled-LR intervention is undone on the user's optimizer
            if self.lr_scale and id(info.optimizer) in self._scaled:
                for g in info.optimizer.param_groups:
                    g["lr"] = g["lr"] / self.lr_scale

    # -- helpers ----------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    @property
    def steps_taken(self) -> int:
        return self.recording.total_steps

    def _notify(self, name: str, *args) -> None:
        fns = self._fns.get(name)
        if not fns:
            return
        for fn in fns:
            try:
                fn(self, *args)
            except StopRun:
                raise
            except Exception:  # noqa: BLE001 - a listener must never break the user's run
                self.recording.listener_errors += 1

    def where(self, depth: int = 1, frame=None) -> str | None:
        """``file:line in function`` of the innermost frame in the user's files (else outside torch), from
        the frame ``depth`` calls out (1: the caller's), or from ``frame``."""
        frame = frame or sys._getframe(depth)
        fallback = None
        kinds, sites = self._file_kinds, self._sites
        get = kinds.get
        while frame is not None:
            code = frame.f_code
            known = get(code)
            if known is not None and not known[0]:   # torch's or nnwizard's own frame: the next one out
                frame = frame.f_back
                continue
            if known is None:  # 2: one of the user's files, 1: other code outside torch and nnwizard, 0: neither
                name = code.co_filename
                known = kinds[code] = (2 if self.files and str(Path(name).resolve()) in self.files else int(
                    "/torch/" not in name and "/nnwizard/" not in name and "/wizard/" not in name
                    and "/probes/" not in name and not name.startswith("<") and "runpy" not in name), Path(name).name)
            if known[0] == 2 or (fallback is None and known[0] == 1):
                key = (code, frame.f_lasti)   # a call site: its text is made once (f_lineno decodes the line table)
                text = sites.get(key)
                if text is None:
                    text = sites[key] = f"{known[1]}:{frame.f_lineno} in {code.co_name}"
                if known[0] == 2 or not self.files:   # (no user files: nothing better further out)
                    return text
                fallback = text
            frame = frame.f_back
        return fallback

    def _check_time(self) -> None:
        if self.time_limit_s is not None and self.now() > self.time_limit_s:
            self.recording.stopped = f"the time limit of {self.time_limit_s:.0f} s was reached"
            raise StopRun(self.recording.stopped)

    # -- the TorchFunctionMode's window (full mode) ------------------------------------------------
    # What the mode watches (ops on a backwarded loss, hand-written parameter updates, predictions and
    # targets taken from a model's output) happens in the user's loop between the calls below, never
    # inside them: a model's forward, a DataLoader's fetch, optimizer.step(), a loss function, backward.
    # The mode leaves the stack while one runs, so their ops cost no Python call. It only ever pops
    # itself when it is on top, and returns only onto the same stack it left (a mode the script
    # entered meanwhile keeps its place; ours then stays where it is, or out).
    def _pause(self) -> None:
        self._paused += 1
        if self._paused == 1 and self._live:
            n = _stack_len()
            if n:
                top = _stack_pop()   # (ours, nearly always: one C call fewer than looking first)
                if top is self._mode_obj:
                    self._popped_at = n - 1
                else:
                    _stack_push(top)

    def _resume(self) -> None:
        self._paused -= 1
        if self._paused == 0 and self._popped_at is not None:
            if _stack_len() == self._popped_at:
                _stack_push(self._mode_obj)
            self._popped_at = None

    def _mode_due(self, step: int) -> bool:
        """Is the graph mode on the stack during optimizer step ``step`` (counted over the run)? What it
        looks for happens at every step of a loop that has it (``total += loss``, a prediction taken from
        the output, a target derived from it): the first MODE_FIRST steps and then two consecutive ones in
        every MODE_EVERY see it; always while the batch's labels are followed or once a hand-written
        parameter update was seen (an lr intervention scales those at every step)."""
        return step <= MODE_FIRST or step % MODE_EVERY in (0, MODE_EVERY - 1) or bool(self._labels) \
            or bool(self.recording.manual_updated) or self._manual_open is not None

    def _set_live(self, live: bool) -> None:
        """Put the graph mode on the stack or take it off, only ever at the top and back onto the same
        stack length it left (as ``_pause`` / ``_resume`` do): under a mode the script entered since it
        stays where it is, on or off. Inside a paused call it is only marked; the call's ``_resume``
        puts it back (or not)."""
        if live == self._live or self._mode_obj is None:
            return
        if live:
            n = _stack_len()
            if n != self._off_at:   # a mode the script entered since sits where ours was
                return
            self._live = True
            if self._paused:
                self._popped_at = n
            else:
                _stack_push(self._mode_obj)
        elif self._paused:
            if self._popped_at is not None:   # (None: it stayed under a mode the script entered above it)
                self._live, self._off_at, self._popped_at = False, self._popped_at, None
        elif (n := _stack_len()) and _stack_at(n - 1) is self._mode_obj:
            _stack_pop()
            self._live, self._off_at = False, _stack_len()

    # -- models -----------------------------------------------------------------------------------
    def _model_index(self, module: nn.Module) -> int | None:
        key = id(module)
        known = self._module_ids.get(key)
        if known is not None and known[0]() is module:  # (an id of a module freed since may be reused)
            return known[1]
        index = None
        if isinstance(module, nn.modules.loss._Loss):
            index = None
        elif any(any(m is module for m in info.module.modules()) for info in self.recording.models):
            index = None   # a submodule of a known model, called directly
        elif not (params := list(module.parameters())) and _not_a_model(module, sys._getframe(1)):
            index = None   # a transform (Normalize, an nn.Flatten called on its own): no parameters to train
        else:
            index = len(self.recording.models)
            inner = inner_model(module)   # (a wrapper's methods are its library's: the user's class is the inner one)
            shadowed = [n for n in _NN_METHODS if n in type(inner).__dict__ and not type(inner).__module__.startswith("torch.")
                        and n not in ("__call__", "__setattr__", "__getattr__", "to", "state_dict", "load_state_dict")]
            info = ModelInfo(index, type(inner).__name__, module, _values(params),
                             _values([p for p in params if p.requires_grad]),
                             sum(1 for m in module.modules() if isinstance(m, MODE_TYPES)
                                 and not (isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0)),
                             first_step=self.steps_taken, shadowed=shadowed,
                             wrapper=type(module).__name__ if inner is not module else None)
            if self.full:
                info.reads_training = _reads_training(module)
                try:
                    info.initial = copy.deepcopy(inner)   # (a DistributedDataParallel copy needs its process group)
                except Exception:  # noqa: BLE001 - some modules cannot be copied; probes then skip
                    info.initial = None
                info.owner = _owner(module, sys._getframe(1))
            ref = self._loaded.get(key)
            if ref is not None and ref() is module:
                shapes = [tuple(p.shape) for p in params]
                info.copy_of = next((m.index for m in self.recording.models if m.name == info.name
                                     and [tuple(p.shape) for p in m.module.parameters()] == shapes), None)
            self.recording.models.append(info)
            if any(map(is_lazy, params)):   # counted again at the end, once its first forward made them
                self._lazy.append(info)
            for opt in self.recording.optimizers:
                self._link(opt)
        torch_loss = index is None and isinstance(module, nn.modules.loss._Loss) \
            and type(module).__module__.startswith("torch.")
        try:
            self._module_ids[key] = (weakref.ref(module), index, torch_loss)
        except TypeError:  # pragma: no cover - a module that cannot be weakly referenced
            self._module_ids[key] = (lambda: module, index, torch_loss)
        return index

    def _forward_pre(self, module, args):
        """Light mode's global forward pre hook (full mode: :meth:`_model_called`)."""
        self._depth += 1
        if self._depth != 1 or self._in_loss:
            return None
        found = self._forward_event(module)
        if found is None:
            return None
        self._check_forwards()
        self._notify("on_forward", found[0], args)
        return None

    def _forward_post(self, module, args, output):
        self._depth = max(self._depth - 1, 0)
        return None

    def _forward_event(self, module) -> tuple[ModelInfo, ForwardEvent] | None:
        """A top-level module call that is a model's (both modes): its forward event, counted and queued for
        the backward that reaches it; None for anything else (a loss module, a submodule called directly)."""
        index = self._model_index(module)
        if index is None:
            return None
        info = self.recording.models[index]
        info.forwards += 1
        self._last_model = info
        top = self._loader_stack[-1] if self._loader_stack else None
        event = ForwardEvent(index, module.training, torch.is_grad_enabled(), self.steps_taken,
                             loader=top.index if top else None, iteration=top.iterations - 1 if top else -1)
        self._pending_forwards.append(event)
        if len(self._pending_forwards) > 64:
            self.flush_pending(keep=32)
        return info, event

    def _check_forwards(self) -> None:
        if self.max_forwards is not None and sum(m.forwards for m in self.recording.models) > self.max_forwards:
            self.recording.stopped = f"{self.max_forwards} model forward calls were recorded"
            raise StopRun(self.recording.stopped)
        self._check_time()

    def _model_called(self, module, args) -> ForwardEvent | None:
        """Full mode, a top-level module call begins (see :meth:`_call_patch`; the mode leaves the
        stack until :meth:`_model_output`): a model's forward event, its first inputs copied, and
        whether they are finite."""
        self._depth = 1
        if self._opt_paused:  # a step that raised (no post hook ran) and was caught by the script
            self._opt_paused = self._in_opt_step = False
            self._resume()
        self._pause()
        if self._in_loss:
            return None
        if self._manual_open is not None:
            self._close_manual()
        known = self._module_ids.get(id(module))
        if known is not None and known[1] is None and known[0]() is module:
            if known[2]:   # torch's own loss module: its loss function's call site is this call's
                self._site = sys._getframe(2)   # (_model_called <- __call__ <- the caller)
            return None   # a loss module (or a submodule called directly) seen before: no forward event
        pending = self._pending_forwards
        found = self._forward_event(module)
        if found is None:
            return None
        if self._pending_forwards is not pending:   # the cap dropped the oldest pending forwards (flush_pending)
            kept = {id(e) for e in self._pending_forwards}
            for dropped in pending:
                if id(dropped) not in kept:
                    dropped.overflow = True
                    self._overflowed += 1
        info, event = found
        rec = self.recording
        event.calls_at, event.fetch = len(rec.loss_calls), self._fetches
        self._last_event = event
        if not self._live and not (event.grad_enabled and event.training):
            self._set_live(True)   # an evaluation's forward: its predictions (argmax) are watched until the next step
        rec.forwards.append(event)
        self._last_forward_at = len(rec.forwards) - 1
        if self._labels:
            self._label_check(event, args)
        if event.grad_enabled and len(rec.model_inputs) < KEEP_PAIRS:
            rec.model_inputs.append((event.model, cpu_copy(tuple(args))))
            rec.model_input_forwards.append(self._last_forward_at)
        elif not event.grad_enabled and len(rec.eval_inputs) < KEEP_PAIRS:
            rec.eval_inputs.append((event.model, fingerprint(args)))
        if len(self._inputs) < 8:   # checked for NaN/Inf at the step, when its gradient norm is measured
            self._inputs.append(args)
        self._check_forwards()
        if self._listening:
            self._notify("on_forward", info, args)
        return event

    def _model_output(self, event: ForwardEvent, output) -> None:
        """Full mode, the model's forward returned ``output``: what its loss and a later backward
        are traced back to (the first output tensor; up to 4 outputs' graph nodes)."""
        if self._label_event is event:   # a model fed with labels: its output carries them on (to a next model)
            self._label_event = None
            if self._labels:
                self._label_all(output)
        if isinstance(output, torch.Tensor):
            out, node = output, output.grad_fn
            outs = [node] if node is not None else []
        else:
            out = next(_tensors(output), None)
            if out is None:
                return
            node = out.grad_fn
            outs = [t.grad_fn for t, _ in zip(_tensors(output), range(4)) if t.grad_fn is not None]
        self._last_out = (event.model, weakref.ref(out), list(out.shape))
        pending = self._pending_forwards
        if pending and pending[-1] is event:   # every output (an RNN's hidden state too): for graphs carried across steps
            event.node, event.outs = node, outs
            if node is not None and len(pending) > 1 and event.grad_enabled:
                if not event.training:
                    self._absorb(pending, event, lambda e: not e.training)
                elif event.loader is not None:
                    self._absorb(pending, event, lambda e: e.training and e.model == event.model
                                 and e.loader == event.loader and e.fetch < event.fetch)

    # -- graphs the script lets go of (full mode) ---------------------------------------------------
    # A forward or loss call waits for the backward that reaches it by holding its graph node, and a node
    # holds its whole graph (every tensor saved for the backward). An evaluation that forgot torch.no_grad()
    # builds a graph per batch that no backward ever reaches, and the script drops each one at the next
    # batch: holding them kept a 5-layer MLP's run at 3 GB instead of 0.65 GB, and a graph-attention
    # model's ran out of memory. So a forward lets go of the graphs of the pending forwards it follows in
    # the same way: in eval mode with gradients on, any older eval-mode forward; in training mode, the same
    # model's forwards on earlier batches of the same DataLoader with no backward to reach them since. They
    # are "absorbed": should a backward reach the newer forward (losses summed over samples or batches and
    # backpropagated once), they trained with it, and so did the loss calls made between them; if none
    # does, they stay evaluation. Forwards of another model, or within one batch, are left alone (a GAN's
    # generator forward is reached after the discriminator's own backward and step).
    def _absorb(self, pending: list, newest: ForwardEvent, match: Callable) -> None:
        keep, absorbed = [], newest.absorbed
        for e in pending:
            if e is newest or e.node is None or not match(e):
                keep.append(e)
                continue
            e.node, e.outs = None, []
            if absorbed is None:
                newest.absorbed = absorbed = []
            if e.absorbed:
                absorbed += e.absorbed
                e.absorbed = None
            absorbed.append(e)
            calls = self.recording.loss_calls[e.calls_at:newest.calls_at]   # the loss calls made from it
            if calls and self._pending_losses:
                ids = set(map(id, calls))
                for c in self._pending_losses:
                    if id(c) in ids:
                        c.node = None
                        absorbed.append(c)
                self._pending_losses = [c for c in self._pending_losses if c.node is not None]
        if len(keep) != len(pending):
            self._pending_forwards = keep

    # -- labels used as a model's input (full mode, the first LABEL_FORWARDS training forwards) -------
    # A batch's labels are normally a target only. Some objectives put them into the model's input instead
    # (forward-forward overlays the label on the image and trains each layer on its own "goodness"; a
    # conditional model concatenates them): pairing the model's output with those labels as if they were its
    # target (the simplify-ladder's meter does, when no loss function is called) measures nothing. The labels
    # of each DataLoader batch are followed through the ops the graph mode sees (those outside model, loss,
    # optimizer and DataLoader calls) until the first training forwards have been checked.
    def _seed_labels(self, batch) -> None:
        if isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor) \
                and isinstance(batch[0], torch.Tensor):   # (the ladder's pair_of: inputs, labels)
            self._mark_label(batch[1])

    def _mark_label(self, t: torch.Tensor) -> None:
        labels = self._labels
        if len(labels) > 1024:
            self._labels = labels = {k: r for k, r in labels.items() if r() is not None}
        try:
            labels[id(t)] = weakref.ref(t)
        except TypeError:  # pragma: no cover - a tensor subclass that cannot be weakly referenced
            pass

    def _is_label(self, a) -> bool:
        labels = self._labels
        if isinstance(a, torch.Tensor):
            ref = labels.get(id(a))
            return ref is not None and ref() is a
        if isinstance(a, (tuple, list)):   # an index tuple (x[rows, y] = ...), a list to cat
            for b in a:
                if isinstance(b, torch.Tensor):
                    ref = labels.get(id(b))
                    if ref is not None and ref() is b:
                        return True
        return False

    def _label_all(self, out) -> None:
        if isinstance(out, torch.Tensor):
            self._mark_label(out)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._mark_label(t)

    def _label_op(self, func, args, kwargs, out) -> None:
        """An op (seen by the graph mode) that takes a tensor computed from the labels: its results are, and
        so is the tensor it changes in place (``x[rows, y] = 1``, ``x.add_(y)``, ``out=``)."""
        is_label = self._is_label
        if not (any(map(is_label, args)) or (kwargs and any(map(is_label, kwargs.values())))):
            return
        self._label_all(out)
        if args and isinstance(args[0], torch.Tensor):
            name = getattr(func, "__name__", "")
            if name.endswith("_") and not name.startswith("__") or name in _INPLACE_DUNDERS:
                self._mark_label(args[0])
        if kwargs and isinstance(kwargs.get("out"), torch.Tensor):
            self._mark_label(kwargs["out"])

    def _label_check(self, event: ForwardEvent, args) -> None:
        """A model's forward while labels are watched: is a positional argument computed from them?"""
        if event.grad_enabled:
            self._label_watch -= 1
            if any(map(self._is_label, args)):
                self._label_event = event
                if event.model not in self.recording.label_inputs:
                    self.recording.label_inputs[event.model] = self.where()
        if self._label_watch <= 0:   # checked enough training forwards: watch no more
            self._label_watch, self._labels = 0, {}

    # -- losses -----------------------------------------------------------------------------------
    def _loss_wrapper(self, name: str, original: Callable) -> Callable:
        rec = self

        @functools.wraps(original)
        def loss(*args, **kwargs):
            if rec._in_loss:
                return original(*args, **kwargs)
            rec._in_loss += 1
            if rec.full:
                rec._pause()
            try:
                try:
                    value = original(*args, **kwargs)
                except Exception:
                    rec._loss_failed(name, args, kwargs)
                    raise
                finally:
                    rec._in_loss -= 1
                try:
                    rec._loss_called(name, args, kwargs, value, original)
                except StopRun:
                    raise
                except Exception:  # noqa: BLE001 - recording must never break the loss
                    pass
            finally:
                if rec.full:
                    rec._resume()
            return value
        return loss

    def _loss_failed(self, name: str, args, kwargs) -> None:
        """A loss function raised (either mode): keep its name and target for the crash audit."""
        y = args[1] if len(args) > 1 else kwargs.get("target")
        self.recording.failed_loss = (name, cpu_copy(y) if isinstance(y, torch.Tensor) else None)

    def _loss_light(self, name: str, original: Callable) -> Callable:
        """Light mode's loss-function wrapper (full mode: :meth:`_loss_wrapper`): no loss call is kept
        (watch runs are long) and no value read (no sync); the listeners get the live tensors."""
        rec = self
        on_loss, on_args = self._fns["on_loss"], self._fns["on_loss_args"]
        # on_loss_args alone (watch): one name-only call for every call of this loss function
        named = LossCall(name, [], "", None, None, None, "mean", True, None, 0, None, True, None)
        if not on_loss:  # (watch) the same, in fewer steps: the one listener called directly
            listen = self._listener("on_loss_args")
            tensor = torch.Tensor
            w = self._fast
            cap = w.max_per_step if w is not None else 0

            @functools.wraps(original)
            def loss_args(*args, **kwargs):
                if rec._in_loss or _compiling():   # (inside a graph torch.compile traces: not recorded)
                    return original(*args, **kwargs)
                rec._in_loss = 1
                try:
                    value = original(*args, **kwargs)
                except Exception:
                    rec._loss_failed(name, args, kwargs)
                    raise
                finally:
                    rec._in_loss = 0
                if isinstance(args[0] if args else kwargs.get("input"), tensor):
                    if w is not None:  # Watch.on_loss_args, inline
                        try:
                            cur = w._current
                            losses = cur["losses"]
                            if _grad_enabled() and isinstance(value, tensor) and len(losses) < cap:
                                losses.append((name, args, kwargs, value))
                                cur["targets"].append(args[1] if len(args) > 1 else kwargs.get("target"))
                        except Exception:  # noqa: BLE001 - a listener must never break the user's run
                            rec.recording.listener_errors += 1
                    if listen is not None:
                        try:
                            listen(rec, named, args, kwargs, value)
                        except StopRun:
                            raise
                        except Exception:  # noqa: BLE001 - a listener must never break the user's run
                            rec.recording.listener_errors += 1
                return value
            return loss_args

        @functools.wraps(original)
        def loss(*args, **kwargs):
            if rec._in_loss or _compiling():
                return original(*args, **kwargs)
            rec._in_loss += 1
            try:
                value = original(*args, **kwargs)
            except Exception:
                rec._loss_failed(name, args, kwargs)
                raise
            finally:
                rec._in_loss -= 1
            x = args[0] if args else kwargs.get("input")
            if not isinstance(x, torch.Tensor):
                return value
            if on_loss:
                try:
                    call = LossCall(name, list(x.shape), str(x.dtype).replace("torch.", ""),
                                    _shape(args[1] if len(args) > 1 else kwargs.get("target")), None, None,
                                    kwargs.get("reduction", "mean"), torch.is_grad_enabled(), None, rec.steps_taken,
                                    None, True, None)
                except Exception:  # noqa: BLE001 - recording must never break the loss
                    return value
                rec._notify("on_loss", call)
            else:
                call = named
            for fn in on_args:  # (_notify, inline: this runs every step)
                try:
                    fn(rec, call, args, kwargs, value)
                except StopRun:
                    raise
                except Exception:  # noqa: BLE001 - a listener must never break the user's run
                    rec.recording.listener_errors += 1
            return value
        return loss

    def _target_reaches_input_model(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether the loss target ``y`` backpropagates into a forward of a model whose forward the input ``x`` comes
        from (a TD target computed by the network being trained, with grad on); a teacher's output (another model)
        is not."""
        pending = self._pending_forwards[-64:]
        node_model = {id(n): e.model for e in pending for n in e.outs}
        if not node_model:
            return False
        mine = {node_model[i] for i in _reached(x.grad_fn, set(node_model), limit=400)}
        outs = {i for i, m in node_model.items() if m in mine}
        return bool(outs and _reached(y.grad_fn, outs, limit=400))

    def _late_site(self, call: LossCall) -> bool:
        """Past KEEP_PAIRS: keep this call's inputs too when its site (where, and which model ran last) has fewer
        than SITE_PAIRS kept and is one of the first LATE_SITES sites seen late (marks it ``late``)."""
        kept = self._site_pairs.get((call.where, call.model))
        if kept is None and len(self._site_pairs) >= LATE_SITES or (kept or 0) >= SITE_PAIRS:
            return False
        call.late = True
        return True

    def _from_model(self, x: torch.Tensor) -> tuple[bool, list | None, Any, bool]:
        """Does the loss input ``x`` come from a model's output: (yes, that output's shape, the output's graph node
        when ``x`` is the last forward's first output or its graph reaches it, and whether ``x`` comes from the last
        forward itself rather than from an earlier one still pending)."""
        if self._last_out is None:
            return False, None, None, False
        _, ref, shape = self._last_out
        out = ref()
        if out is None:   # (the output was freed: taken to be the last one's)
            return bool(x.requires_grad), shape, None, bool(x.requires_grad)
        if x is out:
            return True, shape, out.grad_fn, True
        target = out.grad_fn
        # a view of the output (out.squeeze(1), out.view(-1, C)) comes from it whether or not a graph says so; the
        # search below still finds the output's node for it (the backward then needs none, see _linked)
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
        outs = {id(n) for e in self._pending_forwards[-64:] for n in e.outs} | self._dropped_outs.keys()
        if outs and x.grad_fn is not None and _reached(x.grad_fn, outs, limit=200):
            return True, shape, None, False
        return False, shape, None, False

    def _loss_called(self, name: str, args, kwargs, value, original=None) -> None:
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
                self._loss_value = (weakref.ref(value), v)
                if grad:
                    self._window_values.append(v)
        from_model, out_shape, direct, from_last = self._from_model(x)
        if self._in_model:  # called inside a model's forward (Hugging Face models compute their own loss); a loss
            from_model = True  # module's own call (nn.CrossEntropyLoss) is a top-level call too, but not a model's
        event = self._last_event
        if from_model and event is not None and (from_last or self._in_model):
            event.scored = True   # (the forward that made the input: not a teacher's run after its student's)
        same = False
        y_tensor = isinstance(y, torch.Tensor)
        if y_tensor:
            ref = self._derived.get(id(y))
            same = (ref is not None and ref() is y) or (
                y is not x and y.dtype == x.dtype and y.numel() > 0
                and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
        training = self._last_model.module.training if self._last_model else None
        call = LossCall(name, list(x.shape), _dtype_name(x.dtype), list(y.shape) if y_tensor else None,
                        _dtype_name(y.dtype) if y_tensor else None, v, reduction, grad, training,
                        self.recording.total_steps, self.where(3, self._site), from_model, out_shape, same)  # (3: the loss wrapper's caller)
        if self._last_model is not None:
            call.model = self._last_model.index
        if from_model and event is not None:
            call.forward = self._last_forward_at
            if y_tensor and y.grad_fn is not None and x.grad_fn is not None:   # (rare in supervised training: searched
                call.target_grad = self._target_reaches_input_model(x, y)      # only then)
        if grad and (self._kept_pairs < KEEP_PAIRS or self._late_site(call)):
            self._kept_pairs += 1
            self._site_pairs[call.where, call.model] = self._site_pairs.get((call.where, call.model), 0) + 1
            call.inputs, call.targets = cpu_copy(x), cpu_copy(y)
            call.replay = (original, tuple(args[2:]), {k: v for k, v in kwargs.items() if k not in ("input", "target")})
            if y_tensor and self._inputs:
                call.target_arg = _same_storage(y, self._inputs[-1])
        if is_tensor:
            call.node = value.grad_fn
        if not self._live:   # (a target derived from the output by ops the mode did not see looks separate)
            call.watched = False
        self.recording.loss_calls.append(call)
        if call.node is not None:
            if training is False and self._pending_losses:   # an evaluation's loss with a graph: see _absorb
                for old in self._pending_losses:
                    if old.training is False:
                        old.node = None
                self._pending_losses = [c for c in self._pending_losses if c.node is not None]
            self._pending_losses.append(call)
            # the backward on this very value reaches this call and, when x is the last output (or its
            # graph reaches it), that forward: _before_backward need not search the graph
            self._loss_link = (weakref.ref(value), call, event if event is not None and direct is not None
                               and event.node is direct else None)
        if self._listening:
            self._notify("on_loss", call)
            self._notify("on_loss_args", call, args, kwargs, value)  # watch: the live tensors (added by watch)

    def _zero_grad_light(self, original: Callable) -> Callable:
        """Light mode's ``zero_grad`` wrapper (optimizers and modules): the step record's two flags
        and the count; nothing to pause."""
        rec = self

        @functools.wraps(original)
        def zero_grad(this, *args, **kwargs):
            rec._zero_grad_since = True
            if rec._backward_since_step:
                rec._zero_after_backward = True
            rec.recording.zero_grads += 1
            return original(this, *args, **kwargs)
        return zero_grad

    # -- backward ---------------------------------------------------------------------------------
    def _backward_light(self, original: Callable) -> Callable:
        """Light mode's ``torch.autograd.backward`` wrapper (``Tensor.backward`` calls it): one frame for the
        common case, a CPU tensor, no GradScaler, no discovery and
        no budget (:meth:`_before_backward_light`'s work inline, its listener called directly); anything
        else goes through :meth:`_before_backward_light`. Before the outermost backward only."""
        rec = self
        listen = self._listener("on_backward")
        tensor = torch.Tensor
        w = self._fast
        cap = w.max_per_step if w is not None else 0
        new, blank = object.__new__, _STEP_BLANK

        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            if rec._in_backward:
                return original(tensors, *args, **kwargs)
            rec._in_backward = 1
            try:
                if rec._scales or rec._pending_forwards or rec.max_steps is not None \
                        or not isinstance(tensors, tensor) or tensors.is_cuda:
                    rec._before_backward_light(tensors)
                else:
                    step = rec._pending
                    if step is None:  # (_blank_step, inline: the step's first backward opens its record)
                        step = rec._pending = new(StepRecord)
                        step.__dict__ = d = blank.copy()
                        d["step"], d["losses"], d["lrs"], d["none_names"], d["forwards"], d["training"] = \
                            rec.recording.total_steps + 1, [], [], [], {}, {}
                    rec.recording.backwards += 1
                    rec._backward_since_step += 1
                    step.backwards += 1
                    rec._loss_t = (tensors, None, None)  # a CPU loss, no GradScaler: read as it is at the step
                    if w is not None:  # Watch.on_backward, its common case inline: the last loss call itself
                        try:
                            cur = w._current
                            backward, losses = cur["backward"], cur["losses"]
                            if losses and tensors is losses[-1][3] and len(backward) < cap:
                                backward.append({"kind": "loss-call", "loss": len(losses) - 1, "scale": 1.0})
                            else:
                                w.on_backward(rec, tensors)
                        except StopRun:
                            raise
                        except Exception:  # noqa: BLE001 - a listener must never break the user's run
                            rec.recording.listener_errors += 1
                    if listen is not None:
                        try:
                            listen(rec, tensors)
                        except StopRun:
                            raise
                        except Exception:  # noqa: BLE001 - a listener must never break the user's run
                            rec.recording.listener_errors += 1
                return original(tensors, *args, **kwargs)
            finally:
                rec._in_backward = 0
        return backward

    def _listener(self, name: str) -> Callable | None:
        """Light mode: the listeners' ``name`` methods as one callable (None: none), called per step
        without a loop (one listener, watch, is the common case); with several, each in turn, one
        that fails (not with StopRun) counted and skipped as in :meth:`_notify`. The events of
        ``_FUSED`` leave out the fused watch's own methods (``_fast``): the hooks do its work inline."""
        fns = list(self._fns.get(name) or ())
        if self._fast is not None and name in _FUSED:  # (the fused watch's work runs in the hooks themselves)
            fns = [fn for fn in fns if getattr(fn, "__self__", None) is not self._fast]
        if len(fns) < 2:
            return fns[0] if fns else None
        rec = self

        def each(*args):
            for fn in fns:
                try:
                    fn(*args)
                except StopRun:
                    raise
                except Exception:  # noqa: BLE001 - a listener must never break the user's run
                    rec.recording.listener_errors += 1
        return each

    def _before_backward_light(self, tensors) -> None:
        """Light mode, before ``backward()`` (full mode: :meth:`_before_backward`): counted, and how
        the step reads its loss (see :meth:`_loss_reading`); no graph search."""
        loss = tensors if isinstance(tensors, torch.Tensor) else next(_tensors(tensors), None)
        rec = self.recording
        rec.backwards += 1
        step = self._pending
        if step is None:
            step = self._pending = _blank_step(rec.total_steps + 1)
        self._backward_since_step += 1
        step.backwards += 1
        if loss is not None:  # (an empty one is skipped where it is read)
            scales = self._scales
            if scales or loss.is_cuda:
                scaled = scales.pop(id(loss), None) if scales else None
                self._loss_t = self._loss_reading(loss, scaled[1] if scaled is not None and scaled[0]() is loss else None)
                if len(scales) > 16:
                    self._scales = {k: v for k, v in scales.items() if v[0]() is not None}
            else:  # a CPU loss, no GradScaler: read as it is at the step
                self._loss_t = (loss, None, None)
        if self._pending_forwards:  # only while the global module hooks are on (discovery)
            for event in self._pending_forwards:
                event.node = None
                step.forwards[event.model] = step.forwards.get(event.model, 0) + 1
                step.training[event.model] = step.training.get(event.model, True) and event.training
            self._pending_forwards = []
        for fn in self._fns["on_backward"]:  # (_notify, inline: this runs every step)
            try:
                fn(self, loss)
            except StopRun:
                raise
            except Exception:  # noqa: BLE001 - a listener must never break the user's run
                rec.listener_errors += 1
        if self.max_steps is not None and not self.steps_taken and rec.backwards > self.max_steps:
            rec.stopped = f"the budget of {self.max_steps} backward passes was reached (no optimizer.step() so far)"
            raise StopRun(rec.stopped)

    def _before_backward(self, tensors) -> None:
        if self._manual_open is not None:
            self._close_manual()
        loss = tensors if isinstance(tensors, torch.Tensor) else next(_tensors(tensors), None)
        rec = self.recording
        rec.backwards += 1
        step = self._pending or self._step_record()
        if self._backward_since_step == 0 and rec.total_steps:
            self._first_backward(step, loss)
        self._backward_since_step += 1
        self._zeroed_since_backward = False
        step.backwards += 1
        if loss is not None and loss.numel():
            self._backward_loss(step, loss)
            if len(rec.steps) < SPAN_CHECKS and loss.grad_fn is not None and len(self._trained_nodes) < SPAN_NODES:
                self._trained_nodes += _step_nodes(loss.grad_fn)   # (for the next step's span check)
        link = self._linked(loss) if loss is not None else None
        if link is not None:   # the loss call's own value, its forward the only one pending: no graph search
            call, event = link
            call.eval, call.node = False, None
            if event is not None:
                self._trained(step, event)
            self._pending_forwards, self._pending_losses = [], []
        else:
            self._mark_reached(step, loss)
        self._dropped_outs = {}
        if self._loader_stack:
            self._loader_stack[-1].backwards[-1] += 1
        if self._manual_open is not None or self._manual_key != (len(rec.models), len(rec.optimizers)):
            self._refresh_manual()   # (else nothing changed since it last ran)
        if self._listening:
            self._notify("on_backward", loss)
        if self.max_steps is not None and not rec.total_steps and rec.backwards > self.max_steps:
            rec.stopped = f"the budget of {self.max_steps} backward passes was reached (no optimizer.step() so far)"
            raise StopRun(rec.stopped)

    def _first_backward(self, step: StepRecord, loss: torch.Tensor | None) -> None:
        """Full mode, the first backward after an optimizer step: the gradients still set from before
        it, and (on the first SPAN_CHECKS steps) whether this graph reaches the last step's forwards."""
        rec = self.recording
        step.carried, self._carried_by = self._carried()
        if self._prev_nodes and loss is not None and len(rec.steps) <= SPAN_CHECKS:
            if _reached(loss.grad_fn, {id(n) for n in self._prev_nodes}) and len(rec.graph_spans) < 8:
                rec.graph_spans.append(f"{self.where() or '?'} at step {len(rec.steps) + 1}")
        self._prev_nodes = []

    def _backward_loss(self, step: StepRecord, loss: torch.Tensor) -> None:
        """Full mode: the value ``backward()`` gets (unscaled by a GradScaler's scale) joins the step's
        losses; the tensor is watched by the mode afterwards (an op on it that keeps its graph)."""
        known = self._loss_value
        if known is not None and known[0]() is loss:  # backward on the loss call's own result: read once
            value = known[1]
        else:
            value = float(loss.detach().float().mean()) if loss.numel() > 1 else float(loss.detach())
        if self._scales:
            scaled = self._scales.pop(id(loss), None)
            if scaled is not None and scaled[0]() is loss and scaled[1]:
                value /= scaled[1]
            if len(self._scales) > 16:
                self._scales = {k: v for k, v in self._scales.items() if v[0]() is not None}
        step.losses.append(value)
        step.loss = value
        ref = weakref.ref(loss)
        spent = self._spent
        spent[id(loss)] = ref
        self._spent_all.append(ref)
        if len(spent) > 64:
            self._spent = {k: r for k, r in spent.items() if r() is not None}

    def _trained(self, step: StepRecord, event: ForwardEvent) -> None:
        """A backward reached this forward: it trained, and counts for the step."""
        event.trained, event.node = True, None
        if event.absorbed:
            absorbed, event.absorbed = event.absorbed, None
            for item in absorbed:   # (one level: _absorb keeps the list flat)
                if type(item) is ForwardEvent:
                    self._trained(step, item)
                else:
                    item.eval = False
        if len(self._trained_nodes) < 32:
            self._trained_nodes += event.outs
        event.outs = []
        m = event.model
        step.forwards[m] = step.forwards.get(m, 0) + 1
        step.training[m] = step.training.get(m, True) and event.training

    def _mark_reached(self, step: StepRecord, loss: torch.Tensor | None) -> None:
        """The pending forwards and loss calls the graph of ``loss`` reaches trained (all of them when
        there is no tensor to search from); the others stay pending."""
        reached = None
        if loss is not None:
            targets = {id(e.node) for e in self._pending_forwards if e.node is not None}
            targets |= {id(c.node) for c in self._pending_losses if c.node is not None}
            # the graph grows with the forwards since the last backward (an episode's loss gathers hundreds, a dozen
            # nodes each): a fixed limit stops the search above the model outputs of the latest ones
            forwards = len(self._pending_forwards) + self._overflowed + sum(len(e.absorbed) for e in self._pending_forwards
                                                                            if e.absorbed)
            reached = _reached(loss.grad_fn, targets, limit=min(max(4000, 32 * forwards), 200_000))
            self._overflowed = 0
            first = self._pending_forwards[0] if self._pending_forwards else None
            if first is not None and first.node is not None and id(first.node) in reached:
                self._overflow_reached(step, first)
        keep_f, keep_l = [], []
        for event in self._pending_forwards:
            if reached is None or id(event.node) in reached:
                self._trained(step, event)
            elif event.training or event.node is None:
                keep_f.append(event)
            else:   # eval mode, gradients on, not reached by this backward: an evaluation's graph (see _absorb)
                event.node, event.outs, event.absorbed = None, [], None
        for call in self._pending_losses:
            if reached is None or id(call.node) in reached:
                call.eval, call.node = False, None
            elif call.training is not False:
                keep_l.append(call)
            else:
                call.node = None
        self._pending_forwards, self._pending_losses = keep_f, keep_l

    def _overflow_reached(self, step: StepRecord, first: ForwardEvent) -> None:
        """The backward reached the oldest pending forward: the forwards the pending cap dropped just before it
        (no backward between) belong to the same pass (an episode of a policy called once per time step, more
        forwards than the cap), so they trained too rather than staying unreached like an evaluation."""
        forwards = self.recording.forwards
        i = len(forwards) - 1
        while i >= 0 and forwards[i] is not first:
            i -= 1
        i -= 1
        while i >= 0 and forwards[i].overflow and not forwards[i].trained:
            self._trained(step, forwards[i])
            i -= 1

    def _linked(self, loss: torch.Tensor) -> tuple[LossCall, ForwardEvent | None] | None:
        """The pending loss call and forward (None: none pending) a backward on ``loss`` reaches, known
        without a search when ``loss`` is the value of the only pending loss call, or one op away from it
        (divided by the accumulation steps, weighted, a penalty added), and the only pending forward is the
        one that call's input came from, besides forwards run without grad (an evaluation's, which no backward
        can reach: they leave the pending list); see ``_loss_link``. None when the graph must be searched."""
        link = self._loss_link
        if link is None:
            return None
        ref, call, event = link
        if ref() is loss:
            if loss.grad_fn is not call.node:   # (changed in place since the call)
                return None
        elif not _one_op_from(loss, call.node):   # (the call's own value may be gone: loss = loss_fn(...) / k)
            return None
        pending_f, pending_l = self._pending_forwards, self._pending_losses
        if len(pending_l) != 1 or pending_l[0] is not call:
            return None
        if not pending_f:
            return call, None
        if pending_f[-1] is not event or (len(pending_f) > 1 and any(
                f is not event and (f.grad_enabled or f.node is not None or f.outs) for f in pending_f)):
            return None   # (forwards run without grad, an evaluation's, can never be reached: no search for them)
        return call, event

    def _carried(self) -> tuple[float | None, dict[int, float]]:
        """Share of the optimizers' trainable tensors whose .grad is still non-zero now, at the first
        backward after a step (cleared gradients are None or all zero): over all of them (and the
        parameters a hand-written update changed), and per optimizer index (each optimizer's own
        tensors: with several optimizers, each must clear its own before its own backward). When every
        optimizer's zero_grad() ran since the last step (and no backward since), none is carried: no scan."""
        counts: dict[int, list[int]] = {}   # optimizer index (-1: hand-updated tensors) -> [non-zero, tensors]
        owned = []
        for info in self.recording.optimizers:
            n = self._trainable_n.get(id(info.optimizer)) if id(info.optimizer) in self._cleared else None
            if n is not None:   # its zero_grad() ran since the last step: nothing to scan
                if n:
                    counts[info.index] = [0, n]
                continue
            owned += [(info.index, p.grad) for g in info.optimizer.param_groups for p in g["params"] if p.requires_grad]
        updated = self.recording.manual_updated   # parameters a hand-written update changed (not merely outside every optimizer)
        if updated:
            seen = {id(p) for info in self.recording.optimizers for g in info.optimizer.param_groups for p in g["params"]}
            owned += [(-1, p.grad) for key, (p, _) in self._manual_candidates.items()
                      if key == id(p) and key in updated and key not in seen]
        if not owned:   # every optimizer cleared its own (or none has a trainable tensor)
            return (0.0, dict.fromkeys(counts, 0.0)) if counts else (None, {})
        for i, _ in owned:
            counts.setdefault(i, [0, 0])[1] += 1
        live = [(i, g) for i, g in owned if g is not None]
        if live:
            for (i, _), nonzero in zip(live, _nonzero(torch._foreach_norm([g.detach() for _, g in live]))):
                if nonzero:
                    counts[i][0] += 1
        return sum(c[0] for c in counts.values()) / sum(c[1] for c in counts.values()), \
            {i: c[0] / c[1] for i, c in counts.items()}

    def _graph_op(self, args, out: torch.Tensor) -> None:
        """An op on a loss whose backward ran made a graph-carrying tensor. It is a graph kept across
        steps when one of its other operands is such a tensor made at an earlier step (``total += loss``
        step after step), not when it is a sum for a printout within one step."""
        rec = self.recording
        now = self.steps_taken
        for a in args[:2]:
            if isinstance(a, torch.Tensor) and id(a) in self._kept:
                text, ref, made = self._kept[id(a)]
                if ref() is a and made < now and text not in rec.graph_kept and len(rec.graph_kept) < 8:
                    rec.graph_kept.append(text)
        if len(self._kept) > 64:
            self._kept = {k: v for k, v in self._kept.items() if v[1]() is not None}
        if id(out) not in self._kept or self._kept[id(out)][1]() is not out:
            self._kept[id(out)] = (f"{self.where() or '?'}", weakref.ref(out), now)

    def _confirm_kept(self, count: bool = True) -> None:
        rec = self.recording
        if self._spent_all and count:
            self._spent_all = [r for r in self._spent_all if r() is not None]
            rec.alive_losses.append(len(self._spent_all))

    # -- optimizer steps --------------------------------------------------------------------------
    def _optimizer_info(self, optimizer) -> OptimizerInfo:
        info = self._opt_ids.get(id(optimizer))
        if info is None or info.optimizer is not optimizer:
            inner = _wrapped_optimizer(optimizer)
            if inner is not None:   # a wrapper that delegates to an optimizer: that one is the optimizer
                return self._optimizer_info(inner)
            groups = []
            for g in optimizer.param_groups:
                params = [p for p in g["params"]]
                groups.append({"lr": float(g.get("lr", math.nan)) if not isinstance(g.get("lr"), torch.Tensor) else float(g["lr"]),
                               "params": params, "tensors": len(params), "values": _values(params),
                               **{k: v for k, v in g.items() if k not in ("params", "lr") and isinstance(v, (int, float, bool, str, tuple))}})
            same = self._same_family(optimizer)
            if same is not None:  # built again over the same parameters (in the loop): the same optimizer, restarted
                same.optimizer, same.groups, same.built, same.cadence = optimizer, groups, same.built + 1, _cadence(groups)
                if len(same.built_at) < 64:
                    same.built_at.append(same.steps)
                info = self._opt_ids[id(optimizer)] = same
            else:
                info = OptimizerInfo(len(self.recording.optimizers), type(optimizer).__name__, optimizer, groups,
                                     cadence=_cadence(groups))
                self._opt_ids[id(optimizer)] = info
                self.recording.optimizers.append(info)
                self._link(info)
            if self.full and self._undo:
                self._wrap_step(type(optimizer))
            if not self.full and self._undo and not info.models:  # installed: find the models it trains
                self._hook_modules()
            if self.lr_scale and id(optimizer) not in self._scaled:
                self._scaled.add(id(optimizer))
                for g in optimizer.param_groups:
                    g["lr"] = g["lr"] * self.lr_scale
                self._lr_written[id(optimizer)] = [g["lr"] for g in optimizer.param_groups]
        return info

    def _rescale_lrs(self, optimizer) -> None:
        """A scaled-LR intervention (``lr_scale``), before each step: a learning rate the script set by hand
        since the last step (``param_group['lr'] = get_lr(it)``, a warm-up or cosine schedule written in the loop)
        is scaled too, so the rerun runs the script's own schedule times the scale. A new value counts as set by
        hand when it lies nearer (in ratio) to the unscaled counterpart of the value last written than to that
        value itself: a rate derived from the current one (``g['lr'] *= 0.5``, an LRScheduler's step, both
        already scaled) is left as it is."""
        written = self._lr_written.get(id(optimizer))
        groups = optimizer.param_groups
        if written is None or len(written) != len(groups):
            self._lr_written[id(optimizer)] = [g["lr"] for g in groups]
            return
        scale = self.lr_scale
        for i, g in enumerate(groups):
            lr, last = g["lr"], written[i]
            if lr == last or isinstance(lr, torch.Tensor) or not lr:
                continue
            if not last or abs(math.log(lr / (last / scale))) < abs(math.log(lr / last)):
                g["lr"] = lr * scale
            written[i] = g["lr"]

    def _same_family(self, optimizer) -> OptimizerInfo | None:
        """An optimizer recorded before of the same class over exactly the same parameters: a new one
        replaces it (the recording keeps one object per family, so a loop that builds an optimizer per
        step does not keep every one of them, with its state, alive)."""
        name = type(optimizer).__name__
        ids = None
        for info in reversed(self.recording.optimizers):
            if info.name == name and info.optimizer is not optimizer:
                ids = ids if ids is not None else {id(p) for g in optimizer.param_groups for p in g["params"]}
                if {id(p) for g in info.groups for p in g["params"]} == ids:
                    return info
        return None

    def _wrap_step(self, cls) -> None:
        """Full mode: an optimizer class's ``step`` (torch's profiling wrapper, which runs the step hooks) is
        wrapped once so that the mode leaves the stack before that wrapper's ``record_function`` op (else
        the op passes through the mode's Python ``__torch_function__`` on entry and exit of every step);
        the step pre hook's pause stays for a class first seen at its step, and for a closure."""
        if cls in self._wrapped_steps:
            return
        self._wrapped_steps.add(cls)
        rec = self

        def make(original):
            @functools.wraps(original)   # (copies torch's `hooked` mark: the class is not wrapped again)
            def step(this, *args, **kwargs):
                if rec._opt_paused or rec._mode_obj is None:  # nested, or kept by a scheduler after the recording
                    return original(this, *args, **kwargs)
                rec._opt_paused = True
                rec._step_wraps += 1
                rec._pause()
                try:
                    return original(this, *args, **kwargs)
                finally:
                    rec._step_wraps -= 1
                    if rec._opt_paused:
                        rec._opt_paused = False
                        rec._resume()
            step.__wrapped__ = getattr(original, "__wrapped__", original)  # still the step without torch's hooks
            return step

        self._patch(cls, "step", make)

    def _link(self, info: OptimizerInfo) -> None:
        ids = {id(p) for g in info.groups for p in g["params"]}
        info.models = [m.index for m in self.recording.models if any(id(p) in ids for p in m.parameters())]
        owned = {id(p) for m in self.recording.models for p in m.parameters()}
        info.foreign = len(ids - owned)

    def _step_record(self) -> StepRecord:
        if self._pending is None:   # (without the dataclass __init__: a StepRecord is made every step)
            self._pending = _blank_step(self.recording.total_steps + 1)
        return self._pending

    def _step_pre(self, optimizer, args, kwargs):
        if self._manual_open is not None:
            self._merge_manual()
        self._in_opt_step = True   # its in-place updates are not hand-written ones
        if self.full and not self._opt_paused:
            self._opt_paused = True
            self._pause()
        closure = kwargs.get("closure") if kwargs else None
        if closure is None and len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
            closure = args[1]
        if closure is not None:
            rec = self
            state = {"first": True}

            def measured_closure(*a, **k):
                paused = rec._opt_paused
                if paused:  # the closure is the user's loop: watched
                    rec._opt_paused = False
                    rec._resume()
                try:
                    result = closure(*a, **k)
                finally:
                    if paused:
                        rec._opt_paused = True
                        rec._pause()
                if state["first"]:
                    state["first"] = False
                    rec._measure_pre(optimizer, closure=True)
                return result

            if kwargs and "closure" in kwargs:
                return args, {**kwargs, "closure": measured_closure}
            return (args[0], measured_closure, *args[2:]), kwargs
        self._measure_pre(optimizer)
        return None

    def _measure_pre(self, optimizer, closure: bool = False) -> None:
        if not self.full:
            self._measure_light(optimizer, closure=closure)
            return
        info = self._opt_ids.get(id(optimizer))
        if info is None or info.optimizer is not optimizer:
            info = self._optimizer_info(optimizer)
        step = self._pending or self._step_record()
        step.closure = closure
        step.optimizer, step.t = info.index, time.monotonic() - self._t0
        if info.index in self._carried_by:  # this optimizer's own gradients, measured at the first backward after the last step
            step.carried = self._carried_by[info.index]
        step.zero_grad = self._zero_grad_since
        step.zero_grad_after_backward = self._zero_after_backward
        step.epoch, step.batch = self._epochs, self._batch_index
        step.scheduler_steps = self._scheduler_count
        if self.lr_scale:
            self._rescale_lrs(optimizer)
        groups = optimizer.param_groups
        step.lrs = list(map(float, map(_LR, groups)))
        step.grad_enabled = torch.is_grad_enabled()
        values = self._window_values
        step.loss_calls = len(values)
        step.loss_call_mean = sum(values) / len(values) if values else None
        inputs, self._inputs = self._inputs, []
        if self._detail_due(info, step):
            self._measure_detail(optimizer, step, inputs)
        if self._listening:
            self._notify("on_step_pre", optimizer, step)

    def _detail_due(self, info: OptimizerInfo, step: StepRecord) -> bool:
        """Full mode: is this step measured in detail (see :meth:`_measure_detail`)? The optimizer's own
        steps on its ``cadence`` (counted per optimizer: a GAN's two alternate), the last 3 of the step
        budget and any step whose loss is non-finite."""
        own = info.steps + 1
        first, every = info.cadence
        return own <= first or not own % every or (self.max_steps is not None and step.step > self.max_steps - 3) \
            or (step.loss is not None and not math.isfinite(step.loss))

    def _measure_detail(self, optimizer, step: StepRecord, inputs: list[tuple]) -> None:
        """Full mode, a step :meth:`_detail_due` picks: which trainable tensors have a gradient
        (``grads_total`` / ``grads_none``, their names on the first 3 steps), the global gradient norm
        (0.0 when none has one), NaN/Inf in the forwards' inputs since the last step, and (up to step
        UPDATE_STEPS) the parameter values the step's change is measured against. The other steps keep
        the defaults (0, 0, None): the per-step signals (loss, zero_grad, carried gradients, LRs, modes)
        are recorded on every step."""
        trainable, grads = _trainable_grads(optimizer.param_groups)
        self._trainable_n[id(optimizer)] = len(trainable)
        none = list(map(type, grads)).count(_NONE)   # (list.count(None) would call Tensor.__eq__)
        if none:
            grads = [g for g in grads if g is not None]
        step.grads_total, step.grads_none = len(trainable), none
        if inputs:
            step.nonfinite_input = step.nonfinite_input or _nonfinite(inputs)
        if grads:
            total = self._before_clip(step, total_norm(torch._foreach_norm([g if not g.requires_grad else g.detach()
                                                                            for g in grads])))
            step.grad_norm = total
            step.grads_nonfinite = not math.isfinite(total)
        else:
            step.grad_norm = 0.0
        if step.step <= 3 and none:
            names = {id(p): f"{m.name}.{n}" if len(self.recording.models) > 1 else n
                     for m in self.recording.models for n, p in m.module.named_parameters()}
            step.none_names = [names.get(id(p), "?") for p in trainable if p.grad is None][:40]
        if trainable and step.step <= UPDATE_STEPS:
            views = self._views(optimizer, trainable)
            self._before_step = (trainable, views, _snapshot(views))

    def _before_clip(self, step: StepRecord, total: float) -> float:
        """The step's global gradient norm as the script's ``clip_grad_norm_`` found it before clipping, when it
        clipped since the last step (``total``, measured after the clip, is kept as ``grad_norm_clipped``: a
        clipped norm never exceeds max_norm, so neither a growth nor an explosion would show in it)."""
        clipped = self._clip_norm
        if clipped is None or clipped.numel() != 1:
            return total
        step.grad_norm_clipped = total
        return float(clipped)

    def _views(self, optimizer, trainable: list[torch.Tensor]) -> list[torch.Tensor]:
        """``_update_views`` of the optimizer's trainable parameters, made again only when a parameter
        changed (another tensor, new storage: ``p.data = ...``) or exact comparison was switched on."""
        try:
            key = ([id(p) for p in trainable], [p.data_ptr() for p in trainable], self._exact_update)
        except RuntimeError:  # tensors without storage
            return _update_views(trainable, self._exact_update)
        known = self._view_cache.get(id(optimizer))
        if known is not None and known[0] == key:
            return known[1]
        views = _update_views(trainable, self._exact_update)
        self._view_cache[id(optimizer)] = (key, views)
        return views

    def _loss_reading(self, loss: torch.Tensor, scaler) -> tuple:
        """Light mode, at ``backward()``: how ``_measure_light`` reads this loss at the step, as
        (tensor, CUDA event or None, GradScaler or None). On CPU the tensor itself, not detached (one
        ``item()`` at the step; its graph's saved values are freed by the backward). On CUDA no host
        sync: the value (unscaled on the device by the GradScaler's scale) is
        copied to a pinned host scalar with ``non_blocking=True`` and an event recorded behind the
        copy, both queued *before* the backward; the step waits on that event, i.e. for the forward
        and the loss only, while the backward and the update stay queued on the GPU."""
        if loss.is_cuda:
            try:
                loss = loss.detach()
                value = loss.float().mean() if loss.numel() > 1 else loss.float().reshape(())
                scale = getattr(scaler, "_scale", None) if scaler is not None else None
                if isinstance(scale, torch.Tensor):
                    value = value / scale.float().reshape(())
                    scaler = None
                if scaler is None:
                    if self._pinned is None:
                        self._pinned = torch.empty((), dtype=torch.float32, pin_memory=True)
                    self._pinned.copy_(value, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
                    return self._pinned, event, None
            except Exception:  # noqa: BLE001 - fall back to the plain read at the step (one sync)
                pass
        return loss, None, scaler

    def _measure_light(self, optimizer, args=(), kwargs=None, closure: bool = False) -> None:
        """Light mode's optimizer step pre hook: the loss of the last backward (one read), LRs, which
        gradients exist, and the gradient norm on the steps due (see :meth:`_norm_due`). A
        ``step(closure)`` goes to :meth:`_step_pre`, which measures after the closure's first call."""
        if not closure and (kwargs and kwargs.get("closure") is not None or len(args) > 1 and callable(args[1])):
            return self._step_pre(optimizer, args, kwargs)
        info = self._opt_ids.get(id(optimizer))
        if info is None or info.optimizer is not optimizer:
            info = self._optimizer_info(optimizer)
        step = self._pending
        if step is None:
            step = self._pending = _blank_step(self.recording.total_steps + 1)
        if closure:
            step.closure = True
        self._step_info = info   # (the post hook's, unless another optimizer steps in between)
        step.optimizer, step.t, step.zero_grad, step.zero_grad_after_backward, step.epoch, step.batch, \
            step.scheduler_steps, step.grad_enabled = info.index, _monotonic() - self._t0, self._zero_grad_since, \
            self._zero_after_backward, self._epochs, self._batch_index, self._scheduler_count, _grad_enabled()
        if self.lr_scale:
            self._rescale_lrs(optimizer)
        groups = optimizer.param_groups
        step.lrs = [float(groups[0]["lr"])] if len(groups) == 1 else list(map(float, map(_LR, groups)))
        reading = self._loss_t
        if reading is not None:
            loss, event, scaler = reading
            self._loss_t = None
            if event is None and scaler is None:  # a CPU loss (see _loss_reading)
                try:
                    value = loss.item()  # (no detach, no warning; raises unless one value)
                except RuntimeError:
                    value = float(loss.detach().float().mean()) if loss.numel() else None
                if value is not None:
                    step.loss = value
                    step.losses.append(value)
            else:
                self._read_loss(step, loss, event, scaler)
        self.grad_norms = None
        n = step.step
        if n <= NORM_FIRST or not n % self.recording.norm_interval and self._norm_due(n):
            self._grad_norm_light(step, groups)
        listen = self._pre_listener
        if listen is not None:
            try:
                listen(self, optimizer, step)
            except StopRun:
                raise
            except Exception:  # noqa: BLE001 - a listener must never break the user's run
                self.recording.listener_errors += 1
        return None

    def _read_loss(self, step: StepRecord, loss, event, scaler) -> None:
        """Light mode, at the step: the loss of a CUDA backward (the pinned copy, waiting on its event) or of a
        GradScaler's scaled one (see :meth:`_loss_reading`)."""
        if event is not None:  # CUDA: wait for the forward's loss copy only (see _loss_reading)
            event.synchronize()
            step.loss = float(loss)
        else:
            try:
                value = loss.item()  # (no detach, no warning; raises unless one value)
            except RuntimeError:
                value = float(loss.detach().float().mean()) if loss.numel() else None
            scale = scaler.get_scale() if scaler is not None and value is not None else None
            step.loss = value / scale if scale else value
        if step.loss is not None:
            step.losses.append(step.loss)

    def _grad_norm_light(self, step: StepRecord, groups: list[dict]) -> None:
        """Light mode, on the steps :meth:`_norm_due` picks: the trainable tensors' gradients counted
        (``grads_total`` / ``grads_none``; left 0 on the other steps: walking every parameter's
        ``.grad`` is a Python-level attribute read per tensor) and their global norm (0.0 when none has
        a gradient), with the per-tensor norms kept for the listeners (``grad_norms``)."""
        started = time.perf_counter()
        params, grads = _trainable_grads(groups)
        none = list(map(type, grads)).count(_NONE)
        step.grads_total, step.grads_none = len(grads), none
        if none == len(grads):
            step.grad_norm = 0.0
            return
        withgrad = [p for p, g in zip(params, grads) if g is not None] if none else list(params)
        if none:
            grads = [g for g in grads if g is not None]
        if any(map(_REQUIRES, grads)):  # (a gradient with its own graph: create_graph=True)
            grads = [g.detach() for g in grads]
        norms = torch._foreach_norm(grads)
        total = self._before_clip(step, total_norm(norms))
        step.grad_norm = total
        step.grads_nonfinite = not math.isfinite(total)
        self.grad_norms = (withgrad, norms)
        cost = time.perf_counter() - started
        self._norm_cost = cost if not self._norm_cost else 0.8 * self._norm_cost + 0.2 * cost

    def _after_step_light(self, optimizer, args=None, kwargs=None) -> None:
        """Light mode's optimizer step post hook (full mode: :meth:`_step_post`): the step's record
        joins the bounded window, its time the running step time, and the listeners are told."""
        self._in_opt_step = False
        step = self._pending
        if step is None:
            step = _blank_step(self.recording.total_steps + 1)
        else:
            self._pending = None
        info = self._step_info
        if info is None or info.optimizer is not optimizer:
            info = self._opt_ids.get(id(optimizer))
            if info is None or info.optimizer is not optimizer:
                info = self._optimizer_info(optimizer)
        info.steps += 1
        now = _monotonic() - self._t0
        d = step.duration_s = now - self._last_step_t
        rec = self.recording
        rec.steps.append(step)
        rec.total_steps = total = rec.total_steps + 1
        self._last_step_t, self._zero_grad_since, self._zero_after_backward, self._backward_since_step, \
            self.grad_norms, self._clip_norm = now, False, False, 0, None, None
        if total > 1:  # the first step's time includes the program's start; outliers (an evaluation
            # between epochs) move the estimate by at most 4x its size
            s = self._step_s
            self._step_s = 0.9 * s + 0.1 * (d if d < 4 * s else 4 * s) if s else d
        if self._module_hooks:  # discovery: light mode has pending forwards only while its global module hooks are
            self._pending_forwards, self._pending_losses = [], []   # on (_forward_pre), and no pending loss calls
            if self._discovered():
                self._unhook_modules()
        listen = self._post_listener
        if listen is not None:
            try:
                listen(self, optimizer, step)
            except StopRun:
                raise
            except Exception:  # noqa: BLE001 - a listener must never break the user's run
                rec.listener_errors += 1
        if self.max_steps is not None and total >= self.max_steps:
            rec.stopped = f"the budget of {self.max_steps} optimizer steps was reached"
            raise StopRun(rec.stopped)
        if self.time_limit_s is not None:
            self._check_time()

    def _norm_due(self, n: int) -> bool:
        """Light mode: is the gradient norm measured at step ``n``? On the first NORM_FIRST steps, then
        every ``interval`` steps: the smallest divisor of ``norm_every_max`` (watch's log interval)
        at which one reduction costs at most NORM_SHARE of a step, both as measured in this run."""
        if n <= NORM_FIRST:
            return True
        interval = self.recording.norm_interval
        if n % interval:
            return False
        if self._step_s > 0:
            need = self._norm_cost / (NORM_SHARE * self._step_s)
            top = max(int(self.norm_every_max), 1)
            self.recording.norm_interval = 1 if need <= 1 else \
                next((d for d in range(2, top + 1) if top % d == 0 and d >= need), top)
        return True

    def _step_post(self, optimizer, args, kwargs):
        self._in_opt_step = False
        try:
            self._after_step(optimizer)
        finally:
            if self._opt_paused and not self._step_wraps:   # (else the class's step wrapper resumes)
                self._opt_paused = False
                self._resume()

    def _after_step(self, optimizer) -> None:
        step = self._pending or self._step_record()
        self._pending = None
        info = self._opt_ids.get(id(optimizer))
        if info is None or info.optimizer is not optimizer:
            info = self._optimizer_info(optimizer)
        info.steps += 1
        if self._before_step is not None:
            (trainable, views, before), self._before_step = self._before_step, None
            after = self._views(optimizer, trainable)
            if after is views or (len(after) == len(views) and all(a.shape == b.shape for a, b in zip(after, views))):
                step.update, step.update_rel = _largest_change(after, before)
                if step.update == 0 and step.grad_norm and not self._exact_update \
                        and any(p.numel() > UPDATE_SAMPLE for p in trainable):
                    step.update = step.update_rel = None   # the sampled values did not move: compare every value from the next step on
                    self._exact_update = True
        now = time.monotonic() - self._t0
        step.duration_s = now - self._last_step_t
        self._last_step_t = now
        rec = self.recording
        rec.steps.append(step)
        rec.total_steps += 1
        self._zero_grad_since = self._zero_after_backward = False
        self._backward_since_step = 0
        self._clip_norm = None
        self._cleared = set()
        self._confirm_kept()
        self._window_values = []
        self._prev_nodes, self._trained_nodes = self._trained_nodes, []
        if self._mode_obj is not None:
            self._set_live(self._mode_due(rec.total_steps + 1))
        if self._listening:
            self._notify("on_step_post", optimizer, step)
        if self.max_steps is not None and rec.total_steps >= self.max_steps:
            self.recording.stopped = f"the budget of {self.max_steps} optimizer steps was reached"
            raise StopRun(self.recording.stopped)
        if self.time_limit_s is not None:
            self._check_time()

    # -- hand-written updates (full mode) ---------------------------------------------------------
    def _refresh_manual(self) -> None:
        """Trainable parameters of the recorded models and of the optimizers: an in-place op on one of
        them after a backward, outside ``optimizer.step()`` (``p -= lr * p.grad``, ``p.data.add_(...)``),
        is a hand-written update, unless an ``optimizer.step()`` follows before the next forward,
        backward or zero_grad (an edit of the parameters before the optimizer's own step is merged into that step)."""
        key = (len(self.recording.models), len(self.recording.optimizers))
        if key == self._manual_key and self._manual_open is None:
            return
        self._manual_key = key
        cand: dict[int, tuple] = {}

        def add(p, name):
            if p.requires_grad and id(p) not in cand:
                cand[id(p)] = (p, name)
                ptr = _storage_ptr(p)
                if ptr is not None:
                    cand[ptr] = cand[id(p)]
        for m in self.recording.models:
            for n, p in m.module.named_parameters():
                add(p, f"{m.name}.{n}" if len(self.recording.models) > 1 else n)
        stepped = set()   # ids of the parameters an optimizer holds
        for o in self.recording.optimizers:   # parameters of modules no hook saw (forward called directly)
            for gi, g in enumerate(o.optimizer.param_groups):
                for pi, p in enumerate(g["params"]):
                    add(p, f"{o.name}.group{gi}[{pi}]")
                    stepped.add(id(p))
        self._manual_candidates = cand
        if self.lr_scale:
            self._scale_hand_updates([p for key, (p, _) in cand.items() if key == id(p) and key not in stepped])

    def _scale_hand_updates(self, params: list) -> None:
        """A scaled-LR intervention on parameters no optimizer holds (a hand-written ``p -= lr * p.grad``):
        every gradient reaching them is scaled instead, which scales the script's own learning rate for
        plain SGD updates. Tensor hooks, removed on exit."""
        scale = self.lr_scale
        for p in params:
            if id(p) in self._grad_scaled or not p.requires_grad:
                continue
            try:
                handle = p.register_hook(lambda g, k=scale: g * k)
            except RuntimeError:  # noqa: PERF203 - a tensor that takes no hooks
                continue
            self._grad_scaled.add(id(p))
            self._undo.append(handle.remove)

    def _maybe_manual(self, name: str, first) -> None:
        if self._in_opt_step:
            return
        cand = self._manual_candidates
        tensors = first if isinstance(first, (list, tuple)) else [first]
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                return
            hit = cand.get(id(t)) if name == "__set__" or isinstance(t, nn.Parameter) else None
            if hit is None:
                hit = cand.get(_storage_ptr(t))
            if hit is None or hit[0].grad is None:
                continue
            if self._manual_open is None:
                if not self._backward_since_step:
                    continue
                self._open_manual()
            self._manual_open[2].add(id(hit[0]))

    def _open_manual(self) -> None:
        step = self._step_record()
        params = [p for key, (p, _) in self._manual_candidates.items() if key == id(p)]
        step.manual, step.optimizer, step.t = True, -1, self.now()
        step.nonfinite_input = step.nonfinite_input or _nonfinite(self._inputs)
        self._inputs = []
        step.zero_grad = self._zero_grad_since
        step.zero_grad_after_backward = self._zero_after_backward
        step.epoch, step.batch = self._epochs, self._batch_index
        step.scheduler_steps = len(self.recording.scheduler_steps)
        step.grad_enabled = torch.is_grad_enabled()
        with_grad = [p for p in params if p.grad is not None]
        step.grads_total, step.grads_none = len(params), len(params) - len(with_grad)
        norms = dict(zip(map(id, with_grad), map(float, torch._foreach_norm([p.grad.detach() for p in with_grad])))) \
            if with_grad else {}
        step.grad_norm = math.sqrt(sum(n ** 2 for n in norms.values()))
        step.grads_nonfinite = not math.isfinite(step.grad_norm)
        values = self._window_values
        step.loss_calls, step.loss_call_mean = len(values), (sum(values) / len(values) if values else None)
        if step.step <= 3 and step.grads_none:
            names = {id(p): n for key, (p, n) in self._manual_candidates.items() if key == id(p)}
            step.none_names = [names[id(p)] for p in params if p.grad is None][:40]
        copies = [(p, p.detach().clone(), norms.get(id(p), 0.0)) for p in params] if step.step <= UPDATE_STEPS else []
        self._manual_open = (step, copies, set())

    def _merge_manual(self) -> None:
        """optimizer.step() follows in-place edits of parameters after a backward: one step, the
        optimizer's (the parameters changed by hand count as updated, see trace-optimizer)."""
        step, _, updated = self._manual_open
        self._manual_open = None
        step.manual, step.none_names, step.optimizer = False, [], -1
        self.recording.manual_updated |= updated

    def _close_manual(self, budget: bool = True) -> None:
        step, copies, updated = self._manual_open
        self._manual_open = None
        self._pending = None
        step.updated = len(updated)
        self.recording.manual_updated |= updated
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
        now = self.now()
        step.duration_s, self._last_step_t = now - self._last_step_t, now
        self.recording.steps.append(step)
        self.recording.total_steps += 1
        self._confirm_kept()
        self._prev_nodes, self._trained_nodes = self._trained_nodes, []
        self._zero_grad_since, self._window_values, self._backward_since_step = False, [], 0
        self._zero_after_backward = False
        self._manual_key = None  # `.data = ...` gave parameters new storage
        self._refresh_manual()
        if budget and self._listening:   # (no optimizer: the listeners' step budgets and caps count it all the same)
            self._notify("on_step_post", None, step)
        if budget and self.max_steps is not None and self.recording.total_steps >= self.max_steps:
            self.recording.stopped = f"the budget of {self.max_steps} steps (hand-written updates) was reached"
            raise StopRun(self.recording.stopped)
        if budget:
            self._check_time()

    # -- schedulers -------------------------------------------------------------------------------
    def _scheduler_seen(self, scheduler) -> dict:
        for s in self.recording.schedulers:
            if s["object"] is scheduler:
                return s
        opt = getattr(scheduler, "optimizer", None)
        entry = {"name": type(scheduler).__name__, "index": len(self.recording.schedulers), "object": scheduler,
                 "optimizer": self._optimizer_info(opt).index if opt is not None else None, "steps": 0}
        self.recording.schedulers.append(entry)
        return entry

    def _scheduler_stepped(self, scheduler) -> None:
        entry = self._scheduler_seen(scheduler)
        entry["steps"] += 1
        if self.full and "where" not in entry:
            entry["where"] = self.where()   # the line that steps it (a fix names it)
        opt = getattr(scheduler, "optimizer", None)
        if self.lr_scale and opt is not None and id(opt) in self._lr_written:  # (its rates derive from scaled ones)
            self._lr_written[id(opt)] = [g["lr"] for g in opt.param_groups]
        lr = float(opt.param_groups[0]["lr"]) if opt is not None and opt.param_groups else None
        event = SchedulerEvent(entry["name"], entry["index"], self.steps_taken, self._epochs, lr)
        self.recording.scheduler_steps.append(event)
        self._scheduler_count += 1
        self._notify("on_scheduler", event)

    # -- data loaders -----------------------------------------------------------------------------
    def _loader_info(self, loader: DataLoader) -> LoaderInfo:
        for info in self.recording.loaders:
            if info.loader is loader:
                return info
        try:
            dataset_len = len(loader.dataset)
        except Exception:  # noqa: BLE001 - iterable datasets have no length
            dataset_len = None
        try:
            length = len(loader)
        except Exception:  # noqa: BLE001
            length = None
        sampler = getattr(loader, "sampler", None)
        info = LoaderInfo(len(self.recording.loaders), loader, dataset_len, getattr(loader, "batch_size", None),
                          isinstance(sampler, torch.utils.data.RandomSampler), bool(getattr(loader, "drop_last", False)), length)
        self.recording.loaders.append(info)
        return info

    def flush_pending(self, keep: int = 0) -> None:
        """Forwards and loss calls no backward reached by now stay evaluation (too many are pending):
        drop their graph nodes. A GAN's generator forward is reached by a
        backward after the discriminator's step, so pending items survive optimizer steps."""
        for items in (self._pending_forwards, self._pending_losses):
            for item in items[: max(len(items) - keep, 0)]:
                item.node = None
                if isinstance(item, ForwardEvent):
                    if item.outs and len(self._dropped_outs) < DROPPED_OUTS:   # (an episode's outputs, saved for its loss)
                        self._dropped_outs.update((id(n), n) for n in item.outs)
                    item.outs = []
        self._pending_forwards = self._pending_forwards[len(self._pending_forwards) - keep:] if keep else []
        self._pending_losses = self._pending_losses[len(self._pending_losses) - keep:] if keep else []

    def finish(self) -> Recording:
        """Close what is still open (called on exit): pending forwards with no backward are evaluation."""
        rec = self.recording
        for info in self._lazy:
            params = list(info.module.parameters())
            info.params, info.trainable = _values(params), _values([p for p in params if p.requires_grad])
        if self._manual_open is not None:
            self._close_manual(budget=False)
        self._manual_candidates = {}
        rec.seconds = round(self.now(), 3)
        rec.pass_cap = self.limit_batches
        self._confirm_kept(count=False)
        self._spent_all = []
        self._spent = {}
        for item in self._pending_forwards + self._pending_losses:
            item.node = None
        for event in self._pending_forwards:
            event.outs = []
        self._trained_nodes, self._prev_nodes = [], []
        self._pending_forwards, self._pending_losses = [], []
        self._inputs = []
        return rec

    def record_error(self, exc: BaseException) -> RecordedError:
        frames = traceback.extract_tb(exc.__traceback__)
        where = None
        for frame in reversed(frames):
            if str(Path(frame.filename).resolve()) in self.files:
                where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
                break
        if where is None:
            for frame in reversed(frames):
                resolved = str(Path(frame.filename).resolve())
                if any(resolved.startswith(f) for f in self.folders):
                    where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
                    break
        text = plain_text(str(exc)).strip().splitlines()
        err = RecordedError(type(exc).__name__, text[0][:400] if text else "", where,
                            "".join(traceback.format_exception(exc)[-8:]), self.steps_taken, exc)
        self.recording.error = err
        return err


def _one_op_from(loss: torch.Tensor, node) -> bool:
    """``loss`` is one op away from the graph node ``node`` (``loss_fn(...) / accumulation_steps``, ``loss * w``,
    ``loss + penalty``): its own node takes ``node``'s output as an input."""
    fn = loss.grad_fn
    return fn is not None and node is not None and any(n is node for n, _ in fn.next_functions)


def _owner(module: nn.Module, frame, depth: int = 12) -> nn.Module | None:
    """The module whose own method called ``module`` at the top level (``layer.forward(x)`` called
    directly, so that only the layers inside it pass through ``__call__``): the nearest caller frame
    whose ``self`` is another nn.Module that contains ``module``; None when that frame's ``self`` is
    no module or does not contain it."""
    while frame is not None and depth:
        depth -= 1
        this = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(this, nn.Module) and this is not module:
            return this if any(m is module for m in this.modules()) else None
        frame = frame.f_back
    return None


_LIBRARIES = ("torch", "torchvision", "torchaudio", "torchtext")


def _library_class(cls: type) -> bool:
    """A class of torch's or of an installed package, not the user's own."""
    name = getattr(cls, "__module__", None) or ""
    if name.split(".")[0] in _LIBRARIES:
        return True
    path = getattr(sys.modules.get(name), "__file__", None) or ""
    return "site-packages" in path or "dist-packages" in path


def _fetching(frame, depth: int = 40) -> bool:
    """Is a DataLoader fetching a batch further out (a transform in the dataset's ``__getitem__``)?"""
    codes = _FETCH_CODES
    while frame is not None and depth:
        if frame.f_code in codes:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _not_a_model(module: nn.Module, frame) -> bool:
    """A module without parameters (a lazy module's are UninitializedParameter: it has some) called at the top
    level is no model when it is a library's (torchvision's Normalize, an nn.Flatten) or runs while a DataLoader
    fetches a batch, unless it is called directly by another module's method (forward-forward's ReLU, in a
    ``Layer.forward`` called directly: that layer's model). A parameterless module of the user's own class
    called by the training loop stays a model: a model whose layers were never registered (no-parameters)."""
    owner = _owner(module, frame)
    if owner is not None and next(owner.parameters(), None) is not None:
        return False
    return _library_class(type(module)) or _fetching(frame)


_TRAINING_READ = re.compile(r"\bself\.training\b")


def _forward_reads_training(cls: type) -> bool:
    """Does this (user-defined) module class's forward branch on ``self.training`` (a functional dropout
    with ``training=self.training``, noise added only while training)? Read from its source."""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return code is not None and _code_reads_training(code)


@functools.lru_cache(maxsize=256)
def _code_reads_training(code) -> bool:
    """(Cached by the forward's code object, not its class: a class holds its script's globals, and each rerun of a
    script defines its classes anew, so a cache of classes would keep every rerun's data alive.)"""
    try:
        return bool(_TRAINING_READ.search(inspect.getsource(code)))
    except (OSError, TypeError):
        return False


def _reads_training(module: nn.Module) -> list[str]:
    """The user's module classes in ``module`` whose forward reads self.training: where train/eval mode
    matters although no Dropout or BatchNorm module is there (pytorch/examples' GAT)."""
    found = []
    for m in module.modules():
        cls = type(m)
        if not cls.__module__.startswith("torch.") and _forward_reads_training(cls) and f"{cls.__name__}.forward" not in found:
            found.append(f"{cls.__name__}.forward")
    return found[:4]


def _step_nodes(root, limit: int = SPAN_NODES) -> list:
    """The autograd nodes of one step's graph below ``root``, its parameters' AccumulateGrad nodes left
    out (every step's graph shares those): a later step's graph that reaches one of them runs through
    this step's graph (a hidden state or cached output carried over without detach())."""
    nodes, queue, seen = [], collections.deque([root]), {}
    while queue and len(seen) < limit:
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node   # (held: see _reached)
        if type(node).__name__ != "AccumulateGrad":
            nodes.append(node)
        queue.extend(fn for fn, _ in node.next_functions)
    return nodes


def _reached(root, targets: set[int], limit: int = 4000) -> set[int]:
    """Which of the autograd nodes (by id) in ``targets`` the graph below ``root`` reaches. The
    targets' nodes must be held by the caller, and the walk holds every node it visited: a grad_fn's
    Python object may live only while referenced (torch 2.11 frees it and makes a new one on the next
    access), so the id of a dropped one can come back as another node's and that node seem seen."""
    found: set[int] = set()
    if root is None or not targets:
        return found
    queue, seen = collections.deque([root]), {}
    while queue and len(seen) < limit and len(found) < len(targets):
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        if id(node) in targets:
            found.add(id(node))
        queue.extend(fn for fn, _ in node.next_functions)
    return found


class _LoaderIter:
    """Wraps a DataLoader iterator: counts batches, caps them per epoch, may replace each batch."""

    def __init__(self, rec: Recorder, loader: DataLoader, inner):
        self.rec, self.inner = rec, inner
        self.info = rec._loader_info(loader)
        self.info.iterations += 1
        self.info.batches.append(0)
        self.info.backwards.append(0)
        self.count = 0
        self.done = False
        # its epoch: 1 + the earlier passes over this loader that trained (an evaluation pass over it does not count)
        self.epoch = 1 + sum(1 for b in self.info.backwards[:-1] if b > 0)
        rec._loader_stack.append(self.info)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _close(self) -> None:
        if not self.done:
            self.done = True
            stack = self.rec._loader_stack
            if self.info in stack:
                stack.remove(self.info)

    def __next__(self):
        rec = self.rec
        if not rec.full:
            return self._next()
        rec._pause()
        try:
            return self._next()
        finally:
            rec._resume()

    def _capped(self) -> bool:
        """Does the batch cap end this pass? A training pass, always; an evaluation pass (no backward so
        far) unless the recorder's ``cap_evaluation`` is off (a rerun after a crash that may be the cap's)."""
        rec = self.rec
        if self.info.backwards[-1]:
            return True
        rec.evaluation_capped = rec.evaluation_capped or rec.cap_evaluation
        return rec.cap_evaluation

    def _next(self):
        rec = self.rec
        if rec.limit_batches is not None and self.count >= rec.limit_batches and self._capped():
            if self.info.backwards[-1] and not self.done:
                rec.recording.capped_training += 1
            self._close()
            raise StopIteration
        try:
            batch = next(self.inner)
        except StopIteration:
            self._close()
            raise
        rec._fetches += 1
        stack = rec._loader_stack
        if self.done:  # the epoch re-entered after a cap: count it again
            self.done = False
            stack.append(self.info)
        elif not stack or stack[-1] is not self.info:
            # the loader that last served a batch is the one under way: another's pass left unfinished (Lightning's
            # sanity check takes 2 validation batches, a loop that breaks early) must not take this one's forwards
            # and backwards
            if self.info in stack:
                stack.remove(self.info)
            stack.append(self.info)
        if rec._manual_open is not None:
            rec._close_manual()
        if rec.replace_batch is not None:
            batch = rec.replace_batch(batch, self.count)
        rec._epochs, rec._batch_index = self.epoch, self.count
        self.count += 1
        self.info.batches[-1] = self.count
        if rec.full and len(rec.recording.batches) < KEEP:
            rec.recording.batches.append(cpu_copy(batch))
        if rec._label_watch:
            rec._seed_labels(batch)
        if rec._listening:
            rec._notify("on_batch", batch, self.count - 1)
        rec._check_time()
        return batch


# frames of a DataLoader fetching a batch (_fetching)
_FETCH_CODES = frozenset({_LoaderIter._next.__code__, _LoaderIter.__next__.__code__,
                          torch.utils.data.dataloader._BaseDataLoaderIter.__next__.__code__})
