"""nnwizard's pytest plugin (entry point ``pytest11``): one fixture, ``nnwizard``, and nothing else; a test suite that
does not ask for it sees no option, no marker, no output of nnwizard's, and pays no import of torch.

    def test_training(nnwizard):
        report = nnwizard.assert_no_training_bugs("train.py", args=["--epochs", "1"])
        nnwizard.assert_overfits_one_batch("train.py", args=["--epochs", "1"])

The fixture's diagnoses write their JSON and markdown reports into the test's ``tmp_path`` (a failure names them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


class NNWizardFixture:
    """``nnwizard.diagnose`` and the ``nnwizard.testing`` assertions, with the reports kept in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._count = 0

    def _reports(self, options: dict) -> dict:
        self._count += 1
        stem = self.folder / f"nnwizard-{self._count}"
        options.setdefault("json", stem.with_suffix(".json"))
        options.setdefault("report", stem.with_suffix(".md"))
        return options

    def diagnose(self, script: Any = None, args: Any = None, **options: Any):
        from nnwizard.api import diagnose

        return diagnose(script, args, **self._reports(options))

    def assert_no_training_bugs(self, script: Any = None, args: Any = None, **options: Any):
        __tracebackhide__ = True
        from nnwizard.testing import assert_no_training_bugs

        return assert_no_training_bugs(script, args, **self._reports(options))

    def assert_overfits_one_batch(self, script: Any = None, args: Any = None, **options: Any):
        __tracebackhide__ = True
        from nnwizard.testing import assert_overfits_one_batch

        return assert_overfits_one_batch(script, args, **options)


@pytest.fixture
def nnwizard(tmp_path: Path) -> NNWizardFixture:
    """Diagnose training scripts from a test: ``nnwizard.assert_no_training_bugs("train.py")``,
    ``nnwizard.assert_overfits_one_batch("train.py")``, ``nnwizard.diagnose(...)`` (reports in ``tmp_path``)."""
    return NNWizardFixture(tmp_path)
