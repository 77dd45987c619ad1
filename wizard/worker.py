"""The worker: the process that imports torch and the user's program, records it, runs the probes and every rerun,
under a supervisor (wizard/supervisor.py) that it talks to over the channel (wizard/channel.py).

    python -m nnwizard.worker JOB_JSON

JOB: ``command`` (``diagnose``: stream events, questions and the report as it grows; ``watch`` / ``replay``: the
command itself, its output on the terminal) and its ``options``, ``isolation`` (the mode the supervisor put in
force) and ``scratch`` (the supervisor's private folder). A notebook runner or one rank of a distributed run is
another job of the same form.

Guards for what a script can do to the process it runs in: ``os._exit`` and ``os.exec*`` from the script end its
run, not the worker (the supervisor is told where they were called); a process the script forks never speaks
for the worker; a segmentation fault leaves Python's stack in the worker's log (faulthandler); the worker ends
with ``os._exit`` once its report is sent, so threads and exit handlers of the script cannot hold it.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from nnwizard import channel, watchdog
from nnwizard.errors import ExitCode, NNWizardError

CHECKPOINT_S = 0.1   # a partial report at most this often (and always the last one): each costs a few ms

_real_exit = os._exit


INTERRUPT = signal.SIGUSR2   # the supervisor's Ctrl-C, delivered to the main thread (the script's own SIGINT handling
                             # plays no part); a signal, not an asynchronous exception, which CPython may hand to a
                             # thread the main thread is starting at that moment


def _raise_in(thread_id: int, exc_type: type) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def _deadline_stop() -> type:
    """The run's StopRun, as raised at the supervisor's deadline (an asynchronous exception is raised as its class:
    the class carries the message)."""
    from nnwizard.record import StopRun

    class DeadlineStop(StopRun):
        def __str__(self) -> str:
            return ("nnwizard's time limit for the run passed and the script was still running (its own alarm or "
                    "signal handling, or a loop that catches BaseException, kept it going)")

    return DeadlineStop


class Control:
    """Acts on the supervisor's messages: Ctrl-C (a KeyboardInterrupt in the main thread), a deadline passed (the
    run's StopRun in the thread that armed it); the supervisor gone (the worker ends)."""

    def __init__(self, client: channel.Client):
        self.client = client
        self.deadlines: dict[int, int] = {}   # deadline id -> thread
        client.on_control = self.handle
        watchdog.install(self.arm, self.clear)

    def arm(self, ident: int, seconds: float, what: str, thread: int, stop: bool) -> None:
        self.deadlines[ident] = thread
        self.client.send({"t": "deadline", "id": ident, "seconds": seconds, "what": what, "stop": stop})

    def clear(self, ident: int) -> None:
        self.deadlines.pop(ident, None)
        self.client.send({"t": "clear", "id": ident})

    def handle(self, message: dict) -> None:
        kind = message.get("t")
        if kind == "interrupt":
            watchdog.request_interrupt()
            signal.pthread_kill(threading.main_thread().ident, INTERRUPT)
        elif kind == "stop" and message.get("id") in self.deadlines:
            _raise_in(self.deadlines[message["id"]], _deadline_stop())
        elif kind == "gone" and not self.client.closing:   # (the supervisor died: nothing left to work for)
            _real_exit(int(ExitCode.INTERRUPTED))


def _guard_exits(client: channel.Client) -> None:
    """``os._exit`` / ``os.exec*`` called by the script: the run ends there (ScriptExited), the worker goes on."""
    from nnwizard import script_run

    owner = os.getpid()

    def where() -> str | None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(os.path.dirname(__file__)):
            frame = frame.f_back
        return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}" if frame is not None else None

    def guarded_exit(code=0):
        if os.getpid() == owner:
            at = where()
            if script_run.running():
                raise script_run.ScriptExited(int(code), f"called os._exit({code})", at)
            client.send({"t": "note", "kind": "exit", "text": f"the program called os._exit({code}) at {at or '?'}"})
        _real_exit(code)

    os._exit = guarded_exit
    for name in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"):
        real = getattr(os, name, None)
        if real is None:
            continue

        def guarded(path, *args, _real=real, _name=name, **kwargs):
            if os.getpid() == owner and script_run.running():
                raise script_run.ScriptExited(0, f"replaced its process with another program (os.{_name}({path!r}))", where())
            return _real(path, *args, **kwargs)

        setattr(os, name, guarded)


