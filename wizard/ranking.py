"""From evidence to a ranked list of hypotheses, with a confidence that can be explained.

Each piece of evidence carries a weight in [-1, 1] set by the tree that drew it. Supporting weights
combine as a noisy-OR on top of the catalog prior; opposing weights scale the result down:

    confidence = (1 - (1 - prior) * prod(1 - w_i for w_i > 0)) * prod(1 - |w_j| for w_j < 0)

so two independent 0.6 observations give 0.84, and a 0.5 counter-observation halves it. The same
measurement (one probe's sentence) concluded by two trees counts once. The report
lists every weight with the measured sentence behind it. A hypothesis with no supporting evidence is
not listed. A finding is a hypothesis at 0.5 or above (CONTRACT §4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nnwizard.catalog import Catalog

FINDING = 0.5


@dataclass
class Evidence:
    hypothesis: str
    weight: float
    text: str
    tree: str
    node: str
    probe: str | None = None


@dataclass
class Ranked:
    id: str
    title: str
    category: str
    confidence: float
    evidence: list[Evidence] = field(default_factory=list)
    meaning: str = ""
    fix: str = ""
    snippet: str = ""
    prior: float = 0.0
    fix_here: str = ""   # the fix in the program's own terms (wizard/tailor.py), when the run tells them


def confidence(prior: float, weights: list[float]) -> float:
    miss = 1.0 - prior
    for w in weights:
        if w > 0:
            miss *= 1.0 - w
    value = 1.0 - miss
    for w in weights:
        if w < 0:
            value *= 1.0 + w
    return round(max(0.0, min(1.0, value)), 3)


def _distinct(items: list[Evidence]) -> list[Evidence]:
    """One measurement counts once: the same sentence from the same probe, concluded by two trees
    (a cached probe walked twice), keeps only its strongest weight of each sign."""
    best: dict[tuple, Evidence] = {}
    for e in items:
        key = (e.probe, e.text, e.weight > 0)
        if key not in best or abs(e.weight) > abs(best[key].weight):
            best[key] = e
    return list(best.values())


def rank(evidence: list[Evidence], catalog: Catalog) -> list[Ranked]:
    by_id: dict[str, list[Evidence]] = {}
    for e in evidence:
        by_id.setdefault(e.hypothesis, []).append(e)
    by_id = {hid: _distinct(items) for hid, items in by_id.items()}
    ranked = []
    for hid, items in by_id.items():
        if not any(e.weight > 0 for e in items):
            continue
        h = catalog.hypotheses[hid]
        ranked.append(
            Ranked(
                id=hid, title=h.title, category=h.category,
                confidence=confidence(h.prior, [e.weight for e in items]),
                evidence=sorted(items, key=lambda e: -e.weight),
                meaning=h.meaning, fix=h.fix, snippet=h.snippet, prior=h.prior,
            )
        )
    ranked.sort(key=lambda r: (-r.confidence, -max(e.weight for e in r.evidence), -r.prior, r.id))
    return ranked
