"""The ``nnwizard`` command: diagnose, and helpers for trees and probes, with error handling
that shows users one clear line (``--debug`` for the traceback) with the contract's exit codes."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import List, Optional

import typer

try:  # recent typer vendors its own click
    from typer._click.exceptions import NoArgsIsHelpError, UsageError as ClickUsageError
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.exceptions import NoArgsIsHelpError, UsageError as ClickUsageError
from rich.console import Console

import nnwizard
from nnwizard.errors import ExitCode, NNWizardError, UsageError

app = typer.Typer(
    name="nnwizard", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, help="A guided troubleshooting wizard for PyTorch training that goes wrong.",
)
trees_app = typer.Typer(help="List, draw and validate decision trees.", no_args_is_help=True)
probes_app = typer.Typer(help="List the registered probes.", no_args_is_help=True)
app.add_typer(trees_app, name="trees")
app.add_typer(probes_app, name="probes")

FAIL_ON_NAMES = {"low": 0.3, "medium": 0.5, "high": 0.8}
_debug = False


def _interruptible(command):
    """Ctrl-C that reaches a command (before anything was measured, or in a run with no partial report to write)
    ends it with one line and exit 130; typer alone would exit 130 without a word."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            print("nnwizard: interrupted", file=sys.stderr)
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    return run


