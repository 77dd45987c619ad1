"""The simplify-ladder through the user's own script (script mode, issue #10 item 4).

Module mode's ladder (probes/ladder.py) trains variants through the user's ``train_step``; a script
has no such function, so here every rung is one rerun of the real, unmodified script
(``ScriptTarget.rerun``) on a fixed subset (its first 4 DataLoader batches, in turn) with exactly one
piece replaced while it runs (wizard/script_replace.py), never in the user's file:

======================  ===============================================================  ====================
rung                    replaced at run time                                             learns -> points at
======================  ===============================================================  ====================
your setup              nothing (the subset only)                                        ok: nothing to simplify
one-hidden-layer MLP    the model's output, by a small MLP's on the same input           the model
<standard> loss         each backward, by cross-entropy (class indices) or MSE           the loss
SGD(lr=0.01, mom. 0.9)  every torch.optim class the script builds, over the same groups  the optimizer
synthetic y = x[0] > 0  the batches, by random inputs of the same shape and a known rule the data
======================  ===============================================================  ====================

A rung learns by module mode's rule (``ladder.rung_learns``) on what the rerun measured: the loss of
its first pass over the subset against its last, and the training accuracy of its last pass; the
outcome is module mode's (``ladder.ladder_outcome``). A rung that cannot run on this script (tokens
or several inputs to the model, hand-written parameter updates, batches without a DataLoader) says
why and adds no evidence; rungs cut by the budget make the result inconclusive. A script whose batch
labels go into its model's input (``Recording.label_inputs``: forward-forward overlays them on the
image) pairs no output with them: with no loss function called at all, its objective has no target
to judge a rung against, and the ladder is skipped, saying why.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from nnwizard.probes._objectives import ADVERSARIAL
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.probes.intervene import observed_curves, on_script, rerun_raised, rerun_script
from nnwizard.probes.ladder import MIN_RUNG_STEPS, majority_share, ladder_outcome, rung_learns
from nnwizard.probes._recording import fmt

SUBSET = 4          # DataLoader batches every rung cycles over
SGD_LR, SGD_MOMENTUM = 0.01, 0.9   # the known-good optimizer (module mode uses plain SGD(lr=0.01) over more steps)
STANDARD = ("cross_entropy", "mse_loss")
OPT_NAME = f"SGD(lr={SGD_LR:g}, momentum={SGD_MOMENTUM:g})"


def _window(n: int) -> int:
    """Losses averaged at the start and at the end of a rung: one pass over the subset or a tenth."""
    return max(1, min(n // 3, max(SUBSET, n // 10)))


def _judge(meter) -> dict[str, Any] | None:
    losses = meter.losses
    if len(losses) < MIN_RUNG_STEPS:
        return None
    w = _window(len(losses))
    before, after = sum(losses[:w]) / w, sum(losses[-w:]) / w
    last = meter.accuracies[-w:]
    acc = sum(last) / w if all(a is not None for a in last) else None
    labels = meter.labels[-w:]
    major = majority_share([(None, y) for y in labels]) if acc is not None and labels else None
    return dict(before=before, after=after, accuracy=acc, majority=major, steps=len(losses),
                learns=rung_learns(before, after, acc, major))


def _mlp_for(target, info, seed: int):
    """A one-hidden-layer MLP for the model's recorded input and output, with the script's optimizer
    class and settings over it (built before the rerun: the recorder never sees it), or a reason."""
    from nnwizard.probes.generalization import wide_mlp

    rec = target.recording
    inputs = [a for i, a in rec.model_inputs if i == info.index]
    if not inputs or any(len(a) != 1 or not isinstance(a[0], torch.Tensor) or not a[0].is_floating_point() for a in inputs):
        return None, "the model's input is not one float tensor (token ids or several inputs): a replacement would have to guess how to read it"
    opt = next((o for o in rec.optimizers if info.index in o.models), None)
    if opt is None:
        return None, "no torch.optim optimizer steps the model: the replacement could not be trained alongside it"
    x = inputs[0][0].to(target.device)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            model = copy.deepcopy(info.initial if info.initial is not None else info.module).to(target.device)
            out = model.eval()(x)
            if not isinstance(out, torch.Tensor):
                return None, f"the model returns {type(out).__name__}, not one tensor"
            mlp = _OutputKind(wide_mlp(x, list(out.shape), 128), _kind(out)).to(target.device)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be called outside the script
        return None, f"the captured model could not be called on its recorded input ({type(exc).__name__})"
    first = opt.optimizer.param_groups[0]
    settings = {k: v for k, v in first.items() if k not in ("params", "initial_lr")}
    lrs = rec.steps[0].lrs if rec.steps and rec.steps[0].optimizer == opt.index else []
    settings["lr"] = lrs[0] if lrs else opt.groups[0]["lr"]
    cls = type(opt.optimizer)
    try:
        optimizer = cls(mlp.parameters(), **settings)
    except Exception:  # noqa: BLE001 - settings the constructor does not take: its class and lr
        optimizer = cls(mlp.parameters(), lr=settings["lr"])
    return (mlp, optimizer, int(x[0].numel())), None


def _kind(out: torch.Tensor) -> str:
    """What the model's last op made of its output, as the loss sees it: log-probabilities or
    probabilities over dim 1 (log_softmax / softmax), values in (0, 1) (sigmoid), or raw values."""
    if out.dim() >= 2 and out.shape[1] > 1 and out.is_floating_point():
        if bool((out <= 0).all()) and torch.allclose(out.float().logsumexp(1), torch.zeros(()), atol=1e-3):
            return "log_softmax"
        if bool((out >= 0).all()) and torch.allclose(out.float().sum(1), torch.ones(()), atol=1e-3):
            return "softmax"
    if out.is_floating_point() and out.numel() and bool(((out > 0) & (out < 1)).all()):
        return "sigmoid"
    return "raw"


class _OutputKind(nn.Module):
    """The replacement MLP with the same last op as the script's model (a log_softmax model's NLL
    loss needs log-probabilities from its replacement too)."""

    def __init__(self, mlp: nn.Module, kind: str):
        super().__init__()
        self.mlp, self.kind = mlp, kind

    def forward(self, x):
        out = self.mlp(x)
        if self.kind == "log_softmax":
            return out.log_softmax(1)
        if self.kind == "softmax":
            return out.softmax(1)
        return out.sigmoid() if self.kind == "sigmoid" else out


def _already_standard(target) -> bool:
    """The script's loss is one plain F.cross_entropy / F.mse_loss call, backwarded as it is."""
    call = target.loss_call
    if call is None or call.fn not in STANDARD or call.reduction != "mean" or call.replay is None:
        return False
    _, extra, kwargs = call.replay
    if extra or any(k != "reduction" for k in kwargs):
        return False
    steps = [s for s in target.recording.steps if s.loss is not None]
    return bool(steps) and all(s.loss_calls == 1 and s.loss_call_mean is not None
                               and abs(s.loss - s.loss_call_mean) <= 1e-6 * max(1.0, abs(s.loss)) for s in steps)


