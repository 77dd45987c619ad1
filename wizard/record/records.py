"""What a recording holds: one dataclass per kind of thing the recorder saw in the user's program (a model,
an optimizer, an optimizer step, a loss-function call, a forward, a scheduler step, a DataLoader, a
gradient-clipping call, the error that ended the run) and :class:`Recording`, the whole run. Plain data:
probes and reports read it; only the recorder (``nnwizard.record``) writes it."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

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


STEP_BLANK = {"step": 0, "optimizer": -1, "t": 0.0, **_STEP_DEFAULTS}
# the fields with a default_factory, each a fresh empty list or dict per record (blank_step makes them literally)
_STEP_LISTS, _STEP_DICTS = ("losses", "lrs", "none_names"), ("forwards", "training")
assert dict(_STEP_FRESH) == {**dict.fromkeys(_STEP_LISTS, list), **dict.fromkeys(_STEP_DICTS, dict)}


def wrapped_optimizer(optimizer) -> torch.optim.Optimizer | None:
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


def blank_step(n: int) -> StepRecord:
    """``StepRecord(step=n, optimizer=-1, t=0.0)`` without the dataclass ``__init__``'s 30 assignments
    (light mode makes one every step): a copy of the defaults (one C copy of a dict, not a merge item by
    item) and the fields' own fresh lists and dicts (``_STEP_LISTS``, ``_STEP_DICTS``)."""
    step = object.__new__(StepRecord)
    step.__dict__ = d = STEP_BLANK.copy()
    d["step"], d["losses"], d["lrs"], d["none_names"], d["forwards"], d["training"] = n, [], [], [], {}, {}
    return step


@dataclass(kw_only=True)
class LossCall:
    """A call of a ``torch.nn.functional`` loss (the ``nn.*Loss`` modules call these too), built by keyword."""
    fn: str
    input_shape: list = field(default_factory=list)
    input_dtype: str = ""
    target_shape: list | None = None
    target_dtype: str | None = None
    value: float | None = None
    reduction: str = "mean"
    grad_enabled: bool = True
    training: bool | None = None  # the last model's mode
    step: int = 0                 # optimizer steps before this call
    where: str | None = None
    from_model: bool = False      # the input's graph reaches a model output (or it is one)
    model_output_shape: list | None = None
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
class SeedCall:
    """A ``torch.manual_seed`` call the program made from its own code (full mode)."""
    seed: int | None
    where: str | None
    step: int                    # optimizer steps before it


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
    seeds: list[SeedCall] = field(default_factory=list)  # torch.manual_seed calls from the program (the first SEEDS_KEPT)
    seconds: float = 0.0
    mode: str = "full"
    total_steps: int = 0         # optimizer steps so far (light mode keeps only the last LIGHT_KEEP records)
    norm_interval: int = 1       # light mode: steps between gradient-norm measurements (last value chosen)
    # full mode: model index -> where it was first called, in grad mode, with a positional argument computed from
    # the labels of a DataLoader batch (its second tensor of two): labels used as the model's input (forward-forward
    # overlays them on the image), not only as a target. Watched over the first LABEL_FORWARDS training forwards.
    label_inputs: dict[int, str | None] = field(default_factory=dict)
    child_processes: int = 0     # processes the program started (full mode: it is recorded in this process only)
    # what the probes' run listeners measured on this run, by listener name (probes/api.py: run_listener)
    listened: dict[str, Any] = field(default_factory=dict)

    @property
    def loss_curve(self) -> list[float]:
        return [s.loss for s in self.steps if s.loss is not None]

    def model_of(self, module: nn.Module) -> ModelInfo | None:
        return next((m for m in self.models if m.module is module), None)

