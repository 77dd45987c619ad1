"""The fix in the program's own terms.

The catalog's fix is general ("lower the learning rate by 3 to 10x"). Where the run tells more, a
hypothesis also gets ``fix_here``: which optimizer, built on which line of the user's script, at which
rate, and the rate the reruns measured better; the line of the evaluation that needs ``torch.no_grad()``
or ``model.eval()``; the loss whose backward needs a ``zero_grad()`` before it. Every number and line
comes from this run (the recording of a script, the probes' data); nothing is said where they are
missing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from nnwizard.probes.api import ProbeResult


def tailor(diagnosis) -> None:
    results = {r.id: r for r in diagnosis.results}
    rec = getattr(diagnosis.target, "recording", None)
    framework = _framework(diagnosis.target, rec)
    for h in diagnosis.ranked:
        make = TAILORS.get(h.id)
        if make is None:
            continue
        try:
            h.fix_here = make(results, rec) or ""
            special = FRAMEWORK_TAILORS.get(h.id) if framework is not None else None
            if special is not None:   # the optimizer, its rate or the loop belong to Lightning / transformers
                h.fix_here = special(framework, results, rec) or h.fix_here
        except Exception:  # noqa: BLE001 - a sentence that cannot be made is left out, never the report
            h.fix_here = ""


def _framework(target, rec):
    """The framework that owns the script's optimizer or loop (wizard/frameworks.py), or None."""
    script = getattr(target, "script", None)
    if rec is None or script is None:
        return None
    from nnwizard.frameworks import detect

    files = list(script.files) + list(getattr(getattr(target, "run", None), "own_files", []) or [])
    try:
        return detect(rec, files)
    except Exception:  # noqa: BLE001 - no framework sentence rather than no fix
        return None


def _g(x: float) -> str:
    return f"{x:.3g}"


def _describe(info) -> str:
    """An optimizer as the fix names it: its class and the line that built it."""
    return f"`{info.name}`" + (f" (built at {info.where})" if info.where else "")


def _optimizer(rec) -> tuple[str, list[float]] | None:
    """The first optimizer's description and its groups' rates."""
    if rec is None or not getattr(rec, "optimizers", None):
        return None
    info = rec.optimizers[0]
    lrs = [float(g["lr"]) for g in info.groups if isinstance(g.get("lr"), (int, float))]
    return _describe(info), lrs


def _measured_lr(results: dict[str, ProbeResult], outcome: str) -> tuple[float, float, str] | None:
    """(configured lr, the lr the sweep measured better, its probe) from an lr sweep that concluded ``outcome``."""
    for pid in ("script-lr-sweep", "lr-sweep"):
        r = results.get(pid)
        if r is None or r.status != "failed" or r.outcome != outcome:
            continue
        lr, best = r.data.get("lr"), r.data.get("best_lr")
        if isinstance(lr, (int, float)) and isinstance(best, (int, float)) and lr > 0 and best > 0 and best != lr:
            return float(lr), float(best), pid
    return None


def _rates(results: dict[str, ProbeResult], rec, direction: str):
    """(the optimizer's rates, the rate in use, the rate to set, the sweep's measurement or None)."""
    outcome, factor = ("too-high", 0.1) if direction == "high" else ("too-low", 10.0)
    opt, measured = _optimizer(rec), _measured_lr(results, outcome)
    lrs = opt[1] if opt is not None else []
    lr = measured[0] if measured else (lrs[0] if lrs else None)
    if lr is None:
        return None
    return lrs, lr, (measured[1] if measured else lr * factor), measured


def _framework_lr(direction: str) -> Callable:
    def make(framework, results: dict[str, ProbeResult], rec) -> str:
        from nnwizard.frameworks import rate_fix

        rates = _rates(results, rec, direction)
        if rates is None or len(set(rates[0])) > 1:
            return ""
        _, lr, best, measured = rates
        said = f"; the reruns ({measured[2]}) measured lr {_g(best)} (x{_g(best / lr)}) better" if measured else None
        return rate_fix(framework, lr, best, said)
    return make


def _framework_eval_mode(framework, results, rec) -> str:
    if framework.name != "lightning":
        return ""
    from nnwizard.frameworks import eval_mode_fix

    return eval_mode_fix(framework, _sites(rec, lambda c: c.eval and c.training) or "validation_step")


