"""Diagnosis cost against model size: wall time, plain-step equivalents and peak memory.

For every case of ``benchmarks/scale_models.py`` (a ResNet-18-style CNN and a GPT-style decoder from
about a thousand to about eleven million parameters, each healthy and with a planted fault: no
``zero_grad``, eval mode left on after ``evaluate``) this runs, each in its own subprocess:

1. a plain training step of the healthy model (two warm-ups, then the median of five timed steps),
   and that process's peak resident memory (the same script: imports, data, model, optimizer);
2. ``nnwizard diagnose --symptom auto --non-interactive`` through the real CLI, with its wall time,
   exit code and peak resident memory (``os.wait4``'s rusage of that child alone).

It prints one table row per case (docs/benchmarks.md) and checks the targets of issue #12: every probe completes
(none errored, none left out for lack of budget; a probe the engine deliberately does not run because
a finding is already confirmed is counted apart, as "not needed"), the planted fault is top-1 and the healthy twin
``healthy``, wall time at most ``max(20 s, 40 plain steps)``, a clean exit (0 or 1, no abort), and peak
memory at most twice a plain step's. The plain step of the target is the one the session calibrated
(the same moment as the diagnosis, so a loaded machine inflates both alike), else the benchmark's own.
Timings depend on the machine's load (the last column: the 1-minute load average when the case
ended): say so when quoting them. The whole table, non-interactively: ``python benchmarks/scale.py``.

    python benchmarks/scale.py [--only cnn_w64 gpt_d256_l6 ...] [--faults healthy zero_grad eval_mode]
                               [--markdown] [--json out.json] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_models  # noqa: E402

EXPECTED = {"healthy": None, "zero_grad": "missing-zero-grad", "eval_mode": "train-mode-missing"}

PLAIN = """
import json, resource, statistics, sys, time
import torch
sys.path.insert(0, {bench!r})
import scale_models
ns = getattr(scale_models, {name!r})()
device = torch.device({device!r})
model = ns.build_model().to(device)
optimizer = ns.build_optimizer(model)
train, _ = ns.build_data()
x, y = next(iter(train))
x, y = x.to(device), y.to(device)
cuda = device.type == "cuda"
def step():
    if cuda: torch.cuda.synchronize()
    t0 = time.perf_counter()
    ns.train_step(model, (x, y), ns.loss_fn, optimizer)
    if cuda: torch.cuda.synchronize()
    return time.perf_counter() - t0
