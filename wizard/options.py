"""A diagnosis's options (the ``diagnose`` command's flags) and the checks that need nothing but them: the
supervisor makes them before any worker starts (a bad flag is exit 2 at once, without torch). Importable
without torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from nnwizard.errors import ExitCode, UsageError
from nnwizard.tree import SYMPTOMS


@dataclass
class Options:
    module: str | None = None
    symptoms: list[str] = field(default_factory=list)
    answers: Path | None = None
    json_path: Path | None = None
    report_path: Path | None = None
    device: str = "auto"
    seed: int = 0
    fail_on: float | None = None
    interactive: bool = False
    trees_dir: Path | None = None
    probe_timeout: float | None = None
    budget: float | None = None  # seconds for the whole diagnosis (None: from the measured step time)
    save_answers: Path | None = None
    quiet: bool = False
    script: str | None = None          # script mode (CONTRACT §6): the script path or dotted name
    script_args: list[str] = field(default_factory=list)
    max_steps: int | None = None
    preset_answers: dict[str, str] = field(default_factory=dict)   # answers given already (a CPU re-run's)

    def to_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict) -> "Options":
        paths = {"answers", "json_path", "report_path", "trees_dir", "save_answers"}
        known = {f.name for f in fields(cls)}
        return cls(**{k: (Path(v) if k in paths and v is not None else v) for k, v in data.items() if k in known})


def check_outputs(opts: Options) -> None:
    for flag, path in (("--json", opts.json_path), ("--report", opts.report_path)):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: the folder {Path(path).resolve().parent} does not exist")
    if opts.budget is not None and not opts.budget > 0:
        raise UsageError(f"--budget {opts.budget}: expected a positive number of seconds")
    unknown = [s for s in opts.symptoms if s not in SYMPTOMS]
    if unknown:
        raise UsageError(f"--symptom {unknown[0]!r}: unknown; choose from {', '.join(SYMPTOMS)}")


def check_target(opts: Options) -> None:
    if bool(opts.module) == bool(opts.script):
        raise UsageError("give either --module M (the training-module contract) or --script train.py (an unmodified script)")
    if opts.module and opts.script_args:
        raise UsageError(f"arguments after the options ({' '.join(opts.script_args)}) are passed to a --script; --module takes none")
    if opts.max_steps is not None and opts.max_steps < 1:
        raise UsageError(f"--max-steps {opts.max_steps}: expected at least 1")


def exit_code(report, opts: Options) -> ExitCode:
    """CONTRACT §5: 130 for a partial report after Ctrl-C, 1 for a finding at ``--fail-on``, else 0."""
    if report.interrupted:
        return ExitCode.INTERRUPTED
    if opts.fail_on is not None and any(h.confidence >= opts.fail_on for h in report.hypotheses):
        return ExitCode.FINDINGS
    return ExitCode.OK