def _version(value: bool) -> None:
    if value:
        print(f"nnwizard {nnwizard.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    global _debug
    _debug = debug


def parse_fail_on(value: str | None) -> float | None:
    if value is None:
        return None
    if value.lower() in FAIL_ON_NAMES:
        return FAIL_ON_NAMES[value.lower()]
    try:
        threshold = float(value)
    except ValueError:
        threshold = -1.0
    if not 0.0 <= threshold <= 1.0:
        raise UsageError(f"--fail-on {value!r}: expected a confidence in [0, 1] or one of {', '.join(FAIL_ON_NAMES)}")
    return threshold


@app.command()
@_interruptible
def diagnose(
    module: Optional[str] = typer.Option(None, "--module", "-m", help="Training module: mypkg.train, path/to/train.py, optionally :attr."),
    script: Optional[str] = typer.Option(None, "--script", help="An unmodified training script (path or dotted name), run as `python train.py ARGS` would; ARGS go after `--`."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Script mode: stop the script after this many optimizer steps (default 60)."),
    script_args: Optional[List[str]] = typer.Argument(None, help="Script mode: arguments for the script, after `--`."),
    symptom: Optional[List[str]] = typer.Option(None, "--symptom", "-s", help="What you see (repeatable): nan, flat, oscillating, overfitting, underfitting, val-suspicious, crash, not-reproducible, auto."),
    answers: Optional[Path] = typer.Option(None, "--answers", help="YAML/JSON file of answers (as saved by an interactive session)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write the markdown report here (plots go in a folder beside it)."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when present), cpu or cuda."),
    seed: int = typer.Option(0, "--seed", help="Seed for every probe."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="Exit 1 when a hypothesis reaches this confidence (0-1, or low/medium/high)."),
    non_interactive: bool = typer.Option(False, "--non-interactive", help="Never prompt: answers file, then defaults."),
    trees: Optional[Path] = typer.Option(None, "--trees", help="A folder of extra trees (and catalog.yaml) that add to or override the built-in ones."),
    probe_timeout: Optional[float] = typer.Option(None, "--probe-timeout", help="Seconds before a probe is stopped (default: sized by the measured step time)."),
    budget: Optional[float] = typer.Option(None, "--budget", help="Seconds for the whole diagnosis; probes that train plan their steps from it (default: max(20 s, 40 plain steps; a script's: its reruns with their start-up) less a fifth, printed at the start)."),
    save_answers_path: Optional[Path] = typer.Option(None, "--save-answers", help="Where an interactive session saves its answers (default nnwizard-answers.yaml)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the final table."),
    isolation: str = typer.Option("auto", "--isolation", help="How the program is kept from your files: auto (os where the system allows it, else python), os (Linux namespaces and copy-on-write overlays), python (patched file functions), none (its side effects are real)."),
    keep_scratch: bool = typer.Option(False, "--keep-scratch", help="Keep nnwizard's scratch folder (what the program wrote, the worker's log) and print where it is."),
) -> None:
    """Diagnose a training module or script: ask what you see, measure, and rank the hypotheses."""
    from nnwizard.options import Options

    opts = Options(
        module=module, symptoms=list(symptom or []), answers=answers, json_path=json_path, report_path=report_path,
        device=device, seed=seed, fail_on=parse_fail_on(fail_on),
        interactive=not non_interactive and sys.stdin.isatty(), trees_dir=trees, probe_timeout=probe_timeout,
        budget=budget, save_answers=save_answers_path, quiet=quiet, script=script, script_args=list(script_args or []),
        max_steps=max_steps,
    )
    if os.environ.get("NNWIZARD_IN_PROCESS") == "1":   # (internal: the former design, for benchmarks/supervisor_overhead.py)
        from nnwizard.session import run_session

        raise typer.Exit(int(run_session(opts)))
    from nnwizard.supervisor import diagnose as supervised

    raise typer.Exit(supervised(opts, isolation, keep_scratch))


@trees_app.command("list")
def trees_list(trees: Optional[Path] = typer.Option(None, "--trees", help="Extra trees folder.")) -> None:
    """The trees, their entry symptoms and sizes."""
    from rich.table import Table

    from nnwizard.tree import load_trees

    table = Table("id", "title", "symptoms", "nodes", "file")
    for t in load_trees(trees).values():
        table.add_row(t.id, t.title, ", ".join(t.symptoms), str(len(t.nodes)), Path(t.path).name)
    Console().print(table)


@trees_app.command("show")
def trees_show(tree_id: str, trees: Optional[Path] = typer.Option(None, "--trees", help="Extra trees folder.")) -> None:
    """Draw one tree."""
    from nnwizard.tree import load_trees
    from nnwizard.view import draw_tree

    loaded = load_trees(trees)
    if tree_id not in loaded:
        raise UsageError(f"no tree {tree_id!r}; known: {', '.join(loaded)}")
    Console().print(draw_tree(loaded[tree_id]))


@trees_app.command("validate")
def trees_validate(paths: Optional[List[Path]] = typer.Argument(None, help="Tree files or folders (default: the built-in trees).")) -> None:
    """Check trees against the schema, the probe registry and the hypothesis catalog."""
    from nnwizard.catalog import load_catalog
    from nnwizard.errors import TreeError
    from nnwizard.tree import load_tree, tree_files

    files: list[Path] = []
    for p in paths or []:
        if not p.exists():
            raise UsageError(f"{p}: no such file or folder")
        files += sorted(x for x in p.glob("*.yaml") if x.name != "catalog.yaml") if p.is_dir() else [p]
    extra = next((str(p) for p in paths or [] if p.is_dir() and (p / "catalog.yaml").exists()), None)
    catalog = load_catalog(extra)
    errors = 0
    for f in files or tree_files():
        try:
            tree = load_tree(f, catalog)
            print(f"ok   {f}  ({tree.id}: {len(tree.nodes)} nodes)")
        except TreeError as exc:
            errors += 1
            print(f"FAIL {exc}")
    if errors:
        raise typer.Exit(int(ExitCode.USAGE))


@app.command()
@_interruptible
def curve(
    file: Path = typer.Argument(..., help="A loss log: CSV (step, loss, val_loss...), JSON lines, or a TensorBoard event file."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the shape and the series as JSON here."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write a markdown report with a PNG plot here."),
    reference: Optional[float] = typer.Option(None, "--reference", help="The loss of a chance-level model (e.g. ln(classes)), to judge 'high'."),
) -> None:
    """Read an existing loss log, name its shape and the first intervention."""
    from nnwizard.curve_cmd import run

    raise typer.Exit(run(file, json_path, report_path, reference))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_interruptible
def watch(
    ctx: typer.Context,
    script: str = typer.Option(..., "--script", help="The training script (path or dotted module), run as python would."),
    out: Path = typer.Option(Path("nnwizard-watch"), "--out", help="Folder for watch.jsonl and the replay bundles."),
    on_anomaly: str = typer.Option("continue", "--on-anomaly", help="continue (default) or stop at the first anomaly."),
    every: Optional[int] = typer.Option(None, "--every", help="Steps between JSON lines (default: 10, or a multiple of "
                                        "10 at which a line costs at most 1 percent of the steps between two; the triggers check every step)."),
) -> None:
    """Watch the real run: log per-step health to DIR/watch.jsonl, save a replay bundle at each anomaly."""
    from nnwizard.script_file import load_script
    from nnwizard.supervisor import passthrough

    if on_anomaly not in ("stop", "continue"):
        raise UsageError(f"--on-anomaly {on_anomaly!r}: choose stop or continue")
    if every is not None and every < 1:
        raise UsageError(f"--every {every}: must be 1 or more")
    load_script(script, import_names=False)
    raise typer.Exit(passthrough({"command": "watch", "options": {"script": script, "args": list(ctx.args), "out": str(out),
                                                                    "on_anomaly": on_anomaly, "every": every}}))


@app.command()
@_interruptible
def replay(
    bundle: Path = typer.Argument(..., help="A bundle folder saved by watch: DIR/anomaly-step<N>."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write the markdown report here."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto."),
    seed: int = typer.Option(0, "--seed", help="Seed for the probes."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the final table."),
) -> None:
    """Diagnose exactly the step a watch bundle saved: the op and line, the batch, lr/10 and clipping."""
    from nnwizard.supervisor import passthrough

    for flag, path in (("--json", json_path), ("--report", report_path)):
        if path is not None and not path.resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: the folder {path.resolve().parent} does not exist")
    raise typer.Exit(passthrough({"command": "replay", "options": {
        "bundle": str(bundle), "json_path": json_path and str(json_path), "report_path": report_path and str(report_path),
        "device": device, "seed": seed, "quiet": quiet}}))


@probes_app.command("list")
def probes_list() -> None:
    """Every registered probe with its outcomes."""
    from rich.table import Table

    from nnwizard.probes import load_all

    table = Table("probe", "title", "outcomes", "timeout")
    for spec in sorted(load_all().values(), key=lambda s: s.id):
        outcomes = ", ".join(o for o in spec.outcomes if o not in ("errored", "skipped"))
        table.add_row(spec.id, spec.title, outcomes, f"{spec.timeout_s:.0f}s")
    Console().print(table)


def _crash(exc: BaseException) -> int:
    from nnwizard.processes import crash_log

    log = crash_log("".join(traceback.format_exception(exc)))
    print(f"nnwizard: internal error: {type(exc).__name__}: {exc}. This is a bug in nnwizard; the traceback "
          f"is in {log}.", file=sys.stderr)
    return int(ExitCode.INTERNAL)


def main(argv: list[str] | None = None) -> None:
    if argv is None:   # the nnwizard command itself: what its workers' trees orphan is adopted, and ended with them
        from nnwizard.processes import become_subreaper

        become_subreaper()
    try:
        code = app(args=argv, standalone_mode=False, prog_name="nnwizard")
        code = int(code or 0)
    except typer.Exit as exc:
        code = exc.exit_code
    except NoArgsIsHelpError as exc:
        print(exc.format_message() if hasattr(exc, "format_message") else str(exc), file=sys.stderr)
        code = 0
    except ClickUsageError as exc:
        hint = f" (see 'nnwizard {exc.ctx.command.name} --help')" if exc.ctx and exc.ctx.command.name != "nnwizard" else " (see 'nnwizard --help')"
        print(f"nnwizard: error: {exc.format_message()}{hint}", file=sys.stderr)
        code = int(ExitCode.USAGE)
    except typer.Abort:
        print("nnwizard: interrupted", file=sys.stderr)
        code = int(ExitCode.INTERRUPTED)
    except NNWizardError as exc:
        if _debug:
            traceback.print_exc()
        print(f"nnwizard: error: {exc}", file=sys.stderr)
        code = int(exc.exit_code)
    except KeyboardInterrupt:
        print("nnwizard: interrupted", file=sys.stderr)
        code = int(ExitCode.INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - last line of defence: log it, exit 3
        if _debug:
            traceback.print_exc()
        code = _crash(exc)
    _exit(code, hard=argv is None)


def _exit(code: int, hard: bool) -> None:
    """Exit with ``code``. A probe worker still inside a native call (stopped at its time limit but
    not yet back in Python) would make interpreter shutdown abort inside torch (SIGABRT, exit 134),
    so the command (``hard``: not a call from Python with its own argv) then ends the process at
    once, after flushing what it wrote; the reports are already written."""
    isolation = sys.modules.get("nnwizard.isolation")  # not imported: no probe ran (and torch may be half-imported)
    lost = sys.modules.get("nnwizard.cuda_lost")       # a dead CUDA context can fail its own teardown too
    if hard and ((isolation is not None and isolation.stragglers()) or (lost is not None and lost.seen())):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)
