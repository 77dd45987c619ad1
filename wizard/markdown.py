"""The markdown report, rendered from the Report alone: environment, symptoms, ranked hypotheses with evidence
and fixes, the probe table, and the probes' plots and tables (PNG files in a folder next to the .md); a
replay's report opens with the replayed step and the op it localised."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from nnwizard.plots import render
from nnwizard.probes.api import BarPlot, ImageGrid, LinePlot, Table
from nnwizard.ranking import FINDING
from nnwizard.report import Report

ARTIFACTS = {"line": LinePlot, "bar": BarPlot, "images": ImageGrid, "table": Table}

STATUS_MARK = {"passed": "✅ passed", "failed": "❌ failed", "errored": "⚠️ errored", "skipped": "⏭ skipped"}


_CODE = re.compile(r"(`+)(.+?)\1")
_SPECIAL = re.compile(r"([\\*_<>|])")


def text(value) -> str:
    """Text that came from the program or was measured in it (errors, printed lines, names), shown as itself: the
    characters markdown reads as emphasis, HTML or table cells are escaped, except inside `code spans`."""
    value, out, last = str(value), [], 0
    for span in _CODE.finditer(value):
        out += [_SPECIAL.sub(r"\\\1", value[last:span.start()]), span.group(0)]
        last = span.end()
    out.append(_SPECIAL.sub(r"\\\1", value[last:]))
    return "".join(out)


def fence(lines: list[str]) -> str:
    """A code fence longer than any run of backticks in ``lines`` (printed output may hold some)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def _cell(value) -> str:
    return text(value).replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list], marked: list[int] = ()) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for i, row in enumerate(rows):
        cells = [_cell(c) for c in row]
        if i in marked:
            cells = [f"**{c}**" if c else c for c in cells]
            cells[0] = "⟶ " + cells[0]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _distributed_lines(d: dict) -> list[str]:
    """The ranks of a distributed run (--nproc, torchrun): how each ended, the stacks of a hang, where probes ran."""
    out = ["## Ranks", "", f"{d['world_size']} ranks ({d.get('launcher')}, backend {d.get('backend') or 'none'}, "
                           f"{d.get('device')}), {d.get('seconds', 0):.1f} s." + (f" {d['note']}." if d.get("note") else ""), ""]
    if d.get("aborted"):
        out += [f"The watchdog stopped every rank: {d['aborted'].get('text', '')}.", ""]
    out += markdown_table(["rank", "steps", "collectives", "ended", "files written"],
                  [[r["rank"], r.get("steps"), r.get("collectives"), r["ended"], ", ".join(r.get("files_written", [])[:4])]
                   for r in d["ranks"]]) + [""]
    out += [f"Probes on every rank's recording: {', '.join(f'`{p}`' for p in d.get('probes_on_all_ranks', []))}."]
    if d.get("probes_on_one_rank"):
        out += ["", f"On one process: {d['probes_on_one_rank']}."]
    out += [""]
    for r in d["ranks"]:
        if r.get("stack"):
            out += [f"### Rank {r['rank']}'s Python stacks when it was stopped", "", "```", r["stack"].rstrip()[-4000:], "```", ""]
    return out


def _took(report) -> str:
    """The probes' time, and in script mode the observed run's before it (not counted in duration_s)."""
    observed = (report.script or {}).get("seconds")
    if observed:
        return f"{report.duration_s:.1f} s of probes after the script's {observed:.1f} s observed run"
    return f"{report.duration_s:.1f} s"


def _replay_head(report: Report) -> list[str]:
    """A replay's opening lines: the step, what triggered its bundle, the op it localised."""
    head = [f"**Replay of step {report.step}** (bundle `{report.bundle}`, trigger `{report.trigger}`): {report.reason}.", ""]
    if report.localised:
        loc = report.localised
        head += [f"**Localised:** {loc['text']} ({loc['phase']}; found by {loc['probe']}).", ""]
    if not report.replayable:
        head += [f"The step could not be re-executed: {report.why_not}.", ""]
    return head


