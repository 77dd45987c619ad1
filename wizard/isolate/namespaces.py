"""``--isolation os`` on Linux: start the worker in its own user, mount and pid namespaces, over copy-on-write
overlays of every writable file system (wizard/isolate/overlay.py).

Run as a file by the supervisor, before any other Python of ours starts (stdlib only, ``python -I -S``)::

    python -I -S namespaces.py SPEC_JSON

SPEC: ``argv`` (the worker's command), ``env``, ``cwd``, ``scratch`` (the supervisor's private folder: the upper
layers live there), ``roots`` (places the script likely writes), ``status_fd`` (JSON lines to the supervisor:
``ready``, ``failed``, ``changes``, ``status``), ``control_fd`` (lines from the supervisor: ``kill``), ``keep``.

Three processes: this launcher (enters the user and mount namespaces, maps our user and group to themselves so
files and ``os.getuid()`` read as outside, makes every mount private, plans the overlays, waits); the first
process of the new pid namespace, its init (mounts a fresh /proc, covers the file systems, reaps every orphan,
makes a fresh generation of the overlays when the worker asks before a rerun, lists what was written, and ends
the namespace, killing whatever the worker left running, when the worker ends or the supervisor says ``kill``);
and the worker, which it starts. When the supervisor dies, the launcher and init die with it (PR_SET_PDEATHSIG),
and with init every process of the namespace. As root (no user namespace needed) only the mount and pid
namespaces are made, and every owner is kept on copy-up.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overlay  # noqa: E402 - (a sibling file: this runs before nnwizard can be imported)

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
PR_SET_PDEATHSIG = 1
FAILED = 97          # the launcher's exit code when the namespaces could not be made (nothing of the worker ran)
CONTROL_ENV = "NNWIZARD_OVERLAY_FD"   # the worker's end of init's control socket

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Status:
    def __init__(self, fd: int):
        self.fd = fd

    def send(self, **message) -> None:
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass


def enter(user_namespace: bool) -> None:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if user_namespace else 0)),
           "unshare(user, mount namespaces)" if user_namespace else "unshare(mount namespace)")
    if user_namespace:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    overlay.mount(None, "/", None, overlay.MS_REC | overlay.MS_PRIVATE)


def main(spec: dict) -> int:
    status = Status(spec["status_fd"])
    user_namespace = os.geteuid() != 0
    try:
        enter(user_namespace)
        units = overlay.plan(overlay.mounts(), spec.get("roots", []), os.getuid(), os.getgid(), user_namespace)
        layers = overlay.Layers(units, spec["scratch"], user_namespace)
        layers.keep_all = bool(spec.get("keep"))
        _check(_libc.unshare(CLONE_NEWPID), "unshare(pid namespace)")
    except OSError as exc:
        status.send(t="failed", why=str(exc.strerror or exc))
        return FAILED
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:   # (the supervisor died before we got here)
        return FAILED
    init = os.fork()
    if init == 0:
        try:
            code = Init(spec, status, layers, user_namespace).run()
        except BaseException as exc:  # noqa: BLE001 - init must never leave through Python's exit
            status.send(t="failed", why=f"{type(exc).__name__}: {exc}")
            code = FAILED
        os._exit(code)
    status.send(t="init", pid=init)
    while True:
        try:
            _, raw = os.waitpid(init, 0)
            break
        except ChildProcessError:
            return FAILED
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(raw) if os.WIFEXITED(raw) else 128 + os.WTERMSIG(raw)


class Init:
    """Pid 1 of the worker's namespace."""

    def __init__(self, spec: dict, status: Status, layers: overlay.Layers, user_namespace: bool):
        self.spec, self.status, self.layers, self.user_namespace = spec, status, layers, user_namespace
        self.notes: list[str] = []

    def run(self) -> int:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            overlay.mount("proc", "/proc", "proc", overlay.MS_NOSUID | overlay.MS_NODEV)
        except OSError as exc:
            self.notes.append(f"/proc shows the processes outside ({exc.strerror})")
        try:
            self.notes += self.layers.mount_all()
        except OSError as exc:
            self.status.send(t="failed", why=str(exc.strerror or exc))
            return FAILED
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        worker = os.fork()
        if worker == 0:
            self._exec_worker(mine, theirs)
        theirs.close()
        self.status.send(t="ready", units=[repr(u) for u in self.layers.units], notes=self.notes,
                         user_namespace=self.user_namespace)
        code = self._serve(worker, mine)
        self.status.send(t="changes", changes=self.layers.changes())
        if self.spec.get("keep"):
            self.layers.keep(os.path.join(self.spec["scratch"], "kept"))
        return code

    def _exec_worker(self, mine: socket.socket, theirs: socket.socket) -> None:
        try:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            mine.close()
            for fd in (self.spec["status_fd"], self.spec["control_fd"]):
                os.close(fd)
            os.set_inheritable(theirs.fileno(), True)
            env = dict(self.spec["env"], **{CONTROL_ENV: str(theirs.fileno())})
            os.chdir(self.spec["cwd"])   # (again: the same path, now through the overlays)
            os.execvpe(self.spec["argv"][0], self.spec["argv"], env)
        except BaseException as exc:  # noqa: BLE001
            sys.stderr.write(f"nnwizard: the worker could not start: {exc}\n")
        os._exit(127)

    def _serve(self, worker: int, mine: socket.socket) -> int:
        """Until the worker ends: reap orphans, answer the worker, obey the supervisor; then end the namespace."""
        control, buffer, requests = self.spec["control_fd"], b"", b""
        code: int | None = None
        watched = [mine.fileno(), control]
        while code is None:
            try:
                ready, _, _ = select.select(watched, [], [], 0.1)
            except InterruptedError:
                ready = []
            if control in ready:
                data = os.read(control, 4096)
                if not data:
                    watched.remove(control)   # (the supervisor went away: PDEATHSIG ends us)
                buffer += data
                if b"kill" in buffer:
                    _kill_all()
            if mine.fileno() in ready:
                data = mine.recv(4096)
                if not data:
                    watched.remove(mine.fileno())
                requests += data
                while b"\n" in requests:
                    line, requests = requests.split(b"\n", 1)
                    self._answer(mine, line)
            code = self._reap(worker)
        _kill_all()
        while True:   # every process of the namespace is gone before init reports
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        return code

    def _answer(self, sock: socket.socket, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            return
        reply: dict = {"ok": True}
        try:
            if request.get("op") == "fresh":
                reply["changes"] = self.layers.changes()
                reply["notes"] = self.layers.fresh()
            elif request.get("op") == "changes":
                reply["changes"] = self.layers.changes()
        except OSError as exc:
            reply = {"ok": False, "why": str(exc)}
        try:
            sock.sendall((json.dumps(reply) + "\n").encode())
        except OSError:
            pass

    def _reap(self, worker: int) -> int | None:
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 1
            if pid == 0:
                return None
            if pid == worker:
                exit_code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else None
                self.status.send(t="status", exit=exit_code, signal=None if os.WIFEXITED(raw) else os.WTERMSIG(raw))
                return exit_code if exit_code is not None else 128 + os.WTERMSIG(raw)


def _kill_all() -> None:
    try:
        os.kill(-1, signal.SIGKILL)   # (from init: every other process of the namespace)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
