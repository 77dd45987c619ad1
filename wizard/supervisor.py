"""The supervisor: the process the user started. It never imports torch or the user's code.

It checks the flags, puts isolation in force (wizard/isolate), starts a worker (wizard/worker.py) in a session
of its own, shows the live view from the events the worker streams, answers its questions at the terminal,
owns the time limits (a worker past one is asked to stop, then its whole process tree is killed, whatever the
script did with signals), owns Ctrl-C (passed on once, then the tree is killed after a grace period: exit 130
with a partial report) and writes the reports from what the worker sent, however it ended: an ``os._exit``, a
segmentation fault, an out-of-memory kill or a kill at a time limit is a diagnosis of that, never a silent pass.

``Launch`` says how to start a worker (its command, environment, isolation): a notebook runner or N ranks
under torch's elastic launcher are other commands on the same channel (each rank connects on its own).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nnwizard
from nnwizard import channel
from nnwizard.errors import ExitCode, NNWizardError, UsageError
from nnwizard.isolate import MODES, Decision, static_reason

STOP_GRACE_S = 10.0      # a worker asked to stop at a deadline: killed this long after, if still there
INTERRUPT_GRACE_S = 5.0  # Ctrl-C: the worker finishes its partial report within this, or is killed
SIGNALS = {getattr(signal, n): n for n in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL", "SIGKILL", "SIGTERM",
                                           "SIGINT", "SIGHUP", "SIGPIPE", "SIGQUIT", "SIGXCPU", "SIGUSR1", "SIGUSR2")
           if hasattr(signal, n)}
WHAT_SIGNAL = {"SIGSEGV": "a segmentation fault in native code", "SIGBUS": "a bus error in native code",
               "SIGABRT": "an abort (a failed assertion in native code)", "SIGFPE": "an arithmetic fault in native code",
               "SIGILL": "an illegal instruction", "SIGKILL": "killed from outside: the system's out-of-memory killer, "
               "or another process", "SIGTERM": "asked to terminate by another process"}
TRACKERS = "experiment trackers offline, writing into nnwizard's scratch folder (wandb, MLflow, Comet, Neptune, ClearML, SwanLab)"


# ------------------------------------------------------------------------------------------------ launching
@dataclass
class Launch:
    """How to start one worker: its command (default: ``python -m nnwizard.worker JOB``), the job it runs, extra
    environment, and whether its output goes to the worker's log (diagnose) or to the terminal (watch)."""

    job: dict
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    passthrough: bool = False

    def argv(self) -> list[str]:
        return self.command or [sys.executable, "-m", "nnwizard.worker", json.dumps(self.job)]


