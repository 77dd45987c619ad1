"""Script mode: an optimizer built again and again over the same parameters (``opt = Adam(...)`` inside
the batch loop). Each new optimizer starts with empty state, so Adam's moment estimates, SGD's
momentum and any scheduler bound to the old object restart at every step: Adam's first step is
about lr x sign(gradient) whatever the gradient's size, and momentum never builds up."""

from __future__ import annotations

from nnwizard.probes.api import ProbeContext, failed, passed, probe, skipped
from nnwizard.probes._recording import on_recording

STATELESS = {"SGD"}   # plain SGD keeps no state unless momentum is set


def _stateful(info) -> bool:
    if info.name in STATELESS:
        return any(float(g.get("momentum", 0) or 0) > 0 for g in info.groups)
    return True


@probe(
    "trace-optimizer-rebuilt",
    title="Is the optimizer built once, or again for every step (its state thrown away)?",
    outcomes={"ok": "each optimizer is built once and keeps stepping",
              "rebuilt": "the script builds a new optimizer over the same parameters every step or two: its state restarts",
              "rebuilt-stateless": "a new plain SGD every step: it keeps no state, so nothing is lost"},
    timeout_s=10,
)
@on_recording
def trace_optimizer_rebuilt(ctx: ProbeContext, rec):
    opts = rec.optimizers
    if not opts or not rec.steps:
        return skipped("no optimizer step was recorded")
    info = max(opts, key=lambda o: o.built)
    # steps of each object (built_at keeps the first 64 builds: past them, the last one kept was followed by others)
    ends = info.built_at[1:] + ([info.steps] if len(info.built_at) == info.built else [])
    runs = [b - a for a, b in zip(info.built_at, ends)]
    stepped = [r for r in runs if r]
    most = max(runs, default=0)
    data = dict(optimizer=info.name, built=info.built, stepped=len(stepped), steps=info.steps, most_steps_by_one=most,
                values=sum(g["values"] for g in info.groups))
    if info.built < 3 or len(stepped) < 3 or info.steps < 4 or most > 2:
        return passed(f"{len(opts)} optimizer(s), built {info.built} time(s) at most; the most stepped object took "
                      f"{most} of the {len(rec.steps)} recorded steps", **data)
    head = (f"the script built {info.built} {info.name} optimizers over the same {data['values']:,} parameter values; "
            f"{len(stepped)} of the first {len(runs)} stepped, none more than {most} time(s), over {info.steps} steps")
    if not _stateful(info):
        return passed(f"{head}, but plain SGD without momentum keeps no state, so rebuilding it loses nothing "
                      "(a scheduler bound to it would restart)", "rebuilt-stateless", **data)
    return failed("rebuilt", f"{head}: its state ({'momentum' if info.name == 'SGD' else 'moment estimates'}) restarts at "
                  "every step, so the update is not the one the optimizer is meant to make", **data)
