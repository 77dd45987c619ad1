"""nnwizard started by the user under their own launcher: ``torchrun --standalone --nproc_per_node=2 -m nnwizard
diagnose --script train.py``. Every process is one rank: it runs the script in-process with the rank's digest
(``rank.run_rank``), sends the digest through the job's store, and, except rank 0, ends quietly (exit 0: a
failing rank would make torchrun stop rank 0 before it writes the report). Rank 0 collects the digests, then
diagnoses the script as one process with the cross-rank audits, exactly as ``--nproc`` does, and alone writes the
reports.

No hang: every rank beats; rank 0's heartbeat thread is the watchdog while the ranks run, and its main thread
while it waits for the others' digests. When the ranks hang, every rank sends its stacks and digest and ends;
rank 0, whose own script may be the one stuck, writes a report from the cross-rank audits alone from its
heartbeat thread and ends the process with the report's exit code.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from nnwizard.distributed.channel import Channel, for_torchrun
from nnwizard.distributed.env import rank_and_world
from nnwizard.distributed.heartbeat import ANSWER_S, Watchdog
from nnwizard.distributed.merged import DistributedRun
from nnwizard.errors import ExitCode

WAIT_S = 30.0   # rank 0 waits this long for a scratch folder path / digests beyond the watchdog's own limits


def _channel(rank: int, world: int) -> Channel:
    store = for_torchrun(rank, world)
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return Channel(store, run)


def _scratch(channel: Channel, rank: int) -> str:
    """One scratch folder for every rank of this machine (rank 0 makes it; the others read its path)."""
    if rank == 0:
        folder = tempfile.mkdtemp(prefix="nnwizard-dist-")
        channel.put("scratch", folder)
        return folder
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        folder = channel.get("scratch")
        if folder:
            return folder if Path(folder).is_dir() else tempfile.mkdtemp(prefix="nnwizard-dist-")
        time.sleep(0.05)
    return tempfile.mkdtemp(prefix="nnwizard-dist-")


def _gather(channel: Channel, world: int, abort=None) -> DistributedRun:
    digests, stacks, beats = {}, {}, {}
    for r in range(world):
        d = channel.get(f"digest/{r}")
        if d is not None:
            digests[r] = d
        s = channel.get(f"stack/{r}")
        if s:
            stacks[r] = s
        beats[r] = channel.get(f"hb/{r}")
    from nnwizard.distributed.env import device_kind

    return DistributedRun(world, "torchrun", digests, kind=device_kind("auto"), stacks=stacks,
                          abort=abort or channel.get("abort"), beats=beats)


def run_in_torchrun(opts) -> int:
    from nnwizard.distributed.launch import START_S, _validate, diagnose_and_report, rank_config
    from nnwizard.distributed.rank import run_rank
    from nnwizard.script_run import DEFAULT_TIME_LIMIT_S
    from nnwizard.view import TerminalView

    _validate(replace(opts, nproc=None))
    rank, _, world = rank_and_world()
    channel = _channel(rank, world)
    started = time.monotonic()
    cfg = rank_config(opts, "", channel.prefix, Path(_scratch(channel, rank)))
    view = TerminalView(quiet=opts.quiet or rank != 0)
    watchdog = Watchdog(channel, world) if rank == 0 else None

    def emergency(reason) -> None:   # rank 0's heartbeat thread, its own script stuck: report and end
        end = time.monotonic() + ANSWER_S
        while time.monotonic() < end and len(watchdog.answered()) < world:
            time.sleep(0.1)
        code = _report_alone(opts, _gather(channel, world, reason), view, time.monotonic() - started)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    if rank == 0 and not view.quiet:
        view.console.print(f"[bold cyan]▶ Rank 0 of {world} (torchrun): running the script on every rank[/] [dim](each "
                           f"rank stops at the same optimizer step; rank 0 writes the report)[/]", highlight=False)
    kw = {"deadline_s": START_S + 1.5 * DEFAULT_TIME_LIMIT_S + 15, "exit_code": 0}
    if rank == 0:
        kw.update(watchdog=watchdog, on_abort=emergency)
    run_rank(cfg, channel, rank, world, heartbeat_kw=kw)
    if rank != 0:
        return ExitCode.OK
    run = _wait_for_digests(channel, world, watchdog)
    run.seconds = time.monotonic() - started
    from nnwizard.distributed.launch import _show_ranks

    _show_ranks(view, run)
    return diagnose_and_report(opts, run, view)


def _wait_for_digests(channel: Channel, world: int, watchdog: Watchdog) -> DistributedRun:
    """Rank 0, its own run done: the others' digests, with the watchdog on (a rank stuck in a collective that rank 0
    left, or gone)."""
    while True:
        have = [r for r in range(world) if channel.get(f"digest/{r}") is not None]
        if len(have) == world:
            return _gather(channel, world)
        reason = watchdog.check()
        if reason is not None:
            watchdog.abort(reason)
            end = time.monotonic() + ANSWER_S
            while time.monotonic() < end and len(watchdog.answered()) < world:
                time.sleep(0.1)
            return _gather(channel, world, reason)
        time.sleep(0.2)


def _report_alone(opts, run: DistributedRun, view, seconds: float) -> int:
    from nnwizard.distributed.launch import _show_ranks, distributed_only
    from nnwizard.session import write_reports

    run.seconds = seconds
    _show_ranks(view, run)
    diagnosis = distributed_only(opts, run, view)
    report, written = write_reports(diagnosis, opts)
    view.summary(report, written)
    if opts.fail_on is not None and any(h.confidence >= opts.fail_on for h in report.hypotheses):
        return ExitCode.FINDINGS
    return ExitCode.OK
