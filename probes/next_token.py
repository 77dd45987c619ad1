"""Next-token targets: does the model see what it is asked to predict, and is each loss row paired
with the target of the position it was computed at?

A language model (or any next-step predictor) trains on targets that are its own input shifted along
the sequence: ``y[t] == x[t + 1]``. Two faults keep such a script running, with no error and a
plausible curve:

- *the future is visible*: the output at position ``t`` depends on ``x[t + 1]``, its own target
  (attention without its causal mask, ``is_causal`` forgotten, a bidirectional RNN). The model learns to
  copy the next token; the training loss falls, generation is garbage. On a small run the curve looks
  like the healthy model's plateau, so no curve-based probe can tell.
- *rows paired with the wrong target*: the script's reshape between the model and the loss keeps each
  row to one position of the output, but not the position the row's target belongs to (a time-first
  ``(T, B, V)`` output flattened batch-first against time-first targets). Each row reads one whole
  sample, so ``trace-sample-mixing`` rightly finds no mixing.

Both are judged only where the next-token relation is measured on the real recorded pair: an input
tensor of the model's first training forward ``x`` and the target of the first training loss call
``y``, with as many values as ``x`` and, laid out as ``x``, equal to ``x`` shifted by one along one axis
at >= 90% of the positions (and not a copy of ``x``). Nothing is assumed from names or shapes alone.

- ``trace-future-leak`` (counterfactual, no training): the model as it was before its first forward, in
  eval mode and without gradients, is called twice with the recorded arguments: as recorded, and with
  the input's second half along the sequence axis replaced by other values of the same batch. A model
  that cannot see the future gives bit-for-bit the same outputs at the first half's positions; the
  difference measured there (against the difference between two identical calls) is the evidence.
- ``trace-target-alignment`` reads what ``trace-sample-mixing``'s listener measured on the live graph
  (which output position each checked loss row reads) and compares it with the position of that row's
  target (the targets are laid out as ``x``: that is what the relation measured).

``FirstForwards`` is the recorder listener that keeps the arguments and keyword arguments of each
model's first training forward (the recorder's ``model_inputs`` keep no keyword arguments, and a
``has_mask=False`` is exactly what matters here).
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

import torch

from nnwizard.probes.api import ProbeContext, cannot_run, failed, passed, probe, run_listener, skipped
from nnwizard.probes._recording import on_recording

MIN_SHARE = 0.9      # positions where y[t] == x[t + 1], for the next-token relation
MIN_LENGTH = 4       # sequence positions needed to judge
REL_TOL = 1e-4       # a first-half output change above this share of the output's scale is a dependence


# ------------------------------------------------------------------------------------ listener
@run_listener("first-forwards")
class FirstForwards:
    """Run listener: ``recording.listened["first-forwards"]`` = {model index: (args, kwargs)}, CPU copies of
    each model's first training forward (grad mode on, model in training mode)."""

    def __init__(self):
        self.calls: dict[int, tuple] = {}
        self._handles: dict[int, Any] = {}

    def on_forward(self, rec, info, args) -> None:
        index = info.index
        if index in self.calls or index in self._handles or len(self._handles) + len(self.calls) >= 4:
            return
        if not torch.is_grad_enabled() or not info.module.training:
            return
        from nnwizard.record import cpu_copy

        def keep(module, a, kw, index=index):
            self.calls[index] = (cpu_copy(tuple(a)), cpu_copy(dict(kw)))
            rec.recording.listened["first-forwards"] = self.calls
            handle = self._handles.pop(index, None)
            if handle is not None:
                handle.remove()

        self._handles[index] = info.module.register_forward_pre_hook(keep, with_kwargs=True, prepend=True)

    def close(self) -> None:
        """Remove the hooks not yet fired (a model pickled later must not carry them)."""
        while self._handles:
            self._handles.popitem()[1].remove()


# ------------------------------------------------------------------------------------ relation
def _share(equal: torch.Tensor, counted: torch.Tensor | None) -> float:
    """The share of ``equal`` positions among the ``counted`` ones (all, when None; 0 when none is counted)."""
    if counted is None:
        return float(equal.float().mean())
    n = int(counted.sum())
    return float((equal & counted).sum()) / n if n else 0.0


