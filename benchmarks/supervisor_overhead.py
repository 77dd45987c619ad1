"""What the supervisor and isolation add: to a whole diagnosis, and to one training step.

1. Start-up: a script that trains nothing, diagnosed in each mode (the fixed cost of the supervisor, the worker
   process and the namespaces), repeated and interleaved.
2. Diagnosis: each bundled script of examples/scripts/ diagnosed through the real CLI (``nnwizard diagnose --script
   PATH --non-interactive``), under ``--isolation os``, ``--isolation python``, and the former design (everything in
   the process the user started, ``NNWIZARD_IN_PROCESS=1``), the three runs of a script one after the other so that
   the machine's load weighs on each alike. Prints the median seconds of each mode and the medians of the
   per-script differences to the in-process run.
3. Step: a training loop that reads its batches from files (a DataLoader over .pt files: open, stat and read on every
   step, what the Python sandbox patches) timed plainly, with the Python sandbox installed as a worker installs it,
   and inside the namespaces and overlays of ``--isolation os``: the median step time of each.

    python benchmarks/supervisor_overhead.py [--only NAME ...] [--limit N] [--steps N] [--json out.json]
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

MODES = {"os": ["--isolation", "os"], "python": ["--isolation", "python"], "in-process": []}

STEP_SCRIPT = '''
import json, os, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

folder, steps = sys.argv[1], int(sys.argv[2])
if sys.argv[3] == "python":
    from pathlib import Path
    from nnwizard import isolate
    worker = isolate.install_worker("python", Path(folder) / "scratch")
    worker.sandbox.begin(worker.scratch())


class Files(Dataset):
    def __init__(self, folder):
        self.paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".pt"))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        os.path.exists(self.paths[i])
        return torch.load(self.paths[i])


torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Files(folder), batch_size=16, shuffle=True)
times = []
while len(times) < steps:
    t = time.perf_counter()
    for x, y in loader:   # (a step: its batch's 16 files opened, checked and read, then forward, backward, update)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - t)
        t = now
        if len(times) >= steps:
            break
print(json.dumps({"median_ms": 1e3 * sorted(times)[len(times) // 2]}))
'''


def diagnose(path: Path, mode: str, workdir: Path) -> float:
    env = {**os.environ, **({"NNWIZARD_IN_PROCESS": "1"} if mode == "in-process" else {})}
    cmd = [sys.executable, "-m", "nnwizard", "diagnose", "--script", str(path), "--non-interactive", "--quiet",
           "--json", str(workdir / f"{mode}.json"), *MODES[mode]]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        print(f"  {path.stem} {mode}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    return seconds


def diagnosis_overhead(only: list[str] | None, limit: int | None) -> dict:
    scripts = sorted((ROOT / "examples" / "scripts").glob("*.py"))
    if only:
        scripts = [s for s in scripts if s.stem in only]
    if limit:
        scripts = scripts[:limit]
    rows = []
    for script in scripts:
        with tempfile.TemporaryDirectory(prefix="nnwizard-bench-") as scratch:
            row = {"script": script.stem, **{mode: round(diagnose(script, mode, Path(scratch)), 2) for mode in MODES}}
        rows.append(row)
        print(f"{row['script']:45} " + "  ".join(f"{m} {row[m]:6.1f}s" for m in MODES), flush=True)
    summary = {f"median_{m}_s": round(statistics.median(r[m] for r in rows), 2) for m in MODES}
    for m in ("os", "python"):
        summary[f"median_added_{m}_s"] = round(statistics.median(r[m] - r["in-process"] for r in rows), 2)
    return {"rows": rows, "summary": summary}


EMPTY = "import sys\nprint('nothing to train')\nsys.exit(0)\n"


def startup_overhead(repeats: int) -> dict:
    """The fixed cost: a script that trains nothing (the diagnosis ends after its observed run), through the CLI in
    each mode, ``repeats`` times interleaved; the median seconds of each."""
    times: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="nnwizard-bench-start-") as scratch:
        script = Path(scratch) / "empty.py"
        script.write_text(EMPTY)
        for _ in range(repeats):
            for mode in MODES:
                times[mode].append(diagnose(script, mode, Path(scratch)))
    out = {m: round(statistics.median(v), 3) for m, v in times.items()}
    print("start-up, median seconds of a diagnosis that ends after its observed run: "
          + ", ".join(f"{m} {v:.2f}" for m, v in out.items()), flush=True)
    return out


def step_overhead(steps: int) -> dict:
    import torch

    out = {}
    with tempfile.TemporaryDirectory(prefix="nnwizard-bench-steps-") as folder:
        for i in range(256):
            torch.save((torch.randn(64), torch.randint(0, 10, ()).item()), os.path.join(folder, f"{i:04d}.pt"))
        script = Path(folder) / "steps.py"
        script.write_text(STEP_SCRIPT)
        for mode in ("plain", "python", "os"):
            cmd, fds = [sys.executable, str(script), folder, str(steps), mode], ()
            if mode == "os":
                cmd, fds = _in_namespaces(cmd, Path(folder))
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, pass_fds=fds)
            for fd in fds:
                os.close(fd)
            lines = [line for line in done.stdout.splitlines() if '"median_ms"' in line]
            out[mode] = json.loads(lines[-1])["median_ms"] if lines else None
            if not lines:
                print(f"  step timing, {mode}: {done.stderr.strip()[-300:]}")
    print("median step (ms): " + ", ".join(f"{m} {v:.3f}" for m, v in out.items() if v is not None), flush=True)
    return out


def _in_namespaces(cmd: list[str], folder: Path) -> tuple[list[str], tuple[int, int]]:
    """The command run by the namespace launcher, as ``--isolation os`` runs a worker (its status lines go nowhere)."""
    scratch = Path(tempfile.mkdtemp(prefix="nnwizard-bench-ns-", dir=folder))
    status, control = os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_RDONLY)
    spec = {"argv": cmd, "env": dict(os.environ), "cwd": os.getcwd(), "scratch": str(scratch), "roots": [str(folder)],
            "status_fd": status, "control_fd": control, "keep": False}
    return [sys.executable, "-I", "-S", str(ROOT / "wizard" / "isolate" / "namespaces.py"), json.dumps(spec)], (status, control)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-diagnosis", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    result = {"step_ms": step_overhead(args.steps), "startup_s": startup_overhead(args.repeats)}
    if not args.skip_diagnosis:
        result["diagnosis"] = diagnosis_overhead(args.only, args.limit)
        print(json.dumps(result["diagnosis"]["summary"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
