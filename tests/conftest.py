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