step(), step()
times = [step() for _ in range(5)]
print(json.dumps({{"params": sum(p.numel() for p in model.parameters()), "step_s": statistics.median(times),
                   "batch": len(y), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "cuda_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None}}))
"""


def _run(cmd: list[str], timeout: float) -> tuple[int, str, str, float, float]:
    """(exit code, stdout, stderr, wall seconds, peak RSS in MB) of one child process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env={**os.environ, "MPLBACKEND": "Agg"})
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), wall, usage.ru_maxrss / 1024


def plain_step(name: str, device: str) -> dict:
    code, out, err, _, rss = _run([sys.executable, "-c", PLAIN.format(bench=str(ROOT / "benchmarks"), name=name,
                                                                       device=device)], 900)
    if code != 0:
        raise RuntimeError(f"plain step of {name} failed: {err[-500:]}")
    info = json.loads(out.strip().splitlines()[-1])
    info["rss_mb"] = max(info["rss_mb"], rss)
    return info


def diagnose(name: str, device: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "nnwizard", "diagnose", "-m", f"benchmarks/scale_models.py:{name}", "-s", "auto",
               "--non-interactive", "--device", device, "--json", str(report_path), "-q"]
        code, out, err, wall, rss = _run(cmd, timeout)
        report = json.loads(report_path.read_text()) if report_path.exists() else None
    return {"code": code, "wall_s": wall, "rss_mb": rss, "report": report, "aborted": code < 0 or code == 134 or
            "terminate called" in err, "stderr": err[-800:]}


def case(name: str, fault: str, device: str, timeout: float, plain: dict) -> dict:
    run = diagnose(name, device, timeout)
    report = run["report"] or {}
    probes = report.get("probes", [])
    incomplete = [f"{p['id']} ({p['status']}: {p['summary'][:80]})" for p in probes
                  if p["status"] == "errored" or p["data"].get("cannot_run") not in (None, "not-needed")]
    # deliberately not run: a finding was already confirmed (engine.CONFIRMED); not a cut, but not a measurement either
    not_needed = [f"{p['id']} ({p['summary'][:90]})" for p in probes if p["data"].get("cannot_run") == "not-needed"]
    top = report["hypotheses"][0]["id"] if report.get("hypotheses") and report["hypotheses"][0]["confidence"] >= 0.5 else None
    want = EXPECTED[fault]
    correct = report.get("verdict") == "healthy" if want is None else top == want
    session_step = (report.get("budget") or {}).get("user_step_s") or plain["step_s"]
    target_s = max(20.0, 40 * session_step)
    row = dict(name=name, fault=fault, params=plain["params"], batch=plain["batch"], step_s=plain["step_s"],
               session_step_s=session_step, wall_s=round(run["wall_s"], 1), plain_steps=round(run["wall_s"] / plain["step_s"], 1),
               session_steps=round(run["wall_s"] / session_step, 1), target_s=round(target_s, 1), load=round(os.getloadavg()[0], 1),
               verdict=report.get("verdict"), top=top, correct=correct, probes=len(probes), incomplete=incomplete,
               not_needed=not_needed,
               code=run["code"], aborted=run["aborted"], rss_mb=round(run["rss_mb"]), plain_rss_mb=round(plain["rss_mb"]),
               memory_ratio=round(run["rss_mb"] / plain["rss_mb"], 2), budget=report.get("budget", {}))
    row["in_time"] = run["wall_s"] <= target_s
    row["clean"] = run["code"] in (0, 1) and not run["aborted"]
    row["meets"] = correct and not incomplete and row["in_time"] and row["clean"] and row["memory_ratio"] <= 2.0
    if run["report"] is None:
        row["stderr"] = run["stderr"]
    return row


def _fmt(row: dict) -> str:
    found = "healthy" if row["fault"] == "healthy" and row["verdict"] == "healthy" else (row["top"] or row["verdict"])
    return (f"| `{row['name']}` | {row['fault']} | {row['params']:,} | {row['step_s']:.3f} / {row['session_step_s']:.3f} | "
            f"{row['wall_s']:.1f} | {row['target_s']:.0f} | {row['session_steps']:.0f} | {found} {'✓' if row['correct'] else '✗'} | "
            f"{row['probes'] - len(row['incomplete']) - len(row['not_needed'])}/{row['probes']}"
            f"{' (+%d not needed)' % len(row['not_needed']) if row['not_needed'] else ''} | {row['code']} | "
            f"{row['rss_mb']} / {row['plain_rss_mb']} ({row['memory_ratio']:.2f}x) | {row['load']} |")


def summary(rows: list[dict]) -> str:
    healthy = [r for r in rows if r["fault"] == "healthy"]
    faults = [r for r in rows if r["fault"] != "healthy"]
    n = len(rows)
    return (f"healthy twins `healthy` {sum(r['correct'] for r in healthy)}/{len(healthy)}; planted fault top-1 "
            f"{sum(r['correct'] for r in faults)}/{len(faults)}; every probe completed {sum(not r['incomplete'] for r in rows)}/{n} "
            f"(rows with probes deliberately not run after a confirmed finding: {sum(bool(r['not_needed']) for r in rows)}); "
            f"wall within max(20 s, 40 session steps) {sum(r['in_time'] for r in rows)}/{n}; peak memory within 2x a plain "
            f"step {sum(r['memory_ratio'] <= 2.0 for r in rows)}/{n} (worst {max((r['memory_ratio'] for r in rows), default=0):.2f}x); "
            f"clean exits {sum(r['clean'] for r in rows)}/{n}; all targets {sum(r['meets'] for r in rows)}/{n}; median cost "
            f"{statistics.median([r['session_steps'] for r in rows]) if rows else 0:.0f} session steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="model names, e.g. cnn_w64 gpt_d256_l6 (default: all)")
    parser.add_argument("--faults", nargs="*", default=list(EXPECTED), choices=list(EXPECTED))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a diagnosis is killed")
    parser.add_argument("--markdown", action="store_true", help="print only the README table and its summary (no notes)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    gpu_only = {scale_models.model_name(f, size) for f, size in scale_models.GPU_SIZES}
    models = [m for m in dict.fromkeys(scale_models.model_name(f, size) for f, size, _ in scale_models.TARGETS.values())
              if args.device.startswith("cuda") or m not in gpu_only or (args.only and m in args.only)]
    rows = []
    header = ("| model | fault | parameters | plain step (s): benchmark / session | wall (s) | target (s) | "
              "wall in session steps | result | probes completed | exit | peak RSS MB: diagnosis / plain (ratio) | load |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    for model in models:
        if args.only and model not in args.only:
            continue
        plain = plain_step(f"{model}_healthy", args.device)  # the faults do not change a step's cost
        for fault in args.faults:
            row = case(f"{model}_{fault}", fault, args.device, args.timeout, plain)
            rows.append(row)
            print(_fmt(row), flush=True)
            for item in row["incomplete"] if not args.markdown else []:
                print(f"    not completed: {item}", file=sys.stderr)
            for item in row["not_needed"] if not args.markdown else []:
                print(f"    not needed: {item}", file=sys.stderr)
    print(f"\n{summary(rows)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
