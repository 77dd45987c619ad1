"""Adversarial training scripts for the isolation tests: a small training loop plus one thing real scripts do
(delete an output folder, start a child process, register an exit handler, end their process, fork, play with
signals...), and the harness that diagnoses one through the real CLI in a user folder of files whose bytes,
modes and names must come out unchanged, with no process left behind."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

# the loop every case trains with; ``hook(step)`` is the case's per-step code, ``main()`` its body
LOOP = '''
import os, sys, time, signal, shutil, sqlite3, tempfile, atexit, threading, subprocess
from pathlib import Path
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(512, 8)
Y = (X[:, 0] + 0.5 * X[:, 1] > 0).long()
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()


def train(steps=30, hook=lambda step: None):
    for step in range(steps):
        i = (step * 32) % 512
        opt.zero_grad()
        loss = loss_fn(model(X[i:i + 32]), Y[i:i + 32])
        loss.backward()
        opt.step()
        hook(step)
    print(f"trained, loss {loss.item():.3f}")
'''


@dataclass
class Case:
    name: str
    body: str                 # the script's main() body (``train()`` trains)
    python: bool = True       # the case applies to --isolation python too
    raises: bool | str = False   # the script ends with an error (the diagnosis says so: never healthy); "python": there only
    extra: str = ""           # module-level code before main()
    flags: tuple = ()         # nnwizard's flags for this case

    def source(self) -> str:
        main = "def main():\n" + textwrap.indent(textwrap.dedent(self.body).strip() + "\n", "    ")
        return LOOP + textwrap.dedent(self.extra) + "\n" + main + '\n\nif __name__ == "__main__":\n    main()\n'


CASES = {c.name: c for c in [
    Case("rmtree", """
        shutil.rmtree("out")                      # the common "start from a clean output folder"
        os.makedirs("out")
        train()
        torch.save(model.state_dict(), "out/model.pt")
        assert sorted(os.listdir("out")) == ["model.pt"], os.listdir("out")
    """),
    Case("rmdir", """
        os.rmdir("empty")
        assert not os.path.exists("empty")
        train()
    """),
    Case("truncate", """
        os.truncate("notes.txt", 0)
        assert os.path.getsize("notes.txt") == 0
        train()
    """),
    Case("os_open", """
        fd = os.open("notes.txt", os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "w") as f:
            f.write("overwritten")
        assert open("notes.txt").read() == "overwritten"
        train()
    """),
    Case("fileio", """
        import io
        with io.FileIO("data/a.txt", "w") as f:
            f.write(b"replaced")
        assert open("data/a.txt", "rb").read() == b"replaced"
        train()
    """),
    Case("chmod", """
        os.chmod("notes.txt", 0o600)
        os.chmod("data", 0o700)
        assert os.stat("notes.txt").st_mode & 0o777 == 0o600
        train()
    """),
    Case("utime", """
        os.utime("notes.txt", (1, 1))
        assert os.stat("notes.txt").st_mtime == 1
        train()
    """),
    Case("sqlite", """
        db = sqlite3.connect("results.db")
        db.execute("insert into runs values (?, ?)", ("diagnosis", 1.0))
        db.execute("delete from runs where name = 'old'")
        db.commit()
        train()
        db.execute("insert into runs values (?, ?)", ("end", 2.0))
        db.commit()
        db.close()
    """),
    Case("h5py", """
        import h5py
        with h5py.File("data/store.h5", "a") as f:
            f["new"] = [1, 2, 3]
        train()
    """),
    Case("subprocess", """
        subprocess.run(["sh", "-c", "echo from a child > out/child.txt; rm -f notes.txt; chmod 600 data/a.txt"], check=True)
        train()
    """, raises="python"),   # (python isolation refuses the child: the script raises)
    Case("os_system", """
        code = os.system("rm -rf data out")
        train()
    """, raises="python"),
    Case("spawn", """
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=clobber, args=("notes.txt",))
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
        train()
    """, extra='''
def clobber(path):
    with open(path, "w") as f:
        f.write("written by a spawned child")
    os.remove("data/a.txt")
'''),
    Case("atexit", """
        atexit.register(lambda: open("notes.txt", "w").write("written at exit"))
        atexit.register(shutil.rmtree, "data")
        train()
    """),
    Case("thread", """
        def later():
            time.sleep(1.0)   # after the run ended
            open("notes.txt", "a").write("written by a thread")
            shutil.rmtree("out", ignore_errors=True)
        threading.Thread(target=later).start()
        train()
    """),
    Case("finalizer", """
        class Writer:
            def __del__(self):
                with open("notes.txt", "w") as f:
                    f.write("written by __del__")
        w = Writer()
        train()
        del w
        global KEPT
        KEPT = Writer()   # never collected before the process ends
    """),
    Case("mkstemp", """
        fd, path = tempfile.mkstemp(dir=".", suffix=".tmp")
        os.write(fd, b"temp")
        os.close(fd)
        assert os.path.exists(path)
        d = tempfile.mkdtemp(dir=".")
        train()
    """),
    Case("chdir", """
        os.chdir("data")
        open("made_here.txt", "w").write("x")
        train()
    """),
    Case("trackers", """
        mode, folder = os.environ.get("WANDB_MODE"), os.environ.get("WANDB_DIR")
        assert mode in ("offline", "disabled"), mode
        assert os.environ.get("MLFLOW_TRACKING_URI", "").startswith("file:")
        run = Path(folder or "wandb") / "offline-run"
        run.mkdir(parents=True, exist_ok=True)
        (run / "events").write_text("step 0")
        train()
    """),
    Case("glob", """
        for n in (1, 2, 3):   # checkpoints with rotation, as the Hugging Face Trainer keeps them
            Path(f"out/checkpoint-{n}").mkdir()
            torch.save(model.state_dict(), f"out/checkpoint-{n}/model.pt")
            found = sorted(Path("out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
            assert [p.name for p in found][-1] == f"checkpoint-{n}", found
            if len(found) > 2:
                shutil.rmtree(found[0])
        names = sorted(os.listdir("out"))
        assert names == ["checkpoint-2", "checkpoint-3", "log.txt", "old.ckpt"], names
        assert [e.name for e in os.scandir("out/checkpoint-3")] == ["model.pt"]
        train()
    """),
    Case("alarm", """
        signal.signal(signal.SIGALRM, lambda *a: None)   # the script's own alarm handler...
        signal.alarm(0)                                   # ...and nnwizard's alarm cancelled
        train()
        while True:                                       # then it hangs
            time.sleep(0.2)
    """, python=False),
    Case("sigint_ignored", """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        train(steps=2000, hook=lambda step: time.sleep(0.15))   # (slow steps: the probes' reruns take a while)
    """, python=False),
    Case("sigint_handler", """
        stop = []
        signal.signal(signal.SIGINT, lambda *a: stop.append(1))   # graceful-stop code
        train(steps=2000, hook=lambda step: time.sleep(0.15))
    """, python=False),
    Case("retry", """
        for epoch in range(3):
            while True:
                try:
                    train()
                    break
                except BaseException as exc:   # noqa - retries whatever happened
                    print("retrying after", type(exc).__name__)
    """, python=False, flags=("--max-steps", "20")),   # (the step budget ends the run inside the first epoch)
    Case("os_exit", """
        def hook(step):
            if step == 12:
                os._exit(0)
        train(hook=hook)
    """, python=False),
    Case("segfault", """
        import ctypes
        def hook(step):
            if step == 10:
                ctypes.string_at(0)   # a native crash (SIGSEGV) mid-training
        train(hook=hook)
    """, python=False, raises=True),
    Case("exit_in_thread", """
        def hook(step):
            if step == 10:
                t = threading.Thread(target=os._exit, args=(0,))
                t.start()
                t.join()
        train(hook=hook)
    """, python=False, raises=True),
    Case("fork", """
        def hook(step):
            if step == 5:
                pid = os.fork()
                if pid == 0:
                    open("out/child.txt", "w").write("forked")
                    sys.exit(0)
                os.waitpid(pid, 0)
        train(hook=hook)
    """),
    Case("modules_stub", """
        import types
        sys.modules["matplotlib"] = types.ModuleType("matplotlib")
        sys.modules["matplotlib.pyplot"] = types.ModuleType("matplotlib.pyplot")
        train()
    """, python=False),
    Case("fd_redirect", """
        log = os.open("train.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        train()
    """, python=False),
    Case("keyboard_interrupt", """
        def hook(step):
            if step == 10:
                raise KeyboardInterrupt
        train(hook=hook)
    """, python=False, raises=True),
    Case("markup_error", """
        train()
        raise RuntimeError("[/tmp/gloo/transport/tcp/pair.cc:553] Connection closed by peer [bold]x[/bold] [/]")
    """, python=False, raises=True),
]}


# ------------------------------------------------------------------------------------------------ the user's folder
def make_user_folder(folder: Path) -> None:
    """Files a training project has: data, outputs of an earlier run, notes, a results database."""
    (folder / "data" / "sub").mkdir(parents=True)
    (folder / "data" / "a.txt").write_text("the data\n")
    (folder / "data" / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (folder / "out").mkdir()
    (folder / "out" / "old.ckpt").write_bytes(b"an earlier checkpoint")
    (folder / "out" / "log.txt").write_text("epoch 1\n")
    (folder / "empty").mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    os.chmod(folder / "notes.txt", 0o644)
    db = sqlite3.connect(folder / "results.db")
    db.execute("create table runs (name text, value real)")
    db.execute("insert into runs values ('old', 0.5)")
    db.commit()
    db.close()


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path below ``folder``: its kind, mode, mtime and content hash."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            out[str(path.relative_to(folder))] = (st.st_mode, st.st_mtime_ns if path.is_file() else 0, digest)
    return out


def leftovers(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the run's descendants), still alive."""
    found = []
    needle = f"NNWIZARD_TEST_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found


@dataclass
class Outcome:
    code: int
    report: dict | None
    stderr: str
    before: dict
    after: dict
    left: list[int]
    scratch: list[str]
    seconds: float
    markdown: str | None = None


def diagnose(case: Case, tmp: Path, isolation: str = "os", extra: list[str] | None = None, interrupt_after: float | None = None,
             timeout: float = 240) -> Outcome:
    """Diagnose ``case`` through the real CLI from a user folder; ``interrupt_after``: send SIGINT to nnwizard once its
    probes run (after that many seconds at least)."""
    user, temp = tmp / "user", tmp / "tmp"
    user.mkdir()
    temp.mkdir()
    make_user_folder(user)
    (user / "train.py").write_text(case.source())
    before = snapshot(user)
    tag = uuid.uuid4().hex
    env = {**os.environ, "NNWIZARD_TEST_TAG": tag, "TMPDIR": str(temp), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "nnwizard", "diagnose", "--script", "train.py", "--non-interactive", "--isolation",
           isolation, "--json", "report.json", "--budget", "6", *case.flags, *(extra or [])]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=user, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    if interrupt_after is not None:
        _interrupt_during_probes(proc, lines, interrupt_after)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        lines.append("[test] nnwizard timed out")
    reader.join(5)
    seconds = time.monotonic() - started
    report_path, markdown_path = user / "report.json", user / "report.md"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    markdown = markdown_path.read_text() if markdown_path.exists() else None
    for output in (report_path, markdown_path):   # (the reports the user asked for are not their files)
        if output.exists():
            output.unlink()
    shutil.rmtree(user / "report_files", ignore_errors=True)
    time.sleep(0.3)
    return Outcome(proc.returncode, report, "".join(lines), before, snapshot(user), leftovers(tag),
                   sorted(p.name for p in temp.iterdir()), seconds, markdown)


def _interrupt_during_probes(proc: subprocess.Popen, lines: list[str], at_least: float) -> None:
    """SIGINT (what Ctrl-C sends) to nnwizard once a probe has ended and ``at_least`` seconds passed."""
    started, ends = time.monotonic(), time.monotonic() + 180
    while time.monotonic() < ends and proc.poll() is None:
        time.sleep(0.1)
        probing = any(line.lstrip().startswith(("✓", "✗", "!")) for line in list(lines))
        if probing and time.monotonic() - started >= at_least:
            proc.send_signal(signal.SIGINT)
            return
