"""The user's training module, validated and adapted (CONTRACT §1): the one object probes use.

A ``Target`` hands out fresh models, fixed small batches already on the device, the loss, the
optimizer and scheduler factories, and the user's ``train_step`` / ``train_epoch`` / ``evaluate``
or the correct reference versions of them.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from nnwizard import reference
from nnwizard.errors import TargetError, UsageError
from nnwizard.loader import raised_at, load_namespace

TASKS = ("classification", "binary", "regression")
CLASSIFICATION_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
BINARY_LOSSES = (nn.BCELoss, nn.BCEWithLogitsLoss)
REGRESSION_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)
REQUIRED = {
    "build_model": "build_model() returning a fresh, untrained torch.nn.Module",
    "build_data": "build_data() returning (train, val) DataLoaders or Datasets; val may be None",
    "loss_fn": "loss_fn (a callable (outputs, targets) -> scalar tensor) or build_loss() returning one",
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available here (torch {torch.__version__}); use cpu or auto.")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"--device {name!r} is not a device torch knows: {exc}") from None


def to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def cut(batch: Any, samples: int | None) -> Any:
    """The first ``samples`` samples of a batch's tensors (all of it when None)."""
    if samples is None or not isinstance(batch, (tuple, list)):
        return batch
    return type(batch)(b[:samples] if isinstance(b, torch.Tensor) and b.dim() else b for b in batch)


class LossNotReplayable(Exception):
    """The loss cannot be called again on a new model output as the user's code called it (the code took a
    selection of the output that depends on the batch: ``gather`` with the actions taken, a row index). Probes that
    replay the loss leave that part out: it is not a fault of the user's code and not a missing measurement."""


class DeviceLoader:
    """Iterates a DataLoader moving each batch to the device, optionally stopping after n batches
    and cutting each batch to its first ``samples`` samples.

    Other attributes (``dataset``, ``batch_size``, ``sampler``...) are forwarded to the loader."""

    def __init__(self, loader: DataLoader, device: torch.device, max_batches: int | None = None,
                 samples: int | None = None):
        self.loader, self.device, self.max_batches, self.samples = loader, device, max_batches, samples

    def __iter__(self):
        batches = iter(self.loader)
        if self.max_batches is not None:
            batches = itertools.islice(batches, self.max_batches)
        for batch in batches:
            yield to_device(cut(batch, self.samples), self.device)

    def __len__(self) -> int:
        n = len(self.loader)
        return n if self.max_batches is None else min(n, self.max_batches)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def as_loader(data: Any, shuffle: bool) -> DataLoader | None:
    if data is None or isinstance(data, DataLoader):
        return data
    if isinstance(data, Dataset) or hasattr(data, "__getitem__"):
        return DataLoader(data, batch_size=32, shuffle=shuffle)
    raise TypeError(f"expected a DataLoader or Dataset, got {type(data).__name__}")


