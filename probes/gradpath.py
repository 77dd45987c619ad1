"""``grad-path``: where the learning signal dies, from the loss back to every trained parameter.

One step of the user's own code (module mode: their ``train_step`` on a fresh model and a real batch, else
the model and the loss; script mode: the script rerun for its first optimizer steps) runs under a
:class:`~nnwizard.probes._gradwalk.GradWalk`, which notes where each autograd node was made and every exit
from the graph, and follows the backward node by node. The probe names

- ``cut``: trained parameters the loss's graph never reaches, with the first exit from the graph their
  values took (``.item()``, ``.numpy()``, ``torch.tensor(...)``, ``.detach()``, ``.data``, argmax, an integer
  cast, a ``torch.no_grad()`` block) and the line where a new graph began instead;
- ``zero``: trained parameters reached whose gradient is exactly zero, with the op nearest the loss that
  passed on only zeros (a softmax over a dimension of size 1, a ReLU dead for every sample, a saturated
  sigmoid, tanh or clamp, a step function such as round);
- ``nonfinite``: the same for a gradient that turns NaN/Inf;
- ``constant-output``: the model gives every sample the same output although their inputs differ, and no op
  on the way to the output read the input (followed op by op from the model's argument): the output does
  not depend on the input. A model whose output is constant from its input (a head initialised at zero,
  dead units) is not this.

Its cost is one step: module mode one forward and backward, script mode one rerun stopped once every
optimizer has stepped (at most ``WINDOW`` steps). Script mode reruns only when the recording shows a
signal that dies (a gradient norm of exactly 0, parameters without a gradient, no parameter changed, a
loss that never moved); otherwise it passes on what the recording already measured.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from nnwizard.probes._gradwalk import GradWalk, constant_rows
from nnwizard.record.frames import first_line
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped

WINDOW = 4          # script mode: optimizer steps followed at most (every optimizer's first step, a GAN's two)
FLAT_REL = 1e-6     # a recorded loss whose range is below this share of its size never moved
# what each cause of a gradient that becomes exactly zero is, in words (the report's sentence)
CAUSES = {
    "softmax-size1": "a softmax over a dimension of size 1 (every value is exactly 1, or 0 for log_softmax, whatever the input)",
    "relu-dead": "a ReLU whose outputs are 0 for every sample (every unit dead)",
    "clamp-saturated": "a clamp whose every input lies beyond its bounds",
    "squash-saturated": "a sigmoid/tanh saturated at its bounds for every value",
    "softmax-saturated": "a softmax saturated to one-hot rows",
    "step-function": "a step function (round, floor, sign...) whose gradient is zero everywhere",
    "scaled-by-zero": "a product with zeros",
    "zero-op": "an op that passed on only zeros",
}
FINDING_CAUSES = ("softmax-size1", "relu-dead", "clamp-saturated", "squash-saturated", "softmax-saturated", "step-function")


def _names(models: list[nn.Module], labels: list[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for model, label in zip(models, labels):
        for name, p in model.named_parameters():
            out.setdefault(id(p), f"{label}.{name}" if label else name)
    return out


def _values(params: dict[int, nn.Parameter], names: list[str], lookup: dict[str, nn.Parameter]) -> int:
    return sum(lookup[n].numel() for n in names if n in lookup)


def _modules(names: list[str]) -> str:
    mods = sorted({n.rsplit(".", 1)[0] if "." in n else n for n in names})
    return ", ".join(mods[:5]) + (f" (+{len(mods) - 5} more)" if len(mods) > 5 else "")


def _read(found: dict[str, Any], output_rows: dict | None, values: dict[str, int], total: int, how: str):
    """The probe's result from what the walk found (shared by both modes)."""
    data: dict[str, Any] = dict(how=how, ops=found.get("ops", 0), nodes=found.get("nodes", 0), backward_ran=found.get("backwards", 0) > 0,
                                trained_tensors=found.get("trained", 0), reached_tensors=found.get("reached", 0),
                                trained_values=total)
    unreached, zero, nonfinite = found.get("unreached", []), found.get("zero", []), found.get("nonfinite", [])
    if found.get("truncated"):
        data["truncated"] = True
    if output_rows is not None:   # the forward never reads its input: the root cause of whatever else is cut
        data.update(output_rows)
        data.update(cause="constant-output", op="?", where="?")
        unused = f"; {len(unreached)} trained tensors the loss never reaches follow from it" if unreached else ""
        return failed("constant-output", f"the model gives all {output_rows['rows']} samples the same output "
                      f"({output_rows['value']:.4g}, output {output_rows['output_shape']}) although "
                      f"{output_rows['distinct_inputs']} of their inputs differ, and no op on the way to the output "
                      f"read the input: the output does not depend on the input{unused}", **data)
    rows = [[n, "not reached (cut)"] for n in unreached[:20]] + [[n, "exactly 0"] for n in zero[:20]] + \
        [[n, "NaN/Inf"] for n in nonfinite[:20]]
    table = [Table("grad-path", "Trained parameters whose gradient never arrives", ["parameter", "gradient"], rows)] if rows else []
    if unreached:
        share = sum(values.get(n, 0) for n in unreached) / max(total, 1)
        data.update(cut_tensors=len(unreached), cut_share=share, cut_modules=_modules(unreached), all_cut=not found.get("reached"))
        exit_ = found.get("exit")
        restart = found.get("restart")
        head = (f"the loss's graph reaches none of the {found.get('trained')} trained tensors" if not found.get("reached") else
                f"{len(unreached)} of {found.get('trained')} trained tensors ({share:.0%} of the values; {data['cut_modules']}) "
                f"are not reached by the loss's graph")
        if exit_ is not None:
            times = f" ({exit_['count']} times)" if exit_.get("count", 1) > 1 else ""
            data.update(op=exit_["op"], kind=exit_["kind"], where=exit_["where"] or "?", exit_count=exit_["count"])
            text = f"{head}: their values leave the graph at {exit_['op']}{times} at {exit_['where'] or '?'}, which turns them into {exit_['kind']}"
        else:
            data.update(op="?", kind="unused", where="?")
            text = f"{head}: no op that took them was seen leaving the graph (a layer never called in the forward?)"
        if restart is not None:
            data.update(restart_op=restart.op, restart_where=restart.where or "?")
            text += f"; the loss's graph starts again from a new tensor made by {restart.op} at {restart.where or '?'}"
        data["cause"] = "cut" if exit_ is not None else "unused"
        return failed("cut", text, table, **data)
    for kind, group in (("zero", zero), ("nonfinite", nonfinite)):
        node = found.get(f"{kind}_node")
        if not group:
            continue
        share = sum(values.get(n, 0) for n in group) / max(total, 1)
        data.update(dead_tensors=len(group), dead_share=share, dead_modules=_modules(group))
        if node is None:
            data.update(cause="unlocated", op="?", where="?")
            return failed(kind, f"{len(group)} trained tensors ({share:.0%} of the values) get a gradient of "
                          f"{'exactly 0' if kind == 'zero' else 'NaN/Inf'}; the op that made it was not located", table, **data)
        layer = f" in {node['module_type']} '{node['module']}'" if node.get("module") else ""
        data.update(cause=node["cause"] if kind == "zero" else "nonfinite", op=node["op"], where=node["where"] or "?",
                    node=node["node"], layer=layer.strip(), in_model=bool(node.get("in_model")))
        for key in ("dim", "dim_size", "saved_min", "saved_max", "saved_zero", "input_min", "input_max", "min", "max"):
            if key in node:
                data[key] = node[key]
        what = CAUSES.get(node["cause"], "an op") if kind == "zero" else "an op whose backward turned finite gradients into NaN/Inf"
        numbers = _numbers(node)
        text = (f"the gradient of {len(group)} of {found.get('trained')} trained tensors ({share:.0%} of the values; "
                f"{data['dead_modules']}) becomes {'exactly 0' if kind == 'zero' else 'NaN/Inf'} at {node['op']}{layer} at "
                f"{node['where'] or '?'} ({node['node']}, {node['depth']} nodes from the loss): {what}{numbers}")
        if kind == "zero" and node["cause"] not in FINDING_CAUSES:
            data["cause"] = node["cause"]
            quiet = passed(text + "; a zero from a product, as a zero-initialised layer gives at the first step, is "
                           "not a fault by itself", "zero-product", table, **data)
            break
        return failed(kind, text, table, **data)
    else:
        quiet = None
    if quiet is not None:
        return quiet
    return passed(f"one backward followed over {found.get('nodes', 0)} graph nodes: every one of the "
                  f"{found.get('trained')} trained tensors gets a nonzero, finite gradient", **data)


