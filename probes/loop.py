"""Audits of the user's own training loop by differential diagnosis.

The user's ``train_step`` (or ``train_epoch`` over a few fixed batches) runs on a fresh model with
the user's optimizer, while an optimizer step pre-hook records, at every ``optimizer.step()``, the
gradients the optimizer is about to apply and the model state they were computed at. Afterwards the
correct reference gradient is recomputed from exactly those states on exactly the batches the user's
code consumed. Comparing the two separates the loop bugs that all look like "the loss does not move":
no gradient at all (no backward), gradients but no step, a step that changes nothing (parameters
outside the optimizer), gradients carried over from the previous step (no zero_grad), a gradient that
is a multiple of the mean-reduced one (sum reduction, accumulation without dividing) and a gradient
pointing elsewhere (the loss against the wrong tensor).

Dropout is switched off (p=0) on the audit's own fresh model so that the user's step and the
reference see identical forward passes; BatchNorm in train mode is deterministic for a given batch.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nnwizard import reference
from torch import nn

from nnwizard.probes._crash import error_kind
from nnwizard.record.frames import first_line, user_frame
from nnwizard.record.tracers import trace_modules
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

STEP_CALLS = 3      # train_step calls: enough for two optimizer steps (the carry-over marker test)
EPOCH_BATCHES = 8   # batches handed to train_epoch: room for accumulation over up to 4 micro-batches


# ------------------------------------------------------------------------------------ helpers
class FixedLoader:
    """Fixed batches that count how many were handed out; other attributes come from the user's loader."""

    def __init__(self, batches: list, base: Any):
        self.batches, self.base, self.served = list(batches), base, 0

    def __iter__(self):
        for batch in self.batches:
            self.served += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches)

    def __getattr__(self, name: str) -> Any:
        if name in ("batches", "base", "served"):
            raise AttributeError(name)
        return getattr(self.base, name)


def user_loop(target) -> str | None:
    """Which of the user's functions the loop audits exercise."""
    if target.user_train_step:
        return "train_step"
    if target.user_train_epoch:
        return "train_epoch"
    return None


def no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    return model


