"""Recorder overhead on plain runs of the bundled example scripts (the issue's own wording): each healthy script in
examples/scripts/ run in this process with ``runpy`` as ``python script.py`` would run it, plainly, under the light
recorder (watch mode) and under the full recorder (a diagnosis's observed run, with no step cap), ``--repeats``
times interleaved after one warm-up run of each; the ratio of medians of the whole run's wall time (imports of
torch and sklearn excluded: they happen once, before). The scripts' own output is discarded.

    python benchmarks/script_overhead.py [--repeats 5] [--only NAME ...]

Unlike recorder_overhead.py's bare loop, a script's run includes its data set-up, its evaluation passes and its
logging; a per-sample loop (one loss call, one backward per sample) is the dearest case for the recorder.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from nnwizard.record import Recorder  # noqa: E402

MODES = ("plain", "light", "full")


def run_once(path: Path, mode: str) -> float:
    argv = sys.argv
    sys.argv = [str(path)]
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if mode == "plain":
                runpy.run_path(str(path), run_name="__main__")
            else:
                with Recorder(mode, files=[path.resolve()]):
                    runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = argv
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="script names (without .py)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    scripts = sorted((ROOT / "examples" / "scripts").glob("healthy_*.py"))
    if args.only:
        scripts = [p for p in scripts if p.stem in args.only]
    print("| script | plain run | light recorder | full recorder |\n|---|---|---|---|")
    for path in scripts:
        for mode in MODES:   # warm-up: lazy imports, the first optimizer's torch._dynamo import
            run_once(path, mode)
        times = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                times[mode].append(run_once(path, mode))
        med = {m: statistics.median(v) for m, v in times.items()}
        print(f"| {path.stem} | {med['plain']:.3f} s | {med['light'] / med['plain']:.3f}x | "
              f"{med['full'] / med['plain']:.3f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