def shift_axis(x: torch.Tensor, y: Any, ignore: int | None = None) -> tuple[int, float, tuple] | None:
    """The axis along which ``y`` is ``x`` shifted by one, the share of positions where it holds, and the
    order ``perm`` of x's axes in which ``y``'s values are laid out (``y`` flat is x's positions in that
    order: the identity for ``y = x_next.view(-1)``, reversed for ``y = x_next.t().reshape(-1)``); None when
    there is none (or ``y`` is a copy of ``x``, or ``x`` repeats itself along the axis). Targets equal to
    ``ignore`` (the loss's ``ignore_index``: padding past a word's end) are not counted."""
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.numel() != y.numel():
        return None
    if x.dim() == 0 or x.dim() > 3 or x.is_floating_point() != y.is_floating_point() or x.is_complex():
        return None
    best = None
    for perm in itertools.permutations(range(x.dim())):
        laid = y.reshape([x.shape[p] for p in perm]).permute(*_inverse(perm)).to(x.dtype)
        counted_all = laid != ignore if ignore is not None else None
        for axis in range(x.dim()):
            n = x.shape[axis]
            if n < MIN_LENGTH:
                continue
            nxt = x.narrow(axis, 1, n - 1)
            counted = counted_all.narrow(axis, 0, n - 1) if counted_all is not None else None
            if counted is not None and int(counted.sum()) < 2 * MIN_LENGTH:
                continue
            share = _share(laid.narrow(axis, 0, n - 1) == nxt, counted)
            repeats = _share(x.narrow(axis, 0, n - 1) == nxt, counted)   # (padding repeats itself: not counted)
            copied = _share(laid == x, counted_all)
            if share >= MIN_SHARE and repeats < 0.5 and copied < 0.5 and (best is None or share > best[1]):
                best = (axis, share, perm)
    return best


def ignored_target(call) -> int | None:
    """The class id a classification loss call leaves out (its ``ignore_index``, -100 unless given)."""
    if call.fn not in ("cross_entropy", "nll_loss"):
        return None
    kwargs = call.replay[2] if call.replay else {}
    value = kwargs.get("ignore_index", -100)
    return int(value) if isinstance(value, int) else None


def _inverse(perm: tuple) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def target_position(row: int, x_shape: list, perm: tuple) -> tuple[int, ...]:
    """The position in x of loss target ``row``, for targets laid out in the axis order ``perm``."""
    flat = [int(i) for i in torch.unravel_index(torch.tensor(row), tuple(x_shape[p] for p in perm))]
    pos = [0] * len(perm)
    for i, p in enumerate(perm):
        pos[p] = flat[i]
    return tuple(pos)


def _first_pair(rec) -> tuple | None:
    """(the main model's ModelInfo, the first training LossCall, that model's first training forward's args and
    kwargs) when all are recorded and the loss target is a tensor; None otherwise."""
    from nnwizard.script_target import first_training_call, main_model

    info = main_model(rec)
    call = first_training_call(rec)
    calls = rec.listened.get("first-forwards") or {}
    if info is None or call is None or info.index not in calls or not isinstance(call.targets, torch.Tensor):
        return None
    return (info, call, *calls[info.index])


def _slots(args: tuple, kwargs: dict) -> list[tuple]:
    """(argument index or keyword, value) of every argument of a call."""
    return list(enumerate(args)) + list(kwargs.items())


def _given_targets(call, args: tuple, kwargs: dict) -> int | None:
    """The argument that is the loss target itself, given to a model that computes its own loss beside its
    input (nanoGPT's and makemore's ``model(X, Y)``): it is no input to compare the target with. None when
    that argument is the model's only tensor input (``model(x)`` with ``x`` also the target is the copy bug)."""
    slot = call.target_arg
    if slot is None or not any(isinstance(v, torch.Tensor) for k, v in _slots(args, kwargs) if k != slot):
        return None
    return slot


def _slot_name(slot) -> str:
    return f"argument {slot}" if isinstance(slot, int) else f"{slot}="


def next_token_pair(rec) -> dict | None:
    """The main model's first training forward and the first training loss target, when the target is an
    input of that forward shifted by one: {info (the ModelInfo), call (the LossCall), args, kwargs, slot (argument
    index or keyword), x (that input), axis, share, perm (see :func:`shift_axis`), target}."""
    first = _first_pair(rec)
    if first is None:
        return None
    info, call, args, kwargs = first
    ignore = ignored_target(call)
    given = _given_targets(call, args, kwargs)
    for slot, value in _slots(args, kwargs):
        if slot == given:
            continue
        found = shift_axis(value, call.targets, ignore)
        if found is not None:
            masked = ignore is not None and bool((call.targets == ignore).any())
            return {"info": info, "call": call, "args": args, "kwargs": kwargs, "slot": slot, "axis": found[0],
                    "share": found[1], "perm": found[2], "x": value, "target": call.targets,
                    "ignore": ignore if masked else None}
    return None


