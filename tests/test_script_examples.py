"""The plain training scripts in examples/scripts/: each runs under plain python as planted (healthy
and silent faults finish, crash faults raise), and each is diagnosed in script mode as it declares
(broken: its expected id top-1; healthy: verdict ``healthy``)."""

from __future__ import annotations

import ast
import functools
import os
import random
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples._scripts import diagnose_with_cli, script_examples, script_mode_available

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # tiny models, shared CPU
EXAMPLES = script_examples()
BY_NAME = {s.name: s for s in EXAMPLES}
# diagnosed unmarked on every run (one silent loop fault, one healthy); the rest under -m slow
FAST_SCRIPT_MODE = ("broken_notebook_no_step", "healthy_two_optimizers")
# CONTRACT §3 ids added 2026-12-01, accepted before the catalog lists them
NEW_IDS = {"target-shape-mismatch", "no-parameters", "module-method-shadowed", "op-shape-mismatch", "dtype-mismatch",
           "device-mismatch", "metric-wrong"}


def test_the_corpus_has_enough_of_both_kinds():
    assert sum(not s.healthy for s in EXAMPLES) >= 12
    assert sum(s.healthy for s in EXAMPLES) >= 4


def test_declarations_use_contract_ids_and_symptoms():
    from nnwizard.catalog import load_catalog
    from nnwizard.tree import SYMPTOMS

    known = set(load_catalog(None).hypotheses) | NEW_IDS
    for s in EXAMPLES:
        assert set(s.expected) <= known, f"{s.name}: unknown id in {s.expected}"
        assert set(s.symptoms) <= set(SYMPTOMS), f"{s.name}: unknown symptom in {s.symptoms}"
        assert s.name.startswith("healthy_" if s.healthy else "broken_"), s.name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_scripts_are_plain_pytorch(name):
    tree = ast.parse(BY_NAME[name].path.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"argparse", "dataclasses", "math", "random", "numpy", "torch", "sklearn"}, imported


def _run_in_process(path: Path, cwd: Path):
    """``python path`` in this process: __main__, argv, the script's folder first on sys.path, its
    own cwd; global RNG, grad mode, argv, path and cwd restored afterwards. One intra-op thread:
    these models are tiny, and on a shared CPU a second spinning thread makes them 10-100x slower."""
    saved = (sys.argv[:], sys.path[:], os.getcwd(), torch.random.get_rng_state(), random.getstate(),
             torch.is_grad_enabled(), torch.get_num_threads())
    sys.argv, sys.path[0:0] = [str(path)], [str(path.parent)]
    os.chdir(cwd)
    torch.set_num_threads(1)
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        torch.random.set_rng_state(saved[3])
        random.setstate(saved[4])
        torch.set_grad_enabled(saved[5])
        torch.set_num_threads(saved[6])


@pytest.mark.filterwarnings("ignore::UserWarning")  # what the scripts' own faults make torch say
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_script_runs_as_planted(name, tmp_path, capsys):
    script = BY_NAME[name]
    if script.crashes:
        with pytest.raises((RuntimeError, IndexError, ValueError)):
            _run_in_process(script.path, tmp_path)
    else:
        _run_in_process(script.path, tmp_path)
        assert capsys.readouterr().out.strip(), "the script prints its progress"
    assert not list(tmp_path.iterdir()), "run with its defaults, the script writes no files"


@pytest.mark.slow
def test_every_script_runs_under_plain_python(tmp_path):
    for script in EXAMPLES:
        done = subprocess.run([sys.executable, str(script.path)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=ONE_THREAD)
        if script.crashes:
            assert done.returncode == 1 and "Traceback" in done.stderr, (script.name, done.stderr[-500:])
        else:
            assert done.returncode == 0, (script.name, done.stderr[-500:])


# ---------------------------------------------------------------------------------------------- script mode

@functools.lru_cache(maxsize=1)
def _script_mode() -> bool:
    return script_mode_available()


def _check_verdict(name: str, tmp_path: Path) -> None:
    if not _script_mode():
        pytest.skip("script mode (`nnwizard diagnose --script`) is not on this branch yet")
    script = BY_NAME[name]
    report, error, _ = diagnose_with_cli(script.path, script.symptoms, tmp_path, env=ONE_THREAD)
    assert error is None, error
    assert report.get("mode") == "script"
    findings = [h["id"] for h in report["hypotheses"] if h["confidence"] >= 0.5]
    if script.healthy:
        assert report["verdict"] == "healthy" and not findings, (report["verdict"], findings)
    else:
        assert report["verdict"] == "problems-found", report["verdict"]
        assert findings[0] in script.expected, f"expected {script.expected}, ranked {findings}"


@pytest.mark.parametrize("name", FAST_SCRIPT_MODE)
def test_script_mode_verdict_fast_subset(name, tmp_path):
    _check_verdict(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(BY_NAME) - set(FAST_SCRIPT_MODE)))
def test_script_mode_verdict(name, tmp_path):
    _check_verdict(name, tmp_path)