@dataclass
class Target:
    spec: str
    namespace: Any
    source: Path | None
    device: torch.device
    train_loader: DataLoader
    val_loader: DataLoader | None
    loss_fn: Callable
    task: str
    num_classes: int | None = None
    # samples per batch the probes train on, set by the session's cost model when the user's
    # batch is too dear to step through a diagnosis (None: the user's batches as they are)
    sample_limit: int | None = None
    task_source: str = ""
    _batches: dict[str, list] = field(default_factory=dict, repr=False)
    # fresh models per seed, built once and copied after (None: as the device decides; see fresh_model)
    cache_builds: bool | None = None
    _pristine: dict[int, tuple] = field(default_factory=dict, repr=False)

    # -- the user's optional functions ------------------------------------------------------------
    def user(self, name: str) -> Callable | None:
        fn = getattr(self.namespace, name, None)
        return fn if callable(fn) else None

    @property
    def user_train_step(self):
        return self.user("train_step")

    @property
    def user_train_epoch(self):
        return self.user("train_epoch")

    @property
    def user_evaluate(self):
        return self.user("evaluate")

    def user_functions(self) -> list[str]:
        return [n for n in ("train_step", "train_epoch", "evaluate") if self.user(n)]

    # -- models, optimizers, data -----------------------------------------------------------------
    def fresh_model(self, seed: int | None = None) -> nn.Module:
        """The user's ``build_model()`` from ``seed``, on the device. A diagnosis asks for some thirty;
        on a GPU each one initialises every weight on the CPU and copies it over (0.2-0.6 s for a model of
        45-85M parameters, most of a 20 s session), so there the first model of each seed is kept on the
        device and later calls get a copy of it, the generators left exactly as a build leaves them."""
        if seed is not None:
            torch.manual_seed(seed)
        cached = self._pristine.get(seed) if seed is not None else None
        if cached is not None:
            model, cpu_rng, cuda_rng = cached
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, self.device)
            return copy.deepcopy(model)
        model = self.namespace.build_model().to(self.device)
        if seed is not None and self._caches(model):
            try:
                cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
                self._pristine[seed] = (copy.deepcopy(model), torch.get_rng_state(), cuda_rng)
            except Exception:  # noqa: BLE001 - a model deepcopy cannot copy is built each time
                self.cache_builds = False
        return model

    def _caches(self, model: nn.Module) -> bool:
        if self.cache_builds is not None:
            return self.cache_builds
        if self.device.type != "cuda" or len(self._pristine) >= 2:   # the probes ask for seed and seed + 1
            return False
        size = sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))
        return 4 * size < torch.cuda.mem_get_info(self.device)[0]   # a copy kept, with room to spare

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        factory = self.user("build_optimizer")
        return factory(model) if factory else torch.optim.Adam(model.parameters(), lr=1e-3)

    def make_scheduler(self, optimizer: torch.optim.Optimizer):
        factory = self.user("build_scheduler")
        return factory(optimizer) if factory else None

    def loader(self, split: str = "train", max_batches: int | None = None) -> DeviceLoader | None:
        base = self.train_loader if split == "train" else self.val_loader
        return None if base is None else DeviceLoader(base, self.device, max_batches, self.sample_limit)

    def subset_loader(self, split: str = "val", max_batches: int | None = None) -> DeviceLoader | None:
        """A real DataLoader over the first ``max_batches`` batches' worth of the split's samples, in
        order, whose ``dataset`` is exactly what it iterates (so user code dividing by
        ``len(loader.dataset)`` or ``len(loader)`` gets the right counts); the whole split when
        ``max_batches`` is None. When the session slices dear batches (``sample_limit``), its batches
        hold that many samples. Falls back to the split's own loader, cut, when it has no indexable
        dataset."""
        base = self.train_loader if split == "train" else self.val_loader
        if base is None:
            return None
        ds = getattr(base, "dataset", None)
        size = getattr(base, "batch_size", None)
        if ds is None or size is None or isinstance(ds, torch.utils.data.IterableDataset) or not hasattr(ds, "__len__"):
            return DeviceLoader(base, self.device, max_batches, self.sample_limit)
        if self.sample_limit:
            size = min(size, self.sample_limit)
        n = len(ds) if max_batches is None else min(len(ds), max_batches * size)
        subset = ds if n == len(ds) else torch.utils.data.Subset(ds, range(n))
        loader = DataLoader(subset, batch_size=size, shuffle=False, collate_fn=base.collate_fn, drop_last=base.drop_last)
        return DeviceLoader(loader, self.device)

    def batches(self, n: int, split: str = "train") -> list:
        """The first ``n`` batches of a split, fixed for the whole session, on the device."""
        key = split
        cached = self._batches.setdefault(key, [])
        if len(cached) < n:
            base = self.train_loader if split == "train" else self.val_loader
            if base is None:
                return []
            state = torch.random.get_rng_state()
            torch.manual_seed(0)  # the same "first batches" whatever ran before
            try:
                cached[:] = [to_device(b, torch.device("cpu")) for b in itertools.islice(iter(base), n)]
            finally:
                torch.random.set_rng_state(state)
        return [to_device(cut(b, self.sample_limit), self.device) for b in cached[:n]]

    def batch(self, split: str = "train", size: int | None = None):
        """One fixed batch (inputs, targets) on the device, cut to ``size`` samples if given."""
        batches = self.batches(1, split)
        if not batches:
            return None
        inputs, targets = batches[0][0], batches[0][1]
        if size is not None and size < len(targets):
            inputs, targets = inputs[:size], targets[:size]
        return inputs, targets

    # -- the loop: the user's functions where given, the reference otherwise ----------------------
    def train_step(self, model, batch, optimizer) -> float:
        step = self.user_train_step or reference.train_step
        return reference.as_float(step(model, batch, self.loss_fn, optimizer))

    def train_epoch(self, model, loader, optimizer, scheduler=None) -> float:
        if self.user_train_epoch:
            return reference.as_float(self.user_train_epoch(model, loader, self.loss_fn, optimizer, scheduler))
        if self.user_train_step:
            losses = [self.train_step(model, b, optimizer) for b in loader]
            if scheduler is not None:
                scheduler.step()
            return sum(losses) / max(len(losses), 1)
        return reference.train_epoch(model, loader, self.loss_fn, optimizer, scheduler)

    def evaluate(self, model, loader) -> dict[str, float]:
        if self.user_evaluate:
            result = self.user_evaluate(model, loader, self.loss_fn)
            if isinstance(result, dict):
                return {k: reference.as_float(v) for k, v in result.items()}
            return {"loss": reference.as_float(result)}
        return reference.evaluate(model, loader, self.loss_fn, self.task)

    def accuracy(self, outputs, targets) -> float | None:
        return reference.accuracy(outputs, targets, self.task)

    def expected_initial_loss(self, targets: torch.Tensor) -> tuple[float, str] | None:
        """What an untrained, maximally uncertain model should score, and how that was worked out."""
        import math

        if getattr(self.loss_fn, "reduction", "mean") != "mean":
            return None  # a summed loss grows with the batch and the elements: no per-element expectation
        if self.task == "classification" and self.num_classes and self.num_classes >= 2:
            return math.log(self.num_classes), f"ln({self.num_classes}) for {self.num_classes} classes"
        if self.task == "binary":
            return math.log(2), "ln(2) for a binary target"
        if self.task == "regression" and isinstance(self.loss_fn, nn.MSELoss):
            variance = float(targets.float().var().item()) if targets.numel() > 1 else 0.0
            mean_sq = float(targets.float().pow(2).mean().item())
            return mean_sq, f"mean(y^2) = {mean_sq:.3g} (target variance {variance:.3g}) for outputs near zero"
        return None