@probe(
    "script-ladder",
    title="Simplify-ladder through the script: its model, loss, optimizer or data replaced while it runs",
    outcomes={"ok": "the script's own setup learns the subset: nothing to simplify",
              "data": "the script's model and loop learn a known rule, but not its data",
              "model": "a one-hidden-layer MLP learns the data through the script's loop; the script's model does not",
              "loss": "the script's setup learns once its loss is replaced by the standard one",
              "optimizer": "the script's setup learns once its optimizer is replaced by SGD(lr=0.01, momentum=0.9)",
              "loop": "nothing learns through the script's loop, not even a plain MLP or a known rule", **ADVERSARIAL},
    timeout_s=180,
    share=0.4,
)
@on_script
def script_ladder(ctx: ProbeContext, target):
    from nnwizard.script_replace import Meter, Subset, SwapLoss, SwapModel, SwapOptimizer

    rec = target.recording
    info = target.model_info
    if not rec.steps or info is None:
        return skipped("the script trained no model to simplify")
    objs, skip = observed_curves(target)   # a rung judges whether the loss falls: an adversarial objective's need not
    if skip is not None:
        return skip
    if objs.several:       # a rung swaps one model, loss or optimizer and reads one loss curve
        return skipped(f"{objs.text}: a rung replaces one model, loss or optimizer and judges one loss curve, so the "
                       f"ladder does not apply to several objectives", objectives=objs.text)
    if not rec.loaders and not target.feeds_one_batch:
        return cannot_run("the script feeds its model without a DataLoader and with inputs that change from step to "
                          "step: no fixed subset for the rungs to share", reason="precondition")
    observed = [s for s in rec.steps if s.loss is not None]
    fed = info.index in rec.label_inputs   # the batch's labels went into the model's input: no target to pair with
    if fed and observed and not any(s.loss_calls for s in observed):
        where = rec.label_inputs[info.index]
        return skipped(f"the script's objective has no target: no training step calls a loss function, and the "
                       f"batch's labels go into {info.name}'s input{f' ({where})' if where else ''}, as in "
                       f"forward-forward training or a model conditioned on its label; the ladder would judge each "
                       f"rung by accuracy against those labels and swap the loss for a standard one against them, "
                       f"which measures nothing here", labels_in_input=where or True)
    wanted = int(ctx.param("steps", 40))
    if target.run.exit == "finished" and len(observed) < wanted and not rec.capped_training:
        wanted = len(observed)   # the script ends by itself after this many (not because the batch cap ended its epochs)
    if wanted < MIN_RUNG_STEPS:
        return cannot_run(f"the script takes only {wanted} optimizer steps: fewer than the {MIN_RUNG_STEPS} a rung needs",
                          reason="precondition")
    steps = ctx.plan_steps(wanted, minimum=MIN_RUNG_STEPS, runs=5, fixed=5 * target.rerun_cost(0))
    if not steps:
        return ctx.unaffordable(MIN_RUNG_STEPS, "rerun steps each of its five rungs needs", wanted=wanted)
    task, seed = target.task, ctx.seed
    rows: list[list] = []
    results: dict[str, bool] = {}
    measured: dict[str, dict] = {}
    reruns = [0]

    def rung(piece: str, name: str, replaces: str, points: str, listeners=(), patches=(), synthetic=False,
             problem=lambda: None, meter=None):
        if ctx.time_left() < 2 + target.rerun_cost(steps) * (target.measured_step_s or 0.05):
            rows.append([name, replaces, "not run (time)", "", ""])
            return
        meter = meter or Meter(info.index, info.name, task, labels_fed=fed)
        subset = Subset(SUBSET, task, seed, synthetic=synthetic) if rec.loaders else None
        run = rerun_script(ctx, target, steps, replace_batch=subset, listeners=[*listeners, meter],
                     patches=[*patches, meter], limit_batches=max(2 * steps, 20), what=f"simplify-ladder: {name}")
        reruns[0] += 1
        why = problem() or (subset.problem if subset is not None else None)
        judged = _judge(meter)
        if why is not None:
            rows.append([name, replaces, "not run", why, ""])
            return
        if judged is None:
            error = rerun_raised(run)
            rows.append([name, replaces, "not run", (f"the rerun raised: {error}" if error else
                         f"the rerun took {len(meter.losses)} backward passes, fewer than {MIN_RUNG_STEPS}")[:160], ""])
            return
        learned = judged["learns"]
        results[piece], measured[piece] = learned, judged
        acc = f", accuracy {judged['accuracy']:.0%}" if judged["accuracy"] is not None else ""
        rows.append([name, replaces, "learns" if learned else "does not learn",
                     f"{fmt(judged['before'])} -> {fmt(judged['after'])}{acc}", points if learned else ""])

    columns = ["rung", "replaces", "result", "loss (accuracy)", "what that rules out"]
    rung("setup", "your setup", "nothing", "nothing is broken at this scale")
    if results.get("setup"):
        rows[0][4] = "nothing to simplify at this scale"
        return passed(f"your setup learns its first {SUBSET} batches in {steps} rerun steps: {rows[0][3]}; nothing to "
                      f"simplify (1 rerun)", "ok", [Table("script-ladder", "Simplify-ladder (reruns of the script)", columns, rows)],
                      rungs={r[0]: r[2] for r in rows}, steps=steps, reruns=1)
    if rows[0][2] != "does not learn":
        return cannot_run(f"the script rerun on its first {SUBSET} batches could not be measured: {rows[0][2]} {rows[0][3]}".strip(),
                          reason="budget" if "time" in rows[0][2] else "precondition", rungs={r[0]: r[2] for r in rows})
    # the model
    made, why = _mlp_for(target, info, seed)
    if made is None:
        rows.append(["one-hidden-layer MLP", "the model", "not run", why, ""])
    else:
        swap = SwapModel(info.index, info.name, *made)
        rung("model", "one-hidden-layer MLP", "the model", "the data and the loop", listeners=[swap], patches=[swap],
             problem=lambda: (swap.problem or "the script never stepped the model's optimizer")
             if not swap.replaced or not swap.steps else None)
    # the loss
    if _already_standard(target):
        rows.append(["standard loss", "the loss", "not run", f"the script's loss is already a plain {target.loss_call.fn}", ""])
    else:
        meter = Meter(info.index, info.name, task, labels_fed=fed)
        swap_loss = SwapLoss(meter)
        rung("loss", "standard loss", "the loss", "the model, data and loop: the loss is at fault", patches=[swap_loss], meter=meter,
             problem=lambda: (swap_loss.problem or "no backward reached") if not swap_loss.used else None)
        if swap_loss.used and rows[-1][0] == "standard loss":
            rows[-1][0] = " / ".join(swap_loss.used) + " loss"
    # the optimizer
    if not rec.optimizers:
        rows.append([OPT_NAME, "the optimizer", "not run", "the script updates its parameters by hand (no torch.optim)", ""])
    else:
        opt_swap = SwapOptimizer(SGD_LR, SGD_MOMENTUM)
        rung("optimizer", OPT_NAME, "the optimizer", "the model, data and loss: the optimizer settings are at fault", patches=[opt_swap],
             problem=lambda: None if opt_swap.replaced else "the script built no torch.optim optimizer that could be replaced")
    # the data
    if not rec.loaders:
        rows.append(["synthetic y = x[0] > 0", "the data", "not run", "the script feeds tensors without a DataLoader", ""])
    else:
        rung("data", "synthetic y = x[0] > 0", "the data", "the model and the loop", synthetic=True)
    return _verdict(target, rows, results, measured, steps, wanted, reruns[0])


