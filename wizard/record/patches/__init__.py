"""The patches that intercept torch while a recording runs, grouped by what they intercept:

- ``optimizers``: ``Optimizer.__init__``, ``zero_grad`` (optimizers and modules), the optimizer step hooks
  and (full mode) each optimizer class's ``step``, gradient clipping, LR schedulers, ``GradScaler.scale``;
- ``backward``: ``Tensor.backward`` / ``torch.autograd.backward``;
- ``losses``: the ``torch.nn.functional`` loss functions (the ``nn.*Loss`` modules call them too) and
  ``torch.distributions`` built from tensors that require grad;
- ``modules``: top-level module calls (full mode: ``nn.Module.__call__``; light mode: torch's global forward
  hooks), ``torch.load`` and ``load_state_dict``;
- ``data``: ``DataLoader.__iter__`` (counting, capping and replacing batches);
- ``processes``: ``multiprocessing``'s ``Process.start`` (full mode: the child processes the program starts);
- ``seeding``: ``torch.manual_seed`` (full mode: the seeds the program sets, and where).

Each function installs one patch through ``Recorder.patch`` (undone when the recording ends) and hands what
it sees to the recorder's policy; a policy's ``install`` picks the variants it needs (``full.py``,
``light.py``). A patch never lets the recording break the user's call: what the recorder does with an event
runs in ``try`` blocks, only :class:`~nnwizard.record.StopRun` passes through.
"""
