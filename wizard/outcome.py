"""What a supervised diagnosis reports, however its worker ended: the report it sent, or the last one it sent with
the way its process ended as the reason the verdict cannot be healthy; then the JSON, markdown and answers files.
Importable without torch."""

from __future__ import annotations

import sys
from pathlib import Path

import nnwizard
from nnwizard.errors import ExitCode, UsageError
from nnwizard.processes import SIGNALS, WHAT_SIGNAL, internal_error


def how_it_ended(session) -> dict | None:
    """None when the worker finished its work; else how the program's process ended, in words."""
    if session.final and not session.worker.killed:
        return None
    end = session.worker.ended()
    where = session.phase + (f", after {session.progress['step']} optimizer steps"
                             if session.progress.get("step") and "observed" in session.phase else "")
    exited = next((n for n in reversed(session.notes) if "os._exit" in n), None)
    if session.worker.killed == "interrupted" or (session.interrupts and not session.worker.killed):
        why, text = "interrupted", f"interrupted (Ctrl-C) during {where}; the worker did not finish its partial report in time"
    elif session.worker.killed:
        why, text = "time-limit", f"during {where}: {session.worker.killed}"
    elif end["signal"]:
        name = SIGNALS.get(end["signal"], f"signal {end['signal']}")
        why, text = "crashed", f"the program's process died of {name} ({WHAT_SIGNAL.get(name, 'a signal')}) during {where}"
    else:
        why = "exited"
        text = (f"the program's process ended with exit code {end['exit']} during {where}, before the diagnosis "
                f"finished" + (f" ({exited})" if exited else ""))
    stack = _python_stack(session.worker.log_tail(40))
    return {"why": why, "text": text, "phase": session.phase, "exit_code": end["exit"], "signal": end["signal"],
            "steps": session.progress.get("step"), "stack": stack, "notes": [n for n in session.notes if n]}


def _python_stack(lines: list[str]) -> list[str]:
    """Python's stack, as faulthandler wrote it to the worker's log at a fatal signal (innermost first)."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(("Fatal Python error", "Current thread",
                                                                                   "Thread 0x"))), None)
    if start is None:
        return []
    return [line.strip() for line in lines[start:] if line.strip().startswith("File ")][:8]


def collect(session, opts):
    """``(report, internal)``: the Report of a supervised diagnosis however its worker ended, and the worker's
    internal error (None when there was none). UsageError when the worker refused the input before it reported."""
    from nnwizard.report import Report

    if session.error and session.error.get("code") == int(ExitCode.USAGE) and not session.report:
        raise UsageError(session.error["message"])
    internal = session.error if session.error and session.error.get("code") == int(ExitCode.INTERNAL) else None
    ended = how_it_ended(session)
    data = session.report
    if data is None and ended is None and internal is None:
        ended = {"why": "exited", "text": "the worker ended without a report", "phase": session.phase}
    if data is None or ended is not None or internal is not None:
        data = _partial(data, session, opts, ended, internal)
    data["isolation"] = {**session.decision.as_dict(), **_files(session)}
    if not session.keep and data.get("script"):
        for item in data["script"].get("written") or []:
            item["saved_as"] = ""
        data["script"]["scratch"] = None
    if session.interrupts and (ended is not None or not session.final):   # (a diagnosis that had finished stands)
        data["interrupted"] = True
    report = Report.model_validate(data)
    report._written = write(report, session, opts)
    return report, internal


def finish(session, opts, view) -> int:
    """The ``diagnose`` command's end: the reports written, the summary shown, the exit code (CONTRACT §5, §5a)."""
    from nnwizard.options import exit_code, failure_reasons

    report, internal = collect(session, opts)
    view.summary(report, report.written)
    if internal is not None:
        print(f"nnwizard: {internal_error(internal)}", file=sys.stderr)
        return int(ExitCode.INTERNAL)
    if session.keep:
        print(f"nnwizard: the scratch folder is kept: {session.folder}", file=sys.stderr)
    code = exit_code(report, opts)
    if code == ExitCode.FINDINGS:
        view.failed(failure_reasons(report, opts))
    return int(code)


def _files(session) -> dict:
    """What the program wrote and deleted, as isolation recorded it (os: the overlay; python: the sandbox)."""
    changes = session.worker.changes if session.worker else {}
    if changes:
        ours = str(session.folder)
        return {"written": [p for p in changes.get("written", []) if not p.startswith(ours) and not p.endswith("/")][:500],
                "deleted": changes.get("deleted", [])[:500]}
    obs = (session.report or {}).get("script") or session.observed or {}
    return {"written": [w["path"] for w in obs.get("written") or []], "deleted": list(obs.get("deleted") or [])}


def _partial(data: dict | None, session, opts, ended: dict | None, internal: dict | None) -> dict:
    """The report of a diagnosis cut short: what the worker last sent (or what is known without it), the way its
    process ended as a reason the verdict cannot be healthy."""
    if data is None:
        data = {"nnwizard_version": nnwizard.__version__, "module": opts.script or opts.module or "", "device": opts.device,
                "seed": opts.seed, "symptoms": [], "given_symptoms": list(opts.symptoms), "verdict": "inconclusive",
                "hypotheses": [], "probes": [], "mode": "script" if opts.script else "module",
                "script": session.observed,
                "environment": {"nnwizard": nnwizard.__version__, "python": sys.version.split()[0]}}
    data = dict(data)
    data.setdefault("not_run", [])
    if ended is not None:
        data["ended"] = ended
        data["not_run"] = list(data["not_run"]) + [{"probe": "program", "status": "errored", "why": ended["why"],
                                                    "reason": ended["text"]}]
    if internal is not None:
        data["not_run"] = list(data["not_run"]) + [{"probe": "nnwizard", "status": "errored", "why": "internal-error",
                                                    "reason": internal.get("message", "")}]
    found = any(h.get("confidence", 0) >= 0.5 for h in data.get("hypotheses") or [])
    data["verdict"] = "problems-found" if found else "inconclusive"
    return data


def write(report, session, opts) -> list[str]:
    from nnwizard.report import write_reports

    written = write_reports(report, opts.json_path, opts.report_path)
    answers = session.answers.get("answers") if session.answers else None
    symptoms = session.answers.get("symptoms") if session.answers else None
    if opts.interactive and (answers or symptoms):
        from nnwizard.prompts import save_answers

        path = opts.save_answers or Path("nnwizard-answers.yaml")
        save_answers(path, symptoms or [], answers or {})
        written.append(f"{path} (replay with --answers {path})")
    return written