def tracker_env(folder: Path, mode: str) -> dict[str, str]:
    """The experiment trackers' documented switches: offline, into ``folder`` (wandb's offline mode runs a
    background process, which ``--isolation python`` cannot follow: there it is disabled)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"WANDB_MODE": "disabled" if mode == "python" else "offline", "WANDB_DIR": str(folder), "WANDB_SILENT": "true",
            "MLFLOW_TRACKING_URI": f"file:{folder / 'mlruns'}", "COMET_START_ONLINE": "false",
            "COMET_OFFLINE_DIRECTORY": str(folder / "comet"), "NEPTUNE_MODE": "offline", "CLEARML_OFFLINE_MODE": "1",
            "SWANLAB_MODE": "offline", "PYTHONDONTWRITEBYTECODE": "1"}


def write_roots(opts_script: str | None) -> list[str]:
    """Places a script likely writes: the working folder, its own folder, home, the temp folders."""
    roots = [os.getcwd(), str(Path.home()), tempfile.gettempdir(), "/var/tmp", os.environ.get("XDG_RUNTIME_DIR", "")]
    if opts_script and Path(opts_script).exists():
        roots.append(str(Path(opts_script).resolve().parent))
    return [r for r in dict.fromkeys(roots) if r and os.path.isdir(r)]


class Worker:
    """A started worker: its process (the namespace launcher, in ``os`` isolation), its log, and how it ended."""

    def __init__(self, launch: Launch, decision: Decision, folder: Path, inbox: queue.Queue, roots: list[str],
                 keep: bool):
        self.decision, self.folder, self.inbox = decision, folder, inbox
        self.init_pid: int | None = None
        self.status: dict[str, Any] = {}
        self.changes: dict[str, list[str]] = {}
        self.failed: str | None = None
        self.ready = threading.Event()
        env = {**os.environ, **launch.env}
        self.log_path = folder / "worker.log"
        output = None if launch.passthrough else open(self.log_path, "ab")
        argv = launch.argv()
        self._control = None
        if decision.mode == "os":
            status_r, status_w = os.pipe()
            control_r, control_w = os.pipe()
            spec = {"argv": argv, "env": env, "cwd": os.getcwd(), "scratch": str(folder), "roots": roots,
                    "status_fd": status_w, "control_fd": control_r, "keep": keep}
            launcher = str(Path(__file__).parent / "isolate" / "namespaces.py")
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", launcher, json.dumps(spec)], pass_fds=(status_w, control_r),
                                         start_new_session=True, stdin=subprocess.DEVNULL if not launch.passthrough else None,
                                         stdout=output, stderr=output)
            os.close(status_w)
            os.close(control_r)
            self._control = control_w
            threading.Thread(target=self._read_status, args=(status_r,), daemon=True).start()
        else:
            self.proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=output, stderr=output,
                                         stdin=subprocess.DEVNULL if not launch.passthrough else None)
            self.ready.set()
        if output is not None:
            output.close()
        self.pgid = self.proc.pid
        self.killed: str | None = None

    def _read_status(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                kind = message.get("t")
                if kind == "init":
                    self.init_pid = message["pid"]
                elif kind == "ready":
                    self.decision.notes += message.get("notes") or []
                    self.ready.set()
                elif kind == "failed":
                    self.failed = message.get("why") or "unknown"
                    self.ready.set()
                elif kind == "status":
                    self.status = message
                elif kind == "changes":
                    self.changes = message.get("changes") or {}
        self.ready.set()

    def poll(self) -> int | None:
        return self.proc.poll()

    def interrupt_signal(self) -> None:
        """Watch: Ctrl-C as the terminal would send it, to the worker's process group."""
        try:
            os.killpg(self.pgid, signal.SIGINT)
        except OSError:
            pass

    def kill(self, why: str) -> None:
        """End the worker's whole process tree, whatever it does with signals."""
        self.killed = self.killed or why
        if self._control is not None:   # the namespace's init kills every process in it, then reports
            try:
                os.write(self._control, b"kill\n")
            except OSError:
                pass
            ends = time.monotonic() + 3.0
            while self.poll() is None and time.monotonic() < ends:
                time.sleep(0.02)
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except OSError:
            pass
        sweep(self.pgid)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def ended(self) -> dict:
        """How the program's process ended: exit code or signal."""
        if self.decision.mode == "os" and self.status:
            return {"exit": self.status.get("exit"), "signal": self.status.get("signal")}
        code = self.proc.returncode
        if code is None:
            return {"exit": None, "signal": None}
        return {"exit": code, "signal": None} if code >= 0 else {"exit": None, "signal": -code}

    def log_tail(self, lines: int = 20) -> list[str]:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def close(self) -> None:
        if self._control is not None:
            try:
                os.close(self._control)
            except OSError:
                pass
            self._control = None


def sweep(session: int) -> None:
    """Kill what is left of a worker's tree outside a pid namespace: every process of its session (children that
    made a process group of their own), and orphans this process adopted as a subreaper (ones that made a session
    of their own)."""
    if not sys.platform.startswith("linux"):
        return
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, sid = int(fields[1]), int(fields[3])
        if sid == session or (ppid == me and _subreaper[0]):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    while True:   # (the adopted ones are ours to reap)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break


