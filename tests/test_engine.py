"""The engine with a scripted prompter: routing, evidence, caching, isolation of failing probes."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from nnwizard.catalog import load_catalog
from nnwizard.engine import Engine, quote
from nnwizard.errors import AnswersError, NeedsAnswer
from nnwizard.isolation import run_probe
from nnwizard.probes import ProbeContext, ProbeResult, failed, get, passed, probe
from nnwizard.prompts import ScriptedPrompter, load_answers
from nnwizard.ranking import confidence
from nnwizard.tree import load_tree, question_keys
from tests.conftest import load_example

CALLS: list[str] = []


@probe("test-measure", title="test: returns the value it is given", outcomes={"ok": "small", "big": "large"})
def _measure(ctx: ProbeContext):
    CALLS.append("measure")
    value = ctx.param("value", 1.0)
    return failed("big", f"value {value}", value=value) if value > 10 else passed(f"value {value}", value=value)


@probe("test-raises", title="test: raises", outcomes={"ok": "never"})
def _raises(ctx: ProbeContext):
    raise ZeroDivisionError("user code divided by zero")


@probe("test-hangs", title="test: hangs", outcomes={"ok": "never"}, timeout_s=0.5)
def _hangs(ctx: ProbeContext):
    time.sleep(5)
    return passed("woke up")


@probe("test-busy", title="test: computes forever in small native ops", outcomes={"ok": "never"})
def _busy(ctx: ProbeContext):
    a = torch.randn(64, 64)
    while True:
        try:
            a = torch.tanh(a @ a)
        except Exception:  # user code that swallows errors cannot swallow the cancellation
            pass


@probe("test-messy", title="test: disturbs global state", outcomes={"ok": "done"})
def _messy(ctx: ProbeContext):
    torch.set_grad_enabled(False)
    random.random(), np.random.rand(), torch.rand(1)
    return passed("messed up the RNG and grad mode")


TREE = """\
id: t
title: Test tree
symptoms: [flat]
start: measure
nodes:
  measure:
    probe: test-measure
    params: {value: 50}
    on: {big: q}
    next: end
  q:
    ask: "Is the value expected?"
    key: value-expected
    choices: {yes: "Yes", no: "No"}
    default: no
    on: {yes: against}
    next: again
  again:
    probe: test-measure
    params: {value: 50}
    when:
      - {test: "test-measure.value >= 40", goto: blame}
    next: end
  blame:
    conclude:
      - {hypothesis: lr-too-high, weight: 0.7, evidence: "measured {value:.1f} ({summary})"}
    next: crash
  against:
    conclude:
      - {hypothesis: lr-too-high, weight: -0.5, evidence: "the user expects {value}"}
    next: crash
  crash:
    probe: test-raises
    next: end
