"""Recorder overhead in CPU instructions (load-independent): callgrind counts the instructions of the
plain training loop of ``recorder_overhead.py`` and of the same loop under the recorder, in one
process; their ratio does not move with other processes' load, which the wall-clock and CPU-time
ratios of ``recorder_overhead.py`` do on a shared machine.

    python benchmarks/recorder_instructions.py [--mode full] [--model small] [--steps 200]
    python benchmarks/recorder_instructions.py --model MLP --steps 60     # the 7.3M MLP (slow)
    python benchmarks/recorder_instructions.py --model CNN --steps 20     # the 11M CNN (slower)

Needs valgrind (callgrind_annotate). Method: one process, one thread; a warm-up of a few plain and
recorded steps (lazy imports), then ``--steps`` plain steps and a fresh model's ``--steps`` recorded
steps, each loop one counted region of ``_callgrind`` (callgrind collects exactly those two loops, the
recorder's first-forward copy of the model and every per-step record included; installing the
recorder is not). The hash seed is fixed.
The recorder runs as a diagnosis observes with (``max_steps`` = ``--steps``, so its last 3 steps are
measured in detail). Slow: minutes (torch's import under valgrind), more for the large models.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _callgrind as callgrind   # (this folder is on sys.path when the script runs)

SHORT = {"small": "small MLP", "MLP": "~10M-parameter MLP", "CNN": "~10M-parameter CNN"}


def _child(model: str, mode: str, steps: int) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import recorder_overhead as bench
    from nnwizard.record import Recorder, StopRun

    torch.set_num_threads(1)
    name = next(n for n in bench.MODELS if n.startswith(SHORT[model]))
    build = bench.MODELS[name][0]
    torch.manual_seed(0)
    loader, _ = bench.data(name)

    def recorded(n: int) -> None:
        torch.manual_seed(0)
        m = build()
        with Recorder(mode=mode, max_steps=n):
            try:
                bench.loop(m, loader, n + 1)
            except StopRun:
                pass

    torch.manual_seed(0)
    bench.loop(build(), loader, 3)
    recorded(3)
    torch.manual_seed(0)
    plain = build()
    callgrind.region(lambda: bench.loop(plain, loader, steps))
    torch.manual_seed(0)
    model = build()
    with Recorder(mode=mode, max_steps=steps):
        try:
            callgrind.region(lambda: bench.loop(model, loader, steps + 1))
        except StopRun:   # the budget's stop, raised from the last step's post hook
            pass


def count(model: str, mode: str, steps: int, keep: Path | None = None) -> tuple[float, float]:
    """Instructions per step (plain, recorded); ``keep``: where to leave callgrind's output (for
    ``callgrind_annotate``)."""
    return callgrind.count(__file__, ["--model", model, "--mode", mode, "--steps", str(steps)], steps,
                           {"OMP_NUM_THREADS": "1"}, keep)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model", choices=sorted(SHORT), default="small")
    parser.add_argument("--mode", choices=("full", "light"), default="full")
    parser.add_argument("--keep", type=Path, help="keep callgrind's output file here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.model, args.mode, args.steps)
        return
    plain, recorded = count(args.model, args.mode, args.steps, args.keep and args.keep.resolve())
    print(f"{SHORT[args.model]}, {args.mode} recorder, instructions per step: plain {plain / 1e6:.3f}M, "
          f"recorded {recorded / 1e6:.3f}M, ratio {recorded / plain:.3f}x ({args.steps} steps each)")


if __name__ == "__main__":
    main()
