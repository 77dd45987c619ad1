"""Does the script's own reshape between the model and the loss keep the batch's samples apart?

A script may reshape, transpose or slice the model's output before its loss (``out.view(-1, V)``,
``out.transpose(0, 1)``, ``out.view(10, -1).t()``). Some of these silently move values of one sample
into another sample's row of the loss input: the code runs, the shapes agree with the targets, and the
model is trained to predict each label from other samples' outputs, so the loss stays near chance.

:class:`SampleMixing` is a recorder listener for the observed run (full mode). On the first training
loss call whose input was computed from the model's live output, it asks autograd, once, which
values of the model's output each of a few rows of the loss input depends on (a gradient of that row
under random positive weights: nonzero exactly where the row reads the output), and one more gradient
for the whole loss input. A row *mixes samples* when

- it is a rearrangement: it depends on no more output values than it holds (views, transposes,
  slices, casts, row-wise log_softmax), so it is not a contraction (``a @ b.T`` of a contrastive loss)
  or a pooling (``out.mean(0)``), which are meant to combine samples;
- it reads values of two or more samples of the output (along its batch axis: the output axis whose
  size is the loss input's row count; when none or several match, every non-feature axis must show it);
- and at least one of those samples also sends other values to other rows: the sample is split
  across rows. Grouping whole samples into one row (``scores.view(-1, n_choices)`` of a
  multiple-choice head) splits nothing and stays quiet, as do (B, T, V) -> (B*T, V) flattening and a
  time-first (T, B, V) output flattened with time-first targets (each row reads one sample).

The ``trace-sample-mixing`` probe reports what the listener measured (``recording.listened["sample-mixing"]``);
nothing is rerun. BatchNorm and attention inside the model are not judged: only the ops between
the model's output and the loss input are.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from nnwizard.probes.api import ProbeContext, failed, passed, probe, run_listener, skipped
from nnwizard.record.tensors import tensors_in
from nnwizard.probes._recording import on_recording

ROWS = 8             # loss-input rows whose dependence is measured
MAX_NUMEL = 20_000_000  # larger outputs are not judged (each gradient is the output's size)
TRIES = 3            # training loss calls tried before giving up (e.g. a loss on something else first), within the first step


@run_listener("sample-mixing")
class SampleMixing:
    """Recorder listener (see the module docstring): ``result`` is None until judged, then a dict
    (also set as ``recording.listened["sample-mixing"]``)."""

    def __init__(self):
        self.result: dict[str, Any] | None = None
        # the tensors of the last training forward's output, held until the first training loss call is judged
        # (a weak reference dies when the script rebinds its only name, out = out.transpose(0, 1).reshape(...))
        self._outs: list = []
        self._model: str | None = None
        self._handles: dict[int, Any] = {}
        self._tries = 0

    # -- listener ---------------------------------------------------------------------------------
    def on_forward(self, rec, info, args) -> None:
        if self.result is not None or not torch.is_grad_enabled() or not info.module.training:
            return
        if id(info.module) not in self._handles:
            name = info.name
            self._handles[id(info.module)] = info.module.register_forward_hook(
                lambda module, a, output, name=name: self._seen(name, output))

    def _seen(self, name: str, output) -> None:
        if self.result is not None or not torch.is_grad_enabled():
            return
        tensors = [output] if isinstance(output, torch.Tensor) else list(tensors_in(output, depth=2))
        self._outs = [t for t in tensors[:4] if t.requires_grad and t.is_floating_point()]
        self._model = name

    def on_loss_args(self, rec, call, args, kwargs, value) -> None:
        if self.result is not None or not torch.is_grad_enabled() or not self._outs:
            return
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not x.requires_grad or not x.is_floating_point():
            return
        outs = list(self._outs)
        self._tries += 1
        try:
            with torch.enable_grad():
                found = None
                for out in outs:
                    found = judge(x, out)
                    if found is not None:
                        break
        except Exception as exc:  # noqa: BLE001 - an output autograd cannot differentiate: not judged
            found = None
            if self._tries >= TRIES:
                self._finish(rec, {"judged": False, "why": f"autograd could not trace the loss input: {type(exc).__name__}"})
            return
        if found is not None:
            y = args[1] if len(args) > 1 else kwargs.get("target")
            found.update(model=self._model, fn=getattr(call, "fn", None), where=getattr(call, "where", None),
                         step=getattr(call, "step", None), target_layout=target_layout(y, len(x) if x.dim() else 0))
            self._finish(rec, found)
        elif self._tries >= TRIES:
            self._finish(rec, {"judged": False, "why": "the loss input was not computed from the model's output"})

    def on_step_post(self, rec, optimizer, step) -> None:
        # the hook comes off after the first step whatever happened: a model pickled later by the script
        # (torch.save(model, f)) must not carry it
        if self.result is None:
            self._finish(rec, {"judged": False, "why": "no loss function call on the model's output in the first step"})

    def _finish(self, rec, result: dict) -> None:
        self.result = result
        rec.recording.listened["sample-mixing"] = result
        self._outs = []
        self.close()

    def close(self) -> None:
        """Remove the forward hooks from the script's model(s)."""
        while self._handles:
            self._handles.popitem()[1].remove()


