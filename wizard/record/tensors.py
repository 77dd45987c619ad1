"""Walking what a program passes around: the tensors nested in a value (arguments, outputs, batches),
CPU copies and fingerprints of them, and the small reductions the recorder takes over many tensors at once
(a global norm from per-tensor norms, which of many values are non-zero, NaN/Inf among a forward's
inputs). One walk serves the recorder, the watcher, the op tracer and the probes."""

from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import torch
from torch.nn.parameter import is_lazy


def tensors_in(obj: Any, depth: int | None = None):
    """Every tensor in ``obj``, depth first through lists, tuples and dict values (``depth``: at most this many
    levels of nesting below ``obj``; None: all)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth is not None and depth < 0:
        return
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from tensors_in(o, None if depth is None else depth - 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from tensors_in(o, None if depth is None else depth - 1)


def cpu_copy(obj: Any) -> Any:
    """A copy of ``obj`` with every tensor in it detached and copied to the CPU (named tuples, lists, tuples
    and dicts rebuilt, of their own type where it can be, anything else as it is)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(cpu_copy(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(o) for o in obj)
    if isinstance(obj, dict):
        try:
            return type(obj)({k: cpu_copy(v) for k, v in obj.items()})
        except TypeError:
            return {k: cpu_copy(v) for k, v in obj.items()}
    return obj


def fingerprint(obj: Any) -> tuple | None:
    """What tells one batch from another, cheaply: each of the first 4 tensors' shape, dtype and a hash of
    up to 4096 of its values (evenly spaced); None when a tensor cannot be read that way."""
    out = []
    try:
        for t, _ in zip(tensors_in(obj), range(4)):
            flat = t.detach().reshape(-1)
            sample = flat[:: max(flat.numel() // 4096, 1)][:4096]
            out.append((tuple(t.shape), str(t.dtype), hash(sample.to("cpu", torch.float64).numpy().tobytes())))
    except Exception:  # noqa: BLE001 - complex, quantized, sparse or meta tensors: not told apart
        return None
    return tuple(out) or None


def storage_ptr(t: torch.Tensor) -> int | None:
    """The address of a tensor's storage; a DTensor's (FSDP2's sharded parameters, tensor parallelism) is its local
    shard's; None for a tensor without one (a wrapper subclass holds no storage of its own)."""
    local = getattr(t, "_local_tensor", None)
    try:
        return (local if isinstance(local, torch.Tensor) else t).untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage
        return None


def same_storage(t: torch.Tensor, args: tuple) -> int | None:
    """The index of the first tensor in ``args`` that shares ``t``'s storage (``t`` is it, a view or a slice of it)."""
    try:
        ptr = t.untyped_storage().data_ptr()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr and ptr:
                return i
    except (RuntimeError, NotImplementedError):  # tensors without storage
        pass
    return None


def total_norm(norms: list[torch.Tensor]) -> float:
    """The global norm from per-tensor norms (``torch._foreach_norm``'s), as one float."""
    if len(norms) <= 32 and not norms[0].is_cuda:  # a few CPU tensors: read one by one, faster than a stack
        return math.hypot(*map(float, norms))
    try:
        return float(torch.linalg.vector_norm(torch.stack([n.float() for n in norms])))
    except RuntimeError:  # norms on several devices
        return math.sqrt(sum(float(n) ** 2 for n in norms))


def nonfinite_inputs(inputs: list[tuple]) -> bool:
    """Does any floating-point tensor among these forwards' arguments hold a NaN or an Inf?"""
    for args in inputs:
        for t in (args if len(args) == 1 and isinstance(args[0], torch.Tensor) else tensors_in(args)):
            if t.layout != torch.strided or t.grad_fn is not None:
                continue  # sparse inputs (a graph's adjacency matrix): isfinite has no sparse kernel; a tensor the
                # graph computed (an RNN's hidden state fed back, another model's output) is not the data
            t = t.detach()
            if t.is_floating_point() and t.numel() and not math.isfinite(float(t.sum())) \
                    and not bool(torch.isfinite(t).all()) and not additive_mask(t):  # (a sum of finite values may overflow)
                return True
    return False


def additive_mask(t: torch.Tensor) -> bool:
    """Only 0 and -inf: an additive attention mask (nn.Transformer's square subsequent mask), not data."""
    return bool(((t == 0) | (t == float("-inf"))).all())


def nonzero(values: list[torch.Tensor]) -> list[bool]:
    """Which of these scalar tensors are not 0 (NaN and Inf included: a gradient gone non-finite was not
    cleared), read with one host transfer where there are many."""
    if len(values) > 8:
        try:
            return torch.stack([v.float() for v in values]).ne(0).tolist()
        except RuntimeError:  # on several devices
            pass
    return [float(v) != 0 for v in values]


_GRAD, _REQUIRES, _PARAMS = attrgetter("grad"), attrgetter("requires_grad"), itemgetter("params")


def trainable_grads(groups: list[dict]) -> tuple[list, list]:
    """The trainable tensors of an optimizer's param groups and their ``.grad`` (None where unset), walked in
    C (``map``) rather than in Python: full mode's step pre hook runs it every step, light mode's on the
    steps whose gradient norm it measures."""
    params = groups[0]["params"] if len(groups) == 1 else list(chain.from_iterable(map(_PARAMS, groups)))
    if not all(map(_REQUIRES, params)):
        params = [p for p in params if p.requires_grad]
    return params, list(map(_GRAD, params))


def values_in(params) -> int:
    """Values in these parameters; a lazy module's not yet initialised count 0 (their numel() raises)."""
    return sum(0 if is_lazy(p) else p.numel() for p in params)


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (cached: a loss call records two every call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def shape_of(x) -> list | None:
    """A tensor's shape as a list (of a tuple or list: its first tensor's); None for anything else."""
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return list(x[0].shape)
    return None
