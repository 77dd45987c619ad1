"""What one rank records for the cross-rank audits, as a recorder listener plus a patch set, and the
serialisable digest it sends to whoever writes the report.

Usage (one rank; see ``rank.py``)::

    digest = RankDigest(rank, world, script)
    run_script(script, args, RunOptions(listeners=[digest, ...], patches=[digest.patches()]))
    payload = digest.finish(result)          # a dict of plain JSON values

Recorded (each bounded, so a long run costs little memory):

- the DistributedSamplers (their line, shuffle, seed, replicas) and, at every pass, the epoch they were set to
  and a hash of the order they gave; ``set_epoch`` calls and their line;
- per DataLoader pass, the sample indices its batch sampler yielded (the first ``INDICES`` of each of the first
  ``PASSES`` passes), the sampler's class and length, and a fingerprint of the data set (length and, for tensors,
  sums; a ``Subset``'s own indices);
- a fingerprint (shape, sum, sum of magnitudes) of the first training input of each of the first ``INPUT_STEPS``
  steps; of every parameter an optimizer holds before the first step and after the steps in ``PARAM_STEPS``
  (a sharded DTensor's local shard is not compared across ranks); every step's loss and learning rates;
- BatchNorm layers (synced or not), and in the first ``BN_STEPS`` training steps the number of samples each one
  normalised on this rank and the batch mean and variance of its first ``BN_CHANNELS`` channels;
- the collectives the script entered (torch.distributed's functions, with their line, the step, the tensor
  shape and reduce op; the first ``COLLECTIVES``), DistributedDataParallel wrappers (their line,
  ``find_unused_parameters``, the trainable parameters' names in the order DDP numbers them), FSDP calls,
  ``init_process_group`` calls;
- the files the script opened for writing (the path it asked for, the mode, its line), what it printed (and
  logged) with the step, and the evaluation loss calls (value, and for class scores the correct count);
- the CPU RNG state (a hash) when the script starts and at its first forward.

``busy`` says what the rank waits in right now (a collective, a DDP forward or backward, init_process_group) and
since when, and ``events`` counts what it did: the heartbeat sends both to the watchdog.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import io
import logging
import math
import os
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnwizard.record import inner_model

PASSES = 8            # DataLoader passes whose indices are kept per batch sampler
INDICES = 4096        # indices kept per pass
INPUT_STEPS = 64      # steps whose first training input is fingerprinted
PARAM_STEPS = {1, 2, 3, 4, 5, 8, 10, 15, 20, 30, 40, 50, 60, 80, 100, 150, 200, 300, 400, 500, 600}
BN_STEPS = 30         # training steps whose BatchNorm batch statistics are kept
BN_CHANNELS = 16
COLLECTIVES = 400
PRINTS = 300
STEPS = 2000
EVAL_CALLS = 400
WRITES = 200
COLLECTIVE_NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
                    "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "reduce_scatter",
                    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
                    "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv")
CLASS_FNS = ("cross_entropy", "nll_loss")


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def tensor_fp(t: torch.Tensor) -> list | None:
    """[shape, sum, sum of magnitudes] of a tensor (float64 sums; a DTensor's local shard)."""
    local = getattr(t, "_local_tensor", None)
    t = local if isinstance(local, torch.Tensor) else t
    try:
        d = t.detach()
        if d.is_complex() or d.dtype == torch.bool:
            d = d.float()
        d = d.double()
        return [list(t.shape), _num(float(d.sum())), _num(float(d.abs().sum()))]
    except Exception:  # noqa: BLE001 - a tensor subclass without data
        return None


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for o in obj:
            found = _first_tensor(o)
            if found is not None:
                return found
    return None


def _order_hash(indices: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, indices)).encode()).hexdigest()[:16]


def _sharded(p: torch.Tensor) -> bool:
    """A DTensor with a Shard placement (FSDP2, tensor parallelism): each rank holds another part."""
    placements = getattr(p, "placements", None)
    return bool(placements) and any(type(pl).__name__ in ("Shard", "_StridedShard") for pl in placements)


