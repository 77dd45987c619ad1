"""The supervisor, the worker and isolation, end to end: adversarial scripts (tests/adversarial.py) diagnosed
through the real CLI must leave the user's files byte-identical (content, mode, names), end with the right exit
code and a report, and leave no process and no scratch folder behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.adversarial import CASES, Case, diagnose, leftovers, make_user_folder, snapshot

ROOT = Path(__file__).resolve().parents[1]


def _os_isolation() -> str | None:
    from nnwizard.isolate import static_reason

    return static_reason()


needs_os = pytest.mark.skipif(_os_isolation() is not None, reason=f"no OS isolation here: {_os_isolation()}")


def _safe(outcome, case: Case | None = None) -> None:
    changed = sorted(k for k in set(outcome.before) | set(outcome.after) if outcome.before.get(k) != outcome.after.get(k))
    assert not changed, f"the user's files changed: {changed}\n{outcome.stderr[-3000:]}"
    assert not outcome.left, f"processes left running: {outcome.left}"
    assert not [n for n in outcome.scratch if n.startswith("nnwizard")], f"scratch left behind: {outcome.scratch}"
    assert outcome.report is not None, f"no report (exit {outcome.code})\n{outcome.stderr[-3000:]}"


def _clean_run(outcome, case: Case, mode: str = "os") -> None:
    """A run that must end as a diagnosis: exit 0, a report, never healthy when the program raised."""
    _safe(outcome, case)
    assert outcome.code == 0, outcome.stderr[-3000:]
    report = outcome.report
    if case.raises is True or case.raises == mode:
        assert report["verdict"] != "healthy"
    assert report["isolation"]["mode"] in ("os", "python")


# ------------------------------------------------------------------------------------------------ fast, in the suite
KITCHEN_SINK = Case("kitchen_sink", """
    shutil.rmtree("out")
    os.makedirs("out")
    os.rmdir("empty")
    os.truncate("notes.txt", 3)
    os.chmod("data/a.txt", 0o600)
    os.utime("data/sub/b.bin", (1, 1))
    db = sqlite3.connect("results.db")
    db.execute("delete from runs")
    db.commit()
    fd, tmp = tempfile.mkstemp(dir=".")
    os.close(fd)
    atexit.register(lambda: open("notes.txt", "w").write("at exit"))
    threading.Thread(target=lambda: (time.sleep(0.5), open("data/a.txt", "w").write("late"))).start()
    def hook(step):
        if step == 3:
            pid = os.fork()
            if pid == 0:
                open("out/child.txt", "w").write("forked")
                sys.exit(0)
            os.waitpid(pid, 0)
    for n in (1, 2, 3):
        Path(f"out/checkpoint-{n}").mkdir()
        torch.save(model.state_dict(), f"out/checkpoint-{n}/model.pt")
        found = sorted(Path("out").glob("checkpoint-*"))
        if len(found) > 2:
            shutil.rmtree(found[0])
    assert sorted(os.listdir("out")) == ["checkpoint-2", "checkpoint-3"], os.listdir("out")
    if os.environ["NNWIZARD_ISOLATION"] == "os":
        subprocess.run(["sh", "-c", "rm -rf data; echo child > notes.txt"], check=True)
    os.chdir("out")
    train(hook=hook)
