"""Parameter registration: layers and learnable tensors that the forward pass uses but
``model.parameters()`` does not contain. nn.Module registers a sub-module or an nn.Parameter only
when it is assigned directly as an attribute; one kept in a plain list, dict or tuple, or a tensor
created with ``requires_grad=True`` and stored as a plain attribute, is invisible to the optimizer,
to ``.to(device)`` and to ``state_dict``.

Two independent measurements: a walk over every module's attributes (naming where each such object
lives), and the autograd leaves reached from the loss (which ones the loss really depends on)."""

from __future__ import annotations

import torch
from torch import nn

from nnwizard.record.autograd import graph_nodes
from nnwizard.record.frames import first_line
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe
from nnwizard.target import LossNotReplayable

_INTERNAL = set(vars(nn.Module()))  # _parameters, _modules, _buffers, hooks, training...
_MAX_DEPTH = 4


def _walk(value, label: str, depth: int, seen: set[int]):
    """Yield (attribute path, object, container kind) for modules and tensors inside plain containers."""
    if id(value) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(value))
    if isinstance(value, (nn.Module, torch.Tensor)):
        yield label, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{label}[{key!r}]", depth + 1, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            yield from _walk(item, f"{label}[{index}]", depth + 1, seen)


def attribute_findings(model: nn.Module, registered: set[int]) -> list[dict]:
    """Modules holding unregistered parameters, and leaf tensors requiring grad, that live in a
    module's ``__dict__`` (plain attributes, lists, dicts, tuples) rather than in its registries."""
    findings: list[dict] = []
    seen: set[int] = set()
    for mpath, module in model.named_modules():
        owner = type(module).__name__
        for name, value in vars(module).items():
            if name in _INTERNAL:
                continue
            root = f"{mpath}.{name}" if mpath else name
            kind = type(value).__name__
            for label, obj in _walk(value, root, 0, seen):
                if isinstance(obj, nn.Module):
                    params = [p for p in obj.parameters() if id(p) not in registered]
                    if params:
                        findings.append(dict(attribute=label, holder=root, holder_kind=kind, owner=owner,
                                             object=type(obj).__name__, parameters=sum(p.numel() for p in params),
                                             tensors=[id(p) for p in params], what="module"))
                elif obj.requires_grad and obj.grad_fn is None and id(obj) not in registered:
                    findings.append(dict(attribute=label, holder=root, holder_kind=kind, owner=owner,
                                         object=f"{'Parameter' if isinstance(obj, nn.Parameter) else 'tensor'} {list(obj.shape)}",
                                         parameters=obj.numel(), tensors=[id(obj)], what="tensor"))
    return findings


