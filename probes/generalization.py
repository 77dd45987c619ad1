"""Generalization: can the user's model fit at all, and is it even non-linear?

- ``capacity-check`` fits a moderate fixed subset of the training data three ways for the same
  number of steps: the user's model with a plain optimizer (Adam 1e-3), a wide one-hidden-layer MLP
  with the same optimizer, and the user's model with the user's own optimizer. Which of them reach a
  low training loss separates "the model is too small" from "the optimizer settings (weight decay,
  learning rate) hold it back" from "nothing fits these labels".
- ``linear-stack`` traces the forward pass for affine layers (Linear / Conv) that follow one another
  with nothing non-linear between them, and tests the model itself for affinity:
  f(a x1 + (1-a) x2) = a f(x1) + (1-a) f(x2) holds, to float precision, exactly when the model is one
  linear map, i.e. no better than its linear version whatever its depth.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from nnwizard import reference
from nnwizard.record.frames import first_line
from nnwizard.record.tracers import trace_modules
from nnwizard.probes.api import BarPlot, Table, cannot_run, failed, passed, probe, skipped

AFFINE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
# modules that are themselves affine (or identity) at evaluation time: they do not break a linear stack
TRANSPARENT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.BatchNorm1d, nn.BatchNorm2d,
               nn.BatchNorm3d, nn.Flatten, nn.Unflatten, nn.Identity, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
               nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.Sequential, nn.ModuleList)
SQUASH = (nn.Sigmoid, nn.Softmax, nn.LogSoftmax)


# ------------------------------------------------------------------------------------ linearity
@probe(
    "linear-stack",
    title="Affine layers stacked without an activation; is the model one linear map?",
    outcomes={"ok": "the model is non-linear (or a single affine layer by design)",
              "linear-stack": "two or more affine layers and the whole model is one affine map",
              "adjacent-affine": "affine layers follow one another without an activation module, but the model is non-linear"},
    timeout_s=30,
)
def linear_stack(ctx):
    target = ctx.target
    batch = target.batch()
    inputs = batch[0]
    if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point() or len(inputs) < 2:
        return skipped("the inputs are not a floating-point tensor batch; affinity cannot be tested")
    model = target.fresh_model(ctx.seed).eval()
    captured: dict = {}
    with trace_modules(model, leaves_only=True) as trace, torch.no_grad():
        try:
            model(inputs)
        except Exception as exc:  # noqa: BLE001
            return cannot_run(f"forward raised: {first_line(exc)}", reason="raised")
    leaves = [(c.path, trace.modules[c.path]) for c in trace.calls if c.path in trace.modules]
    affine = [(p, m) for p, m in leaves if isinstance(m, AFFINE)]
    pairs: list[str] = []
    previous = None
    for path, module in leaves:
        if isinstance(module, AFFINE):
            if previous is not None:
                pairs.append(f"{previous} -> {path}")
            previous = path
        elif not isinstance(module, TRANSPARENT):
            previous = None
    # behavioural: the model (up to a final squashing output layer) against its own linear version
    last = leaves[-1][1] if leaves else None
    head = None
    if isinstance(last, SQUASH):
        head = last.register_forward_pre_hook(lambda mod, args: captured.__setitem__("pre", args[0]))

    def f(x):
        out = model(x)
        out = captured.get("pre", out) if head is not None else out
        return out.float() if isinstance(out, torch.Tensor) else None

    half = len(inputs) // 2
    x1, x2 = inputs[:half], inputs[half: 2 * half]
    a = 0.3
    try:
        with torch.no_grad():
            lhs = f(a * x1 + (1 - a) * x2)
            rhs = a * f(x1) + (1 - a) * f(x2)
    except Exception as exc:  # noqa: BLE001
        return cannot_run(f"forward on mixed inputs raised: {first_line(exc)}", reason="raised")
    finally:
        if head is not None:
            head.remove()
    if lhs is None or rhs is None or lhs.shape != rhs.shape:
        return skipped("the model output is not a tensor of fixed shape")
    # relative error of the affine identity: ~1e-7 for a linear map in float32, >1e-2 once a single
    # ReLU/tanh/pooling sits in the path (half the units change regime between the inputs). 1e-4 sits
    # orders of magnitude from both.
    error = float((lhs - rhs).norm() / (rhs.norm() + 1e-12))
    # a constant output (every ReLU dead, saturated units) is trivially affine: that is a different
    # fault, so the spread of the outputs across inputs must be real before linearity is claimed
    with torch.no_grad():
        outputs = f(inputs)
    spread = float((outputs - outputs.mean(0, keepdim=True)).norm() / (outputs.norm() + 1e-12)) if outputs is not None else 0.0
    data = dict(affine_layers=len(affine), adjacent=pairs[:6], affinity_error=error, output_spread=spread,
                layers=[f"{p} ({type(m).__name__})" for p, m in leaves][:20])
    table = Table("leaves", "Layers in forward order", ["layer", "type", "affine"],
                  [[p, type(m).__name__, "yes" if isinstance(m, AFFINE) else ""] for p, m in leaves][:40],
                  marked=[i for i, (p, m) in enumerate(leaves[:40]) if any(p in pair for pair in pairs)])
    names = ", ".join(f"{p} ({type(m).__name__})" for p, m in affine[:5])
    if error < 1e-4 and len(affine) >= 2 and spread > 1e-3:
        where = f"; no activation between {'; '.join(pairs[:3])}" if pairs else ""
        return failed("linear-stack", f"{len(affine)} affine layers ({names}) and the model is exactly affine: "
                      f"f(0.3 x1 + 0.7 x2) matches 0.3 f(x1) + 0.7 f(x2) to {error:.1e}{where}", [table], **data)
    if spread <= 1e-3:
        return passed(f"{len(affine)} affine layers; the output barely depends on the input (spread {spread:.1e}), so "
                      f"linearity cannot be judged", artifacts=[table], **data)
    if pairs:
        return passed(f"affine layers adjacent without an activation module ({'; '.join(pairs[:3])}), but the model is "
                      f"non-linear (affinity error {error:.2g})", "adjacent-affine", [table], **data)
    return passed(f"{len(affine)} affine layers; the model is non-linear (affinity error {error:.2g})", artifacts=[table], **data)


# -------------------------------------------------------------------------------------- capacity
def wide_mlp(inputs: torch.Tensor, out_shape: list[int], width: int) -> nn.Module:
    d_in = int(inputs[0].numel())
    d_out = int(math.prod(out_shape[1:])) if len(out_shape) > 1 else 1

    class WideMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, d_out))

        def forward(self, x):
            return self.net(x.float()).reshape(len(x), *out_shape[1:])

    return WideMLP()


def _fit(target, model, optimizer, batches, steps: int, deadline: float) -> tuple[float, list[float]]:
    """``steps`` reference steps cycling over ``batches``; returns the eval-mode loss on all of them."""
    curve = []
    for i in range(steps):
        curve.append(reference.train_step(model, batches[i % len(batches)], target.loss_fn, optimizer))
        if not math.isfinite(curve[-1]) or time.monotonic() > deadline:
            break
    model.eval()
    with torch.no_grad():
        losses = [reference.as_float(target.loss_fn(model(x), y)) for x, y in batches]
    model.train()
    return sum(losses) / len(losses), curve


MIN_FIT_STEPS = 50


def _opt_settings(optimizer) -> dict:
    group = optimizer.param_groups[0]
    return {"optimizer": type(optimizer).__name__, "lr": float(group.get("lr", math.nan)),
            "weight_decay": float(group.get("weight_decay", 0.0) or 0.0)}


@probe(
    "capacity-check",
    title="Fit a training subset: the user's model vs a wide MLP, plain optimizer vs the user's",
    outcomes={"ok": "the user's model fits the subset with its own optimizer",
              "too-small": "the user's model cannot fit the subset while a wide MLP can",
              "optimizer-holds-back": "the user's model fits with a plain optimizer but not with the user's settings",
              "nothing-fits": "neither the user's model nor a wide MLP fits the subset"},
    timeout_s=60,
    share=0.15,
    floor=2 * MIN_FIT_STEPS + 3,  # two fits at their minimum and the model copies (evaluations not counted)
)
def capacity_check(ctx):
    target = ctx.target
    n_batches = int(ctx.param("batches", 8))
    wanted = int(ctx.param("steps", 200))
    # three fits (the wide MLP costs little), each evaluated once over its batches
    steps = ctx.plan_steps(wanted, minimum=MIN_FIT_STEPS, runs=2, fixed=2 * n_batches / 3 + 3)
    if not steps:
        return ctx.unaffordable(MIN_FIT_STEPS, "steps each of its fits needs", wanted=wanted)
    batches = target.batches(n_batches)
    if not batches or not isinstance(batches[0][0], torch.Tensor) or not batches[0][0].is_floating_point():
        return skipped("the inputs are not floating-point tensors; a reference MLP cannot read them")
    samples = sum(len(b[1]) for b in batches)
    deadline = time.monotonic() + min(ctx.time_left() - 1, 20)
    probe_model = target.fresh_model(ctx.seed)
    with torch.no_grad():
        probe_model.eval()
        out = probe_model(batches[0][0])
        initial = sum(reference.as_float(target.loss_fn(probe_model(x), y)) for x, y in batches) / len(batches)
    with trace_modules(probe_model, leaves_only=True) as trace, torch.no_grad():
        probe_model(batches[0][0])
    widths = [(c.path, int(math.prod(c.output[1:]))) for c in trace.calls
              if isinstance(trace.modules.get(c.path), AFFINE) and c.output and len(c.output) > 1]
    d_out = int(math.prod(out.shape[1:])) if out.dim() > 1 else 1
    hidden = widths[:-1]  # every affine layer but the output layer
    narrowest = min(hidden, key=lambda w: w[1]) if hidden else None
    expected = target.expected_initial_loss(batches[0][1])
    scale = expected[0] if expected and expected[0] > 0 else max(initial, 1e-8)

    model = target.fresh_model(ctx.seed)
    plain, c1 = _fit(target, model, torch.optim.Adam(model.parameters(), lr=1e-3), batches, steps, deadline)
    torch.manual_seed(ctx.seed)
    mlp = wide_mlp(batches[0][0], list(out.shape), int(ctx.param("width", 256))).to(target.device)
    wide, c2 = _fit(target, mlp, torch.optim.Adam(mlp.parameters(), lr=1e-3), batches, steps, deadline)
    model = target.fresh_model(ctx.seed)
    own_opt = target.make_optimizer(model)
    settings = _opt_settings(own_opt)
    own, c3 = _fit(target, model, own_opt, batches, steps, deadline)
    params = sum(p.numel() for p in target.fresh_model(ctx.seed).parameters())
    ran = [len(c1), len(c2), len(c3)]  # the time limit may stop a fit early: sentences quote what ran
    planned, steps = steps, min(ran)
    data = dict(samples=samples, steps=steps, steps_planned=planned, steps_run=ran, initial=initial, reference=scale, user_plain=plain, wide_mlp=wide,
                user_own=own, user_params=params, mlp_params=sum(p.numel() for p in mlp.parameters()),
                plain_level=plain / scale, wide_level=wide / scale, own_level=own / scale, outputs=d_out,
                narrowest_layer=narrowest[0] if narrowest else None, narrowest_width=narrowest[1] if narrowest else None,
                bottleneck=bool(narrowest and narrowest[1] < d_out), **settings)
    after = f"{steps} steps" if len(set(ran)) == 1 else f"{ran[0]}/{ran[1]}/{ran[2]} steps (of {planned} planned)"
    plot = BarPlot("fit", f"Training loss on {samples} samples after {after}",
                   ["your model, Adam 1e-3", "wide MLP, Adam 1e-3", f"your model, your {settings['optimizer']}"],
                   [plain, wide, own], ylabel="loss")
    text = (f"on {samples} training samples after {after}: your model {plain:.4g} (Adam 1e-3), a wide MLP "
            f"{wide:.4g}, your model with your {settings['optimizer']}(lr={settings['lr']:.3g}, weight_decay="
            f"{settings['weight_decay']:.3g}) {own:.4g}; reference {scale:.4g}")
    # "fits" = below 30% of the reference (chance-level) loss. A wide MLP ending below half the user's
    # model's loss *and* 10% of the reference lower is a capacity gap, not noise between two fits,
    # even when the task is hard enough that the MLP itself has not finished fitting.
    fits = lambda v: math.isfinite(v) and v < 0.3 * scale  # noqa: E731
    wide_better = math.isfinite(wide) and (not math.isfinite(plain) or (wide < 0.5 * plain and plain - wide > 0.1 * scale))
    data["wide_better"] = wide_better
    # the model does at least as well with the user's optimizer as with plain Adam 1e-3: the rate is not its limit
    data["own_not_slower"] = math.isfinite(own) and math.isfinite(plain) and own <= plain
    if steps < wanted and not (fits(plain) and fits(own)):
        # a fit the budget shortened that has not got there says nothing about capacity
        data["wanted_steps"] = wanted
        return cannot_run(f"inconclusive at this budget ({steps} of {wanted} steps per fit): " + text, **data, reason="budget")
    if not fits(plain) and wide_better:
        return failed("too-small", "the wide MLP does far better than your model: " + text, [plot], **data)
    if fits(plain) and not fits(own) and own > 2 * plain:
        return failed("optimizer-holds-back", "your model fits with plain Adam but not with your optimizer: " + text, [plot], **data)
    if not fits(plain) and not fits(wide) and not fits(own):
        return failed("nothing-fits", "no model fits these labels: " + text, [plot], **data)
    return passed(text, artifacts=[plot], **data)
