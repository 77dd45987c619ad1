"""``script-metric-audit``: the accuracy a script prints, recomputed from the predictions and targets of its
own evaluation.

Script mode has no ``evaluate`` function to call twice; the numbers a script reports are the lines it
prints. When the observed run printed an accuracy, the script is rerun up to the end of its first
evaluation pass with :class:`MetricTap` (a recorder listener and a run patch):

- the outputs of every forward in eval mode or without grad are kept with the targets they are compared
  with (the other operand of the ``==`` the script's own code applies to a tensor computed from them; else
  the second tensor of the DataLoader batch whose first one the model received);
- the ops applied to those outputs are watched: an ``argmax``/``max``/``topk`` over a dimension of size 1
  (module mode's ``_Reductions``), and each comparison with what it compares (probabilities against class
  ids are never equal);
- every line the script prints is tapped, with the evaluation pass it follows.

The accuracy the first line after the pass prints is then judged by module mode's rules
(``probes/_metrics.py``) against the correct predictions recounted on the same samples: above 1 and no
percentage, a percentage (read as such), a fraction printed with a % sign, a sum divided by the wrong
count, 0 by construction while predictions are right, an argmax over one output.
"""

from __future__ import annotations

import re
import sys
import weakref
from pathlib import Path
from typing import Any

import torch

from nnwizard.probes._metrics import judge
from nnwizard.probes.api import ProbeContext, failed, passed, probe, skipped
from nnwizard.record.tracers import Reductions as _Reductions
from nnwizard.probes.intervene import on_script

MAX_SAMPLES = 50_000      # evaluation outputs kept (rows)
CAPTURE_BATCHES = 4       # batches per DataLoader pass (and slice loop) in the evaluation-capture rerun
# an accuracy in a printed line: "val accuracy 0.8125", "Accuracy: 9823/10000 (98%)", "acc=87.5%"
_ACC = re.compile(r"(?P<name>(?:(?:val(?:id(?:ation)?)?|test|eval(?:uation)?|dev)[ _\-]?)?acc(?:uracy)?)\b"
                  r"[^0-9\-+.\n]{0,12}?(?P<value>[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)\s*(?:/\s*(?P<total>\d+))?\s*(?P<pct>%)?",
                  re.IGNORECASE)
_COMPARISONS = {"eq", "__eq__", "ne", "__ne__"}


def printed_accuracy(line: str) -> dict | None:
    """The accuracy a printed line reports (the validation/test one when it names several), or None."""
    found = [m for m in _ACC.finditer(line)]
    if not found:
        return None
    held = [m for m in found if re.match(r"(val|test|eval|dev)", m.group("name"), re.IGNORECASE)]
    m = (held or found)[-1 if not held and len(found) > 1 else 0]
    try:
        value = float(m.group("value"))
    except ValueError:
        return None
    out = dict(name=m.group("name"), value=value, percent_sign=bool(m.group("pct")), line=line.strip()[:200])
    if m.group("total"):
        out.update(correct=value, total=int(m.group("total")))
    return out