"""


@pytest.fixture(scope="module")
def target():
    return load_example("healthy_mlp")


@pytest.fixture
def tree(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TREE)
    return load_tree(path)


def run(target, tree, answers=None):
    events = []
    engine = Engine(target, {"t": tree}, load_catalog(), ScriptedPrompter(answers), listener=events.append)
    return engine.run(["flat"], answers), events


def test_walk_routes_on_outcome_default_answer_and_when(target, tree):
    CALLS.clear()
    diagnosis, events = run(target, tree)
    assert diagnosis.answers == {"value-expected": "no"}
    assert CALLS == ["measure"], "the second node with the same params is served from the cache"
    [top] = diagnosis.ranked
    assert top.id == "lr-too-high" and top.evidence[0].text == "measured 50.0 (value 50)"
    assert top.confidence == confidence(load_catalog().hypotheses["lr-too-high"].prior, [0.7])
    kinds = [e.kind for e in events]
    assert kinds[0] == "tree-start" and "question" in kinds and kinds[-1] == "tree-end"
    statuses = {r.id: r.status for r in diagnosis.results}
    assert statuses == {"test-measure": "failed", "test-raises": "errored"}, "a raising probe is reported, the session goes on"


def test_answer_routes_to_counter_evidence(target, tree):
    diagnosis, _ = run(target, tree, {"value-expected": "yes"})
    assert diagnosis.ranked == [], "only opposing evidence: nothing is listed"
    assert [e.weight for e in diagnosis.evidence] == [-0.5]


def test_question_without_default_stops_with_the_key_to_pass(target, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TREE.replace("    default: no\n", ""))
    with pytest.raises(NeedsAnswer, match="value-expected.*--answers"):
        run(target, load_tree(path))


def test_errored_probe_carries_message_and_place(target):
    result = run_probe(get("test-raises"), ProbeContext(target))
    assert result.status == "errored" and "ZeroDivisionError: user code divided by zero" in result.summary
    assert "test_engine.py" in result.summary


def test_hanging_probe_is_stopped_by_its_time_limit(target):
    started = time.monotonic()
    result = run_probe(get("test-hangs"), ProbeContext(target))
    assert result.status == "errored" and "timed out after" in result.summary
    assert time.monotonic() - started < 3


def test_probe_restores_rng_and_grad_mode(target):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    run_probe(get("test-messy"), ProbeContext(target))
    assert torch.is_grad_enabled()
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_interrupt_keeps_what_was_measured(target, tree, monkeypatch):
    import nnwizard.engine as engine_module

    real = engine_module.run_probe
    calls = {"n": 0}

    def interrupt_second(spec, ctx, timeout=None, *rest):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(spec, ctx, timeout, *rest)

    monkeypatch.setattr(engine_module, "run_probe", interrupt_second)
    diagnosis, _ = run(target, tree)
    assert diagnosis.interrupted and [r.id for r in diagnosis.results] == ["test-measure"]
    assert diagnosis.ranked and diagnosis.ranked[0].id == "lr-too-high"


def test_quote_survives_missing_and_bad_fields():
    result = ProbeResult("passed", "ok", "s", {"x": 1.23456, "name": "fc"})
    assert quote("{x:.2f} {name} {missing} {name:.2f}", result) == "1.23 fc ? fc"


def test_answers_file_validation(tmp_path, tree):
    keys = question_keys({"t": tree})
    good = tmp_path / "a.yaml"
    good.write_text("symptoms: [nan, flat]\nvalue-expected: yes\n")
    assert load_answers(good, keys) == {"symptoms": ["nan", "flat"], "value-expected": "yes"}
    for text, message in [
        ("value-expectd: yes\n", "unknown question key 'value-expectd'"),
        ("value-expected: maybe\n", "'maybe' is not one of yes, no"),
        ("symptoms: [sad]\n", "known symptoms"),
        ("- just\n- a list\n", "expected a mapping"),
        ("a: [unclosed\n", "malformed"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(AnswersError, match=message):
            load_answers(bad, keys)
    with pytest.raises(AnswersError, match="cannot read"):
        load_answers(tmp_path / "missing.yaml", keys)


def test_confidence_maths():
    assert confidence(0.0, [0.6, 0.6]) == pytest.approx(0.84)
    assert confidence(0.0, [0.6, 0.6, -0.5]) == pytest.approx(0.42)
    assert confidence(0.1, []) == pytest.approx(0.1)


def test_a_time_out_does_not_shrink_later_limits_below_their_cost(target, tmp_path, monkeypatch):
    import nnwizard.budget as budget_module
    import nnwizard.engine as engine_module
    from nnwizard.budget import Budget

    limits = []
    real = engine_module.run_probe

    def spy(spec, ctx, timeout=None, *rest):
        limits.append(timeout)
        return real(spec, ctx, timeout, *rest)

    monkeypatch.setattr(engine_module, "run_probe", spy)
    monkeypatch.setattr(budget_module, "LIMIT_FLOOR_S", 0.0)
    path = tmp_path / "h.yaml"
    path.write_text("id: h\ntitle: hang\nsymptoms: [flat]\nstart: a\nnodes:\n  a:\n    probe: test-hangs\n"
                    "    next: b\n  b:\n    probe: test-measure\n")
    budget = Budget(total_s=20.0, step_s=0.1)
    engine = Engine(target, {"h": load_tree(path)}, load_catalog(), ScriptedPrompter(), budget=budget)
    diagnosis = engine.run(["flat"])
    assert [r.status for r in diagnosis.results] == ["errored", "passed"]
    assert "timed out" in diagnosis.results[0].summary and budget.timeouts == 1
    # before the time-out: the probe's own limit or its measured cost, whichever is longer; after it
    # its measured cost (3 x 1 step of 0.1 s), never one fixed short limit for everything that follows
    assert limits == [0.5, pytest.approx(0.3)]


def test_cancelled_probe_ends_at_its_next_python_instruction(target):
    import threading

    before = threading.active_count()
    result = run_probe(get("test-busy"), ProbeContext(target), 0.3)
    assert result.status == "errored" and "timed out" in result.summary and result.data["stopped"] is True
    time.sleep(0.1)
    assert threading.active_count() == before


class _SlowUser(ScriptedPrompter):
    """A user who thinks for a while at each prompt."""

    def __init__(self, think_s: float):
        super().__init__()
        self.think_s = think_s

    def choose_symptoms(self, choices):
        time.sleep(self.think_s)
        return ["flat"]

    def ask(self, question):
        time.sleep(self.think_s)
        return super().ask(question)


def test_time_at_the_prompts_is_not_spent_from_the_budget(target, tree):
    from nnwizard.budget import CEILING, Budget

    budget = Budget(total_s=0.1, step_s=0.01)
    think = CEILING * budget.total_s  # each answer alone would put the session past its ceiling
    engine = Engine(target, {"t": tree}, load_catalog(), _SlowUser(think), budget=budget)
    diagnosis = engine.run([])
    assert [(r.id, r.status) for r in diagnosis.results] == [("test-measure", "failed"), ("test-raises", "errored")]
    assert all("past" not in r.summary for r in diagnosis.results)
    assert budget.elapsed() < think


SYMPTOM_TREE = """\
id: s
title: Routes on the symptoms the user named
symptoms: [flat, not-reproducible]
start: measure
nodes:
  measure:
    probe: test-measure
    params: {value: 2}
    when:
      - {test: "symptom.not-reproducible == true", goto: asked}
    next: noted
  asked:
    conclude:
      - {hypothesis: nondeterminism, weight: 0.7, evidence: "asked: {summary}"}
  noted:
    conclude:
      - {hypothesis: nondeterminism, weight: 0.25, evidence: "noted: {summary}"}
"""


@pytest.mark.parametrize("symptoms, weight", [(["flat"], 0.25), (["not-reproducible"], 0.7)])
def test_a_when_test_routes_on_the_symptoms_the_user_named(target, tmp_path, symptoms, weight):
    path = tmp_path / "s.yaml"
    path.write_text(SYMPTOM_TREE)
    engine = Engine(target, {"s": load_tree(path)}, load_catalog(), ScriptedPrompter({}))
    diagnosis = engine.run(symptoms, {})
    assert [e.weight for e in diagnosis.evidence] == [weight]


def test_a_when_test_on_an_unknown_symptom_is_a_tree_error(tmp_path):
    from nnwizard.errors import TreeError

    path = tmp_path / "s.yaml"
    path.write_text(SYMPTOM_TREE.replace("symptom.not-reproducible", "symptom.wobbly"))
    with pytest.raises(TreeError, match="unknown symptom 'wobbly'"):
        load_tree(path)