def _ignored_input(walk: GradWalk, io) -> dict | None:
    """The output's rows all the same while the input's differ, and the output not computed from the input at all
    (a model whose weights are zero right now, or whose units are dead, gives constant rows too, but from its input)."""
    if io is None:
        return None
    args, output = io
    rows = constant_rows(output, args)
    if rows is None or walk.depends(output) is not False:
        return None
    return rows


def _numbers(node: dict) -> str:
    if "dim_size" in node and node.get("cause") == "softmax-size1":
        return f"; dim={node['dim']} has size {node['dim_size']}, its outputs lie in [{node['saved_min']:.4g}, {node['saved_max']:.4g}]"
    if "saved_zero" in node and node.get("cause") == "relu-dead":
        return f"; {node['saved_zero']:.0%} of its outputs are 0"
    if "saved_min" in node and node.get("cause") in ("squash-saturated", "softmax-saturated"):
        return f"; its outputs lie in [{node['saved_min']:.4g}, {node['saved_max']:.4g}]"
    if "input_min" in node and node.get("cause") == "clamp-saturated":
        bounds = ", ".join(f"{k} {node[k]:.4g}" for k in ("min", "max") if k in node)
        return f"; its inputs lie in [{node['input_min']:.4g}, {node['input_max']:.4g}]" + (f" ({bounds})" if bounds else "")
    return ""


