"""``nnwizard diagnose --script train.py --nproc N``: the parent of a distributed diagnosis.

1. The script runs on N ranks as ``torchrun --standalone --nproc_per_node=N train.py ARGS`` would run it: torch's
   own elastic launcher (``torch.distributed.run``'s configuration, local c10d rendezvous, gloo on CPU and nccl
   on GPUs: the script picks its backend as always), each rank ``python -m nnwizard.distributed.rank`` running the
   script under the recorder with its digest. The launcher runs in a thread; the main thread is the watchdog
   (heartbeats, the hard deadline) and takes Ctrl-C (every rank is stopped, the report is partial, exit 130).
2. The ranks' digests are merged (:class:`~nnwizard.distributed.merged.DistributedRun`).
3. The script is diagnosed as one process (``RANK=0, WORLD_SIZE=1``: its ``init_process_group`` makes a group of
   one), with every loop audit and rerun of script mode, and the cross-rank audits (tree ``distributed``) read
   the merged digests in the same session: one report, written by this process alone.

A script that never initialises a process group is said to be one and diagnosed as one process. Under the
user's own torchrun (``in_torchrun()``) every rank runs its part in-process and rank 0 writes the report
(:func:`run_in_torchrun`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from nnwizard.distributed.channel import Channel, serve
from nnwizard.distributed.env import check_nproc, environment, in_torchrun, one_process
from nnwizard.distributed.heartbeat import ANSWER_S, Watchdog
from nnwizard.distributed.merged import DistributedRun, DistributedTarget

START_S = 90.0       # for the ranks to import torch and the script and meet (a loaded machine)
LOG_LINES = 40


def rank_config(opts, address: str, run: str, scratch: Path, mode: str = "diagnose", watch: dict | None = None) -> dict:
    """What every rank needs to run its part (JSON, in the ``NNWIZARD_DIST`` environment variable)."""
    from nnwizard.script_run import DEFAULT_LIMIT_BATCHES, DEFAULT_MAX_STEPS, DEFAULT_TIME_LIMIT_S

    return {"script": opts.script, "args": list(opts.script_args), "mode": mode, "store": address, "run": run,
            "crash_dir": str(scratch.parent),
            "max_steps": opts.max_steps or DEFAULT_MAX_STEPS, "limit_batches": DEFAULT_LIMIT_BATCHES,
            "time_limit_s": DEFAULT_TIME_LIMIT_S, "seed": opts.seed, "scratch": str(scratch), "watch": watch or {}}


@contextmanager
def _quiet_launcher():
    """torch's elastic agent logs its rendezvous and its workers' failures to the terminal; nnwizard reports them."""
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.distributed.run",
                                              "torch.distributed.launcher")]
    levels = [(lg, lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level, propagate in levels:
            lg.setLevel(level)
            lg.propagate = propagate


def _kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (Linux /proc; empty elsewhere): the ranks the launcher started,
    also before they beat."""
    out = []
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                        fields = f.read().rsplit(")", 1)[-1].split()
                    if int(fields[1]) == parent:
                        out.append(int(entry.name))
                except (OSError, ValueError, IndexError):
                    continue
    except OSError:
        pass
    return out


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


