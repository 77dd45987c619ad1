"""What the engine tells a view (``Event``) and asks a person (``Question``): plain data, importable without
torch, so that the supervisor (wizard/supervisor.py) can render and answer what a worker process streams."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Question:
    key: str
    text: str
    choices: dict[str, str]
    default: str | None = None
    help: str | None = None


@dataclass
class Event:
    kind: str  # budget | tree-start | question | answer | probe-start | probe-progress | probe-end | conclusion | tree-end
    tree: str = ""
    node: str = ""
    data: dict[str, Any] = field(default_factory=dict)
