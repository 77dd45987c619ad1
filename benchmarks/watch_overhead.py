"""Cost of watch mode: per-step time of a plain training loop against the same loop inside
``nnwizard.watch`` (recorder in light mode, triggers every step, JSON lines at watch's default
interval unless ``--every``), for a small MLP and a ~10M-parameter MLP; the time to save a replay
bundle inside the step; and how many steps a replay re-executes to localise the bundled examples'
anomalies.

    python benchmarks/watch_overhead.py [--steps 300] [--repeats 40] [--every N] [--markdown] [--device cuda]

Method (robust on a shared machine): plain, bare-recorder (light mode) and watched blocks of
``--steps`` steps (the ~10M model: a tenth, at least 20) are interleaved, ``--repeats`` rounds, the
order of the three rotating from round to round, each mode on its own copy of the model. A block's
step time is the *mean* over its steps after the first ``--skip`` (the recorder's model discovery and
first gradient norms; the steps that log a JSON line or measure norms stay in, so their cost is
averaged in, not hidden by a median). Each round gives one ratio per mode (its block over the plain
block of the same round); the reported overhead is the median of those per-round ratios, and the
step times are the medians of the block means. Two clocks: wall time (what the user waits) and the
process's CPU time (``time.process_time``: time the process was not running because other
processes had the CPU does not count, so it is the steadier one on a loaded machine). Work of other
processes that slows one block falls out as an outlier round.
Step time is forward, loss, zero_grad, backward and optimizer.step on CPU, batches prepared ahead,
2 torch threads (1 with ``--threads 1``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def small_mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)), 32, 64


def mlp_10m():
    return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1024),
                         nn.ReLU(), nn.Linear(1024, 10)), 1024, 64


MODELS = {"small MLP": small_mlp, "~10M-param MLP": mlp_10m}


DEVICE = torch.device("cpu")


def _loop(model, optimizer, batches, loss_fn) -> tuple[float, float]:
    """Mean wall seconds of a step after the first ``SKIP``, and the CPU seconds of those steps. On CUDA
    a step's kernels run after its Python returns, so there the steps after ``SKIP`` are timed as one
    block between two ``torch.cuda.synchronize()`` calls (no sync inside the loop, as in a real run)."""
    times, cpu0, t_skip = [], 0.0, 0.0
    cuda = DEVICE.type == "cuda"
    for i, (x, y) in enumerate(batches):
        if i == SKIP:
            if cuda:
                torch.cuda.synchronize(DEVICE)
                t_skip = time.perf_counter()
            cpu0 = time.process_time()
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    if cuda and len(batches) > SKIP:
        torch.cuda.synchronize(DEVICE)
        return (time.perf_counter() - t_skip) / (len(batches) - SKIP), time.process_time() - cpu0
    return statistics.fmean(times[SKIP:] or times), time.process_time() - cpu0


SKIP = 10


def measure(name: str, steps: int, repeats: int, every: int | None) -> dict:
    """Step time plain, under the bare recorder (light mode) and under watch, in interleaved blocks of
    ``steps`` steps (``repeats`` rounds), each on its own copy of the model (see the module docstring)."""
    import nnwizard
    from nnwizard.record import Recorder

    torch.manual_seed(0)
    base, features, batch = MODELS[name]()
    params = sum(p.numel() for p in base.parameters())
    base = base.to(DEVICE)
    batches = [(torch.randn(batch, features, device=DEVICE), torch.randint(0, 10, (batch,), device=DEVICE))
               for _ in range(steps + SKIP)]
    loss_fn = nn.CrossEntropyLoss()
    runs = {}
    for mode in ("plain", "recorder", "watch"):
        model = copy.deepcopy(base)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        _loop(model, optimizer, batches[:3], loss_fn)  # warm-up
        runs[mode] = (model, optimizer)
    wall: dict[str, list[float]] = {m: [] for m in runs}
    cpu: dict[str, list[float]] = {m: [] for m in runs}
    order = list(runs)
    for r in range(repeats):
        for mode in order[r % 3:] + order[:r % 3]:
            model, optimizer = runs[mode]
            if mode == "plain":
                mean, c = _loop(model, optimizer, batches, loss_fn)
            elif mode == "recorder":
                with Recorder("light"):
                    mean, c = _loop(model, optimizer, batches, loss_fn)
            else:
                with tempfile.TemporaryDirectory() as out, \
                        nnwizard.watch(model, optimizer, out=out, every=every, tensorboard=False, quiet=True):
                    mean, c = _loop(model, optimizer, batches, loss_fn)
            wall[mode].append(mean)
            cpu[mode].append(c / steps)

    def ratio(blocks, mode):
        return statistics.median(b / p for b, p in zip(blocks[mode], blocks["plain"]))

    med = {m: statistics.median(t) for m, t in wall.items()}
    return {"model": name, "device": str(DEVICE), "params": params, "plain_ms": med["plain"] * 1e3, "recorder_ms": med["recorder"] * 1e3,
            "watch_ms": med["watch"] * 1e3, "recorder_ratio": ratio(wall, "recorder"), "ratio": ratio(wall, "watch"),
            "cpu_plain_ms": statistics.median(cpu["plain"]) * 1e3, "cpu_recorder_ratio": ratio(cpu, "recorder"),
            "cpu_ratio": ratio(cpu, "watch"), "steps": steps * repeats, "rounds": repeats}


def bundle_time(repeats: int = 3) -> dict:
    """Seconds to save a bundle of the ~10M model inside its step (a forced trigger at step 10)."""
    import nnwizard
    from nnwizard import anomaly

    real = anomaly.Detector.check

    def check(self, step, loss, grad_norm):
        return real(self, step, loss, grad_norm) or (anomaly.Anomaly("loss-spike", step, "forced", loss, grad_norm)
                                                      if step == 10 else None)

    anomaly.Detector.check = check
    seconds, size = [], 0
    try:
        for _ in range(repeats):
            torch.manual_seed(0)
            model, features, batch = mlp_10m()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            batches = [(torch.randn(batch, features), torch.randint(0, 10, (batch,))) for _ in range(12)]
            with tempfile.TemporaryDirectory() as out:
                with nnwizard.watch(model, optimizer, out=out, every=10, tensorboard=False, quiet=True) as w:
                    _loop(model, optimizer, batches, nn.CrossEntropyLoss())
                line = next(json.loads(l) for l in (Path(out) / "watch.jsonl").read_text().splitlines()
                            if json.loads(l).get("bundle"))
                seconds.append(line["bundle_s"])
                size = sum(f.stat().st_size for f in w.bundles[0].iterdir())
    finally:
        anomaly.Detector.check = real
    return {"bundle_s": statistics.median(seconds), "bundle_mb": size / 2**20}


def replay_steps() -> list[dict]:
    """Steps re-executed by the replays of the bundled examples' first anomalies."""
    import runpy

    from nnwizard.replay import replay, report_dict
    from nnwizard.watch_cmd import run

    rows = []
    for script, args in (("bad_batch.py", []), ("warmup.py", ["--steps", "460"])):
        with tempfile.TemporaryDirectory() as out:
            saved = sys.argv
            try:
                if script == "warmup.py":
                    sys.argv = [script, *args, "--watch", out]
                    runpy.run_path(str(ROOT / "examples" / "watch" / script), run_name="__main__")
                else:
                    run(str(ROOT / "examples" / "watch" / script), args, Path(out), "continue", 10, tensorboard=False)
            finally:
                sys.argv = saved
            first = sorted(Path(out).glob("anomaly-step*"), key=lambda p: int(p.name[12:]))[0]
            started = time.perf_counter()
            diagnosis, target = replay(first)
            data = report_dict(diagnosis, target)
            seconds = time.perf_counter() - started
            bisect = next(r for r in diagnosis.results if r.id == "nan-bisect")
            loc = data["localised"] or {}
            localise = bisect.data.get("steps_run", 0) + bisect.data.get("replays", 0) if loc.get("probe") == "nan-bisect" \
                else loc.get("replays", 0)
            rows.append({"example": script, "step": data["step"], "trigger": data["trigger"],
                         "top": data["hypotheses"][0]["id"] if data["hypotheses"] else "-",
                         "localise_steps": localise, "replay_s": seconds, "localised": loc.get("text", "-")})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per block (the ~10M model: a tenth, at least 20)")
    parser.add_argument("--repeats", type=int, default=40, help="alternating rounds of blocks")
    parser.add_argument("--every", type=int, default=None, help="watch's JSON-line interval (default: watch's own)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["overhead"], help="only the overhead table (no bundle or replay timings)")
    parser.add_argument("--model", choices=list(MODELS), action="append", help="only this model (repeatable)")
    parser.add_argument("--markdown", action="store_true", help="print the README tables")
    parser.add_argument("--device", default="cpu", help="cuda: models and batches on the GPU (bundle and replay timings stay on the CPU)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(min(args.threads, torch.get_num_threads()))
    results = [measure(name, args.steps if name == "small MLP" else max(args.steps // 10, 20), args.repeats, args.every)
               for name in (args.model or MODELS)]
    bundle = bundle_time() if not args.only else None
    replays = replay_steps() if not args.only else []
    if args.markdown:
        print("| model | parameters | plain step | recorder alone (light) | watched step | watch overhead (wall) "
              "| recorder / watch (CPU time) |\n|---|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['plain_ms']:.3f} ms | {r['recorder_ms']:.3f} ms "
                  f"({r['recorder_ratio']:.3f}x) | {r['watch_ms']:.3f} ms | {r['ratio']:.3f}x "
                  f"| {r['cpu_recorder_ratio']:.3f}x / {r['cpu_ratio']:.3f}x |")
        if bundle is None:
            return
        print(f"\nBundle of the ~10M model ({bundle['bundle_mb']:.0f} MB) saved inside its step in {bundle['bundle_s']:.2f} s.\n")
        print("| example | caught at | trigger | replay's top hypothesis | steps re-executed to localise | replay wall |\n|---|---|---|---|---|---|")
        for r in replays:
            print(f"| {r['example']} | step {r['step']} | {r['trigger']} | {r['top']} | {r['localise_steps']} | {r['replay_s']:.1f} s |")
    else:
        print(json.dumps({"overhead": results, "bundle": bundle, "replays": replays}, indent=2))


if __name__ == "__main__":
    main()