def copied_input(rec) -> dict | None:
    """The main model's first training forward and a class-index loss target that is exactly one of its
    integer inputs (every position, the same layout): {info, slot, x}; None otherwise. Denoising and masked
    objectives change some positions, so they never match exactly."""
    from nnwizard.script_target import CLASSIFICATION_FNS

    first = _first_pair(rec)
    if first is None or first[1].fn not in CLASSIFICATION_FNS:
        return None
    info, call, args, kwargs = first
    y = call.targets
    ignore = ignored_target(call)
    given = _given_targets(call, args, kwargs)
    for slot, value in _slots(args, kwargs):
        if slot == given:
            continue
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel() == y.numel() >= 8 \
                and value.dim() >= 2 and not y.is_floating_point() and len(torch.unique(value)) > 1:
            flat, target = value.reshape(-1), y.reshape(-1).to(value.dtype)
            counted = target != ignore if ignore is not None else torch.ones_like(target, dtype=torch.bool)
            if int(counted.sum()) >= 8 and torch.equal(flat[counted], target[counted]):
                return {"info": info, "slot": slot, "x": value}
    return None


def _with_input(args: tuple, kwargs: dict, slot, value) -> tuple[tuple, dict]:
    if isinstance(slot, int):
        return tuple(value if i == slot else a for i, a in enumerate(args)), kwargs
    return args, {**kwargs, slot: value}


def _per_position(output: Any, x: torch.Tensor) -> torch.Tensor | None:
    """The model's main output laid out as (*x.shape, features): its leading axes are x's, or one axis
    of x.numel() rows (a model that flattens its positions, as many LMs do before their loss)."""
    stack = [output]
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            if not item.is_floating_point() or item.numel() % max(x.numel(), 1):
                continue
            if list(item.shape[:x.dim()]) == list(x.shape) or (item.dim() <= 2 and item.shape[0] == x.numel()):
                return item.reshape(*x.shape, -1)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
    return None


def future_dependence(model: torch.nn.Module, args: tuple, kwargs: dict, slot, axis: int,
                      device: torch.device | str = "cpu", seed: int = 0) -> dict:
    """Call ``model`` (eval mode, no gradients) on the recorded arguments and on the same with the input in
    ``slot`` changed from the middle of ``axis`` on; how much the outputs at the positions before the
    middle moved (see the module docstring)."""
    from nnwizard.target import to_device

    x = args[slot] if isinstance(slot, int) else kwargs[slot]
    n = x.shape[axis]
    cut = n // 2
    gen = torch.Generator().manual_seed(seed)
    changed = x.clone()
    tail = changed.narrow(axis, cut, n - cut)
    pool = x.reshape(-1)
    tail.copy_(pool[torch.randint(0, pool.numel(), tail.shape, generator=gen)])
    tail_changed = float((tail != x.narrow(axis, cut, n - cut)).float().mean())
    was_training = model.training
    model.eval()
    outs = []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for value in (x, x, changed):
                torch.manual_seed(seed)
                a, kw = _with_input(args, kwargs, slot, value)
                out = _per_position(model(*to_device(a, device), **to_device(kw, device)), x)
                if out is None:
                    return {"judged": False, "why": "no output of the model has one row per input position"}
                outs.append(out.detach().float().cpu())
    finally:
        model.train(was_training)
    base, again, moved = outs
    noise = float((again - base).abs().max())
    scale = float(base.abs().max()) or 1.0
    before = (moved.narrow(axis, 0, cut) - base.narrow(axis, 0, cut)).abs()
    after = float((moved.narrow(axis, cut, n - cut) - base.narrow(axis, cut, n - cut)).abs().max())
    floor = max(REL_TOL * scale, 10 * noise)
    per_position = before.movedim(axis, 0).reshape(cut, -1).amax(1)
    changed_positions = int((per_position > floor).sum())
    return {"judged": True, "length": n, "cut": cut, "tail_changed": tail_changed, "noise": noise, "scale": scale,
            "first_half_change": float(before.max()), "second_half_change": after, "floor": floor,
            "positions_changed": changed_positions, "last_before_cut": float(per_position[-1]),
            "reached": after > floor, "sees_future": changed_positions > 0}


