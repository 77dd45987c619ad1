"""Keeping the user's files as they were while their program runs (``--isolation auto|os|python|none``).

``os`` (Linux): the worker runs in its own user, mount and pid namespaces over copy-on-write overlays
(namespaces.py, overlay.py): every write by any code lands in the overlay, children included. ``python``: the
Python functions that reach the file system are patched (python_sandbox.py). ``none``: the program's side
effects are real (watch mode, or asked for). ``auto``: ``os`` where the kernel allows it, else ``python``.

The supervisor side (``static_reason``, ``Decision``) imports nothing heavy; the worker side (``current()``) is
what each run of the script (wizard/script_run.py) enters: a fresh view of the files before the run, and the
files written and deleted after it.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nnwizard.errors import UsageError

MODES = ("auto", "os", "python", "none")
OVERLAY_ENV = "NNWIZARD_OVERLAY_FD"      # (namespaces.CONTROL_ENV) init's control socket, in the worker
MODE_ENV = "NNWIZARD_ISOLATION"          # the mode in force, in the worker
SCRATCH_ENV = "NNWIZARD_SCRATCH"         # the supervisor's private folder for this run, in the worker


@dataclass
class Decision:
    """The isolation in force for a run, and why when it is not the one asked for."""

    mode: str
    asked: str
    why: str = ""                            # why ``auto`` fell back, in words
    notes: list[str] = field(default_factory=list)
    trackers: str = ""

    def describe(self) -> str:
        text = {"os": "isolation: os (your files are seen through a copy-on-write overlay; every change is discarded)",
                "python": "isolation: python (the script's writes go to a scratch folder; child processes are refused)",
                "none": "isolation: none (the script's side effects are real)"}[self.mode]
        return text + (f"; {self.why}" if self.why else "")

    def as_dict(self) -> dict:
        return {"mode": self.mode, "asked": self.asked, "why": self.why, "notes": self.notes, "trackers": self.trackers}


def static_reason() -> str | None:
    """Why OS isolation cannot work here, when that is known without trying (None: try it)."""
    if not sys.platform.startswith("linux"):
        return f"no user namespaces on {sys.platform}"
    for path, bad, why in (("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=0"),
                           ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces=0")):
        try:
            if Path(path).read_text().strip() == bad and os.geteuid() != 0:
                return f"user namespaces are disabled ({why})"
        except OSError:
            pass
    release = os.uname().release.split("-")[0].split(".")
    try:
        if os.geteuid() != 0 and tuple(int(x) for x in release[:2]) < (5, 11):
            return f"the kernel ({os.uname().release}) cannot mount overlays in a user namespace (5.11 or later can)"
    except ValueError:
        pass
    return None


TRACKERS = "experiment trackers offline, writing into nnwizard's scratch folder (wandb, MLflow, Comet, Neptune, ClearML, SwanLab)"


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


# ------------------------------------------------------------------------------------------- worker side
class RunFiles:
    """What one run wrote (``[(path as the script used it, where the content is kept)]``) and deleted."""

    def __init__(self, written=None, deleted=None):
        self._written, self._deleted = list(written or []), list(deleted or [])

    def written(self) -> list[tuple[str, str]]:
        return self._written

    def deleted(self) -> list[str]:
        return self._deleted


class InProcess:
    """nnwizard used as a library (or in its tests): each sandboxed run installs the Python sandbox for itself."""

    mode = "python"

    def scratch(self) -> Path:
        path = Path(tempfile.mkdtemp(prefix="nnwizard-script-"))
        atexit.register(_remove, path)   # (the runs of this process may read it until it ends; then it goes)
        return path

    @contextmanager
    def run(self, sandboxed: bool, scratch: Path | None):
        from nnwizard.isolate.python_sandbox import Sandbox

        if not sandboxed or scratch is None:
            yield RunFiles()
            return
        files = RunFiles()
        with Sandbox(scratch) as sandbox:
            yield files
        files._written, files._deleted = sandbox.written(), sandbox.deleted()


class PythonWorker:
    """``--isolation python`` in a worker: one sandbox for the process's whole life (the script's threads, exit
    handlers and ``__del__`` stay inside it after a run), a fresh scratch folder for each run."""

    mode = "python"

    def __init__(self, folder: Path):
        from nnwizard.isolate.python_sandbox import Sandbox

        self.folder, self.count = folder, 0
        self.sandbox = Sandbox(None)
        self.sandbox.install()
        self.sandbox.begin(self.scratch())   # (module mode's code, run outside any script run, is inside it too)

    def scratch(self) -> Path:
        self.count += 1
        path = self.folder / f"run-{self.count}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @contextmanager
    def run(self, sandboxed: bool, scratch: Path | None):
        files = RunFiles()
        if not sandboxed or scratch is None:
            yield files
            return
        self.sandbox.begin(scratch)
        try:
            yield files
        finally:
            files._written, files._deleted = self.sandbox.end(), self.sandbox.deleted()
            self.sandbox.begin(scratch)   # (kept: what the script's threads write later still goes there)

    @property
    def refused(self) -> list[str]:
        return self.sandbox.refused


class Overlay:
    """``--isolation os`` in a worker: the namespace's init makes a fresh generation of the overlays before every
    run but the first (a rerun starts from the user's files, not from what the run before it wrote) and lists
    what each run wrote and deleted."""

    mode = "os"

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)
        self.home = os.getcwd()
        self.runs = 0
        self._buffer = b""

    def scratch(self) -> None:
        return None

    def ask(self, op: str) -> dict:
        self.sock.sendall((json.dumps({"op": op}) + "\n").encode())
        while b"\n" not in self._buffer:
            data = self.sock.recv(1 << 16)
            if not data:
                return {"ok": False, "why": "the namespace's init is gone"}
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    @contextmanager
    def run(self, sandboxed: bool, scratch: Path | None):
        files = RunFiles()
        if self.runs:
            self.ask("fresh")
            os.chdir(self.home)   # (the old overlay is let go: its path now leads to the new one)
        self.runs += 1
        try:
            yield files
        finally:
            changes = self.ask("changes").get("changes") or {}
            files._written = [(_shown(p, self.home), "") for p in changes.get("written", []) if not p.endswith("/")]
            files._deleted = list(changes.get("deleted", []))


class NoIsolation:
    mode = "none"

    def scratch(self) -> None:
        return None

    @contextmanager
    def run(self, sandboxed: bool, scratch: Path | None):
        yield RunFiles()


def _remove(path: Path) -> None:
    from nnwizard.isolate.overlay import remove_tree

    remove_tree(str(path))


def _shown(path: str, home: str) -> str:
    try:
        return str(Path(path).relative_to(home))
    except ValueError:
        return path


_current: list = [InProcess()]


def current():
    return _current[0]


def install_worker(mode: str, folder: Path) -> object:
    """The worker's isolation for its whole life (``mode`` as the supervisor decided it)."""
    if mode == "os" and os.environ.get(OVERLAY_ENV):
        _current[0] = Overlay(int(os.environ.pop(OVERLAY_ENV)))
    elif mode == "python":
        _current[0] = PythonWorker(folder / "sandbox")
    else:
        _current[0] = NoIsolation()
    return _current[0]
