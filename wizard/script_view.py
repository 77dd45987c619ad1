"""What was observed in a script run, as plain data (the JSON report's ``script`` section) and as
terminal / markdown blocks: models and parameter counts, optimizers and their groups, the steps run
and why the run ended, a compact per-step trace, the files the script wrote, its last printed lines."""

from __future__ import annotations

import collections
import math
from typing import Any

from rich.markup import escape

from nnwizard.probes._objectives import objectives

TRACE_ROWS = 12
OUTPUT_TAIL = 12


def _num(v: float | None) -> Any:
    if v is None:
        return None
    return v if math.isfinite(v) else str(v)


def observed(target) -> dict[str, Any]:
    run, rec = target.run, target.recording
    models = [_model(m) for m in rec.models]
    optimizers = [{"name": o.name, "steps": o.steps, "built": o.built, "models": [rec.models[i].name for i in o.models],
                   "groups": [{"lr": g["lr"], "tensors": g["tensors"], "values": g["values"]} for g in o.groups]}
                  for o in rec.optimizers]
    steps = rec.steps
    chosen = _trace_steps(steps)
    names = {m.index: m.name for m in rec.models}
    trace = [{"step": s.step, "epoch": s.epoch, "batch": s.batch, "loss": _num(s.loss), "grad_norm": _num(s.grad_norm),
              "clipped": s.grad_norm_clipped is not None, "lr": s.lrs[0] if s.lrs else None, "zero_grad": s.zero_grad, "backwards": s.backwards,
              "training": all(s.training.values()) if s.training else None,
              "modes": {names.get(k, str(k)): v for k, v in s.training.items()}, "update": _num(s.update)}
             for s in chosen]
    evals = sum(1 for c in rec.loss_calls if c.eval)
    note = script_problem(target) or untrained_note(target)
    objs = objectives(rec)
    return {
        "script": str(run.script.path), "args": run.args, "exit": run.exit, "exit_code": run.exit_code,
        "seconds": run.seconds, "stopped": rec.stopped, "steps": len(steps), "backwards": rec.backwards,
        "models": models, "optimizers": optimizers,
        "objectives": objs.text or None,   # several optimizers, each after its own backward (adversarial or not)
        "schedulers": [{"name": s["name"], "steps": s["steps"]} for s in rec.schedulers],
        "loaders": [{"batch_size": l.batch_size, "batches": l.length, "dataset": l.dataset_len, "shuffle": l.shuffle,
                     "iterations": l.iterations} for l in rec.loaders],
        "loss": (f"{target.loss_call.fn} (input {target.loss_call.input_shape} {target.loss_call.input_dtype}, target "
                 f"{target.loss_call.target_shape} {target.loss_call.target_dtype})") if target.loss_call else None,
        "eval_loss_calls": evals, "measured_step_s": target.measured_step_s,
        "seeds": [{"seed": s.seed, "where": s.where, "step": s.step} for s in rec.seeds],
        "manual_steps": sum(1 for s in steps if s.manual), "recording_notes": _counted(rec.notes),
        "error": ({"type": rec.error.type, "message": rec.error.message, "where": rec.error.where, "step": rec.error.step}
                  if rec.error else None),
        "capture": target.capture_problem or "ok",
        "trace": trace, "written": [{"path": a, "saved_as": b} for a, b in run.written],
        "deleted": list(getattr(run, "deleted", []) or []), "ended_by": getattr(run, "ended_by", None),
        "scratch": str(run.scratch) if run.scratch else None,
        "output_tail": run.output[-OUTPUT_TAIL:], "warnings": run.warnings, "note": note,
        "reruns": [{"what": r.what, "max_steps": r.max_steps, "steps": r.steps, "seconds": r.seconds, "exit": r.exit}
                   for r in getattr(target, "reruns", [])],   # the interventions (probes/intervene.py)
    }


def _model(m) -> dict[str, Any]:
    """One observed model; a module seen only through a layer its directly called forward() runs (a
    forward-forward ``Layer.train`` calling ``self.forward(x)``) is shown as that owner."""
    out = {"name": m.name, "params": m.params, "trainable": m.trainable, "forwards": m.forwards,
           "mode_layers": m.mode_layers, "copy_of": m.copy_of, "wrapper": getattr(m, "wrapper", None),
           "device": _device(m)}
    if getattr(m, "owner", None) is not None:
        params = list(m.owner.parameters())
        out.update(name=type(m.owner).__name__, seen_through=m.name, params=sum(p.numel() for p in params),
                   trainable=sum(p.numel() for p in params if p.requires_grad))
    return out