def _lr(direction: str) -> Callable:
    def make(results: dict[str, ProbeResult], rec) -> str:
        rates = _rates(results, rec, direction)
        if rates is None:
            return ""
        lrs, lr, best, measured = rates
        if _optimizer(rec) is None and rec is not None:   # a script that updates its parameters by hand (no torch.optim)
            what = "the hand-written update"
        else:
            what = _optimizer(rec)[0] if _optimizer(rec) is not None else "the optimizer `build_optimizer` returns"   # (module mode)
        rates_text = f"lr {_g(lr)}" if len(set(lrs)) <= 1 else "its groups' rates " + ", ".join(map(_g, lrs))
        scale = best / lr
        head = (f"{what} runs at {rates_text}; the reruns ({measured[2]}) measured lr {_g(best)} (x{_g(scale)}) better"
                if measured else f"{what} runs at {rates_text}")
        if len(set(lrs)) > 1:
            return f"{head}: scale each group's rate by {_g(scale)} there."
        return f"{head}: set `lr={_g(best)}` there" + ("." if measured else ", then diagnose again to measure it.")
    return make


def _sites(rec, keep: Callable[[Any], bool]) -> str:
    """The lines of the recorded loss calls ``keep`` picks, most frequent first ('main.py:88 in test()'); '' without
    a recording (module mode)."""
    if rec is None:
        return ""
    counts = Counter(c.where for c in rec.loss_calls if c.where and keep(c))
    return ", ".join(w for w, _ in counts.most_common(2))


def _evaluation(rec) -> str:
    return _sites(rec, lambda c: c.eval)


def _training(rec) -> str:
    return _sites(rec, lambda c: not c.eval)


def _no_grad(results, rec) -> str:
    fixed = results.get("trace-eval-grad")
    if rec is not None and fixed is not None and fixed.outcome == "grad-into-fixed-model":
        models = [m for m in fixed.data.get("models", []) if m < len(rec.models)]
        names = ", ".join(rec.models[m].name for m in models)
        holders = {o.index for o in rec.optimizers if set(o.models) & set(models)}
        done = max((k for k, st in enumerate(rec.steps) if st.optimizer in holders), default=-1)   # their last step
        site = _sites(rec, lambda c: not c.eval and c.step > done)
        return (f"run {names}'s forward in the training whose loss is computed at {site} under `with torch.no_grad():` "
                f"(or call `requires_grad_(False)` on it): nothing steps its parameters there." if names and site else "")
    site = _sites(rec, lambda c: c.eval and c.grad_enabled)
    return f"run the evaluation whose loss is computed at {site} under `with torch.no_grad():`." if site else ""


def _eval_mode(results, rec) -> str:
    site = _sites(rec, lambda c: c.eval and c.training)
    return (f"call `model.eval()` before the evaluation whose loss is computed at {site}, and `model.train()` "
            f"after it." if site else "")


def _train_mode(results, rec) -> str:
    site = _sites(rec, lambda c: not c.eval and c.training is False)
    if not site:
        return ""
    after = _evaluation(rec)
    return (f"call `model.train()` at the start of each training pass (its loss at {site})"
            + (f": the evaluation at {after} leaves the model in eval mode." if after else "."))


def _zero_grad(results, rec) -> str:
    opt, site = _optimizer(rec), _training(rec)
    if opt is None or not site:
        return ""
    return f"call `zero_grad()` on {opt[0]} before the backward of the loss computed at {site}."


def _zero_grad_order(results, rec) -> str:
    opt, site = _optimizer(rec), _training(rec)
    if opt is None or not site:
        return ""
    return (f"keep this order at every step: `zero_grad()` on {opt[0]}, then the backward of the loss computed at "
            f"{site}, then `step()`.")


def _missing_params(results, rec) -> str:
    r, opt = results.get("trace-optimizer"), _optimizer(rec)
    if r is None or r.outcome != "missing" or opt is None or not r.data.get("missing_modules"):
        return ""
    return (f"{opt[0]} does not hold {r.data['missing_modules']}: build it over the whole model's `parameters()` there "
            f"(or add a parameter group for them).")


def _double_softmax(results, rec) -> str:
    calls = [c for c in rec.loss_calls if not c.eval and c.where] if rec is not None else []
    if not calls:
        return ""
    fn = Counter(c.fn for c in calls).most_common(1)[0][0]
    return (f"give `{fn}` at {_training(rec)} the model's raw outputs (logits): it applies its own (log-)softmax, so "
            f"drop the softmax before it.")


def _target_detach(results, rec) -> str:
    r = results.get("trace-loss-target")
    if r is None or r.outcome != "target-carries-grad" or not r.data.get("where"):
        return ""
    return (f"compute the target passed to `{r.data.get('fn', 'the loss')}` at {r.data['where']} under "
            f"`with torch.no_grad():` (or `.detach()` it).")


def _missing_step(results, rec) -> str:
    idle = [o for o in rec.optimizers if not o.steps] if rec is not None else []
    site = _training(rec)
    if not idle or not site:
        return ""
    return f"{_describe(idle[0])} is never stepped: call its `step()` after the backward of the loss computed at {site}."


