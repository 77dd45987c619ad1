"""Run one probe so that nothing it does escapes: exceptions become ``errored`` results, a hang is
stopped by a time limit, and global RNG state and grad mode are put back as they were."""

from __future__ import annotations

import random
import threading
import warnings
import time
import traceback
from contextlib import contextmanager

import numpy as np
import torch

from nnwizard.probes.api import ProbeContext, ProbeResult, ProbeSpec


@contextmanager
def preserved_state():
    """Save and restore Python, NumPy and torch (CPU and CUDA) RNG state and grad mode."""
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    grad = torch.is_grad_enabled()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        torch.set_grad_enabled(grad)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_probe(spec: ProbeSpec, ctx: ProbeContext, timeout_s: float | None = None) -> ProbeResult:
    """Run ``spec`` in a worker thread with a time limit; never raises (but KeyboardInterrupt)."""
    limit = timeout_s if timeout_s is not None else spec.timeout_s
    ctx.deadline = time.monotonic() + 0.8 * limit  # probes that loop stop early, keeping headroom
    box: dict = {}

    def work() -> None:
        try:
            with preserved_state(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                seed_everything(ctx.seed)
                box["result"] = spec(ctx)
        except BaseException as exc:  # noqa: BLE001 - the user's code may raise anything
            box["error"] = exc
        finally:  # warnings the user's code raised while probed are evidence, not terminal noise
            box["warnings"] = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))[:5]

    started = time.monotonic()
    with preserved_state():
        worker = threading.Thread(target=work, name=f"probe-{spec.id}", daemon=True)
        worker.start()
        while worker.is_alive() and time.monotonic() - started < limit:
            worker.join(0.05)  # short joins keep Ctrl-C responsive
    duration = time.monotonic() - started
    if worker.is_alive():
        result = ProbeResult(
            "errored", "errored",
            f"timed out after {limit:.0f} s (the user's code may be hanging; raise --probe-timeout if it is just slow)",
            {"timeout_s": limit},
        )
    elif "error" in box:
        exc = box["error"]
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        result = ProbeResult(
            "errored", "errored", f"{type(exc).__name__}: {exc}{where}",
            {"exception": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exception(exc)[-6:]},
        )
    else:
        result = box.get("result")
        if not isinstance(result, ProbeResult):
            result = ProbeResult("errored", "errored", f"probe returned {type(result).__name__}, not a ProbeResult")
        elif result.outcome not in spec.outcomes:
            result = ProbeResult("errored", "errored", f"probe returned undeclared outcome {result.outcome!r}", result.data)
    if box.get("warnings"):
        result.data.setdefault("warnings", box["warnings"])
    result.id, result.duration_s, result.params = spec.id, round(duration, 3), dict(ctx.params)
    return result
