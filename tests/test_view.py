"""The rich terminal view, rendered into a string: probe lines as they finish, the ranked table,
weak hypotheses kept out of it, and tree drawings."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from nnwizard.engine import Event
from nnwizard.probes.api import ProbeResult
from nnwizard.report import HypothesisOut, Report
from nnwizard.tree import load_trees
from nnwizard.view import TerminalView, draw_tree


def render(fn) -> str:
    console = Console(file=StringIO(), width=100, force_terminal=False)
    fn(console)
    return console.file.getvalue()


def report(*hypotheses) -> Report:
    return Report(nnwizard_version="0", module="m", device="cpu", seed=0, symptoms=["flat"], given_symptoms=["flat"],
                  verdict="problems-found" if any(h.confidence >= 0.5 for h in hypotheses) else "healthy",
                  hypotheses=list(hypotheses), probes=[])


def hyp(id: str, confidence: float) -> HypothesisOut:
    return HypothesisOut(id=id, title=f"title of {id}", category="loop", confidence=confidence,
                         evidence=[f"measured for {id}"], fix=f"fix {id}")


def test_probe_lines_and_ranked_table():
    def draw(console):
        view = TerminalView(console)
        view(Event("tree-start", "sanity", data={"title": "Sanity checks"}))
        view(Event("probe-end", "sanity", "x", {"result": ProbeResult("failed", "stuck", "loss 1.3 -> 1.3", id="overfit-one-batch", duration_s=0.4)}))
        view.summary(report(hyp("missing-optimizer-step", 0.96), hyp("lr-too-low", 0.3), hyp("frozen-parameters", 0.05)), ["r.json"])

    text = render(draw)
    assert "▶ Sanity checks" in text and "✗ overfit-one-batch" in text and "loss 1.3 -> 1.3 (0.4s)" in text
    assert "missing-optimizer-step" in text and "measured for" in text and "0.96" in text
    assert "lr-too-low" in text and "frozen-parameters" not in text
    assert "1 weaker hypothesis (below 0.2) is listed in the reports" in text
    assert "Verdict: problems-found" in text and "wrote r.json" in text


def test_nothing_above_weak():
    text = render(lambda console: TerminalView(console).summary(report(hyp("val-shuffled", 0.1)), []))
    assert "No hypothesis gathered more than weak evidence" in text and "Verdict: healthy" in text


def test_quiet_view_prints_only_the_summary():
    def draw(console):
        view = TerminalView(console, quiet=True)
        view(Event("tree-start", "sanity", data={"title": "Sanity checks"}))
        view.summary(report(), [])

    text = render(draw)
    assert "Sanity checks" not in text and "Verdict" in text


def test_draw_tree_lists_every_node_with_routes():
    tree = load_trees()["sanity"]
    text = render(lambda console: console.print(draw_tree(tree)))
    for name in tree.nodes:
        assert f"{name}:" in text
    assert "all-frozen → frozen-all" in text and "(start)" in text
