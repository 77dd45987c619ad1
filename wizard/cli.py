"""The ``nnwizard`` command: diagnose, and helpers for trees and probes, with error handling
that shows users one clear line (``--debug`` for the traceback) with the contract's exit codes."""

from __future__ import annotations

import difflib
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
import nnwizard
from nnwizard.config import default_map, env_name
from nnwizard.console import make_console as Console
from nnwizard.errors import ExitCode, NNWizardError, UsageError
from nnwizard.options import parse_fail_on

# this module imports no torch: a usage error is answered before the heavy imports that a diagnosis needs
CONTEXT = {"help_option_names": ["-h", "--help"]}
SCRIPT_COMMAND = {"allow_extra_args": True, "ignore_unknown_options": True}   # script arguments bare or after `--`
app = typer.Typer(
    name="nnwizard", add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, context_settings=CONTEXT,
    help="A guided troubleshooting wizard for PyTorch training that goes wrong. Settings may also come from "
         "NNWIZARD_* environment variables and [tool.nnwizard] in pyproject.toml (flags first, then the environment, "
         "then the file).",
)
trees_app = typer.Typer(help="List, draw and validate decision trees.", no_args_is_help=True)
probes_app = typer.Typer(help="List the registered probes.", no_args_is_help=True)
app.add_typer(trees_app, name="trees")
app.add_typer(probes_app, name="probes")

_debug = False
_after_dashes: list[str] | None = None   # what followed `--` on the command line (the script's arguments)


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
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True, help="Show the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    global _debug
    _debug = debug


def _script_args(ctx: typer.Context) -> list[str]:
    """The script's arguments: those after `--` (the documented way) and any bare ones click left over. A bare
    ``--flag`` that is a near miss of one of this command's own options is a typo, not a script argument."""
    bare = list(ctx.args)
    if bare and not ctx.params.get("script"):
        what = "No such option" if bare[0].startswith("-") else "Got unexpected extra argument"
        raise UsageError(f"{what}: {bare[0]} (see 'nnwizard {ctx.command.name} --help')")
    own = [name for p in ctx.command.params for name in getattr(p, "opts", []) if name.startswith("--")]
    for arg in bare:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], own, n=1, cutoff=0.8)
            if close:
                raise UsageError(f"no option {arg.split('=', 1)[0]} for nnwizard {ctx.command.name} (did you mean "
                                 f"{close[0]}?); arguments for the script go after `--`")
    return bare + list(_after_dashes or [])


def _env(key: str) -> dict:
    return {"envvar": env_name(key), "show_envvar": False}


@app.command(context_settings=SCRIPT_COMMAND)
@_interruptible
def diagnose(
    ctx: typer.Context,
    module: Optional[str] = typer.Option(None, "--module", "-m", help="Training module: mypkg.train, path/to/train.py, optionally :attr."),
    script: Optional[str] = typer.Option(None, "--script", help="An unmodified training script (path, dotted name, or a Jupyter notebook .ipynb), run as `python train.py ARGS` would; ARGS go after `--`."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Script mode: stop the script after this many optimizer steps (default 60).", **_env("max-steps")),
    symptom: Optional[List[str]] = typer.Option(None, "--symptom", "-s", help="What you see (repeatable): nan, flat, oscillating, overfitting, underfitting, val-suspicious, crash, not-reproducible, auto.", **_env("symptom")),
    answers: Optional[Path] = typer.Option(None, "--answers", help="YAML/JSON file of answers (as saved by an interactive session)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here.", **_env("json")),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write the markdown report here (plots go in a folder beside it).", **_env("report")),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when present), cpu or cuda.", **_env("device")),
    seed: int = typer.Option(0, "--seed", help="Seed for every probe.", **_env("seed")),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="Exit 1 when a hypothesis reaches this confidence (0-1, or low/medium/high), or when the program raised.", **_env("fail-on")),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 also when the verdict is inconclusive (implies --fail-on 0.5 unless given).", **_env("strict")),
    non_interactive: bool = typer.Option(False, "--non-interactive", help="Never prompt: answers file, then defaults.", **_env("non-interactive")),
    trees: Optional[Path] = typer.Option(None, "--trees", help="A folder of extra trees (and catalog.yaml) that add to or override the built-in ones.", **_env("trees")),
    probe_timeout: Optional[float] = typer.Option(None, "--probe-timeout", help="Seconds before a probe is stopped (default: sized by the measured step time).", **_env("probe-timeout")),
    budget: Optional[float] = typer.Option(None, "--budget", help="Seconds for the whole diagnosis; probes that train plan their steps from it (default: max(20 s, 40 plain steps; a script's: its reruns with their start-up) less a fifth, printed at the start).", **_env("budget")),
    save_answers_path: Optional[Path] = typer.Option(None, "--save-answers", help="Where an interactive session saves its answers (default nnwizard-answers.yaml)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the final table.", **_env("quiet")),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Script mode: run the script on N ranks as `torchrun --standalone --nproc_per_node=N` would (gloo on the CPU, nccl on GPUs) and audit the ranks against each other.", **_env("nproc")),
    isolation: str = typer.Option("auto", "--isolation", help="How the program is kept from your files: auto (os where the system allows it, else python), os (Linux namespaces and copy-on-write overlays), python (patched file functions), none (its side effects are real).", **_env("isolation")),
    keep_scratch: bool = typer.Option(False, "--keep-scratch", help="Keep nnwizard's scratch folder (what the program wrote, the worker's log) and print where it is."),
) -> None:
    """Diagnose a training module or script: ask what you see, measure, and rank the hypotheses.

    Arguments for the script go after `--`: nnwizard diagnose --script train.py -- --epochs 1"""
    from nnwizard.options import Options, check

    opts = Options(
        module=module, symptoms=list(symptom or []), answers=answers, json_path=json_path, report_path=report_path,
        device=device, seed=seed, fail_on=parse_fail_on(fail_on), strict=strict,
        interactive=not non_interactive and sys.stdin.isatty(), trees_dir=trees, probe_timeout=probe_timeout,
        budget=budget, save_answers=save_answers_path, quiet=quiet, script=script, script_args=_script_args(ctx),
        max_steps=max_steps, nproc=nproc,
    )
    check(opts)   # bad usage is answered here, before torch is imported
    from nnwizard.distributed.env import in_torchrun

    if opts.nproc or in_torchrun() or os.environ.get("NNWIZARD_IN_PROCESS") == "1":
        # distributed training (CONTRACT §8): the launcher's ranks are the workers; NNWIZARD_IN_PROCESS (internal):
        # the diagnosis in this process, for benchmarks/supervisor_overhead.py
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


