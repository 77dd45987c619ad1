"""The plain training scripts in examples/scripts/, what each declares it should be diagnosed as,
and how a user runs script mode on one (the CLI in a subprocess): shared by the tests and the
accuracy benchmark.

Each script states its expectation in comment lines near its top, read here without running it:

    # nnwizard-expect: missing-zero-grad     (catalog ids, comma-separated alternatives; empty: healthy)
    # nnwizard-symptom: oscillating          (the symptom a user would report; default auto)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
_HEADER_LINES = 12
_FIELD = re.compile(r"^#\s*nnwizard-(expect|symptom)\s*:(.*)$")


@dataclass(frozen=True)
class ScriptExample:
    path: Path
    expected: tuple[str, ...]     # empty: the script is healthy
    symptoms: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def healthy(self) -> bool:
        return not self.expected

    @property
    def crashes(self) -> bool:
        """Planted to raise under plain python (its declared symptom is ``crash``)."""
        return "crash" in self.symptoms


def read_expectation(path: Path) -> ScriptExample:
    """The declaration in the first lines of ``path``; ValueError when it has none."""
    fields: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for _, line in zip(range(_HEADER_LINES), f):
            match = _FIELD.match(line.strip())
            if match:
                fields[match.group(1)] = match.group(2).split("(")[0].strip()
    if "expect" not in fields:
        raise ValueError(f"{path}: no '# nnwizard-expect:' line in its first {_HEADER_LINES} lines")
    split = lambda text: tuple(t.strip() for t in text.split(",") if t.strip())  # noqa: E731
    expected = tuple(i for i in split(fields["expect"]) if i != "healthy")
    return ScriptExample(Path(path), expected, split(fields.get("symptom", "")) or ("auto",))


def script_examples(only: list[str] | None = None) -> list[ScriptExample]:
    """Every example script (sorted by name), or those named in ``only``."""
    found = [read_expectation(p) for p in sorted(SCRIPTS.glob("*.py"))]
    return [s for s in found if not only or s.name in only]


def script_mode_available() -> bool:
    """Whether the installed CLI has ``nnwizard diagnose --script`` (CONTRACT section 6)."""
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=120)
    return "--script" in done.stdout


def diagnose_with_cli(path: Path, symptoms, workdir: Path, seed: int = 0, timeout_s: float = 300,
                      env: dict | None = None, device: str = "cpu", kind: str = "--script"
                      ) -> tuple[dict | None, str | None, float]:
    """``nnwizard diagnose --script PATH --non-interactive`` (``kind="--module"``: a training module) in a
    subprocess run from ``workdir``, as a user would: (JSON report or None, error or None, wall seconds)."""
    out = Path(workdir) / "report.json"
    cmd = [sys.executable, "-m", "nnwizard", "diagnose", kind, str(path), "--non-interactive",
           "--device", device, "--seed", str(seed), "--json", str(out), "--quiet"]
    for symptom in symptoms:
        cmd += ["--symptom", symptom]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s", time.monotonic() - started
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1) or not out.exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        return None, f"exit {done.returncode}: {tail}", seconds
    return json.loads(out.read_text()), None, seconds
