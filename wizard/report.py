"""The report model (CONTRACT §4): one pydantic :class:`Report` built from a Diagnosis (``build``; a replay's adds
its step, ``nnwizard.replay.replay_report``). It is rendered as the §4 JSON file here (``write_json``), as markdown
(``nnwizard.markdown``) and on the terminal (``nnwizard.view``), each from the Report alone: it carries the probes'
plots and tables too (``artifacts``), so a process that receives it as JSON renders the same reports."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, PrivateAttr

import nnwizard
from nnwizard.jsonsafe import jsonable, plain_data
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
    #          | anomaly-unexplained (replay: the bundle's anomaly, which no hypothesis explains)
    reason: str


class ArtifactOut(BaseModel):
    """A probe's plot or table (``nnwizard.probes.api``'s artifacts) as plain data: what the markdown report draws.
    Not part of the §4 JSON file (see :meth:`Report.json_file`); sent with the rest of the report otherwise."""

    probe: str
    kind: str                  # line | bar | images | table
    spec: dict[str, Any]       # the artifact's own fields (name, title, series, rows...)


REPLAY_FIELDS = ("step", "bundle", "trigger", "reason", "recorded", "replayable", "why_not", "localised", "verdict_note")


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
    _written: list[str] = PrivateAttr(default_factory=list)
    distributed: dict[str, Any] | None = None  # --nproc / torchrun (CONTRACT §8): the ranks, how each ended, which probes ran where
    # a replay's report (``"mode": "replay"``, nnwizard.replay) adds what it replayed and what it found:
    step: int | None = None               # the optimizer step the bundle saved
    bundle: str | None = None             # its folder
    trigger: str | None = None            # the watch trigger that saved it, and why
    reason: str | None = None
    recorded: dict[str, Any] | None = None  # the loss, gradient norm and LRs the run recorded at that step
    replayable: bool | None = None        # whether the step could be re-executed from the saved calls (else why_not)
    why_not: str | None = None
    localised: dict[str, Any] | None = None  # the op and line the replay names (probe, phase, op, where, text)
    verdict_note: str | None = None       # why the verdict is not healthy when no hypothesis reached 0.5
    artifacts: list[ArtifactOut] = []
    isolation: dict[str, Any] = {}  # how the program was kept from the user's files: mode, why, notes, what it wrote
    ended: dict[str, Any] = {}     # a diagnosis cut short: how the process running the program ended (why, text)

    def json_file(self) -> str:
        """The §4 JSON report as written to ``--json``: the replay fields only in a replay's report (and
        ``verdict_note`` only when there is one), the artifacts left to the markdown report."""
        exclude = {"artifacts"} | (set() if self.mode == "replay" else set(REPLAY_FIELDS))
        if self.verdict_note is None:
            exclude.add("verdict_note")
        return self.model_dump_json(indent=2, exclude=exclude)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (CONTRACT §4) as Python objects: what ``json_file`` holds."""
        return json.loads(self.json_file())

    @property
    def written(self) -> list[str]:
        """The report files this diagnosis wrote (``--json``, ``--report``, saved answers)."""
        return self._written

    @property
    def findings(self) -> list[HypothesisOut]:
        """The hypotheses at finding confidence (0.5 or more), highest first."""
        return [h for h in self.hypotheses if h.confidence >= FINDING]


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
        anomaly = getattr(diagnosis.target, "anomaly", None)
        if anomaly:   # a replay: the run measured an anomaly at this step; nothing here explains it
            tried = "; ".join(f"{r.id} ({r.outcome})" for r in diagnosis.results if r.status in ("passed", "failed"))
            out.append(NotRun(probe="replay", status="failed", why="anomaly-unexplained",
                              reason=f"{anomaly}; not explained by what the replay tried: {tried or 'nothing could run'}"))
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


def build(diagnosis: Diagnosis) -> Report:
    report = _build(diagnosis)
    notebook = getattr(getattr(diagnosis.target, "script", None), "notebook", None)
    if notebook is not None:   # every location of a notebook's program reads "cell N, line M"
        from nnwizard.locations import render_all

        report = Report.model_validate(render_all(report.model_dump(), Path(notebook.path).name))
    return report


def _build(diagnosis: Diagnosis) -> Report:
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
                params=jsonable(r.params), data=jsonable(r.data), artifacts=[a.name for a in r.artifacts],
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
        script=jsonable(diagnosis.target.observed()) if getattr(diagnosis.target, "mode", "") == "script" else None,
        budget=jsonable(diagnosis.budget.as_dict()) if diagnosis.budget is not None else {},
        artifacts=[ArtifactOut(probe=r.id, kind=a.kind, spec=plain_data({f.name: getattr(a, f.name) for f in fields(a)
                                                                            if f.name != "kind"}))
                   for r in diagnosis.results for a in r.artifacts],
        distributed=_distributed(diagnosis.target),
    )


def _distributed(target) -> dict[str, Any] | None:
    run = getattr(target, "distributed", None)
    if run is None:
        return None
    out = run.summary(single_process=getattr(target, "mode", "") == "script")
    note = getattr(target, "distributed_note", None)
    if note:
        out["note"] = note
    return jsonable(out)


def write_json(report: Report, path: str | Path) -> None:
    Path(path).write_text(report.json_file() + "\n", encoding="utf-8")


def write_reports(report: Report, json_path: str | Path | None, report_path: str | Path | None) -> list[str]:
    """The §4 JSON report and the markdown report (with its plots), where asked; the paths written."""
    written = []
    if json_path:
        write_json(report, json_path)
        written.append(str(json_path))
    if report_path:
        from nnwizard.markdown import render_markdown

        render_markdown(report, report_path)
        written.append(str(report_path))
    return written