_subreaper = [False]


def become_subreaper() -> None:
    """The CLI process adopts what its worker's tree orphans (Linux), so that nothing outlives a run."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            _subreaper[0] = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass


def decide(asked: str) -> Decision:
    if asked not in MODES:
        raise UsageError(f"--isolation {asked!r}: choose one of {', '.join(MODES)}")
    if asked in ("python", "none"):
        return Decision(asked, asked)
    reason = static_reason()
    if reason is None:
        return Decision("os", asked)
    if asked == "os":
        raise UsageError(f"--isolation os: {reason}; use --isolation python")
    return Decision("python", asked, why=f"OS isolation is not available ({reason})")


def crash_log(text: str) -> Path:
    """A crash log of its own for this run (never one shared path)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(tempfile.gettempdir()) / f"nnwizard-crash-{stamp}-{os.getpid()}.log"
    path.write_text(f"nnwizard {nnwizard.__version__} python {sys.version.split()[0]}\n{' '.join(sys.argv)}\n\n{text}",
                    encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ a session
class Session:
    """One supervised command: start the worker, relay until it ends, keep what it sent."""

    def __init__(self, launch: Launch, isolation: str = "auto", keep_scratch: bool = False, view=None, prompter=None,
                 script: str | None = None, announce=None):
        self.launch, self.keep, self.view, self.prompter = launch, keep_scratch, view, prompter
        self.decision = decide(isolation)
        self.folder = Path(tempfile.mkdtemp(prefix="nnwizard-run-"))
        self.roots = write_roots(script)
        self.announce = announce or (lambda text: None)
        self.interrupts = 0
        self.interrupt_at: float | None = None
        self.deadlines: dict[int, dict] = {}
        self.report: dict | None = None
        self.artifacts: list = []
        self.final = False
        self.answers: dict = {}
        self.observed: dict | None = None
        self.phase = "start-up"
        self.progress: dict = {}
        self.notes: list[str] = []
        self.error: dict | None = None
        self.exit_code: int | None = None
        self.cuda_lost: dict | None = None
        self.worker: Worker | None = None

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> None:
        self.listener = channel.Listener(self.folder)
        try:
            with _signals(self._signal):
                self._start()
                self._relay()
        finally:
            self.listener.close()
            if self.worker is not None:
                self.worker.close()
                if self.worker.poll() is None:
                    self.worker.kill("nnwizard ended")
                sweep(self.worker.pgid)

    def _start(self) -> None:
        env = {**self.launch.env, **self.listener.env(), "NNWIZARD_ISOLATION": self.decision.mode,
               "NNWIZARD_SCRATCH": str(self.folder)}
        if not self.launch.passthrough:
            env.update(tracker_env(self.folder / "trackers", self.decision.mode))
            self.decision.trackers = TRACKERS
        self.launch.job["isolation"], self.launch.job["scratch"] = self.decision.mode, str(self.folder)
        launch = Launch(self.launch.job, self.launch.command, env, self.launch.passthrough)
        self.worker = Worker(launch, self.decision, self.folder, self.listener.inbox, self.roots, self.keep)
        if self.decision.mode == "os":
            self.worker.ready.wait(30)
            if self.worker.failed:
                why = self.worker.failed
                self.worker.proc.wait()
                if self.decision.asked == "os":
                    raise UsageError(f"--isolation os: the namespaces could not be made ({why}); use --isolation python")
                self.decision = Decision("python", self.decision.asked,
                                         why=f"OS isolation is not available here ({why})", trackers=self.decision.trackers)
                return self._start()
        self.announced = False   # (said with the first event: a worker that stops at once on bad input says only why)

    def _relay(self) -> None:
        exited_at = None
        while True:
            try:
                conn, message = self.listener.inbox.get(timeout=0.05)
            except queue.Empty:
                conn, message = None, None
            if message is not None:
                self._handle(conn, message)
            self._check_interrupt()
            self._check_deadlines()
            if self.worker.poll() is not None:
                exited_at = exited_at or time.monotonic()
                # (what the worker sent before it ended is read to the end: its connection closes with it)
                if self.listener.inbox.empty() and (not self.listener.connections or time.monotonic() - exited_at > 2.0
                                                    or all(c.hello.get("closed") for c in self.listener.connections)):
                    break

    def _handle(self, conn, message: dict) -> None:
        kind = message.get("t")
        if kind == "event":
            if not self.announced:
                self.announced = True
                self.announce(self.decision)
            event = channel.decode_event(message)
            self._track(event)
            if self.view is not None:
                self.view(event)
        elif kind in ("ask", "symptoms"):
            self._ask(conn, message)
        elif kind == "deadline":   # (keyed by connection too: every rank of a distributed run counts its own)
            self.deadlines[(id(conn), message["id"])] = {
                "at": time.monotonic() + float(message["seconds"]), "what": message["what"], "id": message["id"],
                "seconds": float(message["seconds"]), "stop": message.get("stop", True), "stopped": None, "conn": conn}
        elif kind == "clear":
            self.deadlines.pop((id(conn), message.get("id")), None)
        elif kind == "report":
            self.report, self.final = message["report"], bool(message.get("final"))
            if message.get("final"):
                self.artifacts = channel.decode_artifacts(message.get("artifacts") or [])
                self.answers = {"symptoms": message.get("given_symptoms") or [], "answers": message.get("answers") or {}}
        elif kind == "note":
            self.notes.append(message.get("text", ""))
        elif kind == "error":
            self.error = message
        elif kind == "exit":
            self.exit_code = message.get("code")
        elif kind == "cuda-lost":
            self.cuda_lost = message
        elif kind is channel.CLOSED["t"] or kind == "closed":
            conn.hello["closed"] = True

    def _track(self, event) -> None:
        if event.kind == "script-start":
            self.phase = "the observed run of the script"
        elif event.kind == "script-observed":
            self.observed, self.phase = event.data.get("observed"), "the diagnosis's set-up"
        elif event.kind == "script-progress":
            self.progress = event.data
        elif event.kind == "script-note":
            self.notes.append(event.data.get("text", ""))
            if event.data.get("kind") == "stop-caught":   # the run goes on after its stop: it is stopped now
                for deadline in self.deadlines.values():
                    deadline["at"] = min(deadline["at"], time.monotonic() + 1.0)
        elif event.kind == "probe-start":
            self.phase = f"probe {event.data.get('probe')}"
        elif event.kind == "probe-end":
            self.phase = "between probes"

    def _ask(self, conn, message: dict) -> None:
        from nnwizard.events import Question

        started = time.monotonic()
        if self.view is not None and hasattr(self.view, "close"):
            self.view.close()   # (no spinner over the question)
        try:
            if self.prompter is None:
                raise KeyboardInterrupt
            if message["t"] == "symptoms":
                value = self.prompter.choose_symptoms(message["choices"])
            else:
                value = self.prompter.ask(Question(**message["question"]))
            conn.send({"t": "answer", "id": message["id"], "value": value})
        except (KeyboardInterrupt, EOFError):
            conn.send({"t": "answer", "id": message["id"], "error": "interrupted"})
            self.interrupts = max(self.interrupts, 1)
        except NNWizardError as exc:
            conn.send({"t": "answer", "id": message["id"], "error": str(exc)})
        paused = time.monotonic() - started   # (a person answering is not the program running)
        for deadline in self.deadlines.values():
            deadline["at"] += paused

    # -- signals and limits ----------------------------------------------------------------------
    def _signal(self, signum, frame) -> None:
        self.interrupts += 1

    def _check_interrupt(self) -> None:
        if not self.interrupts:
            return
        now = time.monotonic()
        if self.interrupt_at is None:
            self.interrupt_at = now
            if self.view is not None and hasattr(self.view, "close"):
                self.view.close()
            sys.stderr.write("nnwizard: interrupted; finishing the partial report (Ctrl-C again to stop at once)\n")
            sys.stderr.flush()
            if self.launch.passthrough:
                self.worker.interrupt_signal()
            else:
                self.listener.broadcast({"t": "interrupt"})
        if self.worker.poll() is None and (self.interrupts > 1 or now - self.interrupt_at > INTERRUPT_GRACE_S):
            self.worker.kill("interrupted")

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for d in list(self.deadlines.values()):
            if now < d["at"]:
                continue
            if d["stop"] and (d["stopped"] is None or now - d["stopped"] >= 0.5):   # (again: a stop may be caught)
                d["stopped"] = now
                d["conn"].send({"t": "stop", "id": d["id"]})
            if now >= d["at"] + STOP_GRACE_S and self.worker.poll() is None:
                self.deadlines.clear()
                self.worker.kill(f"{d['what']} passed its time limit of {d['seconds']:.0f} s and did not stop when asked "
                                 f"(the script may catch BaseException, or block in native code): nnwizard ended its "
                                 f"processes {STOP_GRACE_S:.0f} s later")
                return

    # -- how it ended ----------------------------------------------------------------------------
    def ended(self) -> dict | None:
        """None when the worker finished its work; else how the program's process ended, in words."""
        if self.final and not self.worker.killed:
            return None
        end = self.worker.ended()
        where = self.phase + (f", after {self.progress['step']} optimizer steps" if self.progress.get("step") and
                              "observed" in self.phase else "")
        exited = next((n for n in reversed(self.notes) if "os._exit" in n), None)
        if self.worker.killed == "interrupted" or (self.interrupts and not self.worker.killed):
            why, text = "interrupted", f"interrupted (Ctrl-C) during {where}; the worker did not finish its partial report in time"
        elif self.worker.killed:
            why, text = "time-limit", f"during {where}: {self.worker.killed}"
        elif end["signal"]:
            name = SIGNALS.get(end["signal"], f"signal {end['signal']}")
            why, text = "crashed", f"the program's process died of {name} ({WHAT_SIGNAL.get(name, 'a signal')}) during {where}"
        else:
            why = "exited"
            text = (f"the program's process ended with exit code {end['exit']} during {where}, before the diagnosis "
                    f"finished" + (f" ({exited})" if exited else ""))
        stack = _python_stack(self.worker.log_tail(40))
        return {"why": why, "text": text, "phase": self.phase, "exit_code": end["exit"], "signal": end["signal"],
                "steps": self.progress.get("step"), "stack": stack, "notes": [n for n in self.notes if n]}

    def cleanup(self) -> None:
        if self.keep:
            return
        from nnwizard.isolate.overlay import remove_tree

        remove_tree(str(self.folder))


def _python_stack(lines: list[str]) -> list[str]:
    """Python's stack, as faulthandler wrote it to the worker's log at a fatal signal (innermost first)."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(("Fatal Python error", "Current thread",
                                                                                   "Thread 0x"))), None)
    if start is None:
        return []
    return [line.strip() for line in lines[start:] if line.strip().startswith("File ")][:8]


class _signals:
    """SIGINT, SIGTERM and SIGHUP while a worker runs: counted (the relay acts on them), never raised."""

    def __init__(self, handler):
        self.handler, self.saved = handler, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for name in ("SIGINT", "SIGTERM", "SIGHUP"):
                sig = getattr(signal, name, None)
                if sig is not None:
                    self.saved[sig] = signal.signal(sig, self.handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------------------------ commands
def diagnose(opts, isolation: str = "auto", keep_scratch: bool = False) -> int:
    """``nnwizard diagnose``: the diagnosis in a worker; the reports written here from what it sent."""
    from nnwizard.options import check_outputs, check_target
    from nnwizard.view import TerminalView

    check_target(opts)
    check_outputs(opts)
    if opts.script:
        _check_script(opts.script)
    elif opts.module:
        _check_module(opts.module)
    view = TerminalView(quiet=opts.quiet)
    env: dict[str, str] = {}
    while True:
        session = Session(Launch({"command": "diagnose", "options": opts.to_json()}, env=env),
                          isolation, keep_scratch, view, _prompter(opts), opts.script,
                          announce=lambda d: _announce(view, d))
        try:
            session.run()
            if session.cuda_lost and not env:
                opts, env = _on_cpu(opts, session.cuda_lost, view)
                continue
            return _finish(session, opts, view)
        finally:
            view.close()
            session.cleanup()


def _announce(view, decision: Decision) -> None:
    from rich.markup import escape

    if not view.quiet:
        style = "yellow" if decision.why else "dim"
        view.console.print(f"[{style}]{escape(decision.describe())}[/]", highlight=False)


def _prompter(opts):
    if not opts.interactive:
        return None
    from nnwizard.prompts import QuestionaryPrompter

    return QuestionaryPrompter({})


def _on_cpu(opts, lost: dict, view) -> tuple:
    """A sticky CUDA error ended the worker: the same diagnosis again on the CPU, with CUDA hidden."""
    from dataclasses import replace

    sys.stderr.write(f"nnwizard: on CUDA, {lost['error']} (seen {lost['where']}). This error leaves the CUDA context "
                     f"unusable; running the diagnosis again on the CPU, where the same code raises a readable error…\n")
    opts = replace(opts, device="cpu", symptoms=list(lost.get("symptoms") or opts.symptoms),
                   preset_answers={**opts.preset_answers, **(lost.get("answers") or {})})
    return opts, {"CUDA_VISIBLE_DEVICES": "", "NNWIZARD_CUDA_LOST": f"{lost['error']} (seen {lost['where']})"}


def _finish(session: Session, opts, view) -> int:
    from nnwizard.options import exit_code
    from nnwizard.report import Report

    if session.error and session.error.get("code") == int(ExitCode.USAGE) and not session.report:
        raise UsageError(session.error["message"])
    internal = session.error if session.error and session.error.get("code") == int(ExitCode.INTERNAL) else None
    ended = session.ended()
    data = session.report
    if data is None and ended is None and internal is None:
        ended = {"why": "exited", "text": "the worker ended without a report", "phase": session.phase}
    if data is None or ended is not None or internal is not None:
        data = _partial(data, session, opts, ended, internal)
    data["isolation"] = {**session.decision.as_dict(), **_files(session)}
    if not session.keep and data.get("script"):
        for item in data["script"].get("written") or []:
            item["saved_as"] = ""
        data["script"]["scratch"] = None
    if session.interrupts and (ended is not None or not session.final):   # (a diagnosis that had finished stands)
        data["interrupted"] = True
    report = Report.model_validate(data)
    written = _write(report, session, opts)
    view.summary(report, written)
    if internal is not None:
        log = crash_log(internal.get("traceback") or internal.get("message", ""))
        print(f"nnwizard: internal error: {internal.get('message')}. This is a bug in nnwizard; the traceback is in {log}.",
              file=sys.stderr)
        return int(ExitCode.INTERNAL)
    if session.keep:
        print(f"nnwizard: the scratch folder is kept: {session.folder}", file=sys.stderr)
    return int(exit_code(report, opts))


def _files(session: Session) -> dict:
    """What the program wrote and deleted, as isolation recorded it (os: the overlay; python: the sandbox)."""
    changes = session.worker.changes if session.worker else {}
    if changes:
        ours = str(session.folder)
        return {"written": [p for p in changes.get("written", []) if not p.startswith(ours) and not p.endswith("/")][:500],
                "deleted": changes.get("deleted", [])[:500]}
    obs = (session.report or {}).get("script") or session.observed or {}
    return {"written": [w["path"] for w in obs.get("written") or []], "deleted": list(obs.get("deleted") or [])}


def _partial(data: dict | None, session: Session, opts, ended: dict | None, internal: dict | None) -> dict:
    """The report of a diagnosis cut short: what the worker last sent (or what is known without it), the way its
    process ended as a reason the verdict cannot be healthy."""
    if data is None:
        data = {"nnwizard_version": nnwizard.__version__, "module": opts.script or opts.module or "", "device": opts.device,
                "seed": opts.seed, "symptoms": [], "given_symptoms": list(opts.symptoms), "verdict": "inconclusive",
                "hypotheses": [], "probes": [], "mode": "script" if opts.script else "module",
                "script": session.observed,
                "environment": {"nnwizard": nnwizard.__version__, "python": sys.version.split()[0]}}
    data = dict(data)
    data.setdefault("not_run", [])
    if ended is not None:
        data["ended"] = ended
        data["not_run"] = list(data["not_run"]) + [{"probe": "program", "status": "errored", "why": ended["why"],
                                                    "reason": ended["text"]}]
    if internal is not None:
        data["not_run"] = list(data["not_run"]) + [{"probe": "nnwizard", "status": "errored", "why": "internal-error",
                                                    "reason": internal.get("message", "")}]
    found = any(h.get("confidence", 0) >= 0.5 for h in data.get("hypotheses") or [])
    data["verdict"] = "problems-found" if found else "inconclusive"
    return data


def _write(report, session: Session, opts) -> list[str]:
    from nnwizard.markdown import render_markdown
    from nnwizard.report import write_json

    written = []
    if opts.json_path:
        write_json(report, opts.json_path)
        written.append(str(opts.json_path))
    if opts.report_path:
        render_markdown(report, session.artifacts, opts.report_path)
        written.append(str(opts.report_path))
    answers = session.answers.get("answers") if session.answers else None
    symptoms = session.answers.get("symptoms") if session.answers else None
    if opts.interactive and (answers or symptoms):
        from nnwizard.prompts import save_answers

        path = opts.save_answers or Path("nnwizard-answers.yaml")
        save_answers(path, symptoms or [], answers or {})
        written.append(f"{path} (replay with --answers {path})")
    return written


def _check_script(spec: str) -> None:
    """A script that cannot run at all is exit 2 here, before any worker starts (a dotted name is looked up as a
    file only: importing it would run the user's code in this process)."""
    from nnwizard.script_file import load_script

    load_script(spec, import_names=False)


def _check_module(spec: str) -> None:
    path = spec.split(":", 1)[0]
    if (path.endswith(".py") or os.sep in path) and not Path(path).is_file():
        raise UsageError(f"--module {spec}: no such file")


def passthrough(job: dict, announce_isolation: bool = False) -> int:
    """``watch`` and ``replay``: the command in a worker whose output is the terminal's (the user's real run, no
    isolation); Ctrl-C passed on as the terminal would, the tree killed if it does not end, a crash named."""
    session = Session(Launch(job, passthrough=True), isolation="none")
    try:
        session.run()
        end = session.worker.ended()
        if session.error and session.error.get("code") == int(ExitCode.USAGE):
            raise UsageError(session.error["message"])
        if session.error and session.error.get("code") == int(ExitCode.INTERNAL):
            log = crash_log(session.error.get("traceback") or session.error.get("message", ""))
            print(f"nnwizard: internal error: {session.error.get('message')}. This is a bug in nnwizard; the "
                  f"traceback is in {log}.", file=sys.stderr)
            return int(ExitCode.INTERNAL)
        for note in session.notes:
            print(f"nnwizard: {note}", file=sys.stderr)
        if session.interrupts:
            return int(ExitCode.INTERRUPTED)
        if end["signal"]:
            name = SIGNALS.get(end["signal"], f"signal {end['signal']}")
            print(f"nnwizard: the program's process died of {name} ({WHAT_SIGNAL.get(name, 'a signal')})", file=sys.stderr)
            return 128 + int(end["signal"])
        return int(end["exit"] if end["exit"] is not None else ExitCode.INTERNAL)
    finally:
        session.cleanup()