def target_layout(y: Any, rows: int) -> list[int] | None:
    """Where the loss's class-index targets come from, when that can be read off the tensor: the shape
    whose positions target row r unravels in, for a 1-D view of a whole contiguous tensor or of whole
    slices along its first axis (``tags.view(-1)``, ``source[i + 1:i + 1 + T].view(-1)``); None otherwise
    (a copy, floating-point targets, not one target per row). Read by trace-target-alignment."""
    if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.is_floating_point() or y.numel() != rows or rows < 2:
        return None
    base = y._base
    if base is None or base.dim() < 2 or not base.is_contiguous() or not y.is_contiguous():
        return None
    inner = math.prod(base.shape[1:])
    offset = y.storage_offset() - base.storage_offset()
    if inner == 0 or offset % inner or y.numel() % inner:
        return None
    return [y.numel() // inner, *base.shape[1:]]


def _ops_between(x: torch.Tensor, out: torch.Tensor, limit: int = 40) -> list[str]:
    """The autograd nodes from the loss input back to the model output (first path found), as op names."""
    target = out.grad_fn
    stack = [(x.grad_fn, [])]
    seen = 0
    while stack and seen < limit * 4:
        node, path = stack.pop()
        if node is None:
            continue
        seen += 1
        if node is target:
            return [n.removesuffix("Backward0").removesuffix("Backward1").lower() for n in reversed(path)]
        if len(path) < limit:
            stack.extend((fn, path + [type(node).__name__]) for fn, _ in node.next_functions)
    return []


def judge(x: torch.Tensor, out: torch.Tensor, rows: int = ROWS) -> dict[str, Any] | None:
    """Which samples of ``out`` each of a few rows of ``x`` reads (see the module docstring); None
    when ``x`` does not depend on ``out``."""
    if x is out:
        return {"judged": True, "mixed": False, "identity": True, "loss_input_shape": list(x.shape),
                "output_shape": list(out.shape), "rows_checked": 0, "ops": []}
    if out.grad_fn is None and not out.requires_grad:
        return None
    if out.numel() > MAX_NUMEL or x.numel() > MAX_NUMEL:
        return {"judged": False, "why": f"the output has {out.numel():,} values (more than {MAX_NUMEL:,} are not traced)"}
    gen = torch.Generator().manual_seed(0)
    weights = (torch.rand(x.shape, generator=gen) + 0.5).to(device=x.device, dtype=x.dtype)
    whole = torch.autograd.grad((x * weights).sum(), out, retain_graph=True, allow_unused=True)[0]
    if whole is None:
        return None
    base = {"judged": True, "loss_input_shape": list(x.shape), "output_shape": list(out.shape),
            "ops": _ops_between(x, out)}
    if x.dim() == 0 or len(x) < 2:
        return {**base, "mixed": False, "rows_checked": 0}
    used = whole != 0
    n = len(x)
    # rows drawn at random (seeded), not on an evenly spaced grid: a grid from the first row to the last lands on
    # the fixed points of a flatten-order permutation (rows 0 and n-1 always; for a (T, B) = (64, 8) transpose
    # every multiple of 73, i.e. all eight evenly spaced rows), where a misaligned or mixing layout reads right
    picked = sorted(torch.randperm(n, generator=gen)[:rows].tolist())
    feature_last = out.dim() >= 2
    candidates = [a for a in range(out.dim() - (1 if feature_last else 0))] or [0]
    matching = [a for a in candidates if out.shape[a] == n]
    axes = matching if len(matching) == 1 else candidates
    per_row = []
    for i in picked:
        g = torch.autograd.grad((x[i] * weights[i]).sum(), out, retain_graph=True)[0]
        reads = g != 0
        count = int(reads.sum())
        cell_mask = reads.any(-1) if feature_last else reads
        row = {"row": i, "reads": count, "holds": x[i].numel(), "rearranged": 0 < count <= x[i].numel(), "axes": {},
               "cells": cell_mask.nonzero()[:4].tolist()}  # output positions (feature axis aside) it reads
        for a in axes:
            flat_reads = reads.movedim(a, 0).reshape(out.shape[a], -1)
            flat_used = used.movedim(a, 0).reshape(out.shape[a], -1)
            samples = flat_reads.any(1).nonzero().flatten()
            split = [int(s) for s in samples if bool((flat_used[s] & ~flat_reads[s]).any())]
            row["axes"][a] = {"samples": [int(s) for s in samples[:12]], "count": len(samples), "split": len(split)}
        row["mixes"] = row["rearranged"] and all(v["count"] >= 2 and v["split"] >= 1 for v in row["axes"].values())
        per_row.append(row)
    mixed = [r for r in per_row if r["mixes"]]
    axis = axes[0] if len(axes) == 1 else None
    return {**base, "mixed": bool(mixed), "rows_checked": len(per_row), "rows_mixed": len(mixed), "batch_axis": axis,
            "axes": axes, "rows": per_row[:ROWS]}


# --------------------------------------------------------------------------------------- probe
@probe(
    "trace-sample-mixing",
    title="Does the script's reshape between the model and the loss keep each sample's values in its own row?",
    outcomes={"ok": "every checked row of the loss input reads one sample of the model's output (or combines them "
                    "by a contraction or pooling, as contrastive and pooled losses do)",
              "mixed": "rows of the loss input read values of several samples that are split across rows: the "
                       "reshape between the model and the loss mixes the batch's samples"},
    timeout_s=10,
)
@on_recording
def trace_sample_mixing(ctx: ProbeContext, rec):
    found = rec.listened.get("sample-mixing")
    if not found:
        return skipped("no training loss call on a tensor computed from the model's output was recorded")
    if not found.get("judged"):
        return skipped(f"not judged: {found.get('why', 'nothing to trace')}")
    shapes = f"{found['fn']} input {found['loss_input_shape']} from {found['model']}'s output {found['output_shape']}"
    ops = ", ".join(found.get("ops") or []) or "none"
    data = {k: v for k, v in found.items() if k != "rows"}
    data["ops_text"] = ops
    where = f" ({found['where']})" if found.get("where") else ""
    if found.get("identity"):
        return passed(f"{found['fn']} receives the model's output itself{where}", **data)
    if not found["mixed"]:
        return passed(f"{shapes}{where}: each of {found['rows_checked']} checked rows reads one sample of the output, "
                      f"or combines samples by a contraction or pooling (ops between: {ops})", **data)
    row = next(r for r in found["rows"] if r["mixes"])
    axis = found["batch_axis"] if found["batch_axis"] is not None else next(iter(row["axes"]))
    detail = row["axes"][axis]
    listed = ", ".join(str(s) for s in detail["samples"][:6]) + (", ..." if detail["count"] > 6 else "")
    data.update(example_row=row["row"], example_samples=detail["count"], example_split=detail["split"],
                samples_axis=axis)
    return failed("mixed", f"{shapes}{where}: {found['rows_mixed']} of {found['rows_checked']} checked rows mix samples; "
                  f"row {row['row']} reads {row['reads']} values from {detail['count']} different samples (output axis "
                  f"{axis}: {listed}), and {detail['split']} of those samples send their other values to other rows. "
                  f"The ops between the model and the loss ({ops}) move values across the batch", **data)