def _flat(params: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Gradients of ``params`` as one float32 vector on the CPU (None -> zeros) and how many were None.
    float32 holds half and bfloat16 gradients exactly; a float64 copy of an 11M-parameter model's
    gradient would cost 89 MB per vector."""
    parts, nones = [], 0
    for p in params:
        if p.grad is None:
            nones += 1
            parts.append(torch.zeros(p.numel(), dtype=torch.float32))
        else:
            parts.append(p.grad.detach().reshape(-1).to("cpu", torch.float32))
    if not parts:
        return torch.zeros(0, dtype=torch.float32), 0
    return torch.cat(parts), nones


def _grad_norm(params: list[torch.Tensor]) -> tuple[float, int, bool]:
    """(norm, how many .grad are None, all finite) of the gradients, without copying them."""
    total, nones, finite = 0.0, 0, True
    for p in params:
        if p.grad is None:
            nones += 1
            continue
        g = p.grad.detach().float()
        total += float(g.pow(2).sum(dtype=torch.float64))
        finite = finite and bool(torch.isfinite(g).all())
    return (math.sqrt(total) if math.isfinite(total) else math.inf), nones, finite


def reference_grad(model: nn.Module, batches: list, loss_fn) -> torch.Tensor:
    """The mean-over-batches gradient of the user's loss at the model's current state, train mode."""
    model.train()
    model.zero_grad(set_to_none=True)
    device_type = next((p.device.type for p in model.parameters()), "cpu")
    with torch.enable_grad(), torch.autocast(device_type=device_type, enabled=False):
        for x, y in batches:
            loss = loss_fn(model(x), y)
            (loss.float().mean() / len(batches)).backward()
    grads, _ = _flat([p for p in model.parameters() if p.requires_grad])
    model.zero_grad(set_to_none=True)
    return grads


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm(dtype=torch.float64)), float(b.norm(dtype=torch.float64))
    return _dot(a, b) / (na * nb) if na > 0 and nb > 0 else 0.0


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """a . b accumulated in float64, a million values at a time (no float64 copy of the vectors)."""
    chunk = 1 << 20
    return sum(float(a[i:i + chunk].double() @ b[i:i + chunk].double()) for i in range(0, len(a), chunk))


class _Stop(Exception):
    """Ends a marker run at the optimizer step the test needs."""


def marker_carry(target, seed: int, batches: list, fn: str, plain: torch.Tensor | None = None) -> float | None:
    """Do gradients survive from one optimizer.step() into the next? The user's loop runs twice from
    identical states (same seed, dropout off); in the second run a known random marker is added to
    every .grad right after the first optimizer.step(). A loop that clears gradients anywhere before
    its next step (zero_grad at the start or at the end of a step, set_to_none or not, after an
    accumulation window) wipes the marker, so both runs reach the second step with identical
    gradients; a loop that never clears them carries the marker in full. Returns the share of the
    marker found at the second step (about 1 carried, about 0 cleared), or None when fewer than two
    steps ran. Independent of what the loss is computed against. ``plain``: the gradients at the
    second step of a run without the marker from the same seed (the loop audit's), so that only the
    marked run has to train."""
    from nnwizard.isolation import seed_everything

    seen: list[torch.Tensor] = [] if plain is None else [plain]
    marker_norm = 0.0
    for inject in ((True,) if plain is not None else (False, True)):
        seed_everything(seed)
        model = no_dropout(target.fresh_model(seed))
        optimizer = target.make_optimizer(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        steps = {"n": 0}

        def pre(opt, args, kwargs):
            steps["n"] += 1
            if steps["n"] == 2:
                seen.append(_flat(trainable)[0])
                raise _Stop

        def post(opt, args, kwargs, inject=inject, trainable=trainable):
            nonlocal marker_norm
            if inject and steps["n"] == 1:
                generator = torch.Generator().manual_seed(seed + 7)
                total = 0.0
                for p in trainable:
                    mark = torch.randn(p.shape, generator=generator, dtype=torch.float64)
                    total += float(mark.pow(2).sum())
                    mark = mark.to(p.device, p.dtype)
                    p.grad = mark if p.grad is None else p.grad + mark
                marker_norm = math.sqrt(total)

        handles = [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
        try:
            if fn == "train_step":
                for batch in batches:
                    target.train_step(model, batch, optimizer)
            else:
                target.user_train_epoch(model, FixedLoader(batches, target.train_loader), target.loss_fn, optimizer,
                                        target.make_scheduler(optimizer) or reference.NoScheduler())
        except _Stop:
            pass
        except Exception:  # a crash is step-audit's finding, not this test's
            return None
        finally:
            for h in handles:
                h.remove()
        if len(seen) != (2 if inject else 1):
            return None
    if not marker_norm or not (torch.isfinite(seen[0]).all() and torch.isfinite(seen[1]).all()):
        return None
    return float(torch.linalg.vector_norm(seen[1] - seen[0])) / marker_norm


@dataclass
class StepEvent:
    norm: float          # of the gradients optimizer.step() was about to apply
    nones: int
    window: list[int]    # the batches consumed since the previous step


@dataclass
class LoopAudit:
    """What the user's step/epoch did on fixed batches, against the reference from the same state.
    As vectors (float32) only the first step's gradient, its reference and the second step's gradient
    are kept; the other steps keep their norms."""

    fn: str
    calls: int
    batches: int
    trainable: int
    events: list[StepEvent] = field(default_factory=list)
    first_grads: torch.Tensor | None = None
    second_grads: torch.Tensor | None = None  # the marker test's run without the marker
    reference: torch.Tensor | None = None     # the reference gradient at the first step's state and batches
    returned: list[float] = field(default_factory=list)
    max_change: float = 0.0
    changed_params: int = 0
    after_grad_norm: float = 0.0
    after_nones: int = 0
    after_finite: bool = True
    first_ref_norm: float = 0.0
    first_ref_loss: float = math.nan
    error: BaseException | None = None
    error_where: str | None = None
    reference_error: str | None = None
    batch_size: int = 0

    @property
    def steps(self) -> int:
        return len(self.events)


def run_loop_audit(target, seed: int) -> LoopAudit | None:
    """Run the user's train_step (3 calls) or train_epoch (8 batches) under instrumentation. Seeded
    like ``marker_carry``'s runs, so that its second-step gradients are that test's unmarked run."""
    from nnwizard.isolation import seed_everything

    fn = user_loop(target)
    if fn is None:
        return None
    cache = target.__dict__.setdefault("_nnwizard_loop_audit", {})
    if seed in cache:
        return cache[seed]
    n = STEP_CALLS if fn == "train_step" else EPOCH_BATCHES
    batches = [tuple(b[:2]) for b in target.batches(n)]
    seed_everything(seed)
    model = no_dropout(target.fresh_model(seed))
    scratch = copy.deepcopy(model)  # the initial state: the reference's model, and what "changed" is measured from
    optimizer = target.make_optimizer(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    audit = LoopAudit(fn, 0, len(batches), sum(p.numel() for p in trainable),
                      batch_size=len(batches[0][1]) if batches else 0)
    loader = FixedLoader(batches, target.train_loader)
    position = {"served": 0, "last": 0}
    first_state: dict = {}

    def pre_hook(opt, args, kwargs):
        served = loader.served if fn == "train_epoch" else position["served"]
        window = list(range(position["last"], served)) or [max(served - 1, 0)]
        position["last"] = served
        norm, nones, _ = _grad_norm(trainable)
        if not audit.events:
            audit.first_grads = _flat(trainable)[0]
            first_state.update((k, v.detach().clone()) for k, v in model.state_dict().items())
        elif len(audit.events) == 1:
            audit.second_grads = _flat(trainable)[0]
        audit.events.append(StepEvent(norm, nones, window))

    handle = optimizer.register_step_pre_hook(pre_hook)
    files = user_source_files(target)
    try:
        if fn == "train_step":
            for i, batch in enumerate(batches):
                position["served"] = i + 1
                audit.calls += 1
                audit.returned.append(target.train_step(model, batch, optimizer))
        else:
            scheduler = target.make_scheduler(optimizer)
            audit.calls = 1
            result = target.user_train_epoch(model, loader, target.loss_fn, optimizer, scheduler or reference.NoScheduler())
            from nnwizard.reference import as_float
            audit.returned.append(as_float(result))
    except Exception as exc:  # the user's step raising is a measurement
        audit.error, audit.error_where = exc, user_frame(exc, files)
    finally:
        handle.remove()
    with torch.no_grad():
        changes = [float((p - b).abs().max()) if p.numel() else 0.0 for p, b in zip(model.parameters(), scratch.parameters())]
    audit.max_change = max(changes, default=0.0)
    audit.changed_params = sum(c > 0 for c in changes)
    audit.after_grad_norm, audit.after_nones, audit.after_finite = _grad_norm(trainable)
    del model, optimizer, trainable, loader  # from here on only the scratch copy is needed
    try:
        ref = reference_grad(scratch, batches[:1], target.loss_fn)  # at the initial state, on the first batch
        audit.first_ref_norm = float(ref.norm())
        with torch.no_grad():
            audit.first_ref_loss = float(target.loss_fn(scratch(batches[0][0]), batches[0][1]).float().mean())
        if audit.events:
            # the reference at the very state and on the very batches of the user's first
            # optimizer.step(); the same as the one above when that step saw the first batch at the
            # initial parameters (a train-mode forward does not read BatchNorm's running statistics)
            window = audit.events[0].window
            params = dict(scratch.named_parameters())
            if window != [0] or any(not torch.equal(params[k], v) for k, v in first_state.items() if k in params):
                scratch.load_state_dict(first_state)
                ref = reference_grad(scratch, [batches[i] for i in window], target.loss_fn)
            audit.reference = ref
    except Exception as exc:
        audit.reference_error = first_line(exc)
    cache[seed] = audit
    return audit


def _scale(audit: LoopAudit) -> tuple[float, float] | None:
    """(a, cos) of the first step: the user's gradient projected on the reference, and their cosine."""
    if audit.first_grads is None or audit.reference is None:
        return None
    g, r = audit.first_grads, audit.reference
    if float(r.norm()) == 0:
        return None
    return _dot(g, r) / _dot(r, r), _cos(g, r)


def _loop_skip(ctx: ProbeContext):
    return skipped("the module gives no train_step or train_epoch: the wizard's reference loop runs instead, "
                   "and it is correct by construction")


def _crash(audit: LoopAudit):
    exc = audit.error
    kind = error_kind(exc)
    return dict(error=first_line(exc), kind=kind, where=audit.error_where or "?", fn=audit.fn, training_raised=True,
                reference_ok=audit.reference_error is None, reference_error=audit.reference_error or "",
                trainable=audit.trainable)


# -------------------------------------------------------------------------------------- probes
@probe(
    "step-audit",
    title="What the user's train_step / train_epoch did to gradients and parameters",
    outcomes={
        "ok": "gradients computed, cleared between steps and applied by optimizer.step()",
        "no-backward": "no gradient was computed: every .grad stayed empty",
        "no-step": "gradients were computed but optimizer.step() was never called; no parameter moved",
        "no-update": "optimizer.step() ran with gradients but no parameter changed",
        "carry-over": "each step's gradient still contains the previous step's: gradients are never cleared",
        "crashed": "the user's function raised",
        "manual-update": "parameters changed without optimizer.step() (a hand-written update)",
    },
    timeout_s=60,
    cost=14,
)
def step_audit(ctx: ProbeContext):
    audit = run_loop_audit(ctx.target, ctx.seed)
    if audit is None:
        return _loop_skip(ctx)
    fn = audit.fn
    unit = f"{audit.calls} calls" if fn == "train_step" else f"one epoch of {audit.batches} batches"
    data: dict[str, Any] = dict(fn=fn, calls=audit.calls, batches=audit.batches, steps=audit.steps,
                                ref_grad_norm=audit.first_ref_norm, max_param_change=audit.max_change,
                                changed_params=audit.changed_params, trainable=audit.trainable)
    if audit.error is not None:
        data.update(_crash(audit))
        hint = ""
        if data["kind"] == "no-grad":
            hint = ("; the reference loss on the same batch does have a graph, so the user's function cut it"
                    if data["reference_ok"] else "; the reference loss on the same batch has no graph either: "
                    "nothing trainable reaches the loss")
        elif data["kind"] == "inplace":
            hint = "; a tensor autograd saved for backward was overwritten in place before backward ran"
        return failed("crashed", f"{fn} raised ({data['where']}): {data['error']}{hint}", **data)
    step_grad = max((e.norm for e in audit.events), default=0.0)
    seen = max(step_grad, audit.after_grad_norm) if audit.after_finite else math.inf
    data.update(grad_norm=seen, step_grad_norm=step_grad)
    if audit.first_ref_norm == 0:
        return skipped(f"the reference step gets no gradient on this model either ({audit.trainable} trainable values)", **data)
    if seen == 0:
        return failed("no-backward", f"{fn} left every .grad empty over {unit} ({audit.steps} optimizer.step() calls, "
                      f"largest parameter change {audit.max_change:.3g}) while the reference step on the same batch "
                      f"gets gradient norm {audit.first_ref_norm:.3g}: loss.backward() never ran", **data)
    if audit.steps == 0 and audit.max_change == 0 and not audit.after_finite:
        # torch.amp.GradScaler skips optimizer.step() while scaled gradients are inf/NaN (it then
        # lowers the scale): a few skipped steps at the start of mixed-precision training are normal.
        return skipped(f"{fn} left non-finite gradients and made no optimizer.step() over {unit}: a GradScaler "
                       f"skips such steps while it lowers its scale, so this run cannot tell", **data)
    if audit.steps == 0 and audit.max_change == 0:
        return failed("no-step", f"{fn} computed gradients (norm {seen:.3g}) over {unit} but never called "
                      f"optimizer.step(): every parameter is exactly as it was", **data)
    if audit.steps == 0:
        return passed(f"{fn} changed {audit.changed_params} parameter tensors without optimizer.step() "
                      f"(a hand-written update); gradient norm {seen:.3g}", "manual-update", **data)
    if audit.max_change == 0:
        return failed("no-update", f"{fn} called optimizer.step() {audit.steps} times with gradient norm {step_grad:.3g} "
                      f"but no parameter changed: the optimizer holds none of this model's parameters, or its lr is 0",
                      **data)
    scale = _scale(audit)
    if scale:
        data.update(scale=scale[0], cosine=scale[1])
    n = STEP_CALLS if fn == "train_step" else EPOCH_BATCHES
    carry = marker_carry(ctx.target, ctx.seed, [tuple(b[:2]) for b in ctx.target.batches(n)], fn, audit.second_grads)
    if carry is not None:
        data["carry"] = carry
        # 1 when the marker survives in full, 0 when it was cleared: 0.5 is halfway
        if carry > 0.5:
            grow = audit.events[-1].norm / max(audit.events[0].norm, 1e-30)
            data["grad_growth"] = grow
            return failed("carry-over", f"{fn} never clears gradients: a marker added to every .grad right after "
                          f"optimizer.step() was still {carry:.0%} present at the next step; the gradient grew "
                          f"{grow:.1f}x over {audit.steps} steps", **data)
    extra = f", gradient {scale[0]:.2f}x the reference's (cosine {scale[1]:.2f})" if scale else ""
    carry_text = f", carry-over {data['carry']:.2f}" if "carry" in data else ""
    return passed(f"{fn}: {audit.steps} optimizer steps over {unit}, gradients present (norm {seen:.3g}), "
                  f"{audit.changed_params} parameter tensors updated{extra}{carry_text}", **data)


@probe(
    "loss-scale-audit",
    title="Gradient scale of the user's loss and step against a mean-reduced reference",
    outcomes={"ok": "the loss is a mean and the step applies a mean-sized gradient",
              "sum-reduction": "the loss doubles when the batch is duplicated: it sums over samples",
              "scaled-gradient": "the user's step applies a multiple of the mean-reduced gradient"},
    timeout_s=60,
    cost=14,
)
def loss_scale_audit(ctx: ProbeContext):
    target = ctx.target
    x, y = target.batch()
    model = no_dropout(target.fresh_model(ctx.seed)).eval()
    data: dict[str, Any] = {"batch_size": len(y)}
    # A mean-reduced loss is unchanged when every sample appears twice; a sum doubles exactly.
    try:
        with torch.no_grad():
            single = target.loss_fn(model(x), y)
            double = target.loss_fn(model(torch.cat([x, x])), torch.cat([y, y]))
    except Exception as exc:
        return cannot_run(f"the loss could not be evaluated on a duplicated batch: {first_line(exc)}", reason="raised")
    if not isinstance(single, torch.Tensor) or single.numel() != 1 or float(single) == 0:
        return skipped("the loss is not a non-zero scalar tensor")
    dup = float(double) / float(single)
    data.update(duplication_ratio=dup, loss=float(single))
    if abs(dup - 2.0) < 0.1:
        data["multiplier"] = float(len(y))
        return failed("sum-reduction", f"loss_fn ({type(target.loss_fn).__name__}) doubles ({dup:.2f}x) when each of the "
                      f"{len(y)} samples appears twice: it sums over the batch, so gradients (and the effective "
                      f"learning rate) grow {len(y)}x with a batch of {len(y)}", **data)
    if abs(dup - 1.0) >= 0.1:  # neither a mean (1x) nor a sum (2x): say what was measured, claim neither
        return passed(f"loss_fn is neither a per-sample mean nor a sum: duplicating each of the {len(y)} samples "
                      f"multiplies it by {dup:.2f}x (a mean gives 1.00x, a sum 2.00x)", **data)
    audit = run_loop_audit(target, ctx.seed)
    scale = _scale(audit) if audit and audit.error is None else None
    if scale is None:
        return passed(f"loss_fn is a mean over the batch (duplicated batch: {dup:.2f}x)", **data)
    a, cos = scale
    window = len(audit.events[0].window)
    data.update(fn=audit.fn, scale=a, cosine=cos, micro_batches=window, step_batch=audit.batch_size)
    # A mean-reduced step gives a ~ 1 (clipping only lowers it). Doubling or more is a sum somewhere:
    # over the micro-batches of an accumulation window (a ~ their number) or over samples (a ~ batch size).
    if a >= 1.8 and cos > 0.5:
        near = (f"about the number of micro-batches accumulated per step ({window})" if abs(a - window) < 0.25 * window
                else f"about the batch size ({audit.batch_size})" if abs(a - audit.batch_size) < 0.25 * audit.batch_size
                else "a constant factor")
        data["near"] = near
        return failed("scaled-gradient", f"{audit.fn} applies a gradient {a:.2f}x the mean-reduced reference "
                      f"(cosine {cos:.2f}) at its first optimizer.step(), {near}: the losses are summed, not averaged",
                      **data)
    return passed(f"loss_fn is a mean (duplicated batch: {dup:.2f}x); {audit.fn}'s gradient is {a:.2f}x the "
                  f"reference (cosine {cos:.2f})", **data)


@probe(
    "loss-target-audit",
    title="Does the user's step descend the loss against the real targets?",
    outcomes={"ok": "the user's gradient points where the reference gradient points",
              "wrong-direction": "the user's gradient is unrelated to the reference: a different loss or target"},
    timeout_s=60,
    cost=14,
)
def loss_target_audit(ctx: ProbeContext):
    target = ctx.target
    audit = run_loop_audit(target, ctx.seed)
    if audit is None:
        return _loop_skip(ctx)
    if audit.error is not None or not audit.events:
        return skipped(f"{audit.fn} made no optimizer step to compare")
    scale = _scale(audit)
    if scale is None:
        return skipped("no reference gradient to compare")
    a, cos = scale
    if audit.events[0].norm == 0:
        return skipped(f"{audit.fn} applied no gradient at all (see step-audit)")
    data: dict[str, Any] = dict(fn=audit.fn, cosine=cos, scale=a, ref_loss=audit.first_ref_loss)
    returned = audit.returned[0] if audit.returned else math.nan
    data["user_loss"] = returned
    # only a train_step's return value is the loss of that one batch (train_epoch returns a mean)
    if audit.fn == "train_step" and math.isfinite(returned) and math.isfinite(audit.first_ref_loss) and audit.first_ref_loss > 0:
        data["loss_ratio"] = returned / audit.first_ref_loss
    # Clipping, AMP, accumulation and scaling keep the direction (cosine near 1); gradients of a loss
    # against another tensor share little of it. Below 0.5 less than a quarter of the user's gradient
    # energy lies along the reference direction.
    if cos < 0.5:
        ratio = f"; it returned loss {returned:.4g} where the loss against the batch's targets is {audit.first_ref_loss:.4g}" \
            if "loss_ratio" in data else ""
        return failed("wrong-direction", f"{audit.fn}'s first optimizer.step() applies a gradient with cosine {cos:.2f} "
                      f"to the gradient of loss_fn(model(inputs), targets) on the same batch and state{ratio}", **data)
    return passed(f"{audit.fn}'s gradient has cosine {cos:.2f} with the reference gradient", **data)


@dataclass
class Coverage:
    """Trainable (name, parameter) pairs and those no param group holds (``held``: ids of the held tensors).
    optimizer-coverage (module mode) and trace-optimizer (script mode) both read it."""

    named: list
    missing: list

    @classmethod
    def of(cls, named_parameters, held) -> "Coverage":
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        return cls(named, [(n, p) for n, p in named if id(p) not in held])

    @property
    def total(self) -> int:
        return sum(p.numel() for _, p in self.named)

    @property
    def n_missing(self) -> int:
        return sum(p.numel() for _, p in self.missing)

    @property
    def fraction(self) -> float:
        return self.n_missing / self.total if self.total else 0.0

    @property
    def modules(self) -> str:
        return ", ".join(sorted({n.rsplit(".", 1)[0] for n, _ in self.missing})[:6])

    def table(self, title: str) -> list:
        rows = [[n, list(p.shape), p.numel()] for n, p in self.missing[:40]]
        return [Table("missing", title, ["parameter", "shape", "values"], rows)] if rows else []


@probe(
    "optimizer-coverage",
    title="Trainable parameters missing from the optimizer's param groups",
    outcomes={"ok": "every trainable parameter is in exactly one param group",
              "missing": "some trainable parameters are in no param group",
              "foreign": "the optimizer holds none of the model's parameters (another instance)",
              "duplicated": "a parameter is listed more than once"},
    timeout_s=30,
)
def optimizer_coverage(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed)
    try:
        optimizer = target.make_optimizer(model)
    except Exception as exc:
        return cannot_run(f"build_optimizer raised: {first_line(exc)}", reason="raised")
    held: dict[int, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            held[id(p)] = held.get(id(p), 0) + 1
    cover = Coverage.of(model.named_parameters(), held)
    named, missing, total, n_missing = cover.named, cover.missing, cover.total, cover.n_missing
    own = {id(p) for p in model.parameters()}
    foreign = sum(1 for k in held if k not in own)
    dups = sum(1 for v in held.values() if v > 1)
    name = "build_optimizer's" if target.user("build_optimizer") else "the default"
    data = dict(optimizer=type(optimizer).__name__, groups=len(optimizer.param_groups), trainable=total,
                missing_params=n_missing, missing_tensors=len(missing), missing_fraction=cover.fraction,
                missing_modules=cover.modules, foreign=foreign, duplicated=dups, source=name)
    table = cover.table("Trainable parameters in no param group")
    if missing and foreign and len(missing) == len(named):
        return failed("foreign", f"{name} {type(optimizer).__name__} holds {foreign} tensors, none of them this model's "
                      f"{len(named)} trainable tensors: it was built over another model instance", table, **data)
    if missing:
        return failed("missing", f"{n_missing:,} of {total:,} trainable values ({data['missing_fraction']:.0%}; modules "
                      f"{data['missing_modules']}) are in no param group of {name} {type(optimizer).__name__}: they get "
                      f"gradients and never change", table, **data)
    if dups:
        return failed("duplicated", f"{dups} parameters appear in more than one param group of {name} {type(optimizer).__name__}", **data)
    return passed(f"{name} {type(optimizer).__name__} holds all {len(named)} trainable tensors "
                  f"({len(optimizer.param_groups)} group(s))", **data)


def _output_layer(model: nn.Module, inputs) -> str | None:
    """The last module with parameters called in the forward pass (the layer producing the output)."""
    with trace_modules(model, leaves_only=True) as trace:
        try:
            with torch.no_grad():
                model(inputs)
        except Exception:
            return None
    for call in reversed(trace.calls):
        module = trace.modules.get(call.path)
        if module is not None and any(True for _ in module.parameters(recurse=False)):
            return call.path
    return None


@probe(
    "requires-grad-audit",
    title="Parameters with requires_grad=False, by module",
    outcomes={"ok": "every parameter requires grad", "partly-frozen": "some modules are frozen, the output layer trains",
              "head-frozen": "the layer producing the output is frozen (and perhaps more)",
              "all-frozen": "no parameter requires grad"},
    timeout_s=30,
)
def requires_grad_audit(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed)
    groups: dict[str, list[int]] = {}
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0] if "." in name else "(model)"
        g = groups.setdefault(module, [0, 0])
        g[0] += p.numel()
        g[1] += p.numel() if not p.requires_grad else 0
    total = sum(g[0] for g in groups.values())
    frozen = sum(g[1] for g in groups.values())
    if total == 0:
        return skipped("the model has no parameters")
    frozen_modules = [m for m, g in groups.items() if g[1] == g[0]]
    rows = [[m, g[0], g[0] - g[1], "frozen" if g[1] == g[0] else "partly" if g[1] else "trains"] for m, g in groups.items()]
    table = Table("requires-grad", "requires_grad by module", ["module", "values", "trainable", "state"], rows,
                  marked=[i for i, r in enumerate(rows) if r[3] != "trains"])
    data = dict(total=total, frozen=frozen, frozen_fraction=frozen / total, frozen_modules=", ".join(frozen_modules[:8]),
                trainable=total - frozen)
    if frozen == 0:
        return passed(f"all {total:,} parameter values require grad", **data)
    if frozen == total:
        x, y = target.batch()
        message = ""
        try:
            target.loss_fn(model(x), y).backward()
        except Exception as exc:
            message = first_line(exc)
        data["backward_error"] = message
        return failed("all-frozen", f"every one of the {total:,} parameter values has requires_grad=False, so the loss has "
                      f"no graph and loss.backward() raises ({message or 'no error seen'})", [table], **data)
    head = _output_layer(model, target.batch()[0])
    data["output_layer"] = head or "?"
    head_frozen = head is not None and all(not p.requires_grad for p in target_module(model, head).parameters(recurse=False))
    text = f"{frozen:,} of {total:,} values ({frozen / total:.0%}) are frozen: {data['frozen_modules']}"
    if head_frozen:
        return failed("head-frozen", f"{text}; the output layer '{head}' is frozen too", [table], **data)
    return passed(f"{text}; the output layer '{head or '?'}' trains", "partly-frozen", [table], **data)


def target_module(model: nn.Module, path: str) -> nn.Module:
    return model if path in ("", "(model)") else model.get_submodule(path)


_CUTS = re.compile(r"\.detach\(\)|\.data\b|torch\.no_grad\(\)|\.item\(\)|\.numpy\(\)|\.tolist\(\)|torch\.tensor\(")


def _cuts_in_forward(model: nn.Module, files: list[Path]) -> list[str]:
    """``file:line: code`` of graph-cutting calls in the forward methods of the user's module classes."""
    wanted = {str(f.resolve()) for f in files}
    found, seen = [], set()
    for m in model.modules():
        cls = type(m)
        if cls in seen or cls.__module__.startswith("torch."):
            continue
        seen.add(cls)
        try:
            path = str(Path(inspect.getsourcefile(cls.forward)).resolve())
            lines, start = inspect.getsourcelines(cls.forward)
        except (TypeError, OSError):
            continue
        if wanted and path not in wanted:
            continue
        for i, line in enumerate(lines):
            if _CUTS.search(line) and not line.strip().startswith("#"):
                found.append(f"{Path(path).name}:{start + i}: {line.strip()}")
    return found


@probe(
    "disconnected-params",
    title="Trainable parameters that get no gradient from the loss",
    outcomes={"ok": "every trainable parameter receives a gradient",
              "disconnected": "some trainable parameters get no gradient (.grad stays None)",
              "no-graph": "the loss has no graph at all although parameters require grad"},
    timeout_s=30,
    cost=2,
)
def disconnected_params(ctx: ProbeContext):
    target = ctx.target
    model = no_dropout(target.fresh_model(ctx.seed)).train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        return skipped("no parameter requires grad (see requires-grad-audit)")
    x, y = target.batch()
    cuts = _cuts_in_forward(model, user_source_files(target))
    data: dict[str, Any] = dict(cuts="; ".join(cuts[:4]) or "none found", trainable_tensors=len(named))
    try:
        loss = target.loss_fn(model(x), y)
        if not loss.requires_grad:
            return failed("no-graph", f"the loss of a model with {len(named)} trainable tensors carries no graph; "
                          f"graph cuts in forward: {data['cuts']}", **data)
        loss.float().mean().backward()
    except Exception as exc:
        return cannot_run(f"forward/backward raised: {first_line(exc)}", reason="raised")
    dead = [(n, p) for n, p in named if p.grad is None]
    total = sum(p.numel() for _, p in named)
    n_dead = sum(p.numel() for _, p in dead)
    modules = sorted({n.rsplit(".", 1)[0] if "." in n else n for n, _ in dead})
    data.update(disconnected_values=n_dead, disconnected_fraction=n_dead / total, disconnected_tensors=len(dead),
                modules=", ".join(modules[:6]))
    if dead:
        where = f"; graph cuts in forward: {data['cuts']}" if cuts else ""
        rows = [[n, list(p.shape)] for n, p in dead[:40]]
        return failed("disconnected", f"{len(dead)} trainable tensors ({n_dead:,} of {total:,} values, modules "
                      f"{data['modules']}) still have .grad None after loss.backward(){where}",
                      [Table("disconnected", "Parameters without gradient", ["parameter", "shape"], rows)], **data)
    return passed(f"all {len(named)} trainable tensors receive a gradient", **data)
