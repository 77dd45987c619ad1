"""NaN / Inf instruments: where the first non-finite value comes from, and why.

- ``nan-inputs`` scans the data itself (inputs and targets) for NaN/Inf.
- ``nan-bisect`` trains through the user's step until the loss, a gradient or a parameter stops
  being finite, then replays exactly that step once, traced op by op (``_optrace``), to name the first
  op that created the value: its phase (inputs, forward, loss, backward, update), module and file:line.
- ``nan-repair`` reruns the failing stretch with lr/10 and with ``clip_grad_norm_(1.0)``.
- ``epsilon-scan`` records the smallest argument of every log/div/sqrt/rsqrt/reciprocal/fractional
  pow on real batches, and scans the user's source for such calls with no epsilon or clamp.
- ``amp-overflow`` runs the forward in fp32 and under fp16 autocast and finds the first module whose
  output leaves the fp16 range.
"""

from __future__ import annotations

import ast
import copy
import math
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset

from nnwizard.probes._crash import error_kind
from nnwizard.record.frames import first_line, user_frame
from nnwizard.record.optrace import OpTracer
from nnwizard.probes.api import LinePlot, ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

FP16_MAX = 65504.0
MIN_BISECT = 10
# An argument this close to zero is zero at float32 resolution for any quantity of order 1 (float32
# resolves ~1.2e-7 relative): log() of it is below -13.8 and 1/x above 1e6.
NEAR_ZERO = 1e-6


def _first_bad(t):
    """The first floating tensor holding NaN/Inf in ``t`` (a tensor, or nested lists/tuples/dicts of them)."""
    if isinstance(t, torch.Tensor):
        return t if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()) else None
    items = t.values() if isinstance(t, dict) else t if isinstance(t, (list, tuple)) else ()
    return next((b for b in (_first_bad(x) for x in items) if b is not None), None)


def _finite(t) -> bool:
    return _first_bad(t) is None


def _grad_norm(model) -> float | None:
    grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def _param_norm(model) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.detach().float()) for p in model.parameters()]))) \
        if any(True for _ in model.parameters()) else 0.0


def _step_batches(target, n: int) -> list:
    loader = target.train_loader
    try:
        available = len(loader)
    except TypeError:
        available = n
    return target.batches(max(1, min(n, available)))


# ------------------------------------------------------------------------------------------ nan-inputs
def _scan_tensor(t, counts: dict, where: str, offset: int, indices: list, limit: int = 20) -> int:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return 0
    bad = ~torch.isfinite(t)
    n = int(bad.sum())
    if n:
        per_sample = bad.reshape(len(t), -1).any(1) if t.dim() else bad.reshape(1)
        for i in torch.nonzero(per_sample).flatten().tolist():
            if len(indices) < limit:
                indices.append(offset + i)
        if t.dim() >= 2:
            per_feature = bad.transpose(0, 1).reshape(t.shape[1], -1).sum(1)
            for j in torch.nonzero(per_feature).flatten().tolist():
                counts[j] = counts.get(j, 0) + int(per_feature[j])
        counts.setdefault("nan", 0)
        counts["nan"] += int(torch.isnan(t).sum())
        counts.setdefault("inf", 0)
        counts["inf"] += int(torch.isinf(t).sum())
    return n


def _scan_split(target, split: str, budget: float) -> dict | None:
    base = target.train_loader if split == "train" else target.val_loader
    if base is None:
        return None
    dataset = getattr(base, "dataset", None)
    started = time.monotonic()
    result = {"split": split, "samples": 0, "bad_inputs": 0, "bad_targets": 0, "input_counts": {}, "target_counts": {},
              "input_samples": [], "target_samples": [], "complete": True, "indices": "dataset"}
    if dataset is not None and hasattr(dataset, "tensors") and len(dataset.tensors) >= 2:
        x, y = dataset.tensors[0], dataset.tensors[1]
        result["samples"] = len(x)
        result["bad_inputs"] = _scan_tensor(x, result["input_counts"], "inputs", 0, result["input_samples"])
        result["bad_targets"] = _scan_tensor(y, result["target_counts"], "targets", 0, result["target_samples"])
        return result
    if dataset is not None and not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__"):
        loader = DataLoader(dataset, batch_size=base.batch_size or 64, shuffle=False, collate_fn=base.collate_fn)
    else:
        loader, result["indices"] = base, "iteration order"
    offset = 0
    for batch in loader:
        x, y = batch[0], batch[1]
        result["bad_inputs"] += _scan_tensor(x, result["input_counts"], "inputs", offset, result["input_samples"])
        result["bad_targets"] += _scan_tensor(y, result["target_counts"], "targets", offset, result["target_samples"])
        offset += len(y)
        if time.monotonic() - started > budget:
            result["complete"] = False
            break
    result["samples"] = offset
    return result


