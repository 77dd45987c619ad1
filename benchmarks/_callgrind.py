"""Instruction counts of two code regions of one child process under callgrind (load-independent).

The child runs each region as ``region(fn)``, i.e. inside ``sys.call_tracing`` (a C function that
nothing else in the process calls: it only runs ``fn()`` when no tracer is set). Callgrind collects
only inside it (``--toggle-collect``) and writes one dump per region (``--dump-after``), so a
region's count is exactly that region: not torch's import, not the set-up, not a warm-up. (The
regions used to be ``functools.reduce`` and ``sorted``: every ``sorted`` call of the process counted,
the ~20M instructions of those made while torch and nnwizard import among them, and a ``sorted``
call inside the second region switched collection off until it returned.) Used by
``recorder_instructions.py`` and ``watch_instructions.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUNCTION = "sys_call_tracing"   # the C function of sys.call_tracing in CPython


def region(fn) -> None:
    """In the child: run ``fn()`` as one counted region."""
    sys.call_tracing(fn, ())


def count(script: str, child_args: list[str], steps: int, env: dict | None = None,
          keep: Path | None = None) -> tuple[float, float]:
    """Instructions per step of the first and the second ``region`` of ``python SCRIPT --child
    CHILD_ARGS``; ``keep``: a folder where callgrind's output is left (``callgrind.out.1`` and
    ``.2``, one per region, for ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "callgrind.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={FUNCTION}",
                        f"--dump-after={FUNCTION}", f"--callgrind-out-file={out}", sys.executable, script,
                        "--child", *child_args], check=True, capture_output=True, cwd=ROOT,
                       env={**os.environ, "PYTHONHASHSEED": "0", **(env or {})})  # the same dict/set layouts each run
        counts = [_total(Path(f"{out}.{part}")) / steps for part in (1, 2)]
    return counts[0], counts[1]


def _total(dump: Path) -> int:
    text = subprocess.run(["callgrind_annotate", str(dump)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"^\s*([\d,]+) .*PROGRAM TOTALS", text, re.M)
    if m is None:
        raise RuntimeError(f"no total in {dump}")
    return int(m.group(1).replace(",", ""))
