"""Is the model still random in eval mode? ``model.eval()`` turns off ``nn.Dropout`` modules, but not
``F.dropout(x, p)`` called without ``training=self.training`` (its default is ``training=True``), nor
``F.scaled_dot_product_attention(..., dropout_p=p)`` with a ``dropout_p`` that ignores the mode, nor
noise the forward adds by hand. Such a model evaluates with units dropped: its validation loss is
worse and noisier than the model's, and two evaluations of the same weights disagree."""

from __future__ import annotations

import torch

from nnwizard.record.frames import first_line
from nnwizard.record.optrace import OpTracer
from nnwizard.probes.batch import first_tensor
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

# torch functions that drop units at random (F.dropout's family)
RANDOM_OPS = {"dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d",
              "feature_dropout"}
TOLERANCE = 1e-6   # relative difference two eval-mode forwards may show (nondeterministic kernels)


@probe(
    "eval-stochastic",
    title="Does the model in eval mode give the same output twice? (functional dropout, hand-made noise)",
    outcomes={"ok": "two eval-mode forwards of the same batch agree",
              "stochastic": "a dropout op still drops units with the model in eval mode",
              "random-by-design": "the forward samples at random in eval mode, with no dropout op active (a VAE's sampling)"},
    timeout_s=30,
    cost=1,   # two forwards without a graph (a third, traced, only when they differ): under one training step
)
def eval_stochastic(ctx: ProbeContext):
    target = ctx.target
    batch = target.batch()
    inputs = batch[0] if batch else None
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
        return skipped("needs a batch whose inputs are one tensor")
    x = inputs[: int(ctx.param("samples", 32))]
    model = target.fresh_model(ctx.seed).eval()
    outs = []
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            for seed in (1, 2):
                torch.manual_seed(seed)
                outs.append(first_tensor(model(x), x.shape[0]))
    except Exception as exc:  # the forward raising is forward-shape's finding
        return cannot_run(f"the forward pass raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    a, b = outs
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or not a.is_floating_point() or a.shape != b.shape:
        return skipped("the model's output is not a floating-point tensor to compare")
    scale = float(a.abs().max()) or 1.0
    diff = float((a - b).abs().max()) / scale
    changed = float(((a - b).abs() > TOLERANCE * scale).float().mean())
    data = dict(samples=int(x.shape[0]), relative_difference=diff, changed_share=changed, output_shape=list(a.shape))
    if diff <= TOLERANCE:
        return passed(f"in eval mode two forwards of the same {x.shape[0]} samples agree (largest relative "
                      f"difference {diff:.1e})", **data)
    found = _random_ops(model, x, user_source_files(target))
    data.update(ops=[f"{op} at {where or '?'}" + (f" in '{module}'" if module else "") for op, where, module in found][:6])
    rows = [[op, where or "?", module or "(model)"] for op, where, module in found]
    table = [Table("eval-random-ops", "Random ops that still changed their input with the model in eval mode",
                   ["op", "where", "module"], rows)] if rows else []
    head = (f"with the model in eval mode, two forwards of the same {x.shape[0]} samples differ by up to {diff:.3g} "
            f"of the output's scale ({changed:.0%} of the output values changed)")
    if found:
        op, where, module = found[0]
        fix = ("drops attention weights whatever the mode (its dropout_p is applied in eval mode too; pass "
               "dropout_p=p if self.training else 0.0)" if op == "scaled_dot_product_attention" else
               f"still drops units in eval mode (F.{op}(x, p) defaults to training=True; pass training=self.training "
               f"or use an nn.Dropout module)")
        return failed("stochastic", f"{head}: {op} at {where or '?'}" + (f" (in '{module}')" if module else "")
                      + f" {fix}", table, **data)
    # no dropout-family op: the forward samples on purpose (a VAE's reparameterisation, noise layers), not a fault
    return passed(f"{head}, but no dropout op is active: the forward draws random numbers by design (sampling), "
                  "which eval mode does not turn off", "random-by-design", **data)


def _random_ops(model, x, files) -> list[tuple[str, str | None, str]]:
    """The random ops that changed their input in one more eval-mode forward, in call order, deduplicated."""
    found: list[tuple[str, str | None, str]] = []

    def on_op(rec, func, args, out, kwargs):
        dropped = False
        if rec.op in RANDOM_OPS and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            dropped = out.shape == args[0].shape and not torch.equal(out, args[0])
        elif rec.op == "scaled_dot_product_attention":   # attention dropout: dropout_p, its 5th argument
            p = (kwargs or {}).get("dropout_p", args[4] if len(args) > 4 else 0.0)
            dropped = isinstance(p, (int, float)) and p > 0
        if dropped:
            key = (rec.op, rec.where, rec.module)
            if key not in found:
                found.append(key)

    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), OpTracer(model, files, record="all", on_op=on_op):
            model(x)
    except Exception:  # noqa: BLE001 - the untraced passes ran; a tracing failure only loses the location
        return found
    return found
