"""Instruction counts of two code paths of one child process under callgrind (load-independent).

The child runs its plain steps inside ``functools.reduce`` and the other steps inside ``sorted``; callgrind
collects only inside those two C functions (``--toggle-collect``), so torch's import and the set-up are not
counted. Used by ``recorder_instructions.py`` and ``watch_instructions.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def count(script: str, child_args: list[str], steps: int, env: dict | None = None,
          keep: Path | None = None) -> tuple[float, float]:
    """Instructions per step inside ``functools.reduce`` and inside ``sorted`` of ``python SCRIPT --child
    CHILD_ARGS``; ``keep``: where to leave callgrind's output (for ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or Path(tmp) / "callgrind.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
                        "--toggle-collect=builtin_sorted", f"--callgrind-out-file={out}", sys.executable, script,
                        "--child", *child_args], check=True, capture_output=True, cwd=ROOT,
                       env={**os.environ, "PYTHONHASHSEED": "0", **(env or {})})  # the same dict/set layouts each run
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(out)], check=True, capture_output=True,
                              text=True).stdout
    counts = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) .*:(functools_reduce|builtin_sorted) ", line)
        if m:
            counts[m.group(2)] = int(m.group(1).replace(",", "")) / steps
    return counts["functools_reduce"], counts["builtin_sorted"]
