"""Plain copies of FSDP2 modules, for the work nnwizard does in one process.

``fully_shard`` turns a module into an ``FSDP<Class>`` whose parameters are DTensors and refuses ``deepcopy``. In
the one-process diagnosis of a distributed script (``RANK=0, WORLD_SIZE=1``: every shard is the whole tensor), the
recorder keeps a copy of each model at its initial state for the model-level probes; ``plain_copies()`` makes
``deepcopy`` of an FSDP2 module give the user's own class with ordinary parameters (the full tensors) and
without FSDP's hooks, so those probes run on it as on any model.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from torch import nn

_DEEPCOPY = copy.deepcopy   # (the original, whatever plain_copies() put in its place meanwhile)
_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks", "_state_dict_hooks",
          "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _fsdp_module_class():
    try:
        from torch.distributed.fsdp import FSDPModule

        return FSDPModule
    except Exception:  # noqa: BLE001 - a torch without FSDP2
        return None


def user_class(module: nn.Module) -> type:
    """The class ``fully_shard`` derived ``FSDP<Class>`` from (the module's own class otherwise)."""
    fsdp = _fsdp_module_class()
    cls = type(module)
    if fsdp is None or not isinstance(module, fsdp):
        return cls
    return next((c for c in cls.__mro__[1:] if c is not fsdp and not issubclass(c, fsdp)), cls)


def _full(p):
    """A DTensor's whole value (one process: its local shard is all of it)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch < 2.4
        from torch.distributed._tensor import DTensor
    if isinstance(p, DTensor):
        return p.full_tensor() if p.device_mesh.size() > 1 else p.to_local()
    return p


def plain_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every FSDP2 module turned back into its own class, its DTensor parameters
    into ordinary ones, and FSDP's hooks left behind."""
    fsdp = _fsdp_module_class()
    saved = []
    memo: dict = {}
    for m in module.modules():
        if fsdp is not None and isinstance(m, fsdp):
            hidden = {k: v for k, v in m.__dict__.items() if k.startswith("__composable_api_state_key")}
            saved.append((m, m.__class__, {name: getattr(m, name) for name in _HOOKS if hasattr(m, name)}, hidden))
            m.__class__ = user_class(m)
            for name in _HOOKS:
                if hasattr(m, name):
                    object.__setattr__(m, name, OrderedDict())
            for k in hidden:   # (FSDP's state: its process group cannot be copied)
                del m.__dict__[k]
        for name, p in list(m._parameters.items()):
            if p is not None and id(p) not in memo:
                full = _full(p)
                if full is not p:
                    memo[id(p)] = nn.Parameter(full.detach().clone(), requires_grad=p.requires_grad)
    try:
        return _DEEPCOPY(module, memo)
    finally:
        for m, cls, hooks, hidden in saved:
            m.__class__ = cls
            for name, value in hooks.items():
                object.__setattr__(m, name, value)
            m.__dict__.update(hidden)


def _contains_fsdp(obj, fsdp) -> bool:
    return isinstance(obj, nn.Module) and any(isinstance(m, fsdp) for m in obj.modules())


def _ours(filename: str) -> bool:
    import nnwizard
    import nnwizard.probes

    return any(filename.startswith(str(Path(pkg.__file__).parent)) for pkg in (nnwizard, nnwizard.probes))


@contextmanager
def plain_copies():
    """While it is entered, nnwizard's own ``copy.deepcopy`` of a module holding FSDP2 modules (the recorder's
    initial copy, a probe's fresh model) gives :func:`plain_copy`; the script's own calls are left as they are."""
    fsdp = _fsdp_module_class()
    if fsdp is None:
        yield
        return
    original = copy.deepcopy

    @functools.wraps(original)
    def deepcopy(x, memo=None, _nil=[]):  # noqa: B006 - copy.deepcopy's own signature
        if _contains_fsdp(x, fsdp) and _ours(sys._getframe(1).f_code.co_filename):
            return plain_copy(x)
        return original(x, memo, _nil)

    copy.deepcopy = deepcopy
    try:
        yield
    finally:
        copy.deepcopy = original
