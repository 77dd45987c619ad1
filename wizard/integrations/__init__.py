"""Watch mode inside training frameworks (optional extras, imported only when used):

- ``nnwizard.integrations.lightning.WatchCallback``: a Lightning ``Callback``
  (``pip install nnwizard[lightning]``);
- ``nnwizard.integrations.transformers.WatchCallback``: a Hugging Face ``TrainerCallback``
  (``pip install nnwizard[transformers]``).

Both start a :class:`nnwizard.watcher.Watch` when training begins (the same watch.jsonl, triggers
and replay bundles as ``nnwizard.watch``) and close it when training ends. With
``on_anomaly="stop"`` they ask the trainer to stop (``trainer.should_stop`` /
``control.should_training_stop``) after the anomalous batch rather than raising inside it, so the
framework ends the run its own way; the bundle still holds the state from before that step.
"""

from typing import Callable

METRICS = ("loss", "grad_norm", "lr", "update_ratio")


def metrics_of(line: dict) -> dict[str, float]:
    """A watch.jsonl line as the scalars a trainer's logger takes (``nnwizard/loss`` ...; ``nnwizard/anomaly`` 1 on an
    anomaly's line); non-finite values are kept: the logger's curve shows where the run broke."""
    out = {f"nnwizard/{k}": float(line[k]) for k in METRICS if isinstance(line.get(k), (int, float))}
    if line.get("anomaly"):
        out["nnwizard/anomaly"] = 1.0
    return out


def tap(watch, forward: Callable[[dict, int], None]) -> None:
    """Call ``forward(metrics, step)`` with every line the watch writes (besides its own watch.jsonl), so that a
    callback logs through the trainer's logger too. A failing logger never breaks the run."""
    write = watch._write

    def written(line: dict) -> None:
        write(line)
        try:
            forward(metrics_of(line), int(line["step"]))
        except Exception:  # noqa: BLE001 - the trainer's logger is the user's; watch goes on without it
            pass

    watch._write = written
