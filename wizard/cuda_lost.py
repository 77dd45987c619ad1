"""A CUDA error that kills the process's CUDA context, and the CPU re-run that reads its real cause.

A kernel that fails an assertion (``device-side assert triggered``: a class label >= the number of
classes, an Embedding index past its rows), or touches memory it must not (``illegal memory
access``), poisons the process's CUDA context: every later CUDA call raises the same error, and the
message names neither the op nor the cause (kernels run asynchronously). Nothing more can be
measured on the GPU in that process, and a probe that went on would only repeat the error.

So the first such error ends the session (``CudaContextLost``, raised where a probe or the step
timing saw it), and the CLI runs the same diagnosis again in a fresh process on the CPU with CUDA
hidden (``CUDA_VISIBLE_DEVICES=""``), where the same step raises the readable error ("Target 10 is
out of bounds") and every probe can run. That process's reports say why it ran on the CPU
(``NNWIZARD_CUDA_LOST``: the CUDA error and where it was seen).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from nnwizard.errors import ExitCode, NNWizardError

# errors after which the CUDA context of the process is unusable (cudaErrorAssert, cudaErrorIllegalAddress,
# cudaErrorLaunchFailure, cudaErrorMisalignedAddress, cudaErrorIllegalInstruction)
STICKY = re.compile(r"device-side assert|illegal memory access|unspecified launch failure|misaligned address|"
                    r"illegal instruction|cudaErrorAssert|cudaErrorIllegalAddress|cudaErrorLaunchFailure", re.IGNORECASE)
ENV = "NNWIZARD_CUDA_LOST"  # set in the CPU re-run: the CUDA error and where it was seen

_seen: list[str] = []  # the first sticky error of this process (and where), once seen


class CudaContextLost(NNWizardError):
    """A sticky CUDA error: nothing more can run on the GPU in this process."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, error: str, where: str):
        self.error, self.where = error, where
        self.symptoms: list[str] = []        # what the user had chosen and answered when it was raised (the engine
        self.answers: dict[str, str] = {}    # fills them in), handed to the CPU re-run
        super().__init__(f"{error} (seen {where}): this CUDA error leaves the process's CUDA context unusable, so "
                         f"nothing more can be measured on the GPU here. Run the diagnosis again with --device cpu "
                         f"(the CLI does this by itself), or with CUDA_LAUNCH_BLOCKING=1 to see the failing op.")


def sticky(error: object) -> bool:
    """Whether ``error`` (an exception or its text) is one that kills the CUDA context."""
    return bool(STICKY.search(f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)))


def remember(error: BaseException, where: str) -> bool:
    """Note ``error`` when it is sticky (the first one is kept); True if it was."""
    from nnwizard.record.frames import first_line

    if not sticky(error):
        return False
    if not _seen:
        _seen.append(f"{first_line(error)}\x00{where}")
    return True


def seen() -> bool:
    return bool(_seen)


def _context_error() -> BaseException | None:
    """The error a CUDA context in use answers a synchronize with (None: healthy, or CUDA not in use)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    try:
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def check(where: str) -> None:
    """Raise CudaContextLost when this process's CUDA context is dead: a sticky error seen before, or
    the one a synchronize answers now (the user's code may have caught the first one itself)."""
    if not _seen:
        error = _context_error()
        if error is not None:
            remember(error, where)
    if _seen:
        error, seen_where = _seen[0].split("\x00")
        raise CudaContextLost(error, seen_where)


@contextmanager
def guard(where: str):
    """A sticky CUDA error raised in the block (outside any probe) ends the session as CudaContextLost."""
    try:
        yield
    except CudaContextLost:
        raise
    except Exception as exc:
        if remember(exc, where):
            check(where)
        raise


def rerun_note() -> str | None:
    """In the CPU re-run: one sentence on why this diagnosis runs on the CPU; else None."""
    seen = os.environ.get(ENV)
    if not seen:
        return None
    return (f"re-run on the CPU: on CUDA, {seen}, which leaves the process's CUDA context unusable, so the diagnosis "
            f"ran again in a fresh process with CUDA hidden, where the same code raises a readable error")


def cli_args(opts, symptoms: list[str] | None = None, answers_file: str | None = None) -> list[str]:
    """The ``nnwizard diagnose`` arguments that ask for the diagnosis ``opts`` describes, on the CPU;
    ``symptoms`` and ``answers_file`` (what the user chose and answered by then) replace the options'."""
    args = ["--script", opts.script] if opts.script else ["--module", opts.module]
    args += ["--device", "cpu", "--seed", str(opts.seed)]
    for symptom in symptoms or opts.symptoms:
        args += ["--symptom", symptom]
    for flag, value in (("--answers", answers_file or opts.answers), ("--json", opts.json_path), ("--report", opts.report_path),
                        ("--fail-on", opts.fail_on), ("--trees", opts.trees_dir), ("--probe-timeout", opts.probe_timeout),
                        ("--budget", opts.budget), ("--save-answers", opts.save_answers), ("--max-steps", opts.max_steps)):
        if value is not None:
            args += [flag, str(value)]
    if not opts.interactive:
        args.append("--non-interactive")
    if opts.quiet:
        args.append("--quiet")
    if getattr(opts, "strict", False):
        args.append("--strict")
    if opts.script_args:
        args += ["--", *opts.script_args]
    return args


def rerun_on_cpu(opts, lost: CudaContextLost) -> int:
    """Run the same diagnosis in a fresh process with CUDA hidden; its exit code. The child writes the
    reports and talks to the terminal itself."""
    if os.environ.get(ENV):  # already the re-run (CUDA hidden): do not loop
        raise lost
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", ENV: f"{lost.error} (seen {lost.where})"}
    print(f"nnwizard: on CUDA, {lost.error} (seen {lost.where}). This error leaves the CUDA context unusable; "
          f"running the diagnosis again on the CPU, where the same code raises a readable error…", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="nnwizard-cpu-rerun-") as scratch:
        answers = None
        if lost.answers:
            from nnwizard.prompts import save_answers

            answers = os.path.join(scratch, "answers.yaml")
            save_answers(Path(answers), lost.symptoms, lost.answers)
        try:
            return subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", *cli_args(opts, lost.symptoms, answers)],
                                  env=env).returncode
        except KeyboardInterrupt:
            return int(ExitCode.INTERRUPTED)