def _verdict(target, rows, results, measured, steps, wanted, reruns):
    table = Table("script-ladder", "Simplify-ladder: reruns of the script, one piece replaced in each",
                  ["rung", "replaces", "result", "loss (accuracy)", "what that rules out"], rows,
                  marked=[i for i, r in enumerate(rows) if r[2] == "learns"])
    line = "; ".join(f"{r[0]}: {r[2]}" + (f" ({r[3]})" if r[3] else "") for r in rows)
    opt = target.recording.optimizers[0] if target.recording.optimizers else None
    first = opt.groups[0] if opt is not None and opt.groups else {}
    data: dict[str, Any] = dict(rungs={r[0]: r[2] for r in rows}, steps=steps, wanted_steps=wanted, reruns=reruns,
                                measured=measured, user_lr=float(first.get("lr", math.nan)),
                                user_weight_decay=float(first.get("weight_decay", 0.0) or 0.0),
                                user_optimizer=opt.name if opt is not None else "none",
                                summary_table=[" | ".join(map(str, r[:4])) for r in rows], line=line)
    outcome = ladder_outcome(results)
    unrun = [r[0] for r in rows if r[2] == "not run (time)"]
    if steps < wanted or unrun:
        why = f"{steps} of {wanted} steps per rung (budget)" if steps < wanted else f"rungs not run: {', '.join(unrun)}"
        return cannot_run(f"inconclusive at this budget ({why}): {line}", **data, reason="budget")
    if outcome == "loop" and "model" not in results and "data" not in results:
        return cannot_run(f"no rung that replaces the model or the data could run, so the loop cannot be told apart: {line}",
                          reason="precondition", **data)
    head = f"{reruns} reruns of {steps} steps on the script's first {SUBSET} batches"
    if outcome == "optimizer":
        data["direction"] = "lower" if data["user_lr"] > SGD_LR else "higher"
    text = {"loss": "only replacing the loss makes it learn",
            "optimizer": f"replacing the optimizer by {OPT_NAME} makes it learn",
            "loop": "nothing learns through the script's loop",
            "data": "the script's model and loop learn a known rule but no model learns its data",
            "model": "a one-hidden-layer MLP learns the data through the script's loop; its own model does not"}[outcome]
    return failed(outcome, f"{head}: {text}: {line}", [table], **data)
