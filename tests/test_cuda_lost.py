"""A sticky CUDA error (device-side assert, illegal memory access) ends the session and the CLI runs the
diagnosis again on the CPU, where the same code raises a readable error. On a machine without CUDA
the sticky error is simulated: the module raises CUDA's own message unless it runs in the re-run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from nnwizard import cuda_lost

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# labels 1..4 for 4 outputs: on CUDA, cross_entropy's kernel asserts; on the CPU it says "Target 4 is out of bounds"
MODULE = textwrap.dedent('''
    import os

    import torch
    from torch import nn
    from torch.nn import functional as F

    from examples.datasets import blobs, split


    def build_model():
        return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


    def build_data():
        x, y = blobs()
        return split(x, y + 1)


    def loss_fn(out, y):
        if not os.environ.get("NNWIZARD_CUDA_LOST"):   # what CUDA says: the kernel asserted, no op or value named
            os.environ["FAKE_CUDA_DEAD"] = "1"          # and from now on every CUDA call would raise the same
            raise RuntimeError("CUDA error: device-side assert triggered\\nCUDA kernel errors might be asynchronously "
                               "reported at some other API call, so the stacktrace below might be incorrect.")
        return F.cross_entropy(out, y)
''')


# the CLI, whose workers' synchronize answers as a dead context does once the user's code has "asserted" (set
# FAKE_CUDA_DEAD in that worker); the re-run on the CPU is a fresh worker (CUDA hidden), where it is not set
_WORKER_PATCH = ("import os\nfrom nnwizard import cuda_lost\n"
                 "cuda_lost._context_error = lambda: (RuntimeError('CUDA error: device-side assert triggered')\n"
                 "                                    if os.environ.get('FAKE_CUDA_DEAD') else None)\n"
                 "import sys\nfrom nnwizard.worker import main\nmain(sys.argv[1:])\n")
FAKE_DEAD_CONTEXT = ("import json, sys\nfrom nnwizard import supervisor\n"
                     f"supervisor.Launch.argv = lambda self: [sys.executable, '-c', {_WORKER_PATCH!r}, json.dumps(self.job)]\n"
                     "from nnwizard.cli import main\nmain(sys.argv[1:])\n")


def test_sticky_errors_are_told_from_others():
    assert cuda_lost.sticky(RuntimeError("CUDA error: device-side assert triggered"))
    assert cuda_lost.sticky("torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
    assert not cuda_lost.sticky(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not cuda_lost.sticky(RuntimeError("Target 4 is out of bounds."))


def test_check_raises_once_the_context_answers_a_sticky_error_and_names_where(monkeypatch):
    answer = [None]
    monkeypatch.setattr(cuda_lost, "_context_error", lambda: answer[0])
    try:
        cuda_lost.check("in probe a")   # a healthy context: no raise
        answer[0] = RuntimeError("CUDA error: out of memory")   # not sticky: the context still works
        cuda_lost.check("in probe a2")
        answer[0] = RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be ...")
        with pytest.raises(cuda_lost.CudaContextLost) as info:
            cuda_lost.check("in probe b")
        assert info.value.where == "in probe b" and info.value.error == "RuntimeError: CUDA error: device-side assert triggered"
        answer[0] = None
        with pytest.raises(cuda_lost.CudaContextLost) as again:   # every later probe: the context stays dead
            cuda_lost.check("in probe c")
        assert again.value.where == "in probe b"
    finally:
        cuda_lost._seen.clear()


def test_cli_args_ask_for_the_same_diagnosis_on_the_cpu():
    from nnwizard.session import Options

    opts = Options(script="train.py", script_args=["--lr", "0.1"], symptoms=["nan"], device="cuda", seed=3,
                   json_path="r.json", fail_on=0.8, max_steps=20, quiet=True)
    assert cuda_lost.cli_args(opts) == ["--script", "train.py", "--device", "cpu", "--seed", "3", "--symptom", "nan",
                                        "--json", "r.json", "--fail-on", "0.8", "--max-steps", "20",
                                        "--non-interactive", "--quiet", "--", "--lr", "0.1"]


def test_a_device_side_assert_is_diagnosed_again_on_the_cpu_with_its_real_cause(tmp_path):
    (tmp_path / "labels.py").write_text(MODULE)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = subprocess.run([sys.executable, "-c", FAKE_DEAD_CONTEXT, "diagnose", "-m", str(tmp_path / "labels.py"), "-s", "crash",
                           "--non-interactive", "--json", str(out), "--report", str(md)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "running the diagnosis again on the CPU" in done.stderr
    report = json.loads(out.read_text())
    assert report["hypotheses"][0]["id"] == "labels-out-of-range" and report["hypotheses"][0]["confidence"] >= 0.5
    assert report["device"] == "cpu" and "device-side assert" in report["environment"]["cuda_lost"]
    assert "re-run on the CPU" in md.read_text()
    assert "internal error" not in done.stderr


SCRIPT = textwrap.dedent('''
    import os

    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(0)
    X = torch.randn(256, 8)
    Y = (X[:, 0] > 0).long() + 1                     # labels 1..2 for 2 outputs
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for i in range(0, 256, 32):
            opt.zero_grad()
            out = model(X[i:i + 32])
            if not os.environ.get("NNWIZARD_CUDA_LOST"):
                os.environ["FAKE_CUDA_DEAD"] = "1"
                raise RuntimeError("CUDA error: device-side assert triggered")
            loss = F.cross_entropy(out, Y[i:i + 32])
            loss.backward()
            opt.step()
''')


def test_a_script_that_kills_the_cuda_context_is_diagnosed_again_on_the_cpu(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-c", FAKE_DEAD_CONTEXT, "diagnose", "--script", "train.py", "-s", "crash",
                           "--non-interactive", "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "script" and "device-side assert" in report["environment"]["cuda_lost"]
    assert report["hypotheses"][0]["id"] == "labels-out-of-range", [h["id"] for h in report["hypotheses"]]


def test_the_re_run_gets_the_symptoms_and_answers_the_user_already_gave(monkeypatch, tmp_path):
    from nnwizard.catalog import load_catalog
    from nnwizard.engine import Engine
    from nnwizard.prompts import ScriptedPrompter, load_answers
    from nnwizard.session import Options
    from nnwizard.tree import load_trees
    from tests.conftest import load_example

    monkeypatch.setattr(cuda_lost, "_context_error", lambda: RuntimeError("CUDA error: device-side assert triggered"))
    trees = load_trees(None)
    engine = Engine(load_example("healthy_mlp"), trees, load_catalog(), ScriptedPrompter({}))
    try:
        with pytest.raises(cuda_lost.CudaContextLost) as info:
            engine.run(["flat"], {"some-question": "yes"})
    finally:
        cuda_lost._seen.clear()
    lost = info.value
    assert lost.symptoms == ["flat"] and lost.answers == {"some-question": "yes"}
    opts = Options(module="m.py", interactive=True)
    args = cuda_lost.cli_args(opts, lost.symptoms, str(tmp_path / "a.yaml"))
    assert args[args.index("--symptom") + 1] == "flat" and "--answers" in args and "--non-interactive" not in args


@pytest.mark.parametrize("probe_id,where", [("trace-run", "in probe trace-run"),
                                             ("step-cost", "while nnwizard timed one plain training step")])
def test_where_a_dead_context_was_seen_names_a_probe_or_what_the_session_did(monkeypatch, probe_id, where):
    from nnwizard.isolation import run_probe
    from nnwizard.probes.api import ProbeContext, ProbeResult, ProbeSpec, load_all

    load_all()
    monkeypatch.setattr(cuda_lost, "_context_error", lambda: RuntimeError("CUDA error: device-side assert triggered"))
    spec = ProbeSpec(probe_id, lambda ctx: ProbeResult("passed", "ok", "", {}),
                     "timed one plain training step", {"ok": ""}, 10.0, __name__)
    try:
        with pytest.raises(cuda_lost.CudaContextLost) as info:
            run_probe(spec, ProbeContext(None), 10.0)
        assert info.value.where == where
    finally:
        cuda_lost._seen.clear()
