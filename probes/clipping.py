"""Script mode: where the script clips its gradients. ``clip_grad_norm_`` / ``clip_grad_value_`` only
act when they run between a step's backward and its ``optimizer.step()``; called before the backward
(after ``zero_grad``) they see no gradient, called after the step they clip gradients that were
already applied and are about to be cleared. Either way the script trains without the clipping it
asked for, which matters exactly when gradients spike."""

from __future__ import annotations

from nnwizard.probes.api import ProbeContext, failed, passed, skipped, probe
from nnwizard.probes._recording import fmt, on_recording


@probe(
    "trace-clip",
    title="Gradient clipping of the script: does it act on the gradient a step applies?",
    outcomes={"ok": "gradient clipping runs between backward() and optimizer.step(), or the script does not clip",
              "clip-stale": "every clipping call ran where no step applies what it clipped (before backward or after step)"},
    timeout_s=10,
)
@on_recording
def trace_clip(ctx: ProbeContext, rec):
    clips = rec.clips
    if not clips:
        return passed("the script does not clip its gradients", calls=0)
    if not rec.steps:
        return skipped("gradient clipping was called but no optimizer step was recorded")
    fresh = [c for c in clips if c.fresh]
    sites = sorted({c.where or "?" for c in clips})
    data = dict(calls=len(clips), fresh_calls=len(fresh), sites=sites, fn=clips[0].fn,
                limit=clips[0].limit)
    if fresh:
        norms = [c.norm for c in fresh if c.norm is not None]
        limit = next((c.limit for c in fresh if c.limit is not None), None)
        extra = ""
        if norms and limit is not None and fresh[0].fn == "clip_grad_norm_":
            over = sum(1 for n in norms if n > limit)
            data.update(over_limit=over, measured=len(norms))
            extra = (f"; the gradient norm exceeded max_norm {fmt(limit, '.3g')} at {over} of {len(norms)} calls "
                     f"(median norm {fmt(sorted(norms)[len(norms) // 2], '.3g')})")
        return passed(f"{fresh[0].fn} runs between backward() and optimizer.step() ({len(fresh)} of {len(clips)} "
                      f"calls, at {fresh[0].where or '?'}){extra}", **data)
    stale_norms = [c.norm for c in clips if c.norm is not None]
    empty = bool(stale_norms) and all(n == 0 for n in stale_norms)
    where_text = ", ".join(sites[:2])
    if empty:
        why = ("before the step's backward(), after the gradients were cleared: the norm it measured was 0 at every "
               "call, so there was nothing to clip")
    else:
        why = ("after optimizer.step() or zero_grad(), where no step applies what it clips"
               + (f" (it measured norms up to {fmt(max(stale_norms), '.3g')} that the step before had already applied)"
                  if stale_norms else ""))
    data.update(stale_norms_zero=empty)
    return failed("clip-stale", f"{clips[0].fn} ran {len(clips)} times at {where_text} over {len(rec.steps)} optimizer "
                  f"steps, every time {why}: no step applied a clipped gradient", **data)

