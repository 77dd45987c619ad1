"""YAML with line numbers: every mapping key's line is kept, so schema errors name file:line:key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class _LineLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's yes/no/on/off booleans: ``on:`` and ``yes:`` stay strings."""


_LineLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_LineLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def safe_load(text: str):
    """yaml.safe_load with the same resolvers as the tree loader (for answers files)."""
    return yaml.load(text, Loader=_LineLoader)


def load_with_lines(path: Path) -> tuple[Any, dict[tuple, int]]:
    """Parse ``path``; returns the data and a map from key paths (tuples) to 1-based line numbers."""
    text = path.read_text(encoding="utf-8")
    loader = _LineLoader(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}

    def walk(n: yaml.Node, at: tuple) -> None:
        lines.setdefault(at, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                key = key_node.value
                lines[at + (key,)] = key_node.start_mark.line + 1
                walk(value_node, at + (key,))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, at + (i,))

    if node is None:
        return None, lines
    walk(node, ())
    data = _LineLoader(text).get_single_data()
    return data, lines


def line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    """The line of the deepest known prefix of ``loc``."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())