def _device(m) -> str | None:
    """Where the model's parameters live at the end of the run (None: it has none)."""
    try:
        return str(next(iter(m.parameters())).device)
    except (StopIteration, AttributeError, RuntimeError):
        return None


def script_problem(target) -> str | None:
    """One sentence when the run gives nothing to diagnose (then the verdict is inconclusive)."""
    rec, run = target.recording, target.run
    if rec.error is not None:
        return None
    if run.exit == "interrupted" and not rec.steps:
        what = "calling a torch.nn.Module" if not rec.models else "its first optimizer step"
        return f"The script was interrupted (Ctrl-C) after {run.seconds:.1f} s, before {what}: nothing to diagnose yet."
    children = rec.child_processes
    if not rec.steps and children:
        return (f"The script started {children} child process(es) and took no optimizer step in its own process: it "
                f"trains in the children (multiprocessing, e.g. Hogwild), which nnwizard does not record. To diagnose it, "
                f"let the main process call the training function the children run (one process, no Process/spawn).")
    if not rec.models:
        how = {"finished": "ran to its end", "exited": f"exited with code {run.exit_code}", "stopped": "was stopped"}.get(run.exit, run.exit)
        return (f"The script {how} in {run.seconds:.1f} s without ever calling a torch.nn.Module, so there is no "
                f"training to diagnose (does it need arguments after `--`, or a `if __name__ == '__main__'` entry?).")
    if not rec.steps and not rec.backwards and not any(c.grad_enabled for c in rec.loss_calls):
        return (f"The script called {', '.join(sorted({m.name for m in rec.models}))} but never computed a loss in grad "
                f"mode, called backward() or took an optimizer step, so there is no training to diagnose.")
    return None


def untrained_note(target) -> str | None:
    """Why the run cannot be healthy although it ran: no torch.optim step found a gradient (nothing trained),
    or it trained, if at all, without a torch.optim step (the loop audits cannot read it)."""
    rec = target.recording
    if rec.error is not None:
        return None
    from nnwizard.probes._recording import gradless, moved

    if gradless(rec):
        return (f"None of the script's {len(rec.steps)} optimizer steps found a gradient on any parameter, so nothing "
                f"trained: the verdict cannot be healthy.")
    if rec.steps:
        return None
    how = ("its parameters changed, so it updates them by hand" if moved(rec)
           else "its parameters never changed")
    return (f"The script never took a torch.optim optimizer step ({rec.backwards} backward passes; {how}), so the "
            f"per-step audits had nothing to read: the verdict cannot be healthy.")


def _models_line(obs: dict) -> str:
    def one(m: dict) -> str:
        if m.get("copy_of") is not None:
            return (f"{m['name']} loaded from a checkpoint (a copy of model {m['copy_of']}, not a second model; "
                    f"{m['forwards']} forwards)")
        through = (f"; its forward() called directly, seen through its {m['seen_through']}" if m.get("seen_through")
                   else "")
        wrapped = f", run through {m['wrapper']}" if m.get("wrapper") else ""
        where = f", on {m['device']}" if m.get("device") not in (None, "cpu") else ""
        return (f"{m['name']} ({m['params']:,} parameters, {m['trainable']:,} trainable, {m['forwards']} forwards"
                f"{where}{wrapped}{through})")
    return "; ".join(one(m) for m in obs["models"]) or "none"


def _optimizers_line(obs: dict) -> str:
    parts = []
    for o in obs["optimizers"]:
        groups = ", ".join(f"lr {g['lr']:.3g} over {g['tensors']} tensors" for g in o["groups"])
        built = f"; built {o['built']} times" if o.get("built", 1) > 1 else ""
        parts.append(f"{o['name']} ({len(o['groups'])} group(s): {groups}; {o['steps']} steps{built})")
    return "; ".join(parts) or "none"


def _ended(obs: dict) -> str:
    if obs["error"]:
        e = obs["error"]
        return f"raised {e['type']} at {e['where'] or '?'} after {e['step']} steps"
    if obs.get("ended_by"):
        return f"ended its own process: {obs['ended_by']}"
    if obs["stopped"]:
        return f"stopped by nnwizard: {obs['stopped']}"
    return {"finished": "ran to its end", "exited": f"exited with code {obs['exit_code']}",
            "interrupted": "interrupted (Ctrl-C)"}.get(obs["exit"], obs["exit"])