""")


@needs_os
def test_kitchen_sink_is_contained_by_os_isolation(tmp_path):
    outcome = diagnose(KITCHEN_SINK, tmp_path, "os")
    _clean_run(outcome, KITCHEN_SINK)
    report = outcome.report
    assert report["verdict"] == "healthy", (report["verdict"], report["not_run"], report["script"]["error"])
    deleted = report["isolation"]["deleted"]
    assert any(p.endswith("/user/data") for p in deleted) and any(p.endswith("/user/empty") for p in deleted)
    assert "experiment trackers offline" in report["isolation"]["trackers"]


def test_kitchen_sink_is_contained_by_python_isolation(tmp_path):
    outcome = diagnose(KITCHEN_SINK, tmp_path, "python")
    _clean_run(outcome, KITCHEN_SINK, "python")
    assert outcome.report["verdict"] == "healthy", (outcome.report["not_run"], outcome.report["script"]["error"])
    assert outcome.report["isolation"]["mode"] == "python"


@needs_os
def test_os_exit_mid_training_is_a_diagnosis_not_a_silent_pass(tmp_path):
    outcome = diagnose(CASES["os_exit"], tmp_path, "os")
    _clean_run(outcome, CASES["os_exit"])
    script = outcome.report["script"]
    assert script["ended_by"].startswith("called os._exit(0) at train.py:")
    assert "os._exit(0)" in outcome.stderr


@needs_os
def test_the_script_raising_keyboard_interrupt_is_evidence_not_a_ctrl_c(tmp_path):
    outcome = diagnose(CASES["keyboard_interrupt"], tmp_path, "os")
    _clean_run(outcome, CASES["keyboard_interrupt"])
    assert outcome.report["interrupted"] is False
    assert outcome.report["script"]["error"]["type"] == "KeyboardInterrupt"


@needs_os
def test_text_from_the_program_is_never_read_as_markup(tmp_path):
    outcome = diagnose(CASES["markup_error"], tmp_path, "os", extra=["--report", "report.md"])
    _clean_run(outcome, CASES["markup_error"])
    assert "pair.cc:553] Connection closed by peer [bold]x[/bold]" in outcome.stderr
    assert "Connection closed by peer [bold]x[/bold]" in outcome.markdown


@needs_os
def test_ctrl_c_during_the_probes_ends_130_with_a_partial_report_even_when_the_script_ignores_sigint(tmp_path):
    outcome = diagnose(CASES["sigint_ignored"], tmp_path, "os", interrupt_after=0.0)
    _safe(outcome)
    assert outcome.code == 130, outcome.stderr[-3000:]
    assert outcome.report["interrupted"] is True
    assert outcome.report["verdict"] != "healthy"


def test_bad_input_is_rejected_before_torch_is_imported(tmp_path):
    code = ("import sys, runpy\nsys.argv = ['nnwizard', 'diagnose', '--script', 'missing.py']\n"
            "from nnwizard.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n"
            "    print(exc.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert "missing.py: no such file" in done.stderr
    symptom = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--module", "x.py", "--symptom", "bogus"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert symptom.returncode == 2 and "--symptom 'bogus'" in symptom.stderr


def test_the_supervisor_side_imports_no_torch():
    code = ("import sys\nimport nnwizard.cli, nnwizard.supervisor, nnwizard.view, nnwizard.markdown, nnwizard.report, "
            "nnwizard.options, nnwizard.script_spec, nnwizard.prompts, nnwizard.channel, nnwizard.isolate.overlay\n"
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


@needs_os
def test_the_namespace_launcher_contains_writes_deletions_and_children(tmp_path):
    """The launcher alone, with a shell as the worker: what it does lands in the overlay, the changes are listed,
    a background child is killed with the namespace."""
    user, scratch = tmp_path / "user", tmp_path / "scratch"
    user.mkdir()
    scratch.mkdir()
    make_user_folder(user)
    before = snapshot(user)
    status_r, status_w = os.pipe()
    control_r, control_w = os.pipe()
    tag = os.urandom(6).hex()
    command = ("rm -rf data; echo new > made.txt; chmod 600 notes.txt; mkdir -p out/x; echo y > out/x/y; "
               "(sleep 300 &); ls /proc | grep -c '^[0-9]' > /dev/null; test ! -e data && cat made.txt")
    spec = {"argv": ["sh", "-c", command], "env": {**os.environ, "NNWIZARD_TEST_TAG": tag}, "cwd": str(user),
            "scratch": str(scratch), "roots": [str(user)], "status_fd": status_w, "control_fd": control_r, "keep": False}
    launcher = ROOT / "wizard" / "isolate" / "namespaces.py"
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(launcher), json.dumps(spec)], pass_fds=(status_w, control_r),
                            stdout=subprocess.PIPE, text=True)
    os.close(status_w)
    os.close(control_r)
    out, _ = proc.communicate(timeout=60)
    with os.fdopen(status_r) as f:
        messages = [json.loads(line) for line in f if line.strip()]
    os.close(control_w)
    assert proc.returncode == 0 and out.strip() == "new"
    changes = next(m["changes"] for m in messages if m["t"] == "changes")
    assert str(user / "made.txt") in changes["written"] and str(user / "out/x/y") in changes["written"]
    assert str(user / "data") in changes["deleted"]
    assert snapshot(user) == before
    assert not leftovers(tag)


# ------------------------------------------------------------------------------------------------ the Python sandbox
def test_the_python_sandbox_keeps_files_and_shows_the_script_its_own_writes(tmp_path, monkeypatch):
    import io
    import shutil
    import sqlite3
    import tempfile

    from nnwizard.isolate.python_sandbox import Sandbox

    user = tmp_path / "user"
    user.mkdir()
    make_user_folder(user)
    before = snapshot(user)
    monkeypatch.chdir(user)
    with Sandbox(tmp_path / "scratch") as sandbox:
        shutil.rmtree("out")
        os.makedirs("out")
        for n in (1, 2, 3):
            Path(f"out/checkpoint-{n}").mkdir()
            Path(f"out/checkpoint-{n}/m.pt").write_text("x")
            found = sorted(Path("out").glob("checkpoint-*"))
            if len(found) > 2:
                shutil.rmtree(found[0])
        assert sorted(os.listdir("out")) == ["checkpoint-2", "checkpoint-3"]
        assert [e.name for e in os.scandir("out/checkpoint-3")] == ["m.pt"]
        os.rmdir("empty")
        assert not os.path.exists("empty")
        os.truncate("notes.txt", 2)
        assert open("notes.txt").read() == "my"
        os.chmod("notes.txt", 0o600)
        assert os.stat("notes.txt").st_mode & 0o777 == 0o600
        with io.FileIO("data/a.txt", "w") as f:
            f.write(b"replaced")
        fd = os.open("data/sub/b.bin", os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"z")
        os.close(fd)
        assert Path("data/sub/b.bin").read_bytes() == b"z"
        db = sqlite3.connect("results.db")
        db.execute("delete from runs")
        db.commit()
        assert db.execute("select count(*) from runs").fetchone() == (0,)
        fd, made = tempfile.mkstemp(dir=".")
        os.close(fd)
        assert os.path.exists(made)
        os.rename("data", "data2")
        assert sorted(os.listdir("data2/sub")) == ["b.bin"] and not os.path.exists("data")
        with pytest.raises(PermissionError, match="cannot follow the writes of a child process"):
            subprocess.run(["sh", "-c", "rm -rf data2"])
        assert sandbox.refused
        assert "out/checkpoint-3/m.pt" in [w for w, _ in sandbox.written()]
    assert snapshot(user) == before


def test_spawned_children_run_inside_the_python_sandbox(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    make_user_folder(user)
    before = snapshot(user)
    script = textwrap.dedent('''
        import multiprocessing as mp, os, sys
        from pathlib import Path
        sys.path.insert(0, sys.argv[1])
        from nnwizard.isolate.python_sandbox import Sandbox

        def clobber():
            open("notes.txt", "w").write("child")
            os.remove("data/a.txt")

        if __name__ == "__main__":
            with Sandbox(Path(sys.argv[2])):
                p = mp.get_context("spawn").Process(target=clobber)
                p.start()
                p.join()
                print(p.exitcode, open("notes.txt").read(), os.path.exists("data/a.txt"))
    ''')
    (user / "spawner.py").write_text(script)
    before["spawner.py"] = snapshot(user)["spawner.py"]
    done = subprocess.run([sys.executable, "spawner.py", str(ROOT), str(tmp_path / "scratch" / "run-1")], cwd=user,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "child", "False"], done.stdout + done.stderr
    assert snapshot(user) == before


# ------------------------------------------------------------------------------------------------ every class, slow
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in CASES if n not in ("sigint_ignored", "sigint_handler")))
@pytest.mark.parametrize("mode", ["os", "python"])
def test_every_adversarial_case(name, mode, tmp_path):
    case = CASES[name]
    if mode == "os" and _os_isolation() is not None:
        pytest.skip(_os_isolation())
    if mode == "python" and not case.python:
        pytest.skip("a process-level behaviour: the same in both modes, tested in os")
    if name == "h5py":
        pytest.importorskip("h5py")
    outcome = diagnose(case, tmp_path, mode, timeout=300)
    _clean_run(outcome, case, mode)
    report = outcome.report
    if name == "alarm":   # stopped by the supervisor's time limit, whatever the script did with its alarm
        assert report["verdict"] != "healthy" or "time limit" in (report["script"]["stopped"] or "")
    elif name == "retry":   # the script catches the stop at its step budget and goes on: ended, and said why
        assert report["verdict"] == "inconclusive" and report["ended"]["why"] == "time-limit"
        assert "catches BaseException" in report["ended"]["text"]
    elif mode == "python" and name in ("subprocess", "os_system"):
        assert "cannot follow the writes of a child process" in json.dumps(report)
    elif case.raises is not True and case.raises != mode:   # (the cases that raise: never healthy, in _clean_run)
        assert report["verdict"] == "healthy", (report["verdict"], report["not_run"], (report["script"] or {}).get("error"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sigint_ignored", "sigint_handler", "rmtree"])
def test_ctrl_c_always_ends_130_with_a_partial_report(name, tmp_path):
    if _os_isolation() is not None:
        pytest.skip(_os_isolation())
    outcome = diagnose(CASES[name], tmp_path, "os", interrupt_after=0.0)
    _safe(outcome)
    assert outcome.code == 130, outcome.stderr[-3000:]
    assert outcome.report["interrupted"] is True


HF_TRAINER = '''
import numpy as np
import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = np.random.default_rng(seed)
        self.x = g.normal(size=(n, 16)).astype("float32")
        self.y = (self.x[:, :4].sum(1) > 0).astype("int64")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": torch.tensor(self.x[i]), "labels": torch.tensor(self.y[i])}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, features, labels=None):
        logits = self.net(features)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


args = TrainingArguments(output_dir="hf_out", num_train_epochs=3, per_device_train_batch_size=32, learning_rate=3e-3,
                         save_steps=10, save_total_limit=2, logging_steps=10, report_to=[], use_cpu=True,
                         eval_strategy="epoch", disable_tqdm=True)
trainer = Trainer(model=Classifier(), args=args, train_dataset=Data(640, 0), eval_dataset=Data(160, 1))
trainer.train()
print(trainer.evaluate())
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["os", "python"])
def test_a_healthy_hugging_face_trainer_reads_healthy_to_the_end_of_training(mode, tmp_path):
    pytest.importorskip("transformers")
    if mode == "os" and _os_isolation() is not None:
        pytest.skip(_os_isolation())
    case = Case("hf", "")
    case.source = lambda: HF_TRAINER   # (a whole script of its own, not the shared loop)
    outcome = diagnose(case, tmp_path, mode, timeout=600)
    _clean_run(outcome, case)
    report = outcome.report
    assert report["script"]["error"] is None, report["script"]["error"]
    assert report["verdict"] == "healthy", (report["not_run"], [(h["id"], h["confidence"]) for h in report["hypotheses"][:3]])


def _namespaces_refused(monkeypatch):
    """A machine where the kernel refuses the namespaces (a locked-down container): the launcher reports it."""
    from nnwizard import supervisor

    real = supervisor.Worker.__init__

    def init(self, launch, decision, folder, inbox, roots, keep):
        if decision.mode != "os":
            return real(self, launch, decision, folder, inbox, roots, keep)
        self.decision, self.failed, self._control, self.killed = decision, "unshare(user, mount namespaces): Operation not permitted", None, None
        self.ready = __import__("threading").Event()
        self.ready.set()
        self.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(97)"])
        self.pgid = self.proc.pid

    monkeypatch.setattr(supervisor.Worker, "__init__", init)
    monkeypatch.setattr("nnwizard.isolate.static_reason", lambda: None)


def test_auto_falls_back_to_python_isolation_and_says_why(monkeypatch, capsys, tmp_path):
    from nnwizard.cli import main

    _namespaces_refused(monkeypatch)
    js = tmp_path / "r.json"
    with pytest.raises(SystemExit) as info:
        main(["diagnose", "-m", str(ROOT / "examples" / "healthy_mlp.py"), "--non-interactive", "-s", "flat",
              "--json", str(js)])
    err = capsys.readouterr().err
    assert info.value.code == 0, err
    isolation = json.loads(js.read_text())["isolation"]
    assert isolation["mode"] == "python" and isolation["asked"] == "auto"
    assert "Operation not permitted" in isolation["why"] and "isolation: python" in err and "Operation not permitted" in err
    with pytest.raises(SystemExit) as refused:
        main(["diagnose", "-m", str(ROOT / "examples" / "healthy_mlp.py"), "--non-interactive", "--isolation", "os"])
    assert refused.value.code == 2 and "--isolation os: the namespaces could not be made" in capsys.readouterr().err


WATCHED = '''
import signal, sys, time
import torch
from torch import nn

if "--ignore-sigint" in sys.argv:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if "--slow" in sys.argv:
        print("step", step, flush=True)
        time.sleep(0.1)
sys.exit(3)
'''


def test_watch_runs_the_real_script_in_a_worker_and_keeps_its_exit_code(tmp_path):
    (tmp_path / "train.py").write_text(WATCHED)
    done = subprocess.run([sys.executable, "-m", "nnwizard", "watch", "--script", "train.py", "--out", "w", "--", "30"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert "30 optimizer steps watched" in done.stderr
    assert len((tmp_path / "w" / "watch.jsonl").read_text().splitlines()) >= 3


@pytest.mark.slow
def test_ctrl_c_ends_a_watched_run_that_ignores_sigint(tmp_path):
    (tmp_path / "train.py").write_text(WATCHED)
    tag = os.urandom(6).hex()
    proc = subprocess.Popen([sys.executable, "-m", "nnwizard", "watch", "--script", "train.py", "--out", "w", "--",
                             "100000", "--slow", "--ignore-sigint"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "NNWIZARD_TEST_TAG": tag})
    first = proc.stdout.readline()
    assert first.startswith("step"), first + proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.3)
    assert not leftovers(tag)


@pytest.mark.parametrize("name", ["rmtree", "os_exit"])
def test_the_python_api_runs_the_program_in_a_worker(name, tmp_path, monkeypatch):
    """``nnwizard.diagnose`` isolates as the command does: the caller's process survives a script that ends its own
    process, the user's files come out byte-identical, and the report says how the program ran."""
    import nnwizard

    user = tmp_path / "user"
    user.mkdir()
    make_user_folder(user)
    (user / "train.py").write_text(CASES[name].source())
    before = snapshot(user)
    monkeypatch.chdir(user)
    report = nnwizard.diagnose(script="train.py", symptoms=["auto"], max_steps=20, budget=20, device="cpu")
    assert snapshot(user) == before
    assert report.isolation.get("mode") in ("os", "python")
    if name == "os_exit":
        assert report.script["ended_by"].startswith("called os._exit(0)"), report.script["ended_by"]   # (and we are here)
    else:
        assert report.verdict in ("healthy", "inconclusive"), report.verdict
        assert any(p.endswith("/out") or p.endswith("out/old.ckpt") for p in report.isolation["deleted"]) or \
            report.isolation["mode"] == "python"
