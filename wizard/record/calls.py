"""The model calls of a step, kept for re-executing it (watch's replay bundles): each top-level call of the
watched model instances in grad mode, with its arguments, keyword arguments and output, and the CPU RNG state at
the step's first call.

:class:`CallKeeper` wraps the ``forward`` of the model's class (one Python call per model call, for the watched
instances only; restored on close) rather than hooking the instance: a module hook puts every call of the model
on torch's slow hook path, and an instance hook (or attribute) would travel with the user's
``copy.deepcopy(model)`` / ``torch.save(model)``. A model whose instance has its own ``forward`` attribute gets a
forward pre/post hook instead (:class:`_Hook`: copied or pickled, it becomes a hook that does nothing).

The keeper writes into its owner's ``step_calls`` dict (``"calls"``: a list of ``{"module", "args", "kwargs",
"out"}``, ``"rng"``), read anew at every call (the owner starts a fresh one at each step), at most
``owner.max_per_step`` calls a step.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

_cpu_rng = torch.default_generator.get_state  # torch.random.get_rng_state without its Python frame
_compiling = torch.compiler.is_compiling       # True while torch.compile traces (our side effects stay out of its graph)
_grad_enabled = torch.is_grad_enabled          # (one lookup less per call: these run every step)


def compiled_inner(module: nn.Module) -> nn.Module:
    """The model a ``torch.compile`` wrapper (OptimizedModule) runs; any other module itself."""
    inner = module.__dict__.get("_modules", {}).get("_orig_mod") if type(module).__name__ == "OptimizedModule" else None
    return inner if isinstance(inner, nn.Module) else module


class _Inert:
    """What a keeper's hook becomes in a copy or pickle of the model: a hook that does nothing."""

    def __call__(self, *args):
        return None


class _Hook:
    """A keeper's forward hook on a model instance; copied (``copy.deepcopy``) or pickled (``torch.save(model)``)
    with the model, it becomes an :class:`_Inert` one, not the keeper."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def __reduce__(self):
        return _Inert, ()


class CallKeeper:
    """See the module docstring. ``owner``: what has ``step_calls`` and ``max_per_step`` (a Watch)."""

    def __init__(self, owner: Any):
        self.owner = owner
        self.hooked: dict[int, list] = {}     # id(model) -> its hook handles (an instance-level forward) or []
        self.wrapped: set[int] = set()        # ids of the models whose class forward is wrapped
        self.patched: dict[type, tuple] = {}  # class -> (the forward it had in its own __dict__ or None, our wrapper)
        self.inside = False                   # in a wrapped model forward (a nested model call is not a new call)

    def keeps(self, module: nn.Module) -> bool:
        return id(module) in self.hooked

    def keep(self, module: nn.Module, args: tuple) -> None:
        """Keep ``module``'s calls from now on, this one (about to run, ``args``) included."""
        if "forward" in module.__dict__:  # an instance-level forward (the class's is not called): hooks
            self.hooked[id(module)] = self._hook(module)
        else:
            self.hooked[id(module)] = []
            self._wrap(module)
        if _grad_enabled():  # this first call: torch looked its forward up before we wrapped it
            self._pre(module, args, {})
            box = []

            def first(m, a, kw, out):  # its keyword arguments and output, once
                box[0].remove()
                calls = self.owner.step_calls["calls"]
                if calls and calls[-1]["module"] is compiled_inner(m) and "out" not in calls[-1]:
                    calls[-1].update(kwargs=kw, out=out)
            box.append(module.register_forward_hook(first, with_kwargs=True, always_call=True))

    def unhook(self, modules) -> list[nn.Module]:
        """Take the instance hooks off ``modules`` (before pickling them); the modules that had some."""
        removed = []
        for m in modules:
            handles = self.hooked.pop(id(m), None)
            for h in handles or []:
                h.remove()
            if handles is not None:
                removed.append(m)
        return removed

    def rehook(self, modules: list[nn.Module]) -> None:
        for m in modules:
            self.hooked[id(m)] = self._hook(m) if "forward" in m.__dict__ else []

    def close(self) -> None:
        """Every hook off, every class's forward back (unless someone patched it after us: ours passes through)."""
        for handles in self.hooked.values():
            for h in handles:
                h.remove()
        self.hooked.clear()
        self.wrapped.clear()
        for cls, (had, wrapper) in self.patched.items():
            if cls.__dict__.get("forward") is wrapper:
                if had is None:
                    delattr(cls, "forward")
                else:
                    setattr(cls, "forward", had)
        self.patched.clear()

    def _hook(self, module: nn.Module) -> list:
        return [module.register_forward_pre_hook(_Hook(self._pre), with_kwargs=True),
                module.register_forward_hook(_Hook(self._post), always_call=True)]

    def _wrap(self, module: nn.Module) -> None:
        """Wrap the ``forward`` of the model's class (once per class) and mark this instance kept."""
        self.wrapped.add(id(module))
        cls = type(module)
        if cls not in self.patched:
            had = cls.__dict__.get("forward")
            wrapper = self._forward_patch(getattr(cls, "forward"))
            setattr(cls, "forward", wrapper)
            self.patched[cls] = (had, wrapper)

    def _forward_patch(self, original):
        """A class's ``forward``, wrapped: a kept instance's top-level call in grad mode is kept (arguments,
        keyword arguments, output; the CPU RNG state at the step's first one); any other call (another instance,
        no grad, a nested call) goes straight through."""
        keeper, owner = self, self.owner

        @functools.wraps(original)
        def forward(this, *args, **kwargs):
            if keeper.inside or id(this) not in keeper.wrapped or not _grad_enabled() or _compiling():
                return original(this, *args, **kwargs)
            cur = owner.step_calls
            calls = cur["calls"]
            if not calls:  # the step's first call (the common case: one a step)
                cur["rng"] = _cpu_rng()  # the RNG state at the step's first forward
                call = {"module": this, "args": args, "kwargs": kwargs}
                calls.append(call)
            else:  # (a first call keep() already took, when the recorder's hooks ran before this lookup)
                call = calls[-1] if calls[-1]["module"] is this and "out" not in calls[-1] else None
                if call is None:
                    if len(calls) >= owner.max_per_step:
                        return original(this, *args, **kwargs)
                    call = {"module": this, "args": args, "kwargs": kwargs}
                    calls.append(call)
                else:
                    call.update(args=args, kwargs=kwargs)
            keeper.inside = True
            try:
                call["out"] = out = original(this, *args, **kwargs)
            finally:
                keeper.inside = False
            return out
        return forward

    def _pre(self, module, args, kwargs):
        if not _grad_enabled():
            return None
        module = compiled_inner(module)   # a compiled model's call is kept as its model's (replayed eagerly)
        cur = self.owner.step_calls
        calls = cur["calls"]
        if not calls:
            cur["rng"] = _cpu_rng()  # the RNG state at the step's first forward
        elif calls[-1]["module"] is module and "out" not in calls[-1]:
            calls[-1].update(args=args, kwargs=kwargs)  # the first call, seen twice
            return None
        if len(calls) < self.owner.max_per_step:
            calls.append({"module": module, "args": args, "kwargs": kwargs})
        return None

    def _post(self, module, args, *rest):
        module = compiled_inner(module)
        output = rest[-1] if rest else None
        calls = self.owner.step_calls["calls"]
        if calls and calls[-1]["module"] is module and "out" not in calls[-1]:
            calls[-1]["out"] = output
        return None
