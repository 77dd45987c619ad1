"""Diagnosis accuracy over the bundled examples.

Every module in examples/ declares ``EXPECTED = {"symptoms": [...], "hypotheses": [...]}`` (an empty
hypothesis list means healthy). This harness runs the scripted diagnosis of each one, with its
declared symptoms (or with ``--auto``: symptom ``auto``), and prints per-example verdicts, top-1 and
top-3 accuracy over the broken examples, false alarms on the healthy ones, and the median and max
seconds per diagnosis. ``--markdown`` runs both modes and prints the table the README shows.

    python benchmarks/accuracy.py [--auto] [--seed N] [--markdown] [--only NAME ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def examples(only: list[str] | None = None) -> list[tuple[str, dict]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        if path.stem.startswith("_") or path.stem == "datasets" or path.stem == "__init__":
            continue
        if only and path.stem not in only:
            continue
        module = importlib.import_module(f"examples.{path.stem}")
        expected = getattr(module, "EXPECTED", None)
        if expected is not None and not getattr(module, "GPU_ONLY", False):
            found.append((path.stem, expected))
    return found


def run_one(name: str, expected: dict, auto: bool, seed: int = 0) -> dict:
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose

    symptoms = ["auto"] if auto else expected.get("symptoms", ["auto"])
    started = time.monotonic()
    try:
        diagnosis = diagnose(Options(module=str(ROOT / "examples" / f"{name}.py"), symptoms=symptoms, device="cpu", seed=seed))
        report = build(diagnosis)
        error = None
    except Exception as exc:  # noqa: BLE001 - a harness reports, it does not stop
        report, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
    wanted = expected.get("hypotheses", [])
    findings = [h.id for h in report.hypotheses if h.confidence >= 0.5] if report else []
    ranked = [h.id for h in report.hypotheses] if report else []
    row = {"example": name, "symptoms": symptoms, "expected": wanted, "found": findings[:3],
           "verdict": report.verdict if report else "error", "seconds": round(seconds, 2), "error": error}
    if wanted:
        row["top1"] = bool(findings) and findings[0] in wanted
        row["top3"] = any(h in wanted for h in findings[:3])
        row["rank"] = next((i + 1 for i, h in enumerate(ranked) if h in wanted), None)
    else:
        row["false_alarm"] = bool(findings) or row["verdict"] != "healthy"
    return row


def _result(row: dict) -> str:
    if row["expected"]:
        return "top-1" if row["top1"] else "top-3" if row["top3"] else "miss"
    return "false alarm" if row["false_alarm"] else "healthy"


def _summary(rows: list[dict], auto: bool, seed: int) -> dict:
    broken = [r for r in rows if r["expected"]]
    healthy = [r for r in rows if not r["expected"]]
    secs = [r["seconds"] for r in rows]
    return {
        "mode": ("auto" if auto else "declared symptoms") + f", seed {seed}",
        "broken": len(broken), "healthy": len(healthy),
        "top1": sum(r["top1"] for r in broken), "top3": sum(r["top3"] for r in broken),
        "false_alarms": sum(r["false_alarm"] for r in healthy),
        "median_s": round(statistics.median(secs), 2) if secs else 0, "max_s": round(max(secs), 2) if secs else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--auto", action="store_true", help="diagnose every example with symptom 'auto'")
    parser.add_argument("--markdown", action="store_true", help="both modes, as the README's table")
    parser.add_argument("--only", nargs="*", help="example names")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--seed", type=int, default=0, help="the diagnosis seed (robustness: results should not hinge on it)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    modes = [False, True] if args.markdown else [args.auto]
    runs = {auto: [] for auto in modes}
    for name, expected in examples(args.only):
        for auto in modes:
            row = run_one(name, expected, auto, args.seed)
            runs[auto].append(row)
            if not args.markdown:
                print(f"{_result(row).upper() if _result(row) in ('miss', 'false alarm') else 'ok':11} {name:34} "
                      f"{row['seconds']:6.1f}s  expected {row['expected'] or 'healthy'}  found {row['found'] or row['verdict']}"
                      + (f"  ERROR {row['error']}" if row["error"] else ""), flush=True)
    summaries = {auto: _summary(rows, auto, args.seed) for auto, rows in runs.items()}
    if args.markdown:
        print("| example | expected | declared symptom: result (s) | `auto`: result (s) |")
        print("|---|---|---|---|")
        for row, auto_row in zip(runs[False], runs[True]):
            print(f"| `{row['example']}` | {', '.join(row['expected']) or 'healthy'} | {', '.join(row['symptoms'])}: "
                  f"{_result(row)} ({row['seconds']:.1f}) | {_result(auto_row)} ({auto_row['seconds']:.1f}) |")
        print()
    for summary in summaries.values():
        print(f"{summary['mode']}: top-1 {summary['top1']}/{summary['broken']}, top-3 {summary['top3']}/{summary['broken']}, "
              f"false alarms {summary['false_alarms']}/{summary['healthy']}, median {summary['median_s']} s, max {summary['max_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps({("auto" if auto else "declared"): {"summary": summaries[auto], "rows": runs[auto]}
                                               for auto in modes}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
