"""Distributed training: accuracy and cost on the scripts of examples/distributed/ (CPU, gloo, 2 ranks).

    python benchmarks/distributed.py [--accuracy] [--timing] [--overhead] [--only NAME ...] [--json out.json]

- ``--accuracy``: every example diagnosed as a user would, with ``nnwizard diagnose --script S --nproc 2`` and
  under ``torchrun --standalone --nproc_per_node=2 -m nnwizard diagnose --script S``: the verdict, the top
  finding, whether it is the declared one (healthy twins: verdict healthy), the wall time.
- ``--timing``: a 2-rank diagnosis of a small DDP script against the same script's one-process diagnosis
  (``RANK=0 WORLD_SIZE=1``, as a user diagnoses it by hand), ``--repeats`` times interleaved: the ratio of medians.
- ``--instructions``: callgrind's instruction count a step of one rank of a DDP loop under the full recorder, and
  under the full recorder with the rank's digest and step agreement (load-independent).
- ``--overhead``: the per-rank cost: the whole script run as one rank in this process (``WORLD_SIZE=1``), plainly,
  under the full recorder, and under the full recorder with the rank's digest and step agreement, ``--repeats``
  times interleaved (ratio of medians: what nnwizard adds to a rank, without the noise of several processes);
  then the median optimizer step of each of 2 ranks under plain torchrun (a step hook timing it), in a
  diagnosis's ranks, and under ``nnwizard watch --nproc 2`` (a noisier, whole-system figure).

Default: all three. The machine is shared: run it on a quiet one, read medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples._distributed import DISTRIBUTED, diagnose_distributed, distributed_examples, findings  # noqa: E402

TIMED = DISTRIBUTED / "healthy_ddp_classifier.py"
STEP_TIMER = '''
import json, os, runpy, sys, time
import torch
times, last = [], [None]
def post(opt, args, kwargs):
    now = time.perf_counter()
    if last[0] is not None:
        times.append(now - last[0])
    last[0] = now
from torch.optim.optimizer import register_optimizer_step_post_hook
register_optimizer_step_post_hook(post)
script = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    with open(os.environ["STEP_TIMES"] + f".rank{os.environ['RANK']}", "w") as f:
        json.dump(times, f)
'''


def accuracy(only: list[str] | None) -> list[dict]:
    rows = []
    for example in distributed_examples(only):
        for how in ("nproc", "torchrun"):
            with tempfile.TemporaryDirectory() as work:
                report, error, seconds, code = diagnose_distributed(example.path, Path(work), how)
            found = findings(report) if report else []
            ok = report is not None and (report["verdict"] == "healthy" if example.healthy else
                                         bool(found) and found[0] in example.expected)
            rows.append({"script": example.name, "how": how, "expected": ", ".join(example.expected) or "healthy",
                         "verdict": report["verdict"] if report else f"error: {error}", "top": found[0] if found else "-",
                         "confidence": round(max((h["confidence"] for h in report["hypotheses"]), default=0), 2) if report else None,
                         "right": ok, "seconds": round(seconds, 1), "exit": code})
            print(f"{example.name:34} {how:9} {rows[-1]['verdict']:15} {rows[-1]['top']:24} "
                  f"{'ok' if ok else 'WRONG':5} {seconds:6.1f} s", flush=True)
    return rows


def timing(repeats: int) -> dict:
    single, ranks = [], []
    for _ in range(repeats):
        for how, into in (("single", single), ("nproc", ranks)):
            with tempfile.TemporaryDirectory() as work:
                report, error, seconds, _ = diagnose_distributed(TIMED, Path(work), how)
            if error is None:
                into.append(seconds)
            print(f"  {how:7} {seconds:6.1f} s" + (f"  ({error})" if error else ""), flush=True)
    out = {"script": TIMED.name, "one_process_s": single, "two_ranks_s": ranks}
    if single and ranks:
        out["ratio"] = round(statistics.median(ranks) / statistics.median(single), 2)
    return out


def _plain_steps(script: Path, work: Path) -> list[float]:
    timer = work / "timer.py"
    timer.write_text(STEP_TIMER)
    base = work / "steps"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(timer),
                    str(script)], cwd=work, env={**os.environ, "STEP_TIMES": str(base), "OMP_NUM_THREADS": "1"},
                   capture_output=True, timeout=600)
    times = []
    for rank in (0, 1):
        path = Path(f"{base}.rank{rank}")
        if path.exists():
            times += json.loads(path.read_text())
    return times


def _diagnosis_steps(script: Path, work: Path) -> list[float]:
    from nnwizard.distributed.launch import Launch

    class Opts:
        script_args: list = []
        max_steps = 60
        seed = 0
    Opts.script = str(script)
    launch = Launch(Opts, 2, "cpu")
    try:
        run = launch.run()
    finally:
        launch.close()
    times = []
    for d in run.digests.values():
        t = [s[3] for s in d.get("steps", [])]
        times += [b - a for a, b in zip(t, t[1:])]
    return times


def _watch_steps(script: Path, work: Path) -> list[float]:
    subprocess.run([sys.executable, "-m", "nnwizard", "watch", "--script", str(script), "--nproc", "2", "--out", "w"],
                   cwd=work, capture_output=True, timeout=600)
    times = []
    for rank in (0, 1):
        rows = [json.loads(line) for line in (work / "w" / f"watch.rank{rank}.jsonl").read_text().splitlines()]
        times += [r["step_s"] for r in rows[1:] if r.get("step_s")]   # (each: the mean step since the line before)
    return times


def _one_rank_run(mode: str) -> float:
    """The whole script in this process as one rank (RANK=0, WORLD_SIZE=1, gloo): plainly, under the full recorder,
    or under the full recorder with the rank's digest and step agreement (what a diagnosis's rank runs)."""
    import contextlib
    import io
    import runpy

    from nnwizard.distributed.agree import StepAgreement
    from nnwizard.distributed.channel import Channel, connect, serve
    from nnwizard.distributed.digest import RankDigest
    from nnwizard.distributed.env import one_process
    from nnwizard.record import Recorder, StopRun

    with one_process(), contextlib.redirect_stdout(io.StringIO()), tempfile.TemporaryDirectory() as work:
        argv, cwd = sys.argv, os.getcwd()
        sys.argv = [str(TIMED), "--epochs", "2"]
        os.chdir(work)
        started = time.perf_counter()
        try:
            if mode == "plain":
                runpy.run_path(str(TIMED), run_name="__main__")
            else:
                listeners, patches = [], contextlib.nullcontext()
                if mode == "digest":
                    store, address = serve()
                    digest = RankDigest(0, 1, TIMED.parent)
                    listeners = [digest, StepAgreement(Channel(connect(address), "bench"), 0, 10_000, None)]
                    patches = digest.patches()
                with Recorder("full", files=[TIMED], listeners=listeners):
                    with patches:
                        try:
                            runpy.run_path(str(TIMED), run_name="__main__")
                        except StopRun:
                            pass
            return time.perf_counter() - started
        finally:
            sys.argv = argv
            os.chdir(cwd)
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def overhead(repeats: int = 5) -> dict:
    out: dict = {"one_rank_s": {}}
    modes = ("plain", "full", "digest")
    _one_rank_run("plain")   # (warm-up: imports, first-time allocations)
    runs: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(repeats):
        for mode in modes:
            runs[mode].append(_one_rank_run(mode))
    med = {m: statistics.median(v) for m, v in runs.items()}
    out["one_rank_s"] = {m: round(v, 3) for m, v in med.items()}
    out["one_rank_ratios"] = {"full recorder": round(med["full"] / med["plain"], 3),
                              "full recorder + digest and agreement": round(med["digest"] / med["plain"], 3)}
    print(f"  one rank in this process ({repeats} interleaved repeats, whole run): plain {med['plain']:.2f} s, "
          f"full recorder {out['one_rank_ratios']['full recorder']}x, with the digest and the step agreement "
          f"{out['one_rank_ratios']['full recorder + digest and agreement']}x", flush=True)
    print("  two gloo ranks, median optimizer step:")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, measure in (("plain torchrun", _plain_steps), ("diagnosis rank (full recorder)", _diagnosis_steps),
                              ("watch --nproc 2 (light recorder)", _watch_steps)):
            steps = measure(TIMED, work)
            out[name] = round(statistics.median(steps) * 1e3, 3) if steps else None
            print(f"  {name:34} median step {out[name]} ms over {len(steps)} steps", flush=True)
    plain = out.get("plain torchrun")
    if plain:
        out["ratios"] = {k: round(v / plain, 2) for k, v in out.items() if isinstance(v, float) and k != "plain torchrun"}
    return out


class _MemoryChannel:
    """The channel's interface in memory: counts the digest's and the agreement's own work, not the store's sockets."""

    def __init__(self):
        self.d: dict = {}

    def get(self, key):
        return self.d.get(key)

    def put(self, key, value) -> None:
        self.d[key] = value

    def first(self, key, value):
        return self.d.setdefault(key, value)


def _instructions_child(steps: int) -> None:
    """(callgrind child) one process, one thread, one rank of a DDP loop over a DistributedSampler: ``steps`` steps
    under the full recorder, then ``steps`` under the full recorder with the rank's digest and step agreement."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import _callgrind as callgrind
    from nnwizard.distributed.agree import StepAgreement
    from nnwizard.distributed.digest import RankDigest
    from nnwizard.distributed.env import one_process
    from nnwizard.record import Recorder, StopRun

    torch.set_num_threads(1)
    with one_process():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(4096, 20), torch.randint(0, 4, (4096,)))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=32, sampler=sampler)

        def run(n: int, digest: bool) -> None:
            torch.manual_seed(0)
            model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            d = RankDigest(0, 1, Path(__file__).parent)
            listeners = [d, StepAgreement(_MemoryChannel(), 0, n, 30.0)] if digest else []
            with Recorder("full", max_steps=n, listeners=listeners), (d.patches() if digest else _null()):
                try:
                    for epoch in range(1000):
                        sampler.set_epoch(epoch)
                        for x, y in loader:
                            opt.zero_grad()
                            F.cross_entropy(model(x), y).backward()
                            opt.step()
                except StopRun:
                    pass

        run(5, False)
        run(5, True)
        callgrind.region(lambda: run(steps, False))
        callgrind.region(lambda: run(steps, True))
        dist.destroy_process_group()


