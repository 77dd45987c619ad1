"""Run one probe so that nothing it does escapes: exceptions become ``errored`` results, a hang is
stopped by a time limit, and global RNG state and grad mode are put back as they were.

A probe past its time limit is cancelled, not abandoned: ``ProbeCancelled`` (a BaseException, so the
user's ``except Exception`` cannot swallow it) is raised inside its worker thread, which then ends at
the next Python instruction, after the native op it is in returns. A worker stuck in one native call
longer than the grace period is left running, listed by ``stragglers()``; the CLI then ends the
process with ``os._exit`` once the reports are written, instead of letting interpreter shutdown
abort inside torch.
"""

from __future__ import annotations

import ctypes
import random
import threading
import warnings
import time
import traceback
from contextlib import contextmanager

import numpy as np
import torch

from nnwizard import cuda_lost
from nnwizard.probes.api import ProbeContext, ProbeResult, ProbeSpec, registered


@contextmanager
def preserved_state():
    """Save and restore Python, NumPy and torch (CPU and CUDA) RNG state and grad mode."""
    state = rng_state()
    grad = torch.is_grad_enabled()
    try:
        yield
    finally:
        set_rng_state(state)
        torch.set_grad_enabled(grad)


def rng_state() -> tuple:
    """The Python, NumPy and torch (CPU and CUDA) generators' state, for :func:`set_rng_state`."""
    return random.getstate(), np.random.get_state(), torch.random.get_rng_state(), _cuda_rng(None)


def set_rng_state(state: tuple) -> None:
    py_state, np_state, torch_state, cuda_state = state
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.random.set_rng_state(torch_state)
    if cuda_state is not None:
        _cuda_rng(cuda_state)


def _cuda_rng(state):
    """Read (``state`` None) or restore the CUDA generators. After a sticky CUDA error (cuda_lost) neither
    can work; that error is remembered for the session to end on, instead of raised from here."""
    if not torch.cuda.is_available() or cuda_lost.seen():
        return None
    try:
        if state is None:
            return torch.cuda.get_rng_state_all()
        torch.cuda.set_rng_state_all(state)
    except Exception as exc:  # noqa: BLE001
        if not cuda_lost.remember(exc, "restoring the CUDA random state"):
            raise
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class ProbeCancelled(BaseException):
    """Raised inside a probe's worker thread when its time limit has passed."""


_STRAGGLERS: list[threading.Thread] = []
GRACE_S = 1.0  # how long a cancelled worker may take to reach its next Python instruction (at least)


def cancel(thread: threading.Thread) -> bool:
    """Ask ``thread`` to raise ProbeCancelled at its next Python instruction."""
    if thread.ident is None or not thread.is_alive():
        return False
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(ProbeCancelled)) == 1


def stragglers() -> list[threading.Thread]:
    """Probe workers that were cancelled but are still inside a native call."""
    _STRAGGLERS[:] = [t for t in _STRAGGLERS if t.is_alive()]
    return list(_STRAGGLERS)


def run_probe(spec: ProbeSpec, ctx: ProbeContext, timeout_s: float | None = None, grace_s: float = GRACE_S) -> ProbeResult:
    """Run ``spec`` in a worker thread with a time limit; never raises (but KeyboardInterrupt, and
    ``cuda_lost.CudaContextLost`` once a sticky CUDA error has made the GPU unusable).
    Past the limit the worker is cancelled and given ``grace_s`` to end."""
    limit = timeout_s if timeout_s is not None else spec.timeout_s
    ctx.cap = time.monotonic() + 0.8 * limit  # probes that loop stop early, keeping headroom
    if ctx.deadline is None or ctx.deadline > ctx.cap:
        ctx.deadline = ctx.cap
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
        try:
            while worker.is_alive() and time.monotonic() - started < limit:
                worker.join(0.05)  # short joins keep Ctrl-C responsive
        except KeyboardInterrupt:
            _stop(worker, grace_s, box)
            raise
        timed_out = worker.is_alive()
        if timed_out:
            _stop(worker, grace_s, box)
    duration = time.monotonic() - started
    if timed_out or isinstance(box.get("error"), ProbeCancelled):
        stuck = worker.is_alive()
        result = ProbeResult(
            "errored", "errored",
            f"timed out after {limit:.0f} s and was stopped"
            + (" (it was still inside one native call, left to finish on its own)" if stuck else "")
            + "; the user's code may be hanging, or the probe needs more time (--probe-timeout, --budget)",
            {"timeout_s": round(limit, 1), "stopped": not stuck},
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
    if ctx.plan:
        result.data.setdefault("plan", dict(ctx.plan))
    if box.get("warnings"):
        result.data.setdefault("warnings", box["warnings"])
    result.id, result.duration_s, result.params = spec.id, round(duration, 3), dict(ctx.params)
    # a dead CUDA context (a sticky error): nothing more can run on the GPU. (Where: a probe by its id; the session's
    # own work run like one, the step timing, by what it does)
    cuda_lost.check(f"in probe {spec.id}" if registered(spec.id) else f"while nnwizard {spec.title}")
    return result


def _stop(worker: threading.Thread, grace_s: float, box: dict) -> None:
    """Cancel a worker and wait up to ``grace_s`` for it to end; a worker still alive is a straggler."""
    cancel(worker)
    ends, again = time.monotonic() + grace_s, time.monotonic() + 0.5
    while worker.is_alive() and time.monotonic() < ends:
        worker.join(0.05)
        if worker.is_alive() and time.monotonic() > again and "error" not in box and "result" not in box:
            cancel(worker)  # the user's code swallowed the first one (a bare except)
            again = time.monotonic() + 0.5
    if worker.is_alive():
        _STRAGGLERS.append(worker)