@probe(
    "nan-inputs",
    title="NaN/Inf in the training and validation data",
    outcomes={"ok": "every scanned input and target is finite", "found": "inputs or targets hold NaN/Inf"},
    timeout_s=60,
)
def nan_inputs(ctx: ProbeContext):
    budget = float(ctx.param("budget_s", 3.0))
    scans = [s for s in (_scan_split(ctx.target, "train", budget), _scan_split(ctx.target, "val", budget)) if s]
    rows, data = [], {"splits": {}}
    total_bad = 0
    for s in scans:
        feats = {k: v for k, v in s["input_counts"].items() if isinstance(k, int)}
        top = sorted(feats.items(), key=lambda kv: -kv[1])[:6]
        rows.append([s["split"], s["samples"], "all" if s["complete"] else "sample", s["bad_inputs"], s["bad_targets"],
                     ", ".join(f"{k} ({v})" for k, v in top) or "-", s["input_samples"][:8] or s["target_samples"][:8] or "-"])
        data["splits"][s["split"]] = {k: s[k] for k in ("samples", "bad_inputs", "bad_targets", "complete", "indices")}
        total_bad += s["bad_inputs"] + s["bad_targets"]
        if s["bad_inputs"] + s["bad_targets"] and "split" not in data:
            data.update(split=s["split"], bad_inputs=s["bad_inputs"], bad_targets=s["bad_targets"],
                        features=[k for k, _ in top], samples=s["input_samples"][:8] or s["target_samples"][:8],
                        nan=s["input_counts"].get("nan", 0) + s["target_counts"].get("nan", 0),
                        inf=s["input_counts"].get("inf", 0) + s["target_counts"].get("inf", 0),
                        scanned=s["samples"], coverage="the whole set" if s["complete"] else f"a sample of {s['samples']}",
                        index_kind=s["indices"])
    table = Table("nan-inputs", "Non-finite values per split", ["split", "samples", "scanned", "bad input values",
                  "bad target values", "features/channels (count)", "sample indices"], rows,
                  marked=[i for i, r in enumerate(rows) if r[3] or r[4]])
    scanned = ", ".join(f"{s['split']}: {s['samples']} samples ({'all' if s['complete'] else 'sample'})" for s in scans)
    data["scanned_text"] = scanned
    if total_bad:
        what = []
        if data["bad_inputs"]:
            what.append(f"{data['bad_inputs']} non-finite input values (features {data['features']})")
        if data["bad_targets"]:
            what.append(f"{data['bad_targets']} non-finite target values")
        data["what"] = " and ".join(what)
        return failed("found", f"{data['split']} set: {data['what']} in samples {data['samples']} "
                      f"({data['nan']} NaN, {data['inf']} Inf; scanned {data['coverage']})", [table], **data)
    return passed(f"no NaN/Inf in inputs or targets ({scanned})", artifacts=[table], **data)


# ------------------------------------------------------------------------------------------ nan-bisect
class _Snap:
    def __init__(self, model, optimizer):
        self.model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.opt = copy.deepcopy(optimizer.state_dict())

    def restore(self, model, optimizer):
        model.load_state_dict(self.model)
        optimizer.load_state_dict(self.opt)


