"""Script mode: an optimizer built again and again over the same parameters (``opt = Adam(...)`` inside
the batch loop). Each new optimizer starts with empty state, so Adam's moment estimates, SGD's
momentum and any scheduler bound to the old object restart at every step: Adam's first step is
about lr x sign(gradient) whatever the gradient's size, and momentum never builds up."""

from __future__ import annotations

from nnwizard.probes.api import ProbeContext, failed, passed, probe, skipped
from nnwizard.probes.trace import _on_recording

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
@_on_recording
def trace_optimizer_rebuilt(ctx: ProbeContext, rec):
    opts = rec.optimizers
    if not opts or not rec.steps:
        return skipped("no optimizer step was recorded")
    families: dict[tuple, list] = {}
    for o in opts:
        key = (o.name, frozenset(id(p) for g in o.groups for p in g["params"]))
        families.setdefault(key, []).append(o)
    name, members = max(((k[0], v) for k, v in families.items()), key=lambda kv: len(kv[1]))
    stepped = [o for o in members if o.steps]
    total = sum(o.steps for o in members)
    most = max((o.steps for o in members), default=0)
    data = dict(optimizer=name, built=len(members), stepped=len(stepped), steps=total, most_steps_by_one=most,
                values=sum(g["values"] for g in members[0].groups))
    if len(stepped) < 3 or total < 4 or most > 2:
        return passed(f"{len(opts)} optimizer object(s); the most stepped one took {max(o.steps for o in opts)} "
                      f"of the {len(rec.steps)} recorded steps", **data)
    head = (f"the script built {len(members)} {name} optimizers over the same {data['values']:,} parameter values; "
            f"{len(stepped)} of them stepped, none more than {most} time(s), over {total} steps")
    if not all(_stateful(o) for o in stepped):
        return passed(f"{head}, but plain SGD without momentum keeps no state, so rebuilding it loses nothing "
                      "(a scheduler bound to it would restart)", "rebuilt-stateless", **data)
    return failed("rebuilt", f"{head}: its state ({'momentum' if name == 'SGD' else 'moment estimates'}) restarts at "
                  "every step, so the update is not the one the optimizer is meant to make", **data)