def dataset_fp(dataset: Any) -> dict:
    """What identifies a data set across ranks without reading it through the user's code."""
    out: dict[str, Any] = {"type": type(dataset).__name__}
    try:
        out["len"] = len(dataset)
    except Exception:  # noqa: BLE001 - an iterable data set
        out["len"] = None
    from torch.utils.data import Subset, TensorDataset

    if isinstance(dataset, Subset):
        indices = [int(i) for i in dataset.indices]
        out["subset"] = {"hash": _order_hash(indices), "first": indices[:8], "base": dataset_fp(dataset.dataset)}
    elif isinstance(dataset, TensorDataset):
        out["tensors"] = [tensor_fp(t) for t in dataset.tensors]
    return out


class Sites:
    """``file:line in function`` of the innermost frame of the script's own files (its folder, outside
    site-packages and nnwizard), or None when the call did not come from them."""

    def __init__(self, folder: Path):
        self.folder = str(Path(folder).resolve())
        self._codes: dict[Any, tuple[bool, str]] = {}
        self._texts: dict[tuple, str] = {}   # (code, instruction offset) -> its text: a call site is formatted once

    def mine(self, code) -> tuple[bool, str]:
        known = self._codes.get(code)
        if known is None:
            name = code.co_filename
            try:
                resolved = str(Path(name).resolve())
            except (OSError, ValueError):
                resolved = name
            own = resolved.startswith(self.folder + os.sep) and "site-packages" not in resolved \
                and "/nnwizard/" not in resolved and not name.startswith("<")
            known = self._codes[code] = (own, Path(name).name)
        return known

    def where(self, depth: int = 2) -> str | None:
        frame = sys._getframe(depth)
        codes = self._codes
        while frame is not None:
            code = frame.f_code
            known = codes.get(code) or self.mine(code)
            if known[0]:
                key = (code, frame.f_lasti)
                text = self._texts.get(key)
                if text is None:
                    text = self._texts[key] = f"{known[1]}:{frame.f_lineno} in {code.co_name}"
                return text
            frame = frame.f_back
        return None


