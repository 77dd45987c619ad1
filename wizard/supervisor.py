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

import os
import queue
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from nnwizard import channel
from nnwizard.errors import ExitCode, NNWizardError, UsageError
from nnwizard.isolate import TRACKERS, Decision, decide, tracker_env, write_roots
from nnwizard.outcome import finish
from nnwizard.processes import SIGNALS, WHAT_SIGNAL, Launch, Worker, internal_error, sweep

STOP_GRACE_S = 10.0      # a worker asked to stop at a deadline: killed this long after, if still there
INTERRUPT_GRACE_S = 5.0  # Ctrl-C: the worker finishes its partial report within this, or is killed


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
        self.final = False
        self.answers: dict = {}
        self.observed: dict | None = None
        self.phase = "start-up"
        self.progress: dict = {}
        self.notes: list[str] = []
        self.error: dict | None = None
        self.exit_code: int | None = None
        self.cuda_lost: dict | None = None
        self.probe_result: dict | None = None
        self.worker: Worker | None = None
        self.stop_caught: str | None = None   # the script caught its run's stop and went on (the worker said so)

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> None:
        self.listener = channel.Listener(self.folder)
        try:
            with _signals(self._signal):
                self._start()
                self._relay()
            self.worker.settle()
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
                self.answers = {"symptoms": message.get("given_symptoms") or [], "answers": message.get("answers") or {}}
        elif kind == "note":
            self.notes.append(message.get("text", ""))
        elif kind == "error":
            self.error = message
        elif kind == "exit":
            self.exit_code = message.get("code")
        elif kind == "cuda-lost":
            self.cuda_lost = message
        elif kind == "probe-result":
            self.probe_result = message
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
                self.stop_caught = event.data.get("text")
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
                if self.stop_caught:
                    why = (f"{d['what']} went on after nnwizard stopped it: the script catches BaseException (nnwizard's "
                           f"stop, and with it KeyboardInterrupt and SystemExit) and carries on, and did not stop when "
                           f"asked again")
                else:
                    why = (f"{d['what']} passed its time limit of {d['seconds']:.0f} s and did not stop when asked (the "
                           f"script may catch BaseException, or block in native code)")
                self.worker.kill(f"{why}: nnwizard ended its processes {STOP_GRACE_S:.0f} s later")
                return

    def cleanup(self) -> None:
        if self.keep:
            return
        from nnwizard.isolate.overlay import remove_tree

        remove_tree(str(self.folder))


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
    from nnwizard.view import TerminalView

    view = TerminalView(quiet=opts.quiet)
    return _supervised(opts, isolation, keep_scratch, view, lambda session, o: finish(session, o, view),
                       _prompter(opts), announce=lambda d: _announce(view, d))


def report(opts, isolation: str = "auto", view=None):
    """The Python API's diagnosis (``nnwizard.diagnose``, ``nnwizard.testing``): the same worker and isolation as the
    command, without a terminal unless ``view`` is given. Returns the Report (``report.written``: the files that
    ``opts`` asked for). UsageError on bad input; NNWizardError when nnwizard itself failed; KeyboardInterrupt
    after Ctrl-C, once the partial reports are written."""
    from nnwizard.outcome import collect

    result, internal, interrupted = _supervised(opts, isolation, False, view,
                                                lambda session, o: (*collect(session, o), session.interrupts))
    if internal is not None:
        raise NNWizardError(internal_error(internal))
    if interrupted:
        raise KeyboardInterrupt
    return result


def _supervised(opts, isolation: str, keep_scratch: bool, view, end, prompter=None, announce=None):
    """The diagnosis ``opts`` asks for, in a worker (once more on the CPU after a sticky CUDA error): what
    ``end(session, opts)`` makes of the session that finished."""
    from nnwizard.options import check

    check(opts)
    if opts.module:
        _check_module(opts.module)
    env: dict[str, str] = {}
    while True:
        session = Session(Launch({"command": "diagnose", "options": opts.to_json()}, env=env),
                          isolation, keep_scratch, view, prompter, opts.script, announce=announce)
        try:
            session.run()
            if session.cuda_lost and not env:
                opts, env = _on_cpu(opts, session.cuda_lost, view)
                continue
            return end(session, opts)
        finally:
            if view is not None:
                view.close()
            session.cleanup()


def probe(opts, probe_id: str, params: dict | None = None, isolation: str = "auto") -> dict:
    """One probe on the program ``opts`` names, in a worker (``nnwizard.testing.assert_overfits_one_batch``): the
    program observed as a diagnosis observes it, then ``probe_id`` measures. Returns the worker's message:
    ``result`` (the ProbeResult's fields, JSON-safe) and ``error`` (the program's own error while observed, or
    None); with ``ended`` (how the worker's process ended) when it sent none."""
    from nnwizard.options import check
    from nnwizard.outcome import how_it_ended

    check(opts)
    session = Session(Launch({"command": "probe", "options": opts.to_json(), "probe": probe_id, "params": params or {}}),
                      isolation, False, None, None, opts.script)
    try:
        session.run()
    finally:
        session.cleanup()
    if session.error and session.error.get("code") == int(ExitCode.USAGE):
        raise UsageError(session.error["message"])
    if session.error and session.error.get("code") == int(ExitCode.INTERNAL):
        raise NNWizardError(internal_error(session.error))
    if session.interrupts:
        raise KeyboardInterrupt
    if session.probe_result is None:
        ended = how_it_ended(session) or {"text": "the worker ended without a result"}
        return {"result": None, "error": None, "ended": ended}
    return session.probe_result


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
            print(f"nnwizard: {internal_error(session.error)}", file=sys.stderr)
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