def _relation_text(pair: dict) -> str:
    name = _slot_name(pair["slot"])
    order = "" if list(pair["perm"]) == sorted(pair["perm"]) else f", flattened with its axes in the order {list(pair['perm'])}"
    counted = f" the loss counts (ignore_index {pair['ignore']} left out)" if pair.get("ignore") is not None else ""
    return (f"the loss targets are {pair['info'].name}'s input ({name}, shape {list(pair['x'].shape)}) shifted by one "
            f"along axis {pair['axis']} at {pair['share']:.0%} of positions{counted}{order}")


# --------------------------------------------------------------------------------------- probes
@probe(
    "trace-future-leak",
    title="Can the model see the next-token targets it is trained to predict?",
    outcomes={"ok": "the outputs before a position do not change when the inputs from that position on change",
              "sees-future": "outputs at earlier positions change when only later inputs change: the model sees "
                             "the tokens it is asked to predict (no causal mask)",
              "copies-input": "the class-index targets are exactly one of the model's token inputs: not shifted"},
    timeout_s=20,
)
@on_recording
def trace_future_leak(ctx: ProbeContext, rec):
    pair = next_token_pair(rec)
    if pair is None:
        copy_of = copied_input(rec)
        if copy_of is not None:
            slot = copy_of["slot"]
            name = _slot_name(slot)
            return failed("copies-input", f"the class-index targets of the first training loss call are exactly "
                          f"{copy_of['info'].name}'s input ({name}, shape {list(copy_of['x'].shape)}) at every one of "
                          f"its {copy_of['x'].numel()} positions: each position is trained to predict the token it is "
                          f"given, which it learns by copying; next-token targets are the input shifted by one",
                          model=copy_of["info"].name, slot=str(slot))
        return skipped("the loss targets are not an input of the model shifted by one (no next-token prediction "
                       "recorded)")
    info = pair["info"]
    if info.initial is None:
        return cannot_run(f"{info.name} could not be copied at its initial state")
    model = copy.deepcopy(info.initial).to(ctx.target.device)
    try:
        found = future_dependence(model, pair["args"], pair["kwargs"], pair["slot"], pair["axis"], ctx.target.device)
    except Exception as exc:  # noqa: BLE001 - the script's model refused the recorded call again
        return cannot_run(f"{info.name} raised when called again on its recorded input: {type(exc).__name__}: {exc}",
                          reason="raised")
    relation = _relation_text(pair)
    data = {k: v for k, v in found.items()}
    data.update(model=info.name, axis=pair["axis"], share=pair["share"], slot=str(pair["slot"]))
    if not found["judged"]:
        return cannot_run(f"{relation}, but {found['why']}", **data)
    if not found["reached"]:
        return cannot_run(f"{relation}, but changing the input's positions {found['cut']}-{found['length'] - 1} "
                          f"changed none of the outputs there: the model's output does not follow this input", **data)
    options = ", ".join(f"{k}={v!r}" for k, v in pair["kwargs"].items() if isinstance(v, (bool, int, float, str, type(None))))
    called = f", called as the script called it ({options})" if options else ""
    changed = (f"with the input's positions {found['cut']}-{found['length'] - 1} along axis {pair['axis']} replaced "
               f"by other values of the same batch (in eval mode, no dropout), {info.name} as built{called}")
    if not found["sees_future"]:
        return passed(f"{relation}; {changed} gave the same outputs at positions 0-{found['cut'] - 1} "
                      f"(largest change {found['first_half_change']:.2g}): no position sees a later one", **data)
    return failed("sees-future", f"{relation}; {changed} changed the outputs at {found['positions_changed']} of the "
                  f"{found['cut']} earlier positions 0-{found['cut'] - 1} by up to {found['first_half_change']:.3g} "
                  f"(outputs of scale {found['scale']:.3g}; two identical calls differ by {found['noise']:.2g}). "
                  f"Position {found['cut'] - 1} is trained to predict the token at position {found['cut']}, and reads "
                  f"it: the model sees its own targets", **data)