def _run_until_nonfinite(ctx, model, optimizer, batches, steps, snapshot=True):
    """Train through the user's step; stop at the first step where loss, grads or params go
    non-finite. Returns (losses, grad_norms, param_norms, bad_step or None, snapshot_before_bad, why)."""
    target = ctx.target
    losses, grad_norms, param_norms = [], [], []
    seen = {}

    def pre_hook(opt, args, kwargs):
        seen["grad"] = _grad_norm(model)

    handle = optimizer.register_step_pre_hook(pre_hook)
    snap = None
    try:
        for step in range(steps):
            batch = batches[step % len(batches)]
            if snapshot:
                snap = _Snap(model, optimizer)
            seen.pop("grad", None)
            loss = target.train_step(model, batch, optimizer)
            g = seen.get("grad", _grad_norm(model))
            losses.append(loss)
            grad_norms.append(g if g is not None else math.nan)
            pn = _param_norm(model)
            param_norms.append(pn)
            why = None
            if not math.isfinite(loss):
                why = "loss"
            elif g is not None and not math.isfinite(g):
                why = "gradient"
            elif not math.isfinite(pn):
                why = "parameters"
            if why:
                return losses, grad_norms, param_norms, step, snap, why
            if ctx.time_left() < 2:
                break
    finally:
        handle.remove()
    return losses, grad_norms, param_norms, None, None, None


