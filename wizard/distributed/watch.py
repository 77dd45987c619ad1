"""``nnwizard watch --script train.py --nproc N`` (and ``watch`` under the user's torchrun): the user's real run
on N ranks, each watched as ``nnwizard watch`` watches one process.

Every rank writes its own log ``DIR/watch.rank<R>.jsonl`` (each row with ``rank``) and its bundles in
``DIR/rank<R>/anomaly-step<N>/``; a bundle keeps the module a DistributedDataParallel wrapper runs, so ``nnwizard
replay`` replays it in one process. The run is the user's: no sandbox, no step budget, its output on the
terminal. Ranks stuck waiting for a peer that is gone are stopped (with their stacks) as in a diagnosis; a long
wait in a collective is not (a real run may keep its ranks at a barrier while rank 0 evaluates).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nnwizard.watcher import Watch

WATCH_STALL_S = 1800.0   # a real run: ranks stuck this long with no rank doing anything are stopped


class RankWatch(Watch):
    """One rank's Watch: the log ``root/watch.rank<R>.jsonl`` (every row with ``rank``), bundles in ``root/rank<R>/``."""

    def __init__(self, *args, rank: int, out, **kwargs):
        self.rank, self.root = rank, Path(out)
        super().__init__(*args, out=self.root / f"rank{rank}", **kwargs)
        self.log_path = self.root / f"watch.rank{rank}.jsonl"

    def start(self, recorder=None):
        result = super().start(recorder)
        default = self.out / "watch.jsonl"
        self._log.close()
        if default.exists() and default.stat().st_size == 0:
            default.unlink()
        self.root.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a", encoding="utf-8")
        return result

    def _write(self, line: dict) -> None:
        super()._write({"rank": self.rank, **line})


def watch_rank(cfg: dict, channel, rank: int, world: int) -> int:
    """One rank of a watched run: its Watch, a heartbeat (what it waits in) and the step's digest of collectives."""
    from nnwizard import watch_cmd
    from nnwizard.distributed.digest import RankDigest
    from nnwizard.distributed.heartbeat import Heartbeat
    from nnwizard.script_run import load_script

    w = cfg.get("watch", {})
    script = load_script(cfg["script"])
    digest = RankDigest(rank, world, script.folder)
    beat = Heartbeat(channel, digest, rank, exit_code=cfg.get("abort_code", 75))
    beat.start()

    def make(**kwargs):
        return RankWatch(rank=rank, **kwargs)

    try:
        code = watch_cmd.run(cfg["script"], list(cfg.get("args", [])), Path(w["out"]), w.get("on_anomaly", "continue"),
                             w.get("every"), make_watch=make, patches=(digest.patches(),), label=f" (rank {rank})")
    finally:
        if beat.state == "running":
            channel.put(f"digest/{rank}", {"rank": rank, "exit": "finished"})
            beat.finish()
    return code


def run_watch(script: str, args: list[str], out: Path, on_anomaly: str, every: int | None, nproc: int | None) -> int:
    """The ``watch`` command with ``--nproc`` (or under torchrun): the exit code."""
    from nnwizard.distributed.env import check_nproc, in_torchrun, rank_and_world
    from nnwizard.errors import UsageError
    from nnwizard.script_run import load_script

    if on_anomaly not in ("stop", "continue"):
        raise UsageError(f"--on-anomaly {on_anomaly!r}: choose stop or continue")
    load_script(script)
    watch = {"out": str(Path(out).resolve()), "on_anomaly": on_anomaly, "every": every}
    if in_torchrun():
        from nnwizard.distributed.channel import Channel, for_torchrun

        rank, _, world = rank_and_world()   # (the user's real run, in this process: the job's store carries the beats)
        channel = Channel(for_torchrun(rank, world), f"watch-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}")
        return watch_rank({"script": script, "args": args, "watch": watch, "abort_code": 0}, channel, rank, world)
    kind = check_nproc(nproc, "auto")
    from types import SimpleNamespace

    from nnwizard.distributed.launch import Launch

    opts = SimpleNamespace(script=script, script_args=list(args), max_steps=None, seed=None)
    launch = Launch(opts, nproc, kind, mode="watch", watch=watch, redirect=False)
    try:
        run = launch.run()
    finally:
        launch.close()
    codes = [c for c in run.exit_codes.values() if c]
    if run.abort:
        print(f"nnwizard watch: the ranks were stopped: {run.abort.get('text', '')}", file=sys.stderr)
        for r, stack in sorted(run.stacks.items()):
            print(f"--- rank {r}'s stacks ---\n{stack.rstrip()}", file=sys.stderr)
        return 1
    if run.interrupted:
        return 130
    return codes[0] if codes else 0