class Streamer:
    """The engine's listener in a worker: every event to the supervisor, a partial report at most every
    CHECKPOINT_S seconds."""

    def __init__(self, client: channel.Client, opts):
        self.client, self.opts = client, opts
        self._last = 0.0

    def __call__(self, event) -> None:
        self.client.event(event)

    def checkpoint(self, diagnosis, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < CHECKPOINT_S:
            return
        self._last = now
        send_report(self.client, diagnosis, final)


def send_report(client: channel.Client, diagnosis, final: bool) -> None:
    from nnwizard.report import build

    report = build(diagnosis)   # (its plots and tables travel with the final report only)
    client.send({"t": "report", "final": final, "report": json.loads(report.model_dump_json(exclude=None if final else {"artifacts"})),
                 "given_symptoms": list(diagnosis.given_symptoms), "answers": dict(diagnosis.answers)})


def _prompter(client: channel.Client):
    """Questions the answers file does not settle are asked by the supervisor, at its terminal."""
    from nnwizard.prompts import SYMPTOMS_KEY, ScriptedPrompter

    class ChannelPrompter(ScriptedPrompter):
        def choose_symptoms(self, choices):
            if self.answers.get(SYMPTOMS_KEY):
                return list(self.answers[SYMPTOMS_KEY])
            return self._ask({"t": "symptoms", "choices": choices}) or ["auto"]

        def ask(self, question):
            if question.key in self.answers:
                return self.answers[question.key]
            return self._ask(channel.question_message(question))

        def _ask(self, message):
            answer = client.request(message)
            if "error" in answer:
                raise KeyboardInterrupt
            return answer.get("value")

    return ChannelPrompter


def diagnose(job: dict, client: channel.Client) -> int:
    from nnwizard import cuda_lost
    from nnwizard.options import Options, exit_code
    from nnwizard.report import build
    from nnwizard.session import diagnose as run_diagnosis

    opts = Options.from_json(job["options"])
    watchdog.interrupts_by_message(True)
    stream = Streamer(client, opts)
    try:
        diagnosis = run_diagnosis(opts, listener=stream, checkpoint=stream.checkpoint,
                                  prompter=_prompter(client) if opts.interactive else None)
    except cuda_lost.CudaContextLost as lost:
        client.send({"t": "cuda-lost", "error": lost.error, "where": lost.where, "symptoms": lost.symptoms,
                     "answers": lost.answers})
        return int(ExitCode.INTERNAL)
    send_report(client, diagnosis, final=True)
    return int(exit_code(build(diagnosis), opts))


def watch(job: dict, client: channel.Client) -> int:
    from nnwizard.watch_cmd import run

    o = job["options"]
    return run(o["script"], list(o["args"]), Path(o["out"]), o["on_anomaly"], o.get("every"))


def replay(job: dict, client: channel.Client) -> int:
    from nnwizard.replay import run

    o = job["options"]
    return run(Path(o["bundle"]), o.get("json_path") and Path(o["json_path"]), o.get("report_path") and Path(o["report_path"]),
               o["device"], o["seed"], o["quiet"])


def probe(job: dict, client: channel.Client) -> int:
    """One probe outside any tree (``nnwizard.testing``): its result and the program's own error, if it raised."""
    from nnwizard.jsonsafe import jsonable
    from nnwizard.options import Options
    from nnwizard.session import probe as run_probe

    opts = Options.from_json(job["options"])
    watchdog.interrupts_by_message(True)
    result, target = run_probe(opts, job["probe"], job.get("params") or {})
    recording = getattr(target, "recording", None)
    error = getattr(recording, "error", None) if recording is not None else None
    client.send({"t": "probe-result", "result": {
        "status": result.status, "outcome": result.outcome, "summary": result.summary, "data": jsonable(result.data),
        "duration_s": result.duration_s, "id": result.id or job["probe"], "params": jsonable(result.params)},
        "error": None if error is None else {"type": error.type, "where": error.where, "message": error.message}})
    return int(ExitCode.OK)


COMMANDS = {"diagnose": diagnose, "watch": watch, "replay": replay, "probe": probe}


def main(argv: list[str]) -> None:
    job = json.loads(argv[0])
    client = channel.Client.from_env({"role": "worker", "command": job["command"],   # (a rank of a distributed run says which)
                                      "rank": os.environ.get("RANK"), "world_size": os.environ.get("WORLD_SIZE")})
    if client is None:
        sys.stderr.write("nnwizard.worker: started without a supervisor (NNWIZARD_CHANNEL is not set)\n")
        _real_exit(int(ExitCode.USAGE))
    signal.signal(INTERRUPT, _interrupted)
    Control(client)
    faulthandler.enable()   # (stderr is the worker's log: a crash leaves Python's stack there)
    sys.dont_write_bytecode = True   # (no __pycache__ of the user's modules in their folders)
    code = int(ExitCode.INTERNAL)
    try:
        import torch  # noqa: F401 - (before the sandbox: its save and load are patched too)

        from nnwizard import isolate

        isolate.install_worker(job.get("isolation", "none"), Path(job.get("scratch") or "."))
        _guard_exits(client)
        code = COMMANDS[job["command"]](job, client)
    except NNWizardError as exc:
        client.send({"t": "error", "code": int(exc.exit_code), "message": str(exc)})
        code = int(exc.exit_code)
    except KeyboardInterrupt:
        code = int(ExitCode.INTERRUPTED)
    except BaseException as exc:  # noqa: BLE001 - an internal error: the supervisor writes the crash log
        client.send({"t": "error", "code": int(ExitCode.INTERNAL), "message": f"{type(exc).__name__}: {exc}",
                     "traceback": "".join(traceback.format_exception(exc))})
        code = int(ExitCode.INTERNAL)
    client.send({"t": "exit", "code": code})
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    client.close()
    _real_exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