@probe(
    "nan-bisect",
    title="First non-finite step, replayed op by op",
    outcomes={"ok": "loss, gradients and parameters stayed finite", "inputs": "the failing batch already holds NaN/Inf",
              "forward": "an op inside the model created the first NaN/Inf", "loss": "the loss computation created it",
              "backward": "forward and loss were finite; a backward op created it",
              "update": "gradients were finite; the optimizer step made the parameters non-finite",
              "unlocated": "the replay of the failing step stayed finite", "crashed": "the step raised"},
    timeout_s=90,
    share=0.2,
    floor=1.2 * MIN_BISECT + 6,
)
def nan_bisect(ctx: ProbeContext):
    target = ctx.target
    wanted = int(ctx.param("steps", 150))
    # a snapshot before every step (a state copy) and the traced replay of the failing one
    steps = ctx.plan_steps(wanted, minimum=MIN_BISECT, cost=1.2, fixed=6)
    if not steps:
        return ctx.unaffordable(MIN_BISECT, "steps a search for the first non-finite one needs", wanted=wanted)
    batches = _step_batches(target, int(ctx.param("batches", 16)))
    model = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(model)
    files = user_source_files(target)
    started = time.monotonic()
    try:
        losses, gnorms, pnorms, bad, snap, why = _run_until_nonfinite(ctx, model, optimizer, batches, steps)
    except Exception as exc:
        return failed("crashed", f"the training step raised: {first_line(exc)}", error=first_line(exc),
                      kind=error_kind(exc), where=user_frame(exc, files), training_raised=True)
    fn = "train_step" if target.user_train_step else "the reference step"
    data = dict(steps_run=len(losses), step_fn=fn, losses=losses, grad_norms=gnorms,
                first_loss=losses[0] if losses else math.nan,
                first_grad_norm=gnorms[0] if gnorms else math.nan, seconds_to_find=round(time.monotonic() - started, 2))
    finite_g = [g for g in gnorms if math.isfinite(g)]
    data["max_grad_norm"] = max(finite_g) if finite_g else math.nan
    plots = [LinePlot("loss", f"Training loss through {fn}", {"loss": [l if math.isfinite(l) else math.nan for l in losses]},
                      logy=all(l > 0 for l in losses if math.isfinite(l)))]
    if finite_g:
        plots.append(LinePlot("grad-norm", "Global gradient norm before each optimizer step", {"grad norm": gnorms},
                              ylabel="gradient norm", logy=True))
    if bad is None and steps < wanted:
        data["wanted_steps"] = wanted
        return cannot_run(f"{len(losses)} steps of {fn} (of {wanted} wanted; the budget fits {steps}) stayed finite: "
                       f"too few to rule out a later NaN/Inf", **data, reason="budget")
    if bad is None:
        return passed(f"{len(losses)} steps of {fn}: loss {losses[0]:.4g} -> {losses[-1]:.4g}, always finite; "
                      f"gradient norm {data['first_grad_norm']:.3g} -> {gnorms[-1]:.3g}", artifacts=plots, **data)
    data.update(step=bad, what=why, last_finite_loss=next((l for l in reversed(losses) if math.isfinite(l)), math.nan),
                grad_norm_before=gnorms[bad - 1] if bad > 0 else math.nan,
                param_growth=(pnorms[bad - 1] / pnorms[0]) if bad > 0 and pnorms[0] else 1.0,
                grad_growth=(gnorms[bad - 1] / gnorms[0]) if bad > 0 and gnorms[0] else 1.0)
    plots[0].marks = {"first non-finite": bad}
    inputs, targets_ = batches[bad % len(batches)][0], batches[bad % len(batches)][1]
    if not _finite(inputs) or not _finite(targets_):
        which = "inputs" if not _finite(inputs) else "targets"
        t = _first_bad(inputs if which == "inputs" else targets_)
        rows = torch.nonzero((~torch.isfinite(t)).reshape(len(t), -1).any(1)).flatten().tolist()
        data.update(phase="inputs", tensor=which, rows=rows[:8], bad_values=int((~torch.isfinite(t)).sum()), replays=0)
        return failed("inputs", f"step {bad}: the batch's {which} already hold {data['bad_values']} NaN/Inf values "
                      f"(rows {rows[:8]} of the batch) before any op ran", plots, **data)
    # replay the failing step exactly, from the state before it, traced op by op
    snap.restore(model, optimizer)
    replay_started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tracer = OpTracer(model, files, backward=True, optimizer=optimizer)
        try:
            with tracer as trace:
                replay_loss = target.train_step(model, batches[bad % len(batches)], optimizer)
        except Exception as exc:
            replay_loss, trace = math.nan, tracer.trace
            data["replay_error"] = first_line(exc)
    replays = 1
    data["replay_loss"] = replay_loss
    rec, phase = trace.first_nonfinite_phase()
    if phase == "backward":
        data["backward_node"] = trace.backward_node
    elif phase is None and (why == "parameters" or (math.isfinite(replay_loss) and not math.isfinite(_param_norm(model)))):
        phase = "update"
    if phase is None and why in ("gradient", "loss"):
        # the hooks missed it: one more replay with autograd anomaly mode on this single step
        snap.restore(model, optimizer)
        replays += 1
        with warnings.catch_warnings(), torch.autograd.detect_anomaly(check_nan=True):
            warnings.simplefilter("ignore")
            try:
                target.train_step(model, batches[bad % len(batches)], optimizer)
            except RuntimeError as exc:
                phase = "backward"
                data["backward_node"] = str(exc).split("'")[1] if "'" in str(exc) else first_line(exc)
                data["where"] = user_frame(exc, files)
    data["replays"] = replays
    data["replay_seconds"] = round(time.monotonic() - replay_started, 3)
    data["phase"] = phase or "unlocated"
    if rec is not None:
        data.update(op=rec.op, layer=rec.module or "(outside the model)", layer_type=rec.module_type or "-",
                    where=rec.where or data.get("where") or "?", min_abs=rec.min_abs, max_abs_in=rec.max_abs_in,
                    negative_input=rec.negative, unsafe_op=rec.min_abs is not None,
                    zero_input=rec.min_abs is not None and (rec.min_abs <= NEAR_ZERO or rec.negative))
        data["op_text"] = rec.describe()
        ops = Table("replay", f"Replay of step {bad}: ops with non-finite outputs (first 12)",
                    ["#", "op", "phase", "module", "where", "non-finite input", "min |arg|"],
                    [[r.index, r.op, r.phase, r.module or "-", r.where or "?", r.nonfinite_in,
                      "-" if r.min_abs is None else f"{r.min_abs:.3g}"] for r in trace.records if r.nonfinite_out][:12],
                    marked=[0])
        plots.append(ops)
    else:
        data.update(zero_input=False, unsafe_op=False, op="?", layer="?", where=data.get("where") or "?")
    size = "; argument reached |x| = {:.3g}".format(rec.min_abs) if rec is not None and rec.min_abs is not None else ""
    big = f"; largest |input| {rec.max_abs_in:.3g}" if rec is not None and rec.max_abs_in is not None and rec.min_abs is None else ""
    head = f"{why} non-finite at step {bad} of {fn}"
    if phase == "forward":
        return failed("forward", f"{head}: first created by {rec.describe()} in the forward pass{size}{big}", plots, **data)
    if phase == "loss":
        return failed("loss", f"{head}: first created by {rec.describe()} while computing the loss{size}{big}", plots, **data)
    if phase == "backward":
        what = f"the backward of {rec.describe()} ({data.get('backward_node')})" if rec is not None else data.get("backward_node")
        return failed("backward", f"{head}: forward and loss finite; {what} turned finite gradients into NaN/Inf{size}",
                      plots, **data)
    if phase == "update":
        return failed("update", f"{head}: gradients finite (norm {data['grad_norm_before']:.3g} before), the optimizer "
                      f"step made the parameters non-finite", plots, **data)
    return failed("unlocated", f"{head}, but the traced replay of that step stayed finite", plots, **data)


