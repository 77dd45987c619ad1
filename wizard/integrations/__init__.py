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
