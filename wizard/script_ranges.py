"""Loops over ``range`` capped like DataLoader passes while a bounded run records a script.

Script mode caps every DataLoader pass at the run's ``limit_batches`` (lowered by BatchCap when steps are
slow), so that a bounded run reaches the script's evaluation and its second training pass. A script
that slices its tensors in a loop over ``range`` (``for i in range(0, data.size(0) - 1, bptt)``, the
style of pytorch/examples' word_language_model) had no such cap: its first epoch could outlast the run,
and its evaluation, and a model left in eval mode after it, were never seen.

While such a run records the script, the name ``range`` in the script's own modules is the class
:func:`capped_range` makes. Its objects behave as ``range`` (length, indexing, ``in``, equality,
``isinstance(r, range)``, pickling as a real range); a loop over one stops after ``limit_batches``
iterations when it is a batch loop:

- it runs inside another loop over a ``range`` of the script's (an epoch loop) that has begun, and
- it is a training pass (it took an optimizer step, at most 2 in any one iteration), or an evaluation
  pass (no step and no backward, at least one model forward per iteration, none of them with gradients
  on: an evaluation that forgot ``torch.no_grad()`` runs uncapped, as does an episode of policy calls
  whose graph a backward after the loop uses).

An evaluation pass whose results are gathered and then compared with all of its data
(``torch.cat(predictions) == labels``) fails when it ends early: script_run then runs the script again
with evaluation passes uncapped (see ``evaluation_capped``).

A loop that builds data (no forward), a per-sample loop inside a batch (forwards with gradients, no
step), the outermost loop of a full-batch script and an epoch loop (a whole pass per iteration) run to
their end. Only code that looks ``range`` up in those modules' globals is affected; the name is gone
with the modules when the run ends (script_run drops the script's modules after every run).
"""

from __future__ import annotations

import builtins
import sys
import weakref
from collections.abc import Sequence
from typing import Any

_range = builtins.range

MAX_STEPS_PER_ITERATION = 2     # a GAN's two optimizers step once each per batch
MAX_FORWARDS_PER_ITERATION = 4  # an evaluation batch: a few model calls at most


class _Meta(type):
    """``isinstance(x, range)`` with the capped class as ``range``: true for real ranges too."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _range) or type.__instancecheck__(CappedRange, obj)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _range) or type.__subclasscheck__(CappedRange, sub)


class CappedRange(metaclass=_Meta):
    """A ``range`` whose ``for`` loops the run's :class:`_Control` may end early (see the module docstring)."""

    __slots__ = ("_r",)
    _control: "_Control | None" = None

    def __new__(cls, *args):
        self = object.__new__(cls)
        self._r = _range(*args)
        return self

    start = property(lambda self: self._r.start)
    stop = property(lambda self: self._r.stop)
    step = property(lambda self: self._r.step)

    def __iter__(self):
        control = type(self)._control
        return iter(self._r) if control is None else control.loop(self._r)

    def __len__(self) -> int:
        return len(self._r)

    def __getitem__(self, index):
        return self._r[index]

    def __contains__(self, value) -> bool:
        return value in self._r

    def __reversed__(self):
        return reversed(self._r)

    def __bool__(self) -> bool:
        return bool(self._r)

    def __eq__(self, other) -> bool:
        return self._r == getattr(other, "_r", other)

    def __hash__(self) -> int:
        return hash(self._r)

    def __repr__(self) -> str:
        return repr(self._r)

    def __reduce__(self):
        return _range, (self._r.start, self._r.stop, self._r.step)

    def count(self, value) -> int:
        return self._r.count(value)

    def index(self, value) -> int:
        return self._r.index(value)


Sequence.register(CappedRange)


