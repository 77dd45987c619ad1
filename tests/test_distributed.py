"""Distributed training (CONTRACT §8), the default suite: the cross-rank probes on the digests two ranks would
send (each fires on its fault and stays quiet on the healthy twin), the step agreement and the watchdog over a
real TCPStore, what one rank records of a real DDP / FSDP2 run (as one process: RANK=0, WORLD_SIZE=1), DDP's
unused-parameter error, bundles of a DDP model, escaped gloo text, and one real launch of two gloo ranks.
The examples end to end (``--nproc 2`` and the user's own torchrun) are in test_distributed_examples.py (slow)."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nnwizard.distributed.merged import DistributedRun

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "examples" / "distributed"


# ------------------------------------------------------------------------------------------- helpers
def digest(rank: int, **over) -> dict:
    """A digest as a rank of a healthy 2-rank DDP run sends it (the fields the probes read); ``over`` replaces some."""
    base = {
        "rank": rank, "world": 2, "pid": 100 + rank, "seconds": 5.0, "exit": "stopped", "total_steps": 40,
        "init": {"calls": [{"where": "train.py:10 in main", "backend": "gloo"}], "backend": "gloo", "world": 2},
        "samplers": [{"index": 0, "where": "train.py:20 in main", "shuffle": True, "seed": 0, "replicas": 2, "rank": rank,
                      "drop_last": False, "dataset": {"type": "TensorDataset", "len": 1000}, "len": 500, "set_epoch": [],
                      "iters": [{"epoch": e, "hash": f"h{e}{rank}", "head": [e, rank], "n": 500, "step": 20 * e}
                                for e in range(2)]}],
        "loaders": [{"index": 0, "where": "train.py:21 in main", "dataset": {"type": "TensorDataset", "len": 1000,
                                                                         "tensors": [[[1000, 4], 1.0, 2.0]]},
                     "batch_size": 25, "sampler": "DistributedSampler", "sampler_len": 500, "distributed_sampler": 0,
                     "iterations": 2, "trained": [True, True],
                     "passes": [{"sampler": "DistributedSampler", "len": 500, "indices": list(range(rank, 1000, 2))[:100],
                                 "step": 0}]}],
        "inputs": [[s, [[25, 4], float(s + 10 * rank), 1.0]] for s in range(10)],
        "params": [{"step": s, "opt": 0, "fp": [[[4, 4], 0.5 + s, 3.0], [[4], 0.1, 0.2]]} for s in (0, 1, 2, 5)],
        "param_names": {"0": ["fc.weight", "fc.bias"]},
        "steps": [[s, 1.0 - 0.01 * s - 0.001 * rank, [0.1], s * 0.1, 0] for s in range(1, 41)],
        "bn_layers": [], "bn": [], "collectives": [
            {"seq": 0, "name": "all_reduce", "where": "train.py:40 in evaluate", "step": 20, "op": "SUM"}],
        "collective_count": 1, "ddp": [{"where": "train.py:25 in main", "model": "Net", "find_unused_parameters": False,
                                        "broadcast_buffers": True, "params": ["fc.weight", "fc.bias", "aux.weight"],
                                        "forwards": 40}],
        "fsdp": [], "writes": [], "prints": [], "eval_calls": [], "busy": None, "events": 100, "rng": {},
    }
    base.update(over)
    return base


def run_of(*digests: dict, **kw) -> DistributedRun:
    return DistributedRun(len(digests), "nnwizard --nproc", {d["rank"]: d for d in digests}, **kw)


def probe(probe_id: str, run: DistributedRun):
    from nnwizard.isolation import run_probe
    from nnwizard.probes import ProbeContext, get

    return run_probe(get(probe_id), ProbeContext(SimpleNamespace(distributed=run, device=torch.device("cpu")), {}, {}, 0))


# --------------------------------------------------------------------------------------- the probes
def test_a_healthy_pair_of_digests_passes_every_cross_rank_probe():
    run = run_of(digest(0), digest(1))
    from nnwizard.probes.distributed import CROSS_RANK_PROBES

    for pid in CROSS_RANK_PROBES:
        result = probe(pid, run)
        assert result.status in ("passed", "skipped"), (pid, result.summary)


def test_sampler_epoch_not_set_fires_on_the_same_order_every_epoch_and_names_the_sampler_line():
    same = [{"epoch": 0, "hash": "h", "head": [3, 9], "n": 500, "step": 20 * e} for e in range(3)]
    bad = [digest(r, samplers=[{**digest(r)["samplers"][0], "iters": same}]) for r in range(2)]
    result = probe("dist-sampler-epoch", run_of(*bad))
    assert result.outcome == "epoch-not-set"
    assert "train.py:20" in result.summary and "set_epoch was never called" in result.summary
    assert "set_epoch(epoch)" in result.data["fix_here"]
    assert probe("dist-sampler-epoch", run_of(digest(0), digest(1))).outcome == "ok"


def test_data_not_sharded_fires_on_identical_batches_and_on_samplers_over_the_whole_data_set():
    same = [digest(r, inputs=[[s, [[25, 4], float(s), 1.0]] for s in range(10)]) for r in range(2)]
    assert probe("dist-sharding", run_of(*same)).outcome == "same-batches"
    whole = []
    for r in range(2):
        d = digest(r)
        loader = {**d["loaders"][0], "sampler": "RandomSampler", "sampler_len": 1000, "distributed_sampler": None,
                  "passes": [{"sampler": "RandomSampler", "len": 1000, "indices": list(range(r, 100 + r)), "step": 0}]}
        whole.append(digest(r, loaders=[loader]))
    result = probe("dist-sharding", run_of(*whole))
    assert result.outcome == "whole-dataset" and result.data["known"] is True
    assert "train.py:21" in result.data["fix_here"]
    assert probe("dist-sharding", run_of(digest(0), digest(1))).outcome == "ok"


def test_a_distributed_sampler_given_the_same_rank_everywhere_is_overlap():
    bad = []
    for r in range(2):
        d = digest(r)
        loader = {**d["loaders"][0], "passes": [{"sampler": "DistributedSampler", "len": 500,
                                                  "indices": list(range(0, 200, 2)), "step": 0}]}
        bad.append(digest(r, loaders=[loader]))
    assert probe("dist-sharding", run_of(*bad)).outcome == "overlap"


def test_metric_not_reduced_matches_the_printed_figure_with_the_rank_s_own_and_the_global_value():
    def ranks(printed: str) -> list[dict]:
        out = []
        for r, correct in ((0, 90), (1, 80)):
            calls = [{"step": 20, "fn": "cross_entropy", "value": 0.3, "reduction": "mean", "correct": correct,
                      "count": 100}]
            prints = [{"text": printed, "where": "train.py:50 in fit", "step": 20}] if r == 0 else []
            out.append(digest(r, eval_calls=calls, prints=prints))
        return out

    local = probe("dist-metric", run_of(*ranks("epoch 0 val_acc=0.9000")))
    assert local.outcome == "not-reduced" and "0.85" in local.summary and "train.py:50" in local.data["fix_here"]
    assert probe("dist-metric", run_of(*ranks("epoch 0 val_acc=0.8500"))).outcome == "ok"
    assert probe("dist-metric", run_of(*ranks("epoch 0 val_acc=1.7000"))).outcome == "summed"
    assert probe("dist-metric", run_of(*ranks("epoch 0 val_acc=85.00%"))).outcome == "ok"


def test_one_batch_loss_printed_by_rank_0_is_a_progress_line_not_a_metric():
    prints = [{"text": f"step {s} loss {1.0 - 0.01 * s:.4f}", "where": "train.py:44 in train", "step": s}
              for s in (10, 20, 30)]
    result = probe("dist-metric", run_of(digest(0, prints=prints), digest(1)))
    assert result.status != "failed", result.summary


def test_rank_write_conflict_fires_when_two_ranks_wrote_one_path():
    write = {"path": "/work/out/checkpoint.pt", "mode": "wb", "where": "train.py:60 in main", "step": 20, "via": "torch.save"}
    result = probe("dist-writes", run_of(digest(0, writes=[write]), digest(1, writes=[write])))
    assert result.outcome == "conflict" and "checkpoint.pt" in result.summary and "get_rank() == 0" in result.data["fix_here"]
    assert probe("dist-writes", run_of(digest(0, writes=[write]), digest(1))).outcome == "ok"


def test_ranks_diverged_names_the_tensors_and_an_idle_ddp_wrapper():
    params = [{"step": s, "opt": 0, "fp": [[[4, 4], 0.5 + s + (0.3 if s else 0), 3.0], [[4], 0.1, 0.2]]} for s in (0, 1, 2)]
    ddp = [{**digest(1)["ddp"][0], "forwards": 0}]
    result = probe("dist-replicas", run_of(digest(0, ddp=ddp), digest(1, params=params, ddp=ddp)))
    assert result.outcome == "diverged" and result.data["step"] == 1
    assert "fc.weight" in result.summary and "never ran a forward" in result.summary
    start = [{"step": s, "opt": 0, "fp": [[[4, 4], 0.9, 3.0], [[4], 0.1, 0.2]]} for s in (0, 1)]
    assert probe("dist-replicas", run_of(digest(0), digest(1, params=start))).outcome == "not-broadcast"
    assert probe("dist-replicas", run_of(digest(0), digest(1))).outcome == "ok"


def test_a_sharded_fsdp_model_has_no_replicas_to_compare():
    sharded = [{"step": s, "opt": 0, "fp": [None, None]} for s in (0, 1)]
    result = probe("dist-replicas", run_of(digest(0, params=sharded), digest(1, params=sharded)))
    assert result.status == "skipped"


def test_ddp_unused_parameters_error_names_the_parameters_from_ddp_s_indices():
    err = {"type": "RuntimeError", "where": "train.py:70 in main", "step": 1,
           "message": "Expected to have finished reduction in the prior iteration before starting a new one.",
           "traceback": "...\nParameter indices which did not receive grad for rank 0: 2\n In addition, ..."}
    result = probe("dist-unused-params", run_of(digest(0, error=err), digest(1, error=err)))
    assert result.outcome == "unused" and result.data["unused"] == ["aux.weight"]
    assert "find_unused_parameters=True" in result.data["fix_here"] and "train.py:25" in result.data["fix_here"]
    assert probe("dist-unused-params", run_of(digest(0), digest(1))).outcome == "ok"
    # the replicas differ because the reducer never ran: not a second finding
    assert probe("dist-replicas", run_of(digest(0, error=err), digest(1, error=err))).status == "skipped"


def test_batchnorm_not_synced_fires_on_few_samples_per_rank_only():
    layers = [{"model": "Net", "layer": "bn1", "class": "BatchNorm2d", "sync": False, "features": 8, "running": True}]

    def ranks(samples: int) -> list[dict]:
        return [digest(r, bn_layers=layers, bn=[{"step": s, "layer": 0, "samples": samples, "per_channel": samples * 64,
                                                 "mean": [0.1 * r, -0.2 * r], "var": [1.0, 1.0]} for s in range(5)])
                for r in range(2)]

    small = probe("dist-batchnorm", run_of(*ranks(4)))
    assert small.outcome == "small-batches" and small.data["tiny"] and "convert_sync_batchnorm" in small.data["fix_here"]
    assert probe("dist-batchnorm", run_of(*ranks(32))).outcome == "ok"
    synced = [{**layers[0], "sync": True}]
    assert probe("dist-batchnorm", run_of(*[digest(r, bn_layers=synced) for r in range(2)])).outcome == "ok"


def test_collective_mismatch_from_the_watchdog_the_backend_and_the_order_of_calls():
    busy0 = {"kind": "collective", "name": "all_reduce", "where": "train.py:33 in validate", "step": 20, "since": 1.0}
    busy1 = {"kind": "backward", "name": "backward (DDP/FSDP reduce the gradients here)", "where": "train.py:60 in main",
             "step": 20, "since": 1.0}
    abort = {"kind": "stalled", "text": "no rank made progress for 10 s", "busy": {}}
    hung = run_of(digest(0, exit="aborted", busy=busy0), digest(1, exit="aborted", busy=busy1), abort=abort)
    result = probe("dist-collectives", hung)
    assert result.outcome == "hang" and "train.py:33" in result.summary and "train.py:33" in result.data["fix_here"]
    logs = {0: ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
                "  what():  [enforce fail at /x/gloo/transport/tcp/pair.cc:456] Received data size doesn't match expected "
                "size. Is there a distributed collective mismatch in your code?"]}
    died = run_of(digest(0, exit="died", busy=busy0), digest(1), logs=logs, exit_codes={0: -6})
    assert probe("dist-collectives", died).outcome == "mismatch"
    other = [{"seq": 0, "name": "broadcast", "where": "train.py:41 in evaluate", "step": 20}]
    assert probe("dist-collectives", run_of(digest(0), digest(1, collectives=other))).outcome == "order"
    assert probe("dist-collectives", run_of(digest(0), digest(1))).outcome == "ok"


def test_ranks_that_never_meet_in_init_process_group_are_a_rendezvous_failure_not_a_mismatch():
    busy = {"kind": "init", "name": "init_process_group", "where": "train.py:2 in <module>", "step": 0}
    abort = {"kind": "stalled", "text": "no rank made progress for 10 s"}
    run = run_of(digest(0, exit="aborted", busy=busy), digest(1, exit="aborted", busy=busy), abort=abort)
    result = probe("dist-collectives", run)
    assert result.outcome == "rendezvous" and result.data["training_raised"] and "train.py:2" in result.summary
    assert probe("dist-run", run).outcome == "aborted"


def test_a_rank_that_raised_alone_keeps_the_verdict_from_healthy_and_its_peer_s_error_is_the_consequence():
    own = {"type": "RuntimeError", "where": "train.py:11 in main", "step": 7,
           "message": "expected target dtype to be Long or Byte, but got Float"}
    lost = {"type": "RuntimeError", "where": "train.py:11 in main", "step": 7,
            "message": "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"}
    run = run_of(digest(0, error=lost), digest(1, error=own))
    ran = probe("dist-run", run)
    assert ran.outcome == "rank-raised" and ran.data["rank"] == 1 and ran.data["training_raised"]
    assert probe("dist-collectives", run).outcome == "peer-raised"


def test_a_script_that_never_initialised_a_process_group_is_said_to_be_one_process():
    plain = [digest(r, init={"calls": [], "backend": None}, ddp=[], collectives=[]) for r in range(2)]
    assert probe("dist-run", run_of(*plain)).outcome == "not-distributed"


# ------------------------------------------------------------------------------ agreement and watchdog
@pytest.fixture
def channel():
    from nnwizard.distributed.channel import Channel, connect, serve

    store, address = serve()
    yield lambda: Channel(connect(address), "test")
    del store


def _rec(steps: int = 0, seconds: float = 0.0):
    rec = SimpleNamespace(recording=SimpleNamespace(total_steps=steps, stopped=None))
    rec.now = lambda: seconds
    return rec


def test_every_rank_stops_at_the_step_the_first_rank_agreed_on(channel):
    from nnwizard.distributed.agree import StepAgreement
    from nnwizard.record import StopRun

    a, b = StepAgreement(channel(), 0, 600, 30.0), StepAgreement(channel(), 1, 587, 30.0)
    assert a.stop == b.stop == 600
    stopped = {}
    for rank, agreement in ((0, a), (1, b)):
        for n in range(1, 700):
            try:
                agreement.on_step_post(_rec(n, 1.0), None, None)
            except StopRun:
                stopped[rank] = n
                break
    assert stopped == {0: 600, 1: 600}


def test_a_rank_past_the_time_limit_halts_every_rank_two_steps_later(channel):
    from nnwizard.distributed.agree import MARGIN, StepAgreement
    from nnwizard.record import StopRun

    a, b = StepAgreement(channel(), 0, 600, 30.0), StepAgreement(channel(), 1, 600, 30.0)
    a.on_step_post(_rec(9, 5.0), None, None)
    b.on_step_post(_rec(9, 5.0), None, None)
    a.on_step_post(_rec(10, 31.0), None, None)       # rank 0's clock passed 30 s at step 10
    ends = {}
    for rank, agreement, seconds in ((0, a, 31.0), (1, b, 29.0)):
        for n in range(10, 10 + 3 * MARGIN):
            try:
                agreement.on_step_post(_rec(n, seconds), None, None)
            except StopRun as stop:
                ends[rank] = (n, str(stop))
                break
    assert ends[0][0] == ends[1][0] == 10 + MARGIN
    assert "rank 0" in ends[1][1]


def test_the_watchdog_ends_ranks_stuck_in_different_collectives_and_a_rank_waiting_for_one_that_left(channel):
    from nnwizard.distributed.heartbeat import Watchdog

    c = channel()
    busy = {"kind": "collective", "name": "all_reduce", "where": "train.py:33 in validate", "step": 12, "waited_s": 0.5}
    c.put("hb/0", {"pid": 1, "state": "running", "step": 12, "events": 50, "busy": busy, "t": 1.0})
    c.put("hb/1", {"pid": 2, "state": "running", "step": 12, "events": 60, "busy": None, "t": 1.0})
    dog = Watchdog(c, 2, stall_s=0.3, gone_s=0.3)
    assert dog.check() is None                      # rank 1 still works
    c.put("hb/1", {"pid": 2, "state": "finished", "step": 12, "events": 61, "busy": None, "t": 2.0})
    c.put("hb/0", {**c.get("hb/0"), "busy": {**busy, "waited_s": 1.0}, "t": 2.0})
    reason = dog.check()
    assert reason["kind"] == "peer-gone" and "train.py:33" in reason["text"] and "finished" in reason["text"]

    c2 = channel()
    c2.prefix += "2/"
    stuck = {"kind": "collective", "name": "barrier", "where": "train.py:10 in main", "step": 6, "waited_s": 0.5}
    for r in range(2):
        c2.put(f"hb/{r}", {"pid": r, "state": "running", "step": 6, "events": 5, "busy": stuck, "t": 1.0})
    dog2 = Watchdog(c2, 2, stall_s=0.3, gone_s=0.3)
    dog2.check()
    time.sleep(0.4)
    assert dog2.check()["kind"] == "stalled"


# ---------------------------------------------------------------------- what one rank records (one process)
@pytest.fixture
def one_process():
    from nnwizard.distributed.env import one_process as env

    with env():
        yield


def test_a_rank_digest_records_samplers_loaders_collectives_ddp_writes_prints_and_parameters(one_process, tmp_path, monkeypatch):
    from nnwizard.distributed.digest import RankDigest
    from nnwizard.script_run import RunOptions, load_script, run_script

    monkeypatch.chdir(tmp_path)
    script = load_script(str(DIST / "healthy_ddp_classifier.py"))
    d = RankDigest(0, 1, script.folder)
    result = run_script(script, ["--epochs", "2"], RunOptions(max_steps=30, limit_batches=12, listeners=[d],
                                                              patches=[d.patches()]))
    out = d.finish(result)
    assert result.exit in ("finished", "stopped"), result.recording.error
    assert out["init"]["backend"] == "gloo" and out["init"]["calls"][0]["where"].startswith("healthy_ddp_classifier.py:")
    sampler = out["samplers"][0]
    assert sampler["shuffle"] and [it["epoch"] for it in sampler["iters"]][:2] == [0, 1]
    assert sampler["iters"][0]["hash"] != sampler["iters"][1]["hash"]
    train = next(l for l in out["loaders"] if any(l["trained"]))
    assert train["distributed_sampler"] == 0 and len(train["passes"][0]["indices"]) >= 12 * 32
    assert any(c["name"] == "all_reduce" and "evaluate" in c["where"] for c in out["collectives"])
    assert out["ddp"][0]["params"][:2] == ["fc1.weight", "fc1.bias"] and out["ddp"][0]["forwards"] > 0
    assert any(w["path"].endswith("ddp_classifier.pt") and w["via"] == "torch.save" for w in out["writes"])
    assert any("val_acc" in p["text"] for p in out["prints"])
    steps = [p["step"] for p in out["params"]]
    assert steps[0] == 0 and 1 in steps and all(fp for p in out["params"] for fp in p["fp"])
    assert out["eval_calls"] and "correct" in out["eval_calls"][0]
    assert not Path("ddp_classifier.pt").exists()   # (the sandbox kept it aside)


def test_an_fsdp2_script_is_recorded_and_its_model_copied_plainly_in_one_process(one_process, tmp_path, monkeypatch):
    from nnwizard.distributed.fsdp import plain_copies
    from nnwizard.script_run import RunOptions, load_script, run_script

    monkeypatch.chdir(tmp_path)
    with plain_copies():
        result = run_script(load_script(str(DIST / "healthy_fsdp2_classifier.py")), [], RunOptions(max_steps=8))
    rec = result.recording
    assert rec.error is None and rec.total_steps == 8
    initial = rec.models[0].initial
    assert type(initial).__name__ == "Net" and all(type(p) is torch.nn.Parameter for p in initial.parameters())
    assert initial(torch.randn(3, 20)).shape == (3, 4)


def test_ddp_s_unused_parameter_error_is_disconnected_parameters_with_the_names(one_process):
    import torch.distributed as dist
    from torch import nn

    from nnwizard.probes._crash import classify_exception

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head, self.aux = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.body(x))

    dist.init_process_group("gloo")
    try:
        model = nn.parallel.DistributedDataParallel(TwoHeads())
        with pytest.raises(RuntimeError) as raised:
            for _ in range(2):
                model(torch.randn(5, 4)).sum().backward()
        found = classify_exception(raised.value, model=model)
    finally:
        dist.destroy_process_group()
    assert found.hypothesis == "disconnected-parameters"
    assert "aux.weight, aux.bias" in found.sentence and "find_unused_parameters=True" in found.sentence


def test_a_bundle_of_a_ddp_step_keeps_the_module_ddp_wraps_and_replays_in_one_process(one_process, tmp_path):
    import torch.distributed as dist
    from torch import nn

    from nnwizard.bundle import load_bundle, save_bundle

    dist.init_process_group("gloo")
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
        opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
        ddp(torch.randn(6, 3)).sum().backward()
        opt.step()
        names = {id(p): n for n, p in ddp.named_parameters()}
        grads = {n: p.grad.clone() for n, p in ddp.named_parameters()}
        save_bundle(tmp_path / "b", {"step": 1, "models": {"model": "DistributedDataParallel"}}, {"model": ddp}, opt,
                    names, grads, {"calls": []}, [], None)
    finally:
        dist.destroy_process_group()
    bundle = load_bundle(tmp_path / "b")
    models = bundle.models()
    assert type(models["model"]).__name__ == "Sequential" and bundle.meta["models"] == {"model": "Sequential"}
    optimizer = bundle.make_optimizer(models)
    assert len(optimizer.param_groups[0]["params"]) == 4
    assert set(bundle.load_state()["grads"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_gloo_text_in_a_summary_is_shown_not_read_as_markup():
    from rich.console import Console

    from nnwizard.engine import Event
    from nnwizard.probes.api import failed
    from nnwizard.view import TerminalView

    out = io.StringIO()
    view = TerminalView(Console(file=out, width=100))
    result = failed("peer-lost", "rank 0: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed")
    result.id = "dist-collectives"
    view(Event("probe-end", data={"result": result}))
    assert "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]" in out.getvalue()


def test_more_ranks_than_cores_is_one_clear_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(DIST / "healthy_ddp_classifier.py"),
                           "--nproc", "999", "--non-interactive", "--device", "cpu"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--nproc 999" in done.stderr and "core" in done.stderr


def test_nproc_takes_a_script_not_a_module(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--module", str(ROOT / "examples" / "healthy_mlp.py"),
                           "--nproc", "2", "--non-interactive"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "--script" in done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_nccl_rank_on_a_gpu(tmp_path):
    import json

    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(DIST / "healthy_ddp_classifier.py"),
                           "--nproc", "1", "--device", "cuda", "--non-interactive", "--json", str(out), "-q"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["distributed"]["backend"] == "nccl" and report["verdict"] == "healthy", report["hypotheses"][:3]


# -------------------------------------------------------------------------------- two real gloo ranks
@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One real launch of broken_sampler_epoch_not_set.py on two gloo ranks (torch's elastic launcher)."""
    from nnwizard.distributed.launch import Launch

    opts = SimpleNamespace(script=str(DIST / "broken_sampler_epoch_not_set.py"), script_args=[], max_steps=40, seed=0)
    launch = Launch(opts, 2, "cpu")
    try:
        run = launch.run()
    finally:
        launch.close()
    return run


def test_two_real_ranks_stop_at_the_same_step_and_their_digests_show_the_sampler_fault(launched):
    run = launched
    assert sorted(run.digests) == [0, 1] and run.initialised() and run.backend == "gloo"
    assert [run.digests[r]["total_steps"] for r in (0, 1)] == [40, 40]
    assert all("40 optimizer steps, agreed by every rank" in run.digests[r]["stopped"] for r in (0, 1))
    assert probe("dist-sampler-epoch", run).outcome == "epoch-not-set"
    for pid in ("dist-collectives", "dist-sharding", "dist-replicas", "dist-writes", "dist-metric"):
        assert probe(pid, run).status in ("passed", "skipped"), (pid, probe(pid, run).summary)
