"""``training-crash``: a few steps of the user's real training code (their ``train_step``, else a
short ``train_epoch``, else the reference step) and their ``evaluate``, on real batches. An exception
is not a usage error but a diagnosis: ``_crash.classify_exception`` reads it into a hypothesis (the
outcome), naming the op, its operands and the user's file:line. Before any step, the user's Module
classes are checked for attributes that shadow nn.Module's own methods (``def train(self, x, y)``).
"""

from __future__ import annotations

from nnwizard import reference
from nnwizard.probes._crash import classify_exception, shadowed_methods
from nnwizard.probes.api import ProbeContext, failed, passed, probe
from nnwizard.target import user_source_files

CLASSIFIED = ("target-shape-mismatch", "no-parameters", "module-method-shadowed", "op-shape-mismatch", "dtype-mismatch",
              "device-mismatch", "labels-wrong-dtype", "labels-out-of-range", "layer-shape-mismatch",
              "inplace-modification", "graph-retained", "disconnected-parameters", "frozen-parameters", "loss-output-mismatch",
              "axes-swapped")
STEPS = 3  # a second and third step catch what only fails once the first one ran (a freed graph, a stale buffer)


@probe(
    "training-crash",
    title="A few real training steps and one evaluate: an exception becomes a diagnosis",
    outcomes={"ok": "the steps and evaluate ran without raising",
              "unclassified": "training raised, in a way no hypothesis explains",
              **{h: f"training raised: {h}" for h in CLASSIFIED}},
    timeout_s=60,
)
def training_crash(ctx: ProbeContext):
    target = ctx.target
    files = user_source_files(target)
    model = target.fresh_model(ctx.seed)
    shadows = shadowed_methods(model)
    if shadows:
        s = shadows[0]
        text = (f"{s.cls}.{s.signature}" + (f" at {s.where}" if s.where else "") + f" overrides nn.Module.{s.name}: "
                f"{s.why}; model.{s.name}() no longer does what nn.Module, the wizard and most loops expect")
        others = [f"{x.cls}.{x.name}" for x in shadows[1:4]]
        if others:
            text += f" (also {', '.join(others)})"
        return failed("module-method-shadowed", text, sentence=text, shadowed=[f"{x.cls}.{x.name}" for x in shadows],
                      where=s.where, before_training=True)
    batch = target.batch()
    inputs, targets = batch
    ran: list[str] = []
    phase = "optimizer"
    try:
        optimizer = target.make_optimizer(model)
        if target.user_train_step or not target.user_train_epoch:
            phase = None
            for _ in range(2 if target.sample_limit else STEPS):  # 2 when the session slices dear batches
                target.train_step(model, batch, optimizer)
                ran.append("step")
                if ctx.time_left() < 2:
                    break
        else:
            phase = None
            loader = target.loader("train", 2)
            target.train_epoch(model, loader, optimizer, reference.NoScheduler())
            ran.append("epoch")
        if target.user_evaluate:
            phase = "evaluate"
            target.evaluate(model, target.subset_loader("val", 2) or target.subset_loader("train", 2))
            ran.append("evaluate")
    except Exception as exc:  # the user's code raising is what this probe measures
        c = classify_exception(exc, model=model, loss_fn=target.loss_fn, files=files, inputs=inputs, targets=targets,
                               phase=phase)
        fn = ("train_step" if target.user_train_step else "train_epoch" if target.user_train_epoch else "the reference step")
        if phase == "evaluate":
            fn = "evaluate"
        if phase == "evaluate":
            when = f" (after {len(ran)} training call{'s' if len(ran) != 1 else ''} ran without raising)"
        else:
            when = f" on call {len(ran) + 1}" if ran else " on its first call"
        text = f"{fn} raised{when}: {c.sentence}"
        data = dict(c.as_dict(), sentence=text, fn=fn, completed=len(ran), training_raised=True)
        outcome = c.hypothesis if c.hypothesis in CLASSIFIED else "unclassified"
        return failed(outcome, text, **data)
    what = {"step": f"{ran.count('step')} steps of {'train_step' if target.user_train_step else 'the reference step'}",
            "epoch": "one train_epoch over 2 batches", "evaluate": "evaluate on 2 batches"}
    return passed("ran without raising: " + ", ".join(dict.fromkeys(what[r] for r in ran)), steps=ran.count("step"),
                  calls=ran)
