"""The JSON report (CONTRACT §4): a pydantic model built from a Diagnosis."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from typing import TYPE_CHECKING

from pydantic import BaseModel

import nnwizard
from nnwizard.probes.api import could_not_run
from nnwizard.ranking import FINDING

if TYPE_CHECKING:  # (the supervisor reads and writes reports without importing torch)
    from nnwizard.engine import Diagnosis

Verdict = Literal["problems-found", "healthy", "inconclusive"]


class Move(BaseModel):
    weight: float
    text: str
    tree: str
    node: str
    probe: str | None = None


class HypothesisOut(BaseModel):
    id: str
    title: str
    category: str
    confidence: float
    evidence: list[str]
    fix: str
    fix_here: str = ""   # the same fix in the program's own terms: the object, the line, the value measured better
    snippet: str = ""
    meaning: str = ""
    prior: float = 0.0
    moves: list[Move] = []


class ProbeOut(BaseModel):
    id: str
    status: Literal["passed", "failed", "errored", "skipped"]
    outcome: str
    summary: str
    duration_s: float
    params: dict[str, Any] = {}
    data: dict[str, Any] = {}
    artifacts: list[str] = []


class NotRun(BaseModel):
    """A probe whose evidence is missing (errored, timed out, or could not run), a training crash that no
    hypothesis explains, or a run whose loss did not move that no hypothesis explains: each keeps the
    verdict from being ``healthy``."""

    probe: str
    status: str
    why: str  # errored | timed-out | raised | budget | not-needed | precondition | ... | training-raised | loss-unmoved
    reason: str


class Report(BaseModel):
    nnwizard_version: str
    module: str
    device: str
    seed: int
    symptoms: list[str]
    given_symptoms: list[str]
    verdict: Verdict
    hypotheses: list[HypothesisOut]
    probes: list[ProbeOut]
    not_run: list[NotRun] = []
    answers: dict[str, Any] = {}
    trees: list[str] = []
    task: str = ""
    task_source: str = ""  # how the task was decided: TASK, the loss called, or a guess (then: set TASK)
    interrupted: bool = False
    duration_s: float = 0.0
    environment: dict[str, str] = {}
    mode: str = "module"                 # "script" for --script (CONTRACT §6)
    script: dict[str, Any] | None = None  # script mode: what the run did (models, optimizers, trace, output)
    budget: dict[str, Any] = {}  # the cost model: step time measured, budget, plain steps used
    isolation: dict[str, Any] = {}  # how the program was kept from the user's files: mode, why, notes, what it wrote
    ended: dict[str, Any] = {}     # a diagnosis cut short: how the process running the program ended (why, text)


CURVE_PROBES = ("triage-run", "trace-run")   # the run's own loss curve (module mode, script mode)


def _found(diagnosis: Diagnosis) -> bool:
    """A hypothesis reached ``FINDING`` confidence."""
    return any(h.confidence >= FINDING for h in diagnosis.ranked)


def not_run(diagnosis: Diagnosis) -> list[NotRun]:
    """What keeps a session without findings from being healthy: every probe the walked trees called
    for that could not measure, a training crash that no hypothesis explains, and a run whose loss
    did not move at all when no hypothesis explains that (the checks found the symptom, not its cause:
    "healthy" would contradict the curve the report shows)."""
    out = []
    if not _found(diagnosis):
        out += [NotRun(probe=r.id, status=r.status, why="loss-unmoved", reason=r.summary) for r in diagnosis.results
                if r.id in CURVE_PROBES and r.status == "failed" and r.outcome == "flat"]
    for r in diagnosis.results:
        if could_not_run(r):
            why = "timed-out" if "timeout_s" in r.data else "errored" if r.status == "errored" else str(r.data["cannot_run"])
            out.append(NotRun(probe=r.id, status=r.status, why=why, reason=r.summary))
        elif r.data.get("training_raised") and r.outcome in ("unclassified", "other"):  # module mode, script mode
            out.append(NotRun(probe=r.id, status=r.status, why="training-raised", reason=r.summary))
    return out


def verdict(diagnosis: Diagnosis, missing: list[NotRun] | None = None) -> Verdict:
    """CONTRACT §4: a finding makes ``problems-found``; ``healthy`` only when every probe the
    symptoms called for completed and training did not raise; otherwise ``inconclusive``."""
    if _found(diagnosis):
        return "problems-found"
    ran = [r for r in diagnosis.results if r.status in ("passed", "failed")]
    missing = not_run(diagnosis) if missing is None else missing
    if diagnosis.interrupted or not ran or missing or getattr(diagnosis.target, "crashed", False) or getattr(diagnosis.target, "untrained", False) or any(r.data.get("training_raised") for r in diagnosis.results):
        return "inconclusive"
    return "healthy"


def _jsonable(value: Any) -> Any:
    """Probe data made JSON-safe: NaN/Inf as strings, tensors and numpy values as Python numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return str(value)


def build(diagnosis: Diagnosis) -> Report:
    from nnwizard.environment import collect

    missing = not_run(diagnosis)
    return Report(
        nnwizard_version=nnwizard.__version__,
        module=diagnosis.target.spec,
        device=str(diagnosis.target.device),
        seed=diagnosis.seed,
        symptoms=diagnosis.symptoms,
        given_symptoms=diagnosis.given_symptoms,
        verdict=verdict(diagnosis, missing),
        not_run=missing,
        hypotheses=[
            HypothesisOut(
                id=h.id, title=h.title, category=h.category, confidence=h.confidence,
                evidence=[e.text for e in h.evidence if e.weight > 0], fix=h.fix, fix_here=h.fix_here, snippet=h.snippet,
                meaning=h.meaning, prior=h.prior, moves=[Move(**asdict(e)) for e in h.evidence],
            )
            for h in diagnosis.ranked
        ],
        probes=[
            ProbeOut(
                id=r.id, status=r.status, outcome=r.outcome, summary=r.summary, duration_s=r.duration_s,
                params=_jsonable(r.params), data=_jsonable(r.data), artifacts=[a.name for a in r.artifacts],
            )
            for r in diagnosis.results
        ],
        answers=diagnosis.answers,
        trees=diagnosis.trees,
        task=diagnosis.target.task,
        task_source=getattr(diagnosis.target, "task_source", ""),
        interrupted=diagnosis.interrupted,
        duration_s=diagnosis.duration_s,
        environment=collect(diagnosis.target.device),
        mode=getattr(diagnosis.target, "mode", "module"),
        script=_jsonable(diagnosis.target.observed()) if getattr(diagnosis.target, "mode", "") == "script" else None,
        budget=_jsonable(diagnosis.budget.as_dict()) if diagnosis.budget is not None else {},
    )


def write_json(report: Report, path: str | Path) -> None:
    Path(path).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
