"""Readings of a recorded script run (a :class:`~nnwizard.record.Recording`) that the audits (``trace.py``) and
other modules share: the decorator that hands an audit the recording (and skips it on a module target), the loss
calls that trained, the evaluation curve and phases, one loss per step, the optimizers that idled or never
stepped, whether the parameters moved, the models cut off the graph, the tensor each loss call got, number
formatting."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable

from nnwizard.probes.api import ProbeContext, failed, passed, skipped
from nnwizard.probes.outputs import clamped
from nnwizard.record import inner_model


def on_recording(audit: Callable[[ProbeContext, Any], Any]) -> Callable[[ProbeContext], Any]:
    """An audit of the recording: called as ``audit(ctx, recording)``; skipped on a module target."""
    @functools.wraps(audit)
    def run(ctx: ProbeContext):
        rec = getattr(ctx.target, "recording", None)
        if rec is None:
            return skipped("script mode only: this audit reads the recording of a script run")
        return audit(ctx, rec)
    return run


def fmt(v, spec=".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def train_calls(rec):
    return [c for c in rec.loss_calls if not c.eval]


def terms(call) -> int:
    """How many terms a ``reduction='sum'`` loss call added up: what ``reduction='mean'`` divides by."""
    if call.target_shape is not None and "int" in (call.target_dtype or ""):
        return max(math.prod(call.target_shape), 1)    # class ids: one term per id
    shape = call.input_shape or []
    if call.fn in ("cross_entropy", "nll_loss") and len(shape) >= 2:
        return max(math.prod(shape) // max(shape[1], 1), 1)   # class probabilities along dim 1
    return max(math.prod(shape), 1)


def eval_curve(rec) -> tuple[list[float], list[int]]:
    """Mean loss of each evaluation phase (loss calls no backward reached), at the step it ran. An
    evaluation that sums its loss (``reduction='sum'``, pytorch/examples' ``test()``) while training
    averages it is brought to the training loss's scale, one term's mean: a per-batch sum is
    batch-size times a mean, and the curve shapes compare the two curves' levels."""
    summed_training = any(c.reduction == "sum" for c in train_calls(rec))
    by_step: dict[int, list[float]] = {}
    for c in rec.loss_calls:
        if c.eval and c.value is not None and math.isfinite(c.value):
            scale = terms(c) if c.reduction == "sum" and not summed_training else 1
            by_step.setdefault(c.step, []).append(c.value / scale)
    steps = sorted(by_step)
    return [sum(by_step[s]) / len(by_step[s]) for s in steps], steps


def cut_models(rec) -> set[int]:
    """Models whose parameters a stepped optimizer holds while backward() ran and reached none of their
    forwards: the script cut the graph between model and loss (detach, .data), so its training forwards
    look like evaluation ones (unreached by a backward, scored by a loss) and cannot be told apart."""
    if not rec.backwards:
        return set()
    stepped = {m for o in rec.optimizers if o.steps for m in o.models}
    return stepped - {f.model for f in rec.forwards if f.trained}


def step_losses(rec) -> list[float]:
    """One loss a recorded step (NaN where a step with a backward has none). A step with no loss and no backward of
    its own (a second optimizer stepped after the same backward: a decoder's beside its encoder's) repeats the loss
    of the step before it: it is not a non-finite loss, and the curve keeps one point per optimizer step."""
    out: list[float] = []
    for s in rec.steps:
        value = s.loss if s.loss is not None else s.loss_call_mean
        if value is None and not s.backwards:
            value = out[-1] if out else next((t.loss for t in rec.steps if t.loss is not None), math.nan)
        out.append(math.nan if value is None else value)
    return out


def gradless(rec) -> bool:
    """Optimizer steps ran, and not one of them found a gradient on any of its parameters."""
    return bool(rec.steps) and all((s.grad_norm or 0.0) == 0 and s.grads_none == s.grads_total for s in rec.steps)


def no_grad_cause(rec, opt, steps) -> tuple[int, bool]:
    """Why an optimizer's steps found no gradient: in how many zero_grad() ran between the backward and the step,
    and whether the graph was cut (it holds a model's own parameters and no backward ever reached that model's
    forwards: a detach, .data, torch.tensor(out), .item() between the model and the loss)."""
    cleared = sum(s.zero_grad_after_backward for s in steps)
    cut = bool(opt and opt.models and not opt.foreign and not cleared and set(opt.models) <= cut_models(rec))
    return cleared, cut


def cleared_every_time(cleared: int, steps) -> bool:
    """zero_grad() ran between the backward and the step at every step that had a backward before it (a loop
    that calls step() before backward() has none before its first step)."""
    return cleared > 0 and cleared == sum(s.backwards > 0 for s in steps)


def starved_optimizer(rec):
    """With several optimizers stepping: the first whose every measured step found all of its
    parameters without a gradient, while another optimizer's steps had gradients (a GAN's generator
    whose output reaches the loss only through ``.detach()``); None otherwise."""
    by_opt: dict[int, list] = {}
    for s in rec.steps:
        if s.optimizer >= 0 and s.grads_total:
            by_opt.setdefault(s.optimizer, []).append(s)
    if len(by_opt) < 2:
        return None
    empty = [i for i, own in by_opt.items() if all((s.grad_norm or 0.0) == 0 and s.grads_none == s.grads_total for s in own)]
    if not empty or len(empty) == len(by_opt):
        return None
    return rec.optimizers[min(empty)]


def unstepped_optimizers(rec) -> str:
    """The optimizers the script built and never stepped, as text ("SGD"); "" if none."""
    return " and ".join(o.name for o in rec.optimizers if not o.steps)


def idle_optimizers(rec) -> list:
    """Optimizers built over trainable parameters that never stepped while others did; a wrapper
    (its parameters all held by an optimizer that steps: accelerate, Lightning) does not count, nor, in a run
    nnwizard cut short, one whose parameters no backward has reached yet: training in stages (layer by layer,
    a second phase) had not come to it."""
    stepped = [o for o in rec.optimizers if o.steps]
    if not stepped:
        return []
    held = {id(p) for o in stepped for g in o.optimizer.param_groups for p in g["params"]}
    idle = []
    for o in rec.optimizers:
        if o.steps:
            continue
        params = [p for g in o.optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not params or all(id(p) in held for p in params):
            continue
        # (reached: a backward ran through one of its models' forwards in a recorded step; its .grad alone would not
        # say, a zero_grad() just before the cut sets it to None)
        reached = any(m in s.forwards for s in rec.steps for m in o.models)
        if rec.stopped and not reached and all(p.grad is None for p in params):
            continue
        idle.append(o)
    return idle


def built_optimizer(ctx) -> bool:
    return bool(getattr(ctx.target, "recording", None) and ctx.target.recording.optimizers)


def moved(rec) -> bool:
    """Did any model's parameters change from their initial copy?"""
    import torch

    for m in rec.models:
        if m.initial is None:
            continue
        for p, q in zip(m.module.parameters(), m.initial.parameters()):
            p = p.to_local() if hasattr(p, "to_local") else p   # (an FSDP2 DTensor in one process: its values)
            if p.shape == q.shape and not torch.equal(p.detach().cpu(), q.detach().cpu()):
                return True
    return False


def eval_phases(rec) -> list[list]:
    """Runs of consecutive model forwards that no backward reached and that look like evaluation:
    the script scored them (a loss, or a prediction: argmax, max, a threshold), ran them over a
    DataLoader iteration with no backward (a test loop, a validation loader), or put them in eval
    mode / no_grad itself. An unscored forward in the middle of training (a GAN generator sampling a
    picture from fixed noise, a logging forward) is not an evaluation phase."""
    def in_training(f) -> bool:
        if f.loader is None or f.loader >= len(rec.loaders):
            return True  # no DataLoader: only scoring or the mode tells
        backwards = rec.loaders[f.loader].backwards
        return 0 <= f.iteration < len(backwards) and backwards[f.iteration] > 0

    def evaluates(run) -> bool:
        return any(f.scored or not f.training or not f.grad_enabled or not in_training(f) for f in run)

    phases, current, cut = [], [], cut_models(rec)
    for f in rec.forwards:
        if f.model in cut:
            continue  # its training forwards reach no backward (see trace-backward-step): not evaluation
        if f.trained:
            if current and evaluates(current):
                phases.append(current)
            current = []
        else:
            current.append(f)
    if current and evaluates(current):
        if not (rec.error is not None or rec.stopped):
            phases.append(current)  # a trailing run cut by the script's exception or the budget is not an evaluation
        elif all(not f.grad_enabled for f in current):
            phases.append(current)
    return phases


def mode_models(rec) -> dict[int, Any]:
    """The models whose behaviour depends on train/eval mode: Dropout/BatchNorm modules, or a forward of the
    user's that branches on self.training (a functional dropout with training=self.training)."""
    return {m.index: m for m in rec.models if m.mode_layers or getattr(m, "reads_training", None)}


def mode_parts(models) -> str:
    """What makes these models mode-dependent, in words."""
    layers = sum(m.mode_layers for m in models)
    reads = sorted({r for m in models for r in getattr(m, "reads_training", [])})
    parts = ([f"{layers} Dropout/BatchNorm layers"] if layers else []) + \
        ([f"the self.training branches of {', '.join(reads)}"] if reads else [])
    return " and ".join(parts)


def averaged_models(rec) -> set[int]:
    """Models no optimizer holds whose parameters still changed during the run (set by hand from another model's:
    an EMA teacher, Mean Teacher style), judged against the copy taken before their first forward."""
    import torch

    if not rec.steps:
        return set()
    held = {id(p) for o in rec.optimizers for g in o.optimizer.param_groups for p in g["params"]}
    out = set()
    for m in rec.models:
        if m.initial is None:
            continue
        now = list(inner_model(m.owner or m.module).parameters())
        if not now or any(id(p) in held for p in now):
            continue
        before = list(m.initial.parameters())
        if len(before) == len(now) and any(a.shape == b.shape and not torch.equal(a.detach().cpu(), b.detach().cpu())
                                           for a, b in zip(now, before)):
            out.add(m.index)
    return out


def scheduler_steps_written(target, cls: str) -> list[str]:
    """``file:line`` of each ``X.step(...)`` call in the script and its own modules whose receiver ``X`` is a
    scheduler: assigned from a call of its class ``cls`` (``self.scheduler = CosineAnnealingLR(...)``), or named
    like one (``sched``, ``lr_scheduler``: the factories that return a LambdaLR have other names)."""
    import ast

    script = getattr(target, "script", None)
    run = getattr(target, "run", None)
    files = (list(script.files) if script is not None else []) + list(getattr(run, "own_files", []) or [])
    found = []
    for path in dict.fromkeys(files):
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        held = set()
        for node in ast.walk(tree):
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call):
                fn = value.func
                if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)) == cls:
                    held.update(ast.unparse(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
                receiver = ast.unparse(node.func.value)
                if receiver in held or "sched" in receiver.lower():
                    found.append(f"{Path(path).name}:{node.lineno}")
    return found


def arg_text(fp: tuple) -> str:
    shape, dtype, _ = fp[0]
    return f"argument 0, shape {list(shape)} {dtype.replace('torch.', '')}"


def project_files(target, exc) -> list | None:
    """The user's files a crash is read in: the script, and the files of its traceback that lie in the script's
    folder outside installed packages (the project's own modules: a script's ``from utils.dice import dice_loss``
    raising there is read there, not at the script's call of it). None (anything outside torch, site-packages
    and nnwizard) without a script."""
    script = getattr(target, "script", None)
    if script is None or script.path is None:
        return None
    files = list(script.files)   # (a notebook: its cells' files)
    folder = Path(script.folder).resolve()
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        path = Path(name).resolve() if not name.startswith("<") else None
        if path is not None and path.suffix == ".py" and folder in path.parents and "site-packages" not in path.parts \
                and not any(part.startswith(".venv") or part == "venv" for part in path.relative_to(folder).parts):
            files.append(path)
        tb = tb.tb_next
    return files


def loss_input(calls: list, at: str):
    """trace-loss-input's reading of the calls of one loss call site and model (``at`` names them when there are
    several)."""
    import torch

    call = calls[0]
    x = torch.cat([class_rows(c.inputs.float()) for c in calls
                   if c.fn == call.fn and c.inputs.dim() == call.inputs.dim() and c.inputs.shape[1:] == call.inputs.shape[1:]])
    data: dict[str, Any] = dict(fn=call.fn, rows=len(x), min=float(x.min()), max=float(x.max()))
    if at:
        data["call_site"] = at.strip()
    if call.fn in ("cross_entropy", "nll_loss") and x.dim() == 2 and x.shape[1] >= 2:
        sums = x.sum(1)
        probs = bool((x >= 0).all() and (x <= 1).all() and ((sums - 1).abs() < 1e-3).all())
        lse = torch.logsumexp(x, 1)
        data.update(row_sum_mean=float(sums.mean()), logsumexp_mean=float(lse.mean()))
        if probs and call.fn == "cross_entropy":
            return failed("double-softmax", f"all {len(x)} rows {call.fn} received{at} are probabilities (in [0, 1], summing "
                          f"to 1): the model already applies softmax and cross_entropy applies log_softmax again, "
                          f"which flattens the gradient", **data)
        if call.fn == "nll_loss" and probs:
            return failed("probs-to-nll", f"nll_loss received{at} probabilities (rows sum to 1, values in [0, 1]) where it "
                          f"needs log-probabilities (log_softmax)", **data)
        if call.fn == "nll_loss" and data["max"] <= 0 and bool((lse < -0.1).all()) and len(x) >= 8:
            # log-probabilities (none above 0) whose rows hold less than all the probability: the log_softmax
            # ran over another dimension (the samples), each column summing to one over the whole batch
            return failed("other-dim", f"nll_loss received{at} log-probabilities (none above 0) whose rows' probabilities sum "
                          f"to {math.exp(float(lse.mean())):.3g} on average, not 1: the log_softmax normalised another "
                          f"dimension (the samples), not the classes", **data)
        if call.fn == "nll_loss" and (lse - 0).abs().mean() > 0.1:
            return failed("logits-to-nll", f"nll_loss received{at} rows whose logsumexp is {float(lse.mean()):.3g}, not 0: raw "
                          f"logits where it needs log_softmax outputs", **data)
        if call.fn == "cross_entropy" and not probs and x.numel() >= MIN_LOGITS:
            clamped = clamped_logits(x, call.fn, data)
            if clamped is not None:
                return clamped
            if data["min"] >= 0 and data["max"] <= 1:
                c = x.shape[1]
                floor = math.log(1 + (c - 1) / math.e)
                data.update(classes=c, loss_floor=round(floor, 4))
                return failed("squashed-logits", f"all {len(x)} rows cross_entropy received{at} lie in [{data['min']:.3g}, "
                              f"{data['max']:.3g}] without summing to 1: the logits are squashed (a sigmoid on them, or a "
                              f"scale that shrinks them, such as a temperature far too large) before a loss "
                              f"that applies its own softmax, so it cannot fall below ln(1 + {c - 1}/e) = {floor:.3f} even "
                              f"when every prediction is right", **data)
    if call.fn == "binary_cross_entropy_with_logits" and x.numel() >= MIN_LOGITS:
        clamped = clamped_logits(x, call.fn, data)
        if clamped is not None:
            return clamped
    if call.fn == "binary_cross_entropy_with_logits" and bool((x >= 0).all() and (x <= 1).all()) and len(x) >= 8:
        return failed("double-sigmoid", f"binary_cross_entropy_with_logits received{at} only values in [0, 1] (min "
                      f"{data['min']:.3g}, max {data['max']:.3g}): a sigmoid was applied before a loss that applies its own",
                      **data)
    return passed(f"{call.fn}{at} receives inputs of the form it expects ({len(x)} rows, range {data['min']:.3g} .. {data['max']:.3g})",
                  **data)


MIN_LOGITS = 64        # values a loss must have received before their range says what produced them


def class_rows(t):
    """A loss input as one row per prediction, the classes along the row: (N, C) as it is, (N, C, d1, ...)
    (a segmentation map, a sequence's logits kept channel-first) with its class dimension 1 moved last."""
    if t.dim() > 2:
        return t.movedim(1, -1).reshape(-1, t.shape[1])
    return t.reshape(-1, t.shape[1] if t.dim() > 1 else 1)


def clamped_logits(x, fn: str, data: dict):
    """Logits with no value below 0 and many exactly 0: a ReLU (or a clamp) after the last layer, so a
    score can never go negative and every clamped one passes no gradient (None: not so)."""
    zeros = float((x == 0).float().mean())
    data["zero_share"] = round(zeros, 4)
    if not clamped(x, zeros):
        return None
    cost = ("a class score can never fall below 0, so the model can only raise the right class, never lower the "
            "others" if fn == "cross_entropy" else "no prediction can fall below probability 0.5")
    return failed("clamped-logits", f"{fn} received {x.numel()} values, none below 0 and {zeros:.0%} exactly 0: the "
                  f"logits pass through a ReLU (or a clamp) before a loss that wants them unbounded; {cost}, and the "
                  f"scores held at 0 pass no gradient back", **data)


_LAYER_FILES = ("conv.py", "linear.py", "pooling.py", "batchnorm.py", "normalization.py", "rnn.py", "sparse.py",
                "transformer.py", "activation.py", "flatten.py")


def raised_in_layer(exc: BaseException) -> str | None:
    """The torch layer file whose forward raised a size complaint (a classifier fallback)."""
    import traceback

    text = str(exc).lower()
    if not isinstance(exc, RuntimeError) or not any(w in text for w in ("size", "shape", "dimension", "channels")):
        return None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/torch/nn/modules/" in frame.filename:
            name = frame.filename.rsplit("/", 1)[-1]
            return name.removesuffix(".py") if name in _LAYER_FILES else None
    return None
