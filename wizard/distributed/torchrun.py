"""nnwizard started by the user under their own launcher: ``torchrun --standalone --nproc_per_node=2 -m nnwizard
diagnose --script train.py``. Each process the launcher started supervises one rank: it runs the rank in a child
process (``python -m nnwizard.distributed.rank``, the same as under ``--nproc``), with the launcher's environment,
so that a rank the script or its backend kills (gloo aborting on a collective mismatch, a segfault) leaves a
supervisor that reports it. Rank 0's supervisor is the watchdog, collects the digests, diagnoses the script as one
process with the cross-rank audits, exactly as ``--nproc`` does, and alone writes the reports; the other
supervisors end quietly (exit 0: a failing worker would make torchrun stop rank 0 before it writes the report).

The ranks talk through the job's store: the elastic agent's (``TORCHELASTIC_USE_AGENT_STORE=True``, torchrun's
default), else one rank 0's supervisor serves at ``MASTER_ADDR:MASTER_PORT``, and the ranks' own process group
then meets on another port that rank 0 chose.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from nnwizard.distributed.channel import Channel, for_torchrun
from nnwizard.distributed.env import CONFIG_VAR, device_kind, free_port, rank_and_world
from nnwizard.distributed.heartbeat import ANSWER_S, Watchdog
from nnwizard.distributed.merged import DistributedRun
from nnwizard.errors import ExitCode

WAIT_S = 60.0      # what a supervisor waits for rank 0's setup (scratch folder, port) and rank 0 for the others' ends
LOG_LINES = 40


def _coordinate(rank: int, world: int) -> tuple[Channel, str, dict[str, str]]:
    """(the channel, its address for the rank's child, the child's environment changes)."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "29500")
    store = for_torchrun(rank, world)
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    channel = Channel(store, run)
    env: dict[str, str] = {}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # this store holds MASTER_PORT: the ranks' process group meets on a port rank 0 chose
        if rank == 0:
            channel.put("pg-port", free_port())
        env = {"MASTER_PORT": str(_wait(channel, "pg-port"))}
    return channel, f"{host}:{port}", env


def _wait(channel: Channel, key: str):
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        value = channel.get(key)
        if value is not None:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"rank 0 did not publish {key!r} within {WAIT_S:.0f} s")


def _scratch(channel: Channel, rank: int) -> str:
    """One scratch folder for every rank of this machine (rank 0 makes it; the others read its path)."""
    if rank == 0:
        folder = tempfile.mkdtemp(prefix="nnwizard-dist-")
        channel.put("scratch", folder)
        return folder
    folder = _wait(channel, "scratch")
    return folder if Path(folder).is_dir() else tempfile.mkdtemp(prefix="nnwizard-dist-")


def run_in_torchrun(opts) -> int:
    from nnwizard.distributed.launch import _show_ranks, _validate, diagnose_and_report, rank_config
    from nnwizard.view import TerminalView

    _validate(replace(opts, nproc=None))
    rank, _, world = rank_and_world()
    started = time.monotonic()
    channel, address, env = _coordinate(rank, world)
    shared = Path(_scratch(channel, rank))   # the ranks' scratch folder and their crash stacks
    cfg = rank_config(opts, address, channel.prefix.removeprefix("nnwizard/").rstrip("/"), shared / "scratch")
    view = TerminalView(quiet=opts.quiet or rank != 0)
    if rank == 0 and not view.quiet:
        view.console.print(f"[bold cyan]▶ torchrun: rank 0 of {world} runs the script on every rank[/] [dim](each rank "
                           f"stops at the same optimizer step; rank 0 writes the report)[/]", highlight=False)
    log = tempfile.NamedTemporaryFile("w+", prefix=f"nnwizard-rank{rank}-", suffix=".log", delete=False)
    child = subprocess.Popen([sys.executable, "-m", "nnwizard.distributed.rank"],
                             env={**os.environ, **env, CONFIG_VAR: json.dumps(cfg)}, stdout=log, stderr=subprocess.STDOUT)
    watchdog = Watchdog(channel, world, alive=lambda r: r != rank or child.poll() is None) if rank == 0 else None
    interrupted = False
    from nnwizard.distributed.rank import _interrupt

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        abort = _supervise(child, channel, watchdog)
    except KeyboardInterrupt:   # Ctrl-C reaches torchrun, which sends SIGTERM to its workers (this process)
        interrupted, abort = True, None
        _stop(child)
    finally:
        signal.signal(signal.SIGTERM, previous)
    code = child.poll()
    from nnwizard.distributed.launch import crash_stack

    channel.put(f"done/{rank}", {"code": code, "log": _tail(log.name), "crash": crash_stack(shared, rank)})
    if rank != 0:
        return ExitCode.OK
    run = _gather(channel, world, abort, interrupted)
    run.seconds = time.monotonic() - started
    shutil.rmtree(shared, ignore_errors=True)
    _show_ranks(view, run)
    return diagnose_and_report(opts, run, view)


def _supervise(child: subprocess.Popen, channel: Channel, watchdog: Watchdog | None) -> dict | None:
    """Wait for the rank's child; rank 0 watches every rank meanwhile. An abort (this watchdog's or rank 0's) gives
    the child ANSWER_S to send its stacks, then it is killed."""
    abort = None
    while child.poll() is None:
        time.sleep(0.2)
        if abort is None:
            abort = channel.get("abort")
            if abort is None and watchdog is not None:
                reason = watchdog.check()
                if reason is not None:
                    watchdog.abort(reason)
                    abort = reason
            if abort is not None:
                deadline = time.monotonic() + ANSWER_S
        elif time.monotonic() > deadline:
            child.kill()
    if watchdog is not None and abort is None:   # rank 0's own child is done: the others may still run (or hang)
        abort = _wait_for_others(channel, watchdog)
    return abort


def _wait_for_others(channel: Channel, watchdog: Watchdog) -> dict | None:
    world = watchdog.world
    while True:
        if all(channel.get(f"done/{r}") is not None for r in range(1, world)):
            return None
        reason = watchdog.check()
        if reason is not None:
            watchdog.abort(reason)
            end = time.monotonic() + ANSWER_S + 2
            while time.monotonic() < end and not all(channel.get(f"done/{r}") is not None for r in range(1, world)):
                time.sleep(0.1)
            return reason
        time.sleep(0.2)


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(5.0)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5.0)


def _tail(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_LINES:]
        Path(path).unlink()
        return lines
    except OSError:
        return []


def _gather(channel: Channel, world: int, abort=None, interrupted: bool = False) -> DistributedRun:
    digests, stacks, beats, codes, logs = {}, {}, {}, {}, {}
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end and not all(channel.get(f"done/{r}") is not None for r in range(world)):
        time.sleep(0.1)
    for r in range(world):
        d = channel.get(f"digest/{r}") or _partial(channel, r)
        if d is not None:
            digests[r] = d
        done = channel.get(f"done/{r}") or {}
        s = channel.get(f"stack/{r}") or done.get("crash")
        if s:
            stacks[r] = s
        beats[r] = channel.get(f"hb/{r}")
        codes[r] = done.get("code")
        logs[r] = done.get("log", [])
    return DistributedRun(world, "torchrun", digests, kind=device_kind("auto"), stacks=stacks,
                          abort=abort or channel.get("abort"), interrupted=interrupted, exit_codes=codes, logs=logs,
                          beats=beats)


def _partial(channel: Channel, rank: int) -> dict | None:
    """The digest a rank's heartbeat sent last, for a rank whose process died before sending its own."""
    d = channel.get(f"partial/{rank}")
    if d is not None:
        d["exit"] = "died"
    return d