class RankDigest:
    """A recorder listener and a patch set (``patches()``) for one rank; see the module docstring."""

    def __init__(self, rank: int, world: int, folder: Path):
        self.rank, self.world = rank, world
        self.sites = Sites(folder)
        self.t0 = time.monotonic()
        self.events = 0
        self.busy: dict | None = None
        self.rec = None                       # the recorder (set at its first event)
        self.init: dict = {"calls": [], "backend": None, "world": None}
        self.samplers: list[dict] = []
        self._samplers: dict[int, dict] = {}
        self.passes: dict[int, list[dict]] = {}   # id(batch sampler) -> its passes
        self._batch_samplers: dict[int, Any] = {}
        self.inputs: list[list] = []          # [step, fingerprint] of the first training forward after each step
        self._input_step = -1
        self.params: list[dict] = []          # {"step", "opt", "fp": [...]} (fp None for sharded tensors)
        self.param_names: dict[int, list[str]] = {}
        self.steps: list[list] = []           # [step, loss, lrs, t]
        self.bn_layers: list[dict] = []
        self.bn: list[dict] = []              # {"step", "layer", "samples", "per_channel", "mean", "var"}
        self._bn_models: set[int] = set()
        self._hooks: list = []
        self.collectives: list[dict] = []
        self.collective_count = 0
        self._in_collective = 0
        self.ddp: list[dict] = []
        self._ddp_objs: list = []
        self.fsdp: list[dict] = []
        self.writes: list[dict] = []
        self.prints: list[dict] = []
        self.eval_calls: list[dict] = []
        self.forwards: dict[str, dict] = {}   # model name -> {"through": wrapper name or "", "calls": n}
        self.rng: dict = {}
        self.loader_sites: dict[int, str | None] = {}
        self._saving = 0                      # inside torch.save (its own open() is not a second write)
        self._names: dict[int, str] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def step_now(self) -> int:
        return self.rec.recording.total_steps if self.rec is not None else 0

    def _enter(self, kind: str, name: str, where: str | None) -> dict:
        self.busy = {"kind": kind, "name": name, "where": where, "since": self.now(), "step": self.step_now()}
        return self.busy

    def _leave(self) -> None:
        self.busy = None
        self.events += 1

    # -- recorder listener -------------------------------------------------------------------------
    def on_batch(self, rec, batch, index) -> None:
        self.rec = rec
        self.events += 1

    def on_forward(self, rec, info, args) -> None:
        self.rec = rec
        self.events += 1
        module = info.module
        inner = inner_model(module)
        entry = self.forwards.setdefault(f"{info.index}:{info.name}", {"through": info.wrapper or "", "calls": 0,
                                                                       "model": info.name, "index": info.index})
        entry["calls"] += 1
        if id(inner) not in self._bn_models:
            self._bn_models.add(id(inner))
            self._watch_batchnorm(inner, info.name)
            self._name_params(inner, info.name)
            if "first_forward" not in self.rng:
                self.rng["first_forward"] = self._rng_hash()
        if torch.is_grad_enabled() and module.training:
            step = rec.recording.total_steps
            if step != self._input_step and len(self.inputs) < INPUT_STEPS:
                self._input_step = step
                t = _first_tensor(args)
                if t is not None:
                    self.inputs.append([step, tensor_fp(t)])

    def on_step_pre(self, rec, optimizer, step) -> None:
        self.rec = rec
        if rec.recording.total_steps == 0 and optimizer is not None and not any(p["step"] == 0 for p in self.params):
            self._fingerprint(rec, optimizer, 0)

    def on_step_post(self, rec, optimizer, step) -> None:
        self.rec = rec
        self.events += 1
        n = rec.recording.total_steps
        if len(self.steps) < STEPS:
            self.steps.append([n, _num(step.loss) if step.loss is not None else None,
                               [_num(float(x)) for x in step.lrs], round(step.t, 3), step.optimizer])
        if optimizer is not None and n in PARAM_STEPS:
            self._fingerprint(rec, optimizer, n)

    def on_loss_args(self, rec, call, args, kwargs, value) -> None:
        if torch.is_grad_enabled() and call.training is not False:
            return
        if len(self.eval_calls) >= EVAL_CALLS:
            return
        entry = {"step": rec.recording.total_steps, "fn": call.fn, "where": call.where, "reduction": call.reduction}
        try:
            entry["value"] = _num(float(value.detach().float().mean())) if isinstance(value, torch.Tensor) else None
            x, y = (args + (None, None))[:2]
            if call.fn in CLASS_FNS and isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) \
                    and x.dim() >= 2 and not y.is_floating_point() and x.shape[0] == y.shape[0]:
                entry["correct"] = int((x.detach().argmax(1) == y).sum())
                entry["count"] = int(y.numel())
            else:
                entry["count"] = int(y.shape[0]) if isinstance(y, torch.Tensor) and y.dim() else None
        except Exception:  # noqa: BLE001 - an unusual loss call: keep what was read
            pass
        self.eval_calls.append(entry)

    # -- what the listener measures ----------------------------------------------------------------
    def _name_params(self, model: nn.Module, name: str) -> None:
        for n, p in model.named_parameters():
            self._names.setdefault(id(p), n)

    def _fingerprint(self, rec, optimizer, step: int) -> None:
        try:
            info = rec.optimizer_info(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            if info.index not in self.param_names:
                self.param_names[info.index] = [self._names.get(id(p), f"group param {i}") for i, p in enumerate(params)]
            with torch.no_grad():
                fps = [None if _sharded(p) else tensor_fp(p) for p in params]
            self.params.append({"step": step, "opt": info.index, "fp": fps})
        except Exception:  # noqa: BLE001 - never break the run
            pass

    def _watch_batchnorm(self, model: nn.Module, model_name: str) -> None:
        from torch.nn.modules.batchnorm import _BatchNorm

        for name, m in model.named_modules():
            if not isinstance(m, _BatchNorm):
                continue
            index = len(self.bn_layers)
            self.bn_layers.append({"model": model_name, "layer": name or type(m).__name__, "class": type(m).__name__,
                                   "sync": isinstance(m, nn.SyncBatchNorm), "features": m.num_features,
                                   "running": bool(m.track_running_stats)})
            self._hooks.append(m.register_forward_pre_hook(functools.partial(self._bn_batch, index)))

    def _bn_batch(self, index: int, module, args) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        step = self.step_now()
        if step >= BN_STEPS:
            return
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
            return
        try:
            with torch.no_grad():
                c = x.shape[1]
                flat = x.detach().transpose(0, 1).reshape(c, -1)[:BN_CHANNELS].double()
                self.bn.append({"step": step, "layer": index, "samples": int(x.shape[0]),
                                "per_channel": int(flat.shape[1]), "mean": flat.mean(1).tolist(),
                                "var": flat.var(1, unbiased=False).tolist()})
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def _rng_hash() -> str:
        return hashlib.sha1(torch.random.get_rng_state().numpy().tobytes()).hexdigest()[:16]

    # -- patches -----------------------------------------------------------------------------------
    @contextmanager
    def patches(self):
        """Everything the digest wraps while the script runs (entered after the recorder, undone before it)."""
        with ExitStack() as stack:
            undo: list = []
            stack.callback(lambda: [u() for u in reversed(undo)])
            self.rng["start"] = self._rng_hash()
            self.rng["initial_seed"] = int(torch.initial_seed())

            def patch(owner, name, make):
                original = getattr(owner, name, None)
                if original is None:
                    return
                setattr(owner, name, make(original))
                undo.append(lambda: setattr(owner, name, original))

            self._patch_distributed(patch)
            self._patch_data(patch)
            self._patch_outputs(patch)
            stack.callback(self._unhook)
            yield self

    def _unhook(self) -> None:
        while self._hooks:
            self._hooks.pop().remove()

    def _patch_distributed(self, patch) -> None:
        try:
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d
        except Exception:  # noqa: BLE001 - a torch build without distributed
            return
        if not dist.is_available():
            return
        digest = self

        def collective(name):
            def make(original):
                @functools.wraps(original)
                def call(*args, **kwargs):
                    if digest._in_collective:
                        return original(*args, **kwargs)
                    where = digest.sites.where()
                    entry = None
                    if len(digest.collectives) < COLLECTIVES:
                        entry = {"seq": digest.collective_count, "name": name, "where": where, "step": digest.step_now(),
                                 "t": digest.now()}
                        t = _first_tensor(args)
                        if t is not None:
                            entry["shape"] = list(t.shape)
                            entry["dtype"] = str(t.dtype).replace("torch.", "")
                        op = kwargs.get("op", next((a for a in args[1:2] if not isinstance(a, (torch.Tensor, list))), None))
                        if op is not None and name in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"):
                            entry["op"] = str(op).rsplit(".", 1)[-1]
                        digest.collectives.append(entry)
                    digest.collective_count += 1
                    digest._enter("collective", name, where)
                    digest._in_collective += 1
                    try:
                        result = original(*args, **kwargs)
                    finally:
                        digest._in_collective -= 1
                        digest._leave()
                        if entry is not None:
                            entry["s"] = round(digest.now() - entry["t"], 4)
                    return result
                return call
            return make

        for name in COLLECTIVE_NAMES:
            if hasattr(c10d, name):
                wrapped = collective(name)(getattr(c10d, name))
                for owner in (c10d, dist):
                    patch(owner, name, lambda original, wrapped=wrapped: wrapped)

        def init_patch(original):
            @functools.wraps(original)
            def init_process_group(*args, **kwargs):
                where = digest.sites.where()
                backend = kwargs.get("backend", args[0] if args else None)
                digest.init["calls"].append({"where": where, "backend": str(backend) if backend is not None else None,
                                             "t": digest.now()})
                digest._enter("init", "init_process_group", where)
                try:
                    result = original(*args, **kwargs)
                finally:
                    digest._leave()
                try:
                    digest.init["backend"] = str(dist.get_backend())
                    digest.init["world"] = dist.get_world_size()
                    digest.init["rank"] = dist.get_rank()
                except Exception:  # noqa: BLE001
                    pass
                return result
            return init_process_group

        for owner in (c10d, dist):
            patch(owner, "init_process_group", init_patch)

        from torch.nn.parallel import DistributedDataParallel as DDP

        def ddp_init(original):
            @functools.wraps(original)
            def __init__(this, module, *args, **kwargs):
                where = digest.sites.where()
                digest._enter("ddp-init", "DistributedDataParallel(...)", where)
                try:
                    original(this, module, *args, **kwargs)
                finally:
                    digest._leave()
                try:
                    ignored = set(getattr(this, "parameters_to_ignore", ()) or ())
                    names = [n for n, p in module.named_parameters() if p.requires_grad and n not in ignored]
                    digest.ddp.append({"where": where, "model": type(module).__name__,
                                       "find_unused_parameters": bool(getattr(this, "find_unused_parameters", False)),
                                       "broadcast_buffers": bool(getattr(this, "broadcast_buffers", True)),
                                       "static_graph": bool(getattr(this, "static_graph", False)),
                                       "params": names, "forwards": 0})
                    digest._ddp_objs.append(this)
                except Exception:  # noqa: BLE001
                    pass
            return __init__

        def ddp_forward(original):
            @functools.wraps(original)
            def forward(this, *args, **kwargs):
                for entry, obj in zip(digest.ddp, digest._ddp_objs):
                    if obj is this:
                        entry["forwards"] += 1
                digest._enter("ddp-forward", "DistributedDataParallel forward", digest.sites.where())
                try:
                    return original(this, *args, **kwargs)
                finally:
                    digest._leave()
            return forward

        patch(DDP, "__init__", ddp_init)
        patch(DDP, "forward", ddp_forward)

        def backward_patch(original):
            @functools.wraps(original)
            def backward(*args, **kwargs):
                if digest.busy is not None or not (digest._ddp_objs or digest.fsdp):
                    return original(*args, **kwargs)
                digest._enter("backward", "backward (DDP/FSDP reduce the gradients here)", digest.sites.where())
                try:
                    return original(*args, **kwargs)
                finally:
                    digest._leave()
            return backward

        patch(torch.autograd, "backward", backward_patch)

        def shard_patch(original):
            @functools.wraps(original)
            def fully_shard(module, *args, **kwargs):
                digest.fsdp.append({"where": digest.sites.where(), "module": type(module).__name__, "api": "fully_shard"})
                return original(module, *args, **kwargs)
            return fully_shard

        try:
            import torch.distributed.fsdp as fsdp

            patch(fsdp, "fully_shard", shard_patch)

            def fsdp1_init(original):
                @functools.wraps(original)
                def __init__(this, module, *args, **kwargs):
                    digest.fsdp.append({"where": digest.sites.where(), "module": type(module).__name__,
                                        "api": "FullyShardedDataParallel"})
                    return original(this, module, *args, **kwargs)
                return __init__

            patch(fsdp.FullyShardedDataParallel, "__init__", fsdp1_init)
        except Exception:  # noqa: BLE001 - a torch without FSDP
            pass

        from torch.utils.data.distributed import DistributedSampler

        def sampler_init(original):
            @functools.wraps(original)
            def __init__(this, dataset, *args, **kwargs):
                original(this, dataset, *args, **kwargs)
                try:
                    entry = {"index": len(digest.samplers), "where": digest.sites.where(), "shuffle": bool(this.shuffle),
                             "seed": int(this.seed), "replicas": int(this.num_replicas), "rank": int(this.rank),
                             "drop_last": bool(this.drop_last), "dataset": dataset_fp(dataset),
                             "len": int(this.num_samples), "set_epoch": [], "iters": []}
                    digest.samplers.append(entry)
                    digest._samplers[id(this)] = entry
                except Exception:  # noqa: BLE001
                    pass
            return __init__

        def set_epoch_patch(original):
            @functools.wraps(original)
            def set_epoch(this, epoch, *args, **kwargs):
                entry = digest._samplers.get(id(this))
                if entry is not None and len(entry["set_epoch"]) < 100:
                    entry["set_epoch"].append({"epoch": epoch if isinstance(epoch, int) else str(epoch),
                                               "where": digest.sites.where(), "step": digest.step_now()})
                return original(this, epoch, *args, **kwargs)
            return set_epoch

        def sampler_iter(original):
            @functools.wraps(original)
            def __iter__(this):
                entry = digest._samplers.get(id(this))
                if entry is None or len(entry["iters"]) >= PASSES * 4:
                    return original(this)
                indices = [int(i) for i in original(this)]
                entry["iters"].append({"epoch": int(getattr(this, "epoch", 0)), "hash": _order_hash(indices),
                                       "head": indices[:16], "n": len(indices), "step": digest.step_now()})
                return iter(indices)
            return __iter__

        patch(DistributedSampler, "__init__", sampler_init)
        patch(DistributedSampler, "set_epoch", set_epoch_patch)
        patch(DistributedSampler, "__iter__", sampler_iter)

    def _patch_data(self, patch) -> None:
        from torch.utils.data import BatchSampler, DataLoader

        digest = self

        def loader_init(original):
            @functools.wraps(original)
            def __init__(this, *args, **kwargs):
                original(this, *args, **kwargs)
                if len(digest.loader_sites) < 64:
                    digest.loader_sites[id(this)] = digest.sites.where()
            return __init__

        patch(DataLoader, "__init__", loader_init)

        def batch_iter(original):
            @functools.wraps(original)
            def __iter__(this):
                passes = digest.passes.setdefault(id(this), [])
                digest._batch_samplers[id(this)] = this
                record = None
                if len(passes) < PASSES:
                    sampler = getattr(this, "sampler", None)
                    try:
                        length = len(sampler)
                    except Exception:  # noqa: BLE001
                        length = None
                    record = {"sampler": type(sampler).__name__, "len": length, "indices": [], "step": digest.step_now()}
                    passes.append(record)
                for batch in original(this):
                    if record is not None and len(record["indices"]) < INDICES:
                        try:
                            record["indices"].extend(map(int, batch))
                        except (TypeError, ValueError):
                            record = None
                    yield batch
            return __iter__

        patch(BatchSampler, "__iter__", batch_iter)

    def _patch_outputs(self, patch) -> None:
        digest = self

        def open_patch(original):
            @functools.wraps(original)
            def opened(file, mode="r", *args, **kwargs):
                if isinstance(mode, str) and any(c in mode for c in "wax+") and not isinstance(file, int) \
                        and len(digest.writes) < WRITES and not digest._saving:
                    where = digest.sites.where()
                    if where is not None:
                        try:
                            path = os.path.abspath(os.fspath(file))
                        except TypeError:
                            path = None
                        if path and path != os.devnull:
                            digest.writes.append({"path": path, "mode": mode, "where": where, "step": digest.step_now(),
                                                  "via": digest._writer()})
                return original(file, mode, *args, **kwargs)
            return opened

        patch(builtins, "open", open_patch)
        patch(io, "open", open_patch)

        def save_patch(original):   # (torch.save writes a path through C++, not through open())
            @functools.wraps(original)
            def save(obj, f, *args, **kwargs):
                if isinstance(f, (str, os.PathLike)) and len(digest.writes) < WRITES:
                    where = digest.sites.where()
                    if where is not None:
                        digest.writes.append({"path": os.path.abspath(os.fspath(f)), "mode": "wb", "where": where,
                                              "step": digest.step_now(), "via": "torch.save"})
                digest._saving += 1
                try:
                    return original(obj, f, *args, **kwargs)
                finally:
                    digest._saving -= 1
            return save

        patch(torch, "save", save_patch)

        def print_patch(original):
            @functools.wraps(original)
            def printed(*args, **kwargs):
                if len(digest.prints) < PRINTS and kwargs.get("file") in (None, sys.stdout, sys.stderr):
                    where = digest.sites.where()
                    if where is not None:
                        sep = kwargs.get("sep", " ")
                        digest.prints.append({"text": (sep if isinstance(sep, str) else " ").join(map(str, args))[:400],
                                              "where": where, "step": digest.step_now(), "t": digest.now()})
                        digest.events += 1
                return original(*args, **kwargs)
            return printed

        patch(builtins, "print", print_patch)

        def log_patch(original):
            @functools.wraps(original)
            def handle(this, record):
                if len(digest.prints) < PRINTS:
                    where = digest.sites.where()
                    if where is not None:
                        try:
                            text = record.getMessage()
                        except Exception:  # noqa: BLE001
                            text = str(record.msg)
                        digest.prints.append({"text": text[:400], "where": where, "step": digest.step_now(),
                                              "t": digest.now(), "logged": True})
                return original(this, record)
            return handle

        patch(logging.Logger, "handle", log_patch)

    @staticmethod
    def _writer() -> str:
        """What opened the file: torch.save, numpy, logging, or the script's own open()."""
        frame = sys._getframe(2)
        for _ in range(12):
            if frame is None:
                break
            name = frame.f_code.co_filename
            if "/torch/serialization" in name:
                return "torch.save"
            if "/numpy/" in name:
                return "numpy"
            if "/logging/" in name:
                return "logging"
            frame = frame.f_back
        return "open"

    # -- the digest --------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The digest so far (plain JSON values): what the audits compare across ranks."""
        loaders = []
        rec = self.rec.recording if self.rec is not None else None
        for info in (rec.loaders if rec is not None else []):
            bs = getattr(info.loader, "batch_sampler", None)
            sampler = getattr(info.loader, "sampler", None)
            passes = self.passes.get(id(bs), []) if bs is not None else []
            dist_sampler = self._samplers.get(id(sampler))
            loaders.append({"index": info.index, "where": self.loader_sites.get(id(info.loader)),
                            "dataset": dataset_fp(info.loader.dataset),
                            "batch_size": info.batch_size, "sampler": type(sampler).__name__,
                            "sampler_len": passes[0]["len"] if passes else None,
                            "distributed_sampler": dist_sampler["index"] if dist_sampler else None,
                            "iterations": info.iterations, "trained": [b > 0 for b in info.backwards],
                            "passes": [{k: v for k, v in p.items()} for p in passes]})
        models = []
        for m in (rec.models if rec is not None else []):
            models.append({"index": m.index, "name": m.name, "wrapper": m.wrapper, "params": m.params,
                           "trainable": m.trainable, "forwards": m.forwards})
        return {
            "rank": self.rank, "world": self.world, "pid": os.getpid(), "seconds": self.now(),
            "init": self.init, "samplers": self.samplers, "loaders": loaders, "inputs": self.inputs,
            "params": self.params, "param_names": {str(k): v for k, v in self.param_names.items()},
            "steps": self.steps, "total_steps": rec.total_steps if rec is not None else 0,
            "bn_layers": self.bn_layers, "bn": self.bn, "collectives": self.collectives,
            "collective_count": self.collective_count, "ddp": self.ddp, "fsdp": self.fsdp, "writes": self.writes,
            "prints": self.prints, "eval_calls": self.eval_calls, "forwards": list(self.forwards.values()),
            "models": models, "rng": self.rng, "busy": self.busy, "events": self.events,
            "optimizers": [{"index": o.index, "name": o.name, "steps": o.steps, "where": o.where,
                            "lrs": [g.get("lr") for g in o.groups]} for o in (rec.optimizers if rec is not None else [])],
        }

    def finish(self, result) -> dict:
        """The final digest, with how the script ended (``result``: a RunResult, or None when it never ran)."""
        out = self.snapshot()
        if result is None:
            return out
        rec = result.recording
        out["exit"] = result.exit
        out["exit_code"] = result.exit_code
        out["stopped"] = rec.stopped
        out["run_seconds"] = result.seconds
        out["output"] = list(result.output)[-40:]
        out["written"] = [w[0] for w in result.written]
        out["notes"] = list(rec.notes)
        if rec.error is not None:
            out["error"] = {"type": rec.error.type, "message": rec.error.message, "where": rec.error.where,
                            "step": rec.error.step, "traceback": rec.error.traceback[-3000:]}
        return out