def print_observed(console, obs: dict) -> None:
    from rich.table import Table

    c = console   # (everything below that came from the program is escaped: its text is never read as markup)
    c.print(f"\n[bold cyan]▶ Observed run of {escape(str(obs['script']))}[/] [dim]({obs['seconds']:.1f} s, "
            f"{escape(_ended(obs))})[/]", highlight=False)
    c.print(f"  models: {escape(_models_line(obs))}", highlight=False)
    c.print(f"  optimizers: {escape(_optimizers_line(obs))}", highlight=False)
    if obs.get("objectives"):
        c.print(f"  objectives: {escape(obs['objectives'])}", highlight=False)
    if obs["schedulers"]:
        c.print("  schedulers: " + escape(", ".join(f"{s['name']} ({s['steps']} steps)" for s in obs["schedulers"])),
                highlight=False)
    for note in obs.get("recording_notes") or []:
        c.print(f"  [dim]while recording: {escape(note)}[/]", highlight=False)
    c.print(f"  loss: {escape(obs['loss'] or 'no loss call recorded')}; {escape(_steps_text(obs))}, {obs['backwards']} "
            f"backward calls, {obs['eval_loss_calls']} evaluation loss calls", highlight=False)
    if obs["trace"]:
        table = Table(*TRACE_COLUMNS[:6], "bwd", *TRACE_COLUMNS[7:], box=None, padding=(0, 1))
        for row in _trace_rows(obs["trace"]):
            table.add_row(*(escape(str(cell)) for cell in row))
        c.print(table)
        for note in _notes(obs["trace"]):
            c.print(f"  [dim]{escape(note)}[/]", highlight=False)
    if obs["written"]:
        where = f", kept in {obs['scratch']}" if obs.get("scratch") else ", kept out of your folders"
        c.print(escape(f"  the script wrote {len(obs['written'])} file(s){where}: "
                       + ", ".join(w["path"] for w in obs["written"][:6])), highlight=False)
    if obs.get("deleted"):
        c.print(escape(f"  the script deleted {len(obs['deleted'])} path(s) (still there: it only saw them gone): "
                       + ", ".join(obs["deleted"][:6])), highlight=False)
    if obs["output_tail"]:
        c.print("  [dim]last lines it printed:[/]")
        for line in obs["output_tail"][-6:]:
            c.print(f"  [dim]│ {escape(line)}[/]", highlight=False)  # the script's text, never read as markup
    if obs["note"]:
        c.print(f"[bold yellow]{escape(obs['note'])}[/]", highlight=False)


def _counted(notes: list[str]) -> list[str]:
    """The recorder's notes once each, with how often a repeated one was made (one per DataLoader...)."""
    counts = collections.Counter(notes)
    return [note if counts[note] == 1 else f"{note} ({counts[note]} times)" for note in dict.fromkeys(notes)]


def _steps_text(obs: dict) -> str:
    manual = obs.get("manual_steps") or 0
    if manual and manual == obs["steps"]:
        idle = [o["name"] for o in obs["optimizers"] if not o["steps"]]
        return (f"{manual} steps, all hand-written parameter updates (no torch.optim step"
                + (f"; {' and '.join(idle)} built but never stepped)" if idle else ")"))
    return f"{obs['steps']} optimizer steps" + (f" ({manual} of them hand-written updates)" if manual else "")


def _trace_steps(steps: list) -> list:
    """The steps the per-step trace shows (TRACE_ROWS of them): the last 3, the step before and the step
    of the first change of a model's mode (training after an evaluation left it in eval mode) and of the
    first non-finite loss, and the first steps in the rows left."""
    if len(steps) <= TRACE_ROWS:
        return steps
    events = set()
    change = next((i for i in range(1, len(steps)) if steps[i].training and steps[i - 1].training
                   and steps[i].training != steps[i - 1].training), None)
    bad = next((i for i, s in enumerate(steps) if s.loss is not None and not math.isfinite(s.loss)), None)
    for i in (change, bad):
        if i is not None:
            events |= {i - 1, i}
    tail = set(range(len(steps) - 3, len(steps)))
    extra = events - tail
    head = max(TRACE_ROWS - 3 - len(extra), 4)
    return [steps[i] for i in sorted(set(range(head)) | extra | tail)]