# ------------------------------------------------------------------------------------------ loading
def _call(spec: str, name: str, fn: Callable, *args):
    try:
        return fn(*args)
    except Exception as exc:
        raise TargetError(
            f"{spec}: {name}() raised while being built{raised_at(exc)}: {type(exc).__name__}: {exc}. "
            f"Expected {REQUIRED.get(name, name)}."
        ) from exc


def _called_loss(loss_fn: Callable, outputs: torch.Tensor | None, targets: Any):
    """The built-in loss function ``loss_fn(outputs, targets)`` really calls (a lambda or a function
    wrapping F.cross_entropy, a loss module), or None."""
    if outputs is None or not isinstance(targets, torch.Tensor):
        return None
    from nnwizard.record.losscalls import LossCalls

    import warnings

    try:
        with LossCalls() as calls, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss_fn(outputs, targets)
    except Exception:  # noqa: BLE001 - a loss that raises is the probes' finding
        pass
    return calls.first


def _infer_task(ns: Any, loss_fn: Callable, outputs: torch.Tensor | None, targets: Any) -> tuple[str, str, int | None]:
    """(task, how it was decided, class count) from TASK, else the loss actually called and the class
    dimension of its input (dim 1 for cross-entropy / NLL), else the targets (then it says so)."""
    declared = getattr(ns, "TASK", None)
    call = _called_loss(loss_fn, outputs, targets)
    classes = None
    if call is not None and call.kind == "class" and call.input.dim() >= 2:
        classes = int(call.input.shape[1])
    if declared is not None:
        if declared not in TASKS:
            raise TargetError(f"TASK = {declared!r}: expected one of {', '.join(TASKS)}.")
        return declared, "TASK", classes
    if call is not None and call.kind in ("class", "binary", "regression"):
        task = {"class": "classification", "binary": "binary", "regression": "regression"}[call.kind]
        return task, f"the loss called: F.{call.name}" + (f" over {classes} classes (input dimension 1)" if classes else ""), classes
    if isinstance(loss_fn, CLASSIFICATION_LOSSES):
        return "classification", type(loss_fn).__name__, None
    if isinstance(loss_fn, BINARY_LOSSES):
        return "binary", type(loss_fn).__name__, None
    if isinstance(loss_fn, REGRESSION_LOSSES):
        return "regression", type(loss_fn).__name__, None
    hint = "; ambiguous: set TASK in the module to be sure"
    if isinstance(targets, torch.Tensor):
        if not targets.is_floating_point():
            return "classification", f"guessed from {str(targets.dtype).replace('torch.', '')} targets{hint}", None
        if outputs is not None and outputs.shape[-1:] in ((1,), ()) and set(targets.unique().tolist()) <= {0.0, 1.0}:
            return "binary", f"guessed from 0/1 float targets{hint}", None
    return "regression", f"guessed: no known loss called, float targets{hint}", None