def _loss_leaves(loss: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every autograd leaf the loss depends on (the variables of its AccumulateGrad nodes)."""
    leaves: dict[int, torch.Tensor] = {}
    if loss.grad_fn is None:
        return leaves
    for node in graph_nodes([loss]):
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves[id(variable)] = variable
    return leaves


def _global_names(namespace, wanted: set[int]) -> dict[int, str]:
    names = {}
    for name, value in vars(namespace).items() if hasattr(namespace, "__dict__") else []:
        for label, obj in _walk(value, name, 0, set()):
            if isinstance(obj, torch.Tensor) and id(obj) in wanted:
                names[id(obj)] = label
    return names


@probe(
    "parameter-registration",
    title="Layers and learnable tensors used by the model but missing from model.parameters()",
    outcomes={
        "ok": "everything the loss depends on is a registered parameter",
        "unregistered": "the forward pass uses modules or tensors requiring grad that model.parameters() lacks",
        "held-unused": "modules or tensors requiring grad sit in plain containers but the loss does not use them",
    },
    timeout_s=60,
    cost=2,
)
def parameter_registration(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed).train()
    registered = {id(p) for p in model.parameters()}
    findings = attribute_findings(model, registered)
    inputs, targets = target.batch()
    data: dict = {"registered": sum(p.numel() for p in model.parameters()), "model": type(model).__name__}
    leaves: dict[int, torch.Tensor] = {}
    error = None
    try:
        with torch.enable_grad():
            outputs = model(inputs)
            try:
                loss = target.loss_fn(outputs, targets)
            except LossNotReplayable:   # the forward's own leaves: all the loss could reach through the model
                first = outputs if isinstance(outputs, torch.Tensor) else \
                    next((o for o in outputs if isinstance(o, torch.Tensor)), None) if isinstance(outputs, (tuple, list)) else None
                loss = first.float().sum() if first is not None and first.requires_grad else None
                data["loss_not_replayed"] = True
        leaves = _loss_leaves(loss) if isinstance(loss, torch.Tensor) else {}
    except Exception as exc:  # e.g. unregistered layers left on the CPU: a device mismatch
        from nnwizard.probes._crash import crash_kind

        error = first_line(exc)
        data.update(error=error, device_error=crash_kind(exc) == "device")
    extra = {k: v for k, v in leaves.items() if k not in registered and k != id(inputs)}
    for f in findings:
        f["used"] = sum(1 for t in f["tensors"] if t in extra)
    known = {t for f in findings for t in f["tensors"]}
    orphans = [t for k, t in extra.items() if k not in known]
    if orphans:  # reached from the loss, held by no module attribute: a global, or created in forward
        names = _global_names(target.namespace, {id(t) for t in orphans})
        for t in orphans:
            label = names.get(id(t))
            findings.append(dict(attribute=label or f"(a {list(t.shape)} tensor created during the forward pass)",
                                 holder=label or "", holder_kind="global" if label else "temporary",
                                 owner="module namespace" if label else "forward", object=f"tensor {list(t.shape)}",
                                 parameters=t.numel(), tensors=[id(t)], what="tensor", used=1))
    data.update(loss_leaves=len(leaves), unregistered_leaves=len(extra))
    if not findings and error is not None:  # half the measurement (the loss's leaves) is missing
        return cannot_run(f"no module or tensor requiring grad is held in plain attributes, but the forward raised "
                          f"({error}), so the tensors the loss uses could not be checked", reason="raised", **data)
    if not findings:
        reaches = "the output (the loss is not replayed)" if data.get("loss_not_replayed") else "the loss"
        return passed(f"{type(model).__name__}: {reaches} reaches {len(leaves)} leaf tensors, all registered parameters "
                      f"({data['registered']:,} values)", **data)

    groups: dict[str, dict] = {}
    for f in findings:
        g = groups.setdefault(f["holder"] or f["attribute"], dict(f, objects=[], parameters=0, used=0, count=0))
        g["objects"].append(f["object"])
        g["parameters"] += f["parameters"]
        g["used"] += f["used"]
        g["count"] += 1
    rows = [[name, g["holder_kind"], g["count"], ", ".join(sorted(set(g["objects"])))[:80], g["parameters"], g["used"]]
            for name, g in groups.items()]
    table = Table("unregistered", "Learnable objects outside model.parameters()",
                  ["attribute", "held in", "objects", "types", "values", "tensors the loss uses"], rows,
                  marked=[i for i, r in enumerate(rows) if r[5]])
    top_name, top = max(groups.items(), key=lambda kv: (kv[1]["used"], kv[1]["parameters"]))
    used = sum(g["used"] for g in groups.values())
    types = sorted(set(top["objects"]))
    kind = top["holder_kind"]
    held = (f"a plain {kind}" if kind in ("list", "dict", "tuple", "set") else "a plain tensor attribute" if kind in ("Tensor", "Parameter")
            else "a module-level global" if kind == "global" else "no attribute" if kind == "temporary" else f"a plain {kind}")
    data.update(attribute=top_name, holder_kind=kind, held_in=held, owner=top["owner"], objects=top["count"],
                object_types=", ".join(types), unregistered_values=sum(g["parameters"] for g in groups.values()),
                attributes=list(groups), used_tensors=used)
    head = (f"'{top_name}' of {top['owner']} is {held} holding {top['count']} {', '.join(types)} "
            f"({top['parameters']:,} values) that model.parameters() does not contain")
    if len(groups) > 1:
        head += f"; also {', '.join(repr(n) for n in list(groups) if n != top_name)}"
    if used:
        return failed("unregistered", f"{head}; the loss depends on {used} of these tensors (autograd leaves outside "
                      f"the {len(registered)} registered parameters), so the optimizer never updates them", [table], **data)
    if error is not None:
        return failed("unregistered", f"{head}; the forward pass raised ({error})", [table], **data)
    return passed(f"{head}; the loss does not use them", "held-unused", [table], **data)
