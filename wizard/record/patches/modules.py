"""Patches on module calls: full mode wraps ``nn.Module.__call__``; light mode puts torch's global module
forward hooks on (until the models are known: ``LightPolicy``). Full mode also notes modules that came from a
checkpoint (``torch.load``, ``load_state_dict``): a new instance of a model already seen is then a copy of it."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.full import FullPolicy
    from nnwizard.record.recorder import Recorder


def module_call_full(rec: "Recorder", full: "FullPolicy") -> None:
    """Full mode watches module calls through ``nn.Module.__call__`` instead of the global module
    hooks: those put every module call of the process (each submodule of each forward) on torch's
    slow hook path for the whole run; this costs one Python call per submodule call, and sees
    every top-level module call from start to end (a model first run in a late test loop too).
    At the top level only (a submodule's call inside a forward passes straight through):
    ``FullPolicy.model_called`` before the call, ``FullPolicy.model_output`` after it."""
    graph = full.graph

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def __call__(this, *args, **kwargs):
            if rec.depth:
                return original(this, *args, **kwargs)
            try:
                event = full.model_called(this, args)
                rec.in_model = event is not None
                output = original(this, *args, **kwargs)
                if event is not None:
                    full.model_output(event, output)
                return output
            finally:
                rec.depth, rec.in_model, full.site = 0, False, None
                graph.resume()
        return __call__

    rec.patch(nn.Module, "__call__", make)


def global_hooks(pre: Callable, post: Callable) -> list:
    """torch's global module forward pre/post hooks (they make every module call of the process slower);
    the handles to remove them."""
    from torch.nn.modules import module as module_mod

    return [module_mod.register_module_forward_pre_hook(pre), module_mod.register_module_forward_hook(post, always_call=True)]


def checkpoints(rec: "Recorder") -> None:
    """Full mode: ``torch.load`` results and modules given a state dict are noted (``Recorder.loaded``)."""
    def load_patch(original):
        @functools.wraps(original)
        def load(*args, **kwargs):
            result = original(*args, **kwargs)
            if isinstance(result, nn.Module):
                rec.loaded(result)
            return result
        return load

    def load_state_patch(original):
        @functools.wraps(original)
        def load_state_dict(this, *args, **kwargs):
            rec.loaded(this)
            return original(this, *args, **kwargs)
        return load_state_dict

    rec.patch(torch, "load", load_patch)
    rec.patch(nn.Module, "load_state_dict", load_state_patch)
