"""The channel between the supervisor (the process the user started) and its worker processes: JSON lines over a
local socket. A worker streams what the view shows (events), asks its questions, arms its time limits and sends
its report as it grows; the supervisor answers, interrupts and stops. Importable without torch.

Address: ``NNWIZARD_CHANNEL`` (``@name``: an abstract Linux socket, which no mount namespace hides; otherwise a
socket file in the supervisor's private run folder) and ``NNWIZARD_CHANNEL_TOKEN`` (a secret each worker sends
first, so no other local process can talk in its place). Each worker (one per rank, later) opens its own
connection, so messages never interleave however large they are.

Worker to supervisor (``t``): ``hello`` · ``event`` (kind, tree, node, data) · ``ask`` (id, question) ·
``symptoms`` (id, choices) · ``deadline`` (id, seconds, what, stop) · ``clear`` (id) · ``report`` (report,
artifacts, final) · ``note`` (text) · ``observed`` (the observed run so far) · ``cuda-lost`` · ``error``
(kind, message) · ``exit`` (code). Supervisor to worker: ``answer`` (id, value or error) · ``interrupt`` ·
``stop`` (id).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import secrets
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from nnwizard.events import Event, Question

ADDRESS_ENV, TOKEN_ENV = "NNWIZARD_CHANNEL", "NNWIZARD_CHANNEL_TOKEN"
CLOSED = {"t": "closed"}   # what a reader queues when its worker's connection ends


# ----------------------------------------------------------------------------------------------- wire form
def _plain(value: Any) -> Any:
    """Engine objects (results, evidence, questions, budgets) as JSON-safe data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in ("artifacts", "target", "func")}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "as_dict"):
        return _plain(value.as_dict())
    return str(value)


class Obj(dict):
    """A decoded engine object: its fields read as attributes (``result.summary``) by the view."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def encode_event(event: Event) -> dict:
    return {"t": "event", "kind": event.kind, "tree": event.tree, "node": event.node, "data": _plain(event.data)}


def decode_event(message: dict) -> Event:
    data = {k: Obj(v) if isinstance(v, dict) and k in ("result", "evidence", "question") else v
            for k, v in (message.get("data") or {}).items()}
    return Event(message["kind"], message.get("tree", ""), message.get("node", ""), data)


def _dumps(message: dict) -> bytes:
    return (json.dumps(message, default=str, separators=(",", ":")) + "\n").encode("utf-8")


def _lines(sock: socket.socket):
    """The JSON messages arriving on ``sock`` until it closes (a line that is not JSON is skipped)."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            return
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            try:
                yield json.loads(line)
            except ValueError:
                continue


# ----------------------------------------------------------------------------------------------- supervisor
class Listener:
    """The supervisor's end: a listening socket; every accepted worker gets a reader thread that puts its
    messages on ``inbox`` (with ``conn``: where to answer) and CLOSED when it goes away."""

    def __init__(self, folder: Path):
        self.token = secrets.token_hex(16)
        self.inbox: queue.Queue = queue.Queue()
        self.connections: list[Connection] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if sys.platform.startswith("linux"):
            name = f"nnwizard-{os.getpid()}-{secrets.token_hex(8)}"
            self._server.bind("\0" + name)
            self.address = "@" + name
        else:   # (a socket file's path must stay short: macOS allows 104 bytes)
            path = Path(folder) / "channel.sock"
            if len(str(path)) > 100:
                import tempfile

                path = Path(tempfile.mkdtemp(prefix="nnw-", dir="/tmp")) / "c.sock"
            self._server.bind(str(path))
            self.address = str(path)
        self._server.listen(16)
        threading.Thread(target=self._accept, name="nnwizard-channel", daemon=True).start()

    def env(self) -> dict[str, str]:
        return {ADDRESS_ENV: self.address, TOKEN_ENV: self.token}

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(sock,), daemon=True).start()

    def _read(self, sock: socket.socket) -> None:
        messages = _lines(sock)
        hello = next(messages, None)
        if not hello or hello.get("t") != "hello" or hello.get("token") != self.token:
            sock.close()
            return
        conn = Connection(sock, hello)
        self.connections.append(conn)
        self.inbox.put((conn, hello))
        for message in messages:
            self.inbox.put((conn, message))
        self.inbox.put((conn, CLOSED))

    def broadcast(self, message: dict) -> None:
        for conn in list(self.connections):
            conn.send(message)

    def close(self) -> None:
        try:
            self._server.close()
        except OSError:
            pass
        for conn in self.connections:
            conn.close()


class Connection:
    def __init__(self, sock: socket.socket, hello: dict):
        self.sock, self.hello = sock, hello
        self._lock = threading.Lock()

    def send(self, message: dict) -> bool:
        with self._lock:
            try:
                self.sock.sendall(_dumps(message))
                return True
            except OSError:
                return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------- worker
class Client:
    """A worker's end. ``send`` is thread-safe and does nothing in a process forked from the worker (a script's
    ``os.fork()`` child must never speak for it). Control messages go to ``on_control``; answers to ``request``."""

    def __init__(self, address: str, token: str, hello: dict | None = None):
        self.owner = os.getpid()
        self.closing = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect("\0" + address[1:] if address.startswith("@") else address)
        os.set_inheritable(self._sock.fileno(), False)
        self._lock = threading.Lock()
        self._answers: dict[int, queue.Queue] = {}
        self._next = 0
        self.on_control: Callable[[dict], None] = lambda message: None
        self.send({"t": "hello", "token": token, "pid": os.getpid(), **(hello or {})})
        threading.Thread(target=self._read, name="nnwizard-control", daemon=True).start()

    @classmethod
    def from_env(cls, hello: dict | None = None) -> "Client | None":
        address = os.environ.get(ADDRESS_ENV)
        return cls(address, os.environ.get(TOKEN_ENV, ""), hello) if address else None

    def send(self, message: dict) -> None:
        if os.getpid() != self.owner:
            return
        data = _dumps(message)
        with self._lock:
            try:
                self._sock.sendall(data)
            except OSError:
                pass

    def event(self, event: Event) -> None:
        self.send(encode_event(event))

    def request(self, message: dict, wait: Callable[[], None] | None = None) -> Any:
        """Send a question and wait for its answer (``wait`` runs between polls: an interrupt may arrive)."""
        with self._lock:
            self._next += 1
            ident = self._next
            box = self._answers[ident] = queue.Queue()
        self.send({**message, "id": ident})
        while True:
            try:
                answer = box.get(timeout=0.1)
                break
            except queue.Empty:
                if wait is not None:
                    wait()
        self._answers.pop(ident, None)
        return answer

    def _read(self) -> None:
        for message in _lines(self._sock):
            if message.get("t") == "answer" and message.get("id") in self._answers:
                self._answers[message["id"]].put(message)
            else:
                try:
                    self.on_control(message)
                except Exception:  # noqa: BLE001 - the control thread must live on
                    pass
        self.on_control({"t": "gone"})

    def close(self) -> None:
        self.closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def question_message(question: Question) -> dict:
    return {"t": "ask", "question": dataclasses.asdict(question)}
