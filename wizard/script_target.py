"""What a Target answers, from a recorded run of the user's script (CONTRACT §6).

``ScriptTarget`` is a :class:`~nnwizard.target.Target` built from a :class:`~nnwizard.script_run.RunResult`:

- ``fresh_model()``: a deep copy of the trained model taken before its first forward (its initial state);
- ``batches(n)`` / ``batch()``: the real pairs the script fed its model and its loss, in order: the
  model's inputs as the model received them, the targets as the loss received them;
- ``loss_fn(outputs, targets)``: the user's loss function called as the script called it, after the
  same reshape/cast the script applied between the model's output and the loss;
- ``make_optimizer(model)``: the script's optimizer class and param groups rebuilt over ``model``;
- ``measured_step_s``: the median wall time of one optimizer step in the real run;
- ``recording`` / ``run``: the trace itself, for the loop audits (probes/trace.py);
- ``rerun(...)``: the script run again under an intervention (the same first batch every step, a
  scaled learning rate, a fixed seed), returning another RunResult.

When the script gives no capturable model (none built, several trained together, a forward taking
more than one tensor), ``capture_problem`` says why and the model-level probes are skipped with it.
"""

from __future__ import annotations

import collections
import copy
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nnwizard.record import LossCall, ModelInfo, Recording
from nnwizard.script_run import DEFAULT_LIMIT_BATCHES, RunOptions, RunResult, Script, run_script
from nnwizard.target import LossNotReplayable, Target

# the reruns the default budget is sized for, in optimizer steps: script-overfit (40), script-lr-sweep's x0.1, x10
# and x100 (30 each, the x100 one when neither of the others moves the loss) and its one long arm (the observed run's
# default 60 steps: lr*100 when nothing moved, lr/10 when the configured rate's early overshoot may be all it saw)
BUDGET_RERUNS = (40, 30, 30, 30, 60)
CLASSIFICATION_FNS = ("cross_entropy", "nll_loss", "multi_margin_loss")
BINARY_FNS = ("binary_cross_entropy", "binary_cross_entropy_with_logits", "soft_margin_loss")


class NotCapturable(Exception):
    """The recording holds no model/batch/loss that model-level probes could use."""


def step_time(rec: Recording) -> float | None:
    """The median wall time of one optimizer step in a recorded run (the first left out: it pays for one-off work)."""
    times = [s.duration_s for s in list(rec.steps)[1:] if s.duration_s > 0]
    return statistics.median(times) if times else None


def main_model(rec: Recording) -> ModelInfo | None:
    """The model the training loop trained: most forward calls reached by a backward, trainable first."""
    trained: dict[int, int] = {}
    for step in rec.steps:
        for index, n in step.forwards.items():
            trained[index] = trained.get(index, 0) + n
    if not rec.models:
        return None
    return max(rec.models, key=lambda m: (trained.get(m.index, 0), m.trainable, m.forwards))


def training_models(rec: Recording) -> list[ModelInfo]:
    used = {i for s in rec.steps for i in s.forwards}
    return [m for m in rec.models if m.index in used]


def first_training_call(rec: Recording) -> LossCall | None:
    return next((c for c in rec.loss_calls if c.inputs is not None and not c.eval and not c.late), None) or \
        next((c for c in rec.loss_calls if c.inputs is not None and not c.late), None)