# ------------------------------------------------------------------------------------ module mode
class _Backwards:
    """Patches ``Tensor.backward`` and ``torch.autograd.backward`` while the user's step runs, so that each
    backward's graph is walked (and hooked) before it runs."""

    def __init__(self, walk: GradWalk):
        self.walk = walk
        self.count = 0

    def __enter__(self):
        self._tensor, self._autograd = torch.Tensor.backward, torch.autograd.backward
        walk, outer = self.walk, self

        def tensor_backward(tensor, *args, **kwargs):
            outer.count += 1
            walk.watch(tensor)
            return outer._tensor(tensor, *args, **kwargs)

        def autograd_backward(tensors, *args, **kwargs):
            outer.count += 1
            for t in [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or []):
                walk.watch(t)
            return outer._autograd(tensors, *args, **kwargs)

        torch.Tensor.backward, torch.autograd.backward = tensor_backward, autograd_backward
        return self

    def __exit__(self, *exc):
        torch.Tensor.backward, torch.autograd.backward = self._tensor, self._autograd


def _module_walk(ctx: ProbeContext):
    from nnwizard.probes.loop import no_dropout
    from nnwizard.target import user_source_files

    target = ctx.target
    model = no_dropout(target.fresh_model(ctx.seed)).train()
    optimizer = target.make_optimizer(model)
    trained_params = {id(p): p for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
    if not trained_params:
        return skipped("the optimizer holds no parameter that requires grad (see requires-grad-audit)")
    names = {k: v for k, v in _names([model], [""]).items() if k in trained_params}
    lookup = {n: trained_params[k] for k, n in names.items()}
    batch = target.batch()
    first: dict[str, Any] = {}
    def keep(module, args, out) -> None:   # (a hook that returns a value would replace the output)
        first.setdefault("io", (args, out))

    hook = model.register_forward_hook(keep)
    walk = GradWalk(files=user_source_files(target))
    how = "the user's train_step" if target.user_train_step else "the model and loss_fn"
    try:
        with walk, _Backwards(walk) as backwards:
            walk.attach(model)
            walk.track(batch[0])
            if target.user_train_step:
                target.train_step(model, batch, optimizer)
            else:
                loss = target.loss_fn(model(batch[0]), batch[1])
                loss = loss.float().mean() if isinstance(loss, torch.Tensor) and loss.dim() else loss
                if isinstance(loss, torch.Tensor) and loss.requires_grad:
                    loss.backward()
    except Exception as exc:  # noqa: BLE001 - the step's own crash is other probes' evidence
        if not walk.roots:
            return cannot_run(f"the step raised before any backward: {first_line(exc)}", reason="raised",
                              error=first_line(exc))
    finally:
        hook.remove()
    if not walk.roots and not walk.exits:
        return skipped(f"{how} ran no backward (see step-audit)", "no-backward")
    found = walk.report(names)
    rows = _ignored_input(walk, first.get("io"))
    values = {n: p.numel() for n, p in lookup.items()}
    return _read(found, rows, values, sum(values.values()), f"{how} on a fresh model and one real batch")


# ------------------------------------------------------------------------------------ script mode
class _ScriptWalk:
    """Rerun patch and recorder listener: the walk is entered once the recorder is installed; each backward of
    the first steps is walked before it runs; the run ends once every optimizer seen has stepped (at most
    WINDOW steps). The module hooks come off after the window (a model pickled later must not carry them)."""

    def __init__(self, walk: GradWalk):
        self.walk = walk
        self.trained: dict[int, nn.Parameter] = {}
        self.models: list[nn.Module] = []
        self.labels: list[str] = []
        self.io: tuple | None = None
        self.stepped: set[int] = set()
        self.optimizers: set[int] = set()
        self.steps = 0
        self._hook = None

    def __enter__(self):
        self.walk.armed = False   # until the script's first model forward
        self.walk.__enter__()
        return self

    def __exit__(self, *exc):
        self.walk.__exit__(*exc)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_forward(self, rec, info, args) -> None:
        if not self.walk.enabled:
            return
        self.walk.armed = True
        module = info.owner or info.module
        if not any(m is module for m in self.models):
            self.models.append(module)
            self.labels.append(info.name)
            self.walk.attach(module)
        if self.io is None and torch.is_grad_enabled() and module.training and self._hook is None:
            self._hook = module.register_forward_hook(self._seen)
            self.walk.track(args)

    def _seen(self, module, args, output) -> None:
        if self.io is None and torch.is_grad_enabled():
            self.io = (args, output)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_backward(self, rec, loss) -> None:
        if self.walk.enabled:
            self.walk.watch(loss)

    def on_step_pre(self, rec, optimizer, step) -> None:
        if optimizer is not None:
            self.optimizers.add(id(optimizer))
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.requires_grad:
                        self.trained[id(p)] = p
        else:   # a hand-written update: the parameters of the models that ran
            for m in self.models:
                for p in m.parameters():
                    if p.requires_grad:
                        self.trained[id(p)] = p

    def on_step_post(self, rec, optimizer, step) -> None:
        from nnwizard.record import StopRun

        self.steps += 1
        self.stepped.add(id(optimizer))
        if optimizer is None and not self.trained:
            self.on_step_pre(rec, None, step)
        known = {id(o.optimizer) for o in rec.recording.optimizers}
        if self.steps >= WINDOW or (known and known <= self.stepped) or (optimizer is None and self.steps >= 1):
            self.walk.enabled = False
            self.walk.detach_modules()
            raise StopRun("grad-path: the first step of every optimizer was followed")


def signal_dies(rec) -> str | None:
    """What in the recording says the learning signal may die on its way back (None: nothing)."""
    steps = [s for s in rec.steps if not s.manual]
    measured = [s for s in rec.steps if s.grad_norm is not None]
    if any(s.grad_norm == 0 for s in measured):
        s = next(s for s in measured if s.grad_norm == 0)
        return f"the gradient norm was exactly 0 at step {s.step}"
    if any(s.grads_none for s in measured if s.grads_total):
        s = next(s for s in measured if s.grads_none and s.grads_total)
        return f"{s.grads_none} of {s.grads_total} trained tensors had no gradient at step {s.step}"
    updates = [s.update for s in steps if s.update is not None]
    if len(updates) >= 2 and all(u == 0 for u in updates):
        return f"no parameter changed over {len(updates)} measured steps"
    losses = [s.loss for s in rec.steps if s.loss is not None and math.isfinite(s.loss)]
    if len(losses) >= 3 and max(losses) - min(losses) <= FLAT_REL * max(abs(max(losses)), 1e-12):
        return f"the loss stayed at {losses[0]:.6g} for {len(losses)} steps"
    return None


def _script_walk(ctx: ProbeContext, target):
    from nnwizard.probes.intervene import _limit_s

    rec = target.recording
    if not rec.steps:
        return skipped("the script took no optimizer step: no backward to follow")
    why = signal_dies(rec)
    if why is None and not ctx.param("always", False):
        return passed("the recording shows gradients on every trained tensor, parameters that change and a loss that "
                      "moves: no step followed back", "not-needed")
    walk = GradWalk(files=list(target.script.files) + list(getattr(target.run, "own_files", []) or []))
    listener = _ScriptWalk(walk)
    ctx.progress(0.0, "rerunning the script's first step with its backward followed op by op")
    run = target.rerun(max_steps=WINDOW, time_limit_s=_limit_s(target, WINDOW), listeners=[listener], patches=[listener],
                       seed=ctx.seed, what="its first steps' backward followed op by op (grad-path)")
    if not walk.roots and not listener.trained:
        err = run.recording.error
        if err is not None:
            return cannot_run(f"the rerun raised before a step: {err.type}: {err.message}", reason="raised")
        return cannot_run("the rerun took no optimizer step", reason="precondition")
    names = {k: v for k, v in _names(listener.models, listener.labels if len(listener.models) > 1 else [""] * len(listener.models)).items()
             if k in listener.trained}
    for k, p in listener.trained.items():
        names.setdefault(k, f"(tensor {list(p.shape)})")
    found = walk.report(names)
    rows = _ignored_input(walk, listener.io)
    values = {names[k]: p.numel() for k, p in listener.trained.items()}
    result = _read(found, rows, values, sum(values.values()),
                   f"the script rerun for {len(run.recording.steps)} step(s) ({why or 'asked for'})")
    result.data["why"] = why or "asked for"
    return result


@probe(
    "grad-path",
    title="One backward followed op by op: where the gradient stops on its way to the parameters",
    outcomes={"ok": "every trained parameter gets a nonzero, finite gradient",
              "not-needed": "script mode: the recorded gradients and updates show a signal that arrives",
              "zero-product": "a gradient is exactly zero behind a product with zeros (a zero-initialised layer): not a fault by itself",
              "cut": "trained parameters the loss's graph never reaches: the op where their values left the graph",
              "zero": "the gradient becomes exactly zero at an op on its way to the parameters",
              "nonfinite": "the gradient becomes NaN/Inf at an op on its way to the parameters",
              "constant-output": "the model's output is the same for every input and computed without reading it",
              "no-backward": "the step ran no backward"},
    timeout_s=90,
    cost=3,
)
def grad_path(ctx: ProbeContext):
    target = ctx.target
    if getattr(target, "mode", "module") == "script" and hasattr(target, "rerun"):
        return _script_walk(ctx, target)
    return _module_walk(ctx)
