"""The engine walks the trees for the session's symptoms, runs probes, asks questions and collects
evidence. It imports no UI library: it talks to a Prompter and emits Events that a view renders."""

from __future__ import annotations

import json
import operator
import string
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from nnwizard.budget import Budget, paused
from nnwizard.catalog import Catalog
from nnwizard.isolation import GRACE_S, run_probe
from nnwizard.probes.api import ProbeContext, ProbeResult, cannot_run, could_not_run, get, moot_result
from nnwizard.cuda_lost import CudaContextLost
from nnwizard.events import Event, Question  # noqa: F401 - (re-exported: their home was here)
from nnwizard.ranking import Evidence, Ranked, rank
from nnwizard.tailor import tailor
from nnwizard.target import Target
from nnwizard.tree import END, SYMPTOMS, Node, Tree

MAX_TREES = 64
# Once a finding stands at this confidence, the trees queued later to explain a measured symptom run
# no more probes that train for many steps: they would train with a fault already known to be there.
CONFIRMED = 0.85


class Prompter(Protocol):
    def choose_symptoms(self, choices: dict[str, str]) -> list[str]: ...

    def ask(self, question: Question) -> str: ...


@dataclass
class Diagnosis:
    target: Target
    seed: int
    symptoms: list[str]
    given_symptoms: list[str]
    answers: dict[str, str] = field(default_factory=dict)
    results: list[ProbeResult] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)
    ranked: list[Ranked] = field(default_factory=list)
    interrupted: bool = False
    budget: Budget | None = None
    started: float = field(default_factory=time.time)
    duration_s: float = 0.0


class _Quote(string.Formatter):
    """Formats evidence sentences; a missing or unformattable field shows as '?'."""

    def get_value(self, key, args, kwargs):
        return kwargs.get(key, "?") if isinstance(key, str) else "?"

    def format_field(self, value, spec):
        try:
            return super().format_field(value, spec)
        except (ValueError, TypeError):
            return str(value)


_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


def quote(template: str, result: ProbeResult | None) -> str:
    values: dict[str, Any] = {}
    if result is not None:
        values.update({k: v for k, v in result.data.items() if not isinstance(v, dict) and not (isinstance(v, list) and len(v) > 8)})
        values.update(summary=result.summary, outcome=result.outcome, probe=result.id)
    try:
        return _Quote().vformat(template, (), values)
    except (ValueError, IndexError, KeyError):
        return template


