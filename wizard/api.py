"""The Python API: ``nnwizard.diagnose(...)`` runs the diagnosis the ``diagnose`` command runs and returns its report.

    import nnwizard
    d = nnwizard.diagnose(script="train.py", args=["--epochs", "1"], symptoms=["auto"])
    d.verdict                           # "problems-found" | "healthy" | "inconclusive"
    d.hypotheses[0].id, d.hypotheses[0].confidence, d.hypotheses[0].evidence, d.hypotheses[0].fix
    d.findings                          # the hypotheses at confidence 0.5 or more
    d.to_dict()                         # the JSON report (CONTRACT §4)

Every call runs the program as the ``diagnose`` command does: in a worker process under isolation
(``nnwizard.supervisor.report``; ``supervisor.probe`` for one probe), so that nothing the program does reaches the
caller's process or files. Bad input raises :class:`nnwizard.errors.UsageError` (an NNWizardError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from nnwizard.options import Options, check, parse_fail_on


def options(script: str | Path | None = None, args: Iterable[str] | None = None, *, module: str | None = None,
            symptoms: Iterable[str] | None = ("auto",), device: str = "auto", seed: int = 0,
            max_steps: int | None = None, budget: float | None = None, probe_timeout: float | None = None,
            json: str | Path | None = None, report: str | Path | None = None, trees: str | Path | None = None,
            fail_on: str | float | None = None, strict: bool = False) -> Options:
    """The :class:`~nnwizard.options.Options` of a non-interactive diagnosis, checked (UsageError on bad input)."""
    opts = Options(module=module, script=str(script) if script is not None else None, script_args=[str(a) for a in args or []],
                   symptoms=list(symptoms or []), device=device, seed=seed, max_steps=max_steps, budget=budget,
                   probe_timeout=probe_timeout, json_path=Path(json) if json else None,
                   report_path=Path(report) if report else None, trees_dir=Path(trees) if trees else None,
                   fail_on=parse_fail_on(fail_on), strict=strict, interactive=False, quiet=True)
    check(opts)
    return opts


def diagnose(script: str | Path | None = None, args: Iterable[str] | None = None, *, module: str | None = None,
             symptoms: Iterable[str] | None = ("auto",), device: str = "auto", seed: int = 0,
             max_steps: int | None = None, budget: float | None = None, probe_timeout: float | None = None,
             json: str | Path | None = None, report: str | Path | None = None, trees: str | Path | None = None,
             isolation: str = "auto", verbose: bool = False):
    """Diagnose a script (``script=``, run as ``python script ARGS`` would; a notebook ``.ipynb`` too) or a training
    module (``module=``, CONTRACT §1) and return the report (:class:`nnwizard.report.Report`). ``json``/``report``
    also write the JSON and markdown reports; ``isolation``: as ``--isolation`` (auto, os, python, none);
    ``verbose`` shows the progress on stderr as the command does."""
    opts = options(script, args, module=module, symptoms=symptoms, device=device, seed=seed, max_steps=max_steps,
                   budget=budget, probe_timeout=probe_timeout, json=json, report=report, trees=trees)
    return run(opts, isolation, verbose)


def run(opts: Options, isolation: str = "auto", verbose: bool = False):
    """The report of ``opts`` from a supervised worker (in this process when ``NNWIZARD_IN_PROCESS=1``, as the command
    line allows for benchmarks)."""
    import os

    view = None
    if verbose:
        from nnwizard.view import TerminalView

        view = TerminalView()
    if os.environ.get("NNWIZARD_IN_PROCESS") == "1":
        from nnwizard.session import run as in_process

        return in_process(opts, listener=view)
    from nnwizard.supervisor import report as supervised

    return supervised(opts, isolation, view)
