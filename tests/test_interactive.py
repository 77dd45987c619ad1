"""The real ``nnwizard`` in a pseudo-terminal: pick a symptom, watch the probes, read the ranking,
and replay the saved answers in scripted mode. Also the questionary prompter with piped input."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from nnwizard.engine import Question
from nnwizard.prompts import QuestionaryPrompter
from tests.conftest import EXAMPLES, ROOT

pexpect = pytest.importorskip("pexpect")
NNWIZARD = shutil.which("nnwizard")
pytestmark = pytest.mark.skipif(NNWIZARD is None or sys.platform == "win32", reason="needs the installed nnwizard and a pty")

ENV = {**os.environ, "TERM": "xterm", "COLUMNS": "140", "LINES": "50"}
DOWN, SPACE, ENTER = "\x1b[B", " ", "\r"


def test_interactive_session_ranks_the_fault_first_and_saves_answers(tmp_path):
    answers, report = tmp_path / "answers.yaml", tmp_path / "r.json"
    child = pexpect.spawn(
        NNWIZARD, ["diagnose", "--module", str(EXAMPLES / "broken_no_step.py"), "--device", "cpu",
                   "--save-answers", str(answers), "--json", str(report)],
        cwd=str(ROOT), encoding="utf-8", timeout=120, dimensions=(50, 140), env=ENV,
    )
    child.expect("What do you see")
    child.send(DOWN)          # nan -> flat
    child.send(SPACE)
    child.send(ENTER)
    child.expect("overfit-one-batch")
    child.expect("Ranked hypotheses")
    child.expect("missing-optimizer-step")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    data = json.loads(report.read_text())
    assert data["given_symptoms"] == ["flat"] and data["hypotheses"][0]["id"] == "missing-optimizer-step"
    assert "flat" in answers.read_text()

    replay = pexpect.spawn(NNWIZARD, ["diagnose", "--module", str(EXAMPLES / "broken_no_step.py"), "--device", "cpu",
                                      "--answers", str(answers), "--non-interactive", "-q"],
                           cwd=str(ROOT), encoding="utf-8", timeout=120, dimensions=(50, 140), env=ENV)
    replay.expect("missing-optimizer-step")
    replay.expect(pexpect.EOF)
    replay.close()
    assert replay.exitstatus == 0


def test_questionary_prompter_with_piped_keys():
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    question = Question("uses-amp", "Do you train with mixed precision?", {"yes": "Yes", "no": "No", "unsure": "Not sure"}, "no")
    with create_pipe_input() as pipe:
        pipe.send_text(DOWN + ENTER)   # starts on the default 'no', moves to 'unsure'
        assert QuestionaryPrompter(input=pipe, output=DummyOutput()).ask(question) == "unsure"
    with create_pipe_input() as pipe:
        pipe.send_text(SPACE + DOWN + SPACE + ENTER)
        picked = QuestionaryPrompter(input=pipe, output=DummyOutput()).choose_symptoms({"nan": "a", "flat": "b", "auto": "c"})
    assert picked == ["nan", "flat"]
    assert QuestionaryPrompter({"uses-amp": "yes"}).ask(question) == "yes", "answers from the file are not asked again"
