"""The listener protocol: how code outside the recorder (watch, the probes' run listeners, the script
runner's budget) follows a recorded run. Pass ``listeners=[obj]`` to the :class:`~nnwizard.record.Recorder`;
each method is optional and is called with the recorder first:

==========================================================  ========================================================
``on_batch(rec, batch, index)``                              a DataLoader yielded ``batch`` (``index`` within its epoch)
``on_forward(rec, model_info, args)``                        a top-level model forward is about to run (a ModelInfo)
``on_loss(rec, loss_call)``                                  a ``torch.nn.functional`` loss was called (a LossCall)
``on_loss_args(rec, loss_call, args, kwargs, value)``        the same call's live arguments and result (light mode
                                                             with no ``on_loss`` listener: ``loss_call`` carries only
                                                             the function's name, ``fn``)
``on_backward(rec, loss_tensor)``                            before ``backward()`` runs (the outermost call only)
``on_step_pre(rec, optimizer, step)``                        before ``optimizer.step()``; ``step`` is the StepRecord
                                                             being filled (gradients as the optimizer will see them;
                                                             for ``step(closure)``: after the closure's first call)
``on_step_post(rec, optimizer, step)``                       after it (the StepRecord is complete); also after a
                                                             hand-written update (full mode), with ``optimizer`` None
``on_scheduler(rec, scheduler_event)``                       after ``scheduler.step()`` (a SchedulerEvent)
==========================================================  ========================================================

A listener may raise :class:`StopRun` to end the run cleanly (a BaseException: the hooks' ``except Exception``
around each listener call lets it through). Exceptions of other kinds are swallowed and counted in
``recording.listener_errors``: watching must never break the user's run.

What a listener may read of the recorder besides its ``recording``: ``steps_taken``, ``t0`` (the
``time.monotonic()`` a StepRecord's ``t`` counts from), ``optimizer_index(optimizer)``, ``step_seconds``
(light mode: the running mean of a step's wall time), ``grad_norms`` (light mode: the per-tensor gradient norms
of the step being measured), ``limit_batches`` / ``time_limit_s`` (which a budget listener may change) and
``norm_every_max`` (the longest interval between two gradient-norm measurements, light mode).

The inline fast path (light mode). A listener that keeps the live loss calls and backward tensors of the
current step (watch: to re-execute the step) can have the light recorder's loss and backward hooks do that
work themselves, one Python call less per loss call and per backward: pass it as ``Recorder(inline=obj)``
(it must also be among ``listeners``). It exposes

- ``step_calls``: a dict (:class:`StepCalls`) whose lists ``losses`` (``(fn, args, kwargs, value)`` of each
  training loss call), ``targets`` (each one's target) and ``backward`` (one entry per backward) the hooks
  append to, read anew at every call (the listener may replace it at each step);
- ``max_per_step``: how many entries of each list a step keeps.

Its ``on_loss_args`` is then not called; for a backward on the last loss call's value the fast backward hook
appends ``{"kind": "loss-call", "loss": i, "scale": 1.0}`` itself, and calls its ``on_backward`` for any other
tensor (and on its slower path: a GradScaler, CUDA, a step budget, models still being discovered). Both methods
must do what the hooks do, since they run wherever the hooks do not (and in full mode).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypedDict

EVENTS = ("on_batch", "on_forward", "on_loss", "on_loss_args", "on_backward", "on_step_pre", "on_step_post",
          "on_scheduler")
INLINE = ("on_loss_args", "on_backward")   # the events an inline listener's work is done in the hooks for


class StopRun(BaseException):
    """The run's budget is spent: raised inside the user's program (from a hook or a listener), caught by the
    runner. A BaseException: the program's own ``except Exception`` cannot swallow it."""


class StepCalls(TypedDict):
    """An inline listener's record of the current step (see the module docstring)."""
    losses: list
    targets: list
    backward: list


class Listener(Protocol):
    """The methods a listener may have (each optional; see the module docstring)."""

    def on_batch(self, rec, batch: Any, index: int) -> None: ...
    def on_forward(self, rec, model_info, args: tuple) -> None: ...
    def on_loss(self, rec, loss_call) -> None: ...
    def on_loss_args(self, rec, loss_call, args: tuple, kwargs: dict, value: Any) -> None: ...
    def on_backward(self, rec, loss_tensor) -> None: ...
    def on_step_pre(self, rec, optimizer, step) -> None: ...
    def on_step_post(self, rec, optimizer, step) -> None: ...
    def on_scheduler(self, rec, scheduler_event) -> None: ...


class Listeners:
    """The listeners of one recording, by event: ``notify`` calls each (counting failures in ``recording``),
    ``combined`` makes them one callable for the hooks that run every step."""

    def __init__(self, listeners: list, recording, inline: Any = None):
        self.objects = list(listeners)
        self.recording, self.inline = recording, inline
        self.fns: dict[str, list[Callable]] = {
            name: [fn for fn in (getattr(listener, name, None) for listener in self.objects) if fn is not None]
            for name in EVENTS}
        self.any = any(self.fns.values())

    def notify(self, rec, name: str, *args) -> None:
        for fn in self.fns.get(name) or ():
            self.call(rec, fn, *args)

    def call(self, rec, fn: Callable, *args) -> None:
        """One listener method called, a failure (not StopRun) counted."""
        try:
            fn(rec, *args)
        except Exception:  # noqa: BLE001 - a listener must never break the user's run
            self.recording.listener_errors += 1

    def combined(self, name: str) -> Callable | None:
        """The listeners' ``name`` methods as one callable (None: none), called per step without a loop (one
        listener, watch, is the common case); with several, each in turn, one that fails (not with StopRun)
        counted and skipped as in :meth:`notify`. For the events of ``INLINE`` the inline listener's own
        method is left out: the hooks do its work."""
        fns = list(self.fns.get(name) or ())
        if self.inline is not None and name in INLINE:
            fns = [fn for fn in fns if getattr(fn, "__self__", None) is not self.inline]
        if len(fns) < 2:
            return fns[0] if fns else None
        recording = self.recording

        def each(*args):
            for fn in fns:
                try:
                    fn(*args)
                except Exception:  # noqa: BLE001 - a listener must never break the user's run
                    recording.listener_errors += 1
        return each