class _LineTap:
    """A stand-in for ``sys.stdout`` that passes everything on and notes each complete line."""

    def __init__(self, inner, tap: "MetricTap"):
        self.inner, self.tap, self.partial = inner, tap, ""

    def write(self, text):
        text = str(text)
        parts = (self.partial + text).split("\n")
        self.partial = parts.pop()
        for line in parts:
            self.tap.line(line)
        return self.inner.write(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _EvalWatch(_Reductions):
    """Module mode's reduction watch (argmax/max/topk over a dimension of size 1), active during evaluation
    passes only, plus the provenance of the evaluation outputs and the comparisons made with them."""

    def __init__(self, tap: "MetricTap"):
        super().__init__()
        self.tap = tap

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tap = self.tap
        if not tap.in_eval or tap.done:
            return func(*args, **(kwargs or {}))
        out = super().__torch_function__(func, types, args, kwargs)
        try:
            tap.observe(getattr(func, "__name__", ""), args, kwargs or {}, out)
        except Exception:  # noqa: BLE001 - the watch must never break the user's computation
            pass
        return out


class MetricTap:
    """Recorder listener and run patch: see the module docstring."""

    def __init__(self, files: list | None = None):
        self.files = {str(Path(f).resolve()) for f in files or []}
        self.in_eval = False
        self.done = False
        self.phases = 0
        self.lines: list[tuple[int, str]] = []      # (evaluation pass it follows, line)
        self.outputs: list[torch.Tensor] = []       # evaluation outputs of the first pass, CPU copies
        self.inputs: list[torch.Tensor | None] = []  # the model's first argument at those forwards (leakage audit)
        self.targets: list[torch.Tensor | None] = []
        self.derived: dict[int, Any] = {}           # id -> weakref of tensors computed from evaluation outputs
        self.compares: list[dict] = []
        self.rows = 0
        self._batch = None
        self._pending: dict[int, int] = {}          # id(output) -> its index in outputs (awaiting a comparison)
        self._pass_start = 0                        # outputs kept before the pass under way
        self._hook = None
        self._mode = _EvalWatch(self)
        self._stdout = None

    # -- patch ----------------------------------------------------------------------------------------
    def __enter__(self):
        self._mode.__enter__()
        self._stdout = sys.stdout
        sys.stdout = _LineTap(self._stdout, self)
        return self

    def __exit__(self, *exc):
        if isinstance(sys.stdout, _LineTap) and sys.stdout.tap is self:
            if sys.stdout.partial:
                self.line(sys.stdout.partial)
            sys.stdout = self._stdout
        try:
            self._mode.__exit__(*exc)
        except Exception:  # noqa: BLE001 - the mode stack changed under it
            pass
        self._unhook()

    def line(self, text: str) -> None:
        if text.strip() and len(self.lines) < 2000:
            self.lines.append((self.phases, text))

    @property
    def single(self) -> list:
        return self._mode.single

    # -- listener -------------------------------------------------------------------------------------
    def on_batch(self, rec, batch, index) -> None:
        self._batch = batch

    def on_forward(self, rec, info, args) -> None:
        from nnwizard.record import StopRun

        evaluating = not torch.is_grad_enabled() or not info.module.training
        if not evaluating:
            if self.in_eval:
                self._end_pass()
            if self.done:
                raise StopRun("script-metric-audit: the first evaluation pass and its report were read")
            return
        if self.done:
            return
        if not self.in_eval:
            self.in_eval = True
            self.phases += 1
            self._pass_start = len(self.outputs)
        if self.phases == 1 and self._hook is None and self.rows < MAX_SAMPLES:
            self._hook = info.module.register_forward_hook(lambda m, a, out: self._output(a, out))

    def on_backward(self, rec, loss) -> None:
        """A backward in a pass taken for an evaluation (a training loop in eval mode): its forwards were training
        forwards after all; what was kept of them is dropped."""
        if self.in_eval:
            self.in_eval = False
            self.phases -= 1
            self.lines = [(phase, line) for phase, line in self.lines if phase <= self.phases]
            del self.outputs[self._pass_start:], self.inputs[self._pass_start:], self.targets[self._pass_start:]
            self.rows = sum(len(o) for o in self.outputs)
            self._unhook()

    def on_step_post(self, rec, optimizer, step) -> None:
        from nnwizard.record import StopRun

        if self.in_eval:
            self._end_pass()
        if self.done:
            raise StopRun("script-metric-audit: the first evaluation pass and its report were read")

    def _end_pass(self) -> None:
        self.in_eval = False
        if self.phases >= 1 and self.outputs:
            self.done = True
        self._unhook()

    def _unhook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _output(self, args, out) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        t = out if isinstance(out, torch.Tensor) else next((o for o in out if isinstance(o, torch.Tensor)), None) \
            if isinstance(out, (tuple, list)) else None
        if t is None or not t.is_floating_point() or not t.dim():
            return
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        chained = self._root(first) if first is not None and id(first) in self.derived and self.derived[id(first)]() is first \
            else None
        if chained is not None:   # a model fed another's evaluation output (head(encoder(x))): the chain's last output
            self.derived[id(t)] = weakref.ref(t)
            self._pending[id(t)] = chained
            self.outputs[chained] = t.detach().to("cpu", copy=True)
            return
        self.derived[id(t)] = weakref.ref(t)
        self._pending[id(t)] = len(self.outputs)
        self.outputs.append(t.detach().to("cpu", copy=True))
        x = args[0] if args and isinstance(args[0], torch.Tensor) and args[0].dim() and len(args[0]) == len(t) else None
        self.inputs.append(x.detach().to("cpu", copy=True) if x is not None else None)
        self.targets.append(self._paired(args))
        self.rows += len(t)

    def _paired(self, args) -> torch.Tensor | None:
        """The target of the batch whose first tensor is the model's input (an (inputs, targets) pair)."""
        batch, x = self._batch, args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None or not isinstance(batch, (tuple, list)) or len(batch) != 2:
            return None
        first, second = batch
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and len(second) == len(x) and \
                (first is x or (first.shape == x.shape and first.device == x.device and torch.equal(first, x.to(first.dtype)))):
            return second.detach().to("cpu", copy=True)
        return None

    def observe(self, name: str, args, kwargs, out) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        derived = [a for a in tensors if id(a) in self.derived and self.derived[id(a)]() is a]
        if not derived:
            return
        if name in _COMPARISONS and len(tensors) == 2 and len(derived) == 1:
            other = tensors[1] if derived[0] is tensors[0] else tensors[0]
            d = derived[0]
            root = self._root(d)
            if len(self.compares) < 256:
                scores = d.is_floating_point() and bool((d != d.round()).any())
                labels = not other.is_floating_point() or bool((other == other.round()).all())
                self.compares.append(dict(mine=f"{str(d.dtype).replace('torch.', '')}{list(d.shape)}",
                                          other=f"{str(other.dtype).replace('torch.', '')}{list(other.shape)}",
                                          float_vs_int=scores and labels, where=self._where(),
                                          equal=int(out.sum()) if isinstance(out, torch.Tensor) else None,
                                          numel=int(out.numel()) if isinstance(out, torch.Tensor) else None))
            if root is not None and self.targets[root] is None and len(other) == len(self.outputs[root]):
                self.targets[root] = other.detach().to("cpu", copy=True)
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and len(self.derived) < 4096:
                self.derived[id(t)] = weakref.ref(t)
                root = self._root(derived[0])
                if root is not None:
                    self._pending[id(t)] = root

    def _where(self) -> str | None:
        frame = sys._getframe(1)
        while frame is not None:
            if str(Path(frame.f_code.co_filename).resolve()) in self.files:
                return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
        return None

    def _root(self, t) -> int | None:
        return self._pending.get(id(t))


def _recount(target, outputs: list[torch.Tensor], targets: list) -> tuple[float, int, int] | None:
    """(correct, samples, batches) recounted by the wizard's own accuracy on the captured pairs; None when a pair
    is not one it can read (its target missing, or shapes that are no class scores against class ids)."""
    from nnwizard import reference

    correct, samples, batches = 0.0, 0, 0
    for out, y in zip(outputs, targets):
        if y is None or not isinstance(y, torch.Tensor):
            return None
        try:
            if out.dim() >= 2 and tuple(out.shape[:-1]) == tuple(y.shape) and out.shape[-1] >= 2 and not y.is_floating_point():
                right, n = float((out.argmax(-1) == y).sum()), y.numel()   # class scores on the last axis (time-first too)
            elif out.reshape(-1).shape == y.reshape(-1).shape:
                acc = reference.accuracy(out, y, "binary")
                right, n = (acc * y.numel() if acc is not None else None), y.numel()
            else:
                return None
        except RuntimeError:
            return None
        if right is None:
            return None
        correct += right
        samples += n
        batches += 1
    return (round(correct), samples, batches) if samples else None


def evaluation_capture(ctx: ProbeContext, target) -> tuple[MetricTap, Any]:
    """The script rerun to the end of its first evaluation pass with a :class:`MetricTap` (its outputs, inputs,
    targets, comparisons and printed lines), made once per diagnosis and shared by the probes that read it."""
    from nnwizard.probes.intervene import _limit_s

    cached = getattr(target, "_evaluation_capture", None)
    if cached is not None:
        return cached
    tap = MetricTap(list(target.script.files) + list(getattr(target.run, "own_files", []) or []))
    steps = max(len(target.recording.steps), 1)
    ctx.progress(0.0, "rerunning the script to its first evaluation with its predictions kept")
    # passes of at most CAPTURE_BATCHES batches: the run reaches its first evaluation (and the line it prints after
    # it) in a few steps, not after a whole observed run's worth of training
    run = target.rerun(max_steps=steps, time_limit_s=_limit_s(target, steps), listeners=[tap], patches=[tap],
                       seed=ctx.seed, limit_batches=CAPTURE_BATCHES,
                       what="its first evaluation's inputs, predictions and printed lines kept")
    target._evaluation_capture = (tap, run)
    return tap, run


def observed_accuracy_lines(run) -> list[str]:
    return [line for line in run.output if printed_accuracy(line)]


@probe(
    "script-metric-audit",
    title="The accuracy the script prints, recomputed from its own evaluation's predictions and targets",
    outcomes={"ok": "the printed accuracy agrees with the recount on the same samples",
              "percent": "the accuracy is printed in percent (consistent on that scale)",
              "above-one": "an accuracy above 1 that is no percentage",
              "argmax-single": "accuracy from an argmax over a dimension of size 1: fixed at one class",
              "wrong-count": "an accuracy divided by the wrong count",
              "fixed": "the accuracy is 0 by construction while predictions are right",
              "fraction-as-percent": "a fraction printed with a % sign",
              "no-accuracy": "the script prints no accuracy"},
    timeout_s=90,
    cost=4,
)
@on_script
def script_metric_audit(ctx: ProbeContext, target):
    printed = observed_accuracy_lines(target.run)
    if not printed:
        return passed("the script printed no accuracy: nothing to recompute", "no-accuracy")
    rec = target.recording
    tap, run = evaluation_capture(ctx, target)
    data: dict[str, Any] = dict(printed=printed[:3], rerun_steps=len(run.recording.steps), compares=tap.compares[:3])
    after = [(phase, line) for phase, line in tap.lines if phase >= 1]
    report = next((printed_accuracy(line) for phase, line in after if phase == 1 and printed_accuracy(line)), None)
    # what the audit cannot read adds no evidence either way: skipped, with why (the script's own metric code)
    if not tap.outputs:
        return skipped("the rerun ran no evaluation forward (eval mode or no_grad) before it ended: nothing to recount",
                       **data)
    if report is None:
        return skipped("no accuracy was printed right after the first evaluation pass of the rerun (printed later, or "
                       "of something else): nothing to compare", **data)
    data.update(line=report["line"], key=report["name"], first=report["value"])
    recount = _recount(target, tap.outputs, tap.targets)
    on_rows = sum(len(o) for o in tap.outputs)
    if tap.single:
        name, shape = tap.single[0]
        data.update(op=name, op_shape=shape)
        return failed("argmax-single", f"the script prints \"{report['line']}\" after an evaluation that takes {name} over "
                      f"a dimension of size 1 (input {shape}): every prediction is class 0, so {report['name']} = "
                      f"{report['value']:.4g} is the share of class-0 targets whatever the model learns", **data)
    if recount is None:
        return skipped(f"the evaluation's targets could not be paired with its {on_rows} outputs (no comparison with "
                       f"them, no (inputs, targets) batch): nothing to recount", **data)
    correct, samples, batches = recount
    loader = _eval_loader(rec)
    counts = {"samples": samples, "batches": batches}
    allowed = ("samples",)
    if loader is not None and loader.dataset_len:
        counts["dataset"] = loader.dataset_len
        if loader.dataset_len > samples:
            allowed = ("samples", "dataset")   # the pass was cut short by the run's cap: the script's full count stands
    if loader is not None and loader.batch_size:
        counts["batch size"] = loader.batch_size
    value = report["value"]
    if "total" in report:   # "9823/10000": the count and its denominator, printed
        value = report["value"] / report["total"] if report["total"] else value
        counts.setdefault("printed total", report["total"])
    on = f"{samples} evaluation samples in {batches} batches (rerun)"
    verdict = judge(report["name"], value, correct, counts, on, percent_sign=report["percent_sign"] and "total" not in report,
                    allowed=allowed, fixed_zero=True)
    data.update(verdict.data, correct=correct, samples=samples, batches=batches, accuracy=correct / samples)
    head = f"the script prints \"{report['line']}\"; "
    if verdict.outcome == "fixed" and tap.compares:
        c = next((c for c in tap.compares if c["float_vs_int"]), tap.compares[0])
        at = f" at {c['where']}" if c.get("where") else ""
        why = (f": its comparison `==`{at} takes {c['mine']} computed from the outputs and {c['other']}"
               + (" (continuous scores against whole-number labels, which are never equal)" if c["float_vs_int"] else "")
               + (f": {c['equal']} of {c['numel']} equal" if c.get("equal") is not None else ""))
        data.update(compare_where=c.get("where") or "?", compare_scores=c["float_vs_int"])
        return failed("fixed", head + verdict.text + why, **data)
    if verdict.outcome == "percent":
        return passed(head + verdict.text, "percent", **data)
    if verdict.outcome is not None:
        return failed(verdict.outcome, head + verdict.text, **data)
    return passed(head + verdict.text, **data)


def _eval_loader(rec):
    """The DataLoader whose passes ran no backward (the evaluation's), if one."""
    loaders = [info for info in rec.loaders if info.iterations and not any(info.backwards)]
    return loaders[0] if loaders else None