# ------------------------------------------------------------------------------------------ nan-repair
@probe(
    "nan-repair",
    title="Rerun the failing stretch with lr/10 and with gradient clipping",
    outcomes={"lr-fixes": "lr/10 stays finite, clipping does not", "clip-fixes": "clipping stays finite, lr/10 does not",
              "both-fix": "both stay finite", "neither": "both still go non-finite",
              "ok": "no non-finite step to repair"},
    timeout_s=90,
    share=0.15,
)
def nan_repair(ctx: ProbeContext):
    target = ctx.target
    bisect = ctx.results.get("nan-bisect")
    bad = bisect.data.get("step") if bisect is not None else None
    batches = _step_batches(target, int(ctx.param("batches", 16)))
    if bad is None:
        if bisect is not None:
            return passed("nan-bisect found no non-finite step to repair", "ok")
        model = target.fresh_model(ctx.seed)
        _, _, _, bad, _, _ = _run_until_nonfinite(ctx, model, target.make_optimizer(model), batches,
                                                  int(ctx.param("steps", 150)), snapshot=False)
        if bad is None:
            return passed("the training stayed finite: nothing to repair", "ok")
    # the failing stretch, with headroom: a fix must hold well past the step that failed
    horizon = int(ctx.param("horizon", max(3 * (bad + 1), 30)))
    if not ctx.plan_steps(horizon, minimum=horizon, runs=2):
        return cannot_run(f"the budget does not fit two runs of {horizon} steps past the failing step {bad}", step=bad, reason="budget")
    max_norm = float(ctx.param("max_norm", 1.0))
    runs = {}
    for name in ("lr/10", "clip"):
        model = target.fresh_model(ctx.seed)
        optimizer = target.make_optimizer(model)
        handle = None
        if name == "lr/10":
            for group in optimizer.param_groups:
                if "lr" in group:
                    group["lr"] = group["lr"] * 0.1
        else:
            params = [p for p in model.parameters() if p.requires_grad]

            def clip(opt, args, kwargs, _p=params):
                torch.nn.utils.clip_grad_norm_(_p, max_norm)  # returning None keeps step()'s arguments

            handle = optimizer.register_step_pre_hook(clip)
        try:
            losses, gnorms, _, fail, _, _ = _run_until_nonfinite(ctx, model, optimizer, batches, horizon, snapshot=False)
        except Exception:  # noqa: BLE001 - the user's step raising counts as not finite
            losses, fail = [math.nan], 0
        finally:
            if handle is not None:
                handle.remove()
        finite = fail is None and len(losses) >= min(horizon, bad + 1)
        runs[name] = dict(finite=finite, steps=len(losses), fail=fail, losses=losses,
                          first=losses[0] if losses else math.nan, last=losses[-1] if losses else math.nan)
    lr, clip = runs["lr/10"], runs["clip"]
    data = dict(step=bad, horizon=horizon, max_norm=max_norm, lr10_finite=lr["finite"], clip_finite=clip["finite"],
                lr10_fail=lr["fail"], clip_fail=clip["fail"], lr10_last=lr["last"], clip_last=clip["last"],
                lr10_first=lr["first"], clip_first=clip["first"], lr10_steps=lr["steps"], clip_steps=clip["steps"])
    series = {f"{k} ({'finite' if v['finite'] else 'non-finite at step %s' % v['fail']})":
              [l if math.isfinite(l) else math.nan for l in v["losses"]] for k, v in runs.items()}
    if bisect is not None and bisect.data.get("losses"):
        series["as configured"] = [l if math.isfinite(l) else math.nan for l in bisect.data["losses"]]
    plot = LinePlot("repair", f"Repair tests over {horizon} steps (failing step {bad})", series,
                    logy=all(l > 0 for s in series.values() for l in s if math.isfinite(l)), marks={"failed": bad})

    def said(v):
        return f"finite for {v['steps']} steps (loss {v['first']:.3g} -> {v['last']:.3g})" if v["finite"] else \
            f"non-finite again at step {v['fail']}"

    text = f"as configured non-finite at step {bad}; lr/10: {said(lr)}; clip_grad_norm_({max_norm:g}): {said(clip)}"
    data["lr10_text"], data["clip_text"] = said(lr), said(clip)
    if lr["finite"] and clip["finite"]:
        return failed("both-fix", text, [plot], **data)
    if lr["finite"]:
        return failed("lr-fixes", text, [plot], **data)
    if clip["finite"]:
        return failed("clip-fixes", text, [plot], **data)
    return failed("neither", text, [plot], **data)


