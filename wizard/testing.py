"""Assertions for a test suite (pytest or any other): a training script checked the way ``nnwizard diagnose`` checks
it, failing with an ``AssertionError`` that lists what was found, the numbers measured and the fix.

    from nnwizard.testing import assert_no_training_bugs, assert_overfits_one_batch

    def test_training_is_sound():
        assert_no_training_bugs("train.py", args=["--epochs", "1"])

    def test_learns_one_batch():
        assert_overfits_one_batch("train.py", args=["--epochs", "1"])

Both return what they measured (the report; the probe's result) so a test can look further.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from nnwizard.options import exit_code, failure_reasons
from nnwizard.ranking import FINDING


class TrainingBugsFound(AssertionError):
    """``assert_no_training_bugs`` failed: ``report`` holds the whole diagnosis."""

    def __init__(self, message: str, report: Any):
        super().__init__(message)
        self.report = report


class DoesNotOverfit(AssertionError):
    """``assert_overfits_one_batch`` failed: ``result`` is the ``script-overfit`` probe's result."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


def assert_no_training_bugs(script: str | Path | None = None, args: Iterable[str] | None = None, *,
                            module: str | None = None, symptoms: Iterable[str] | None = ("auto",),
                            fail_on: str | float = 0.5, allow_inconclusive: bool = False, **options: Any):
    """Diagnose ``script`` (or ``module``) and fail when a hypothesis reaches ``fail_on`` (0.5: every finding), when
    the program raised, or (unless ``allow_inconclusive``) when the verdict is inconclusive: the checks that could
    tell could not run, so "no bug" would not be measured. ``options``: those of :func:`nnwizard.diagnose`
    (``device``, ``seed``, ``max_steps``, ``budget``, ``json``, ``report``, ``isolation``...). Returns the report."""
    __tracebackhide__ = True
    from nnwizard.api import options as make_options
    from nnwizard.api import run

    isolation = options.pop("isolation", "auto")
    opts = make_options(script, args, module=module, symptoms=symptoms, fail_on=fail_on, strict=not allow_inconclusive,
                        **options)
    report = run(opts, isolation)
    if exit_code(report, opts):
        raise TrainingBugsFound(bugs_message(report, opts), report)
    return report


def bugs_message(report: Any, opts: Any) -> str:
    """The failure of :func:`assert_no_training_bugs`: the reasons, then each finding with its evidence and fix."""
    name = Path(report.module).name if report.module else "the program"
    lines = [f"nnwizard: {name} is not free of training bugs (verdict {report.verdict})"]
    lines += [f"  {reason}" for reason in failure_reasons(report, opts)]
    threshold = opts.threshold if opts.threshold is not None else FINDING
    for h in [h for h in report.hypotheses if h.confidence >= threshold]:
        lines.append("")
        lines.append(f"{h.id} (confidence {h.confidence:.2f}): {h.title}")
        lines += [f"    measured: {e}" for e in h.evidence[:4]]
        lines.append(f"    fix: {h.fix_here or h.fix}")
    error = (report.script or {}).get("error") if report.script else None
    if error:
        lines.append("")
        lines.append(f"the program raised {error.get('type')}" + (f" at {error['where']}" if error.get("where") else "")
                     + f": {error.get('message', '')}")
    if report.verdict == "inconclusive" and report.not_run:
        lines.append("")
        lines.append("could not measure:")
        lines += [f"    {n.probe} ({n.why}): {n.reason}" for n in report.not_run[:6]]
    if report.written:
        lines.append("")
        lines += [f"report: {w}" for w in report.written]
    return "\n".join(lines)


def assert_overfits_one_batch(script: str | Path | None = None, args: Iterable[str] | None = None, *,
                              module: str | None = None, steps: int = 40, **options: Any):
    """Run the script's own loop again with its first batch at every step (the ``script-overfit`` probe) and fail
    unless the loss on that batch falls towards zero: the check the training checklists call a regression test for
    the training system. Returns the probe's result (``.data`` holds the losses' first and last values)."""
    __tracebackhide__ = True
    from nnwizard.api import options as make_options
    from nnwizard.locations import render
    from nnwizard.probes.api import ProbeResult
    from nnwizard.supervisor import probe

    isolation = options.pop("isolation", "auto")
    opts = make_options(script, args, module=module, **options)
    if opts.module:
        from nnwizard.errors import UsageError

        raise UsageError("assert_overfits_one_batch runs a script's own loop: give script=, not module=")
    sent = probe(opts, "script-overfit", {"steps": steps}, isolation)
    name = Path(opts.script).name
    if sent.get("result") is None:   # the worker's process ended before it measured
        raise DoesNotOverfit(render(f"nnwizard: {name} could not be measured: {sent['ended'].get('text')}"), None)
    result = ProbeResult(**sent["result"])
    if result.status == "passed":
        return result
    if result.status in ("errored", "skipped") or result.data.get("cannot_run"):
        why = f"could not be measured: {result.summary}"
    else:
        why = f"did not overfit one batch ({result.outcome}): {result.summary}"
    error = sent.get("error")
    if error is not None:
        why += (f"\nthe program's own run raised {error['type']}" + (f" at {error['where']}" if error.get("where") else "")
                + f": {error['message']}")
    raise DoesNotOverfit(render(f"nnwizard: {name} {why}"), result)