@app.command(context_settings=SCRIPT_COMMAND)
@_interruptible
def watch(
    ctx: typer.Context,
    script: str = typer.Option(..., "--script", help="The training script (path, dotted module, or a notebook .ipynb), run as python would; its arguments go after `--`."),
    out: Path = typer.Option(Path("nnwizard-watch"), "--out", help="Folder for watch.jsonl and the replay bundles.", **_env("out")),
    on_anomaly: str = typer.Option("continue", "--on-anomaly", help="continue (default) or stop at the first anomaly.", **_env("on-anomaly")),
    every: Optional[int] = typer.Option(None, "--every", help="Steps between JSON lines (default: 10, or a multiple of "
                                        "10 at which a line costs at most 1 percent of the steps between two; the triggers check every step).", **_env("every")),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Run the script on N ranks as `torchrun --standalone --nproc_per_node=N` would: one log per rank (watch.rank<R>.jsonl) and bundles per rank.", **_env("nproc")),
) -> None:
    """Watch the real run: log per-step health to DIR/watch.jsonl, save a replay bundle at each anomaly.

    Arguments for the script go after `--`: nnwizard watch --script train.py -- --epochs 1"""
    if on_anomaly not in ("stop", "continue"):
        raise UsageError(f"--on-anomaly {on_anomaly!r}: choose stop or continue")
    if every is not None and every < 1:
        raise UsageError(f"--every {every}: must be 1 or more")
    args = _script_args(ctx)
    from nnwizard.script_spec import load_script

    load_script(script, import_names=False)   # a missing script or a syntax error is answered before torch is imported
    from nnwizard.distributed.env import in_torchrun

    if nproc or in_torchrun():   # distributed training (CONTRACT §8)
        from nnwizard.distributed.watch import run_watch

        raise typer.Exit(run_watch(script, args, out, on_anomaly, every, nproc))
    from nnwizard.supervisor import passthrough

    raise typer.Exit(passthrough({"command": "watch", "options": {"script": script, "args": args, "out": str(out),
                                                                  "on_anomaly": on_anomaly, "every": every}}))


@app.command()
@_interruptible
def replay(
    bundle: Path = typer.Argument(..., help="A bundle folder saved by watch: DIR/anomaly-step<N>."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write the markdown report here."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto.", **_env("device")),
    seed: int = typer.Option(0, "--seed", help="Seed for the probes.", **_env("seed")),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the final table.", **_env("quiet")),
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


def _split_dashes(args: list[str]) -> tuple[list[str], list[str] | None]:
    """``diagnose ... -- ARGS`` / ``watch ... -- ARGS``: the arguments before `--`, and those after it (None: none)."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command in ("diagnose", "watch") and "--" in args:
        at = args.index("--")
        return args[:at], args[at + 1:]
    return args, None


def main(argv: list[str] | None = None) -> None:
    global _after_dashes
    if argv is None:   # the nnwizard command itself: what its workers' trees orphan is adopted, and ended with them
        from nnwizard.processes import become_subreaper

        become_subreaper()
    try:
        args, _after_dashes = _split_dashes(list(sys.argv[1:] if argv is None else argv))
        defaults, _ = default_map()
        code = app(args=args, standalone_mode=False, prog_name="nnwizard", default_map=defaults)
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
