"""Report consistency: every bundled example is diagnosed with its declared symptoms, and each
evidence sentence's claims are checked against the numbers of the probe it quotes: step counts
("in 40 steps"), ratios ("2.00x", "x1.20"), "mean" / "sum" wording; and a program whose training
raises is never healthy. The whole set is slow (minutes); a fast subset covering the probes whose
sentences quote step counts and ratios runs by default."""

from __future__ import annotations

import math
import re
from functools import lru_cache

import pytest

from tests.conftest import EXAMPLES, diagnose_example

FAST = ["broken_loss_reduction_mismatch_sum", "broken_softmax_in_step", "broken_capacity_too_small", "broken_val_shuffled",
        "broken_metric_over_batches", "broken_op_shape_mismatch", "healthy_mlp"]


def _all_examples() -> list[str]:
    import importlib

    names = []
    for path in sorted(EXAMPLES.glob("*.py")):
        if path.stem.startswith("_") or path.stem in ("datasets", "__init__"):
            continue
        module = importlib.import_module(f"examples.{path.stem}")
        if getattr(module, "EXPECTED", None) is not None and not getattr(module, "GPU_ONLY", False):
            names.append(path.stem)
    return names


@lru_cache(maxsize=None)
def _report(name: str):
    import importlib

    expected = importlib.import_module(f"examples.{name}").EXPECTED
    return diagnose_example(name, tuple(expected.get("symptoms", ["auto"])))[1]


def _numbers(value, out: list[float]) -> list[float]:
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, dict):
        for v in value.values():
            _numbers(v, out)
    elif isinstance(value, (list, tuple)):
        out.append(float(len(value)))
        for v in value[:64]:
            _numbers(v, out)
    return out


def _step_counts(data: dict) -> set[int]:
    """Every step count the probe recorded: fields named *step*/*calls*, and the lengths of its series."""
    counts: set[int] = set()
    for key, value in data.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value) and ("step" in key or key in ("calls", "steps")):
            counts.add(int(value))
        if isinstance(value, list):
            counts.add(len(value))
            if "step" in key:
                counts.update(int(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool))
        if isinstance(value, dict):
            counts.update(int(v) for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool))
    return counts


def _matches(printed: str, numbers: list[float]) -> bool:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    value = float(printed)
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(n - value) <= tolerance or (value and abs(n - value) / abs(value) < 0.006) for n in numbers)


STEPS = re.compile(r"(?<![\w.])(\d+) (?:optimizer |training |reference |plain |more )?steps\b")
RATIO = re.compile(r"(?<![\w.+-])(\d+(?:\.\d+)?(?:e[-+]?\d+)?)x(?![\w])|\(x(\d+(?:\.\d+)?)\)")


@lru_cache(maxsize=None)
def _templates() -> dict[tuple[str, str], str]:
    from nnwizard.tree import load_trees

    return {(t.id, name): " ".join(c.evidence for c in node.conclude or []) for t in load_trees().values()
            for name, node in t.nodes.items()}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def contradictions(report) -> list[str]:
    """Sentences whose claims disagree with the quoted probe's data."""
    probes = {p.id: p for p in report.probes}
    found = []
    for h in report.hypotheses:
        for move in h.moves:
            probe = probes.get(move.probe)
            if probe is None:
                continue
            text, data = move.text, probe.data
            counts = _step_counts(data) | _step_counts(probe.params)
            for m in STEPS.finditer(text):
                n = int(m.group(1))
                if counts and n not in counts:
                    found.append(f"{h.id} / {probe.id}: '{m.group(0)}' but the probe recorded step counts {sorted(counts)[:12]}")
            numbers = _numbers(data, [])
            template = _templates().get((move.tree, move.node), "")
            for m in RATIO.finditer(text):
                printed = m.group(1) or m.group(2)
                if m.group(0) in template:  # a constant of the sentence ("lowering the rate 10x"), not a measurement
                    continue
                if not _matches(printed, numbers + [float(n) for n in counts]):
                    found.append(f"{h.id} / {probe.id}: ratio '{m.group(0)}' is none of the probe's numbers")
            ratio = _number(data.get("duplication_ratio"))
            if ratio is not None and "is a mean" in text and abs(ratio - 1) >= 0.1:
                found.append(f"{h.id} / {probe.id}: says 'mean' with duplication ratio {ratio:.2f}")
            if ratio is not None and "sums over" in text and abs(ratio - 2) >= 0.1:
                found.append(f"{h.id} / {probe.id}: says 'sum' with duplication ratio {ratio:.2f}")
    for p in report.probes:  # the probes' own summaries, shown in every report
        ratio = _number(p.data.get("duplication_ratio"))
        if ratio is not None and "is a mean" in p.summary and abs(ratio - 1) >= 0.1:
            found.append(f"{p.id}: summary says 'mean' with duplication ratio {ratio:.2f}")
    if report.verdict == "healthy" and any(p.data.get("training_raised") for p in report.probes):
        found.append("verdict healthy although training raised: " + next(p.summary for p in report.probes if p.data.get("training_raised")))
    return found


@pytest.mark.parametrize("name", FAST)
def test_sentences_agree_with_their_numbers_fast(name):
    assert contradictions(_report(name)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in _all_examples() if n not in FAST])
def test_sentences_agree_with_their_numbers_all(name):
    assert contradictions(_report(name)) == []


def test_checker_catches_a_contradiction():
    from nnwizard.report import HypothesisOut, Move, ProbeOut, Report

    report = Report(nnwizard_version="0", module="m", device="cpu", seed=0, symptoms=[], given_symptoms=[], verdict="healthy",
                    hypotheses=[HypothesisOut(id="lr-too-low", title="t", category="loop", confidence=0.6, evidence=[], fix="",
                                              moves=[Move(weight=0.6, text="loss fell 2.00x after 200 steps", tree="t",
                                                          node="n", probe="p")])],
                    probes=[ProbeOut(id="p", status="failed", outcome="x", summary="s", duration_s=0, data={"steps": 40, "ratio": 1.5}),
                            ProbeOut(id="q", status="failed", outcome="crashed", summary="raised", duration_s=0,
                                     data={"training_raised": True})])
    problems = contradictions(report)
    assert len(problems) == 3, problems
