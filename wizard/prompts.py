"""Prompters: where the engine's questions get their answers.

Answers are layered as copier does it: flags (``--symptom``) > the ``--answers`` file > asking the
person at the terminal > the question's default. Without a terminal nothing ever waits for input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nnwizard.events import Question
from nnwizard.errors import AnswersError, NeedsAnswer
from nnwizard.tree import SYMPTOMS, Node
from nnwizard.yamlsource import safe_load

SYMPTOMS_KEY = "symptoms"


def load_answers(path: str | Path, questions: dict[str, Node]) -> dict[str, Any]:
    """Read and check an answers file: a YAML/JSON mapping of question key -> choice, plus an
    optional ``symptoms`` list. Unknown keys and values are errors (they are usually typos)."""
    file = Path(path)
    try:
        data = safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AnswersError(f"--answers {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise AnswersError(f"--answers {path}: malformed YAML/JSON: {exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AnswersError(f"--answers {path}: expected a mapping of question key to answer, got {type(data).__name__}")
    answers: dict[str, Any] = {}
    for key, value in data.items():
        if key == SYMPTOMS_KEY:
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, list) or any(v not in SYMPTOMS for v in values):
                raise AnswersError(f"--answers {path}: symptoms: {value!r}; known symptoms: {', '.join(SYMPTOMS)}")
            answers[key] = list(values)
        elif key not in questions:
            raise AnswersError(f"--answers {path}: unknown question key {key!r}; known keys: {', '.join(sorted(questions)) or 'none'}")
        else:
            value = {True: "yes", False: "no"}.get(value, value) if isinstance(value, bool) else str(value)
            choices = questions[key].choices or {}
            if value not in choices:
                raise AnswersError(f"--answers {path}: {key}: {value!r} is not one of {', '.join(choices)}")
            answers[key] = value
    return answers


def save_answers(path: str | Path, symptoms: list[str], answers: dict[str, str]) -> None:
    body = {SYMPTOMS_KEY: symptoms, **answers}
    Path(path).write_text(
        "# nnwizard answers: replay with  nnwizard diagnose --module ... --answers " + str(path) + "\n"
        + yaml.safe_dump(body, sort_keys=False),
        encoding="utf-8",
    )


class ScriptedPrompter:
    """Non-interactive: answers from the file, else the default, else stop with what to pass."""

    def __init__(self, answers: dict[str, Any] | None = None):
        self.answers = dict(answers or {})

    def choose_symptoms(self, choices: dict[str, str]) -> list[str]:
        return list(self.answers.get(SYMPTOMS_KEY) or ["auto"])

    def ask(self, question: Question) -> str:
        if question.key in self.answers:
            return self.answers[question.key]
        if question.default is not None:
            return question.default
        raise NeedsAnswer(
            f"question {question.key!r} ({question.text}) has no default and no answer; pass "
            f"--answers FILE with a line '{question.key}: <{'|'.join(question.choices)}>'"
        )


class QuestionaryPrompter(ScriptedPrompter):
    """At a terminal: questionary pickers; answers already in the file are not asked again."""

    def __init__(self, answers: dict[str, Any] | None = None, input=None, output=None):
        super().__init__(answers)
        self._io = {"input": input, "output": output} if input is not None else {}

    def choose_symptoms(self, choices: dict[str, str]) -> list[str]:
        if self.answers.get(SYMPTOMS_KEY):
            return list(self.answers[SYMPTOMS_KEY])
        import questionary

        picked = questionary.checkbox(
            "What do you see? (space to select, enter to confirm; none selected = auto)",
            choices=[questionary.Choice(f"{key:<17} {text}", value=key) for key, text in choices.items()],
            **self._io,
        ).unsafe_ask()
        return picked or ["auto"]

    def ask(self, question: Question) -> str:
        if question.key in self.answers:
            return self.answers[question.key]
        import questionary

        choices = [questionary.Choice(label, value=value) for value, label in question.choices.items()]
        default = next((c for c in choices if c.value == question.default), None)
        text = question.text + (f"  ({question.help})" if question.help else "")
        return questionary.select(text, choices=choices, default=default, **self._io).unsafe_ask()