# ---------------------------------------------------------------------------------------- epsilon-scan
_UNSAFE_CALLS = {"log", "log2", "log10", "sqrt", "rsqrt", "reciprocal"}
_GUARDS = {"clamp", "clamp_min", "clamp_", "clip", "maximum", "max", "softplus", "exp", "relu", "abs_", "nan_to_num",
           "log_softmax", "logsigmoid", "log1p"}
_DENOMS = ("std", "norm", "sqrt", "var", "sum", "sigma", "denom", "scale", "count", "total", "length", "nrm")


def _name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def _guarded(node) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and _name(sub.func) in _GUARDS:
            return True
        if isinstance(sub, (ast.Name, ast.Attribute)) and "eps" in _name(sub).lower():
            return True
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add):
            for side in (sub.left, sub.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, (int, float)) and 0 < abs(side.value) < 1e-2:
                    return True
    return False


def _safer(op: str, arg_src: str) -> str:
    text = arg_src.replace(" ", "")
    if op.startswith("log"):
        if "sigmoid" in text:
            return "F.logsigmoid(z) (or nn.BCEWithLogitsLoss on the logits)"
        if text.startswith("1-") or "(1-" in text:
            return "nn.BCEWithLogitsLoss on the logits (or log((1 - p).clamp_min(1e-7)))"
        if "softmax" in text:
            return "F.log_softmax(z, dim=...) (or nn.CrossEntropyLoss on the logits)"
        return f"torch.log({arg_src}.clamp_min(1e-7))"
    if op in ("sqrt", "rsqrt"):
        return f"torch.{op}({arg_src} + 1e-8)"
    if op == "reciprocal":
        return f"1 / ({arg_src} + 1e-8)"
    return f"... / ({arg_src} + 1e-8)"


