"""Tree and catalog validation: every error names the file, the line and the key."""

from __future__ import annotations

import re
import textwrap

import pytest

from nnwizard.catalog import load_catalog
from nnwizard.errors import TreeError
from nnwizard.tree import load_tree, load_trees

VALID = """\
id: mine
title: My tree
symptoms: [flat]
start: first
nodes:
  first:
    probe: model-summary
    on:
      all-frozen: blame
    next: ask
  ask:
    ask: "Do you use AMP?"
    key: my-amp
    choices: {yes: "Yes", no: "No"}
    default: no
    on:
      yes: blame
  blame:
    conclude:
      - {hypothesis: frozen-parameters, weight: 0.8, evidence: "{summary}"}
"""


def write(tmp_path, text, name="mine.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_valid_tree_loads_with_on_and_yes_as_strings(tmp_path):
    tree = load_tree(write(tmp_path, VALID))
    assert tree.nodes["ask"].choices == {"yes": "Yes", "no": "No"}
    assert tree.nodes["first"].on == {"all-frozen": "blame"}


def test_builtin_trees_and_catalog_validate():
    trees = load_trees()
    assert "sanity" in trees
    catalog = load_catalog()
    contract_ids = {"missing-zero-grad", "eval-mode-missing", "lr-too-high", "train-val-leakage", "overfitting",
                    "graph-retained", "unregistered-parameters", "axes-swapped", "batch-too-small"}
    assert contract_ids <= set(catalog.hypotheses)


@pytest.mark.parametrize(
    "change, message, line",
    [
        (("    next: ask\n", "    next: ask\n    colour: red\n"), r"colour: Extra inputs are not permitted", 11),
        (("probe: model-summary", "probe: no-such-probe"), r"unknown probe 'no-such-probe'", 7),
        (("all-frozen: blame", "frozen-ish: blame"), r"has no outcome \['frozen-ish'\]", 8),
        (("hypothesis: frozen-parameters", "hypothesis: gremlins"), r"unknown hypothesis 'gremlins'", 20),
        (("    next: ask\n", "    next: nowhere\n"), r"points to unknown node 'nowhere'", 10),
        (("default: no", "default: maybe"), r"default 'maybe' is not one of the choices", 15),
    ],
)
def test_errors_name_file_line_and_key(tmp_path, change, message, line):
    path = write(tmp_path, VALID.replace(*change))
    with pytest.raises(TreeError) as info:
        load_tree(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}:"), text
    assert re.search(message, text), text


def test_unreachable_node(tmp_path):
    path = write(tmp_path, VALID + "  orphan:\n    probe: initial-loss\n")
    with pytest.raises(TreeError, match=r"mine.yaml:21: nodes.orphan: node 'orphan' is unreachable"):
        load_tree(path)


def test_cycle_is_rejected(tmp_path):
    path = write(tmp_path, VALID.replace("      yes: blame\n", "      yes: first\n"))
    with pytest.raises(TreeError, match=r"cycle: first -> ask -> first"):
        load_tree(path)


def test_malformed_yaml(tmp_path):
    path = write(tmp_path, "id: x\nnodes: [unclosed\n")
    with pytest.raises(TreeError, match=r"mine.yaml: malformed YAML"):
        load_tree(path)


def test_node_of_two_kinds(tmp_path):
    path = write(tmp_path, VALID.replace("    probe: model-summary\n", "    probe: model-summary\n    ask: two kinds?\n"))
    with pytest.raises(TreeError, match=r"exactly one of probe, ask, branch, conclude"):
        load_tree(path)


def test_unknown_symptom(tmp_path):
    with pytest.raises(TreeError, match=r"mine.yaml:3: symptoms: .*unknown symptoms \['sad'\]"):
        load_tree(write(tmp_path, VALID.replace("[flat]", "[sad]")))


def test_user_trees_folder_adds_and_overrides(tmp_path):
    write(tmp_path, VALID)
    write(tmp_path, VALID.replace("id: mine", "id: sanity").replace("title: My tree", "title: Overridden"), "other.yaml")
    trees = load_trees(tmp_path)
    assert "mine" in trees and trees["sanity"].title == "Overridden"


def test_user_catalog_extends_builtin(tmp_path):
    (tmp_path / "catalog.yaml").write_text(textwrap.dedent("""\
        hypotheses:
          gremlins:
            title: Gremlins in the GPU
            category: model
            meaning: m
            detection: d
            fix: f
            snippet: s
        """))
    write(tmp_path, VALID.replace("hypothesis: frozen-parameters", "hypothesis: gremlins"))
    trees = load_trees(tmp_path)
    assert "gremlins" in load_catalog(str(tmp_path)).hypotheses and "mine" in trees


def test_bad_catalog_names_line(tmp_path):
    (tmp_path / "catalog.yaml").write_text("hypotheses:\n  x:\n    title: t\n    category: astrology\n")
    with pytest.raises(TreeError, match=r"catalog.yaml:4: hypotheses.x.category"):
        load_catalog(str(tmp_path))
