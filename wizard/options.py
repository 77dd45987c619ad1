"""A diagnosis's options, their checks and the exit code of its outcome, without importing torch: the command line
rejects bad usage at once (a missing script, an unknown symptom) and the Python API shares the same rules.

Exit codes (CONTRACT §5, §5a): 0 the diagnosis ran · 1 a finding at or above ``fail_on``; with ``fail_on`` also a
program that raised; with ``strict`` (``fail_on`` 0.5 unless given) also an ``inconclusive`` verdict · 2 bad usage ·
3 an internal error · 130 interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nnwizard.errors import ExitCode, UsageError

SYMPTOMS: dict[str, str] = {
    "nan": "loss is NaN or Inf",
    "flat": "loss does not move",
    "oscillating": "loss jumps around without progress",
    "overfitting": "train loss falls, validation does not",
    "underfitting": "train and validation both stall high",
    "val-suspicious": "validation too good, or noisier / worse than it should be",
    "crash": "training raises an exception",
    "not-reproducible": "same seed, different results",
    "auto": "I don't know: measure it with a short run",
}
FAIL_ON_NAMES = {"low": 0.3, "medium": 0.5, "high": 0.8}
STRICT_FAIL_ON = 0.5


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
    strict: bool = False               # §5a: an inconclusive verdict fails too (fail_on 0.5 unless given)
    nproc: int | None = None           # distributed training (CONTRACT §8): run the script on N ranks
    distributed: object = None         # the ranks' merged recordings (nnwizard.distributed), for the cross-rank audits
    preset_answers: dict[str, str] = field(default_factory=dict)   # answers given already (a CPU re-run's)

    PATHS = ("answers", "json_path", "report_path", "trees_dir", "save_answers")

    def to_json(self) -> dict:
        """The options a worker is started with (``distributed``, an object in the process that merged the ranks,
        does not travel)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "distributed"}
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in values.items()}

    @classmethod
    def from_json(cls, data: dict) -> "Options":
        known = {f.name for f in fields(cls)}
        return cls(**{k: (Path(v) if k in cls.PATHS and v is not None else v) for k, v in data.items() if k in known})

    @property
    def threshold(self) -> float | None:
        """The confidence at which a finding fails the run: ``fail_on``, or 0.5 under ``strict``."""
        return self.fail_on if self.fail_on is not None or not self.strict else STRICT_FAIL_ON


def parse_fail_on(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str) and value.lower() in FAIL_ON_NAMES:
        return FAIL_ON_NAMES[value.lower()]
    try:
        threshold = float(value)
    except ValueError:
        threshold = -1.0
    if not 0.0 <= threshold <= 1.0:
        raise UsageError(f"--fail-on {value!r}: expected a confidence in [0, 1] or one of {', '.join(FAIL_ON_NAMES)}")
    return threshold


def check(opts: Options, load: bool = True) -> None:
    """UsageError for options that cannot make a diagnosis; ``load``: also find and syntax-check the script (a
    notebook: read and compile its cells), which imports no torch."""
    if bool(opts.module) == bool(opts.script):
        raise UsageError("give either --module M (the training-module contract) or --script train.py (an unmodified script)")
    if opts.module and opts.script_args:
        raise UsageError(f"arguments after the options ({' '.join(opts.script_args)}) are passed to a --script; --module takes none")
    if opts.nproc is not None and not opts.script:
        raise UsageError("--nproc runs an unmodified script on several ranks: give --script train.py (not --module)")
    if opts.max_steps is not None and opts.max_steps < 1:
        raise UsageError(f"--max-steps {opts.max_steps}: expected at least 1")
    for flag, path in (("--json", opts.json_path), ("--report", opts.report_path)):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: the folder {Path(path).resolve().parent} does not exist")
    if opts.budget is not None and not opts.budget > 0:
        raise UsageError(f"--budget {opts.budget}: expected a positive number of seconds")
    unknown = [s for s in opts.symptoms if s not in SYMPTOMS]
    if unknown:
        raise UsageError(f"--symptom {unknown[0]!r}: unknown; choose from {', '.join(SYMPTOMS)}")
    if opts.device not in ("auto", "cpu", "cuda") and not str(opts.device).startswith("cuda:"):
        raise UsageError(f"--device {opts.device!r}: choose auto, cpu or cuda")
    if opts.answers is not None and not Path(opts.answers).is_file():
        raise UsageError(f"--answers {opts.answers}: no such file")
    if load and opts.script:   # (a dotted name only as a file: importing its packages would run the user's code here)
        from nnwizard.script_spec import load_script

        load_script(opts.script, import_names=False)


def raised(report: Any) -> bool:
    """The user's program raised while it was observed (script mode), or training raised in a probe (module mode)."""
    script = getattr(report, "script", None) or {}
    if script.get("exit") == "raised" or script.get("error"):
        return True
    return any(p.data.get("training_raised") for p in getattr(report, "probes", []))


def exit_code(report: Any, opts: Options) -> ExitCode:
    """CONTRACT §5 and §5a for a finished diagnosis (an interrupted one is 130)."""
    if getattr(report, "interrupted", False):
        return ExitCode.INTERRUPTED
    threshold = opts.threshold
    if threshold is None:
        return ExitCode.OK
    if any(h.confidence >= threshold for h in report.hypotheses) or raised(report):
        return ExitCode.FINDINGS
    if opts.strict and report.verdict == "inconclusive":
        return ExitCode.FINDINGS
    return ExitCode.OK


def failure_reasons(report: Any, opts: Options) -> list[str]:
    """Why :func:`exit_code` is 1, one line each (the terminal's last lines in CI, the pytest helpers' message)."""
    threshold = opts.threshold
    out = []
    if threshold is None:
        return out
    found = [h for h in report.hypotheses if h.confidence >= threshold]
    if found:
        out.append(f"{len(found)} finding{'s' if len(found) != 1 else ''} at or above --fail-on {threshold:g}: "
                   + ", ".join(f"{h.id} ({h.confidence:.2f})" for h in found))
    if raised(report):
        error = (getattr(report, "script", None) or {}).get("error") or {}
        where = f" at {error['where']}" if error.get("where") else ""
        what = f": {error['type']}{where}: {error.get('message', '')}" if error.get("type") else ""
        out.append(f"the program raised{what}")
    if opts.strict and report.verdict == "inconclusive":
        why = "; ".join(f"{n.probe}: {n.reason}" for n in report.not_run[:3]) if report.not_run else ""
        out.append("the verdict is inconclusive (--strict)" + (f": {why}" if why else ""))
    return out
