"""``nnwizard replay DIR/anomaly-step<N>``: diagnose exactly the step a watch bundle saved.

The bundle becomes a :class:`ReplayTarget`: the same questions a module Target answers (a fresh
model, the optimizer, batches, the loss, a train step), answered from the bundle. "A fresh model" is
the saved model object at its state from *before* step N; "the batches" are the batch of step N
first, then the ring of the steps before it (most recent first); "the loss" is the loss call the
script made, re-applied to the model's output as the script shaped it (a reshape or dtype cast
between model and loss is repeated), or the output's own loss (Hugging Face models); the train step
restores the RNG state of that step (dropout masks as in the real run), then forward, loss,
backward, ``optimizer.step()``. The saved models sit inside one :class:`StepModule` (parameter
names get the bundle's model key as prefix, ``model.``).

The ``replay`` tree (``trees/replay/replay.yaml``) runs nan-bisect and epsilon-scan on that step,
grad-norms on its batch, the replay probes (is the batch bad, the same state on the batch before,
lr/10 and clipping on that step, the LR history) and ranks the catalog hypotheses as a diagnosis
does; the reports are the §4 reports with ``"mode": "replay"`` and ``"step": N``.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnwizard.bundle import Bundle, load_bundle
from nnwizard.errors import TargetError, UsageError
from nnwizard.target import Target, resolve_device, to_device

TREE = Path(__file__).resolve().parent.parent / "trees" / "replay" / "replay.yaml"
TASK_OF = {"cross_entropy": "classification", "nll_loss": "classification", "binary_cross_entropy": "binary",
           "binary_cross_entropy_with_logits": "binary"}


def _tree_path() -> Path:
    try:
        import nnwizard.trees as trees_pkg

        path = Path(trees_pkg.__file__).resolve().parent / "replay" / "replay.yaml"
        if path.exists():
            return path
    except ImportError:
        pass
    return TREE


def _get(container: Any, path: list) -> Any:
    for key in path:
        if isinstance(key, str) and not isinstance(container, dict) and hasattr(container, key):
            container = getattr(container, key)
        else:
            container = container[key]
    return container


class StepModule(nn.Module):
    """The bundle's model(s) as one module: ``forward(inputs)`` repeats the step's model calls and
    returns their outputs (a tuple, one per call)."""

    def __init__(self, models: dict[str, nn.Module]):
        super().__init__()
        for key, m in models.items():
            self.add_module(key, m)

    def forward(self, inputs: dict) -> tuple:
        return tuple(getattr(self, c["model"])(*c["args"], **c["kwargs"]) for c in inputs["calls"])


class StepLoss:
    """The loss of the recorded step from the StepModule's outputs: each backward the step ran,
    re-made as the script made it (a torch.nn.functional loss of the output, or the output's loss)."""

    def __init__(self, recipe: dict):
        self.recipe = recipe

    def __call__(self, outputs: tuple, targets: dict) -> torch.Tensor:
        total = None
        for how in self.recipe["backward"]:
            if how["kind"] == "loss-call":
                spec = self.recipe["losses"][how["loss"]]
                src = spec["input"]
                x = _get(outputs[src["call"]], src["path"])
                if list(x.shape) != src["shape"] and x.numel() == math.prod(src["shape"]):
                    x = x.reshape(src["shape"])
                dtype = getattr(torch, src["dtype"], None)
                if dtype is not None and x.dtype != dtype:
                    x = x.to(dtype)
                fn = getattr(torch.nn.functional, spec["fn"])
                value = fn(x, targets["targets"][how["loss"]], *spec["extra"], **spec["kwargs"])
            else:
                value = _get(outputs[how["call"]], how["path"])
            value = value * how["scale"] if how["scale"] != 1.0 else value
            total = value if total is None else total + value
        return total


class _Batches:
    """A loader over the bundle's batches (len and iteration are all the probes need)."""

    def __init__(self, batches: list):
        self._batches, self.batch_size, self.dataset = batches, None, None

    def __len__(self) -> int:
        return len(self._batches)

    def __iter__(self):
        return iter(self._batches)


class ReplayTarget(Target):
    """A Target answered from a bundle (see the module docstring)."""

    bundle: Bundle
    recipe: dict

    @classmethod
    def from_bundle(cls, bundle: Bundle, device: torch.device) -> "ReplayTarget":
        recipe = bundle.batch.get("step") or {}
        # a batch is (inputs, targets, about): what probes unpack, plus the step's RNG state and number
        step = ({"calls": recipe.get("calls", [])}, {"targets": [l["target"] for l in recipe.get("losses", [])]},
                {"rng": (bundle.rng or {}).get("torch"), "step": bundle.step})
        ring = []
        for r in reversed(bundle.batch.get("ring", [])):
            if len(r["calls"]) == len(step[0]["calls"]) and len(r["targets"]) == len(step[1]["targets"]):
                ring.append(({"calls": r["calls"]}, {"targets": r["targets"]}, {"rng": r["rng"], "step": r["step"]}))
        batches = [step] + ring
        loss = StepLoss(recipe) if recipe.get("replayable") else None
        fns = [l["fn"] for l in recipe.get("losses", [])]
        task = next((TASK_OF[f] for f in fns if f in TASK_OF), "regression" if fns else "classification")
        ns = types.SimpleNamespace()
        target = cls(spec=str(bundle.meta.get("script") or bundle.folder), namespace=ns,
                     source=Path(bundle.meta["script"]) if bundle.meta.get("script") else None, device=device,
                     train_loader=_Batches(batches), val_loader=None, loss_fn=loss, task=task)
        target.bundle, target.recipe = bundle, recipe
        target._replay_batches = batches
        ns.train_step = target._step
        return target

    @property
    def anomaly(self) -> str:
        """What watch saw at this step (every bundle is saved at an anomaly): a replay that explains nothing of it
        is inconclusive, never healthy."""
        meta = self.bundle.meta
        reason = meta.get("reason") or meta.get("trigger") or "an anomaly"
        return f"{meta.get('trigger') or 'anomaly'} at step {self.bundle.step}: {reason}"

    # the user's step, as recorded: RNG of that step, forward, loss, backward, update
    def _step(self, model, batch, loss_fn, optimizer) -> torch.Tensor:
        optimizer.zero_grad()
        about = batch[2] if len(batch) > 2 else {}
        if about.get("rng") is not None:
            torch.random.set_rng_state(about["rng"])
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss.detach()

    def fresh_model(self, seed: int | None = None) -> nn.Module:
        return StepModule(self.bundle.models(self.device)).to(self.device)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return self.bundle.make_optimizer({name: m for name, m in model.named_children()})

    def make_scheduler(self, optimizer):
        return None

    def batches(self, n: int, split: str = "train") -> list:
        if split != "train":
            return []
        # inputs and targets to the device; the step's RNG state stays a CPU tensor (set_rng_state takes no other:
        # moved with the rest, every replayed step raised on CUDA and the replay localised nothing)
        return [(to_device(b[0], self.device), to_device(b[1], self.device), *b[2:]) for b in self._replay_batches[:n]]

    def batch(self, split: str = "train", size: int | None = None):
        batches = self.batches(1, split)
        return (batches[0][0], batches[0][1]) if batches else None

    def train_step(self, model, batch, optimizer) -> float:
        from nnwizard.reference import as_float

        return as_float(self._step(model, batch, self.loss_fn, optimizer))

    @property
    def extra_sources(self) -> list[Path]:
        import inspect

        files = []
        try:
            for m in self.bundle.models("cpu").values():
                f = inspect.getsourcefile(type(m))
                if f and Path(f) != self.source and "site-packages" not in f:
                    files.append(Path(f))
        except (TypeError, OSError):
            pass
        return files


def load_replay_target(folder: str | Path, device: str = "auto") -> ReplayTarget:
    path = Path(folder)
    if not path.exists():
        raise UsageError(f"{path}: no such folder")
    try:
        bundle = load_bundle(path)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a bundle whose classes no longer import
        raise TargetError(f"{path}: the bundle could not be loaded: {type(exc).__name__}: {exc}. "
                          f"Classes of the saved model must import (the script {bundle_script(path)} must exist).") from exc
    resolved = resolve_device(device)
    try:
        bundle.models(resolved)
    except Exception as exc:  # noqa: BLE001
        raise TargetError(f"{path}: the saved model could not be rebuilt: {type(exc).__name__}: {exc}. Its class must "
                          f"import: a class defined in the training script is read from {bundle_script(path)}.") from exc
    return ReplayTarget.from_bundle(bundle, resolved)


def bundle_script(path: Path) -> str:
    try:
        return json.loads((path / "meta.json").read_text()).get("script") or "?"
    except (OSError, ValueError):
        return "?"


# ------------------------------------------------------------------------------------------ session
SYMPTOM_OF = {"nonfinite": "nan", "loss-spike": "oscillating", "grad-explosion": "oscillating", "stalled": "flat"}


def localised(diagnosis) -> dict | None:
    """The op and file:line the replay names: the first NaN/Inf op of the replayed step (nan-bisect),
    else the first op far above the same op on the batch before (replay-swap)."""
    by_id = {r.id: r for r in diagnosis.results}
    bisect, swap = by_id.get("nan-bisect"), by_id.get("replay-swap")
    if bisect is not None and bisect.outcome in ("forward", "loss", "backward", "update") and bisect.data.get("op") not in (None, "?"):
        d = bisect.data
        return {"probe": "nan-bisect", "phase": d.get("phase"), "op": d.get("op"), "where": d.get("where"),
                "module": d.get("layer"), "text": d.get("op_text"), "replays": d.get("replays")}
    if bisect is not None and bisect.outcome == "inputs":
        d = bisect.data
        first = f"; first used by {swap.data['jump_text']}" if swap is not None and swap.data.get("jump_text") else ""
        return {"probe": "nan-bisect", "phase": "inputs", "op": swap.data.get("jump_op") if swap else None,
                "where": swap.data.get("jump_where") if swap else None, "rows": d.get("rows"),
                "text": f"the batch's {d.get('tensor')} already hold NaN/Inf (rows {d.get('rows')} of the batch){first}",
                "replays": 0}
    if swap is not None and swap.data.get("jump_text"):
        d = swap.data
        return {"probe": "replay-swap", "phase": "forward", "op": d.get("jump_op"), "where": d.get("jump_where"),
                "text": d.get("jump_text"), "replays": 2}
    if swap is not None and swap.outcome == "state" and swap.data.get("peak_text"):
        d = swap.data
        grads = by_id.get("grad-norms")
        layer = f"; largest gradient at {grads.data.get('max_layer')} ({grads.data.get('max_norm'):.3g})" \
            if grads is not None and grads.status in ("passed", "failed") and isinstance(grads.data.get("max_norm"), float) else ""
        return {"probe": "replay-swap", "phase": "state", "op": d.get("peak_op"), "where": d.get("peak_where"),
                "text": f"the weights before step {d.get('step')} are off on any batch (loss {d.get('prev_loss'):.4g} on "
                        f"the batch before); largest activation |x| = {d.get('peak_value'):.4g} from {d.get('peak_text')}"
                        f"{layer}", "replays": 2}
    if swap is not None and swap.data.get("op_text"):
        d = swap.data
        return {"probe": "replay-swap", "phase": "forward", "op": d.get("op"), "where": d.get("where"),
                "text": d.get("op_text"), "replays": 1}
    return None


def replay(folder: str | Path, device: str = "cpu", seed: int = 0, listener=None):
    """Load the bundle and run the replay tree on its step: (Diagnosis, ReplayTarget)."""
    from nnwizard.catalog import load_catalog
    from nnwizard.engine import Engine
    from nnwizard.isolation import preserved_state
    from nnwizard.prompts import ScriptedPrompter
    from nnwizard.tree import load_tree

    target = load_replay_target(folder, device)
    tree = load_tree(_tree_path(), load_catalog())
    symptom = SYMPTOM_OF.get(target.bundle.meta.get("trigger"), "nan")
    with preserved_state():
        engine = Engine(target, {tree.id: tree}, load_catalog(), ScriptedPrompter({}), seed=seed, listener=listener)
        diagnosis = engine.run([symptom], {})
    return diagnosis, target


def replay_report(diagnosis, target: ReplayTarget):
    """The Report of a replay: the diagnosis's, with ``"mode": "replay"``, the step, what triggered the bundle,
    whether the step could be re-executed and the op the replay localised."""
    from nnwizard.report import build

    report = build(diagnosis)
    meta = target.bundle.meta
    report.mode, report.step, report.bundle = "replay", target.bundle.step, str(target.bundle.folder)
    report.trigger, report.reason = meta.get("trigger"), meta.get("reason")
    report.recorded = {"loss": meta.get("loss"), "grad_norm": meta.get("grad_norm"), "lrs": meta.get("lrs")}
    report.replayable, report.why_not = bool(target.recipe.get("replayable")), target.recipe.get("why_not")
    report.localised = localised(diagnosis)
    swap = next((r for r in diagnosis.results if r.id == "replay-swap"), None)
    if report.verdict == "healthy" and swap is not None and swap.outcome in ("batch", "state", "no-ring"):
        # the anomaly was measured in the run and reproduced here: no named cause is not "healthy"
        report.verdict = "inconclusive"
        report.verdict_note = (f"the anomaly of step {report.step} reproduced on replay ({swap.summary}), but no "
                               f"hypothesis reached 0.5")
    return report


def report_dict(diagnosis, target: ReplayTarget) -> dict:
    """The replay's §4 JSON report as a dict."""
    return replay_report(diagnosis, target).to_dict()


def run(folder: Path, json_path: Path | None = None, report_path: Path | None = None, device: str = "cpu",
        seed: int = 0, quiet: bool = False) -> int:
    from nnwizard.console import make_console as Console

    from nnwizard.errors import ExitCode
    from nnwizard.report import write_reports
    from nnwizard.view import TerminalView

    for flag, path in (("--json", json_path), ("--report", report_path)):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: the folder {Path(path).resolve().parent} does not exist")
    view = TerminalView(console=Console(), quiet=quiet)
    diagnosis, target = replay(folder, device, seed, listener=view)
    report = replay_report(diagnosis, target)
    view.summary(report, write_reports(report, json_path, report_path))
    return int(ExitCode.INTERRUPTED if diagnosis.interrupted else ExitCode.OK)
