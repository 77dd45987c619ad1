"""The parameter change over one optimizer step (full mode, ``StepRecord.update`` / ``update_rel``): the values
before the step are copied and compared after it. A copy of every value would cost more than the step of a
large model, so a tensor of more than UPDATE_SAMPLE values is compared on that many evenly spaced ones; when
the sampled values did not move although the gradient was not zero, every value is compared from the next
step on."""

from __future__ import annotations

import math

import torch

UPDATE_SAMPLE = 4096  # a parameter's change over a step is compared on at most this many evenly spaced values


def update_views(params: list[torch.Tensor], exact: bool) -> list[torch.Tensor]:
    """The values of each parameter a step's change is measured on: all of them for a tensor of at most
    UPDATE_SAMPLE values (or ``exact``), else UPDATE_SAMPLE evenly spaced ones."""
    out = []
    for p in params:
        flat = p.detach().reshape(-1)
        n = flat.numel()
        out.append(flat if exact or n <= UPDATE_SAMPLE else flat[:: -(-n // UPDATE_SAMPLE)])
    return out


def snapshot(views: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """A copy of the values of ``views``: one flat tensor (a single copy op), or a copy of each where
    they do not concatenate (on several devices)."""
    try:
        return torch.cat(views) if len(views) != 1 else views[0].clone()
    except RuntimeError:
        return [v.clone() for v in views]


def largest_change(after: list[torch.Tensor], before: torch.Tensor | list[torch.Tensor]) -> tuple[float, float | None]:
    """The largest |change| between the values of ``after`` now and their ``snapshot`` before, and the change's
    norm as a share of the values' norm before (None when they were all zero)."""
    if isinstance(before, torch.Tensor):
        now = torch.cat(after) if len(after) != 1 else after[0]
        if not now.numel():
            return 0.0, None
        diff = (now - before).float()
        size = float(before.float().norm())
        return float(diff.abs().max()), (float(diff.norm()) / size if size > 0 else None)
    pairs = [(a, b) for a, b in zip(after, before) if a.numel()]
    if not pairs:
        return 0.0, None
    diffs = torch._foreach_sub([a for a, _ in pairs], [b for _, b in pairs])
    size = math.hypot(*(float(n) for n in torch._foreach_norm([b for _, b in pairs])))
    change = math.hypot(*(float(n) for n in torch._foreach_norm(diffs)))
    torch._foreach_abs_(diffs)
    return float(torch.stack([d.max().float() for d in diffs]).max()), (change / size if size > 0 else None)


class UpdateMeter:
    """Before a step: the values to compare (``before``); after it: the change (``after``)."""

    def __init__(self):
        self.exact = False   # compare every value (a sampled comparison saw no change)
        self._cache: dict[int, tuple] = {}   # id(optimizer) -> (its parameters' ids and storages, update_views)
        self._before: tuple | None = None    # (trainable, views, snapshot) of the step under way

    def _views(self, optimizer, trainable: list[torch.Tensor]) -> list[torch.Tensor]:
        """``update_views`` of the optimizer's trainable parameters, made again only when a parameter
        changed (another tensor, new storage: ``p.data = ...``) or exact comparison was switched on."""
        try:
            key = ([id(p) for p in trainable], [p.data_ptr() for p in trainable], self.exact)
        except RuntimeError:  # tensors without storage
            return update_views(trainable, self.exact)
        known = self._cache.get(id(optimizer))
        if known is not None and known[0] == key:
            return known[1]
        views = update_views(trainable, self.exact)
        self._cache[id(optimizer)] = (key, views)
        return views

    def before(self, optimizer, trainable: list[torch.Tensor]) -> None:
        views = self._views(optimizer, trainable)
        self._before = (trainable, views, snapshot(views))

    def after(self, optimizer, step) -> None:
        """The step's change into ``step`` (when ``before`` ran for it)."""
        if self._before is None:
            return
        (trainable, views, before), self._before = self._before, None
        after = self._views(optimizer, trainable)
        if after is views or (len(after) == len(views) and all(a.shape == b.shape for a, b in zip(after, views))):
            step.update, step.update_rel = largest_change(after, before)
            if step.update == 0 and step.grad_norm and not self.exact \
                    and any(p.numel() > UPDATE_SAMPLE for p in trainable):
                step.update = step.update_rel = None   # the sampled values did not move: compare every value from the next step on
                self.exact = True
