"""Cost of the instruments: one instrumented training step (per-parameter gradient norms read
before optimizer.step, activation statistics hooked on every activation module) against a plain
step of the same model, as a ratio measured in one run; and the cost of NaN localisation (the traced
replay of the failing step) in plain steps of that batch.

    python benchmarks/overhead.py [--only NAME ...] [--steps 200]

The instrumented step uses module forward hooks and an optimizer step pre-hook (what a user could
leave on during training); the TorchFunctionMode op tracer is the NaN replay's tool, used on one
step only, and is reported separately.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = ["healthy_mlp", "healthy_cnn", "broken_vanishing_gradients", "broken_exploding_gradients"]
ACTIVATIONS = (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.GELU, nn.LeakyReLU)


def _instrument(model, optimizer):
    stats: dict = {}

    def act_hook(mod, args, out, _name=None):
        v = out.detach().reshape(len(out), -1)
        stats[_name] = v.amax(0) <= 0  # units dead for every sample (one reduction)

    handles = [m.register_forward_hook(lambda mod, a, o, _n=n: act_hook(mod, a, o, _n))
               for n, m in model.named_modules() if isinstance(m, ACTIVATIONS)]
    params = [p for p in model.parameters() if p.requires_grad]

    def grad_hook(opt, args, kwargs):
        stats["grad"] = torch._foreach_norm([p.grad for p in params if p.grad is not None])

    handles.append(optimizer.register_step_pre_hook(grad_hook))
    return handles


def _time(fn, steps: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(name: str, steps: int) -> dict:
    from nnwizard.record.optrace import OpTracer
    from nnwizard.target import load_target

    target = load_target(str(ROOT / "examples" / f"{name}.py"), "cpu")
    batch = target.batch()
    model = target.fresh_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay put, every step costs the same

    def step():
        target.train_step(model, batch, optimizer)

    plain = _time(step, steps)
    handles = _instrument(model, optimizer)
    instrumented = _time(step, steps)
    for h in handles:
        h.remove()

    def traced():
        with OpTracer(model, backward=True, optimizer=optimizer):
            step()

    replay = _time(traced, max(10, steps // 10))
    return {"example": name, "plain_ms": plain * 1e3, "instrumented_ms": instrumented * 1e3,
            "ratio": instrumented / plain, "traced_ms": replay * 1e3, "traced_ratio": replay / plain}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=DEFAULT)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| example | plain step | instrumented step | ratio | traced replay (NaN localisation) | ratio |")
    print("|---|---|---|---|---|---|")
    for name in args.only:
        r = measure(name, args.steps)
        print(f"| `{r['example']}` | {r['plain_ms']:.3f} ms | {r['instrumented_ms']:.3f} ms | {r['ratio']:.2f}x | "
              f"{r['traced_ms']:.3f} ms | {r['traced_ratio']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