TRACE_COLUMNS = ["step", "epoch.batch", "loss", "grad norm", "lr", "zero_grad", "backward", "mode", "max |Δθ|"]
UNMEASURED = ("grad norm `-`: not measured on that step (the recorder measures it on the first steps, then on sampled "
              "ones, the last ones and any step with a non-finite loss)")


def _trace_rows(trace: list[dict]) -> list[list]:
    """The per-step trace as table rows, with a row of dots where steps were left out."""
    rows, last = [], None
    for s in trace:
        if last is not None and s["step"] > last + 1:
            rows.append(["…"] * len(TRACE_COLUMNS))
        last = s["step"]
        rows.append([s["step"], f"{s['epoch']}.{s['batch']}" if s["batch"] >= 0 else "-", _short(s["loss"]),
                     _short(s["grad_norm"]), _short(s["lr"]), "yes" if s["zero_grad"] else "no", s["backwards"],
                     _mode(s), _short(s["update"], ".2g")])
    return rows


def _mode(s: dict) -> str:
    """train / eval at the step's forwards; each model's own when several ran in different modes
    (``Encoder:train, Head:eval``)."""
    modes = s.get("modes") or {}
    if len(set(modes.values())) > 1:
        return ", ".join(f"{name}:{'train' if on else 'eval'}" for name, on in modes.items())
    return "-" if s["training"] is None else ("train" if s["training"] else "eval")


CLIPPED = ("grad norm: before the script's `clip_grad_norm_`, as it returned it (after the clip a norm is at most "
           "max_norm)")


def _unmeasured(trace: list[dict]) -> bool:
    return any(s["grad_norm"] is None and s["loss"] is not None for s in trace)


def _notes(trace: list[dict]) -> list[str]:
    """The sentences under the per-step table that say how to read its grad norm column."""
    return ([UNMEASURED] if _unmeasured(trace) else []) + ([CLIPPED] if any(s.get("clipped") for s in trace) else [])


def _short(v, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def markdown_lines(obs: dict) -> list[str]:
    from nnwizard.markdown import fence, markdown_table, text

    out = ["## What the script did (observed)", ""]
    if obs["note"]:
        out += [f"> {text(obs['note'])}", ""]
    out += [f"- Script: `{obs['script']}` {text(' '.join(obs['args']))} ({obs['seconds']:.1f} s; {text(_ended(obs))})",
            f"- Models: {text(_models_line(obs))}", f"- Optimizers: {text(_optimizers_line(obs))}"]
    if obs.get("objectives"):
        out.append(f"- Objectives: {text(obs['objectives'])}")
    if obs["schedulers"]:
        out.append("- Schedulers: " + text(", ".join(f"{s['name']} ({s['steps']} steps)" for s in obs["schedulers"])))
    out += [f"- While recording: {text(note)}" for note in obs.get("recording_notes") or []]
    out += [f"- Loss: {text(obs['loss'] or 'no loss call recorded')}", f"- {_steps_text(obs)}, {obs['backwards']} "
            f"backward calls, {obs['eval_loss_calls']} evaluation loss calls; measured step time "
            f"{_short(obs['measured_step_s'])} s", ""]
    if obs["trace"]:
        out += ["### Per-step trace", ""]
        out += markdown_table(TRACE_COLUMNS, _trace_rows(obs["trace"]))
        out.append("")
        for note in _notes(obs["trace"]):
            out += [note, ""]
    if obs.get("reruns"):
        out += ["### Reruns of the script (interventions)", ""]
        out += markdown_table(["intervention", "optimizer steps (planned)", "seconds", "ended"],
                      [[r["what"], f"{r['steps']} ({r['max_steps']})", f"{r['seconds']:.2f}", r["exit"]]
                       for r in obs["reruns"]]) + [""]
    if obs["written"]:
        out += ["### Files the script wrote (kept out of your folders)", ""]
        out += markdown_table(["path the script used", "saved as"], [[w["path"], w["saved_as"] or "discarded"]
                                                            for w in obs["written"]]) + [""]
    if obs.get("deleted"):
        out += ["### Files the script deleted (they are still there: it only saw them gone)", ""]
        out += [f"- {text(path)}" for path in obs["deleted"][:50]] + [""]
    if obs["output_tail"]:
        out += ["### The script's last printed lines", "", fence(obs["output_tail"]), *obs["output_tail"],
                fence(obs["output_tail"]), ""]
    return out