def _scheduler(results, rec) -> str:
    r = results.get("trace-scheduler")
    if r is None or rec is None or not rec.schedulers or r.outcome not in ("per-step-for-per-epoch", "per-epoch-for-per-step"):
        return ""
    entry = rec.schedulers[0]
    name, site = entry["name"], entry.get("where")
    at = f" (at {site})" if site else ""
    if r.outcome == "per-step-for-per-epoch":
        return (f"`{name}` is stepped after every batch{at}, but it counts epochs: call its `step()` once per epoch, "
                f"after the batch loop.")
    return f"`{name}` is stepped once per epoch{at}, but it is a per-iteration schedule: call its `step()` after every `optimizer.step()`."


def _graph_kept(results, rec) -> str:
    kept = getattr(rec, "graph_kept", None) if rec is not None else None
    if not kept:
        return ""
    return (f"the value kept at {kept[0]} is the loss tensor itself, so every step's graph stays alive: keep "
            f"`loss.item()` there (or `loss.detach()` for a tensor).")


def _clip(results, rec) -> str:
    stale = [c for c in rec.clips if not c.fresh and c.where] if rec is not None and getattr(rec, "clips", None) else []
    if not stale:
        return ""
    c = stale[0]
    return (f"`{c.fn}` at {c.where} runs where no fresh gradient is waiting (after `optimizer.step()` or "
            f"`zero_grad()`): call it between `loss.backward()` and `optimizer.step()`.")


def _probe_fix(*probes: str) -> Callable:
    """The fix a probe measured in the program's own terms (its ``fix_here``): the cross-rank audits."""
    def make(results: dict[str, ProbeResult], rec) -> str:
        for pid in probes:
            r = results.get(pid)
            if r is not None and r.status == "failed" and r.data.get("fix_here"):
                return str(r.data["fix_here"])
        return ""
    return make


# what to change at the line grad-path names, by what stopped the gradient there
_GRAD_FIXES = {
    "cut": "keep the tensor in the graph there: compute the loss from the model's output tensor itself, with torch "
           "ops only (no `.item()`, `.tolist()`, `.numpy()`, `.detach()`, `.data`, `torch.tensor(...)` of its values, "
           "argmax or an integer cast before the loss); to gather per-sample outputs use `torch.stack(outputs)` or "
           "`torch.cat`",
    "softmax-size1": "a softmax over a dimension of size 1 is exactly 1 for every sample: with one output unit use "
                     "`torch.sigmoid` (or `BCEWithLogitsLoss` on the raw output), with several normalise `dim=-1`",
    "relu-dead": "every unit of that ReLU is 0 for every sample: look at the layer before it (its bias or inputs "
                 "far below zero), lower the learning rate, or use LeakyReLU",
    "clamp-saturated": "every value reaching that clamp lies beyond its bounds, so nothing passes back: widen or "
                       "remove the clamp, or fix the scale of what it receives",
    "squash-saturated": "every value there sits in the flat tails of the sigmoid/tanh: scale down what reaches it "
                        "(initialisation, input normalisation) or give the loss the raw logits",
    "softmax-saturated": "the softmax there gives one-hot rows, whose gradient is 0: scale its input down (a "
                         "temperature) or give the loss the logits",
    "step-function": "the gradient of a step function (round, floor, sign) is 0 everywhere: give the loss the "
                     "unrounded values and round only where the metric is computed",
    "constant-output": "the model gives every sample the same output: follow the input through `forward`, each layer "
                       "must take the previous one's output",
}


def _grad_path(results, rec) -> str:
    r = results.get("grad-path")
    if r is None or r.status != "failed":
        return ""
    cause, where, op = r.data.get("cause"), r.data.get("where"), r.data.get("op")
    fix = _GRAD_FIXES.get("cut" if cause == "cut" else cause)
    if fix is None or not where or where == "?":
        return ""
    restart = r.data.get("restart_where")
    also = f" (the loss's graph then starts again at {restart}: remove that re-wrapping too)" if restart and restart != "?" else ""
    return f"at {where} (`{op}`){also}: {fix}."


def _tensor_list(results, rec) -> str:
    for pid in ("trace-crash", "training-crash"):
        r = results.get(pid)
        if r is None or r.status != "failed" or r.data.get("kind") != "tensor-list":
            continue
        at = f" at {r.data['where']}" if r.data.get("where") else ""
        name = r.data.get("subject") or "the list"
        return (f"`torch.tensor(...)`{at} is given tensors, which it can only copy as numbers: build the tensor "
                f"with `torch.stack({name})` (or `torch.cat`), which keeps their graph.")
    return ""