class _Loop:
    """The iterator of one loop over a capped range."""

    __slots__ = ("control", "it", "nested", "site", "epoch", "marks", "n", "done", "s0", "f0", "b0", "last_s", "last_f",
                 "max_s", "max_f", "with_grad", "__weakref__")

    def __init__(self, control: "_Control", it, nested: bool, site):
        self.control, self.it, self.nested, self.site = control, it, nested, site
        self.epoch: int | None = None   # its pass number at its site, once it is known to be a training pass
        self.marks: list[int] | None = []   # steps taken before each iteration, until then (None: not a training pass)
        self.n, self.done, self.with_grad = 0, False, False
        self.s0 = self.f0 = self.b0 = self.last_s = self.last_f = self.max_s = self.max_f = 0

    def __iter__(self):
        return self

    def __next__(self):
        if not self.nested:
            return self._advance()
        rec = self.control.recorder
        recording = rec.recording
        steps, forwards = recording.total_steps, len(recording.forwards)
        if self.n == 0:
            self.s0, self.f0, self.b0 = steps, forwards, recording.backwards
        else:
            self.max_s = max(self.max_s, steps - self.last_s)
            if forwards > self.last_f:
                self.max_f = max(self.max_f, forwards - self.last_f)
                event = rec.last_event
                if event is not None and event.grad_enabled:   # (an RL episode in eval mode keeps its graph for
                    self.with_grad = True                          # the backward after it: not an evaluation)
        self.last_s, self.last_f = steps, forwards
        if self.epoch is None and not rec.in_loader_pass:
            self._number(rec, steps)
        if self.epoch is not None and not rec.in_loader_pass:   # the steps of the next iteration: epoch.batch
            rec.set_position(self.epoch, self.n)
        cap = rec.limit_batches
        if cap is not None and self.n >= cap and self._batch_loop(steps, forwards, recording.backwards):
            if steps > self.s0:
                recording.capped_training += 1
            self.done = True
            self.control.capped(cap)
            raise StopIteration
        return self._advance()

    def _advance(self):
        try:
            value = next(self.it)
        except StopIteration:
            self.done = True
            raise
        self.n += 1
        return value

    def _number(self, rec, steps: int) -> None:
        """A training pass gets the next epoch number of its site (the loop statement), like a DataLoader
        pass: at once when an earlier pass there trained, else as soon as one of its iterations stepped;
        the steps already taken in it get their epoch.batch afterwards."""
        passes = self.control.passes
        if self.n == 0 and self.site in passes:
            passes[self.site] += 1
            self.epoch = passes[self.site]
            return
        if self.marks is None:
            return
        self.marks.append(steps)
        if steps == self.s0 or self.max_s > MAX_STEPS_PER_ITERATION:
            if len(self.marks) > 64 or self.max_s > MAX_STEPS_PER_ITERATION:
                self.marks = None   # not a training pass (data, samples, evaluation, whole epochs): stop looking
            return
        passes[self.site] = self.epoch = passes.get(self.site, 0) + 1
        taken = rec.recording.steps
        for batch, (start, end) in enumerate(zip(self.marks, self.marks[1:])):
            for record in taken[len(taken) - (steps - start):len(taken) - (steps - end)] if end > start else ():
                if record.batch < 0:
                    record.epoch, record.batch = self.epoch, batch
        self.marks = []

    def _batch_loop(self, steps: int, forwards: int, backwards: int) -> bool:
        took = steps - self.s0
        if took:   # a training pass: one step per batch (two for a GAN)
            return self.max_s <= MAX_STEPS_PER_ITERATION
        if backwards == self.b0 and forwards - self.f0 >= self.n and not self.with_grad \
                and self.max_f <= MAX_FORWARDS_PER_ITERATION and self.control.evaluation:   # an evaluation pass
            self.control.evaluation_capped = True
            return True
        return False


class _Control:
    """One run's state: the recorder whose counts the loops read, the loops under way, the note."""

    def __init__(self, recorder, evaluation: bool):
        self.recorder, self.evaluation = recorder, evaluation
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.passes: dict[tuple, int] = {}   # loop site (code, line) -> training passes there so far
        self.noted = False
        self.evaluation_capped = False   # an evaluation pass ended early (its results may be shorter than its data)

    def loop(self, r) -> _Loop:
        nested = any(loop.n and not loop.done for loop in self.live)
        frame = sys._getframe(2)   # the script's frame whose for statement (or enumerate()) asked for the iterator
        loop = _Loop(self, iter(r), nested, (frame.f_code, frame.f_lineno))   # (f_lasti moves as 3.11 specialises the call)
        self.live.add(loop)
        return loop

    def capped(self, cap: int) -> None:
        if not self.noted:
            self.noted = True
            self.recorder.recording.notes.append(
                f"loops over range() inside an epoch loop (training or evaluation passes over tensor slices) "
                f"capped at {cap} iterations, like a DataLoader pass")


def capped_range(recorder, evaluation: bool = True) -> type:
    """The ``range`` to put in the script's module globals for one recorded run (``evaluation``: evaluation
    passes are capped too, not only training passes)."""
    return type("range", (CappedRange,), {"__slots__": (), "_control": _Control(recorder, evaluation),
                                          "__module__": "builtins", "__qualname__": "range"})


def install(namespace: dict[str, Any], cls: type) -> None:
    """Put ``cls`` as ``range`` in a module's globals, unless the module defines its own ``range``."""
    if "range" not in namespace:
        namespace["range"] = cls
