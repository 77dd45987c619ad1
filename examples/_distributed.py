"""The distributed training scripts in examples/distributed/, what each declares it should be diagnosed as
(the same ``# nnwizard-expect:`` lines as examples/scripts/), and how a user diagnoses one on 2 ranks: with
``nnwizard diagnose --script S --nproc 2``, or under their own ``torchrun --standalone --nproc_per_node=2 -m
nnwizard diagnose --script S``. Shared by the tests and benchmarks/distributed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from examples._scripts import ScriptExample, read_expectation

DISTRIBUTED = Path(__file__).resolve().parent / "distributed"


def distributed_examples(only: list[str] | None = None) -> list[ScriptExample]:
    found = [read_expectation(p) for p in sorted(DISTRIBUTED.glob("*.py"))]
    return [s for s in found if not only or s.name in only]


def command(path: Path, how: str, nproc: int, out: Path, extra: list[str] = ()) -> list[str]:
    """The user's command line: ``--nproc N``, torchrun around nnwizard (``torchrun``), or one process (``single``)."""
    diagnose = ["-m", "nnwizard", "diagnose", "--script", str(path), "--non-interactive", "--device", "cpu",
                "--json", str(out), "--quiet", *extra]
    if how == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *diagnose]
    if how == "nproc":
        return [sys.executable, *diagnose, "--nproc", str(nproc)]
    return [sys.executable, *diagnose]


def one_process_env() -> dict[str, str]:
    """A distributed script's environment as one process (what a user sets by hand without torchrun)."""
    from nnwizard.distributed.env import free_port

    return {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def diagnose_distributed(path: Path, workdir: Path, how: str = "nproc", nproc: int = 2, timeout_s: float = 400,
                         extra: list[str] = ()) -> tuple[dict | None, str | None, float, int | None]:
    """Diagnose one script as a user would, from ``workdir``: (JSON report or None, error or None, wall seconds,
    exit code)."""
    out = Path(workdir) / f"report-{how}.json"
    out.unlink(missing_ok=True)
    env = one_process_env() if how == "single" else {k: v for k, v in os.environ.items()
                                                     if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    started = time.monotonic()
    try:
        done = subprocess.run(command(path, how, nproc, out, list(extra)), cwd=workdir, capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s", time.monotonic() - started, None
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1) or not out.exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        return None, f"exit {done.returncode}: {tail}", seconds, done.returncode
    return json.loads(out.read_text()), None, seconds, done.returncode


def findings(report: dict) -> list[str]:
    return [h["id"] for h in report["hypotheses"] if h["confidence"] >= 0.5]
