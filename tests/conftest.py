"""Shared fixtures: load bundled examples as targets and run single probes on them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")
torch.set_num_threads(min(2, torch.get_num_threads()))


def load_example(name: str, device: str = "cpu"):
    """The Target of ``examples/<name>.py``."""
    from nnwizard.target import load_target

    return load_target(str(EXAMPLES / f"{name}.py"), device)


def run_probe_on(probe_id: str, target, seed: int = 0, results: dict | None = None, **params):
    """Run one registered probe on a target exactly as the engine does (isolated, seeded)."""
    from nnwizard.isolation import run_probe
    from nnwizard.probes import ProbeContext, get

    ctx = ProbeContext(target, params, dict(results or {}), seed)
    return run_probe(get(probe_id), ctx)


def diagnose_example(name: str, symptoms=("auto",), **options):
    """The full scripted diagnosis of an example: (Diagnosis, Report)."""
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose

    diagnosis = diagnose(Options(module=str(EXAMPLES / f"{name}.py"), symptoms=list(symptoms), device="cpu", **options))
    return diagnosis, build(diagnosis)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def example():
    return load_example


@pytest.fixture
def probe_on():
    return run_probe_on


def patch_worker(monkeypatch, code: str) -> None:
    """Run ``code`` first in every worker that the CLI called in this process starts (the worker is a process of
    its own: a monkeypatch here does not reach it)."""
    import json

    from nnwizard import supervisor

    def argv(self):
        return [sys.executable, "-c", f"{code}\nimport sys\nfrom nnwizard.worker import main\nmain(sys.argv[1:])",
                json.dumps(self.job)]

    monkeypatch.setattr(supervisor.Launch, "argv", argv)


def signal_when(monkeypatch, wanted) -> None:
    """Send this process SIGINT (what Ctrl-C sends) once the live view gets an event for which ``wanted(event)``
    is true: a Ctrl-C at a chosen point of a diagnosis whose supervisor is this process."""
    import signal

    from nnwizard.view import TerminalView

    real, sent = TerminalView.__call__, []

    def view(self, event):
        real(self, event)
        if not sent and wanted(event):
            sent.append(event)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(TerminalView, "__call__", view)
