"""A Hugging Face ``TrainerCallback`` giving watch mode and replay bundles to ``Trainer.train``::

    from nnwizard.integrations.transformers import WatchCallback
    trainer = transformers.Trainer(model, args, train_dataset=ds, callbacks=[WatchCallback()])

The Trainer calls ``model(**batch)`` and backpropagates the output's own ``loss`` (divided by the
accumulation steps); watch records both, so a bundle's step re-executes from the saved batch. The
Trainer clips gradients (``max_grad_norm``, default 1.0) before ``optimizer.step()``: the gradient
norm watch logs there is the clipped one, so the loss triggers do most of the work under it. The latest
watch scalars (``nnwizard/loss``, ``nnwizard/grad_norm`` ...) are added to each record the Trainer logs
(``on_log``): they land in ``trainer.state.log_history`` and in the reporters listed after this callback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover
    raise ImportError("nnwizard.integrations.transformers needs transformers: pip install 'nnwizard[transformers]'") from exc

from nnwizard.integrations import tap
from nnwizard.watcher import DEFAULT_OUT, Watch


class WatchCallback(TrainerCallback):
    def __init__(self, out: str | Path = DEFAULT_OUT, on_anomaly: str = "continue", **options: Any):
        if on_anomaly not in ("continue", "stop"):
            raise ValueError(f"on_anomaly must be 'continue' or 'stop', not {on_anomaly!r}")
        self.out, self.on_anomaly, self.options = Path(out), on_anomaly, options
        self.watch: Watch | None = None
        self._pending: dict[str, float] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # the Trainer's optimizer is wrapped (accelerate): watch every torch optimizer step instead
        self.watch = Watch(model, None, self.out, "continue", **self.options)
        self.watch.start()
        self._pending: dict[str, float] = {}
        tap(self.watch, lambda metrics, step: self._pending.update(metrics))
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The latest watch scalars join the Trainer's own log record (``state.log_history``, and the reporters
        that run after this callback)."""
        if logs is not None and self._pending:
            logs.update(self._pending)
            self._pending = {}
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.on_anomaly == "stop" and self.watch is not None and self.watch.anomalies and not control.should_training_stop:
            self.watch.stopped = f"stopped after step {self.watch.anomalies[0].step}: {self.watch.anomalies[0].reason}"
            self.watch._say(f"nnwizard watch: {self.watch.stopped} (on_anomaly='stop')")
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.watch is not None:
            self.watch.close()
        return control

    @property
    def bundles(self) -> list[Path]:
        return list(self.watch.bundles) if self.watch is not None else []
