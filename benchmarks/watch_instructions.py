"""Watch overhead in CPU instructions (load-independent): callgrind counts the instructions of a plain
and a watched small-MLP step in one process; their ratio does not move with other processes' load,
which the wall-clock ratio of ``watch_overhead.py`` does on a shared machine.

    python benchmarks/watch_instructions.py [--steps 200] [--warmup 40]   # needs valgrind (callgrind_annotate)

Method: one process; ``--warmup`` steps (40) in each mode, then ``--steps`` plain steps and ``--steps``
watched steps, each loop one counted region of ``_callgrind`` (callgrind collects exactly those two
loops); the per-step instruction count of each is its total over ``--steps``. The sampled work is fixed so that two runs count the same work:
JSON lines every 10 steps (``every=10``), the gradient norm on steps 1-5 and every 5th, the
update/weight ratio on every logged step (watch's defaults choose these from measured time, which
differs from run to run under valgrind) and the hash seed is fixed. With the default warm-up the
measured steps are among a run's first 250, while watch's bounded windows (the recorder's last 256
step records, the last 500 history entries) still grow, so Python's garbage collector runs in them
(about 1% of the step); ``--warmup 600`` measures a long run's steady state, where they stay full. What still varies between runs
(allocator state, a flush once a second) moves the watched count by about 0.5%. Slow: about 4-10
minutes (importing torch under valgrind).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import _callgrind as callgrind   # (this folder is on sys.path when the script runs)



def _child(steps: int, warmup: int) -> None:
    import torch
    from torch import nn

    import nnwizard
    from nnwizard import watcher
    from nnwizard.record.light import LightPolicy

    LightPolicy.norm_due = lambda self, n: n <= 5 or n % 5 == 0
    watcher.UPDATE_SHARE = 1e9
    torch.set_num_threads(1)

    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        return m, torch.optim.Adam(m.parameters(), lr=1e-4)

    batches = [(torch.randn(64, 32), torch.randint(0, 10, (64,))) for _ in range(steps + 40)]
    warm = [batches[i % len(batches)] for i in range(warmup)]
    loss_fn = nn.CrossEntropyLoss()

    def run(model, opt, b):
        loss = loss_fn(model(b[0]), b[1])
        opt.zero_grad()
        loss.backward()
        opt.step()

    mp, op = make()
    mw, ow = make()
    for b in warm:
        run(mp, op, b)
    callgrind.region(lambda: [run(mp, op, b) for b in batches[40:]])
    with tempfile.TemporaryDirectory() as out, nnwizard.watch(mw, ow, out=out, every=10, tensorboard=False, quiet=True):
        for b in warm:
            run(mw, ow, b)
        callgrind.region(lambda: [run(mw, ow, b) for b in batches[40:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40, help="steps run in each mode before the counted ones")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.steps, args.warmup)
        return
    plain, watched = callgrind.count(__file__, ["--steps", str(args.steps), "--warmup", str(args.warmup)], args.steps)
    print(f"small MLP, instructions per step: plain {plain / 1e6:.3f}M, watched {watched / 1e6:.3f}M, "
          f"ratio {watched / plain:.3f}x ({args.steps} steps each, after {args.warmup} warm-up steps)")


if __name__ == "__main__":
    main()
