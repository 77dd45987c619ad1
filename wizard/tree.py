"""Decision trees: YAML files validated by pydantic, cross-checked against probes and catalog.

A tree names the symptoms it starts from and a graph of nodes. Each node is one of:

- ``probe``: run a registered probe (with ``params``); route on its outcome (``on``), on tests of
  its numbers (``when``), else ``next``. ``follow: symptoms`` queues the trees of the symptoms the
  probe measured (``data["symptoms"]``).
- ``ask``: a question with ``choices`` and a ``default``, stored under ``key``; route like a probe.
- ``branch``: route on an earlier probe's outcome or an earlier answer (``answer:KEY``).
- ``conclude``: evidence for (weight > 0) or against (weight < 0) hypotheses, with a sentence that
  may quote the probe's numbers (``{step}``, ``{ratio:.2f}``, ``{summary}``); then ``next``.

``next: end`` (or no ``next``) ends the tree. Trees are acyclic; every node is reachable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from nnwizard.catalog import Catalog, builtin_trees_dir, load_catalog
from nnwizard.errors import TreeError
from nnwizard.options import SYMPTOMS  # noqa: F401 - (the symptoms and their meaning live with the options)
from nnwizard.yamlsource import line_of, load_with_lines

END = "end"
_TEST = re.compile(r"^\s*([A-Za-z0-9_\-]+)\.([A-Za-z0-9_.\-]+)\s*(<=|>=|==|!=|<|>)\s*(.+?)\s*$")


class Test(BaseModel):
    """``when`` entry: ``test: "nan-bisect.step < 3"`` (or ``answer.KEY == yes``, or ``symptom.NAME == true``:
    the user named that symptom) -> ``goto``."""

    model_config = ConfigDict(extra="forbid")
    test: str
    goto: str

    @field_validator("test")
    @classmethod
    def _parse(cls, value: str) -> str:
        if not _TEST.match(value):
            raise ValueError("expected '<probe-id>.<field> <op> <value>', 'answer.<key> <op> <value>' or 'symptom.<name> == true'")
        source, path = _TEST.match(value).groups()[:2]
        if source == "symptom" and path not in SYMPTOMS:
            raise ValueError(f"unknown symptom {path!r} in {value!r}; known: {', '.join(SYMPTOMS)}")
        return value

    def parts(self) -> tuple[str, str, str, Any]:
        source, path, op, literal = _TEST.match(self.test).groups()
        return source, path, op, yaml.safe_load(literal)


class Conclusion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hypothesis: str
    weight: float = Field(ge=-1.0, le=1.0)
    evidence: str = "{summary}"
    source: str | None = Field(None, alias="from")  # probe whose numbers the sentence quotes


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    probe: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    follow: Literal["symptoms"] | None = None
    ask: str | None = None
    key: str | None = None
    help: str | None = None
    choices: dict[str, str] | None = None
    default: str | None = None
    branch: str | None = None
    conclude: list[Conclusion] | None = None
    on: dict[str, str] = Field(default_factory=dict)
    cases: dict[str, str] = Field(default_factory=dict)
    when: list[Test] = Field(default_factory=list)
    next: str = END

    @field_validator("default")
    @classmethod
    def _default_is_a_choice(cls, value: str | None, info: ValidationInfo) -> str | None:
        choices = info.data.get("choices") or {}
        if value is not None and choices and value not in choices:
            raise ValueError(f"default {value!r} is not one of the choices {list(choices)}")
        return value

    @field_validator("on")
    @classmethod
    def _answers_are_choices(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        choices = info.data.get("choices")
        if info.data.get("ask") is not None and choices:
            bad = [c for c in value if c not in choices]
            if bad:
                raise ValueError(f"names answers that are not choices: {bad}")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> "Node":
        kinds = [k for k in ("probe", "ask", "branch", "conclude") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a node is exactly one of probe, ask, branch, conclude (got {kinds or 'none'})")
        if self.ask is not None:
            if not self.key or not self.choices:
                raise ValueError("an ask node needs 'key' and 'choices'")
        if self.cases and self.branch is None:
            raise ValueError("'cases' belongs to branch nodes; probe and ask nodes route with 'on'")
        if self.on and self.kind in ("branch", "conclude"):
            raise ValueError(f"'on' is for probe and ask nodes; a {self.kind} node uses 'cases'/'next'")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("probe", "ask", "branch", "conclude") if getattr(self, k) is not None)

    def targets(self) -> list[str]:
        return [*self.on.values(), *self.cases.values(), *(t.goto for t in self.when), self.next]


class Tree(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    title: str
    description: str = ""
    symptoms: list[str]
    priority: int = 50  # trees of the same symptom are walked in (priority, id) order: cheap, broad ones first
    # which targets the tree is for: "module" (the --module contract), "script" (the recording of a
    # --script run), "script-model" (the model/batch/loss captured from a script run)
    modes: list[Literal["module", "script", "script-model", "distributed"]] = ["module"]
    start: str
    nodes: dict[str, Node]
    path: str = ""

    @field_validator("symptoms")
    @classmethod
    def _known_symptoms(cls, value: list[str]) -> list[str]:
        unknown = [s for s in value if s not in SYMPTOMS]
        if unknown:
            raise ValueError(f"unknown symptoms {unknown}; known: {', '.join(SYMPTOMS)}")
        return value


def _fail(path: Path, lines: dict, loc: tuple, msg: str) -> TreeError:
    where = ".".join(str(p) for p in loc)
    return TreeError(f"{path}:{line_of(lines, loc)}: {where}: {msg}" if where else f"{path}:{line_of(lines, loc)}: {msg}")


def _check_graph(tree: Tree, path: Path, lines: dict, catalog: Catalog, probes: dict) -> None:
    if tree.start not in tree.nodes:
        raise _fail(path, lines, ("start",), f"start node {tree.start!r} is not among the nodes")
    for name, node in tree.nodes.items():
        at = ("nodes", name)
        for field_name, target in [("on", t) for t in node.on.values()] + [("cases", t) for t in node.cases.values()] + [
            ("when", t.goto) for t in node.when
        ] + [("next", node.next)]:
            if target != END and target not in tree.nodes:
                raise _fail(path, lines, at + (field_name,), f"points to unknown node {target!r}")
        if node.probe is not None:
            if node.probe not in probes:
                raise _fail(path, lines, at + ("probe",), f"unknown probe {node.probe!r}; known: {', '.join(sorted(probes))}")
            declared = probes[node.probe].outcomes
            bad = [o for o in node.on if o not in declared]
            if bad:
                raise _fail(path, lines, at + ("on",), f"probe {node.probe!r} has no outcome {bad}; it declares {sorted(declared)}")
        for i, c in enumerate(node.conclude or []):
            if c.hypothesis not in catalog.hypotheses:
                raise _fail(path, lines, at + ("conclude", i, "hypothesis"), f"unknown hypothesis {c.hypothesis!r} (not in the catalog)")
            if c.source is not None and c.source not in probes:
                raise _fail(path, lines, at + ("conclude", i, "from"), f"unknown probe {c.source!r}")
        for i, t in enumerate(node.when):
            source = t.parts()[0]
            if source not in ("answer", "symptom") and source not in probes:
                raise _fail(path, lines, at + ("when", i, "test"), f"unknown probe {source!r} in test {t.test!r}")
    # reachability and cycles (depth-first from start)
    # (each node is expanded once: linear in the size of the graph, however many paths it has)
    seen: set[str] = set()
    done: set[str] = set()
    trail: list[str] = []

    def visit(name: str) -> None:
        seen.add(name)
        trail.append(name)
        for target in tree.nodes[name].targets():
            if target == END or target in done:
                continue
            if target in trail:
                raise _fail(path, lines, ("nodes", name), f"cycle: {' -> '.join(trail + [target])}")
            visit(target)
        trail.pop()
        done.add(name)

    visit(tree.start)
    unreachable = [n for n in tree.nodes if n not in seen]
    if unreachable:
        raise _fail(path, lines, ("nodes", unreachable[0]), f"node {unreachable[0]!r} is unreachable from start {tree.start!r}")


def load_tree(path: Path, catalog: Catalog | None = None, probes: dict | None = None) -> Tree:
    """Parse and fully validate one tree file; errors name the file, the line and the key."""
    from nnwizard.probes import load_all

    catalog = catalog or load_catalog()
    probes = probes if probes is not None else load_all()
    try:
        data, lines = load_with_lines(path)
    except yaml.YAMLError as exc:
        raise TreeError(f"{path}: malformed YAML: {exc}") from None
    except OSError as exc:
        raise TreeError(f"{path}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise TreeError(f"{path}:1: a tree is a mapping with id, title, symptoms, start and nodes")
    data.setdefault("id", path.stem)
    try:
        tree = Tree.model_validate({**data, "path": str(path)})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in ("function-after[_one_kind(), Node]",)))
        raise _fail(path, lines, loc, err["msg"].removeprefix("Value error, ")) from None
    _check_graph(tree, path, lines, catalog, probes)
    return tree


def tree_files(extra_dir: str | Path | None = None) -> list[Path]:
    """Built-in trees, then the user's ``--trees`` folder (a same-id tree there overrides)."""
    files = sorted(p for p in builtin_trees_dir().glob("*.yaml") if p.name != "catalog.yaml")
    if extra_dir:
        folder = Path(extra_dir)
        if not folder.is_dir():
            raise TreeError(f"--trees {extra_dir}: not a folder")
        files += sorted(p for p in folder.glob("*.yaml") if p.name != "catalog.yaml")
    return files


def load_trees(extra_dir: str | Path | None = None) -> dict[str, Tree]:
    catalog = load_catalog(str(extra_dir) if extra_dir else None)
    trees: dict[str, Tree] = {}
    for path in tree_files(extra_dir):
        tree = load_tree(path, catalog)
        trees[tree.id] = tree
    return dict(sorted(trees.items(), key=lambda item: (item[1].priority, item[0])))


def question_keys(trees: dict[str, Tree]) -> dict[str, Node]:
    return {n.key: n for t in trees.values() for n in t.nodes.values() if n.ask is not None}
