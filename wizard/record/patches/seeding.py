"""Patch on the random state (full mode): ``torch.manual_seed`` calls the program makes from its own code
(``Recording.seeds``: the seed, the line, the optimizer steps before it). nnwizard's own seeding, with no frame of
the user's files on the stack, is not recorded. The seed itself is set as the program asked."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

import torch

from nnwizard.record.records import SeedCall

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.recorder import Recorder

SEEDS_KEPT = 32


def manual_seed(rec: "Recorder") -> None:
    def make(original):
        @functools.wraps(original)
        def manual_seed(*args, **kwargs):
            result = original(*args, **kwargs)
            try:
                seeds = rec.recording.seeds
                where = rec.code.where(sys._getframe(1), fallback=False)
                if where is not None and len(seeds) < SEEDS_KEPT:
                    seed = args[0] if args else kwargs.get("seed")
                    seeds.append(SeedCall(int(seed) if isinstance(seed, int) else None, where, rec.steps_taken))
            except Exception:  # noqa: BLE001 - recording must never break the call
                pass
            return result
        return manual_seed

    for owner in (torch, torch.random):
        if "manual_seed" in owner.__dict__:
            rec.patch(owner, "manual_seed", make)
