"""The graph mode (full mode): a ``TorchFunctionMode`` over the user's own loop code that notices

- arithmetic on a loss tensor after its backward producing a tensor that requires grad, kept across steps
  (``total += loss``: every step's graph stays alive): ``Recording.graph_kept``;
- predictions and targets taken from a model's output (argmax, a threshold, a detached copy):
  ``ForwardEvent.scored``, ``LossCall.target_is_output``;
- hand-written parameter updates (in-place ops on trainable parameters outside ``optimizer.step()``,
  see ``manual.py``);
- a DataLoader batch's labels followed into a model's input (``Recording.label_inputs``).

It watches only the user's loop: it leaves the mode stack while a model forward, a DataLoader fetch,
``optimizer.step()``, a loss function, backward or zero_grad runs (:meth:`GraphMode.pause` /
:meth:`GraphMode.resume`, called by the patches), so the ops inside them cost no Python call. After the first
MODE_FIRST steps it is on the stack for two consecutive steps in every MODE_EVERY only
(:meth:`GraphMode.due`: what it looks for recurs at every step of a loop that has it), from any forward in
eval mode or without grad to the next step's end (an evaluation's predictions), and on every step once a
hand-written update or a model fed with labels is being followed.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.manual import ManualUpdates
    from nnwizard.record.records import ForwardEvent
    from nnwizard.record.recorder import Recorder

MODE_FIRST = 8    # the graph mode watches every step up to this one (and while labels are followed),
MODE_EVERY = 8    # then two consecutive steps in every MODE_EVERY (the second step sees a graph kept from the first)
LABEL_FORWARDS = 16  # the first training forwards whose arguments are checked for the batch's labels (label_inputs)

# ops whose result, taken from a tensor that carries a graph (a model output), is a prediction, not
# a target; and ops that keep that provenance (reshape, cast)
_FROM_OUTPUT = {"argmax", "max", "detach", "topk", "round", "__gt__", "__ge__", "gt", "ge", "sign", "clone"}
_INPLACE_SETS = {"__set__", "__isub__", "__iadd__", "__imul__", "__itruediv__"}
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                              "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"})
_SCORES = {"argmax", "max", "topk", "round", "__gt__", "__ge__", "gt", "ge", "sign", "sigmoid", "softmax"}
_KEEPS_PROVENANCE = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "long", "float", "int", "to", "type",
                     "__getitem__", "contiguous", "clone", "view_as", "reshape_as", "double", "detach"}

_stack_len = torch._C._len_torch_function_stack
_stack_pop = torch._C._pop_torch_function_stack
_stack_push = torch._C._push_on_torch_function_stack
_stack_at = torch._C._get_function_stack_at


def remove_mode(mode: TorchFunctionMode) -> None:
    """Take ``mode`` out of the torch-function mode stack wherever it is (modes the script entered
    above it and left open keep their order)."""
    above = []
    while _stack_len():
        top = _stack_pop()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _stack_push(m)


class GraphMode(TorchFunctionMode):
    """See the module docstring. ``installed``: entered by the recorder and not removed yet."""

    def __init__(self, recorder: "Recorder", manual: "ManualUpdates"):
        super().__init__()
        self.recorder, self.manual = recorder, manual
        self.installed = False
        # the window: nested calls the mode is out of the stack for, the stack length it left, whether it is on
        # the stack now (or paused to go back: set_live), the stack length set_live took it off at
        self.paused, self.popped_at, self.live, self.off_at = 0, None, False, 0
        self.spent: dict[int, weakref.ref] = {}   # losses whose backward ran (id -> weakref), the latest
        self.spent_all: list[weakref.ref] = []    # every one of them (their count alive at each step: alive_losses)
        self.kept: dict[int, tuple[str, weakref.ref, int]] = {}   # graph-carrying results of ops on them: id -> (where, ref, step)
        self.derived: dict[int, weakref.ref] = {}  # tensors computed from a model output without a graph
        # tensors computed from a DataLoader batch's labels (id -> weakref), while the first training forwards are
        # checked for them (label_watch left of LABEL_FORWARDS; 0: no longer watched)
        self.labels: dict[int, weakref.ref] = {}
        self.label_watch = LABEL_FORWARDS
        self.label_event: ForwardEvent | None = None   # the last forward called with labels in its input

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rec, manual = self.recorder, self.manual
        if manual.candidates and args:
            name = getattr(func, "__name__", "")
            if (name.endswith("_") and not name.startswith("__")) or name in _INPLACE_SETS:
                manual.maybe(name, args[0])
        out = func(*args, **(kwargs or {}))
        if self.labels:   # (empty once the first training forwards were checked)
            self.label_op(func, args, kwargs, out)
        spent = self.spent
        if spent:
            for a in args[:2]:
                if isinstance(a, torch.Tensor) and id(a) in spent and spent[id(a)]() is a:
                    if isinstance(out, torch.Tensor) and out.requires_grad:
                        self.graph_op(args, out)
                    break
        if args and isinstance(out, torch.Tensor) and isinstance(args[0], torch.Tensor):
            name = getattr(func, "__name__", "")
            first = args[0]
            if name in _SCORES and rec.last_out is not None and rec.last_event is not None \
                    and rec.last_out[1]() is first:
                rec.last_event.scored = True
            derived = self.derived
            if (name in _FROM_OUTPUT and first.requires_grad) or (name in _KEEPS_PROVENANCE and id(first) in derived
                                                                 and derived[id(first)]() is first):
                if not out.requires_grad:
                    if len(derived) > 256:
                        self.derived = derived = {k: r for k, r in derived.items() if r() is not None}
                    derived[id(out)] = weakref.ref(out)
        return out

    # -- on the stack and off it ------------------------------------------------------------------------
    def install(self) -> None:
        self.__enter__()
        self.installed = self.live = True

    def uninstall(self) -> None:
        if self.installed:
            remove_mode(self)
            self.installed, self.paused, self.popped_at, self.live = False, 0, None, False

    # What the mode watches happens in the user's loop between the calls the patches wrap, never inside
    # them. The mode leaves the stack while one runs. It only ever pops itself when it is on top, and returns
    # only onto the same stack it left (a mode the script entered meanwhile keeps its place; ours then stays
    # where it is, or out).
    def pause(self) -> None:
        self.paused += 1
        if self.paused == 1 and self.live:
            n = _stack_len()
            if n:
                top = _stack_pop()   # (ours, nearly always: one C call fewer than looking first)
                if top is self:
                    self.popped_at = n - 1
                else:
                    _stack_push(top)

    def resume(self) -> None:
        self.paused -= 1
        if self.paused == 0 and self.popped_at is not None:
            if _stack_len() == self.popped_at:
                _stack_push(self)
            self.popped_at = None

    def due(self, step: int) -> bool:
        """Is the graph mode on the stack during optimizer step ``step`` (counted over the run)? What it
        looks for happens at every step of a loop that has it (``total += loss``, a prediction taken from
        the output, a target derived from it): the first MODE_FIRST steps and then two consecutive ones in
        every MODE_EVERY see it; always while the batch's labels are followed or once a hand-written
        parameter update was seen (an lr intervention scales those at every step)."""
        return step <= MODE_FIRST or step % MODE_EVERY in (0, MODE_EVERY - 1) or bool(self.labels) \
            or bool(self.recorder.recording.manual_updated) or self.manual.open is not None

    def set_live(self, live: bool) -> None:
        """Put the graph mode on the stack or take it off, only ever at the top and back onto the same
        stack length it left (as ``pause`` / ``resume`` do): under a mode the script entered since it
        stays where it is, on or off. Inside a paused call it is only marked; the call's ``resume``
        puts it back (or not)."""
        if live == self.live or not self.installed:
            return
        if live:
            n = _stack_len()
            if n != self.off_at:   # a mode the script entered since sits where ours was
                return
            self.live = True
            if self.paused:
                self.popped_at = n
            else:
                _stack_push(self)
        elif self.paused:
            if self.popped_at is not None:   # (None: it stayed under a mode the script entered above it)
                self.live, self.off_at, self.popped_at = False, self.popped_at, None
        elif (n := _stack_len()) and _stack_at(n - 1) is self:
            _stack_pop()
            self.live, self.off_at = False, _stack_len()

    # -- graphs kept across steps ------------------------------------------------------------------------
    def spend(self, loss: torch.Tensor) -> None:
        """``backward()`` ran on ``loss``: an op on it that keeps its graph is watched from now on."""
        ref = weakref.ref(loss)
        spent = self.spent
        spent[id(loss)] = ref
        self.spent_all.append(ref)
        if len(spent) > 64:
            self.spent = {k: r for k, r in spent.items() if r() is not None}

    def graph_op(self, args, out: torch.Tensor) -> None:
        """An op on a loss whose backward ran made a graph-carrying tensor. It is a graph kept across
        steps when one of its other operands is such a tensor made at an earlier step (``total += loss``
        step after step), not when it is a sum for a printout within one step."""
        rec = self.recorder.recording
        now = rec.total_steps
        kept = self.kept
        for a in args[:2]:
            if isinstance(a, torch.Tensor) and id(a) in kept:
                text, ref, made = kept[id(a)]
                if ref() is a and made < now and text not in rec.graph_kept and len(rec.graph_kept) < 8:
                    rec.graph_kept.append(text)
        if len(kept) > 64:
            self.kept = kept = {k: v for k, v in kept.items() if v[1]() is not None}
        if id(out) not in kept or kept[id(out)][1]() is not out:
            kept[id(out)] = (f"{self.recorder.where() or '?'}", weakref.ref(out), now)

    def count_alive(self, count: bool = True) -> None:
        """At a step: how many of the backwarded losses are still referenced (``Recording.alive_losses``)."""
        if self.spent_all and count:
            self.spent_all = [r for r in self.spent_all if r() is not None]
            self.recorder.recording.alive_losses.append(len(self.spent_all))

    def forget(self) -> None:
        """At the end of the recording: hold no tensor of the run."""
        self.count_alive(count=False)
        self.spent_all, self.spent = [], {}

    # -- labels used as a model's input (the first LABEL_FORWARDS training forwards) ----------------------
    # A batch's labels are normally a target only. Some objectives put them into the model's input instead
    # (forward-forward overlays the label on the image and trains each layer on its own "goodness"; a
    # conditional model concatenates them): pairing the model's output with those labels as if they were its
    # target (the simplify-ladder's meter does, when no loss function is called) measures nothing. The labels
    # of each DataLoader batch are followed through the ops the graph mode sees (those outside model, loss,
    # optimizer and DataLoader calls) until the first training forwards have been checked.
    def seed_labels(self, batch) -> None:
        if isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor) \
                and isinstance(batch[0], torch.Tensor):   # (the ladder's pair_of: inputs, labels)
            self.mark_label(batch[1])

    def mark_label(self, t: torch.Tensor) -> None:
        labels = self.labels
        if len(labels) > 1024:
            self.labels = labels = {k: r for k, r in labels.items() if r() is not None}
        try:
            labels[id(t)] = weakref.ref(t)
        except TypeError:  # pragma: no cover - a tensor subclass that cannot be weakly referenced
            pass

    def is_label(self, a) -> bool:
        labels = self.labels
        if isinstance(a, torch.Tensor):
            ref = labels.get(id(a))
            return ref is not None and ref() is a
        if isinstance(a, (tuple, list)):   # an index tuple (x[rows, y] = ...), a list to cat
            for b in a:
                if isinstance(b, torch.Tensor):
                    ref = labels.get(id(b))
                    if ref is not None and ref() is b:
                        return True
        return False

    def label_all(self, out) -> None:
        if isinstance(out, torch.Tensor):
            self.mark_label(out)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self.mark_label(t)

    def label_op(self, func, args, kwargs, out) -> None:
        """An op (seen by the graph mode) that takes a tensor computed from the labels: its results are, and
        so is the tensor it changes in place (``x[rows, y] = 1``, ``x.add_(y)``, ``out=``)."""
        is_label = self.is_label
        if not (any(map(is_label, args)) or (kwargs and any(map(is_label, kwargs.values())))):
            return
        self.label_all(out)
        if args and isinstance(args[0], torch.Tensor):
            name = getattr(func, "__name__", "")
            if name.endswith("_") and not name.startswith("__") or name in _INPLACE_DUNDERS:
                self.mark_label(args[0])
        if kwargs and isinstance(kwargs.get("out"), torch.Tensor):
            self.mark_label(kwargs["out"])

    def label_check(self, event: "ForwardEvent", args) -> None:
        """A model's forward while labels are watched: is a positional argument computed from them?"""
        if event.grad_enabled:
            self.label_watch -= 1
            if any(map(self.is_label, args)):
                self.label_event = event
                recording = self.recorder.recording
                if event.model not in recording.label_inputs:
                    recording.label_inputs[event.model] = self.recorder.where()
        if self.label_watch <= 0:   # checked enough training forwards: watch no more
            self.label_watch, self.labels = 0, {}

    def label_output(self, event: "ForwardEvent", output) -> None:
        """A model fed with labels returned ``output``: it carries them on (to a next model)."""
        if self.label_event is event:
            self.label_event = None
            if self.labels:
                self.label_all(output)
