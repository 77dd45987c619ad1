"""The rules that say whether a reported accuracy can be right, given the correct predictions nnwizard
counted on the same samples. One set of rules for module mode's ``metric-audit`` (the user's
``evaluate``) and script mode's ``script-metric-audit`` (the numbers the script prints).

    verdict = judge("accuracy", 0.0, correct=871, counts={"samples": 1000, "batches": 16, ...}, on="1000 samples")
    verdict.outcome   # "percent" | "above-one" | "wrong-count" | "fixed" | "fraction-as-percent" | None (agrees)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOLERANCE = 0.02          # an accuracy may differ from the recount by this much (plus one sample) and agree
FIXED_CORRECT = 3         # a reported 0 while this many predictions are right is fixed by construction


@dataclass
class Verdict:
    outcome: str | None       # None: the reported number agrees with the recount
    text: str
    fault: bool               # a fault (failed) or a reading note (percent: passed)
    data: dict[str, Any] = field(default_factory=dict)


def explain(value: float, correct: float, counts: dict[str, int]) -> str | None:
    """Which count, divided into the correct predictions, gives the reported number. A number above 1 that is the
    percentage is read as one first (with batches of 100 samples, correct / batches gives the same number)."""
    samples = counts.get("samples")
    percentage = samples and value > 1 and abs(correct * 100 / samples - value) <= 0.5
    if percentage:
        return f"{correct:.0f} correct / {samples} samples x 100 = {correct * 100 / samples:.4g} (a percentage)"
    for what, d in counts.items():
        if d and abs(correct / d - value) <= 0.005 * max(1.0, abs(value)):
            return f"{correct:.0f} correct / {d} ({what}) = {correct / d:.4g}"
    return None


def judge(key: str, value: float, correct: float, counts: dict[str, int], on: str, *, percent_sign: bool = False,
          allowed: tuple[str, ...] = ("samples",), fixed_zero: bool = False) -> Verdict:
    """The reported ``value`` of ``key`` against ``correct`` right predictions over ``counts["samples"]``.
    ``allowed``: the counts a right script may divide by (script mode adds the data set's length when its
    evaluation pass was cut short). ``percent_sign``: the number was printed with a % after it.
    ``fixed_zero``: judge a reported 0 while predictions are right as fixed by construction (script mode; module
    mode compares two models instead)."""
    samples = counts["samples"]
    accuracy = correct / samples if samples else 0.0
    arithmetic = explain(value, correct, counts)
    data: dict[str, Any] = dict(key=key, first=value, arithmetic=arithmetic or "")
    if value > 1:
        if arithmetic and "percentage" in arithmetic:
            data["percent"] = True
            return Verdict("percent", f"{key} = {value:.4g} in percent: {arithmetic} on {on}; read as {value / 100:.4f}",
                           False, data)
        how = f": {arithmetic}" if arithmetic else ""
        return Verdict("above-one", f"{key} = {value:.4g}, above 1, on {on} where {correct:.0f} predictions are "
                       f"right{how}, not {correct:.0f} / {samples} = {accuracy:.4f}", True, data)
    if fixed_zero and value == 0 and correct >= FIXED_CORRECT:
        return Verdict("fixed", f"{key} = 0 on {on} where {correct:.0f} of {samples} predictions are right "
                       f"({accuracy:.4f}): the number is 0 by construction, whatever the model predicts", True, data)
    if percent_sign and value <= 1 and abs(value - accuracy) <= TOLERANCE + 1.0 / max(samples, 1) and accuracy > 0.01:
        data["percent"] = False
        return Verdict("fraction-as-percent", f"{key} is printed as {value:.4g}% on {on}, where {correct:.0f} / {samples} = "
                       f"{accuracy:.4f} are right: a fraction printed as a percentage (it reads {accuracy * 100:.4g}%)",
                       True, data)
    consistent = arithmetic is not None and any(f"({what})" in arithmetic for what in allowed)
    if not consistent and abs(value - accuracy) > TOLERANCE + 1.0 / max(samples, 1):
        how = f" ({arithmetic})" if arithmetic else ""
        return Verdict("wrong-count", f"{key} = {value:.4g} on {on}; the same model gets {correct:.0f} / {samples} = "
                       f"{accuracy:.4f} right{how}", True, data)
    return Verdict(None, f"{key} = {value:.4g} agrees with {correct:.0f} / {samples} = {accuracy:.4f}", False, data)