class ScriptLoss:
    """The user's loss as the script called it: the same function and options, after the same
    reshape and cast between the model's output and the loss input."""

    def __init__(self, call: LossCall, output_shape: list | None):
        self.call = call
        self.fn, self.extra, self.kwargs = call.replay
        self.name = call.fn
        self.input_shape, self.output_shape = call.input_shape, output_shape
        self.dtype = getattr(torch, call.input_dtype, None)
        self.reduction = call.reduction
        self.__name__ = call.fn
        # a loss input with other values than the output had (``q.gather(1, actions)``, ``out[mask]``, ``out[:, -1]``)
        # is a selection no reshape reproduces: replaying it would score the wrong values or raise
        self.not_replayable = None
        if output_shape is not None and math.prod(output_shape) != math.prod(call.input_shape):
            self.not_replayable = (f"{call.fn}'s input {list(call.input_shape)} has {math.prod(call.input_shape):,} values "
                                   f"and the model's output {list(output_shape)} {math.prod(output_shape):,}: a selection "
                                   f"(gather, indexing) or scores computed from the output, which no reshape reproduces")

    def adapt(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.not_replayable:
            raise LossNotReplayable(self.not_replayable)
        if not isinstance(outputs, torch.Tensor):
            outputs = next((o for o in outputs if isinstance(o, torch.Tensor)), outputs) if isinstance(outputs, (tuple, list)) else outputs
        shape = self.input_shape
        if self.output_shape is not None and list(self.output_shape) != list(shape) and isinstance(outputs, torch.Tensor):
            tail = shape[1:]
            per = 1
            for d in tail:
                per *= d
            if per and outputs.numel() % per == 0:
                outputs = outputs.reshape(-1, *tail) if tail else outputs.reshape(-1)
        if self.dtype is not None and isinstance(outputs, torch.Tensor) and outputs.dtype != self.dtype \
                and outputs.is_floating_point() and self.dtype.is_floating_point:
            outputs = outputs.to(self.dtype)
        return outputs

    def __call__(self, outputs, targets):
        return self.fn(self.adapt(outputs), targets, *self.extra, **self.kwargs)

    def __repr__(self) -> str:
        return f"{self.name}(reduction={self.reduction!r})"


def _task(call: LossCall | None) -> str:
    if call is None:
        return "regression"
    if call.fn in CLASSIFICATION_FNS:
        return "classification"
    if call.fn in BINARY_FNS:
        return "binary"
    return "regression"


def _paired(rec: Recording, info: ModelInfo, calls: list[LossCall]) -> list[tuple]:
    """(model input args, loss target) of the kept training calls: each call with the input of the forward whose
    output it scored, once a forward (mixup's two calls on one output: the first; an evaluation run with grad on
    between them: no call of its own). Calls recorded without their forward are zipped in order as before."""
    inputs = [(at, args) for (index, args), at in zip(rec.model_inputs, rec.model_input_forwards) if index == info.index]
    if len(rec.model_input_forwards) != len(rec.model_inputs) or any(c.forward is None for c in calls):
        return list(zip((args for _, args in inputs), (c.targets for c in calls)))
    by_forward = dict(inputs)
    pairs, used = [], set()
    for c in calls:
        if c.forward in by_forward and c.forward not in used:
            used.add(c.forward)
            pairs.append((by_forward[c.forward], c.targets))
    return pairs


class ScriptTarget(Target):
    """See the module docstring."""

    mode = "script"

    def __init__(self, run: RunResult, device: torch.device | None = None):
        self.run = run
        self.recording = run.recording
        self.script: Script = run.script
        self.capture_problem: str | None = None
        self.reruns: list[Rerun] = []   # the interventions run so far (shown in the report)
        rec = run.recording
        info = main_model(rec)
        self.model_info = info
        call = first_training_call(rec)
        self.loss_call = call
        pairs = self._pairs(info, call)
        self.pairs = pairs
        loss_fn = ScriptLoss(call, call.model_output_shape) if call is not None and call.replay else _NoLoss()
        params = next(iter(info.module.parameters()), None) if info else None
        resolved = device or (params.device if params is not None else torch.device("cpu"))
        train_loader = self._loader(pairs)
        task = _task(call)
        num_classes = None
        if task == "classification" and call is not None and len(call.input_shape) >= 2:
            num_classes = int(call.input_shape[1])
        super().__init__(spec=str(self.script.spec), namespace=SimpleNamespace(), source=self.script.path,
                         device=resolved, train_loader=train_loader, val_loader=None, loss_fn=loss_fn, task=task,
                         num_classes=num_classes,
                         task_source=f"from {call.fn}, the loss the script called" if call is not None else
                         "no training loss call was recorded: not known, regression assumed")

    # -- capture ----------------------------------------------------------------------------------
    def _pairs(self, info: ModelInfo | None, call: LossCall | None) -> list[tuple]:
        rec = self.recording
        if info is None:
            self.capture_problem = "the script never called a model (no nn.Module forward was recorded)"
            return []
        if len(training_models(rec)) > 1:
            names = ", ".join(m.name for m in training_models(rec))
            self.capture_problem = f"the script trains several models together ({names}); model-level probes need one"
            return []
        if info.initial is None:
            self.capture_problem = f"{info.name} could not be copied at its initial state"
            return []
        if call is None or call.replay is None:
            self.capture_problem = "no training loss call through torch.nn.functional / nn.*Loss was recorded"
            return []
        inputs = [args for index, args in rec.model_inputs if index == info.index]
        calls = [c for c in rec.loss_calls if c.inputs is not None and not c.eval and not c.late] or \
            [c for c in rec.loss_calls if c.inputs is not None and not c.late]
        if not inputs or any(len(a) != 1 or not isinstance(a[0], torch.Tensor) for a in inputs):
            self.capture_problem = f"{info.name}.forward takes more than one tensor (or none); model-level probes need one input"
            return []
        pairs = [(a[0], t) for a, t in _paired(rec, info, calls) if isinstance(t, torch.Tensor)]
        if not pairs:
            self.capture_problem = "the loss received no target tensor"
        return pairs

    @staticmethod
    def _loader(pairs: list[tuple]) -> DataLoader:
        if pairs:   # (a 0-d tensor, a scalar target or input, has no batch dimension: kept as a pair)
            size = len(pairs[0][0]) if pairs[0][0].dim() else 0
            shapes_x = {tuple(x.shape[1:]) for x, _ in pairs}
            shapes_y = {tuple(y.shape[1:]) for _, y in pairs}
            same = len(shapes_x) == 1 and len(shapes_y) == 1 and all(x.dim() and y.dim() and len(x) == len(y) for x, y in pairs)
            if same and size > 0:
                xs = torch.cat([x for x, _ in pairs])
                ys = torch.cat([y for _, y in pairs])
                return DataLoader(TensorDataset(xs, ys), batch_size=size, shuffle=False)
        return DataLoader(_PairList(pairs), batch_size=None, shuffle=False)

    @property
    def capturable(self) -> bool:
        return self.capture_problem is None and bool(self.pairs)

    def require_capture(self) -> None:
        if not self.capturable:
            raise NotCapturable(self.capture_problem or "nothing was captured")

    # -- what a Target answers --------------------------------------------------------------------
    def fresh_model(self, seed: int | None = None) -> nn.Module:
        self.require_capture()
        if seed is not None:
            torch.manual_seed(seed)
        return copy.deepcopy(self.model_info.initial).to(self.device)   # (the model a wrapper runs: inner_model)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        rec = self.recording
        info = self.model_info
        opt = next((o for o in rec.optimizers if info is not None and info.index in o.models), None)
        if opt is None or info is None:
            return torch.optim.Adam(model.parameters(), lr=1e-3)
        position = {id(p): i for i, p in enumerate(info.module.parameters())}
        new = list(model.parameters())
        lrs = rec.steps[0].lrs if rec.steps and rec.steps[0].optimizer == opt.index else []
        groups = []
        for gi, (g, original) in enumerate(zip(opt.groups, opt.optimizer.param_groups)):
            params = [new[position[id(p)]] for p in g["params"] if id(p) in position and position[id(p)] < len(new)]
            if not params:
                continue
            group = {k: copy.deepcopy(v) for k, v in original.items() if k not in ("params", "initial_lr")}
            group["lr"] = lrs[gi] if gi < len(lrs) else g["lr"]
            groups.append({"params": params, **group})
        try:
            return type(opt.optimizer)(groups)
        except Exception:  # noqa: BLE001 - an optimizer we cannot rebuild: its class with its first lr
            return type(opt.optimizer)(model.parameters(), lr=groups[0]["lr"] if groups else 1e-3)

    def make_scheduler(self, optimizer):
        return None

    def batches(self, n: int, split: str = "train") -> list:
        from nnwizard.target import cut, to_device

        if split != "train" or not self.capturable:
            return []
        pairs = self.pairs
        out = [pairs[i % len(pairs)] for i in range(n)]
        return [to_device(cut(b, self.sample_limit), self.device) for b in out]

    @property
    def untrained(self) -> bool:
        """No torch.optim step was taken (the loop audits had nothing to read), or every step found no
        gradient (nothing trained): never healthy."""
        from nnwizard.probes._recording import gradless

        return not self.recording.steps or gradless(self.recording)

    @property
    def crashed(self) -> bool:
        """The script raised: never healthy (CONTRACT §4)."""
        return self.recording.error is not None

    @property
    def measured_step_s(self) -> float | None:
        return step_time(self.recording)

    # -- interventions ----------------------------------------------------------------------------
    def rerun(self, *, same_batch: bool = False, lr_scale: float | None = None, seed: int | None = 0,
              max_steps: int | None = None, time_limit_s: float | None = None, listeners: list | None = None,
              limit_batches: int | None | str = "observed", replace_batch: Any = None,
              patches: list | None = None, what: str | None = None) -> RunResult:
        """The script again, sandboxed, under an intervention: ``same_batch`` (every DataLoader batch is
        the first one), ``lr_scale`` (every optimizer's learning rates times this), ``seed`` (None: the
        script's own seeding only), ``listeners`` (recorder listeners, e.g. an op tracer),
        ``replace_batch`` (the recorder's ``replace_batch(batch, index)``), ``patches`` (context managers
        that replace one piece of the program while it runs, see wizard/script_replace.py) and ``what``
        (the intervention in words, for the report). Its DataLoader passes take at most ``limit_batches``
        batches, by default as many as the observed run's could when it ended (lengthened for a fast script,
        one long pass for a script of one epoch), so that a rerun as long as the observed run has its passes."""
        replace = replace_batch or (_SameBatch() if same_batch else None)
        if limit_batches == "observed":
            limit_batches = self.recording.pass_cap or DEFAULT_LIMIT_BATCHES
        opts = RunOptions(max_steps=max_steps or len(self.recording.steps) or 40, seed=seed,
                          time_limit_s=time_limit_s or 30.0, replace_batch=replace, lr_scale=lr_scale,
                          listeners=list(listeners or []), limit_batches=limit_batches, patches=list(patches or []),
                          scratch=(self.run.scratch / f"rerun-{_count()}") if self.run.scratch else None)
        result = run_script(self.script, self.run.args, opts)
        steps = result.recording.steps
        described = _describe(same_batch, lr_scale, seed, listeners if what is None else None)
        self.reruns.append(Rerun(f"{what}, {described}" if what else described, opts.max_steps, len(steps),
                                 result.seconds, result.exit, float(steps[0].t) if steps else None))
        return result

    @property
    def startup_s(self) -> float:
        """Seconds a rerun takes before its first optimizer step (data, model, one step): the observed
        run's less its first-time imports, or what a rerun already measured."""
        steps = self.recording.steps
        observed = max(0.0, (float(steps[0].t) if steps else float(self.run.seconds)) - self.run.import_s)
        # the observed run paid for the first imports; a rerun that reached a step shows the real cost
        return min([observed] + [r.startup_s for r in self.reruns if r.startup_s is not None])

    def rerun_cost(self, steps: int) -> float:
        """A rerun of ``steps`` optimizer steps, in plain steps of the observed run (start-up included)."""
        step = self.measured_step_s or 0.0
        return steps + (self.startup_s / step if step else 0.0)

    @property
    def default_plain_steps(self) -> float:
        """What the default budget is sized for (budget.default_total), in plain steps: the reruns a flat or
        stuck curve calls for at their wanted lengths, each with the script's start-up (BUDGET_RERUNS)."""
        return sum(self.rerun_cost(n) for n in BUDGET_RERUNS)

    @property
    def feeds_one_batch(self) -> bool | None:
        """Whether the observed run fed its model the same inputs at every recorded training forward
        (a full-batch loop), None when too little was recorded to tell."""
        info = self.model_info
        inputs = [a for i, a in self.recording.model_inputs if info is not None and i == info.index]
        if len(inputs) < 2:
            return None
        first = inputs[0]
        return all(len(a) == len(first) and all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                                                and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, first))
                   for a in inputs[1:])

    @property
    def inputs_batch_first(self) -> bool:
        """Whether the model's first captured input is a tensor of a DataLoader batch as it was
        yielded (collated: its dim 0 is the batch). False when the script slices its own tensors or
        transposes the batch before the model: its dim 0 may then be time (a time-first RNN)."""
        info = self.model_info
        first = next((a for i, a in self.recording.model_inputs if info is not None and i == info.index), None)
        x = first[0] if first and isinstance(first[0], torch.Tensor) else None
        if x is None:
            return False
        batches = self.recording.batches[:1]
        items = [t for b in batches for t in (b if isinstance(b, (tuple, list)) else
                                              b.values() if isinstance(b, dict) else [b]) if isinstance(t, torch.Tensor)]
        return any(t.shape == x.shape and t.dtype == x.dtype and torch.equal(t, x) for t in items)

    @property
    def sequence_lengths(self) -> list[int] | None:
        """The dim-0 sizes of the model's recorded training inputs when they vary as sequence lengths do
        (one sentence per forward, not a DataLoader batch as yielded): three or more sizes, or two that
        each make up a quarter of the forwards (a batch loader's last short batch is one of many); None
        otherwise."""
        if self.inputs_batch_first:
            return None
        info = self.model_info
        sizes = [a[0].shape[0] for i, a in self.recording.model_inputs
                 if info is not None and i == info.index and a and isinstance(a[0], torch.Tensor) and a[0].dim()]
        counts = sorted(collections.Counter(sizes).values())
        if len(sizes) < 4 or len(counts) < 2 or (len(counts) == 2 and counts[0] < len(sizes) / 4):
            return None
        return sizes

    # -- what was observed ------------------------------------------------------------------------
    def observed(self) -> dict[str, Any]:
        from nnwizard.script_view import observed
        return observed(self)


