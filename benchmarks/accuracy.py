"""Diagnosis accuracy over the bundled examples.

Every module in examples/ declares ``EXPECTED = {"symptoms": [...], "hypotheses": [...]}`` (an empty
hypothesis list means healthy). This harness runs the scripted diagnosis of each one, with its
declared symptoms (or with ``--auto``: symptom ``auto``), and prints per-example verdicts, top-1 and
top-3 accuracy over the broken examples, false alarms on the healthy ones, and the median and max
seconds per diagnosis. ``--markdown`` runs both modes and prints the tables of docs/benchmarks.md.

``--scripts`` does the same for script mode over the plain training scripts in examples/scripts/
(each declares ``# nnwizard-expect:`` / ``# nnwizard-symptom:`` in its first lines): every script
is diagnosed through the real CLI in a subprocess, ``nnwizard diagnose --script PATH
--non-interactive``, as a user would run it, so its seconds include Python and torch start-up.
``--markdown`` adds the script-mode table and summary row (declared symptoms).

    python benchmarks/accuracy.py [--auto] [--scripts] [--seed N] [--markdown] [--only NAME ...] [--json out.json] [--device cuda]

``--device cuda`` diagnoses on the GPU (module mode: every probe there, the CUDA-only examples included;
script mode: ``--device`` is passed on, the scripts choose where their own model runs).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def examples(only: list[str] | None = None, device: str = "cpu") -> list[tuple[str, dict]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        if path.stem.startswith("_") or path.stem == "datasets" or path.stem == "__init__":
            continue
        if only and path.stem not in only:
            continue
        module = importlib.import_module(f"examples.{path.stem}")
        expected = getattr(module, "EXPECTED", None)
        if expected is not None and (device.startswith("cuda") or not getattr(module, "GPU_ONLY", False)):
            found.append((path.stem, expected))
    return found


def run_one(name: str, expected: dict, auto: bool, seed: int = 0, device: str = "cpu") -> dict:
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose

    symptoms = ["auto"] if auto else expected.get("symptoms", ["auto"])
    started = time.monotonic()
    try:
        diagnosis = diagnose(Options(module=str(ROOT / "examples" / f"{name}.py"), symptoms=symptoms, device=device, seed=seed))
        report = build(diagnosis)
        error = None
    except Exception as exc:  # noqa: BLE001 - a harness reports, it does not stop
        report, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    ranked = [(h.id, h.confidence) for h in report.hypotheses] if report else []
    return _row(name, symptoms, expected.get("hypotheses", []), ranked, report.verdict if report else "error", seconds, error)


def run_one_cli(name: str, expected: dict, auto: bool, seed: int, device: str) -> dict:
    """One example diagnosed through the CLI in its own process (``--device cuda``: a kernel assertion
    kills its process's CUDA context, and the CLI then re-runs that diagnosis on the CPU; in-process,
    every later example would inherit the dead context)."""
    from examples._scripts import diagnose_with_cli

    symptoms = ["auto"] if auto else expected.get("symptoms", ["auto"])
    with tempfile.TemporaryDirectory(prefix="nnwizard-bench-") as scratch:
        report, error, seconds = diagnose_with_cli(ROOT / "examples" / f"{name}.py", symptoms, Path(scratch), seed,
                                                   timeout_s=600, device=device, kind="--module")
    ranked = [(h["id"], h["confidence"]) for h in report["hypotheses"]] if report else []
    row = _row(name, symptoms, expected.get("hypotheses", []), ranked, report["verdict"] if report else "error", seconds,
               error and error.splitlines()[-1])
    row["device"] = report["device"] if report else device
    row["cuda_lost"] = (report or {}).get("environment", {}).get("cuda_lost")
    return row


def _row(name: str, symptoms: list[str], wanted: list[str], ranked: list[tuple[str, float]], verdict: str,
         seconds: float, error: str | None) -> dict:
    findings = [h for h, confidence in ranked if confidence >= 0.5]
    ranked = [h for h, _ in ranked]
    row = {"example": name, "symptoms": symptoms, "expected": wanted, "found": findings[:3],
           "verdict": verdict, "seconds": round(seconds, 2), "error": error}
    if wanted:
        row["top1"] = bool(findings) and findings[0] in wanted
        row["top3"] = any(h in wanted for h in findings[:3])
        row["rank"] = next((i + 1 for i, h in enumerate(ranked) if h in wanted), None)
    else:
        row["false_alarm"] = bool(findings) or row["verdict"] != "healthy"
    return row


def run_script_one(script, auto: bool, seed: int = 0, device: str = "cpu") -> dict:
    """One example script diagnosed through the real CLI in a subprocess; the row from its JSON report."""
    from examples._scripts import diagnose_with_cli

    symptoms = ["auto"] if auto else list(script.symptoms)
    with tempfile.TemporaryDirectory(prefix="nnwizard-bench-") as scratch:
        report, error, seconds = diagnose_with_cli(script.path, symptoms, Path(scratch), seed, device=device)
    ranked = [(h["id"], h["confidence"]) for h in report["hypotheses"]] if report else []
    return _row(script.name, symptoms, list(script.expected), ranked, report["verdict"] if report else "error",
                seconds, error and error.splitlines()[-1])


def _result(row: dict) -> str:
    if row["expected"]:
        return "top-1" if row["top1"] else "top-3" if row["top3"] else "miss"
    return "false alarm" if row["false_alarm"] else "healthy"


def _summary(rows: list[dict], auto: bool, seed: int, scripts: bool = False, device: str = "cpu") -> dict:
    broken = [r for r in rows if r["expected"]]
    healthy = [r for r in rows if not r["expected"]]
    secs = [r["seconds"] for r in rows]
    return {
        "mode": ("script mode (CLI), " if scripts else "") + ("auto" if auto else "declared symptoms") + f", seed {seed}"
                + ("" if device == "cpu" else f", device {device}"),
        "broken": len(broken), "healthy": len(healthy),
        "top1": sum(r["top1"] for r in broken), "top3": sum(r["top3"] for r in broken),
        "false_alarms": sum(r["false_alarm"] for r in healthy),
        "median_s": round(statistics.median(secs), 2) if secs else 0, "max_s": round(max(secs), 2) if secs else 0,
    }


def _print_row(row: dict) -> None:
    print(f"{_result(row).upper() if _result(row) in ('miss', 'false alarm') else 'ok':11} {row['example']:42} "
          f"{row['seconds']:6.1f}s  expected {row['expected'] or 'healthy'}  found {row['found'] or row['verdict']}"
          + (f"  ERROR {row['error']}" if row["error"] else ""), flush=True)


def _print_summary(summary: dict) -> None:
    print(f"{summary['mode']}: top-1 {summary['top1']}/{summary['broken']}, top-3 {summary['top3']}/{summary['broken']}, "
          f"false alarms {summary['false_alarms']}/{summary['healthy']}, median {summary['median_s']} s, max {summary['max_s']} s")


def run_scripts(args) -> int:
    """``--scripts``: script mode over examples/scripts/ (one CLI subprocess per script)."""
    from examples._scripts import script_examples, script_mode_available

    if not script_mode_available():
        print("script mode: this checkout's `nnwizard diagnose` has no --script option yet")
        return 2
    rows = []
    for script in script_examples(args.only):
        rows.append(run_script_one(script, args.auto, args.seed, args.device))
        _print_row(rows[-1])
    summary = _summary(rows, args.auto, args.seed, scripts=True, device=args.device)
    _print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"scripts": {"summary": summary, "rows": rows}}, indent=2))
    return 0


def _markdown_scripts(only: list[str] | None, seed: int) -> dict | None:
    """The script-mode table for ``--markdown`` (declared symptoms); None when there is no script mode."""
    from examples._scripts import script_examples, script_mode_available

    if not script_mode_available():
        print("Script mode: not available in this checkout.\n")
        return None
    rows = [run_script_one(script, False, seed) for script in script_examples(only)]
    print("| script | expected | declared symptom: result (s) | top hypotheses found |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| `{row['example']}` | {', '.join(row['expected']) or 'healthy'} | {', '.join(row['symptoms'])}: "
              f"{_result(row)} ({row['seconds']:.1f}) | {', '.join(row['found']) or row['verdict']} |")
    print()
    return {"summary": _summary(rows, False, seed, scripts=True), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--auto", action="store_true", help="diagnose every example with symptom 'auto'")
    parser.add_argument("--scripts", action="store_true", help="script mode over examples/scripts/ (through the CLI)")
    parser.add_argument("--markdown", action="store_true", help="both modes and script mode, as the README's tables")
    parser.add_argument("--only", nargs="*", help="example names")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--seed", type=int, default=0, help="the diagnosis seed (robustness: results should not hinge on it)")
    parser.add_argument("--device", default="cpu", help="the diagnosis device (cuda: also the examples that need one; "
                        "each example then runs in its own CLI process)")
    parser.add_argument("--jobs", type=int, default=4, help="with --device cuda: examples diagnosed at once")
    args = parser.parse_args(argv)
    if args.scripts and not args.markdown:
        return run_scripts(args)
    import torch

    torch.set_num_threads(2)
    modes = [False, True] if args.markdown else [args.auto]
    runs = {auto: [] for auto in modes}
    if args.device.startswith("cuda"):  # each example in its own CLI process, --jobs at a time
        from concurrent.futures import ThreadPoolExecutor

        jobs = [(name, expected, auto) for name, expected in examples(args.only, args.device) for auto in modes]
        with ThreadPoolExecutor(args.jobs) as pool:
            for (name, expected, auto), row in zip(jobs, pool.map(lambda j: run_one_cli(*j, args.seed, args.device), jobs)):
                runs[auto].append(row)
                if not args.markdown:
                    _print_row(row)
                    if row.get("cuda_lost"):
                        print(f"            (re-run on the CPU: {row['cuda_lost'][:160]})", flush=True)
    for name, expected in [] if args.device.startswith("cuda") else examples(args.only, args.device):
        for auto in modes:
            row = run_one(name, expected, auto, args.seed, args.device)
            runs[auto].append(row)
            if not args.markdown:
                _print_row(row)
    summaries = {auto: _summary(rows, auto, args.seed, device=args.device) for auto, rows in runs.items()}
    if args.markdown:
        print("| example | expected | declared symptom: result (s) | `auto`: result (s) |")
        print("|---|---|---|---|")
        for row, auto_row in zip(runs[False], runs[True]):
            print(f"| `{row['example']}` | {', '.join(row['expected']) or 'healthy'} | {', '.join(row['symptoms'])}: "
                  f"{_result(row)} ({row['seconds']:.1f}) | {_result(auto_row)} ({auto_row['seconds']:.1f}) |")
        print()
    scripts = _markdown_scripts(args.only, args.seed) if args.markdown else None
    for summary in summaries.values():
        _print_summary(summary)
    if scripts:
        _print_summary(scripts["summary"])
    if args.json:
        results = {("auto" if auto else "declared"): {"summary": summaries[auto], "rows": runs[auto]} for auto in modes}
        if scripts:
            results["scripts"] = scripts
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