def _metric(results, rec) -> str:
    r = results.get("script-metric-audit")
    if r is None or r.status != "failed":
        return ""
    where = r.data.get("compare_where")
    if r.outcome == "fixed" and where and where != "?" and r.data.get("compare_scores"):
        return (f"the comparison at {where} compares scores with labels: compare predicted classes, e.g. "
                f"`(torch.sigmoid(out) > 0.5).float() == y` for one output, `out.argmax(1) == y` for several.")
    if r.outcome == "fraction-as-percent":
        return "print the fraction times 100 where it is followed by a % sign (or drop the sign)."
    if r.outcome == "wrong-count" and r.data.get("arithmetic"):
        return f"divide the correct predictions by the number of samples evaluated, not as now ({r.data['arithmetic']})."
    return ""


def _schedule_peak(results, rec) -> str:
    r = results.get("schedule-ahead")
    if r is None or r.status != "failed" or r.outcome not in ("overshoot", "above-trainable"):
        return ""
    d = r.data
    entry = next((e for e in getattr(rec, "schedulers", None) or [] if e.get("name") == d.get("scheduler")), None)
    at = f" (stepped at {entry['where']})" if entry and entry.get("where") else ""
    if r.outcome == "overshoot":
        return (f"`{d['scheduler']}`{at} multiplies the rate up to {_g(d['peak_factor'])}x (lr {_g(d['peak_lr'])} at "
                f"scheduler step {d['peak_step']}): make its factor end at 1.0, so the warm-up reaches the optimizer's lr "
                f"{_g(d['base_lr'])} and stops there.")
    return (f"`{d['scheduler']}`{at} peaks at lr {_g(d['peak_lr'])}, at or above {_g(d['sweep_ceiling'])} where the lr "
            f"sweep measured the rate as too high: lower its peak (max_lr, or the warm-up's target) below that.")


def _replay_ramp(results, rec) -> str:
    r = results.get("replay-history")
    if r is None or r.status != "failed" or r.outcome not in ("ramp", "lr-rose"):
        return ""
    line = r.data.get("schedule_line")
    if not line or line == "?":
        return ""
    return (f"the rate was {'still rising' if r.data.get('ramping') else 'raised ' + _g(r.data.get('lr_rise', 0)) + 'x'} when "
            f"the run broke; the schedule is set at {line}: lower its peak or lengthen its warm-up so that the rate "
            f"stays below {_g(r.data.get('lr_at_best', r.data.get('lr_now', 0)))}, where the loss was last at its best.")


def _first(*makers: Callable) -> Callable:
    def make(results, rec) -> str:
        for m in makers:
            text = m(results, rec)
            if text:
                return text
        return ""
    return make


TAILORS: dict[str, Callable] = {
    "disconnected-parameters": _first(_grad_path, _tensor_list, _probe_fix("dist-unused-params")),
    "metric-wrong": _metric,
    "op-shape-mismatch": _tensor_list,
    "softmax-wrong-dim": _grad_path,
    "dead-relu": _grad_path,
    "saturated-activations": _grad_path,
    "loss-output-mismatch": _grad_path,
    "output-ignores-input": _grad_path,
    "scheduler-misplaced": _scheduler,
    "sampler-epoch-not-set": _probe_fix("dist-sampler-epoch"),
    "data-not-sharded": _probe_fix("dist-sharding"),
    "batchnorm-not-synced": _probe_fix("dist-batchnorm"),
    "metric-not-reduced": _probe_fix("dist-metric"),
    "rank-write-conflict": _probe_fix("dist-writes"),
    "ranks-diverged": _probe_fix("dist-replicas"),
    "collective-mismatch": _probe_fix("dist-collectives"),
    "graph-retained": _graph_kept,
    "clip-misplaced": _clip,
    "missing-optimizer-step": _missing_step,
    "zero-grad-misplaced": _zero_grad_order,
    "optimizer-missing-params": _missing_params,
    "double-softmax": _double_softmax,
    "lr-too-high": _first(_schedule_peak, _replay_ramp, _lr("high")),
    "lr-too-low": _lr("low"),
    "no-grad-missing": _no_grad,
    "target-not-detached": _target_detach,
    "eval-mode-missing": _eval_mode,
    "train-mode-missing": _train_mode,
    "missing-zero-grad": _zero_grad,
}
# where Lightning or transformers owns the optimizer, its rate or the loop: the fix in that framework's terms
FRAMEWORK_TAILORS: dict[str, Callable] = {
    "lr-too-high": _framework_lr("high"),
    "lr-too-low": _framework_lr("low"),
    "eval-mode-missing": _framework_eval_mode,
}