def _lookup(data: dict, path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class Engine:
    def __init__(
        self,
        target: Target,
        trees: dict[str, Tree],
        catalog: Catalog,
        prompter: Prompter,
        *,
        seed: int = 0,
        probe_timeout: float | None = None,
        listener: Callable[[Event], None] | None = None,
        budget: Budget | None = None,
        checkpoint: Callable[[Diagnosis], None] | None = None,
    ):
        self.target, self.trees, self.catalog, self.prompter = target, trees, catalog, prompter
        self.checkpoint = checkpoint  # gets a partial Diagnosis after each probe (a worker streams it to its supervisor)
        self.seed, self.probe_timeout, self.budget = seed, probe_timeout, budget
        self.listener = listener or (lambda event: None)
        self._cache: dict[tuple, ProbeResult] = {}
        self._reported: set[tuple] = set()  # cache keys whose result is in diagnosis.results
        self._latest: dict[str, ProbeResult] = {}
        self._first: set[str] = set()  # the trees the session's symptoms queued (not those a measured symptom added)
        self._queue: list[Tree] = []  # the trees still to walk (the session queue itself, grown by measured symptoms)
        self._tree: Tree | None = None  # the tree being walked
        self._walked: list[str] = []  # the ids of the trees walked (or being walked)
        self._diagnosis: Diagnosis | None = None  # the one being built (for the findings that stand)

    # ------------------------------------------------------------------------------------ public
    def run(self, symptoms: list[str] | None = None, answers: dict[str, str] | None = None) -> Diagnosis:
        given = list(symptoms or [])
        diagnosis = self._building = Diagnosis(self.target, self.seed, symptoms=[], given_symptoms=given,
                                               answers=dict(answers or {}), budget=self.budget)
        try:
            if not given:
                with paused(self.budget):
                    given = self.prompter.choose_symptoms(dict(SYMPTOMS)) or ["auto"]
                diagnosis.given_symptoms = given
            diagnosis.symptoms = [s for s in given if s != "auto"]
            queue = self._queue = self._trees_for(given)
            self._walked = diagnosis.trees
            self._first = {t.id for t in queue}
            if self.budget is not None:
                self._cheap_first(queue)
            while queue and len(diagnosis.trees) < MAX_TREES:
                tree = queue.pop(0)
                if tree.id in diagnosis.trees:
                    continue
                diagnosis.trees.append(tree.id)
                self._tree = tree
                for symptom in self._walk(tree, diagnosis):
                    if symptom not in diagnosis.symptoms:
                        diagnosis.symptoms.append(symptom)
                    queue += [t for t in self._trees_for([symptom]) if t.id not in diagnosis.trees and t not in queue]
        except KeyboardInterrupt:
            diagnosis.interrupted = True
            # what was measured ahead of its tree walk still belongs in the partial report
            diagnosis.results += [r for k, r in self._cache.items() if k not in self._reported]
        except CudaContextLost as lost:   # the CPU re-run asks nothing the user already answered
            lost.symptoms, lost.answers = list(diagnosis.given_symptoms), dict(diagnosis.answers)
            raise
        diagnosis.ranked = rank(diagnosis.evidence, self.catalog)
        tailor(diagnosis)
        diagnosis.duration_s = round(time.time() - diagnosis.started, 2)
        return diagnosis

    def partial(self) -> Diagnosis:
        """What the diagnosis under way holds now, ranked: the measurements so far, as a report would show them."""
        d = self._building
        snap = Diagnosis(d.target, d.seed, symptoms=list(d.symptoms), given_symptoms=list(d.given_symptoms),
                         answers=dict(d.answers), evidence=list(d.evidence), trees=list(d.trees), budget=d.budget,
                         started=d.started, results=list(d.results) + [r for k, r in self._cache.items() if k not in self._reported])
        snap.ranked = rank(snap.evidence, self.catalog)
        tailor(snap)
        snap.duration_s = round(time.time() - snap.started, 2)
        return snap

    # ---------------------------------------------------------------------------------- schedule
    def _cheap_first(self, trees: list[Tree]) -> None:
        """Run the fixed-cost probes of the session's first trees before any probe that trains for
        many steps, so that the loop audits (a handful of steps each) are never starved by one slow
        probe. Their results are cached; each enters the diagnosis when its tree walk reaches it."""
        nodes = [(tree, name, node) for tree in trees for name, node in tree.nodes.items() if node.kind == "probe"]
        cheap = [(t, n, node) for t, n, node in nodes if get(node.probe).share == 0]
        if not cheap:
            return
        self.listener(Event("tree-start", "cheap-first", data={"title": "Cheap audits first (a few steps each)"}))
        for tree, name, node in cheap:
            self._run_cached(tree, name, node)
        self.listener(Event("tree-end", "cheap-first"))

    def _plan_ahead(self, running: Node) -> None:
        """Tell the budget what is still to run before ``running`` is allotted: the probes of the tree
        being walked and of the trees queued after it that have no result yet (a branch not taken
        stays counted until its tree ends: the budget errs towards keeping time), and, while one of
        them measures symptoms, the share of the costliest trees one measured symptom may queue."""
        trees = ([self._tree] if self._tree is not None else []) + [t for t in self._queue if t is not self._tree]
        unrun = [n for t in trees for n in t.nodes.values() if n.kind == "probe" and self._key(n) not in self._cache]
        ahead = [n for n in unrun if self._key(n) != self._key(running)]
        budget = self.budget
        budget.pending = {n.probe: get(n.probe).share for n in ahead if get(n.probe).share > 0}
        budget.floors = {p: get(p).floor for p in budget.pending}
        budget.fixed = {n.probe: get(n.probe).cost for n in ahead if get(n.probe).share == 0}
        measures = any(n.follow == "symptoms" for n in [running, *unrun])  # the same run may sit in several trees
        budget.future = self._symptom_share(trees, {running.probe, *budget.pending, *(k[0] for k in self._cache)}) if measures else 0.0

    def _symptom_share(self, queued: list[Tree], known: set[str]) -> float:
        """The most the trees of one symptom, not queued yet, would share among the budgeted probes
        they add (the ones not run and not pending already). As with the floors kept for the probes
        already queued, a probe whose smallest run cannot fit what is left beside the ones before it
        keeps no share: it will say it did not fit, and it starves no one."""
        best = 0.0
        skip = {t.id for t in queued} | set(self._walked)
        room = max(0.0, self.budget.spare()) if self.budget is not None else float("inf")
        step = (self.budget.step_s or 0.0) if self.budget is not None else 0.0
        for symptom in SYMPTOMS:
            added = list(dict.fromkeys(n.probe for t in self._trees_for([symptom]) if t.id not in skip
                                       for n in t.nodes.values() if n.kind == "probe" and n.probe not in known))
            share, floors = 0.0, 0.0
            for probe_id in added:
                spec = get(probe_id)
                if spec.share > 0 and floors + spec.floor * step <= room:
                    share, floors = share + spec.share, floors + spec.floor * step
            best = max(best, share)
        return best

    # ----------------------------------------------------------------------------------- walking
    def _trees_for(self, symptoms: list[str]) -> list[Tree]:
        """Per symptom: by priority, then the trees whose main symptom it is, then by id."""
        ordered = []
        for s in symptoms:
            matching = [t for t in self.trees.values() if s in t.symptoms]
            ordered += sorted(matching, key=lambda t: (t.priority, t.symptoms[0] != s, t.id))
        return ordered

    def _walk(self, tree: Tree, diagnosis: Diagnosis) -> list[str]:
        """Walk one tree for real (probes run, questions asked, evidence added); returns the symptoms measured by
        ``follow: symptoms`` probe nodes."""
        self.listener(Event("tree-start", tree.id, data={"title": tree.title}))

        def conclude(name: str, c, source: ProbeResult | None) -> None:
            evidence = Evidence(c.hypothesis, c.weight, quote(c.evidence, source), tree.id, name, source.id if source else None)
            diagnosis.evidence.append(evidence)
            self.listener(Event("conclusion", tree.id, name, {"evidence": evidence}))

        measured = self._through(tree, diagnosis, self._latest, lambda name, node: self._probe(tree, name, node, diagnosis),
                                 lambda name, node: self._ask(tree, name, node, diagnosis), conclude)
        self.listener(Event("tree-end", tree.id))
        return measured

    def _through(self, tree: Tree, diagnosis: Diagnosis, latest: dict[str, ProbeResult],
                 probe: Callable[[str, Node], ProbeResult | None], ask: Callable[[str, Node], str | None],
                 conclude: Callable[[str, Any, ProbeResult | None], None]) -> list[str]:
        """The one tree walker: from the tree's start to its end, a probe node's result from ``probe`` (None: the
        walk stops there), an ask node's answer from ``ask`` (None: it stops), a branch routed on ``latest``, each
        conclusion of a conclude node handed to ``conclude`` (not when its probe could not measure: a probe that
        could not measure adds no evidence, for or against). Returns the symptoms ``follow: symptoms`` nodes
        measured."""
        measured: list[str] = []
        last: ProbeResult | None = None
        name = tree.start
        for _ in range(len(tree.nodes) + 1):  # a tree is acyclic; the bound only guards a malformed one
            if name == END:
                break
            node = tree.nodes[name]
            if node.kind == "probe":
                last = probe(name, node)
                if last is None:
                    break
                latest[node.probe] = last
                if node.follow == "symptoms":
                    measured += [s for s in last.data.get("symptoms", []) if s in SYMPTOMS and s != "auto"]
                name = self._route(node, last.outcome, node.on, diagnosis, latest)
            elif node.kind == "ask":
                answer = ask(name, node)
                if answer is None:
                    break
                name = self._route(node, answer, node.on, diagnosis, latest)
            elif node.kind == "branch":
                name = self._route(node, self._value_of(node.branch, diagnosis, latest), node.cases, diagnosis, latest)
            else:
                for c in node.conclude or []:
                    source = latest.get(c.source) if c.source else last
                    if not any(r is not None and could_not_run(r) for r in (source, last)):
                        conclude(name, c, source)
                name = node.next
        return measured

    def _route(self, node: Node, value: str | None, table: dict[str, str], diagnosis: Diagnosis,
               latest: dict[str, ProbeResult] | None = None) -> str:
        if value is not None and value in table:
            return table[value]
        latest = self._latest if latest is None else latest
        for test in node.when:
            source, path, op, literal = test.parts()
            if source == "answer":
                actual = diagnosis.answers.get(path)
            elif source == "symptom":
                actual = path in diagnosis.given_symptoms
            else:
                result = latest.get(source)
                actual = _lookup(result.data, path) if result else None
                if result and path in ("outcome", "status", "summary"):
                    actual = getattr(result, path)
            try:
                if actual is not None and _OPS[op](actual, literal):
                    return test.goto
            except TypeError:
                continue
        return node.next

    def _value_of(self, ref: str, diagnosis: Diagnosis, latest: dict[str, ProbeResult] | None = None) -> str | None:
        if ref.startswith("answer:"):
            return diagnosis.answers.get(ref.removeprefix("answer:"))
        result = (self._latest if latest is None else latest).get(ref)
        return result.outcome if result else "not-run"

    def _ask(self, tree: Tree, name: str, node: Node, diagnosis: Diagnosis) -> str:
        if node.key in diagnosis.answers:
            return diagnosis.answers[node.key]
        question = Question(node.key, node.ask, dict(node.choices), node.default, node.help)
        self.listener(Event("question", tree.id, name, {"question": question}))
        with paused(self.budget):
            answer = self.prompter.ask(question)
        diagnosis.answers[node.key] = answer
        self.listener(Event("answer", tree.id, name, {"key": node.key, "answer": answer}))
        return answer

    def _probe(self, tree: Tree, name: str, node: Node, diagnosis: Diagnosis) -> ProbeResult:
        key = self._key(node)
        self._diagnosis = diagnosis
        result = self._cache.get(key) or self._not_needed(tree, name, node, diagnosis) or self._run_cached(tree, name, node)
        if key not in self._reported:
            self._reported.add(key)
            diagnosis.results.append(result)
        return result

    def _confirmed(self, diagnosis: Diagnosis) -> Ranked | None:
        """The top finding when it stands at ``CONFIRMED`` or more, counting what the trees still
        queued will conclude from results already measured (the cheap audits ran first)."""
        top = next(iter(rank(diagnosis.evidence + self._foreseen(diagnosis), self.catalog)), None)
        return top if top is not None and top.confidence >= CONFIRMED else None

    def _foreseen(self, diagnosis: Diagnosis) -> list[Evidence]:
        """The evidence the queued trees not walked yet will draw from results already in the cache:
        each is walked as far as it goes without running a probe or asking a question, and nothing of
        this walk enters the diagnosis (the real walk adds it in its turn)."""
        evidence: list[Evidence] = []
        for tree in self._queue:
            if tree.id in diagnosis.trees:
                continue
            self._through(tree, diagnosis, dict(self._latest), lambda name, node: self._cache.get(self._key(node)),
                          lambda name, node: diagnosis.answers.get(node.key),
                          lambda name, c, source, tree=tree: evidence.append(
                              Evidence(c.hypothesis, c.weight, "", tree.id, name, source.id if source else None)))
        return evidence

    def _not_needed(self, tree: Tree, name: str, node: Node, diagnosis: Diagnosis) -> ProbeResult | None:
        """The result of a budgeted probe that is deliberately not run (None: run it): under a session
        budget, in a tree queued to explain a symptom the session measured, once a finding is already
        confirmed. The probe adds no evidence and says why; the finding's fix comes first. (In the
        session's own trees such a probe still runs, unless the budget would cut its run: ``ProbeContext.moot``.)"""
        spec = get(node.probe)
        if self.budget is None or spec.share == 0 or tree.id in self._first:
            return None
        top = self._confirmed(diagnosis)
        if top is None:
            return None
        result = moot_result(top.id, top.confidence)
        result.id, result.params = spec.id, dict(node.params)
        self._cache[self._key(node)] = result
        self.listener(Event("probe-start", tree.id, name, {"probe": spec.id, "title": spec.title}))
        self.listener(Event("probe-end", tree.id, name, {"result": result}))
        return result

    @staticmethod
    def _key(node: Node) -> tuple:
        return node.probe, json.dumps(node.params, sort_keys=True, default=str)

    def _run_cached(self, tree: Tree, name: str, node: Node) -> ProbeResult:
        key = self._key(node)
        if key in self._cache:
            return self._cache[key]
        spec = get(node.probe)
        self.listener(Event("probe-start", tree.id, name, {"probe": spec.id, "title": spec.title}))

        def progress(fraction: float, text: str) -> None:
            self.listener(Event("probe-progress", tree.id, name, {"probe": spec.id, "fraction": fraction, "text": text}))

        ctx = ProbeContext(self.target, dict(node.params), dict(self._latest), self.seed, on_progress=progress,
                           budget=self.budget)
        limit, grace, reason = self.probe_timeout, GRACE_S, None
        if self.budget is not None:
            self._plan_ahead(node)
            ctx.allowance_s, limit, reason, lendable = self.budget.allot(spec.share, spec.cost, spec.timeout_s,
                                                                         self.probe_timeout, spec.id, spec.floor)
            if ctx.allowance_s is not None and self.probe_timeout is None:
                ctx.lendable_s = lendable  # what the budgeted probes after it (and future trees) were to share above their floors
            if ctx.allowance_s is not None and self._diagnosis is not None and tree.id in self._first:
                # a run the budget would cut cannot add much beside a confirmed finding: the probe is then not run
                top = self._confirmed(self._diagnosis)
                ctx.moot = (top.id, top.confidence) if top is not None else None
            grace = self.budget.grace_s()
            if ctx.allowance_s is not None:  # a safety net: the probe's planned steps fit its allowance
                ctx.deadline = time.monotonic() + 1.25 * ctx.allowance_s + 3
        if reason is not None:
            result = cannot_run(reason, budget_s=round(self.budget.total_s, 1), reason="budget")
            result.id, result.params = spec.id, dict(node.params)
        else:
            result = run_probe(spec, ctx, limit, grace)
        if "timeout_s" in result.data and self.budget is not None:
            self.budget.timeouts += 1
        self._cache[key] = result
        self.listener(Event("probe-end", tree.id, name, {"result": result}))
        if self.checkpoint is not None and getattr(self, "_building", None) is not None:
            self.checkpoint(self.partial())
        return result
