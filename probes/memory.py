"""Graphs kept alive across steps: run a few steps of the user's own epoch (or step) and count,
after each step, the autograd graph nodes still reachable from live tensors, naming the variable
that holds them (a local of the user's loop, a module-level global, a model attribute). A loop
that lets go of each step's graph holds a constant number of nodes; ``total_loss += loss`` or
``outputs.append(out)`` adds a whole step's graph every step, which is how memory climbs until the
process (or CUDA) runs out. Resident memory (CPU) and ``torch.cuda.memory_allocated`` (GPU) are
recorded alongside."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import torch
from torch import nn

from nnwizard.record.autograd import graph_nodes
from nnwizard.record.frames import first_line, user_frame
from nnwizard.probes.api import LinePlot, ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

_SKIP_TYPES = (type(sys), type, type(len), type(lambda: 0))
_INTERNAL = set(vars(nn.Module()))
_NODE_CAP = 200_000


def _tensors(value, depth: int = 0, seen: set[int] | None = None):
    """Tensors carrying a grad_fn inside a value (through lists, tuples, dicts, up to depth 3)."""
    seen = set() if seen is None else seen
    if id(value) in seen or depth > 3:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield value
    elif isinstance(value, dict):
        for item in list(value.values())[:10_000]:
            yield from _tensors(item, depth + 1, seen)
    elif isinstance(value, (list, tuple, set)):
        for item in list(value)[:10_000]:
            yield from _tensors(item, depth + 1, seen)
    elif _user_object(value):  # a trainer / tracker instance: its attributes
        for item in list(vars(value).values())[:1_000]:
            yield from _tensors(item, depth + 1, seen)


def _user_object(value) -> bool:
    """An instance of an ordinary user class (not torch's, not a module, function or class)."""
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    return (hasattr(value, "__dict__") and not isinstance(value, _SKIP_TYPES) and not isinstance(value, nn.Module)
            and not module.startswith(("torch", "builtins", "numpy", "nnwizard")))


def _node_count(tensors) -> int:
    """Distinct autograd nodes reachable from the tensors' grad_fn (strong refs keep ids stable)."""
    return len(graph_nodes(tensors, _NODE_CAP))


def _sequence_mark() -> int:
    """The autograd sequence number the next node created on this thread will get (per-thread and
    monotonic), by creating and reading one throwaway node."""
    return (torch.zeros((), requires_grad=True) * 1).grad_fn._sequence_nr()


def _live_graph_tensors() -> list[torch.Tensor]:
    """Every tensor alive in the process that carries a grad_fn: one pass over gc's objects (~50 ms
    on a loaded interpreter), so the probe makes two, before the first step and after the last."""
    return [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.grad_fn is not None]


def _live_nodes_by_step(marks: list[tuple[int, int]], before: set[int]) -> tuple[int, dict[int, int]]:
    """(new graph-carrying tensors, {step: live nodes created during that step}) over the tensors
    alive now that were not alive before the run (``before``: their ids; graphs other code keeps,
    e.g. from earlier runs, are not this loop's). The step is read off each node's sequence number
    (per-thread, monotonic) against ``marks``: (step, sequence number at the end of that step)."""
    live = [t for t in _live_graph_tensors() if id(t) not in before]
    per_step: dict[int, int] = {}
    first = marks[0][1] if marks else 0
    for node in graph_nodes(live, _NODE_CAP):
        try:
            seq = node._sequence_nr()
        except (AttributeError, RuntimeError):
            continue
        if seq < first or seq >= marks[-1][1] + 2:  # before the first measured step, or AccumulateGrad (max)
            continue
        step = next((k for k, mark in marks if seq < mark), marks[-1][0])
        per_step[step] = per_step.get(step, 0) + 1
    return len(live), per_step


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


class _Roots:
    """Where a retained graph can live: locals of the user's functions on the stack, the user's
    module-level globals, and plain attributes of the model's modules."""

    def __init__(self, target, model: nn.Module, files: set[str], stop_frame):
        self.target, self.model, self.files, self.stop = target, model, files, stop_frame

    def collect(self) -> dict[str, list[torch.Tensor]]:
        roots: dict[str, list[torch.Tensor]] = {}

        def add(label: str, value) -> None:
            if isinstance(value, _SKIP_TYPES) or isinstance(value, nn.Module):
                return
            found = list(_tensors(value))
            if found:
                roots[label] = found

        frame = sys._getframe(1)
        while frame is not None and frame is not self.stop:
            code = frame.f_code
            if code.co_filename in self.files:
                for name, value in list(frame.f_locals.items()):
                    add(f"{name}|local of {code.co_name} in {Path(code.co_filename).name}", value)
            frame = frame.f_back
        namespace = self.target.namespace
        source = Path(self.target.source).name if self.target.source else "the module"
        for name, value in list(vars(namespace).items()) if hasattr(namespace, "__dict__") else []:
            if not name.startswith("__"):
                add(f"{name}|module-level global in {source}", value)
        for path, module in self.model.named_modules():
            for name, value in vars(module).items():
                if name not in _INTERNAL:
                    add(f"{(path + '.' if path else '')}{name}|attribute of the model", value)
        return roots


class _MeasuringLoader:
    """The user's training loader, measuring the graph state each time the loop asks for the next
    batch (so after every completed step) and once when the loader is exhausted."""

    def __init__(self, loader, measure):
        self.loader, self.measure = loader, measure

    def __iter__(self):
        for step, batch in enumerate(self.loader):
            self.measure(step)
            yield batch
        self.measure(len(self.loader))

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


def _steadily_growing(series: list[int]) -> bool:
    """Strictly more nodes after every step: each step's graph is being kept. A loop that releases
    its graphs holds a constant count (the last step's graph, until the next step rebinds it)."""
    return len(series) >= 3 and all(b > a for a, b in zip(series, series[1:]))


@probe(
    "memory-growth",
    title="Autograd graphs and memory held after each step of the user's loop",
    outcomes={
        "ok": "the loop holds a constant amount of graph from step to step",
        "grows": "the graph held after each step grows linearly with the number of steps",
        "returns-graph": "the loop releases its graphs but returns a tensor still attached to the epoch's graph",
    },
    timeout_s=60,
    cost=10,
)
def memory_growth(ctx: ProbeContext):
    target = ctx.target
    if not (target.user_train_epoch or target.user_train_step):
        return skipped("no user train_epoch or train_step: the reference loop keeps only numbers (loss.item())")
    # 8 steps; 4 (still 3 increments to see a rise) when the session slices dear batches
    steps = int(ctx.param("steps", 4 if target.sample_limit else 8))
    loader = target.loader("train", steps)
    steps = len(loader)
    if steps < 4:
        return skipped(f"only {steps} training batches: too few steps to see growth")
    model = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(model)
    scheduler = target.make_scheduler(optimizer)
    files = {str(p) for p in user_source_files(target)} | {str(p.resolve()) for p in user_source_files(target)}
    roots = _Roots(target, model, files, sys._getframe())
    cuda = target.device.type == "cuda"
    points: list[dict] = []
    marks: list[tuple[int, int]] = []  # (steps done, autograd sequence number then)
    scan: dict = {}
    existing = _live_graph_tensors()  # held (so their ids stay theirs) until the probe returns
    before = {id(t) for t in existing}

    def measure(step: int) -> None:
        if step < 1 or (points and points[-1]["step"] == step):
            if step == 0:
                marks.append((0, _sequence_mark()))
            return
        marks.append((step, _sequence_mark()))
        held = {label: _node_count(ts) for label, ts in roots.collect().items()}
        point = {"step": step, "roots": held, "rss_mb": _rss_mb()}
        if cuda:
            torch.cuda.synchronize()
            point["cuda_mb"] = torch.cuda.memory_allocated() / 2**20
        points.append(point)
        if step == steps and not scan:  # the last step, while the user's frames are still alive
            scan["tensors"], scan["per_step"] = _live_nodes_by_step(marks, before)

    fn = "train_epoch" if target.user_train_epoch else "train_step"
    returned = None
    try:
        if target.user_train_epoch:
            returned = target.user_train_epoch(model, _MeasuringLoader(loader, measure), target.loss_fn, optimizer, scheduler)
        else:
            measure(0)
            for step, batch in enumerate(loader):
                if ctx.time_left() < 2:
                    break
                returned = target.user_train_step(model, batch, target.loss_fn, optimizer)
                measure(step + 1)
    except Exception as exc:  # the user's loop raising is another probe's finding
        return cannot_run(f"{fn} raised: {first_line(exc)} ({user_frame(exc, [Path(f) for f in files])})", reason="raised",
                          error=first_line(exc))
    if len(points) < 3:
        return cannot_run(f"{fn} completed fewer than 3 measured steps (did it iterate the loader?)", reason="precondition")
    returned_nodes = _node_count(list(_tensors(returned)))
    series_steps = [p["step"] for p in points]
    labels = {label for p in points for label in p["roots"]}
    per_root = {label: [p["roots"].get(label, 0) for p in points] for label in labels}
    growing = {label: s for label, s in per_root.items() if _steadily_growing(s)}
    if not scan and marks:
        scan["tensors"], scan["per_step"] = _live_nodes_by_step(marks, before)
    per_step_live = scan.get("per_step", {})
    steps_alive = sorted(k for k, v in per_step_live.items() if v and k >= 1)
    # A loop that lets go of its graphs keeps at most the newest step's nodes alive (its `loss` is
    # still bound); nodes surviving from (nearly) every step mean every step's graph is kept.
    live_growing = len(points) >= 3 and len(steps_alive) >= max(3, len(points) - 1)
    rss = [p["rss_mb"] for p in points if p["rss_mb"] is not None]
    data = dict(step_fn=fn, steps=series_steps[-1], steps_with_live_graph=len(steps_alive),
                live_graph_nodes=sum(per_step_live.values()), live_graph_tensors=scan.get("tensors", 0),
                rss_growth_mb=round(rss[-1] - rss[0], 2) if len(rss) > 1 else None)
    if cuda:
        mem = [p["cuda_mb"] for p in points]
        data.update(cuda_start_mb=round(mem[0], 3), cuda_end_mb=round(mem[-1], 3),
                    cuda_growth_per_step_mb=round((mem[-1] - mem[0]) / max(len(mem) - 1, 1), 4))
    series = {label.split("|")[0]: [float(v) for v in s] for label, s in sorted(per_root.items(), key=lambda kv: -max(kv[1]))[:4]}
    plots = [LinePlot("graph-nodes", f"Autograd nodes held after each step of {fn}", series or {"held": [0.0]},
                      ylabel="graph nodes", x=[float(s) for s in series_steps])]
    rows = [[label.split("|")[0], label.split("|")[1], s[0], s[-1], "yes" if label in growing else "no"]
            for label, s in sorted(per_root.items(), key=lambda kv: -kv[1][-1])]
    plots.append(Table("graph-holders", "Variables holding autograd graphs between steps",
                       ["variable", "where", f"nodes after step {series_steps[0]}", f"after step {series_steps[-1]}", "grows"],
                       rows, marked=[i for i, r in enumerate(rows) if r[4] == "yes"]))
    if growing or live_growing:
        if growing:
            label, s = max(growing.items(), key=lambda kv: kv[1][-1] - kv[1][0])
            name, where = label.split("|")
        else:
            s = [sum(v for k, v in per_step_live.items() if k <= step) for step in series_steps]
            name, where = "", "not a local of the loop, a module global or a model attribute"
        per_step = (s[-1] - s[0]) / max(series_steps[-1] - series_steps[0], 1)
        data.update(holder=name, holder_where=where, nodes_first=s[0], nodes_last=s[-1], nodes_per_step=round(per_step, 1))
        mem = f"; CUDA memory {data['cuda_start_mb']:.2f} -> {data['cuda_end_mb']:.2f} MB" if cuda else (
            f"; resident memory +{data['rss_growth_mb']:.1f} MB" if data.get("rss_growth_mb") else "")
        ret = f"; {fn} returns a tensor still attached to a {returned_nodes}-node graph" if returned_nodes else ""
        data["returned_nodes"] = returned_nodes
        who = f"'{name}' ({where}) holds an autograd graph that" if name else (
            f"graph nodes from {len(steps_alive)} of {series_steps[-1]} steps are still alive after the last one, held by an "
            f"object the probe could not name ({where}); the live graph")
        return failed("grows", f"{who} grows by {per_step:.0f} nodes every step ({s[0]} after step {series_steps[0]}, "
                      f"{s[-1]} after step {series_steps[-1]}){ret}{mem}", plots, **data)
    if returned_nodes:
        data["returned_nodes"] = returned_nodes
        return failed("returns-graph", f"{fn} returns a tensor attached to a {returned_nodes}-node autograd graph "
                      f"(return loss.item() or a float)", plots, **data)
    biggest = max((s[-1] for s in per_root.values()), default=0)
    return passed(f"{series_steps[-1]} steps of {fn}: the graph held between steps stays constant "
                  f"(at most {biggest} nodes, no more than one step holds)", artifacts=plots, **data)
