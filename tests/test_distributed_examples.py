"""Distributed training end to end (slow: each test starts the real CLI and two gloo ranks): every script of
examples/distributed/ gives its expected hypothesis top-1 (its healthy twins read healthy) under
``--nproc 2`` and under the user's own ``torchrun --standalone --nproc_per_node=2 -m nnwizard``; a hang ends as
collective-mismatch with each rank's stack; Ctrl-C, a rank that raises, init_process_group twice, a script
that is not distributed, watch with one log per rank and a DDP bundle replayed in one process; nccl on GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from examples._distributed import DISTRIBUTED, diagnose_distributed, distributed_examples, findings

pytestmark = pytest.mark.slow
EXAMPLES = distributed_examples()


def _check(example, report: dict) -> None:
    found = findings(report)
    if example.healthy:
        assert report["verdict"] == "healthy", (found, report["not_run"])
    else:
        assert found and found[0] in example.expected, f"expected {example.expected}, ranked {found}"
    assert report["distributed"]["world_size"] == 2


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_example_under_nproc_2(example, tmp_path):
    report, error, _, _ = diagnose_distributed(example.path, tmp_path, "nproc")
    assert error is None, error
    _check(example, report)
    assert report["distributed"]["launcher"] == "nnwizard --nproc"
    assert not list(tmp_path.glob("*.pt")), "the script's files went to the user's folder"


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_example_under_the_user_s_own_torchrun(example, tmp_path):
    report, error, _, _ = diagnose_distributed(example.path, tmp_path, "torchrun")
    assert error is None, error
    _check(example, report)
    assert report["distributed"]["launcher"] == "torchrun"
    assert len(list(tmp_path.glob("report-*.json"))) == 1   # rank 0 alone wrote it


HANG = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(30):
    x = torch.randn(16, 8); y = (x[:, 0] > 0).long()
    opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
    if step == 5 and rank == 1:
        dist.barrier()     # only rank 1 waits here: rank 0 waits in the next backward's all-reduce
'''


@pytest.mark.parametrize("how", ["nproc", "torchrun"])
def test_a_hang_ends_as_collective_mismatch_with_each_rank_s_stack(how, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    report, error, seconds, _ = diagnose_distributed(script, tmp_path, how, timeout_s=300)
    assert error is None, error
    assert findings(report)[0] == "collective-mismatch"
    probe = next(p for p in report["probes"] if p["id"] == "dist-collectives")
    assert probe["outcome"] == "hang" and "hang.py:12" in probe["summary"]
    stacks = [r["stack"] for r in report["distributed"]["ranks"]]
    assert all(stacks) and "hang.py" in stacks[1]
    assert not _ranks_left()


def _ranks_left() -> list[str]:
    done = subprocess.run(["pgrep", "-f", "nnwizard.distributed.rank"], capture_output=True, text=True)
    return done.stdout.split()


def test_ctrl_c_stops_every_rank_and_writes_a_partial_report(tmp_path):
    out = tmp_path / "partial.json"
    proc = subprocess.Popen([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(DISTRIBUTED / "healthy_ddp_classifier.py"),
                             "--nproc", "2", "--non-interactive", "--device", "cpu", "--json", str(out), "-q"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _ranks_left():
        time.sleep(0.2)
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    report = json.loads(out.read_text())
    assert report["interrupted"] and report["verdict"] == "inconclusive"
    time.sleep(1)
    assert not _ranks_left()


RAISES = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    x = torch.randn(16, 8); y = (x[:, 0] > 0).long()
    if rank == 1 and step == 7:
        y = y.float()      # a bug on one rank only
    opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
'''

TWICE = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(16, 8); y = (x[:, 0] > 0).long()
    opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
dist.init_process_group("gloo")
'''


@pytest.mark.parametrize("source, said", [(RAISES, "rank 1 raised RuntimeError at script.py:12"),
                                          (TWICE, "init_process_group was called 2 times")], ids=["one-rank-raises", "init-twice"])
def test_a_rank_that_raises_ends_every_rank_and_is_never_healthy(source, said, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(source)
    report, error, _, _ = diagnose_distributed(script, tmp_path, "nproc", timeout_s=300)
    assert error is None, error
    assert report["verdict"] != "healthy"
    assert said in next(p for p in report["probes"] if p["id"] == "dist-run")["summary"]
    assert not _ranks_left()


def test_a_script_that_is_not_distributed_is_said_to_be_one_and_diagnosed_as_one_process(tmp_path):
    script = Path(__file__).resolve().parents[1] / "examples" / "scripts" / "broken_mnist_style_missing_zero_grad.py"
    report, error, _, _ = diagnose_distributed(script, tmp_path, "nproc")
    assert error is None, error
    assert "not distributed" in json.dumps(report["distributed"]) or "diagnosed as one process" in report["distributed"]["note"]
    assert findings(report)[0] == "missing-zero-grad"


def test_one_rank_beside_the_one_process_diagnosis(tmp_path):
    """--nproc 1 on a machine with a core to spare: the one-process diagnosis runs beside the rank (Pending) and
    waits for it after its observed run. A sampler that replays its order is seen on one rank too; the audits
    that compare ranks have nothing to compare."""
    example = next(e for e in EXAMPLES if e.name == "broken_sampler_epoch_not_set")
    report, error, _, _ = diagnose_distributed(example.path, tmp_path, "nproc", nproc=1)
    assert error is None, error
    assert report["distributed"]["world_size"] == 1 and findings(report)[0] == "sampler-epoch-not-set"
    assert next(p for p in report["probes"] if p["id"] == "dist-replicas")["status"] == "skipped"


WATCH = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(256, 8); labels = (data[:, 0] > 0).long()
for step in range(80):
    i = step % 16
    if step == 50:
        for g in opt.param_groups: g["lr"] = 1e4
    opt.zero_grad(); F.cross_entropy(model(data[i * 16:(i + 1) * 16]), labels[i * 16:(i + 1) * 16]).backward(); opt.step()
'''


@pytest.mark.parametrize("how", ["nproc", "torchrun"])
def test_watch_on_two_ranks_writes_one_log_per_rank_and_a_ddp_bundle_replays_in_one_process(how, tmp_path):
    script = tmp_path / "watched.py"
    script.write_text(WATCH)
    watch = ["-m", "nnwizard", "watch", "--script", str(script), "--out", "w"]
    cmd = ([sys.executable, *watch, "--nproc", "2"] if how == "nproc" else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *watch])
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        rows = [json.loads(line) for line in (tmp_path / "w" / f"watch.rank{rank}.jsonl").read_text().splitlines()]
        assert rows and all(r["rank"] == rank for r in rows)
    bundles = sorted((tmp_path / "w" / "rank0").glob("anomaly-step*"))
    assert bundles
    replay = subprocess.run([sys.executable, "-m", "nnwizard", "replay", str(bundles[0]), "--json", "r.json", "-q"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["mode"] == "replay"


# ------------------------------------------------------------------------------------------- GPUs
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["healthy_ddp_classifier", "broken_sampler_epoch_not_set", "healthy_fsdp2_classifier"])
def test_nccl_ranks_on_the_gpus(name, tmp_path):
    example = next(e for e in EXAMPLES if e.name == name)
    nproc = min(2, torch.cuda.device_count())
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(example.path), "--nproc",
                           str(nproc), "--non-interactive", "--device", "cuda", "--json", str(out), "-q"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=400, env={**os.environ})
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["distributed"]["backend"] == "nccl"
    if nproc == 2:
        _check(example, report)
    else:   # one GPU: one nccl rank, nothing to compare across ranks, and nothing broken in the one-process loop
        assert report["verdict"] in ("healthy", "inconclusive") or example.name.startswith("broken")