def render_markdown(report: Report, path: str | Path) -> Path:
    path = Path(path)
    assets = path.parent / f"{path.stem}_files"
    out: list[str] = [f"# nnwizard diagnosis: `{report.module}`", ""]
    if report.mode == "replay":
        out += _replay_head(report)
    if report.interrupted:
        out += ["> **Interrupted**: this is a partial report of what was measured before Ctrl-C.", ""]
    if report.ended:
        out += [f"> **Cut short**: {text(report.ended.get('text', ''))}", ""]
        out += [f">     {line}" for line in report.ended.get("stack") or []] + ([""] if report.ended.get("stack") else [])
    findings = [h for h in report.hypotheses if h.confidence >= FINDING]
    raised = next((n.reason for n in report.not_run if n.why == "training-raised"), None)
    unmoved = next((n.reason for n in report.not_run if n.why == "loss-unmoved"), None)
    verdict_line = {
        "problems-found": f"**{len(findings)} problem{'s' if len(findings) != 1 else ''} found**",
        "healthy": "**Healthy**: no hypothesis reached 0.5 confidence",
        "inconclusive": (f"**Inconclusive**: {text(raised)}, and no hypothesis explains it (a crash is never healthy)" if raised
                         else f"**Inconclusive**: {text(unmoved)}, and no hypothesis reached 0.5 to explain it (a loss that "
                         "does not move is not a clean bill of health)" if unmoved
                         else f"**Inconclusive**: no finding, but {len(report.not_run)} check{'s' if len(report.not_run) != 1 else ''} "
                         "could not run (see *Not run*), so this is not a clean bill of health" if report.not_run
                         else "**Inconclusive**: too little could be measured"),
    }[report.verdict]
    out += [
        f"Verdict: {verdict_line}. Symptoms: {', '.join(report.symptoms) or 'none measured'}"
        + (f" (given: {', '.join(report.given_symptoms)})" if report.given_symptoms != report.symptoms else "")
        + f". Task: {report.task}" + (f" ({report.task_source})" if report.task_source else "")
        + f". Seed {report.seed}, {_took(report)}.",
        "",
        *([f"Isolation: {report.isolation.get('mode')}" + (f" ({text(report.isolation['why'])})" if report.isolation.get("why") else "")
           + (f"; {report.isolation['trackers']}" if report.isolation.get("trackers") else "") + ".", ""]
          if report.isolation else []),
        "## Environment",
        "",
        *markdown_table(["", ""], [[k, v] for k, v in report.environment.items()]),
        "",
        "## Ranked hypotheses",
        "",
    ]
    if not report.hypotheses:
        out += ["No hypothesis gathered supporting evidence.", ""]
    else:
        out += markdown_table(
            ["#", "hypothesis", "category", "confidence", "strongest evidence"],
            [[i + 1, f"`{h.id}` {h.title}", h.category, f"{h.confidence:.2f}", (h.evidence or ["-"])[0]]
             for i, h in enumerate(report.hypotheses)],
        ) + [""]
        for i, h in enumerate(report.hypotheses):
            tag = "finding" if h.confidence >= FINDING else "weak"
            out += [f"### {i + 1}. {h.title} (`{h.id}`, {h.confidence:.2f}, {tag})", "", h.meaning, "", "Evidence (weight, measured):", ""]
            out += [f"- {m.weight:+.2f} {text(m.text)} _(tree `{m.tree}`, node `{m.node}`)_" for m in h.moves]
            out += ["", f"**Fix.** {h.fix}", ""]
            if h.fix_here:
                out += [f"**In this program.** {text(h.fix_here)}", ""]
            if h.snippet:
                out += ["```python", h.snippet.rstrip(), "```", ""]
    if report.not_run:
        out += ["## Not run", "", "These probes could not measure (they add no evidence for or against anything), or "
                "training raised in a way no hypothesis explains (why: training-raised), or the loss did not move and no "
                "hypothesis explains it (why: loss-unmoved).", "",
                *markdown_table(["probe", "status", "why", "reason"], [[f"`{n.probe}`", n.status, n.why, n.reason] for n in report.not_run]), ""]
    if report.script:
        from nnwizard.script_view import markdown_lines

        out += markdown_lines(report.script)
    if report.distributed:
        out += _distributed_lines(report.distributed)
    if report.answers:
        out += ["## Answers", "", *markdown_table(["question", "answer"], [[k, v] for k, v in report.answers.items()]), ""]
    out += ["## Probes", ""]
    out += markdown_table(
        ["probe", "status", "outcome", "summary", "seconds"],
        [[f"`{p.id}`", STATUS_MARK[p.status], p.outcome, p.summary, f"{p.duration_s:.2f}"] for p in report.probes],
    ) + [""]
    for item in report.artifacts:
        artifact = ARTIFACTS[item.kind](**item.spec)
        if isinstance(artifact, Table):
            out += [f"### {artifact.title} (`{item.probe}`)", "", *markdown_table(artifact.columns, artifact.rows, artifact.marked), ""]
            continue
        png = render(artifact, assets, item.probe)
        if png is not None:
            out += [f"### {artifact.title} (`{item.probe}`)", "", f"![{artifact.title}]({assets.name}/{png.name})", ""]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path
