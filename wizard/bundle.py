"""Replay bundles (CONTRACT §7): ``DIR/anomaly-step<N>/`` holds what replaying one optimizer step
needs, saved inside that step, before the optimizer changed anything.

Files:

- ``meta.json``   step, trigger, reason, loss, gradient norm, LR per group, the recent history, the
                  script (path, argv, cwd), how the step is re-executed (``recipe``), versions.
- ``state.pt``    the model object(s) as the run held them (``torch.save(module)``: class and weights),
                  the optimizer's class, hyper-parameters, ``state_dict()`` and its parameters' names,
                  and the gradients of that step as the real run computed them.
- ``batch.pt``    what the step consumed: the model's call arguments, the loss call(s), and a ring of
                  the few steps before it (``ring``), for "the batch before".
- ``rng.pt``      torch's CPU (and CUDA) RNG state taken at the step's first forward, and Python's
                  and NumPy's.

Models are pickled whole, so their classes must import at replay time. A class defined in the
training script itself (``__main__``) is found again by reading that script's imports, classes,
functions and constant assignments into a module *without running it* (``load_script_defs``);
classes from importable modules need those modules on ``sys.path`` (the script's folder and the
working directory of the run are added). Bundles are pickles: load only your own.
"""

from __future__ import annotations

import ast
import io
import json
import platform
import random
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import nnwizard
from nnwizard.jsonsafe import jsonable as _jsonsafe

SCRIPT_MODULE = "__nnwizard_script__"


def jsonable(v: Any) -> Any:
    """JSON-safe meta data: a tensor of more than 16 values is described by its shape."""
    return _jsonsafe(v, limit=16)


def rng_state(cuda: bool = False) -> dict:
    state = {"torch": torch.random.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.random.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def optimizer_record(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict:
    groups = [[names.get(id(p), f"?{i}.{j}") for j, p in enumerate(g["params"])] for i, g in enumerate(optimizer.param_groups)]
    cls = type(optimizer)
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "defaults": dict(optimizer.defaults),
            "state_dict": optimizer.state_dict(), "param_names": groups}


def save_bundle(folder: Path, meta: dict, models: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None,
                names: dict[int, str], grads: dict[str, torch.Tensor], step_data: dict, ring: list[dict],
                rng: dict | None) -> Path:
    """Write a bundle; returns the folder. Raises only on I/O errors of the folder itself."""
    folder.mkdir(parents=True, exist_ok=True)
    notes = []
    models, names, grads, meta = _unwrapped(models, names, grads, meta, notes)
    state = {"models": {}, "model_states": {}, "grads": grads,
             "optimizer": optimizer_record(optimizer, names) if optimizer is not None else None}
    for name, module in models.items():
        state["model_states"][name] = {"class": f"{type(module).__module__}:{type(module).__qualname__}",
                                       "state_dict": module.state_dict()}
    buf = io.BytesIO()
    try:
        torch.save({**state, "models": models}, buf)
    except Exception as exc:  # noqa: BLE001 - a model with unpicklable attributes: keep its weights
        notes.append(f"the model object could not be pickled ({type(exc).__name__}: {exc}); only its state_dict was saved")
        buf = io.BytesIO()
        torch.save(state, buf)
    (folder / "state.pt").write_bytes(buf.getvalue())
    try:
        torch.save({"step": step_data, "ring": ring}, folder / "batch.pt")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"the batch could not be saved ({type(exc).__name__}: {exc})")
        torch.save({"step": {k: v for k, v in step_data.items() if k == "recipe"}, "ring": []}, folder / "batch.pt")
    if rng is not None:
        torch.save(rng, folder / "rng.pt")
    meta = {**meta, "notes": meta.get("notes", []) + notes, "nnwizard_version": nnwizard.__version__,
            "torch": torch.__version__, "python": platform.python_version()}
    if "cells" not in meta and (sys.modules.get("IPython") is not None or sys.modules.get("nnwizard.notebook.cells")):
        from nnwizard.notebook.sources import current_cells

        cells = current_cells()   # a notebook's or a kernel's cells: replay rebuilds the classes they define
        if cells:
            meta["cells"] = cells
    (folder / "meta.json").write_text(json.dumps(jsonable(meta), indent=1) + "\n", encoding="utf-8")
    return folder


def _unwrapped(models: dict[str, nn.Module], names: dict[int, str], grads: dict[str, torch.Tensor], meta: dict,
               notes: list[str]):
    """The models a bundle keeps, without their data-parallel wrappers: a DistributedDataParallel (or
    DataParallel, torch.compile) wrapper needs its process group to be unpickled, and replay runs in one process,
    so the module it runs is saved, under the same keys, its parameters named as in that module. An FSDP2 module
    sharded over several ranks holds only this rank's shards: kept as it is, and the bundle says it does not
    replay in one process."""
    from nnwizard.record import inner_model

    inner = {k: inner_model(m) for k, m in models.items()}
    if all(inner[k] is m for k, m in models.items()):
        return _sharded(models, meta, notes), names, grads, meta
    old = {}   # id(parameter) -> its name as the wrapper gave it
    for k, m in models.items():
        for n, p in m.named_parameters():
            old.setdefault(id(p), names.get(id(p), n))
    new: dict[int, str] = {}
    for k, m in inner.items():
        for n, p in m.named_parameters():
            new.setdefault(id(p), n if len(inner) == 1 else f"{k}.{n}")
    rename = {old[i]: new[i] for i in new if i in old}
    names = {i: new.get(i, n) for i, n in names.items()}
    grads = {rename.get(n, n): g for n, g in grads.items()}
    wrapped = sorted({type(m).__name__ for k, m in models.items() if inner[k] is not m})
    notes.append(f"saved the module(s) that {', '.join(wrapped)} wraps (replay runs in one process)")
    meta = {**meta, "models": {k: type(m).__name__ for k, m in inner.items()}, "wrappers": wrapped}
    return _sharded(inner, meta, notes), names, grads, meta


