"""A Lightning ``Callback`` giving watch mode and replay bundles to ``Trainer.fit``::

    from nnwizard.integrations.lightning import WatchCallback
    trainer = lightning.Trainer(callbacks=[WatchCallback(out="nnwizard-watch")])

Lightning runs forward and backward inside ``optimizer.step(closure)``; watch wraps that closure,
so its checks (and a bundle's saved state) come after the backward and before the update, as in a
plain loop. Steps are numbered from 1 over every ``optimizer.step()`` of the run. Every line watch writes
also goes to the trainer's loggers (``trainer.loggers``) as ``nnwizard/loss``, ``nnwizard/grad_norm``,
``nnwizard/lr``, ``nnwizard/update_ratio`` (and ``nnwizard/anomaly``) at that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the older package name
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError("nnwizard.integrations.lightning needs Lightning: pip install 'nnwizard[lightning]'") from exc

from nnwizard.integrations import tap
from nnwizard.watcher import DEFAULT_OUT, Watch


class WatchCallback(Callback):
    def __init__(self, out: str | Path = DEFAULT_OUT, on_anomaly: str = "continue", **options: Any):
        super().__init__()
        if on_anomaly not in ("continue", "stop"):
            raise ValueError(f"on_anomaly must be 'continue' or 'stop', not {on_anomaly!r}")
        self.out, self.on_anomaly, self.options = Path(out), on_anomaly, options
        self.watch: Watch | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        # the optimizer is left open: Lightning may wrap it, and the torch hooks see the inner one
        self.watch = Watch(pl_module, None, self.out, "continue", **self.options)
        self.watch.start()
        loggers = list(getattr(trainer, "loggers", None) or [])
        if loggers:   # the same scalars through the trainer's own loggers (TensorBoard, CSV, W&B ...)
            def forward(metrics: dict, step: int) -> None:
                for logger in loggers:
                    logger.log_metrics(metrics, step=step)

            tap(self.watch, forward)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.on_anomaly == "stop" and self.watch is not None and self.watch.anomalies and not trainer.should_stop:
            self.watch.stopped = f"stopped after step {self.watch.anomalies[0].step}: {self.watch.anomalies[0].reason}"
            self.watch._say(f"nnwizard watch: {self.watch.stopped} (on_anomaly='stop')")
            trainer.should_stop = True

    def _close(self) -> None:
        if self.watch is not None:
            self.watch.close()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()

    @property
    def bundles(self) -> list[Path]:
        return list(self.watch.bundles) if self.watch is not None else []
