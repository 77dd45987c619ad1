"""How many objectives a recorded script trains, read from its recording (script mode).

One optimizer, or several stepped after ONE backward (an encoder's and a decoder's optimizer), train
one objective: its loss curve is the series of the steps that had a backward of their own. Several
optimizers over disjoint parameters that each step after their own backward train several
objectives (a GAN's discriminator and generator, an actor and a critic): each optimizer's own series
is a curve, the interleaved one is not. When one objective's backward runs through a model whose
parameters another of them holds (the generator's loss is the discriminator's output), the
objectives are coupled (adversarial): neither loss is expected to fall while the other learns, so
curve-based judgements (trace-run, script-overfit, script-lr-sweep, script-ladder) do not apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ADVERSARIAL = {"adversarial": "several optimizers play against each other (one's loss goes through another's model): "
                              "their losses need not fall, no curve is judged"}
OWN_SHARE = 0.5   # an optimizer is an objective of its own when at least this share of its steps had a backward of their own


@dataclass
class Objectives:
    series: dict[int | None, list[float]]          # optimizer index (None: the one objective) -> its loss series
    through: dict[int, list[int]] = field(default_factory=dict)  # optimizer -> models (of other objectives) its backward went through
    # optimizer -> models its backward went through whose own optimizer did not step while it trained (a teacher
    # run with grad mode on after its training ended: gradients computed for nothing)
    idle_through: dict[int, list[int]] = field(default_factory=dict)
    text: str = ""
    holder: dict[int, int] = field(default_factory=dict)   # model index -> the optimizer holding its parameters (alone)

    @property
    def several(self) -> bool:
        return len(self.series) > 1

    @property
    def adversarial(self) -> bool:
        return bool(self.through)

    def steps_per_point(self, steps: int) -> float:
        """Optimizer steps per point of the shortest series (to plan a rerun in series points)."""
        return steps / max(1, min((len(v) for v in self.series.values()), default=0))


def optimizer_label(rec, index: int) -> str:
    info = rec.optimizers[index]
    models = [rec.models[m].name for m in info.models if m < len(rec.models)]
    return f"{info.name} #{index + 1}" + (f" ({', '.join(models)})" if models else "")


def objectives(rec) -> Objectives:
    steps = [s for s in rec.steps if s.optimizer >= 0]
    own: dict[int, list[float]] = {}
    for s in steps:
        if s.backwards > 0 and s.loss is not None:
            own.setdefault(s.optimizer, []).append(s.loss)
    total = {i: sum(1 for s in steps if s.optimizer == i) for i in own}
    separate = [i for i in own if i < len(rec.optimizers) and len(own[i]) >= OWN_SHARE * total[i]]
    params = {i: {id(p) for g in rec.optimizers[i].optimizer.param_groups for p in g["params"]} for i in separate}
    disjoint = all(not (params[a] & params[b]) for a in separate for b in separate if a < b)
    if len(separate) < 2 or not disjoint:
        return Objectives({None: [s.loss for s in rec.steps if s.loss is not None]})
    holder: dict[int, int] = {}   # model index -> the separate optimizer holding its parameters (alone)
    for m in rec.models:
        ids = {id(p) for p in m.parameters()}
        holders = [i for i in separate if params[i] & ids]
        if len(holders) == 1:
            holder[m.index] = holders[0]
    through: dict[int, list[int]] = {}
    idle: dict[int, list[int]] = {}
    at = {i: [k for k, s in enumerate(steps) if s.optimizer == i] for i in separate}
    for i in separate:
        mine = [s for s in steps if s.optimizer == i and s.backwards > 0]
        crossed: dict[int, int] = {}
        for s in mine:
            for m in s.forwards:
                if holder.get(m, i) != i:
                    crossed[m] = crossed.get(m, 0) + 1
        # a moving target only while the other optimizer steps within this one's span (a GAN's alternation); a
        # teacher whose optimizer finished before the student's began is fixed, whatever its forward's grad mode
        first, last = at[i][0], at[i][-1]
        often = sorted(m for m, n in crossed.items() if n >= OWN_SHARE * len(mine))
        models = [m for m in often if any(first < k < last for k in at.get(holder.get(m), ()))]
        if models:
            through[i] = models
        if len(often) > len(models):
            idle[i] = [m for m in often if m not in models]
    text = (f"{len(separate)} optimizers over disjoint parameters, each stepped after its own backward: "
            + ", ".join(optimizer_label(rec, i) for i in separate))
    if through:
        text += "; adversarial: " + "; ".join(
            f"{optimizer_label(rec, i)}'s loss goes through {', '.join(rec.models[m].name for m in ms)}, "
            f"whose parameters {', '.join(sorted({f'{rec.optimizers[holder[m]].name} #{holder[m] + 1}' for m in ms}))} holds"
            for i, ms in through.items())
    return Objectives({i: own[i] for i in separate}, through, text=text, idle_through=idle, holder=holder)


def idle_models_text(rec, obj: Objectives) -> str:
    """The models an optimizer's backward ran through while the optimizer holding them did not step, in words."""
    def holds(m: int) -> str:
        h = obj.holder.get(m)
        return f"{optimizer_label(rec, h)} holds and did not step while it trained" if h is not None else "no optimizer holds"
    return "; ".join(f"{optimizer_label(rec, i)}'s backward ran through {rec.models[m].name}, whose parameters {holds(m)}"
                     for i, ms in obj.idle_through.items() for m in ms)


def adversarial_reason(obj: Objectives) -> str:
    return (f"{obj.text}: the objectives compete (a loss measured through a model another optimizer trains has a "
            f"moving target), so it need not fall while the other learns; a curve-based judgement (learning rate, "
            f"learning at all) does not apply")
