"""The one report model: the §4 JSON file, markdown and terminal rendered from a Report alone (a process that gets
the Report as JSON renders the same reports), a replay's report with its step, its fields only in replay reports."""

from __future__ import annotations

import io
import json
import math

from rich.console import Console

from nnwizard.engine import Diagnosis
from nnwizard.markdown import render_markdown
from nnwizard.probes.api import LinePlot, ProbeResult, Table
from nnwizard.report import REPLAY_FIELDS, Report, build, write_reports
from nnwizard.view import TerminalView

from conftest import load_example


def _report() -> Report:
    target = load_example("healthy_mlp")
    plot = LinePlot("loss", "The loss", {"train": [1.0, 0.5, math.nan]}, x=range(3))
    table = Table("rows", "Some rows", ["a", "b"], [[1, 2], [3, 4]], marked=[1])
    result = ProbeResult("passed", "ok", "fine", id="trace-run", artifacts=[plot, table])
    return build(Diagnosis(target, 0, ["flat"], ["auto"], results=[result]))


def test_the_json_file_holds_the_contract_fields_and_not_the_artifacts_or_replay_fields(tmp_path):
    report = _report()
    data = json.loads(report.json_file())
    assert data["probes"][0]["artifacts"] == ["loss", "rows"] and "artifacts" not in {k for k in data if k != "probes"}
    assert not set(REPLAY_FIELDS) & set(data)
    replay = report.model_copy(update={"mode": "replay", "step": 7, "bundle": "b", "trigger": "nonfinite"})
    replayed = json.loads(replay.json_file())
    assert replayed["mode"] == "replay" and replayed["step"] == 7 and "why_not" in replayed and "verdict_note" not in replayed


def test_markdown_is_rendered_from_the_report_alone_even_after_a_json_round_trip(tmp_path):
    report = _report()
    sent = Report.model_validate_json(report.model_dump_json())   # (as a supervisor process would receive it)
    for name, r in (("here", report), ("sent", sent)):
        text = render_markdown(r, tmp_path / f"{name}.md").read_text()
        assert "### Some rows (`trace-run`)" in text and "| ⟶ **3** | **4** |" in text
        assert f"![The loss]({name}_files/trace-run-loss.png)" in text and (tmp_path / f"{name}_files" / "trace-run-loss.png").exists()
    replay = report.model_copy(update={"mode": "replay", "step": 7, "bundle": "b", "trigger": "nonfinite", "reason": "NaN loss",
                                       "replayable": False, "why_not": "no backward() was seen in this step"})
    text = render_markdown(replay, tmp_path / "replay.md").read_text().split("\n")
    assert text[2] == "**Replay of step 7** (bundle `b`, trigger `nonfinite`): NaN loss."
    assert "The step could not be re-executed: no backward() was seen in this step." in text


def test_write_reports_and_the_terminal_summary(tmp_path):
    report = _report()
    written = write_reports(report, tmp_path / "r.json", tmp_path / "r.md")
    assert written == [str(tmp_path / "r.json"), str(tmp_path / "r.md")]
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == report.verdict
    out = io.StringIO()
    TerminalView(Console(file=out, width=100)).summary(report, written)
    assert f"Verdict: {report.verdict}" in out.getvalue() and "replay of step" not in out.getvalue()
    out = io.StringIO()
    TerminalView(Console(file=out, width=100)).summary(report.model_copy(update={"mode": "replay", "step": 3}), [])
    assert "replay of step 3" in out.getvalue() and "localised: no op named" in out.getvalue()