def misaligned_rows(mixing: dict, x_shape: list, perm: tuple) -> dict | None:
    """From ``trace-sample-mixing``'s rows (the output cells each read): which rows read the output at a
    position other than their target's (target row r sits at position r of x laid out flat in the axis
    order ``perm``)."""
    out_shape = mixing.get("output_shape") or []
    lead = out_shape[:-1]
    numel = math.prod(x_shape)
    if list(lead) == list(x_shape):
        to_position = tuple
    elif lead == [numel]:
        def to_position(cell):
            return tuple(int(i) for i in torch.unravel_index(torch.tensor(cell[0]), tuple(x_shape)))
    else:
        return None
    rows = [r for r in mixing.get("rows", []) if len(r.get("cells", [])) == 1]
    if not rows or mixing.get("loss_input_shape", [0])[0] != numel:
        return None
    checked = []
    for r in rows:
        wanted = target_position(r["row"], x_shape, perm)
        got = to_position(r["cells"][0])
        checked.append({"row": r["row"], "target_at": list(wanted), "reads": list(got), "aligned": got == wanted})
    return {"rows": checked, "misaligned": [c for c in checked if not c["aligned"]]}


@probe(
    "trace-target-alignment",
    title="Is each loss row computed at the position of its own next-token target?",
    outcomes={"ok": "each checked loss row reads the model's output at the position its target belongs to",
              "misaligned": "loss rows read the output at other positions than their targets': outputs and "
                            "targets are flattened in different orders"},
    timeout_s=10,
)
@on_recording
def trace_target_alignment(ctx: ProbeContext, rec):
    mixing = rec.listened.get("sample-mixing") or {}
    if not mixing.get("judged") or mixing.get("identity") or mixing.get("mixed"):
        why = ("the loss receives the model's output itself" if mixing.get("identity") else
               "rows mix samples (trace-sample-mixing)" if mixing.get("mixed") else
               mixing.get("why", "the loss input was not traced to the model's output"))
        return skipped(f"not judged: {why}")
    layout = _targets_layout(rec, mixing)
    if layout is None:
        return skipped("where each loss target sits is not known: the targets are not the model's input shifted by "
                       "one, nor a flat view of a tensor laid out like the model's output positions")
    shape, perm, relation = layout
    found = misaligned_rows(mixing, shape, perm)
    if found is None:
        return skipped(f"{relation}, but the model's output {mixing.get('output_shape')} and the loss input "
                       f"{mixing.get('loss_input_shape')} do not lay out one row per position")
    data = {"rows": found["rows"], "positions": shape, "perm": list(perm), "output_shape": mixing.get("output_shape"),
            "ops_text": ", ".join(mixing.get("ops") or []) or "none"}
    bad = found["misaligned"]
    if len(bad) < 2 or len(bad) * 2 < len(found["rows"]):
        return passed(f"{relation}; {len(found['rows']) - len(bad)} of {len(found['rows'])} checked loss rows read the "
                      f"output at their target's position", **data)
    example = bad[0]
    order = "" if list(perm) == sorted(perm) else f" with its axes in the order {list(perm)}"
    return failed("misaligned", f"{relation}, so loss row r's target belongs to position r of {shape} laid out "
                  f"flat{order}; {len(bad)} of {len(found['rows'])} checked rows read the output at another position: "
                  f"row {example['row']} is scored against the target of position {example['target_at']} but reads "
                  f"{mixing.get('model')}'s output {mixing.get('output_shape')} at {example['reads']} (ops between: "
                  f"{data['ops_text']}). The output and the targets are flattened in different orders", **data)


def _targets_layout(rec, mixing: dict) -> tuple[list, tuple, str] | None:
    """(positions shape, targets' axis order, the relation in words): from the next-token relation when
    there is one (measured on values), else from the targets' view (mixing's ``target_layout``) when it
    matches the output's positions as they are or transposed, and no two position axes have one size."""
    pair = next_token_pair(rec)
    if pair is not None:
        return list(pair["x"].shape), pair["perm"], _relation_text(pair)
    seen = mixing.get("target_layout")
    lead = list((mixing.get("output_shape") or [])[:-1])
    if not seen or len(lead) < 2 or len(set(lead)) != len(lead):
        return None
    text = f"the loss targets are a flat view of a {seen} tensor and {mixing.get('model')}'s output has positions {lead}"
    if seen == lead:
        return lead, tuple(range(len(lead))), text
    if len(lead) == 2 and seen == lead[::-1]:
        return lead, (1, 0), text + " (transposed)"
    return None