def static_unsafe_calls(files: list[Path]) -> list[dict]:
    """log/sqrt/rsqrt/reciprocal calls and divisions by a std/norm/sum-like value with no epsilon or
    clamp in the user's source files."""
    found = []
    for path in files:
        try:
            source = Path(path).read_text()
            tree = ast.parse(source)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            hit = None
            if isinstance(node, ast.Call):
                op = _name(node.func)
                if op in _UNSAFE_CALLS:
                    base = getattr(node.func, "value", None)
                    module_call = isinstance(base, ast.Name) and base.id in ("torch", "np", "numpy", "math", "F")
                    arg = node.args[0] if module_call and node.args else (base if base is not None and not module_call else
                                                                          (node.args[0] if node.args else None))
                    if arg is not None and not _guarded(arg) and not isinstance(arg, ast.Constant):
                        hit = (op, arg)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                right = node.right
                label = _name(right).lower()
                if any(d in label for d in _DENOMS) and not _guarded(right):
                    hit = ("div", right)
            if hit:
                op, arg = hit
                arg_src = ast.get_source_segment(source, arg) or "x"
                found.append({"file": Path(path).name, "line": node.lineno, "op": op,
                              "code": (ast.get_source_segment(source, node) or "")[:80], "safer": _safer(op, arg_src)})
    return sorted(found, key=lambda f: (f["file"], f["line"]))


@probe(
    "epsilon-scan",
    title="log / div / sqrt arguments near zero, and unguarded calls in the source",
    outcomes={"ok": "no epsilon-sensitive op near zero, none unguarded in the source",
              "near-zero": "an op in the user's code saw an argument at or near zero (or negative under log/sqrt)",
              "unguarded": "the source has log/sqrt/division calls with no epsilon or clamp (not near zero on these batches)"},
    timeout_s=60,
    cost=4,
)
def epsilon_scan(ctx: ProbeContext):
    target = ctx.target
    files = user_source_files(target)
    model = target.fresh_model(ctx.seed).train()
    seen: dict[tuple, dict] = {}
    for inputs, targets in [b[:2] for b in _step_batches(target, int(ctx.param("batches", 3)))]:
        try:
            with OpTracer(model, files) as trace, torch.no_grad():
                target.loss_fn(model(inputs), targets)
        except Exception as exc:  # noqa: BLE001
            return cannot_run(f"forward or loss raised: {first_line(exc)}", reason="raised", error=first_line(exc))
        for r in trace.unsafe:
            if not r.direct:
                continue  # library functions (F.normalize, norms) guard their own denominators
            key = (r.op, r.where)
            entry = seen.setdefault(key, {"op": r.op, "where": r.where, "phase": r.phase, "module": r.module,
                                          "min_abs": math.inf, "negative": False, "calls": 0})
            entry["min_abs"] = min(entry["min_abs"], r.min_abs)
            entry["negative"] = entry["negative"] or r.negative
            entry["calls"] += 1
        if ctx.time_left() < 2:
            break
    dynamic = sorted(seen.values(), key=lambda e: e["min_abs"])
    static = static_unsafe_calls(files)
    risky = [e for e in dynamic if e["min_abs"] <= NEAR_ZERO or e["negative"]]
    rows = [[e["op"], e["where"], e["phase"], f"{e['min_abs']:.3g}", e["negative"], e["calls"]] for e in dynamic]
    tables = [Table("epsilon-ops", "Epsilon-sensitive ops run from the user's code (smallest |argument|)",
                    ["op", "where", "phase", "min |arg|", "negative", "calls"], rows,
                    marked=[i for i, e in enumerate(dynamic) if e in risky])]
    if static:
        tables.append(Table("epsilon-source", "Unguarded calls in the source", ["file:line", "code", "safer form"],
                            [[f"{s['file']}:{s['line']}", s["code"], s["safer"]] for s in static]))
    data = dict(ops=len(dynamic), unguarded=len(static), static=static[:10])
    if static:
        s = static[0]
        data.update(static_where=f"{s['file']}:{s['line']}", static_code=s["code"], safer=s["safer"],
                    static_list="; ".join(f"{x['file']}:{x['line']} {x['code']}" for x in static[:4]))
    if risky:
        e = risky[0]
        data.update(op=e["op"], where=e["where"], min_abs=e["min_abs"], negative=e["negative"])
        why = "a negative argument" if e["negative"] else f"|argument| down to {e['min_abs']:.3g}"
        return failed("near-zero", f"{e['op']} at {e['where']} saw {why} on real batches" +
                      (f"; unguarded in the source: {data['static_list']}" if static else ""), tables, **data)
    if static:
        return failed("unguarded", f"{len(static)} unguarded call(s) in the source: {data['static_list']} "
                      f"(safer: {data['safer']}); smallest argument seen on these batches "
                      f"{dynamic[0]['min_abs']:.3g}" if dynamic else f"{len(static)} unguarded call(s): {data['static_list']}",
                      tables, **data)
    return passed(f"{len(dynamic)} epsilon-sensitive op(s) in the user's code, none near zero; no unguarded call in the source",
                  artifacts=tables, **data)


