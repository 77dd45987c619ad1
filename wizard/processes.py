"""A worker's process tree: started in a session of its own (in ``os`` isolation, through the namespace launcher,
wizard/isolate/namespaces.py), ended whole whatever it does with signals, and how it ended (exit code or signal).
Importable without torch."""

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
from nnwizard.isolate import Decision

SIGNALS = {getattr(signal, n): n for n in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL", "SIGKILL", "SIGTERM",
                                           "SIGINT", "SIGHUP", "SIGPIPE", "SIGQUIT", "SIGXCPU", "SIGUSR1", "SIGUSR2")
           if hasattr(signal, n)}
WHAT_SIGNAL = {"SIGSEGV": "a segmentation fault in native code", "SIGBUS": "a bus error in native code",
               "SIGABRT": "an abort (a failed assertion in native code)", "SIGFPE": "an arithmetic fault in native code",
               "SIGILL": "an illegal instruction", "SIGKILL": "killed from outside: the system's out-of-memory killer, "
               "or another process", "SIGTERM": "asked to terminate by another process"}


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


class Worker:
    """A started worker: its process (the namespace launcher, in ``os`` isolation), its log, and how it ended."""

    def __init__(self, launch: Launch, decision: Decision, folder: Path, inbox: queue.Queue, roots: list[str],
                 keep: bool):
        self.decision, self.folder, self.inbox = decision, folder, inbox
        self.init_pid: int | None = None
        self._status_reader: threading.Thread | None = None
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
            self._status_reader = threading.Thread(target=self._read_status, args=(status_r,), daemon=True)
            self._status_reader.start()
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

    def settle(self, timeout: float = 5.0) -> None:
        """Once it ended: everything the namespace's init reported (how the worker ended, what it wrote) is read."""
        if self._status_reader is not None:
            self._status_reader.join(timeout)

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


def crash_log(text: str) -> Path:
    """A crash log of its own for this run (never one shared path)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(tempfile.gettempdir()) / f"nnwizard-crash-{stamp}-{os.getpid()}.log"
    path.write_text(f"nnwizard {nnwizard.__version__} python {sys.version.split()[0]}\n{' '.join(sys.argv)}\n\n{text}",
                    encoding="utf-8")
    return path


def internal_error(error: dict) -> str:
    """The sentence for a worker's internal error (``{"message", "traceback"}``), its traceback saved to a crash log."""
    log = crash_log(error.get("traceback") or error.get("message", ""))
    return f"internal error: {error.get('message')}. This is a bug in nnwizard; the traceback is in {log}."