class Launch:
    """One launch of the script on ``nproc`` ranks (see the module docstring); ``run()`` -> DistributedRun."""

    def __init__(self, opts, nproc: int, kind: str, mode: str = "diagnose", watch: dict | None = None,
                 redirect: bool = True):
        self.opts, self.nproc, self.kind, self.mode, self.watch = opts, nproc, kind, mode, watch
        self.redirect = redirect
        self.folder = Path(tempfile.mkdtemp(prefix="nnwizard-dist-"))
        self.store, self.address = serve()
        self.run_id = uuid.uuid4().hex[:8]
        self.channel = Channel(self.store, self.run_id)
        self.box: dict = {}
        self.interrupted = False
        self._interrupt = threading.Event()   # interrupt() from another thread: as Ctrl-C in the one running run()
        self.done = threading.Event()   # the launcher's thread ended (an Event: Ctrl-C can corrupt Thread.join's state)
        if mode == "watch":   # a real run: a long wait at a barrier is the user's business; a peer that left is not
            from nnwizard.distributed.watch import WATCH_STALL_S

            self.stall = {"stall_s": WATCH_STALL_S, "gone_s": 10.0}
        else:
            self.stall = {}

    def _launch(self, config, cmd, args) -> None:
        from torch.distributed.launcher.api import elastic_launch

        try:
            self.box["result"] = elastic_launch(config, cmd)(*args)
        except BaseException as exc:  # noqa: BLE001 - the launcher's own failure (a rank that died) is read below
            self.box["error"] = exc
        finally:
            self.done.set()

    def _config(self):
        from torch.distributed import run as trun

        argv = [f"--nproc_per_node={self.nproc}", "--max_restarts=0", "--monitor_interval=0.2",
                "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", f"--rdzv_id={self.run_id}"]
        if self.redirect:
            argv += ["--redirects=3", f"--log_dir={self.folder / 'logs'}"]
        args = trun.parse_args([*argv, "-m", "nnwizard.distributed.rank", str(self.folder / "config.json")])
        return trun.config_from_args(args)

    def interrupt(self) -> None:
        """Stop every rank as Ctrl-C would (their digests so far are kept), from another thread than run()'s."""
        self._interrupt.set()

    def pids(self) -> dict[int, int]:
        return {r: b["pid"] for r in range(self.nproc) if (b := self.channel.get(f"hb/{r}")) and b.get("pid")}

    def _signal(self, sig) -> None:
        for pid in {*self.pids().values(), *_children(os.getpid())}:
            _kill(pid, sig)

    def run(self) -> DistributedRun:
        from nnwizard.script_run import DEFAULT_TIME_LIMIT_S

        started = time.monotonic()
        cfg = rank_config(self.opts, self.address, self.run_id, self.folder / "scratch", self.mode, self.watch)
        (self.folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": "1"}   # as torchrun sets it (quietly)
        deadline = None if self.mode == "watch" else START_S + 1.5 * DEFAULT_TIME_LIMIT_S + 15
        abort = None
        with environment(env), _quiet_launcher():
            config, cmd, args = self._config()
            thread = threading.Thread(target=self._launch, args=(config, cmd, args), name="nnwizard-launcher", daemon=True)
            thread.start()
            pids: dict[int, int] = {}
            watchdog = Watchdog(self.channel, self.nproc, deadline_s=deadline,
                                alive=lambda r: _pid_alive(pids.get(r)), **self.stall)
            try:
                while not self.done.wait(0.25):
                    if self._interrupt.is_set():
                        raise KeyboardInterrupt
                    pids.update(self.pids())
                    reason = watchdog.check()
                    if reason is not None:
                        abort = reason
                        watchdog.abort(reason)
                        self._reap(thread, watchdog, pids)
                        break
            except KeyboardInterrupt:
                self.interrupted = True
                self._signal(signal.SIGINT)
                if not self.done.wait(5.0):
                    self._signal(signal.SIGKILL)
                    self.done.wait(10.0)
        return self._collect(abort, watchdog, time.monotonic() - started)

    def _reap(self, thread, watchdog: Watchdog, pids: dict[int, int]) -> None:
        """After an abort: wait for the ranks' stacks, then kill what is left."""
        end = time.monotonic() + ANSWER_S
        while time.monotonic() < end and len(watchdog.answered()) < self.nproc and not self.done.is_set():
            time.sleep(0.1)
        silent = [pid for r, pid in pids.items() if r not in watchdog.answered() and _pid_alive(pid)]
        for pid in silent:   # (its heartbeat thread could not run: faulthandler writes its stacks from the signal)
            _kill(pid, getattr(signal, "SIGUSR1", signal.SIGTERM))
        time.sleep(0.5 if silent else 0)
        for pid in pids.values():
            if _pid_alive(pid):
                _kill(pid, signal.SIGKILL)
        self.done.wait(15.0)

    def _collect(self, abort, watchdog: Watchdog, seconds: float) -> DistributedRun:
        digests, stacks, beats = {}, {}, {}
        for r in range(self.nproc):
            d = self.channel.get(f"digest/{r}") or self.channel.get(f"partial/{r}")
            if d is not None:
                d.setdefault("exit", "died")
                digests[r] = d
            s = self.channel.get(f"stack/{r}") or crash_stack(self.folder, r)
            if s:
                stacks[r] = s
            beats[r] = self.channel.get(f"hb/{r}")
        if abort is None:
            abort = self.channel.get("abort")
        error = self.box.get("error")
        exit_codes = _failures(error)
        start_error = None
        if not beats or all(b is None for b in beats.values()):
            start_error = f"{type(error).__name__}: {error}" if error is not None else "no rank reported"
        run = DistributedRun(self.nproc, "nnwizard --nproc", digests, kind=self.kind, stacks=stacks, abort=abort,
                             interrupted=self.interrupted, exit_codes=exit_codes, logs=self._logs(), seconds=seconds,
                             start_error=start_error, beats=beats)
        return run

    def _logs(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for path in sorted((self.folder / "logs").glob("**/stderr.log")):
            try:
                rank = int(path.parent.name)
                out[rank] = path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_LINES:]
            except (ValueError, OSError):
                continue
        return out

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.store = None


def crash_stack(folder: Path, rank: int) -> str | None:
    """The Python stacks faulthandler wrote when the rank's process was killed by a fatal signal (None: none)."""
    try:
        text = (Path(folder) / f"crash.rank{rank}.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text if text.strip() else None


def _failures(error) -> dict[int, int | None]:
    """The ranks whose process failed, with their exit codes (from the launcher's ChildFailedError)."""
    failures = getattr(error, "failures", None) or {}
    out = {}
    for local, failure in failures.items():
        rank = getattr(failure, "rank", local)
        out[int(rank)] = getattr(failure, "exitcode", None)
    return out


# ------------------------------------------------------------------------------------------- diagnose
def _validate(opts) -> str:
    from nnwizard.options import check

    check(opts)
    return check_nproc(opts.nproc, opts.device) if opts.nproc else "cpu"


def run_distributed(opts, view=None) -> int:
    """See the module docstring; the exit code (CONTRACT §5)."""
    if in_torchrun():
        from nnwizard.distributed.torchrun import run_in_torchrun

        return run_in_torchrun(opts)
    kind = _validate(opts)
    from nnwizard.view import TerminalView

    view = view or TerminalView(quiet=opts.quiet)
    _announce(view, opts, kind)
    pending = Pending(Launch(opts, opts.nproc, kind), view)
    try:
        if kind == "cpu" and (os.cpu_count() or 1) <= opts.nproc:
            # no core to spare beside the CPU ranks: the one-process diagnosis after them, so that its observed run's
            # measured step time (which sizes its run and its reruns) is not the ranks' contention
            try:
                source = pending.result()
            except KeyboardInterrupt:
                pending.interrupt()
                source = pending.result()
        else:
            source = pending
        return diagnose_and_report(opts, source, view)
    finally:
        pending.close()


class Pending:
    """The ranks' run while it is under way (in a thread): the one-process diagnosis starts beside it, and waits
    for it once its own observed run is done, before its probes (the machine's cores serve both meanwhile).
    Attribute reads go to the finished :class:`DistributedRun`."""

    def __init__(self, launch: Launch, view):
        self.launch, self.view = launch, view
        self._run: DistributedRun | None = None
        self._error: BaseException | None = None
        # (an Event, not Thread.join: a join that Ctrl-C interrupts can leave is_alive() False while the thread runs)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._go, name="nnwizard-ranks", daemon=True)
        self._thread.start()

    def _go(self) -> None:
        try:
            self._run = self.launch.run()
        except BaseException as exc:  # noqa: BLE001 - read in result()
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> DistributedRun:
        if self._run is None:
            while not self._done.wait(0.2):   # (in small waits: Ctrl-C reaches the main thread)
                pass
            if self._run is None:
                raise self._error or RuntimeError("the ranks' launcher ended without a result")
            _show_ranks(self.view, self._run)
        return self._run

    def interrupt(self) -> None:
        self.launch.interrupt()

    def listener(self, view):
        """``view`` for the one-process diagnosis, which waits for the ranks once its observed run is shown (and
        stops them first when that run was interrupted)."""
        def listen(event) -> None:
            view(event)
            if event.kind == "script-observed":
                if event.data["observed"].get("exit") == "interrupted":
                    self.interrupt()
                self.result()
        return listen

    def close(self) -> None:
        if not self._done.is_set():
            self.interrupt()
            self._done.wait(30.0)
        self.launch.close()

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.result(), name)


def _announce(view, opts, kind: str) -> None:
    if view.quiet:
        return
    from rich.markup import escape

    backend = "nccl, one GPU per rank" if kind == "cuda" else "gloo, on the CPU"
    view.console.print(f"[bold cyan]▶ Running {escape(str(opts.script))} {escape(' '.join(opts.script_args))} on "
                       f"{opts.nproc} ranks[/] [dim](torch's elastic launcher, as torchrun --standalone "
                       f"--nproc_per_node={opts.nproc} would; the script picks its backend: {backend}; every rank stops "
                       f"at the same optimizer step)[/]", highlight=False)


def _show_ranks(view, run: DistributedRun) -> None:
    if view.quiet:
        return
    from rich.markup import escape

    c = view.console
    for r in range(run.world):
        c.print(f"  [dim]rank {r}:[/] {escape(run.ended(r))}", highlight=False)
    if run.abort:
        c.print(f"  [yellow]watchdog: {escape(run.abort.get('text', ''))}; every rank was stopped[/]", highlight=False)
    if run.start_error:
        c.print(f"  [yellow]the ranks could not start: {escape(run.start_error)}[/]", highlight=False)


def diagnose_and_report(opts, source, view) -> int:
    """The one-process diagnosis with the cross-rank audits in the same session, then the reports. ``source``: the
    ranks' DistributedRun, or a :class:`Pending` one still under way."""
    from nnwizard.distributed.fsdp import plain_copies
    from nnwizard.session import diagnose

    listener = source.listener(view) if isinstance(source, Pending) else view
    if not isinstance(source, Pending) and source.interrupted:
        diagnosis = distributed_only(opts, source, view, interrupted=True)
        return _report(opts, diagnosis, source, view)
    try:
        with one_process(), plain_copies():
            known = isinstance(source, Pending) or source.initialised()   # (a run not distributed: no cross-rank audits)
            diagnosis = diagnose(replace(opts, nproc=None, distributed=source if known else None), listener=listener)
        run = source.result() if isinstance(source, Pending) else source
        if diagnosis.interrupted and not diagnosis.results:   # (Ctrl-C in the observed run: what the ranks recorded)
            diagnosis = distributed_only(opts, run, view, interrupted=True)
    except KeyboardInterrupt:
        if isinstance(source, Pending):
            source.interrupt()
        run = source.result() if isinstance(source, Pending) else source
        diagnosis = distributed_only(opts, run, view, interrupted=True)
    return _report(opts, diagnosis, run, view)


def _report(opts, diagnosis, run: DistributedRun, view) -> int:
    from nnwizard.errors import ExitCode
    from nnwizard.options import exit_code, failure_reasons
    from nnwizard.session import write_reports

    diagnosis.target.distributed = run
    if not run.initialised() and not run.interrupted and not run.start_error:
        diagnosis.target.distributed_note = (f"run with --nproc {run.world}, but no rank called init_process_group or "
                                             f"built DDP/FSDP: every rank ran its own copy; diagnosed as one process")
        if not view.quiet:
            view.console.print(f"[yellow]The script never called init_process_group (nor built DDP or FSDP) on any of "
                               f"the {run.world} ranks: it is not distributed. Diagnosed as one process.[/]")
    report, written = write_reports(diagnosis, opts)
    view.summary(report, written)
    code = exit_code(report, opts)
    if code == ExitCode.FINDINGS:
        view.failed(failure_reasons(report, opts))
    return code


def distributed_only(opts, run: DistributedRun, listener=None, interrupted: bool = False):
    """A diagnosis from the cross-rank audits alone (no one-process run): Ctrl-C, or a report written while the
    script itself cannot go on."""
    from nnwizard.catalog import load_catalog
    from nnwizard.engine import Engine
    from nnwizard.prompts import ScriptedPrompter
    from nnwizard.tree import load_trees

    target = DistributedTarget(run, str(opts.script))
    trees = {k: t for k, t in load_trees(opts.trees_dir).items() if "distributed" in t.modes}
    catalog = load_catalog(str(opts.trees_dir) if opts.trees_dir else None)
    engine = Engine(target, trees, catalog, ScriptedPrompter({}), seed=opts.seed, listener=listener)
    diagnosis = engine.run(["auto"], {})
    diagnosis.given_symptoms = list(opts.symptoms)
    diagnosis.interrupted = diagnosis.interrupted or interrupted
    return diagnosis
