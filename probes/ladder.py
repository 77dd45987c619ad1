"""The simplify-ladder: when nothing works, change one thing at a time and see what starts to learn.

Every rung trains for the same number of steps on the user's data (a fixed subset), through the
user's own step (or epoch) function, with exactly one piece replaced:

====================  ===========================================  ==================================
rung                  replaces                                     learns -> rules out
====================  ===========================================  ==================================
your setup            nothing (baseline)                           (nothing is broken at this scale)
one-hidden-layer MLP  the model                                    the data and the loop
100-sample subset     the data size (overfit 100 samples)          labels/loop bugs that stop memorising
MSE loss              the loss (MSE on one-hot / raw targets)      the loop and the model
SGD(lr=0.01)          the optimizer                                the model, data and loss
synthetic y=x[0]>0    the data (a known rule, user's input shape)  the model and the loop
====================  ===========================================  ==================================

The outcome names the layer that the rungs point at: data, model or loop (with loss and optimizer
as the two parts of the loop that a single rung isolates).
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nnwizard import reference
from nnwizard.record.frames import first_line
from nnwizard.probes.api import Table, cannot_run, failed, passed, probe, skipped
from nnwizard.probes.generalization import wide_mlp

# A rung "learns" when its eval-mode training accuracy ends 30 points above the majority class
# (capped at 90%) with its loss at least 20% down, or, without an accuracy (regression), when its
# loss ends below half of where it
# started. The 100-sample rung is a memorisation test: 99% accuracy, or a fifth of its start. A healthy model on a learnable subset
# passes both within a couple of hundred steps; a broken piece leaves the loss near its start.
LEARN_RATIO, OVERFIT_RATIO = 0.5, 0.2
MIN_RUNG_STEPS = 30


def _mse_for(task: str, num_classes: int | None):
    mse = nn.MSELoss()

    def loss(outputs, targets):
        if task == "classification" and outputs.dim() == 2 and not targets.is_floating_point():
            return mse(outputs, nn.functional.one_hot(targets.long(), outputs.shape[1]).float())
        return mse(outputs.float(), targets.float().reshape(outputs.shape) if targets.numel() == outputs.numel() else targets.float())

    return loss


def synthetic_batches(batches, task: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for x, y in batches:
        xs = torch.randn(x.shape, generator=g).to(x.device, x.dtype)
        rule = xs.reshape(len(xs), -1)[:, 0] > 0
        if task == "classification":
            ys = rule.long()
        else:
            ys = rule.float().reshape(-1, *([1] * (y.dim() - 1))).expand_as(y).clone() if y.dim() > 1 else rule.float()
        out.append((xs, ys.to(y.device)))
    return out


def _subset(batches, n: int):
    out, left = [], n
    for x, y in batches:
        if left <= 0:
            break
        out.append((x[:left], y[:left]))
        left -= len(y)
    return out


def _evaluate(model, batches, loss_fn, task) -> tuple[float, float | None]:
    model.eval()
    with torch.no_grad():
        losses, accs = [], []
        for x, y in batches:
            out = model(x)
            losses.append(reference.as_float(loss_fn(out, y)))
            acc = reference.accuracy(out, y, task) if isinstance(out, torch.Tensor) else None
            if acc is not None:
                accs.append(acc)
    model.train()
    return sum(losses) / len(losses), (sum(accs) / len(accs) if accs else None)


def _train(target, model, batches, loss_fn, optimizer, steps: int, deadline: float) -> None:
    """Steps through the user's own step (or epoch) function with the given loss."""
    if target.user_train_step or not target.user_train_epoch:
        step = target.user_train_step or reference.train_step
        for i in range(steps):
            value = reference.as_float(step(model, batches[i % len(batches)], loss_fn, optimizer))
            if math.isinf(value) or time.monotonic() > deadline:  # NaN may just be a step returning None
                break
    else:
        for _ in range(max(1, steps // len(batches))):
            target.user_train_epoch(model, _as_loader(batches), loss_fn, optimizer, reference.NoScheduler())
            if time.monotonic() > deadline:
                break


def _as_loader(batches) -> DataLoader:
    """The rung's batches as a real DataLoader (its ``dataset`` and ``len`` are what a user
    ``train_epoch`` may read), in order, with the same batch size."""
    xs, ys = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    return DataLoader(TensorDataset(xs, ys), batch_size=len(batches[0][1]), shuffle=False)


def majority_share(batches) -> float | None:
    ys = torch.cat([y.reshape(-1).float() for _, y in batches])
    if ys.numel() == 0:
        return None
    _, counts = torch.unique(ys, return_counts=True)
    return float(counts.max()) / ys.numel()


@probe(
    "simplify-ladder",
    title="Simplify one piece at a time (model, data size, loss, optimizer, data) and see what learns",
    outcomes={"ok": "the user's own setup learns the subset: nothing to simplify",
              "data": "the model and loop learn a known rule, but not the user's data",
              "model": "another model learns the user's data through the user's loop; the user's model does not",
              "loss": "the user's setup learns once the loss is replaced by MSE",
              "optimizer": "the user's setup learns once the optimizer is replaced by SGD(lr=0.01)",
              "loop": "nothing learns through the user's loop, not even a plain MLP or a known rule"},
    timeout_s=90,
    share=0.2,
    floor=6 * MIN_RUNG_STEPS + 6 * 3,
)
def simplify_ladder(ctx):
    target = ctx.target
    wanted = int(ctx.param("steps", 120))
    # six rungs, each evaluated before and after on its batches (about three steps' worth)
    steps = ctx.plan_steps(wanted, minimum=MIN_RUNG_STEPS, runs=6, fixed=6 * 3)
    if not steps:
        return ctx.unaffordable(MIN_RUNG_STEPS, "steps each of its six rungs needs", wanted=wanted)
    batches = target.batches(int(ctx.param("batches", 4)))
    if not batches or not isinstance(batches[0][0], torch.Tensor):
        return skipped("the batches are not (tensor, tensor) pairs")
    float_inputs = batches[0][0].is_floating_point()
    task = target.task
    # a budget for all rungs together, the most telling rungs first: a rung that does not fit is
    # shown as "not run (time)"
    budget_s = float(ctx.param("budget_s", 3.0))
    if steps < wanted and ctx.allowance_s is not None:
        budget_s = max(budget_s, 0.9 * ctx.allowance_s)
    deadline = time.monotonic() + min(ctx.time_left() - 1, budget_s)
    rows, results = [], {}
    with torch.no_grad():
        out_shape = list(target.fresh_model(ctx.seed).eval()(batches[0][0]).shape)

    def rung(name, replaced, rules_out, make_model, data, loss_fn, make_opt, ratio=LEARN_RATIO):
        if time.monotonic() > deadline:
            rows.append([name, replaced, "not run (time)", "", ""])
            return
        try:
            torch.manual_seed(ctx.seed)
            model = make_model()
            optimizer = make_opt(model)
            before, _ = _evaluate(model, data, loss_fn, task)
            _train(target, model, data, loss_fn, optimizer, steps, deadline)
            after, acc = _evaluate(model, data, loss_fn, task)
        except Exception as exc:  # noqa: BLE001 - a rung that raises did not learn
            rows.append([name, replaced, "raised", first_line(exc)[:80], ""])
            results[name] = False
            return
        major = majority_share(data) if task != "regression" else None
        learned = rung_learns(before, after, acc, major, ratio)
        results[name] = learned
        acc_text = f", accuracy {acc:.0%}" if acc is not None else ""
        rows.append([name, replaced, "learns" if learned else "does not learn", f"{before:.4g} -> {after:.4g}{acc_text}",
                     rules_out if learned else ""])

    user_model = lambda: target.fresh_model(ctx.seed)  # noqa: E731
    mlp = lambda: wide_mlp(batches[0][0], out_shape, 128).to(target.device)  # noqa: E731
    rung("your setup", "nothing", "nothing is broken at this scale", user_model, batches, target.loss_fn, target.make_optimizer)
    if results.get("your setup"):  # the user's own setup learns: there is nothing to simplify
        rows[0][4] = "nothing to simplify at this scale"
        table = Table("ladder", "Simplify-ladder", ["rung", "replaces", "result", "loss (accuracy)", "what that rules out"], rows)
        return passed(f"your setup learns {sum(len(b[1]) for b in batches)} samples in {steps} steps: {rows[0][3]}; "
                      f"nothing to simplify", "ok", [table], rungs={rows[0][0]: rows[0][2]}, steps=steps)
    if float_inputs:
        rung("one-hidden-layer MLP", "the model", "the data and the loop", mlp, batches, target.loss_fn, target.make_optimizer)
        rung("synthetic y = x[0] > 0", "the data", "the model and the loop", user_model, synthetic_batches(batches, task, ctx.seed),
             target.loss_fn, target.make_optimizer)
    if task != "regression" or not isinstance(target.loss_fn, nn.MSELoss):
        rung("MSE loss", "the loss", "the loss choice", user_model, batches, _mse_for(task, target.num_classes), target.make_optimizer)
    rung("SGD(lr=0.01)", "the optimizer", "the optimizer settings", user_model, batches, target.loss_fn,
         lambda m: torch.optim.SGD(m.parameters(), lr=0.01))
    rung("100-sample subset", "data size", "labels or loop bugs that stop memorising", user_model, _subset(batches, 100),
         target.loss_fn, target.make_optimizer, OVERFIT_RATIO)
    table = Table("ladder", "Simplify-ladder (each rung replaces one piece)",
                  ["rung", "replaces", "result", "loss (accuracy)", "what that rules out"], rows,
                  marked=[i for i, r in enumerate(rows) if r[2] == "learns" and i > 0])
    group = target.make_optimizer(target.fresh_model(ctx.seed)).param_groups[0]
    data = dict(rungs={r[0]: r[2] for r in rows}, steps=steps, user_lr=float(group.get("lr", math.nan)),
                user_weight_decay=float(group.get("weight_decay", 0.0) or 0.0), user_optimizer=type(target.make_optimizer(target.fresh_model(ctx.seed))).__name__,
                summary_table=[" | ".join(map(str, r[:4])) for r in rows])
    line = "; ".join(f"{r[0]}: {r[2]}" for r in rows)
    pieces = {"setup": "your setup", "model": "one-hidden-layer MLP", "data": "synthetic y = x[0] > 0",
              "loss": "MSE loss", "optimizer": "SGD(lr=0.01)", "subset": "100-sample subset"}
    outcome = ladder_outcome({piece: results.get(name, False) for piece, name in pieces.items()})
    if outcome == "ok":
        return passed(f"your setup learns {sum(len(b[1]) for b in batches)} samples in {steps} steps: {line}", "ok", [table], **data)
    unrun = [r[0] for r in rows if r[2] == "not run (time)"]
    if steps < wanted or unrun:
        # every outcome but "ok" rests on rungs that did not learn: with fewer steps than the rungs are
        # calibrated for, or rungs left out, "does not learn" may only mean "not yet"
        why = f"{steps} of {wanted} steps per rung (budget)" if steps < wanted else f"rungs not run: {', '.join(unrun)}"
        data.update(wanted_steps=wanted, not_run=unrun)
        return cannot_run(f"inconclusive at this budget ({why}): {line}", **data, reason="budget")
    if outcome == "optimizer":
        data["direction"] = "lower" if data["user_lr"] > 0.01 else "higher"
    loop = 'your train_step' if target.user_train_step else 'your train_epoch' if target.user_train_epoch else 'the loop'
    text = {"loss": "only replacing the loss makes it learn",
            "optimizer": "replacing the optimizer by SGD(lr=0.01) makes it learn",
            "loop": f"nothing learns through {loop}",
            "data": ("your model and loop learn a known rule but no model learns your data" if results.get(pieces["data"])
                     else "only memorising 100 samples works"),
            "model": "a one-hidden-layer MLP learns your data through your loop; your model does not"}[outcome]
    return failed(outcome, f"{text}: {line}", [table], **data)


def rung_learns(before: float, after: float, accuracy: float | None, majority: float | None,
                ratio: float = LEARN_RATIO) -> bool:
    """Whether a rung learnt (module and script mode share this rule): with an accuracy, 30 points above
    always-the-majority-class (capped at 90%; 99% for a memorisation rung, ``ratio`` below LEARN_RATIO)
    with the loss at least 20% down; without one (regression), the loss ending below ``ratio`` of its start.
    A start that is not a positive number (a loss that can go negative) gives no ratio to read: not learnt."""
    if not (math.isfinite(before) and before > 0):
        return False
    if accuracy is not None and majority is not None:
        return accuracy >= (0.99 if ratio < LEARN_RATIO else min(0.9, majority + 0.3)) and after <= 0.8 * before
    return math.isfinite(after) and after <= ratio * before


def ladder_outcome(learns: dict[str, bool]) -> str:
    """The layer the rungs point at (module and script mode share it). ``learns`` maps each replaced
    piece that ran (setup, model, data, loss, optimizer, subset) to whether its rung learnt."""
    got = lambda piece: bool(learns.get(piece))  # noqa: E731
    if got("setup"):
        return "ok"
    if got("loss") and not got("model"):
        return "loss"
    if got("optimizer"):
        return "optimizer"
    if not (got("model") or got("data") or got("subset")):
        return "loop"
    if got("data") and not got("model"):
        return "data"
    return "model" if got("model") else "data"
