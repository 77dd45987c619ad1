"""Recorder overhead: a plain training loop timed without the recorder, under the light recorder
(watch mode) and under the full recorder (script-mode diagnosis), on a small MLP and on a ~10M
parameter MLP and a ~11M-parameter CNN (ResNet-18 layout, from scale_models.py). Each configuration runs interleaved ``--repeats`` times; the ratio of medians is
printed (goal, for both recorders: <= 1.10x on the small MLP, <= 1.05x on the ~10M model).

    python benchmarks/recorder_overhead.py [--repeats 5] [--steps 200] [--big-steps 20] [--cpu] [--model CNN] [--json out.json]
                                           [--device cuda] [--floor]

``--floor``: a fourth column, the full recorder with every wrapper, hook and pause of the graph mode installed
and every record emptied (no forward, loss call, backward, step or batch is recorded): what the wrapping alone
costs, the floor under any recorder that watches the same calls in Python.

``--device cuda``: the model on the GPU, each batch moved there in the loop (``x.to(device)``, as a
script does), the clock read after ``torch.cuda.synchronize()`` at the start and the end of a loop.

(``benchmarks/recorder_instructions.py`` counts instructions instead: unaffected by other processes.)

Times on a shared machine are noisy: run it when nothing else runs. ``--cpu`` times the process's CPU
time instead of the wall clock (less disturbed by other processes; run it with OMP_NUM_THREADS=1, as
torch's waiting threads count too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nnwizard.record import Recorder  # noqa: E402
from nnwizard.record.full import FullPolicy  # noqa: E402
from nnwizard.record.patches.data import LoaderIter  # noqa: E402

from scale_models import ResNet  # noqa: E402

# name -> (build, input shape of one sample, classes, batch size)
MODELS = {
    "small MLP (10-64-64-3)": (lambda: nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                                     nn.Linear(64, 3)), (10,), 3, 64),
    "~10M-parameter MLP (512-2048x2-1000)": (lambda: nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                                                                   nn.ReLU(), nn.Linear(2048, 1000)), (512,), 1000, 64),
    "~10M-parameter CNN (ResNet-18 layout, 3x8x8)": (lambda: ResNet(64), (3, 8, 8), 10, 16),
}


def data(name: str) -> tuple[DataLoader, int]:
    """The model's DataLoader (16 batches, shuffled) and its parameter count."""
    build, shape, classes, batch = MODELS[name]
    x = torch.randn(batch * 16, *shape)
    y = torch.randint(0, classes, (batch * 16,))
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True), sum(p.numel() for p in build().parameters())


DEVICE = torch.device("cpu")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def loop(model, loader, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    done = 0
    while done < steps:
        for x, y in loader:
            x, y = x.to(DEVICE), y.to(DEVICE)
            opt.zero_grad()
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            done += 1
            if done >= steps:
                return


CLOCK = time.perf_counter


@contextlib.contextmanager
def records_emptied():
    """The full recorder's record-keeping replaced by nothing (see ``--floor``); its wrappers stay."""
    def model_called(self, module, args):
        self.recorder.depth = 1
        self.graph.pause()   # (the wrapper's finally resumes)
        return None

    empty = {"model_called": model_called, "loss_called": lambda self, *a, **k: None,
             "before_backward": lambda self, tensors: None, "step_pre": lambda self, opt, args, kwargs: None,
             "step_post": lambda self, opt, args, kwargs: None}
    saved = {name: FullPolicy.__dict__[name] for name in empty}
    saved_next = LoaderIter._next
    try:
        for name, fn in empty.items():
            setattr(FullPolicy, name, fn)
        LoaderIter._next = lambda self: next(self.inner)
        yield
    finally:
        for name, fn in saved.items():
            setattr(FullPolicy, name, fn)
        LoaderIter._next = saved_next


def timed(build, loader, steps: int, mode: str | None) -> float:
    torch.manual_seed(0)
    model = build().to(DEVICE)
    emptied = mode == "floor"
    _sync()
    t0 = CLOCK()
    if mode is None:
        loop(model, loader, steps)
    else:
        with records_emptied() if emptied else contextlib.nullcontext(), Recorder(mode="full" if emptied else mode):
            loop(model, loader, steps)
    _sync()
    return CLOCK() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--big-steps", type=int, default=20)
    ap.add_argument("--cpu", action="store_true", help="time process CPU seconds, not the wall clock")
    ap.add_argument("--model", action="append", help="only models whose name contains this (repeatable): small, MLP, CNN")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--floor", action="store_true", help="also time the full recorder's wrappers with every record emptied")
    args = ap.parse_args(argv)
    global CLOCK, DEVICE
    CLOCK = time.process_time if args.cpu else time.perf_counter
    DEVICE = torch.device(args.device)
    rows = []
    for name, (build, *_) in MODELS.items():
        if args.model and not any(w in name for w in args.model):
            continue
        steps = args.steps if "small" in name else args.big_steps
        loader, params = data(name)
        modes = ("plain", "light", "full") + (("floor",) if args.floor else ())
        for mode in modes:  # warm up (the first recorder import pulls in lazy torch modules)
            timed(build, loader, max(steps // 10, 2), None if mode == "plain" else mode)
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode in modes:
                times[mode].append(timed(build, loader, steps, None if mode == "plain" else mode))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"model": name, "device": str(DEVICE), "params": params, "steps": steps, "plain_s": med["plain"],
               "light_x": med["light"] / med["plain"], "full_x": med["full"] / med["plain"]}
        if args.floor:
            row["floor_x"] = med["floor"] / med["plain"]
        rows.append(row)
        print(f"{name:<40} {params:>11,} params  {steps:>4} steps  plain {med['plain']:.3f} s  "
              f"light {row['light_x']:.3f}x  full {row['full_x']:.3f}x"
              + (f"  floor (records emptied) {row['floor_x']:.3f}x" if args.floor else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
