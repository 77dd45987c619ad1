"""``nnwizard watch --script train.py [--out DIR] [--on-anomaly stop|continue] [-- ARGS]``: the user's
real run, unchanged (no sandbox, its own output on the terminal, no step or time budget, no seeding),
under the recorder in light mode with a :class:`~nnwizard.watcher.Watch` listening.

Exit code: the script's own (0 when it ends normally, its ``sys.exit`` code, 1 when it raises, with
its traceback printed as Python would); 1 when ``--on-anomaly stop`` stopped it at an anomaly.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nnwizard.anomaly import Triggers
from nnwizard.watcher import Watch


def run(script_spec: str, args: list[str], out: Path, on_anomaly: str = "continue", every: int | None = None,
        tensorboard: bool | None = None, *, make_watch=Watch, listeners: tuple = (), patches: tuple = (),
        label: str = "") -> int:
    """The exit code. ``make_watch`` builds the Watch (a rank of a distributed run writes its own log: see
    nnwizard.distributed.watch), ``listeners`` / ``patches`` go to the run beside it, ``label`` heads its summary."""
    from nnwizard.errors import UsageError
    from nnwizard.script_run import RunOptions, load_script, run_script

    if on_anomaly not in ("stop", "continue"):
        raise UsageError(f"--on-anomaly {on_anomaly!r}: choose stop or continue")
    if every is not None and every < 1:
        raise UsageError(f"--every {every}: must be 1 or more")
    script = load_script(script_spec)
    watch = make_watch(out=out, on_anomaly=on_anomaly, every=every, triggers=Triggers(), tensorboard=tensorboard,
                       script=script.path, files=script.files)

    class _Starter:  # the runner makes the recorder: watch attaches to it when it starts
        def __init__(self):
            self.started = False

        def on_forward(self, rec, info, a):
            self._start(rec)
            watch.on_forward(rec, info, a)

        def on_step_pre(self, rec, optimizer, step):
            self._start(rec)
            watch.on_step_pre(rec, optimizer, step)

        def _start(self, rec):
            if not self.started:
                self.started = True
                watch.start(recorder=rec)

        def __getattr__(self, name):
            if name.startswith("on_"):
                return getattr(watch, name)
            raise AttributeError(name)

    starter = _Starter()
    opts = RunOptions(mode="light", sandbox=False, capture=False, max_steps=None, limit_batches=None,
                      time_limit_s=None, seed=None, listeners=[starter, *listeners], patches=list(patches))
    try:
        result = run_script(script, list(args), opts)
    finally:
        watch.close()
    rec = result.recording
    steps = rec.total_steps
    log = getattr(watch, "log_path", out / "watch.jsonl")
    summary = f"nnwizard watch{label}: {steps} optimizer steps watched; log {log}"
    if watch.bundles:
        summary += "; bundles: " + ", ".join(str(b) for b in watch.bundles)
    elif steps:
        summary += "; no anomaly"
    if not starter.started:
        summary = f"nnwizard watch{label}: the script built no model and took no optimizer step: nothing was watched"
    elif not steps and rec.backwards:
        # e.g. word_language_model's `p.data.add_(p.grad, alpha=-lr)`: watch logs and checks at optimizer steps
        summary = (f"nnwizard watch{label}: the script called backward() {rec.backwards} times but never optimizer.step() (a "
                   f"hand-written update such as p.data.add_(p.grad, alpha=-lr)?): watch logs and checks at optimizer "
                   f"steps, so nothing was logged to {log}; `nnwizard diagnose --script` reads "
                   f"hand-written updates")
    print(summary, file=sys.stderr)
    if result.exit == "raised" and rec.error is not None:
        print(rec.error.traceback, file=sys.stderr, end="")
        return 1
    if result.exit == "stopped":
        return 1 if watch.stopped else 0
    return int(result.exit_code or 0)
