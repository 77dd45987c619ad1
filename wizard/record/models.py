"""What a module called at the top level is: a model (its parameters trained), a loss module, a transform
(a parameterless library module, or one run while a DataLoader fetches a batch), or a layer of another model
called directly by that model's own method. And what about a model matters for train/eval mode: its Dropout
and BatchNorm layers, and its own forwards that branch on ``self.training``."""

from __future__ import annotations

import functools
import inspect
import re
import sys

import torch
from torch import nn

MODE_TYPES = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)
# nn.Module methods a user's class may override (ModelInfo.shadowed)
NN_METHODS = ("train", "eval", "parameters", "named_parameters", "zero_grad", "to", "state_dict", "modules",
              "children", "cuda", "cpu", "float", "double", "half", "apply", "load_state_dict", "register_buffer",
              "requires_grad_", "__call__", "__setattr__", "__getattr__")
_LIBRARIES = ("torch", "torchvision", "torchaudio", "torchtext")
# code objects of a DataLoader fetching a batch (torch's iterator; the recorder's own adds its on import)
FETCH_CODES: set = {torch.utils.data.dataloader._BaseDataLoaderIter.__next__.__code__}


def mode_layers(module: nn.Module) -> int:
    """Dropout (p > 0) and BatchNorm layers: where train/eval mode matters."""
    return sum(1 for m in module.modules() if isinstance(m, MODE_TYPES)
               and not (isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0))


def owner(module: nn.Module, frame, depth: int = 12) -> nn.Module | None:
    """The module whose own method called ``module`` at the top level (``layer.forward(x)`` called
    directly, so that only the layers inside it pass through ``__call__``): the nearest caller frame
    whose ``self`` is another nn.Module that contains ``module``; None when that frame's ``self`` is
    no module or does not contain it."""
    while frame is not None and depth:
        depth -= 1
        this = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(this, nn.Module) and this is not module:
            return this if any(m is module for m in this.modules()) else None
        frame = frame.f_back
    return None


def library_class(cls: type) -> bool:
    """A class of torch's or of an installed package, not the user's own."""
    name = getattr(cls, "__module__", None) or ""
    if name.split(".")[0] in _LIBRARIES:
        return True
    path = getattr(sys.modules.get(name), "__file__", None) or ""
    return "site-packages" in path or "dist-packages" in path


def fetching(frame, depth: int = 40) -> bool:
    """Is a DataLoader fetching a batch further out (a transform in the dataset's ``__getitem__``)?"""
    codes = FETCH_CODES
    while frame is not None and depth:
        if frame.f_code in codes:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def not_a_model(module: nn.Module, frame) -> bool:
    """A module without parameters (a lazy module's are UninitializedParameter: it has some) called at the top
    level is no model when it is a library's (torchvision's Normalize, an nn.Flatten) or runs while a DataLoader
    fetches a batch, unless it is called directly by another module's method (forward-forward's ReLU, in a
    ``Layer.forward`` called directly: that layer's model). A parameterless module of the user's own class
    called by the training loop stays a model: a model whose layers were never registered (no-parameters)."""
    found = owner(module, frame)
    if found is not None and next(found.parameters(), None) is not None:
        return False
    return library_class(type(module)) or fetching(frame)


_TRAINING_READ = re.compile(r"\bself\.training\b")


def _forward_reads_training(cls: type) -> bool:
    """Does this (user-defined) module class's forward branch on ``self.training`` (a functional dropout
    with ``training=self.training``, noise added only while training)? Read from its source."""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return code is not None and _code_reads_training(code)


@functools.lru_cache(maxsize=256)
def _code_reads_training(code) -> bool:
    """(Cached by the forward's code object, not its class: a class holds its script's globals, and each rerun of a
    script defines its classes anew, so a cache of classes would keep every rerun's data alive.)"""
    try:
        return bool(_TRAINING_READ.search(inspect.getsource(code)))
    except (OSError, TypeError):
        return False


def reads_training(module: nn.Module) -> list[str]:
    """The user's module classes in ``module`` whose forward reads self.training: where train/eval mode
    matters although no Dropout or BatchNorm module is there (pytorch/examples' GAT)."""
    found = []
    for m in module.modules():
        cls = type(m)
        if not cls.__module__.startswith("torch.") and _forward_reads_training(cls) and f"{cls.__name__}.forward" not in found:
            found.append(f"{cls.__name__}.forward")
    return found[:4]