def load_target(spec: str, device: str = "auto") -> Target:
    """Import, validate and adapt the user's module; raises TargetError (exit 2) on bad input."""
    resolved = resolve_device(device)
    ns, module = load_namespace(spec)
    missing = [n for n in ("build_model", "build_data") if not callable(getattr(ns, n, None))]
    if not callable(getattr(ns, "loss_fn", None)) and not callable(getattr(ns, "build_loss", None)):
        missing.append("loss_fn")
    if missing:
        wanted = "; ".join(REQUIRED[n] for n in missing)
        raise TargetError(f"Module {spec!r} lacks {', '.join(missing)}. Expected: {wanted}.")

    rng = torch.random.get_rng_state()
    try:
        data = _call(spec, "build_data", ns.build_data)
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise TargetError(f"{spec}: build_data() must return (train, val); it returned {type(data).__name__}.")
        try:
            train, val = as_loader(data[0], True), as_loader(data[1], False)
        except TypeError as exc:
            raise TargetError(f"{spec}: build_data(): {exc}.") from None
        if train is None:
            raise TargetError(f"{spec}: build_data() returned no training data.")
        model = _call(spec, "build_model", ns.build_model)
        if not isinstance(model, nn.Module):
            raise TargetError(f"{spec}: build_model() returned {type(model).__name__}, not a torch.nn.Module.")
        loss_fn = getattr(ns, "loss_fn", None)
        if not callable(loss_fn):
            loss_fn = _call(spec, "build_loss", ns.build_loss)
        try:
            first = next(iter(train))
        except Exception as exc:
            raise TargetError(f"{spec}: reading the first training batch raised{raised_at(exc)}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(first, (tuple, list)) or len(first) < 2:
            raise TargetError(f"{spec}: the training data must yield (inputs, targets); it yielded {type(first).__name__}.")
        outputs = None
        try:
            with torch.no_grad():
                outputs = model.to(resolved)(to_device(first[0], resolved))
        except Exception:
            pass  # a forward that raises is evidence for the probes, not a usage error
        task, task_source, num_classes = _infer_task(ns, loss_fn, outputs if isinstance(outputs, torch.Tensor) else None, first[1])
    finally:
        torch.random.set_rng_state(rng)
    if task == "classification" and num_classes is None:
        if isinstance(outputs, torch.Tensor) and outputs.dim() >= 2 and outputs.shape[1] > 1:
            num_classes = int(outputs.shape[1])
        elif isinstance(first[1], torch.Tensor) and not first[1].is_floating_point() and first[1].numel():
            num_classes = int(first[1].max().item()) + 1
    source = getattr(module, "__file__", None)
    return Target(
        spec=spec, namespace=ns, source=Path(source) if source else None, device=resolved,
        train_loader=train, val_loader=val, loss_fn=loss_fn, task=task, num_classes=num_classes, task_source=task_source,
    )


def user_source_files(target: Target) -> list[Path]:
    """The user's own Python files behind the target (for static scans and stack frames)."""
    files = []
    if target.source:
        files.append(target.source)
    for name in ("build_model", "train_step", "train_epoch", "evaluate", "build_data"):
        fn = target.user(name)
        try:
            path = Path(inspect.getsourcefile(fn)) if fn else None
        except TypeError:
            path = None
        if path and path not in files and Path(__file__).resolve().parent not in path.resolve().parents:
            files.append(path)  # (a replayed step's own train_step lives in nnwizard, not in the user's files)
    files += [p for p in getattr(target, "extra_sources", []) if p not in files]  # e.g. a replayed model's own file
    return files