@dataclass
class Rerun:
    """One re-execution of the script under an intervention, for the report."""
    what: str
    max_steps: int | None
    steps: int
    seconds: float
    exit: str
    startup_s: float | None = None   # seconds before its first optimizer step


def _describe(same_batch: bool, lr_scale: float | None, seed: int | None, listeners) -> str:
    parts = ["the first batch every step"] if same_batch else []
    if lr_scale is not None:
        parts.append(f"learning rate x{lr_scale:g}")
    parts.append("no seed from nnwizard" if seed is None else f"seed {seed}")
    if listeners:
        parts.append("ops traced")
    return ", ".join(parts)


def trained_model(run: RunResult) -> nn.Module | None:
    """The model the run trained (the script's own object, in the state the run left it)."""
    info = main_model(run.recording)
    return info.module if info is not None else None


class _NoLoss:
    def __call__(self, *args, **kwargs):
        raise NotCapturable("no loss call was recorded")


class _PairList(torch.utils.data.Dataset):
    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]


class _SameBatch:
    """replace_batch for the recorder: every DataLoader batch becomes the first one of its kind
    (overfit one batch through the user's own code path, reshaping included). The kind is the batch's
    structure (types, per-sample shapes, dtypes), so a script that zips two loaders (inputs from one,
    labels from the other) gets each loader's own first batch, not the inputs twice.

    The random draws the step makes after its batch come again too: each time the first kind's batch is
    handed out, the generators (Python, NumPy, torch) are put back where they stood when it was first
    fetched. A step that draws its own targets or inputs (a diffusion model's noise and timesteps, a VAE's
    sample, a random crop or mask in the loop) is then one batch repeated, which a model can memorise;
    with fresh draws every step the loss of a healthy model cannot approach zero."""

    def __init__(self):
        self.first: dict = {}
        self.anchor: Any = None
        self.state: tuple | None = None
        self.repeats = 0

    def __call__(self, batch, index):
        from nnwizard.isolation import rng_state, set_rng_state

        kind = _kind(batch)
        if self.state is None:
            self.anchor, self.state = kind, rng_state()
        elif kind == self.anchor:
            set_rng_state(self.state)
            self.repeats += 1
        return self.first.setdefault(kind, batch)


def _kind(batch, depth: int = 0):
    if isinstance(batch, torch.Tensor):
        return ("tensor", tuple(batch.shape[1:]), str(batch.dtype))
    if depth < 3 and isinstance(batch, (tuple, list)):
        return (type(batch).__name__, tuple(_kind(b, depth + 1) for b in batch))
    if depth < 3 and isinstance(batch, dict):
        return ("dict", tuple((k, _kind(v, depth + 1)) for k, v in batch.items()))
    return type(batch).__name__


_RERUNS = [0]


def _count() -> int:
    _RERUNS[0] += 1
    return _RERUNS[0]


def load_script_target(spec: str, args: list[str], options: RunOptions, device: str = "auto") -> ScriptTarget:
    from nnwizard.script_run import load_script

    script = load_script(spec)
    result = run_script(script, args, options)
    return ScriptTarget(result)


def script_files(target) -> list[Path]:
    return list(target.script.files) if getattr(target, "script", None) else []