def _null():
    import contextlib

    return contextlib.nullcontext()


def instructions(steps: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _callgrind as callgrind

    full, digest = callgrind.count(__file__, ["--steps", str(steps)], steps)
    out = {"steps": steps, "full_recorder": round(full), "with_digest": round(digest), "ratio": round(digest / full, 3)}
    print(f"  instructions a step, one rank of a DDP loop ({steps} steps): full recorder {full:,.0f}, with the digest "
          f"and the step agreement {digest:,.0f}: {out['ratio']}x", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--overhead", action="store_true")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--instructions", action="store_true", help="callgrind: the digest's cost on top of the full "
                        "recorder, in instructions (load-independent; minutes)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _instructions_child(args.steps)
        return
    if args.instructions:
        result = {"instructions": instructions(args.steps)}
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        return
    every = not (args.accuracy or args.timing or args.overhead)
    result: dict = {}
    started = time.monotonic()
    if args.accuracy or every:
        print("accuracy (diagnose --nproc 2, and under torchrun)")
        rows = result["accuracy"] = accuracy(args.only)
        for how in ("nproc", "torchrun"):
            mine = [r for r in rows if r["how"] == how]
            broken = [r for r in mine if r["expected"] != "healthy"]
            healthy = [r for r in mine if r["expected"] == "healthy"]
            print(f"{how}: broken right top-1 {sum(r['right'] for r in broken)}/{len(broken)}, healthy read healthy "
                  f"{sum(r['right'] for r in healthy)}/{len(healthy)}")
    if args.timing or every:
        print(f"timing ({TIMED.name}: 2 ranks vs one process)")
        result["timing"] = timing(args.repeats)
        print(f"  ratio of medians: {result['timing'].get('ratio')}")
    if args.overhead or every:
        print(f"per-rank cost ({TIMED.name})")
        result["overhead"] = overhead(args.repeats)
    result["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
