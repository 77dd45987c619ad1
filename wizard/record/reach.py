"""Which forwards and loss calls a backward reaches (full mode; light mode keeps only the forwards of its
discovery steps). A forward or loss call waits, pending, for the backward that reaches its graph node: then
it trained, and counts for the step; one no backward reaches stays an evaluation.

A forward or loss call waits by holding its graph node, and a node holds its whole graph (every tensor saved
for the backward). An evaluation that forgot torch.no_grad() builds a graph per batch that no backward ever
reaches, and the script drops each one at the next batch: holding them kept a 5-layer MLP's run at 3 GB
instead of 0.65 GB, and a graph-attention model's ran out of memory. So a forward lets go of the graphs of the
pending forwards it follows in the same way (:meth:`Reach.absorb`): in eval mode with gradients on, any older
eval-mode forward; in training mode, the same model's forwards on earlier batches of the same DataLoader with
no backward to reach them since. They are "absorbed": should a backward reach the newer forward (losses summed
over samples or batches and backpropagated once), they trained with it, and so did the loss calls made between
them; if none does, they stay evaluation. Forwards of another model, or within one batch, are left alone (a
GAN's generator forward is reached after the discriminator's own backward and step).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch

from nnwizard.record.autograd import one_op_from, reached
from nnwizard.record.records import ForwardEvent, LossCall, StepRecord

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.recorder import Recorder

DROPPED_OUTS = 16384  # output nodes of forwards the pending cap dropped, kept (by id) until the next backward
TRAINED_NODES = 32    # output nodes of trained forwards kept per step (for the next step's span check)


class Reach:
    """The pending forwards and loss calls of one recording (see the module docstring)."""

    def __init__(self, recorder: "Recorder"):
        self.recorder = recorder
        self.forwards: list[ForwardEvent] = []
        self.losses: list[LossCall] = []
        self.overflowed = 0   # forwards the pending cap dropped since the last graph search
        self.dropped_outs: dict[int, Any] = {}   # id -> those forwards' output nodes (held, so ids stay theirs), since the last backward
        self.trained_nodes: list = []   # grad_fns of forward outputs a backward reached since the last step, and
        # (the first SPAN_CHECKS steps) the nodes of the graphs it ran through
        self.prev_nodes: list = []      # the same, of the steps before the last optimizer step
        self.loss_link: tuple | None = None   # (weakref to a loss value, its LossCall, the ForwardEvent it comes from)

    def link(self, value: torch.Tensor, call: LossCall, event: ForwardEvent | None) -> None:
        """The backward on this very ``value`` (or one op away from it) reaches ``call`` and, when known,
        ``event``: :meth:`linked` need not search the graph."""
        self.loss_link = (weakref.ref(value), call, event)

    def absorb(self, newest: ForwardEvent, match: Callable) -> None:
        pending = self.forwards
        keep, absorbed = [], newest.absorbed
        for e in pending:
            if e is newest or e.node is None or not match(e):
                keep.append(e)
                continue
            e.node, e.outs = None, []
            if absorbed is None:
                newest.absorbed = absorbed = []
            if e.absorbed:
                absorbed += e.absorbed
                e.absorbed = None
            absorbed.append(e)
            calls = self.recorder.recording.loss_calls[e.calls_at:newest.calls_at]   # the loss calls made from it
            if calls and self.losses:
                ids = set(map(id, calls))
                for c in self.losses:
                    if id(c) in ids:
                        c.node = None
                        absorbed.append(c)
                self.losses = [c for c in self.losses if c.node is not None]
        if len(keep) != len(pending):
            self.forwards = keep

    def trained(self, step: StepRecord, event: ForwardEvent) -> None:
        """A backward reached this forward: it trained, and counts for the step."""
        event.trained, event.node = True, None
        if event.absorbed:
            absorbed, event.absorbed = event.absorbed, None
            for item in absorbed:   # (one level: absorb keeps the list flat)
                if type(item) is ForwardEvent:
                    self.trained(step, item)
                else:
                    item.eval = False
        if len(self.trained_nodes) < TRAINED_NODES:
            self.trained_nodes += event.outs
        event.outs = []
        m = event.model
        step.forwards[m] = step.forwards.get(m, 0) + 1
        step.training[m] = step.training.get(m, True) and event.training

    def mark_reached(self, step: StepRecord, loss: torch.Tensor | None) -> None:
        """The pending forwards and loss calls the graph of ``loss`` reaches trained (all of them when
        there is no tensor to search from); the others stay pending."""
        found = None
        if loss is not None:
            targets = {id(e.node) for e in self.forwards if e.node is not None}
            targets |= {id(c.node) for c in self.losses if c.node is not None}
            # the graph grows with the forwards since the last backward (an episode's loss gathers hundreds, a dozen
            # nodes each): a fixed limit stops the search above the model outputs of the latest ones
            forwards = len(self.forwards) + self.overflowed + sum(len(e.absorbed) for e in self.forwards if e.absorbed)
            found = reached(loss.grad_fn, targets, limit=min(max(4000, 32 * forwards), 200_000))
            self.overflowed = 0
            first = self.forwards[0] if self.forwards else None
            if first is not None and first.node is not None and id(first.node) in found:
                self._overflow_reached(step, first)
        keep_f, keep_l = [], []
        for event in self.forwards:
            if found is None or id(event.node) in found:
                self.trained(step, event)
            elif event.training or event.node is None:
                keep_f.append(event)
            else:   # eval mode, gradients on, not reached by this backward: an evaluation's graph (see absorb)
                event.node, event.outs, event.absorbed = None, [], None
        for call in self.losses:
            if found is None or id(call.node) in found:
                call.eval, call.node = False, None
            elif call.training is not False:
                keep_l.append(call)
            else:
                call.node = None
        self.forwards, self.losses = keep_f, keep_l

    def _overflow_reached(self, step: StepRecord, first: ForwardEvent) -> None:
        """The backward reached the oldest pending forward: the forwards the pending cap dropped just before it
        (no backward between) belong to the same pass (an episode of a policy called once per time step, more
        forwards than the cap), so they trained too rather than staying unreached like an evaluation."""
        forwards = self.recorder.recording.forwards
        i = len(forwards) - 1
        while i >= 0 and forwards[i] is not first:
            i -= 1
        i -= 1
        while i >= 0 and forwards[i].overflow and not forwards[i].trained:
            self.trained(step, forwards[i])
            i -= 1

    def linked(self, loss: torch.Tensor) -> tuple[LossCall, ForwardEvent | None] | None:
        """The pending loss call and forward (None: none pending) a backward on ``loss`` reaches, known
        without a search when ``loss`` is the value of the only pending loss call, or one op away from it
        (divided by the accumulation steps, weighted, a penalty added), and the only pending forward is the
        one that call's input came from, besides forwards run without grad (an evaluation's, which no backward
        can reach: they leave the pending list); see :meth:`link`. None when the graph must be searched."""
        link = self.loss_link
        if link is None:
            return None
        ref, call, event = link
        if ref() is loss:
            if loss.grad_fn is not call.node:   # (changed in place since the call)
                return None
        elif not one_op_from(loss, call.node):   # (the call's own value may be gone: loss = loss_fn(...) / k)
            return None
        pending_f, pending_l = self.forwards, self.losses
        if len(pending_l) != 1 or pending_l[0] is not call:
            return None
        if not pending_f:
            return call, None
        if pending_f[-1] is not event or (len(pending_f) > 1 and any(
                f is not event and (f.grad_enabled or f.node is not None or f.outs) for f in pending_f)):
            return None   # (forwards run without grad, an evaluation's, can never be reached: no search for them)
        return call, event

    def backward(self, step: StepRecord, loss: torch.Tensor | None) -> None:
        """A backward on ``loss``: what it reaches trained (no search when the link tells, see :meth:`linked`)."""
        link = self.linked(loss) if loss is not None else None
        if link is not None:   # the loss call's own value, its forward the only one pending: no graph search
            call, event = link
            call.eval, call.node = False, None
            if event is not None:
                self.trained(step, event)
            self.forwards, self.losses = [], []
        else:
            self.mark_reached(step, loss)
        self.dropped_outs = {}

    def flush(self, keep: int = 0) -> None:
        """Forwards and loss calls no backward reached by now stay evaluation (too many are pending):
        drop their graph nodes. A GAN's generator forward is reached by a
        backward after the discriminator's step, so pending items survive optimizer steps."""
        for items in (self.forwards, self.losses):
            for item in items[: max(len(items) - keep, 0)]:
                item.node = None
                if isinstance(item, ForwardEvent):
                    if item.outs and len(self.dropped_outs) < DROPPED_OUTS:   # (an episode's outputs, saved for its loss)
                        self.dropped_outs.update((id(n), n) for n in item.outs)
                    item.outs = []
        self.forwards = self.forwards[len(self.forwards) - keep:] if keep else []
        self.losses = self.losses[len(self.losses) - keep:] if keep else []

    def stepped(self) -> None:
        """An optimizer step (or a hand-written update) ended: this step's trained nodes become the last step's."""
        self.prev_nodes, self.trained_nodes = self.trained_nodes, []

    def clear(self) -> None:
        """The end of the recording: hold no graph node."""
        for item in self.forwards + self.losses:
            item.node = None
        for event in self.forwards:
            event.outs = []
        self.trained_nodes, self.prev_nodes = [], []
        self.forwards, self.losses = [], []