def _sharded(models: dict[str, nn.Module], meta: dict, notes: list[str]) -> dict[str, nn.Module]:
    for m in models.values():
        for p in m.parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is not None and mesh.size() > 1:
                meta["replayable"] = False
                meta["why_not"] = (f"the model's parameters are sharded over {mesh.size()} ranks (FSDP2 / DTensor): this "
                                   f"bundle holds one rank's shards, which do not replay in one process")
                notes.append(meta["why_not"])
                return models
    return models


# ------------------------------------------------------------------------------------------ loading
def load_script_defs(path: Path) -> types.ModuleType:
    """The imports, classes, functions and call-free assignments of a script, executed into a fresh
    module without running anything else (no training, no ``main()``)."""
    source = path.read_text(encoding="utf-8")
    module = types.ModuleType(SCRIPT_MODULE)
    module.__file__ = str(path)
    return definitions(ast.parse(source, str(path)), str(path), module)


def definitions(tree: ast.Module, filename: str, module: types.ModuleType) -> types.ModuleType:
    """Run the definitions of ``tree`` (imports, classes, functions, call-free assignments) into ``module``."""
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            keep.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and \
                not any(isinstance(n, (ast.Call, ast.Await, ast.Yield)) for n in ast.walk(node.value)):
            keep.append(node)
    for node in keep:   # one at a time: a statement that reads what only the run computed
        code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec")   # (`x = args.lr`) is left out
        try:
            exec(code, module.__dict__)  # noqa: S102 - the user's own definitions, nothing that runs training
        except Exception:  # noqa: BLE001 - NameError, AttributeError ... of a value the run made
            continue
    return module


@contextmanager
def _importable(meta: dict):
    """``__main__`` resolved to the script's definitions, its folder and the run's cwd on sys.path."""
    script = meta.get("script")
    added = [p for p in (str(Path(script).resolve().parent) if script else None, meta.get("cwd")) if p and p not in sys.path]
    sys.path[:0] = added
    saved_main = sys.modules.get("__main__")
    if meta.get("cells"):   # a notebook's (or a kernel's) cells: the classes they defined
        from nnwizard.notebook.sources import load_cells_defs

        sys.modules["__main__"] = load_cells_defs(meta["cells"], SCRIPT_MODULE)
    elif script and Path(script).exists() and Path(script).suffix != ".ipynb":
        sys.modules["__main__"] = load_script_defs(Path(script))
    try:
        yield
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


def _resolve(path: str):
    module, _, qual = path.partition(":")
    obj = __import__(module, fromlist=["_"])
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Bundle:
    folder: Path
    meta: dict
    state_bytes: bytes
    batch: dict
    rng: dict | None

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    def load_state(self, device: torch.device | str = "cpu") -> dict:
        """A fresh copy of the saved models (as objects, pre-step weights) and the optimizer record."""
        with _importable(self.meta):
            state = torch.load(io.BytesIO(self.state_bytes), map_location=device, weights_only=False)
        return state

    def models(self, device: torch.device | str = "cpu") -> dict[str, nn.Module]:
        state = self.load_state(device)
        if state.get("models"):
            return state["models"]
        built = {}
        for name, rec in state["model_states"].items():  # no pickled object: try the class with no arguments
            with _importable(self.meta):
                cls = _resolve(rec["class"])
            module = cls()
            module.load_state_dict(rec["state_dict"])
            built[name] = module.to(device)
        return built

    def make_optimizer(self, models: dict[str, nn.Module]) -> torch.optim.Optimizer:
        rec = self.load_state("cpu")["optimizer"]
        if rec is None:
            raise ValueError("the bundle holds no optimizer")
        params = {}
        for prefix, model in models.items():
            for n, p in model.named_parameters():
                params[f"{prefix}.{n}" if len(models) > 1 else n] = p
        groups = []
        for names, saved in zip(rec["param_names"], rec["state_dict"]["param_groups"]):
            group = {k: v for k, v in saved.items() if k != "params"}
            group["params"] = [params[n] for n in names if n in params]
            groups.append(group)
        missing = [n for names in rec["param_names"] for n in names if n not in params]
        if missing:
            raise ValueError(f"the optimizer's parameters {missing[:3]} are not in the saved model(s)")
        cls = _resolve(rec["class"])
        optimizer = cls(groups)
        optimizer.load_state_dict(rec["state_dict"])
        return optimizer


def load_bundle(folder: str | Path) -> Bundle:
    folder = Path(folder)
    if not (folder / "meta.json").is_file() or not (folder / "state.pt").is_file():
        raise FileNotFoundError(f"{folder}: not a replay bundle (expected meta.json and state.pt from nnwizard watch)")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    with _importable(meta):
        batch = torch.load(folder / "batch.pt", weights_only=False) if (folder / "batch.pt").exists() else {"step": {}, "ring": []}
    rng = torch.load(folder / "rng.pt", weights_only=False) if (folder / "rng.pt").exists() else None
    return Bundle(folder, meta, (folder / "state.pt").read_bytes(), batch, rng)