# ---------------------------------------------------------------------------------------- amp-overflow
def _uses_amp(files: list[Path]) -> list[str]:
    """file:line of code (not comments or strings) that turns on fp16: autocast, .half(), float16."""
    hits = []
    for path in files:
        try:
            tree = ast.parse(Path(path).read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in ("autocast", "half", "float16"):
                hits.append(f"{Path(path).name}:{node.lineno}")
    return sorted(set(hits), key=lambda h: int(h.rsplit(":", 1)[1]))


def _module_outputs(model, inputs) -> list[tuple[str, str, float, bool]]:
    calls: list = []
    handles = []
    for name, module in model.named_modules():
        if any(True for _ in module.children()):
            continue

        def hook(mod, args, out, _n=name):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                v = t.detach().float()
                calls.append((_n, type(mod).__name__, float(v.nan_to_num(0.0, 0.0, 0.0).abs().max()),
                              bool(torch.isfinite(v).all()), str(t.dtype).replace("torch.", "")))

        handles.append(module.register_forward_hook(hook))
    try:
        model(inputs)
    finally:
        for h in handles:
            h.remove()
    return calls


@probe(
    "amp-overflow",
    title="First module whose output leaves the fp16 range under autocast",
    outcomes={"ok": "every module output fits fp16", "overflow": "a module's output overflows fp16 (finite in fp32)"},
    timeout_s=60,
    cost=2,
)
def amp_overflow(ctx: ProbeContext):
    target = ctx.target
    device = ctx.device.type
    files = user_source_files(target)
    amp_lines = _uses_amp(files)
    model = target.fresh_model(ctx.seed).train()
    inputs, _ = target.batch()
    if not torch.is_tensor(inputs) or not inputs.is_floating_point():
        return skipped("the inputs are not a floating tensor")
    try:
        with torch.no_grad():
            fp32 = _module_outputs(model, inputs)
            with torch.autocast(device_type=device, dtype=torch.float16):
                fp16 = _module_outputs(model, inputs)
    except Exception as exc:  # noqa: BLE001 - autocast fp16 may not exist on this device
        return skipped(f"fp16 autocast could not run on {device}: {first_line(exc)}", uses_amp=bool(amp_lines))
    rows, first = [], None
    for i, (a, b) in enumerate(zip(fp32, fp16)):
        over = (not b[3] or b[2] > FP16_MAX) and a[3]
        rows.append([a[0], a[1], f"{a[2]:.4g}", f"{b[2]:.4g}" if b[3] else "inf/nan", b[4], over])
        if over and first is None:
            first = (i, a, b)
    peak = max((a[2] for a in fp32), default=0.0)
    data = dict(device=device, uses_amp=bool(amp_lines), amp_lines=amp_lines[:5], peak_fp32=peak,
                headroom=FP16_MAX / peak if peak else math.inf)
    table = Table("amp", "Module outputs: fp32 |max| against fp16 autocast", ["module", "type", "fp32 |max|",
                  "fp16 |max|", "fp16 dtype", "overflows"], rows, marked=[first[0]] if first else [])
    amp = f"; the user's code enables fp16 at {', '.join(amp_lines[:3])}" if amp_lines else ""
    if first is not None:
        _, a, b = first
        data.update(layer=a[0], layer_type=a[1], fp32_max=a[2])
        return failed("overflow", f"{a[1]} '{a[0]}' outputs |x| up to {a[2]:.4g} in fp32, beyond the fp16 limit "
                      f"{FP16_MAX:g}: it becomes Inf under autocast{amp}", [table], **data)
    return passed(f"largest module output {peak:.4g} fits fp16 ({data['headroom']:.3g}x headroom){amp}", artifacts=[table], **data)
