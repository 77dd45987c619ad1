"""The plain training scripts in examples/scripts/ and what each declares it should be diagnosed as.

Each script states its expectation in comment lines near its top, read here without running it:

    # nnwizard-expect: missing-zero-grad     (catalog ids, comma-separated alternatives; empty: healthy)
    # nnwizard-symptom: oscillating          (the symptom a user would report; default auto)
"""

from __future__ import annotations

import re
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
